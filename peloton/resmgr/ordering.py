"""The order of a pool's waiting gangs (`--queue-order`). Pure: plain data in, a sort key out; the clock is passed in.

Every order puts a higher `sla.priority` first (priority preemption relies on it). Within a priority:

- `arrival` (the default): the job's submission time, then the gang id: first come, first served.
- `gpu-time`: discretized least expected service first, after Tiresias's two-dimensional queues (J. Gu et al.,
  NSDI 2019), on what a gang is expected to take rather than what it has taken (a gang here is not time-sliced,
  so a gang that never ran has taken nothing). A gang's expected service is its GPUs x its sla.max_runtime, in
  GPU-seconds; it falls in queue k, the first whose bound it does not exceed: queue 0 up to `first_gpu_s`, each
  next bound `factor` times the last, the last queue unbounded. A gang without a max_runtime (its service is not
  known) is in the last queue. Lower queues go first; within a queue, arrival order. So a narrow or short gang is
  not held behind a wide, long one that waits for the cluster to have room for it, and a gang declaring how long
  it runs may go sooner than one that does not.
- **Aging** (`gpu-time`): a gang that has waited `promote_after_s` since it was queued (this attempt: a preempted
  gang queues again) is promoted to queue 0, among the others there by arrival; so no gang, however wide or long,
  waits behind later ones for longer than that. Promotion happens at a known time (`promote_at`), which the
  resource manager re-queues the gang at (and a replay steps to).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from peloton.errors import InvalidArgument

QUEUE_ORDERS = ("arrival", "gpu-time")
DEFAULT_PROMOTE_AFTER_S = 4 * 3600.0  # gpu-time: a gang waiting this long is promoted to the first queue
FIRST_QUEUE_GPU_S = 3600.0  # gpu-time: queue 0 holds gangs expected to take up to one GPU-hour
QUEUE_FACTOR = 4.0  # ...each next queue's bound this many times the last
QUEUES = 6  # ...and the sixth is unbounded: 1, 4, 16, 64, 256 GPU-hours, more (or not known)

Order = tuple[int, int, float, str]  # (-priority, queue, submitted at, gang id): smaller is first


@dataclass(frozen=True, slots=True)
class QueueOrder:
    """`--queue-order` and `--queue-promote-after` as one checked value."""

    kind: str = "arrival"
    promote_after_s: float = DEFAULT_PROMOTE_AFTER_S

    def __post_init__(self) -> None:
        if self.kind not in QUEUE_ORDERS:
            raise InvalidArgument(f"--queue-order: must be one of {', '.join(QUEUE_ORDERS)}, got {self.kind!r}",
                                  field="--queue-order")
        if not (math.isfinite(self.promote_after_s) and self.promote_after_s > 0):
            raise InvalidArgument(f"--queue-promote-after: must be a positive number of seconds, got "
                                  f"{self.promote_after_s}", field="--queue-promote-after")


ARRIVAL = QueueOrder()


def service_queue(order: QueueOrder, gpus: float, max_runtime_s: float) -> int:
    """The queue of a gang asking `gpus` GPUs with this sla.max_runtime (0: none) before any promotion."""
    if order.kind == "arrival":
        return 0
    if not max_runtime_s > 0:
        return QUEUES - 1  # its service is not known
    service, bound = gpus * max_runtime_s, FIRST_QUEUE_GPU_S
    k = 0
    while service > bound * (1 + 1e-9) and k < QUEUES - 1:
        k += 1
        bound *= QUEUE_FACTOR
    return k


def promote_at(order: QueueOrder, queue: int, queued_at: float) -> float | None:
    """When a gang queued at `queued_at` in `queue` is promoted to queue 0 (None: never, it is there or the order
    does not age)."""
    if order.kind == "arrival" or queue == 0:
        return None
    return queued_at + order.promote_after_s


def rank(order: QueueOrder, priority: int, gpus: float, max_runtime_s: float, submitted_at: float, gang_id: str,
         queued_at: float, now: float) -> Order:
    """The sort key of a waiting gang at `now` (smaller goes first)."""
    queue = service_queue(order, gpus, max_runtime_s)
    due = promote_at(order, queue, queued_at)
    if due is not None and now >= due:
        queue = 0
    return -priority, queue, submitted_at, gang_id
