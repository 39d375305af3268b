"""Trace replay: public traces run through the real scheduler on the sim backend, and what users would feel. The
pure parts: reading traces and cluster shapes (traces.py), how long a job runs on the placement it got (work.py),
the metrics of a replay (metrics.py) and its report (report.py); docs/scheduling-quality.md."""
