"""Plain data exchanged between resmgr, the placement engine and hostmgr."""

from __future__ import annotations

from dataclasses import dataclass, field

from peloton.domain.resources import Resources
from peloton.domain.spec import Constraint
from peloton.modelaware.plan import PlanChoice, PlanGoal


@dataclass(frozen=True, slots=True)
class HostOffer:
    """What one host can give right now: free resources plus the concrete GPU indices and ports."""

    hostname: str
    address: str  # reachable address for peers (127.0.0.1 on the local backend)
    # free.gpu and free.ports are counts. The id lists are filled where concrete ids matter (the host manager's
    # own book); placement works on the counts alone.
    free: Resources
    gpu_ids: tuple[int, ...] = ()
    ports: tuple[int, ...] = ()
    labels: dict[str, str] = field(default_factory=dict)
    capacity: Resources = Resources()
    has_gpus: bool = False  # host has GPUs at all (CPU-only work avoids GPU hosts when it can)


@dataclass(frozen=True, slots=True)
class MemberRequest:
    instance: int
    task_id: str
    resources: Resources
    hostname: str = ""  # a running gang's (re-registered after a restart): where it holds `resources`


@dataclass(frozen=True, slots=True)
class GangRequest:
    """A gang asking to be placed: every member or none."""

    gang_id: str  # "<job_id>/<gang_index>"
    job_id: str
    attempt: int
    members: tuple[MemberRequest, ...]
    priority: int = 0
    respool: str = "/"
    strategy: str = "pack"
    constraints: tuple[Constraint, ...] = ()
    enqueued_at: float = 0.0
    preemptible: bool = True
    running_since: float = 0.0  # a running gang's (re-registered after a restart): when it began to run
    max_runtime_s: float = 0.0  # sla.max_runtime (0: none): it ends by then at the latest (backfill, reservations)
    goal: PlanGoal | None = None  # placement.strategy model-aware: the job's cost model (docs/model-aware.md)
    # every member's resources together: computed once (admission looks at it for each waiting gang every round)
    total: Resources = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        t = Resources()
        for m in self.members:
            t = t + m.resources
        object.__setattr__(self, "total", t)


@dataclass(frozen=True, slots=True)
class MemberAssignment:
    """Where one member goes. The placer decides the host and the counts; the host manager's claim fills in the
    concrete GPU ids and ports (empty until then)."""

    instance: int
    task_id: str
    hostname: str
    address: str
    resources: Resources
    gpu_ids: tuple[int, ...] = ()
    ports: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class GangPlacement:
    """A whole gang's assignment. Identified by (gang_id, attempt): the host manager holds its resources under
    that key (a claim) from the moment placement claims them until the launch or the claim's expiry."""

    gang_id: str
    job_id: str
    attempt: int
    members: tuple[MemberAssignment, ...]
    plan: PlanChoice | None = None  # a model-aware gang's: the plan chosen, its prediction, the runner-ups


@dataclass(frozen=True, slots=True)
class PlacementFailure:
    """Why a gang could not be placed: a human reason plus per-dimension counts of hosts that fell short."""

    gang_id: str
    job_id: str
    attempt: int
    reason: str
    short_hosts: dict[str, int] = field(default_factory=dict)  # e.g. {"gpu": 3, "constraint": 1}
