"""The one histogram every component adds to: how long gangs spend in each stage of their way to running.

- `queued`: enqueued in the resource manager to admitted (resmgr);
- `placing`: admitted to placed and claimed on hosts (resmgr, when the placement engine answers);
- `launched`: the launch intent committed to the backend's answer that it started every member (jobmgr);
- `launching`: the launch intent committed to every member running (jobmgr; `launched` plus the members' start);
- `submitted_to_running`: the job's submission to the gang running whole, whatever the run (jobmgr).
"""

from __future__ import annotations

from prometheus_client import Histogram

GANG_STAGE = Histogram(
    "peloton_gang_stage_seconds", "How long gangs spend in each stage (queued, placing, launched, "
    "launching, submitted_to_running)", ["stage"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 14400))
