"""Store functions. Each takes a Session, never commits, and speaks domain types only.

Hot paths are batched: the `*_many` / list-taking functions issue multi-row statements, never one
round trip per task.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sqlalchemy.orm import Session

from peloton.domain.model import Gang, Job, ResourcePool, Task, TaskEvent
from peloton.domain.states import GangState, JobState


# --- jobs -------------------------------------------------------------------------------------------------
def insert_job(s: Session, job: Job, gangs: Sequence[Gang], tasks: Sequence[Task]) -> None:
    """Insert a job with all its gangs and tasks (multi-row inserts). AlreadyExists if the id is taken."""
    raise NotImplementedError


def get_job(s: Session, job_id: str) -> Job:
    """NotFound if absent."""
    raise NotImplementedError


def get_jobs(s: Session, job_ids: Iterable[str]) -> dict[str, Job]:
    """Batch lookup; missing ids are simply absent from the result."""
    raise NotImplementedError


def list_jobs(
    s: Session,
    *,
    states: Sequence[JobState] | None = None,
    owner: str | None = None,
    respool: str | None = None,
    name_contains: str | None = None,
    limit: int = 100,
) -> list[Job]:
    """Newest first."""
    raise NotImplementedError


def update_job(s: Session, job: Job) -> None:
    """Write state, desired, reason, updated_at, completed_at of `job`. NotFound if absent."""
    raise NotImplementedError


def delete_job(s: Session, job_id: str) -> None:
    """Delete the job and its gangs, tasks and events. NotFound if absent."""
    raise NotImplementedError


# --- gangs ------------------------------------------------------------------------------------------------
def get_gangs(s: Session, job_id: str) -> list[Gang]:
    """Ordered by index."""
    raise NotImplementedError


def gangs_in_states(s: Session, states: Sequence[GangState]) -> list[Gang]:
    """Every gang (of any job) in one of `states`, ordered by (job_id, index)."""
    raise NotImplementedError


def update_gangs(s: Session, gangs: Sequence[Gang]) -> None:
    """Batch write of state, attempt, reason, launch_deadline, updated_at."""
    raise NotImplementedError


# --- tasks ------------------------------------------------------------------------------------------------
def get_tasks(s: Session, job_id: str, instances: Sequence[int] | None = None) -> list[Task]:
    """Ordered by instance. NotFound is not raised; an unknown job gives []."""
    raise NotImplementedError


def get_tasks_by_keys(s: Session, keys: Iterable[tuple[str, int]]) -> dict[tuple[str, int], Task]:
    """Batch lookup by (job_id, instance)."""
    raise NotImplementedError


def update_tasks(s: Session, tasks: Sequence[Task]) -> None:
    """Batch write of every mutable field of each task (attempt, state, host, address, ports, gpu_ids,
    exit_code, reason, message, started_at, finished_at, updated_at)."""
    raise NotImplementedError


def task_state_counts(s: Session, job_ids: Sequence[str]) -> dict[str, dict[str, int]]:
    """job_id -> {state: count}, one query."""
    raise NotImplementedError


# --- task events (history) --------------------------------------------------------------------------------
def append_task_events(s: Session, events: Sequence[TaskEvent]) -> None:
    """Multi-row insert."""
    raise NotImplementedError


def get_task_events(s: Session, job_id: str, instance: int) -> list[TaskEvent]:
    """Oldest first."""
    raise NotImplementedError


# --- resource pools ---------------------------------------------------------------------------------------
def create_pool(s: Session, pool: ResourcePool) -> None:
    """AlreadyExists if the path exists; NotFound (field 'path') if the parent does not exist."""
    raise NotImplementedError


def get_pool(s: Session, path: str) -> ResourcePool:
    raise NotImplementedError


def list_pools(s: Session) -> list[ResourcePool]:
    """Ordered by path."""
    raise NotImplementedError


def delete_pool(s: Session, path: str) -> None:
    """NotFound if absent; FailedPrecondition for '/', a pool with children, or a pool with unfinished jobs."""
    raise NotImplementedError


def ensure_root_pool(s: Session, now: float) -> None:
    """Create '/' if it does not exist (idempotent)."""
    raise NotImplementedError


# --- small key/value facts (framework id, schema facts) ------------------------------------------------------
def get_meta(s: Session, key: str) -> str | None:
    raise NotImplementedError


def set_meta(s: Session, key: str, value: str) -> None:
    raise NotImplementedError
