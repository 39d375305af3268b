"""Records the store hands out. ORM rows never leave peloton/store; these do."""

from __future__ import annotations

from dataclasses import dataclass, field

from peloton.domain.resources import Resources
from peloton.domain.spec import JobSpec
from peloton.domain.states import GangState, JobState, TaskState


def task_id_for(job_id: str, instance: int, attempt: int) -> str:
    return f"{job_id}-{instance}-{attempt}"


def gang_id_for(job_id: str, gang_index: int) -> str:
    return f"{job_id}/{gang_index}"


def split_gang_id(gang_id: str) -> tuple[str, int]:
    job_id, _, idx = gang_id.rpartition("/")
    return job_id, int(idx)


@dataclass(slots=True)
class Job:
    id: str
    spec: JobSpec
    state: JobState = JobState.INITIALIZED
    desired: str = "RUNNING"  # RUNNING or KILLED
    reason: str = ""
    created_at: float = 0.0
    updated_at: float = 0.0
    completed_at: float = 0.0
    request_id: str = ""  # the caller's idempotency key for its creation ("" when none was given)


@dataclass(slots=True)
class Gang:
    job_id: str
    index: int
    instances: list[int]
    state: GangState = GangState.QUEUED
    attempt: int = 1
    reason: str = ""  # why pending / why aborted
    launch_deadline: float = 0.0  # clock time by which every member must run
    updated_at: float = 0.0
    preemptions: int = 0  # runs ended by a preemption: `attempt - preemptions` is what counts against max_attempts
    plan: str = ""  # a model-aware gang's plan for its current run, as JSON (peloton/modelaware/plan.py); else ""

    @property
    def gang_id(self) -> str:
        return gang_id_for(self.job_id, self.index)


@dataclass(slots=True)
class Task:
    job_id: str
    instance: int
    gang_index: int
    attempt: int = 1
    state: TaskState = TaskState.INITIALIZED
    host: str = ""
    address: str = ""
    ports: list[int] = field(default_factory=list)
    gpu_ids: list[int] = field(default_factory=list)
    exit_code: int | None = None
    reason: str = ""
    message: str = ""
    started_at: float = 0.0
    finished_at: float = 0.0
    updated_at: float = 0.0

    @property
    def task_id(self) -> str:
        return task_id_for(self.job_id, self.instance, self.attempt)


@dataclass(frozen=True, slots=True)
class TaskEvent:
    job_id: str
    instance: int
    attempt: int
    state: TaskState
    time: float
    host: str = ""
    reason: str = ""
    message: str = ""
    exit_code: int | None = None


@dataclass(frozen=True, slots=True)
class AuditEvent:
    """One call recorded in the audit log: who, how authenticated, what, about which object, the outcome."""

    at: float
    principal: str
    via: str
    method: str
    object: str
    allowed: bool
    code: str
    message: str = ""
    id: int = 0  # given by the store


@dataclass(frozen=True, slots=True)
class ResourcePool:
    path: str
    reservation: Resources = Resources()
    limit: Resources | None = None  # None: no limit
    share: float = 1.0
    created_at: float = 0.0
    # Who may submit jobs to this pool and its subtree (principals); empty: as the parent says (the root's
    # empty list: anyone with job.create). Operators and admins are never refused.
    submitters: tuple[str, ...] = ()
    # Whether jobs in this pool and its subtree may run tasks as root (`task.user: root`); never by default.
    allow_root: bool = False
    # elastic: what the pool does not use of its reservation is lent to others; static: held even when idle
    reservation_type: str = "elastic"

    @property
    def parent(self) -> str | None:
        if self.path == "/":
            return None
        head = self.path.rsplit("/", 1)[0]
        return head or "/"


@dataclass(frozen=True, slots=True)
class StoredModel:
    """A model document kept in the store under a name (`peloton model create`; domain/stored_models.py)."""

    name: str
    owner: str
    document: str  # the canonical JSON text of the document (what the daemon read, with its defaults)
    version: int = 1  # each replace adds 1
    created_at: float = 0.0
    updated_at: float = 0.0
