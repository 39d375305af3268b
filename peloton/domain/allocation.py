"""What the resource manager knows of pools and gangs, as plain data: a pool's entitlement (resmgr/entitlement.py
divides the cluster into them) and usage, and the resources a gang holds (resmgr/preemption.py chooses among them).
The API reports them (api/convert.py), which is why they live on the bottom floor."""

from __future__ import annotations

import math
from dataclasses import dataclass

from peloton.domain.resources import Resources

_WHOLE_EPS = 1e-6  # 15.9999999 GPUs after float arithmetic are 16 whole GPUs


def whole_gpus(gpu: float) -> int:
    """The whole GPUs in a fractional GPU figure (an entitlement, a capacity): the one rule for admission and for
    whoever asks what a pool is entitled to (autosize's bound), so that both count the same devices."""
    return math.floor(gpu + _WHOLE_EPS)


@dataclass(frozen=True, slots=True)
class Entitlement:
    """A pool's entitlement. gpu is fractional: see resmgr/entitlement.py's docstring."""

    cpu: float = 0.0
    mem: float = 0.0
    disk: float = 0.0
    gpu: float = 0.0

    def whole(self) -> Resources:
        """As Resources, GPUs rounded down to whole devices (what a gang can be admitted against); ports 0."""
        return Resources(self.cpu, self.mem, self.disk, whole_gpus(self.gpu))


@dataclass(slots=True)
class Holding:
    """A gang holding resources (admitted, placed or running), as the resource manager records it."""

    pool: str
    total: Resources
    attempt: int
    preemptible: bool
    priority: int = 0
    since: float = 0.0  # when it was placed (or began to run, for a gang adopted after a restart)
    usage: tuple[tuple[str, Resources], ...] = ()  # (hostname, resources) per member; () until placed
    max_runtime_s: float = 0.0  # its sla.max_runtime (0: none)
    # jobmgr took its placement (its launch intent is durable: LAUNCHING there), or it was adopted running. From
    # admission until then False: an order to preempt it would be ignored (jobmgr preempts launching or running
    # gangs only), and the gang it was for would wait for a victim that never lets go
    launched: bool = True

    @property
    def ends_at(self) -> float | None:
        """When it ends at the latest (placed, with a max_runtime); None: not known."""
        return self.since + self.max_runtime_s if self.max_runtime_s and self.since and self.usage else None


@dataclass(frozen=True, slots=True)
class PoolUsage:
    """One pool as the resource manager sees it now (allocation and demand include its subtree)."""

    allocated: Resources
    demand: Resources
    entitlement: Entitlement | None  # None: the cluster's capacity is not known yet
    queued: int  # its own gangs waiting to be admitted or placed


@dataclass(frozen=True, slots=True)
class GangAsk:
    """A gang of a job not yet created, as a dry run asks the resource manager whether it would be admitted."""

    total: Resources
    preemptible: bool = True
    priority: int = 0


@dataclass(frozen=True, slots=True)
class AdmissionPreview:
    """Whether a gang would be admitted now: `reason` why it would wait ("": admitted now), and how many gangs of
    its pool already wait ahead of it (same or higher priority); `borrows`: admitted beyond its pool's
    entitlement, on capacity nobody holds (borrowing: taken back by preemption when other pools need it)."""

    reason: str
    ahead: int
    borrows: bool = False
