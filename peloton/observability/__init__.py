"""What operators see of the daemon: its log lines (`logs.py`), the Prometheus census of the store and the cluster
(`census.py`) and the gang stage histogram (`gang_metrics.py`), and the health judged from its loops (`health.py`)."""
