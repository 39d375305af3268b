"""What a running member reports of its speed, so that `job get` shows predicted against measured.

A member appends lines to the file named by `$PELOTON_METRICS_FILE` (in its sandbox), e.g. once per epoch:

    echo "step_time=0.52 local_bsz=32" >> "$PELOTON_METRICS_FILE"

Keys: `step_time` (seconds per step), `samples_per_s` (the member's own samples per second), `local_bsz` (its batch
per step). The last line with a valid figure counts. Only numbers are read back: the file is the member's, and
nothing else of it reaches `job get`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

FILE_NAME = "peloton-metrics"
READ_BYTES = 4096  # the tail the daemon reads: the last lines are the ones that count
KEYS = ("step_time", "samples_per_s", "local_bsz")


@dataclass(frozen=True, slots=True)
class Report:
    step_time: float = 0.0
    samples_per_s: float = 0.0
    local_bsz: float = 0.0


def parse(data: bytes) -> Report | None:
    """The last line of `data` that gives a step time or a rate; None if none does."""
    text = data.decode("ascii", errors="replace")
    for line in reversed(text.splitlines()):
        vals: dict[str, float] = {}
        for word in line.split():
            key, sep, raw = word.partition("=")
            if not sep or key not in KEYS:
                continue
            try:
                v = float(raw)
            except ValueError:
                continue
            if math.isfinite(v) and v > 0:
                vals[key] = v
        if "step_time" in vals or "samples_per_s" in vals:
            return Report(vals.get("step_time", 0.0), vals.get("samples_per_s", 0.0), vals.get("local_bsz", 0.0))
    return None


@dataclass(frozen=True, slots=True)
class Measured:
    step_time: float  # the members' mean (a synchronous step: they agree within noise)
    samples_per_s: float  # of the whole gang
    members: int


def combine(reports: Sequence[Report], gpus: int, local_bsz: float) -> Measured | None:
    """The gang's figures from its members' reports: the mean step time, and the gang's samples per second
    (the members' own rates added up, or gpus x local batch / step time when they report only step times)."""
    if not reports:
        return None
    steps = [r.step_time for r in reports if r.step_time > 0]
    rates = [r.samples_per_s for r in reports if r.samples_per_s > 0]
    step = sum(steps) / len(steps) if steps else 0.0
    if rates and len(rates) == len(reports):
        rate = sum(rates) / len(rates) * gpus  # each member's own rate, for every member of the gang
    else:
        bsz = next((r.local_bsz for r in reports if r.local_bsz > 0), local_bsz)
        rate = gpus * bsz / step if step else 0.0
    if not step and rate:
        bsz = next((r.local_bsz for r in reports if r.local_bsz > 0), local_bsz)
        step = gpus * bsz / rate if bsz else 0.0
    return Measured(step, rate, len(reports))
