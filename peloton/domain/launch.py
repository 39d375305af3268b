"""What the job manager, the host manager and its backends exchange, as plain data: a gang's launch and its
result, a task's status update, a host. The backends' interface is hostmgr/backend.py; the API converts these to
protobuf (api/convert.py), which is why they live on the bottom floor."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from peloton.domain.resources import Resources
from peloton.domain.states import TaskState


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    """One member to start on a host, with the exact GPUs and ports its claim holds."""

    task_id: str
    job_id: str
    instance: int
    attempt: int
    hostname: str
    command: str
    env: dict[str, str]
    resources: Resources
    gpu_ids: tuple[int, ...] = ()
    ports: tuple[int, ...] = ()
    files: dict[str, str] = field(default_factory=dict)  # extra files written into the sandbox (hostfile)
    container_image: str = ""  # Mesos containerizer image; the local backend runs on the host
    # Who it runs as (run_as.py): "" the backend's default user, a user name, or "#<uid>" (a uid allocated to the
    # job's owner; no account has it). uid 0 only when this names root (the pool allowed it at submit).
    user: str = ""
    # the job was created before identities: nobody vetted `user`, so the backend refuses a system account
    legacy_user: bool = False


@dataclass(frozen=True, slots=True)
class GangLaunch:
    """Every member of one gang attempt: the unit a backend starts whole or not at all."""

    gang_id: str
    attempt: int
    tasks: tuple[LaunchSpec, ...]


class LaunchOutcome(StrEnum):
    OK = "OK"  # every member started (its RUNNING status is on its way)
    REFUSED = "REFUSED"  # nothing was started: the system refused (stale claim, killed before launch, host gone)
    FAILED = "FAILED"  # a member could not be started; the others were stopped; the gang's policy applies


@dataclass(frozen=True, slots=True)
class LaunchResult:
    gang_id: str
    attempt: int
    outcome: LaunchOutcome
    task_id: str = ""  # the member at fault (FAILED)
    message: str = ""
    # True when starting the same task again cannot succeed (a command that cannot be executed at all)
    permanent: bool = False


@dataclass(frozen=True, slots=True)
class TaskStatus:
    """A status update from the backend. `state` is one of RUNNING, SUCCEEDED, FAILED, KILLED, LOST."""

    task_id: str
    state: TaskState
    time: float
    hostname: str = ""
    exit_code: int | None = None
    reason: str = ""
    message: str = ""
    # Opaque token the backend needs to acknowledge this update once the job manager has persisted it
    # (Mesos: agent id + uuid). Empty when there is nothing to acknowledge.
    ack: str = ""
    # True when running the same task again cannot succeed (Mesos TASK_ERROR: the task itself is invalid):
    # the gang is not restarted unchanged; the job fails with the reason.
    permanent: bool = False


@dataclass(frozen=True, slots=True)
class RunningTask:
    """A task the backend accounts for on a host (started, or registered and about to start)."""

    task_id: str
    hostname: str
    resources: Resources
    gpu_ids: tuple[int, ...] = ()
    ports: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class HostInfo:
    hostname: str
    address: str
    capacity: Resources
    allocated: Resources
    labels: dict[str, str] = field(default_factory=dict)
    state: str = "UP"
    task_ids: tuple[str, ...] = ()
    holds_offer: bool = False  # the backend holds an unused offer for this host (Mesos)
    # the host's GPU ids, and (GPU id, task id) for each GPU a task holds, where the backend knows ids (local, sim;
    # Mesos counts GPUs: empty)
    gpu_ids: tuple[int, ...] = ()
    gpu_holders: tuple[tuple[int, str], ...] = ()
