"""How many workers `instances: auto` asks for: a pure rule over the cost model's predictions for each allowed count.

A user of a shared cluster wants a job to finish soon without holding GPUs it barely uses. The rule
(docs/model-aware.md, "How auto chooses the count"):

- A count's **scaling efficiency** is its samples/s per GPU relative to the smallest allowed count's best plan:
  E(K) = (S(K) / K) / (S(k0) / k0), where S is the predicted samples/s of a plan (on the GPUs free now when it fits
  now, else on the whole cluster as if empty) and k0 the smallest count (`model.min_instances`) that can be placed
  at all. A count is **efficient** when E(K) >= `min_efficiency` (default 0.5: no more than half of a GPU's time
  lost to scaling, the knee of Eager, Zahorjan and Lazowska's speedup-efficiency trade-off; Optimus and Pollux
  likewise add GPUs to a job only while they pay). k0 is always efficient.
- **Something fits now** (on the GPUs free now): the efficient count that fits now with the most samples/s (ties:
  fewer GPUs). On a mostly idle cluster that is the largest efficient count; on a busy one, the most that starts now.
- **Nothing fits now**: k0, the smallest count, which starts soonest (a smaller gang never needs more GPUs to free
  up than a larger one), rather than the count that would be fastest on an empty cluster.

Always within [min_instances, max_instances]: the options are exactly the allowed counts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from peloton.errors import InvalidArgument

DEFAULT_MIN_EFFICIENCY = 0.5


@dataclass(frozen=True, slots=True)
class CountOption:
    """One allowed worker count and the cost model's best predictions for it."""

    gpus: int
    best: float  # samples/s of its best plan on the whole cluster as if empty; 0: cannot be placed even then
    now: float = 0.0  # samples/s of its best plan on the GPUs free now; 0: does not fit now


@dataclass(frozen=True, slots=True)
class CountChoice:
    gpus: int
    samples_per_s: float  # predicted, on the GPUs free now when fits_now, else on the empty cluster
    efficiency: float  # E(gpus), above
    fits_now: bool
    why: str


def upper_bound(max_instances: int, min_instances: int, entitled: int | None, reserved: int) -> int:
    """The most workers `instances: auto` may choose (0: no bound): `max_instances` (0: none), and no more than the
    GPUs the job's pool would be entitled to if it asked for them (None: not known) nor than the GPUs the pool
    reserves (0: none), each only where it leaves room for `min_instances`. Beyond its pool's reservation a gang
    runs on GPUs lent by other pools: when they take them back it is preempted, and it waits until they lend
    again."""
    top = max_instances
    for cap in (entitled, reserved or None):
        if cap is not None and cap >= min_instances:
            top = min(top, cap) if top else cap
    return top


def efficiency(option: CountOption, per_gpu_ref: float) -> float:
    """E(K): the option's samples/s per GPU (now when it fits now, else as if empty) over the reference's."""
    rate = option.now or option.best
    return rate / option.gpus / per_gpu_ref if per_gpu_ref > 0 else 0.0


def choose_count(options: Sequence[CountOption], min_efficiency: float = DEFAULT_MIN_EFFICIENCY) -> CountChoice | None:
    """The worker count `instances: auto` asks for among `options` (the allowed counts); None when none of them
    can be placed even on the empty cluster."""
    if not (isinstance(min_efficiency, int | float) and math.isfinite(min_efficiency)
            and 0 <= min_efficiency <= 1):
        raise InvalidArgument(f"min_efficiency: must be a number in [0, 1], got {min_efficiency!r}",
                              field="min_efficiency")
    for o in options:
        if o.gpus < 1 or not (math.isfinite(o.best) and o.best >= 0 and math.isfinite(o.now) and o.now >= 0):
            raise InvalidArgument(f"options: a count must be >= 1 with finite, non-negative rates, got {o!r}",
                                  field="options")
    placeable = sorted((o for o in options if o.best > 0), key=lambda o: o.gpus)
    if not placeable:
        return None
    ref = placeable[0]
    per_gpu = ref.best / ref.gpus
    fitting = [o for o in placeable if o.now > 0 and (o is ref or efficiency(o, per_gpu) >= min_efficiency)]
    if fitting:
        pick = max(fitting, key=lambda o: (o.now, -o.gpus))
        return CountChoice(pick.gpus, pick.now, efficiency(pick, per_gpu), True,
                           f"the most samples/s that starts now among the counts at least {min_efficiency:g} "
                           "efficient")
    return CountChoice(ref.gpus, ref.best, 1.0, False,
                       "nothing fits now: the smallest count, which starts soonest")
