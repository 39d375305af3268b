"""Leadership and high availability: which process acts for each role, and what the others do meanwhile.

The store lock (`lock.py`) and its epochs (`fence.py`), the watch on both (`guard.py`), what a standby serves
(`standby.py`), and how callers move on from a leader that went (`failover.py`)."""
