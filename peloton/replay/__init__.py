"""Trace replay's pure data side: reading public traces and cluster shapes (traces.py), and how long a job runs on
the placement it got (work.py). No I/O beyond the text handed in, no clock (docs/scheduling-quality.md)."""
