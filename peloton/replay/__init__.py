"""Trace replay: public traces run through the real scheduler on the sim backend, and what users would feel. The
driver steps the production components in virtual time (driver.py); the pure parts read traces and cluster shapes
(traces.py), say how long a job runs on the placement it got (work.py), and measure and report a replay
(metrics.py, report.py). docs/scheduling-quality.md."""
