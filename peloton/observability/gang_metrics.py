"""The one histogram every component adds to: how long gangs spend in each stage of their way to running.

- `queued`: enqueued in the resource manager to admitted (resmgr);
- `placing`: admitted to placed and claimed on hosts (resmgr, when the placement engine answers);
- `launched`: the launch intent committed to the backend's answer that it started every member (jobmgr);
- `launching`: the launch intent committed to every member running (jobmgr; `launched` plus the members' start);
- `submitted_to_running`: the job's submission to the gang running whole, whatever the run (jobmgr).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from prometheus_client import Histogram

GANG_STAGE = Histogram(
    "peloton_gang_stage_seconds", "How long gangs spend in each stage (queued, placing, launched, "
    "launching, submitted_to_running)", ["stage"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 14400))

STAGES = ("queued", "placing", "launched", "launching", "submitted_to_running")
# each stage's series, looked up once: they are observed once a gang or more on the gang path (labels() takes the
# histogram's lock and hashes the label each time); the stages are fixed, so none is ever dropped
STAGE = {stage: GANG_STAGE.labels(stage) for stage in STAGES}
QUANTILES = (0.5, 0.95, 0.99)


def quantile(buckets: Sequence[tuple[float, float]], q: float) -> float:
    """The `q` quantile estimated from cumulative buckets [(upper bound, count up to it)], as Prometheus'
    histogram_quantile does: linear within the bucket it falls in; past the last finite bound, that bound."""
    total = buckets[-1][1] if buckets else 0.0
    if not total:
        return 0.0
    rank = q * total
    lower, below = 0.0, 0.0
    for bound, cum in buckets:
        if cum >= rank:
            if math.isinf(bound):
                return lower
            return lower + (bound - lower) * ((rank - below) / (cum - below) if cum > below else 1.0)
        lower, below = bound, cum
    return lower


def stage_latencies() -> list[tuple[str, int, float, tuple[float, ...]]]:
    """(stage, gangs, mean seconds, the QUANTILES in seconds) for every stage, as this process observed them."""
    buckets: dict[str, list[tuple[float, float]]] = {}
    counts: dict[str, float] = {}
    sums: dict[str, float] = {}
    for metric in GANG_STAGE.collect():
        for s in metric.samples:
            stage = s.labels.get("stage", "")
            if s.name.endswith("_bucket"):
                buckets.setdefault(stage, []).append((float(s.labels["le"]), s.value))
            elif s.name.endswith("_count"):
                counts[stage] = s.value
            elif s.name.endswith("_sum"):
                sums[stage] = s.value
    out = []
    for stage in STAGES:
        n = counts.get(stage, 0.0)
        b = sorted(buckets.get(stage, []))
        out.append((stage, int(n), sums.get(stage, 0.0) / n if n else 0.0, tuple(quantile(b, q) for q in QUANTILES)))
    return out
