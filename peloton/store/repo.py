"""Store functions. Each takes a Session, never commits, and speaks domain types only.

Hot paths are batched: the `*_many` / list-taking functions issue multi-row statements, never one
round trip per task.

Reads select table columns (Core rows), not ORM entities, so nothing is cached in the session's identity
map and a read after a bulk UPDATE in the same session always sees the new values.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import (
    Row,
    Table,
    delete,
    exists,
    func,
    insert,
    select,
    text,
    tuple_,
    update,
)
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from peloton.domain.model import AuditEvent, Gang, Job, ResourcePool, StoredModel, Task, TaskEvent
from peloton.domain.resources import Resources
from peloton.domain.spec import spec_from_dict, spec_to_dict
from peloton.domain.states import GangState, JobState, TaskState
from peloton.errors import AlreadyExists, Conflict, FailedPrecondition, NotFound
from peloton.store import bulk
from peloton.store.models import (
    AuditEventRow,
    GangRow,
    JobRow,
    MetaRow,
    ModelRow,
    ResourcePoolRow,
    TaskEventRow,
    TaskRow,
    TaskUidRow,
)

_JOBS: Table = JobRow.__table__  # type: ignore[assignment]
_GANGS: Table = GangRow.__table__  # type: ignore[assignment]
_TASKS: Table = TaskRow.__table__  # type: ignore[assignment]
_EVENTS: Table = TaskEventRow.__table__  # type: ignore[assignment]
_POOLS: Table = ResourcePoolRow.__table__  # type: ignore[assignment]
_META: Table = MetaRow.__table__  # type: ignore[assignment]
_AUDIT: Table = AuditEventRow.__table__  # type: ignore[assignment]
_TASK_UIDS: Table = TaskUidRow.__table__  # type: ignore[assignment]
_MODELS: Table = ModelRow.__table__  # type: ignore[assignment]

# Keys per statement for (job_id, instance) lookups: well under SQLite's bound-parameter limit.
_KEY_CHUNK = 2000
_JOB_COLS = ("state", "desired", "reason", "updated_at", "completed_at")
_GANG_COLS = ("state", "attempt", "reason", "launch_deadline", "updated_at", "preemptions", "plan")
_TASK_COLS = ("attempt", "state", "host", "address", "ports", "gpu_ids", "exit_code", "reason", "message",
              "started_at", "finished_at", "updated_at")  # the order of _task_mutable
_NO_SYNC = {"synchronize_session": False}
_JOB_TERMINAL = (JobState.SUCCEEDED.value, JobState.FAILED.value, JobState.KILLED.value)


def _update(s: Session, table: Table, keys: tuple[str, ...], cols: tuple[str, ...], rows: Sequence[Sequence[Any]],
            what: str) -> None:
    """UPDATE rows by primary key (each row: key values, then `cols`' values); NotFound (naming `what`) if a row
    does not exist (the caller must roll back: other rows may have been written)."""
    n = bulk.update_rows(s, table, keys, cols, rows)
    if n != len(rows):
        sample = ", ".join("/".join(str(v) for v in r[:len(keys)]) for r in rows[:5])
        raise NotFound(f"{len(rows) - n} of the {what} to update do not exist (batch of {len(rows)}: {sample})")


# --- conversions ------------------------------------------------------------------------------------------
def _dumps(v: Any) -> str:
    return json.dumps(v, separators=(",", ":"), sort_keys=True)


def _int_list(xs: Sequence[int]) -> str:
    """json.dumps of a list of ints, without json's overhead (it runs for every task row written)."""
    return "[" + ",".join(str(int(x)) for x in xs) + "]"


def _job_to_dict(job: Job) -> dict[str, Any]:
    spec = job.spec
    return {
        "id": job.id,
        "name": spec.name,
        "owner": spec.owner,
        "respool": spec.respool,
        "spec": _dumps(spec_to_dict(spec)),
        "state": JobState(job.state).value,
        "desired": job.desired,
        "reason": job.reason,
        "priority": spec.priority,
        "created_at": job.created_at,
        "updated_at": job.updated_at,
        "completed_at": job.completed_at,
        "request_id": job.request_id or None,
    }


def _job_from_row(r: Row[Any]) -> Job:
    return Job(
        id=r.id,
        spec=spec_from_dict(json.loads(r.spec)),
        state=JobState(r.state),
        desired=r.desired,
        reason=r.reason,
        created_at=r.created_at,
        updated_at=r.updated_at,
        completed_at=r.completed_at,
        request_id=r.request_id or "",
    )


def _gang_to_dict(g: Gang) -> dict[str, Any]:
    return {
        "job_id": g.job_id,
        "idx": g.index,
        "instances": _int_list(g.instances),
        "state": GangState(g.state).value,
        "attempt": g.attempt,
        "reason": g.reason,
        "launch_deadline": g.launch_deadline,
        "updated_at": g.updated_at,
        "preemptions": g.preemptions,
        "plan": g.plan,
    }


def _gang_from_row(r: Row[Any]) -> Gang:
    return Gang(
        job_id=r.job_id,
        index=r.idx,
        instances=[int(i) for i in json.loads(r.instances)],
        state=GangState(r.state),
        attempt=r.attempt,
        reason=r.reason,
        launch_deadline=r.launch_deadline,
        updated_at=r.updated_at,
        preemptions=r.preemptions,
        plan=r.plan,
    )


def _task_mutable(t: Task) -> dict[str, Any]:
    return {
        "attempt": t.attempt,
        "state": TaskState(t.state).value,
        "host": t.host,
        "address": t.address,
        "ports": _int_list(t.ports),
        "gpu_ids": _int_list(t.gpu_ids),
        "exit_code": t.exit_code,
        "reason": t.reason,
        "message": t.message,
        "started_at": t.started_at,
        "finished_at": t.finished_at,
        "updated_at": t.updated_at,
    }


def _task_to_dict(t: Task) -> dict[str, Any]:
    return {"job_id": t.job_id, "instance": t.instance, "gang_index": t.gang_index, **_task_mutable(t)}


def _task_from_row(r: Row[Any]) -> Task:
    return Task(
        job_id=r.job_id,
        instance=r.instance,
        gang_index=r.gang_index,
        attempt=r.attempt,
        state=TaskState(r.state),
        host=r.host,
        address=r.address,
        ports=[int(p) for p in json.loads(r.ports)],
        gpu_ids=[int(g) for g in json.loads(r.gpu_ids)],
        exit_code=r.exit_code,
        reason=r.reason,
        message=r.message,
        started_at=r.started_at,
        finished_at=r.finished_at,
        updated_at=r.updated_at,
    )


def _event_to_dict(e: TaskEvent) -> dict[str, Any]:
    return {
        "job_id": e.job_id,
        "instance": e.instance,
        "attempt": e.attempt,
        "state": TaskState(e.state).value,
        "time": e.time,
        "host": e.host,
        "reason": e.reason,
        "message": e.message,
        "exit_code": e.exit_code,
    }


def _event_from_row(r: Row[Any]) -> TaskEvent:
    return TaskEvent(
        job_id=r.job_id,
        instance=r.instance,
        attempt=r.attempt,
        state=TaskState(r.state),
        time=r.time,
        host=r.host,
        reason=r.reason,
        message=r.message,
        exit_code=r.exit_code,
    )


def _res_to_json(res: Resources) -> str:
    return _dumps({"cpu": res.cpu, "mem": res.mem, "disk": res.disk, "gpu": res.gpu, "ports": res.ports})


def _res_from_json(text: str) -> Resources:
    d = json.loads(text)
    return Resources(
        cpu=float(d.get("cpu", 0.0)),
        mem=float(d.get("mem", 0.0)),
        disk=float(d.get("disk", 0.0)),
        gpu=int(d.get("gpu", 0)),
        ports=int(d.get("ports", 0)),
    )


def _pool_from_row(r: Row[Any]) -> ResourcePool:
    m = r._mapping
    limit = m["limit"]
    return ResourcePool(
        path=m["path"],
        reservation=_res_from_json(m["reservation"]),
        limit=None if limit is None else _res_from_json(limit),
        share=m["share"],
        created_at=m["created_at"],
        submitters=tuple(json.loads(m["submitters"] or "[]")),
        allow_root=bool(m["allow_root"]),
        reservation_type=m["reservation_type"],
    )


def _job_exists(s: Session, job_id: str) -> bool:
    return bool(s.execute(select(exists().where(_JOBS.c.id == job_id))).scalar())


def _pool_exists(s: Session, path: str) -> bool:
    return bool(s.execute(select(exists().where(_POOLS.c.path == path))).scalar())


# --- jobs -------------------------------------------------------------------------------------------------
def _core(s: Session) -> Connection:
    """The session's connection: bulk statements on hot paths skip the ORM layer (no entities involved)."""
    return s.connection()


def insert_job(s: Session, job: Job, gangs: Sequence[Gang], tasks: Sequence[Task]) -> None:
    """Insert a job with all its gangs and tasks (multi-row inserts). AlreadyExists if the id is taken (the
    transaction is then unusable: the caller rolls back)."""
    try:
        _core(s).execute(insert(_JOBS), [_job_to_dict(job)])
    except IntegrityError as e:
        raise AlreadyExists(f"job {job.id!r} already exists", field="id") from e
    insert_job_rows(s, gangs, tasks)


def insert_job_rows(s: Session, gangs: Sequence[Gang], tasks: Sequence[Task]) -> None:
    """More gangs and tasks of a job already inserted (a big job goes in several transactions)."""
    if gangs:
        _insert_rows(s, _GANGS, [_gang_to_dict(g) for g in gangs])
    if tasks:
        _insert_rows(s, _TASKS, [_task_to_dict(t) for t in tasks])


def refresh_job_statistics(s: Session) -> None:
    """After a big job's rows went in: on PostgreSQL, ANALYZE the tables it filled. Until autovacuum gets to them
    (a minute or more), the planner would guess their size from a stale or missing count and pick a hash join over
    a whole-table scan for each chunk of a bulk UPDATE instead of a primary-key lookup per row: stopping a
    100,000-task job then took 25 s in one writer transaction. On SQLite an UPDATE by primary key always uses it."""
    if s.get_bind().dialect.name == "postgresql":
        s.execute(text(f"ANALYZE {_GANGS.name}, {_TASKS.name}, {_EVENTS.name}"))


def _insert_rows(s: Session, table: Table, rows: list[dict[str, Any]]) -> None:
    if rows:
        cols = tuple(rows[0])
        bulk.insert_rows(s, table, cols, [tuple(r[c] for c in cols) for r in rows])


def job_id_for_request(s: Session, request_id: str) -> str | None:
    """The job created with this idempotency key, if any."""
    return s.execute(select(_JOBS.c.id).where(_JOBS.c.request_id == request_id)).scalar_one_or_none()


def get_job(s: Session, job_id: str) -> Job:
    """NotFound if absent."""
    row = s.execute(select(_JOBS).where(_JOBS.c.id == job_id)).first()
    if row is None:
        raise NotFound(f"job {job_id!r} not found", field="id")
    return _job_from_row(row)


def get_jobs(s: Session, job_ids: Iterable[str]) -> dict[str, Job]:
    """Batch lookup; missing ids are simply absent from the result."""
    ids = list(dict.fromkeys(job_ids))
    if not ids:
        return {}
    rows = s.execute(select(_JOBS).where(_JOBS.c.id.in_(ids))).all()
    return {r.id: _job_from_row(r) for r in rows}


def list_jobs(
    s: Session,
    *,
    states: Sequence[JobState] | None = None,
    owner: str | None = None,
    respool: str | None = None,
    name_contains: str | None = None,
    limit: int = 100,
    after: tuple[float, str] | None = None,
) -> list[Job]:
    """Newest first; `after` = (created_at, id) of the last job of the previous page."""
    q = select(_JOBS)
    if after is not None:
        q = q.where((_JOBS.c.created_at < after[0]) | ((_JOBS.c.created_at == after[0]) & (_JOBS.c.id < after[1])))
    if states is not None:
        q = q.where(_JOBS.c.state.in_([JobState(st).value for st in states]))
    if owner is not None:
        q = q.where(_JOBS.c.owner == owner)
    if respool is not None:
        q = q.where(_JOBS.c.respool == respool)
    if name_contains:
        # Case-insensitive on both backends (SQLite's LIKE already is; PostgreSQL's is not).
        q = q.where(_JOBS.c.name.icontains(name_contains, autoescape=True))
    q = q.order_by(_JOBS.c.created_at.desc(), _JOBS.c.id.desc()).limit(max(0, int(limit)))
    return [_job_from_row(r) for r in s.execute(q).all()]


def count_jobs(s: Session, *, owner: str, states: Sequence[JobState]) -> int:
    """How many jobs of `owner` are in one of `states` (indexed by owner)."""
    q = select(func.count()).select_from(_JOBS).where(
        _JOBS.c.owner == owner, _JOBS.c.state.in_([JobState(st).value for st in states]))
    return int(s.execute(q).scalar_one())


def update_job(s: Session, job: Job) -> None:
    """Write state, desired, reason, updated_at, completed_at of `job`. NotFound if absent."""
    update_jobs(s, [job])


def update_jobs(s: Session, jobs: Sequence[Job]) -> None:
    """Batch write of state, desired, reason, updated_at, completed_at. NotFound if a job does not exist."""
    _update(s, _JOBS, ("id",), _JOB_COLS,
            [(j.id, JobState(j.state).value, j.desired, j.reason, j.updated_at, j.completed_at) for j in jobs], "jobs")


def delete_job(s: Session, job_id: str) -> None:
    """Delete the job and its gangs, tasks and events. NotFound if absent."""
    if not _job_exists(s, job_id):
        raise NotFound(f"job {job_id!r} not found", field="id")
    for model in (TaskEventRow, TaskRow, GangRow):
        s.execute(delete(model).where(model.job_id == job_id).execution_options(**_NO_SYNC))
    s.execute(delete(JobRow).where(JobRow.id == job_id).execution_options(**_NO_SYNC))


# --- gangs ------------------------------------------------------------------------------------------------
def get_gangs(s: Session, job_id: str, limit: int | None = None) -> list[Gang]:
    """Ordered by index (the first `limit`)."""
    q = select(_GANGS).where(_GANGS.c.job_id == job_id).order_by(_GANGS.c.idx)
    if limit is not None:
        q = q.limit(limit)
    return [_gang_from_row(r) for r in s.execute(q).all()]


def gang_state_counts(s: Session, job_id: str) -> dict[str, int]:
    """state -> number of the job's gangs in it."""
    rows = s.execute(select(_GANGS.c.state, func.count()).where(_GANGS.c.job_id == job_id)
                     .group_by(_GANGS.c.state)).all()
    return {state: int(n) for state, n in rows}


def gangs_in_states(s: Session, states: Sequence[GangState]) -> list[Gang]:
    """Every gang (of any job) in one of `states`, ordered by (job_id, index)."""
    values = [GangState(st).value for st in states]
    if not values:
        return []
    rows = s.execute(
        select(_GANGS).where(_GANGS.c.state.in_(values)).order_by(_GANGS.c.job_id, _GANGS.c.idx)
    ).all()
    return [_gang_from_row(r) for r in rows]


def update_gangs(s: Session, gangs: Sequence[Gang]) -> None:
    """Batch write of state, attempt, reason, launch_deadline, updated_at, preemptions, plan. NotFound if a gang does
    not exist (the caller must roll back: other rows of the batch may have been written)."""
    _update(s, _GANGS, ("job_id", "idx"), _GANG_COLS,
            [(g.job_id, g.index, GangState(g.state).value, g.attempt, g.reason, g.launch_deadline, g.updated_at,
              g.preemptions, g.plan) for g in gangs], "gangs")


# --- tasks ------------------------------------------------------------------------------------------------
def get_tasks(s: Session, job_id: str, instances: Sequence[int] | None = None, *, after: int | None = None,
              limit: int | None = None) -> list[Task]:
    """Ordered by instance (from the first after `after`, at most `limit`). An unknown job gives []."""
    q = select(_TASKS).where(_TASKS.c.job_id == job_id)
    if instances is not None:
        wanted = sorted({int(i) for i in instances})
        if not wanted:
            return []
        q = q.where(_TASKS.c.instance.in_(wanted))
    if after is not None:
        q = q.where(_TASKS.c.instance > after)
    q = q.order_by(_TASKS.c.instance)
    if limit is not None:
        q = q.limit(limit)
    return [_task_from_row(r) for r in s.execute(q).all()]


def get_job_records(s: Session, job_ids: Sequence[str]) -> dict[str, tuple[Job, list[Gang], list[Task]]]:
    """Jobs with all their gangs and tasks, in three queries per chunk of jobs (not three per job)."""
    out: dict[str, tuple[Job, list[Gang], list[Task]]] = {}
    ids = list(dict.fromkeys(job_ids))
    for start in range(0, len(ids), _KEY_CHUNK):
        chunk = ids[start:start + _KEY_CHUNK]
        jobs = get_jobs(s, chunk)
        for jid, job in jobs.items():
            out[jid] = (job, [], [])
        if not jobs:
            continue
        for r in s.execute(select(_GANGS).where(_GANGS.c.job_id.in_(list(jobs))).order_by(_GANGS.c.job_id,
                                                                                         _GANGS.c.idx)):
            out[r.job_id][1].append(_gang_from_row(r))
        for r in s.execute(select(_TASKS).where(_TASKS.c.job_id.in_(list(jobs))).order_by(_TASKS.c.job_id,
                                                                                         _TASKS.c.instance)):
            out[r.job_id][2].append(_task_from_row(r))
    return out


def get_tasks_by_keys(s: Session, keys: Iterable[tuple[str, int]]) -> dict[tuple[str, int], Task]:
    """Batch lookup by (job_id, instance)."""
    wanted = list(dict.fromkeys((str(j), int(i)) for j, i in keys))
    out: dict[tuple[str, int], Task] = {}
    for start in range(0, len(wanted), _KEY_CHUNK):
        chunk = wanted[start : start + _KEY_CHUNK]
        rows = s.execute(select(_TASKS).where(tuple_(_TASKS.c.job_id, _TASKS.c.instance).in_(chunk))).all()
        for r in rows:
            out[(r.job_id, r.instance)] = _task_from_row(r)
    return out


def update_tasks(s: Session, tasks: Sequence[Task]) -> None:
    """Batch write of every mutable field of each task (attempt, state, host, address, ports, gpu_ids,
    exit_code, reason, message, started_at, finished_at, updated_at). NotFound if a task does not exist
    (the caller must roll back: other rows of the batch may have been written)."""
    _update(s, _TASKS, ("job_id", "instance"), _TASK_COLS,
            [(t.job_id, t.instance, *_task_mutable(t).values()) for t in tasks], "tasks")


def task_state_counts(s: Session, job_ids: Sequence[str]) -> dict[str, dict[str, int]]:
    """job_id -> {state: count}, one query. Every requested id is a key ({} when it has no tasks)."""
    ids = list(dict.fromkeys(job_ids))
    out: dict[str, dict[str, int]] = {j: {} for j in ids}
    if not ids:
        return out
    rows = s.execute(
        select(_TASKS.c.job_id, _TASKS.c.state, func.count())
        .where(_TASKS.c.job_id.in_(ids))
        .group_by(_TASKS.c.job_id, _TASKS.c.state)
    ).all()
    for job_id, state, n in rows:
        out[job_id][state] = int(n)
    return out


# --- task events (history) --------------------------------------------------------------------------------
def append_task_events(s: Session, events: Sequence[TaskEvent]) -> None:
    """Multi-row insert."""
    if not events:
        return
    _insert_rows(s, _EVENTS, [_event_to_dict(e) for e in events])


def append_audit_events(s: Session, events: Sequence[AuditEvent]) -> None:
    """Multi-row insert (ids come from the store)."""
    if events:
        _insert_rows(s, _AUDIT, [{"at": e.at, "principal": e.principal[:128], "via": e.via[:32],
                                  "method": e.method[:128], "object": e.object[:512], "allowed": e.allowed,
                                  "code": e.code[:32], "message": e.message[:4096]} for e in events])


def list_audit_events(s: Session, *, principal: str = "", obj: str = "", since: float = 0.0, until: float = 0.0,
                      denied_only: bool = False, limit: int = 100, before_id: int = 0) -> list[AuditEvent]:
    """Newest first (by id, which follows insertion)."""
    q = select(_AUDIT)
    if principal:
        q = q.where(_AUDIT.c.principal == principal)
    if obj:
        q = q.where(_AUDIT.c.object == obj)
    if since:
        q = q.where(_AUDIT.c.at >= since)
    if until:
        q = q.where(_AUDIT.c.at < until)
    if denied_only:
        q = q.where(_AUDIT.c.allowed.is_(False))
    if before_id:
        q = q.where(_AUDIT.c.id < before_id)
    q = q.order_by(_AUDIT.c.id.desc()).limit(max(0, int(limit)))
    return [AuditEvent(at=r.at, principal=r.principal, via=r.via, method=r.method, object=r.object,
                       allowed=bool(r.allowed), code=r.code, message=r.message, id=r.id) for r in s.execute(q).all()]


def get_task_events(s: Session, job_id: str, instance: int, newest: int | None = None) -> list[TaskEvent]:
    """Oldest first (only the `newest` ones when given)."""
    q = select(_EVENTS).where(_EVENTS.c.job_id == job_id, _EVENTS.c.instance == instance)
    if newest is not None:
        q = q.order_by(_EVENTS.c.time.desc(), _EVENTS.c.id.desc()).limit(newest)
        return [_event_from_row(r) for r in reversed(s.execute(q).all())]
    return [_event_from_row(r) for r in s.execute(q.order_by(_EVENTS.c.time, _EVENTS.c.id)).all()]


def count_task_events(s: Session, job_id: str, instance: int) -> int:
    return int(s.execute(select(func.count()).select_from(_EVENTS)
                         .where(_EVENTS.c.job_id == job_id, _EVENTS.c.instance == instance)).scalar_one())


# --- resource pools ---------------------------------------------------------------------------------------
def create_pool(s: Session, pool: ResourcePool) -> None:
    """AlreadyExists if the path exists; NotFound (field 'path') if the parent does not exist."""
    if _pool_exists(s, pool.path):
        raise AlreadyExists(f"resource pool {pool.path!r} already exists", field="path")
    parent = pool.parent
    if parent is not None and not _pool_exists(s, parent):
        raise NotFound(f"parent pool {parent!r} of {pool.path!r} does not exist", field="path")
    s.execute(
        insert(ResourcePoolRow),
        [
            {
                "path": pool.path,
                "parent": parent,
                "reservation": _res_to_json(pool.reservation),
                "limit_": None if pool.limit is None else _res_to_json(pool.limit),
                "share": pool.share,
                "created_at": pool.created_at,
                "submitters": json.dumps(list(pool.submitters)),
                "allow_root": pool.allow_root,
                "reservation_type": pool.reservation_type,
            }
        ],
    )


def update_pool(s: Session, pool: ResourcePool) -> None:
    """Replace everything but the path (and parent, creation time) of an existing pool. NotFound if absent."""
    if not _pool_exists(s, pool.path):
        raise NotFound(f"resource pool {pool.path!r} not found", field="path")
    s.execute(
        update(ResourcePoolRow).where(ResourcePoolRow.path == pool.path).values(
            reservation=_res_to_json(pool.reservation),
            limit_=None if pool.limit is None else _res_to_json(pool.limit),
            share=pool.share,
            submitters=json.dumps(list(pool.submitters)),
            allow_root=pool.allow_root,
            reservation_type=pool.reservation_type,
        ).execution_options(**_NO_SYNC)
    )


def unfinished_jobs_in(s: Session, path: str) -> int:
    """Jobs of pool `path` (not its subtree) that have not ended."""
    return int(s.execute(
        select(func.count()).select_from(_JOBS).where(_JOBS.c.respool == path, _JOBS.c.state.not_in(_JOB_TERMINAL))
    ).scalar_one())


def get_pool(s: Session, path: str) -> ResourcePool:
    """NotFound (field 'path') if absent."""
    row = s.execute(select(_POOLS).where(_POOLS.c.path == path)).first()
    if row is None:
        raise NotFound(f"resource pool {path!r} not found", field="path")
    return _pool_from_row(row)


def list_pools(s: Session) -> list[ResourcePool]:
    """Ordered by path."""
    return [_pool_from_row(r) for r in s.execute(select(_POOLS).order_by(_POOLS.c.path)).all()]


def delete_pool(s: Session, path: str) -> None:
    """NotFound if absent; FailedPrecondition for '/', a pool with children, or a pool with unfinished jobs."""
    if path == "/":
        raise FailedPrecondition("the root pool '/' cannot be deleted", field="path")
    if not _pool_exists(s, path):
        raise NotFound(f"resource pool {path!r} not found", field="path")
    children = s.execute(select(_POOLS.c.path).where(_POOLS.c.parent == path).order_by(_POOLS.c.path)).scalars().all()
    if children:
        raise FailedPrecondition(
            f"resource pool {path!r} has child pools ({', '.join(children)}); delete them first", field="path"
        )
    busy = unfinished_jobs_in(s, path)
    if busy:
        raise FailedPrecondition(f"resource pool {path!r} has {busy} unfinished job(s)", field="path")
    s.execute(delete(ResourcePoolRow).where(ResourcePoolRow.path == path).execution_options(**_NO_SYNC))


def ensure_root_pool(s: Session, now: float) -> None:
    """Create '/' if it does not exist (idempotent)."""
    if not _pool_exists(s, "/"):
        create_pool(s, ResourcePool(path="/", created_at=now))


# --- small key/value facts (framework id, schema facts) ------------------------------------------------------
def get_meta(s: Session, key: str) -> str | None:
    return s.execute(select(_META.c.value).where(_META.c.key == key)).scalar_one_or_none()


def set_meta(s: Session, key: str, value: str) -> None:
    res = s.execute(update(MetaRow).where(MetaRow.key == key).values(value=value).execution_options(**_NO_SYNC))
    if getattr(res, "rowcount", 0) == 0:
        s.execute(insert(MetaRow), [{"key": key, "value": value}])


# --- task identities: the uid allocated to each principal without a mapped Unix user (run_as.py) -----------------
def get_task_uid(s: Session, principal: str) -> int | None:
    return s.execute(select(_TASK_UIDS.c.uid).where(_TASK_UIDS.c.principal == principal)).scalar_one_or_none()


def task_uids_taken(s: Session, lo: int, hi: int) -> set[int]:
    """Every uid of lo..hi allocated to some principal."""
    return set(s.execute(select(_TASK_UIDS.c.uid).where(_TASK_UIDS.c.uid.between(lo, hi))).scalars())


def insert_task_uid(s: Session, principal: str, uid: int, now: float) -> None:
    """AlreadyExists when the principal already has a uid or the uid is another's (a concurrent allocation; the
    transaction is then unusable: the caller rolls back and tries again)."""
    try:
        _core(s).execute(insert(_TASK_UIDS), [{"principal": principal, "uid": uid, "created_at": now}])
    except IntegrityError:
        raise AlreadyExists(f"uid {uid} or principal {principal!r} was allocated meanwhile") from None


# --- stored models (`peloton model ...`) ----------------------------------------------------------------------
def _model_from_row(r: Row[Any]) -> StoredModel:
    return StoredModel(name=r.name, owner=r.owner, document=r.document, version=r.version, created_at=r.created_at,
                       updated_at=r.updated_at)


def create_model(s: Session, m: StoredModel) -> None:
    """AlreadyExists (field 'name') if a model of that name exists. The row's version is `m.version` (1)."""
    if s.execute(select(_MODELS.c.name).where(_MODELS.c.name == m.name)).first() is not None:
        raise AlreadyExists(f"name: model {m.name!r} already exists (replace it with --replace)", field="name")
    try:
        _core(s).execute(insert(_MODELS), [{"name": m.name, "owner": m.owner, "document": m.document,
                                            "version": m.version, "created_at": m.created_at,
                                            "updated_at": m.updated_at}])
    except IntegrityError:  # created meanwhile by another call (the transaction is then unusable: it rolls back)
        raise AlreadyExists(f"name: model {m.name!r} already exists (replace it with --replace)",
                            field="name") from None


def replace_model(s: Session, name: str, document: str, now: float, version: int) -> StoredModel:
    """Replace the document of model `name`, which the caller read at `version`: its version goes up by one,
    updated_at becomes `now`; owner and created_at stay. NotFound if it is gone; Conflict if it changed since it
    was read (another replace, or deleted and created again)."""
    res = s.execute(update(_MODELS).where(_MODELS.c.name == name, _MODELS.c.version == version)
                    .values(document=document, version=version + 1, updated_at=now).execution_options(**_NO_SYNC))
    if getattr(res, "rowcount", 0) != 1:
        get_model(s, name)  # NotFound when it is gone
        raise Conflict(f"name: model {name!r} changed while it was being replaced; try again", field="name")
    return get_model(s, name)


def get_model(s: Session, name: str) -> StoredModel:
    """NotFound (field 'name') if absent."""
    row = s.execute(select(_MODELS).where(_MODELS.c.name == name)).first()
    if row is None:
        raise NotFound(f"name: no model {name!r}", field="name")
    return _model_from_row(row)


def list_models(s: Session, *, after: str | None = None, limit: int | None = None) -> list[StoredModel]:
    """By name; only those after `after` (a page's last name); at most `limit`."""
    # byte order on both stores (SQLite compares bytes; PostgreSQL would use the database's locale), so that a
    # list reads the same on either
    name = _MODELS.c.name.collate("C") if s.get_bind().dialect.name == "postgresql" else _MODELS.c.name
    q = select(_MODELS).order_by(name)
    if after is not None:
        q = q.where(name > after)
    if limit is not None:
        q = q.limit(limit)
    return [_model_from_row(r) for r in s.execute(q).all()]


def delete_model(s: Session, name: str) -> None:
    """NotFound (field 'name') if absent."""
    res = s.execute(delete(_MODELS).where(_MODELS.c.name == name).execution_options(**_NO_SYNC))
    if getattr(res, "rowcount", 0) == 0:
        raise NotFound(f"name: no model {name!r}", field="name")


# --- host drains (a small map kept as one meta row: hosts are few, and drains fewer) ---------------------------
_DRAINS_KEY = "host_drains"


def get_drains(s: Session) -> dict[str, float]:
    """Draining hosts -> the deadline of each (clock time; 0: none)."""
    raw = get_meta(s, _DRAINS_KEY)
    return {str(k): float(v) for k, v in json.loads(raw).items()} if raw else {}


def set_drains(s: Session, drains: dict[str, float]) -> None:
    set_meta(s, _DRAINS_KEY, json.dumps(dict(sorted(drains.items()))))


# --- retention ----------------------------------------------------------------------------------------------
def finished_before(s: Session, before: float, limit: int) -> list[str]:
    """Ids of up to `limit` jobs that ended (SUCCEEDED, FAILED, KILLED) before `before`, oldest first."""
    done = [JobState.SUCCEEDED.value, JobState.FAILED.value, JobState.KILLED.value]
    q = (select(JobRow.id).where(JobRow.state.in_(done), JobRow.completed_at < before)
         .order_by(JobRow.completed_at, JobRow.id).limit(limit))
    return list(s.execute(q).scalars())


def delete_audit_before(s: Session, before: float, limit: int) -> int:
    """Delete up to `limit` audit records older than `before` (oldest first); how many went."""
    ids = list(s.execute(select(AuditEventRow.id).where(AuditEventRow.at < before)
                         .order_by(AuditEventRow.id).limit(limit)).scalars())
    if ids:
        s.execute(delete(AuditEventRow).where(AuditEventRow.id.in_(ids)).execution_options(**_NO_SYNC))
    return len(ids)


# --- the census: how many jobs, gangs and tasks are in each state (the metrics' gauges) -------------------------


def count_by_state(s: Session) -> dict[str, dict[str, int]]:
    """{"jobs": {state: n}, "gangs": {...}, "tasks": {...}}: one GROUP BY per table (a scan of each; the metrics
    endpoint asks at most every CENSUS_EVERY_S)."""
    out: dict[str, dict[str, int]] = {}
    for name, table in (("jobs", _JOBS), ("gangs", _GANGS), ("tasks", _TASKS)):
        rows = s.execute(select(table.c.state, func.count()).group_by(table.c.state)).all()
        out[name] = {str(state): int(n) for state, n in rows}
    return out
