"""The interface every cluster backend (local, mesos, sim) implements, and the plain data it speaks."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from peloton.domain.placement import HostOffer
from peloton.domain.resources import Resources
from peloton.domain.states import TaskState


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    """One member to start on a host, with the exact GPUs and ports the placement chose."""

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
class HostInfo:
    hostname: str
    address: str
    capacity: Resources
    allocated: Resources
    labels: dict[str, str] = field(default_factory=dict)
    state: str = "UP"
    task_ids: tuple[str, ...] = ()
    holds_offer: bool = False  # the backend holds an unused offer for this host (Mesos)


class LaunchError(Exception):
    """A member could not be started; `task_id` names it."""

    def __init__(self, task_id: str, message: str) -> None:
        super().__init__(f"{task_id}: {message}")
        self.task_id = task_id
        self.message = message


StatusCallback = Callable[[TaskStatus], None]


class Backend(Protocol):
    """A cluster backend. Implementations are thread-safe; they call `on_status` from their own threads."""

    def start(self, on_status: StatusCallback) -> None:
        """Begin monitoring (and adopt tasks a previous daemon left running)."""

    def stop(self) -> None:
        """Stop monitoring. Running tasks are NOT killed: a restarted daemon adopts them."""

    def offers(self) -> list[HostOffer]:
        """Free resources of every host now (leases are the caller's business)."""

    def hosts(self) -> list[HostInfo]:
        ...

    def launch(self, tasks: Sequence[LaunchSpec]) -> None:
        """Start every task, or none: on any failure kill those already started and raise LaunchError.
        A RUNNING status is reported for each task that started."""

    def kill(self, task_ids: Sequence[str]) -> None:
        """Ask each task to stop (SIGTERM to its process group, SIGKILL after a grace period).
        Unknown ids are ignored. Each task's end is reported as a status (KILLED)."""

    def reconcile(self, task_ids: Sequence[str]) -> dict[str, TaskStatus]:
        """Current status of each id: RUNNING, a terminal state, or LOST if the backend knows nothing of it."""

    def running_task_ids(self) -> set[str]:
        ...

    def acknowledge(self, acks: Sequence[str]) -> None:
        """The updates carrying these `ack` tokens are persisted; the backend may acknowledge them upstream."""

    def read_log(self, task_id: str, stream: str, tail_bytes: int) -> bytes:
        """The last `tail_bytes` of the task's stdout or stderr. NotFound if the task is unknown."""
