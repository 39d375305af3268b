"""The store's interface: every read and write of the daemon's durable state goes through these functions.

The contract, for every public function here unless its docstring says otherwise:

- **Transactions belong to the caller.** Each function takes an open `Session`, runs its statements in it and never
  commits, rolls back or flushes ORM state: the caller opens one transaction with `db.transaction(sessions)` (commit
  on success, rollback on any error), so several calls commit together or not at all. Writes go through write
  sessions (`db.make_sessions`), reads through read sessions (`db.make_read_sessions`) unless they must see the
  caller's own uncommitted writes.
- **Domain types in, domain types out.** No row objects, ORM entities or SQL leave this module. Reads select table
  columns (Core rows), not ORM entities, so nothing is cached in the session's identity map and a read after a bulk
  UPDATE in the same session always sees the new values.
- **Errors are the project's** (`peloton/errors.py`): NotFound, AlreadyExists, FailedPrecondition, Conflict, each
  naming the field at fault where there is one. A store that cannot be reached surfaces from `db.transaction` as
  `StoreUnavailable`, not from here. A function that raised may have written part of its work (a batch's first
  chunks): the caller rolls back, which `db.transaction` does.
- **Batched.** The `*_many` / list-taking functions issue multi-row statements (a few per batch, chunked below the
  databases' bound-parameter limits), never one round trip per row; the hot writes bypass SQLAlchemy (`bulk.py`).

What differs between the two stores (db.py configures both):

- **Isolation.** SQLite: one writer at a time (writers `BEGIN IMMEDIATE`), so a write transaction's reads and
  checks stay true until it commits; a read transaction (plain `BEGIN`, WAL) sees one snapshot, taken at its first
  read. PostgreSQL: READ COMMITTED, the server's default: each *statement* sees the commits made before it began,
  so two reads in one transaction may see different commits, and a check followed by a write (`create_pool`,
  `delete_pool`, `set_meta`, `create_model`) can race a concurrent writer; where that matters the function says so.
- **A failed statement.** On PostgreSQL it aborts the whole transaction (every later statement fails); on SQLite
  the transaction goes on. Callers must not rely on either: after an error from here, roll back.
- **Text.** JSON values are stored as text, times as epoch seconds (floats), so both stores hold the same bytes.
  Ordering by a text column (model names) uses byte order on both (PostgreSQL's is otherwise the locale's).
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Iterable, Sequence
from enum import StrEnum
from typing import Any, TypeVar

from sqlalchemy import (
    Row,
    Table,
    and_,
    case,
    delete,
    exists,
    func,
    insert,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from peloton.domain.model import AuditEvent, Gang, Job, ResourcePool, StoredModel, Task, TaskEvent
from peloton.domain.resources import Resources
from peloton.domain.spec import spec_from_dict, spec_to_dict
from peloton.domain.states import GangState, JobState, TaskState
from peloton.errors import AlreadyExists, Conflict, FailedPrecondition, InvalidArgument, NotFound
from peloton.store import bulk
from peloton.store.db import DBAPI_INTEGRITY_ERRORS, RawTransaction
from peloton.store.models import (
    AuditEventRow,
    Base,
    GangRow,
    JobRow,
    MetaRow,
    ModelRow,
    ResourcePoolRow,
    TaskEventRow,
    TaskRow,
    TaskUidRow,
)


def _table(row: type[Base]) -> Table:
    """The Core table of a mapped class (its `__table__` is typed as any FromClause; ours are all tables)."""
    table = row.__table__
    assert isinstance(table, Table)
    return table


_JOBS = _table(JobRow)
_GANGS = _table(GangRow)
_TASKS = _table(TaskRow)
_EVENTS = _table(TaskEventRow)
_POOLS = _table(ResourcePoolRow)
_META = _table(MetaRow)
_AUDIT = _table(AuditEventRow)
_TASK_UIDS = _table(TaskUidRow)
_MODELS = _table(ModelRow)

# Job ids per statement of get_job_records: well under SQLite's bound-parameter limit.
_KEY_CHUNK = 2000
_JOB_COLS = ("state", "desired", "reason", "updated_at", "completed_at")
_GANG_COLS = ("state", "attempt", "reason", "launch_deadline", "updated_at", "preemptions", "plan")
_TASK_COLS = ("attempt", "state", "host", "address", "ports", "gpu_ids", "exit_code", "reason", "message",
              "started_at", "finished_at", "updated_at")  # the order of _task_values
_NO_SYNC = {"synchronize_session": False}
_JOB_TERMINAL = (JobState.SUCCEEDED.value, JobState.FAILED.value, JobState.KILLED.value)


def _update(s: bulk.Tx, table: Table, keys: tuple[str, ...], cols: tuple[str, ...], rows: Sequence[Sequence[Any]],
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


E = TypeVar("E", bound=StrEnum)


def _state_text(cls: type[E], v: E | str) -> str:
    """The column text of a state: a member of `cls` as it is (no enum lookup: this runs for every row written),
    anything else through `cls` (a value that is not one of its states raises)."""
    return v._value_ if type(v) is cls else cls(v).value


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


def _task_values(t: Task) -> tuple[Any, ...]:
    """A task's mutable columns' values, in _TASK_COLS order (a tuple: written for every task row updated)."""
    return (t.attempt, _state_text(TaskState, t.state), t.host, t.address, _int_list(t.ports), _int_list(t.gpu_ids),
            t.exit_code, t.reason, t.message, t.started_at, t.finished_at, t.updated_at)


def _task_update_row(t: Task) -> tuple[Any, ...]:
    return (t.job_id, t.instance, *_task_values(t))


_TASK_INSERT_COLS = ("job_id", "instance", "gang_index", *_TASK_COLS)


def _task_to_dict(t: Task) -> dict[str, Any]:
    return dict(zip(_TASK_INSERT_COLS, _task_insert_row(t), strict=True))


def _task_insert_row(t: Task) -> tuple[Any, ...]:
    return (t.job_id, t.instance, t.gang_index, *_task_values(t))


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


# A task_events row stands for the tasks `instance` .. `instance + span` of its job, which made one transition
# together (models.TaskEventRow): a gang's members as a rule, so a gang's transition is one row, not one per member.
# A run is at most EVENT_SPAN_MAX + 1 tasks, which bounds the rows a read of one task's history looks at: those of
# its job whose first instance is at most EVENT_SPAN_MAX below it (on the (job_id, instance) index).
EVENT_SPAN_MAX = 255
_EVENT_COLS = ("job_id", "instance", "span", "attempt", "state", "time", "host", "reason", "message", "exit_code")


def _event_rows(events: Iterable[TaskEvent]) -> list[tuple[Any, ...]]:
    """Task events as rows in _EVENT_COLS order, in their order: an event of the task after the last one's
    (same job, next instance) with the same attempt, state, time, host, reason, message and exit code joins its
    row (span + 1), up to EVENT_SPAN_MAX."""
    rows: list[tuple[Any, ...]] = []
    last: tuple[Any, ...] = ()
    job_id, first, span = "", 0, -1
    for e in events:
        rest = (e.attempt, _state_text(TaskState, e.state), e.time, e.host, e.reason, e.message, e.exit_code)
        if (span >= 0 and rest == last and e.job_id == job_id and e.instance == first + span + 1
                and span < EVENT_SPAN_MAX):
            span += 1
            continue
        if span >= 0:
            rows.append((job_id, first, span, *last))
        job_id, first, span, last = e.job_id, e.instance, 0, rest
    if span >= 0:
        rows.append((job_id, first, span, *last))
    return rows


def _events_of_row(r: Row[Any], wanted: Sequence[tuple[int, int]] | None = None) -> list[TaskEvent]:
    """A row's events, one per task it stands for (those in `wanted`, inclusive ranges, only, when given), by
    instance."""
    state = TaskState(r.state)
    first, last = r.instance, r.instance + r.span
    if wanted is None:
        instances: Iterable[int] = range(first, last + 1)
    else:
        instances = [i for a, b in wanted for i in range(max(a, first), min(b, last) + 1)]
    return [TaskEvent(job_id=r.job_id, instance=i, attempt=r.attempt, state=state, time=r.time, host=r.host,
                      reason=r.reason, message=r.message, exit_code=r.exit_code) for i in instances]


def _covering(job_id: str, lo: int, hi: int) -> list[Any]:
    """Where a task_events row stands for a task of `job_id` in `lo` .. `hi`: its first instance within
    EVENT_SPAN_MAX below `lo` or in the range (an index range), its last at `lo` or above."""
    return [_EVENTS.c.job_id == job_id, _EVENTS.c.instance.between(lo - EVENT_SPAN_MAX, hi),
            _EVENTS.c.instance + _EVENTS.c.span >= lo]


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
# Jobs, gangs, tasks and their events have one writer: the job manager's writer thread (jobmgr/writer.py), one
# transaction per group commit, which also deletes jobs (DeleteJob, retention). The exceptions are CreateJob's
# chunked insert of a big job (jobmgr/manager.py: INITIALIZED until its last chunk, and deleted again if a chunk
# fails) and recovery's clean-up of such a job at start. Everyone else reads, through read sessions.
def _core(s: Session) -> Connection:
    """The session's connection: bulk statements on hot paths skip the ORM layer (no entities involved)."""
    return s.connection()


def insert_job(s: Session, job: Job, gangs: Sequence[Gang], tasks: Sequence[Task]) -> None:
    """Insert a job with all its gangs and tasks (multi-row inserts). Write transaction; the rows are visible to
    others when the caller commits. AlreadyExists (field 'id') if the id is taken; the database's unique key decides,
    so two concurrent inserts of one id cannot both succeed on either store. After that error the transaction is
    unusable on PostgreSQL (and half-done on both): the caller rolls back. InvalidArgument (field 'respool') if
    the job's pool does not exist or has children (deleted, or given a child, since the create checked it;
    `_check_pools`)."""
    _check_pools(s, [job.spec.respool])
    try:
        _core(s).execute(insert(_JOBS), [_job_to_dict(job)])
    except IntegrityError as e:
        raise AlreadyExists(f"job {job.id!r} already exists", field="id") from e
    insert_job_rows(s, gangs, tasks)


def insert_job_rows(s: Session, gangs: Sequence[Gang], tasks: Sequence[Task]) -> None:
    """More gangs and tasks of a job already inserted: a big job goes in over several write transactions, one
    chunk each (jobmgr/manager.py), with the job INITIALIZED until the last. Nothing checks that the job exists: the
    foreign keys do (IntegrityError, a bug of the caller's)."""
    if gangs:
        _insert_rows(s, _GANGS, [_gang_to_dict(g) for g in gangs])
    if tasks:
        _insert_rows(s, _TASKS, [_task_to_dict(t) for t in tasks])


def refresh_job_statistics(s: Session) -> None:
    """After a big job's rows went in: on PostgreSQL, ANALYZE the tables it filled. Until autovacuum gets to them
    (a minute or more), the planner would guess their size from a stale or missing count and pick a hash join over
    a whole-table scan for each chunk of a bulk UPDATE instead of a primary-key lookup per row: stopping a
    100,000-task job then took 25 s in one writer transaction. On SQLite an UPDATE by primary key always uses it,
    and this does nothing. Its own write transaction, after the rows are committed (ANALYZE sees committed rows)."""
    if s.get_bind().dialect.name == "postgresql":
        s.execute(text(f"ANALYZE {_GANGS.name}, {_TASKS.name}, {_EVENTS.name}"))


def _insert_rows(s: Session, table: Table, rows: list[dict[str, Any]]) -> None:
    if rows:
        cols = tuple(rows[0])
        bulk.insert_rows(s, table, cols, [tuple(r[c] for c in cols) for r in rows])


def job_id_for_request(s: Session, request_id: str) -> str | None:
    """The job created with this idempotency key, if any (a unique column: at most one). Read transaction; on
    PostgreSQL a job created by a concurrent request after this read is not seen: the unique key then refuses the
    second insert."""
    return s.execute(select(_JOBS.c.id).where(_JOBS.c.request_id == request_id)).scalar_one_or_none()


def get_job(s: Session, job_id: str) -> Job:
    """The job (its row only: no gangs or tasks). NotFound (field 'id') if absent."""
    row = s.execute(select(_JOBS).where(_JOBS.c.id == job_id)).first()
    if row is None:
        raise NotFound(f"job {job_id!r} not found", field="id")
    return _job_from_row(row)


def get_jobs(s: Session, job_ids: Iterable[str]) -> dict[str, Job]:
    """Batch lookup, one query; missing ids are simply absent from the result (never NotFound)."""
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
    id_prefix: str | None = None,
    limit: int = 100,
    after: tuple[float, str] | None = None,
) -> list[Job]:
    """One page of jobs, newest first (created_at, then id, both descending, so the order is total);
    `after` = (created_at, id) of the last job of the previous page (keyset paging: stable while jobs are added).
    Filters combine with AND; `name_contains` is case-insensitive on both stores (ASCII letters only on SQLite,
    whose lower() knows no others); `id_prefix`: ids that start with it. One statement: on PostgreSQL a later read in the same transaction (e.g.
    task_state_counts) may see commits this one did not."""
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
    if id_prefix:
        q = q.where(_JOBS.c.id.startswith(id_prefix, autoescape=True))
    q = q.order_by(_JOBS.c.created_at.desc(), _JOBS.c.id.desc()).limit(max(0, int(limit)))
    return [_job_from_row(r) for r in s.execute(q).all()]


def count_jobs(s: Session, *, owner: str, states: Sequence[JobState]) -> int:
    """How many jobs of `owner` are in one of `states` (indexed by owner). One statement: a count, not a
    reservation (on PostgreSQL concurrent creates are not serialized against it)."""
    q = select(func.count()).select_from(_JOBS).where(
        _JOBS.c.owner == owner, _JOBS.c.state.in_([JobState(st).value for st in states]))
    return int(s.execute(q).scalar_one())


def update_jobs(s: Session, jobs: Sequence[Job]) -> None:
    """Batch write of state, desired, reason, updated_at, completed_at (other columns stay). NotFound if a job does
    not exist; the other rows may have been written: the caller rolls back. The job manager's writer thread is the
    only caller (one write transaction per group commit)."""
    _update(s, _JOBS, ("id",), _JOB_COLS, [_job_update_row(j) for j in jobs], "jobs")


def _job_update_row(j: Job) -> tuple[Any, ...]:
    return (j.id, JobState(j.state).value, j.desired, j.reason, j.updated_at, j.completed_at)


def delete_job(s: Session, job_id: str) -> None:
    """Delete the job and its events, tasks and gangs (four statements, children first; the foreign keys' ON DELETE
    CASCADE would too). NotFound (field 'id') if absent. Write transaction."""
    if not _job_exists(s, job_id):
        raise NotFound(f"job {job_id!r} not found", field="id")
    for model in (TaskEventRow, TaskRow, GangRow):
        s.execute(delete(model).where(model.job_id == job_id).execution_options(**_NO_SYNC))
    s.execute(delete(JobRow).where(JobRow.id == job_id).execution_options(**_NO_SYNC))


def _pools_to_check(pools: Iterable[str]) -> list[str]:
    """The pools a new job's insert checks (they exist, they are leaves): not the root, which is never deleted and
    takes jobs whatever its children."""
    return sorted({p for p in pools if p != "/"})


def _check_pools(s: bulk.Tx, pools: Iterable[str]) -> None:
    """InvalidArgument (field 'respool') unless every one of the new jobs' `pools` exists and is a leaf (its row's
    `children` is 0), each locked until the transaction ends (PostgreSQL; on SQLite the writer lock keeps the pool
    changes out). The create checked its pool before it was queued for the writer; DeletePool, which counts the
    pool's jobs, may have deleted it meanwhile, or CreatePool, which counts the parent's, given it a child. Neither
    may do so between this check and the commit: each locks the row first (delete_pool; CreatePool's
    lock_pool_tree), and on PostgreSQL a check that waited for that lock reads the row again as they left it."""
    wanted = _pools_to_check(pools)
    if wanted:
        found, leaves = bulk.count_pools(s, wanted)
        if leaves != len(wanted):
            raise _no_pool(wanted, len(wanted) - found)


def _no_pool(wanted: Sequence[str], missing: int) -> InvalidArgument:
    """The error of a batch whose new jobs' pools are not all leaves: `missing` of them do not exist (the others
    that fail have children)."""
    which = f"resource pool {wanted[0]}" if len(wanted) == 1 else f"one of the resource pools {', '.join(wanted)}"
    if missing:
        return InvalidArgument(f"respool: {which} does not exist (deleted while the job was being created)",
                               field="respool")
    which = wanted[0] if len(wanted) == 1 else which
    return InvalidArgument(f"respool: {which} has child pools (created while the job was being created); jobs go "
                           f"to a leaf pool", field="respool")


class Writes:
    """A group commit's writes, gathered and then sent together (`send`): new jobs with their gangs, tasks and first
    events, the updates of jobs, gangs and tasks, and task events. On PostgreSQL a batch that is not too big goes
    as one statement with the fence's epoch check and the new jobs' pools' check (bulk.write_batch: one round trip,
    then the commit); otherwise, and on SQLite (in-process: no round trips to save), one statement per table, as
    the functions above send them, after the pools' check. Errors are theirs: AlreadyExists (field 'id') for a job
    id taken, InvalidArgument (field 'respool') for a new job's pool deleted or given a child meanwhile, NotFound
    for an update of a row that does not exist; the caller rolls back."""

    def __init__(self) -> None:
        self._jobs: list[dict[str, Any]] = []
        self._inserts = {t.name: bulk.Insert(t, ()) for t in (_GANGS, _TASKS, _EVENTS)}
        self._created: set[str] = set()

    def insert_job(self, job: Job, gangs: Sequence[Gang], tasks: Sequence[Task]) -> None:
        # rendered now, as inserting it now would: a later change in this batch goes as an update
        self._jobs.append(_job_to_dict(job))
        gang_rows = [_gang_to_dict(g) for g in gangs]
        if gang_rows:
            cols = tuple(gang_rows[0])
            self._add(_GANGS, cols, [tuple(r[c] for c in cols) for r in gang_rows])
        self._add(_TASKS, _TASK_INSERT_COLS, [_task_insert_row(t) for t in tasks])
        self._created.add(job.id)

    def append_task_events(self, events: Sequence[TaskEvent]) -> int:
        """Add the events (a row for each run of consecutive tasks' same transition); how many rows that is."""
        rows = _event_rows(events)
        self._add(_EVENTS, _EVENT_COLS, rows)
        return len(rows)

    def _add(self, table: Table, cols: tuple[str, ...], rows: list[tuple[Any, ...]]) -> None:
        """Rows (tuples of `cols`' values) to insert into `table`; a table's rows all have the same columns."""
        if not rows:
            return
        ins = self._inserts[table.name]
        if not ins.cols:
            ins.cols = cols
        assert ins.cols == cols, (table.name, ins.cols, cols)
        ins.rows.extend(rows)

    def send(self, s: bulk.Tx, jobs: Sequence[Job] = (), gangs: Sequence[Gang] = (),
             tasks: Sequence[Task] = (), *, last: bool = False) -> None:
        """Send what was gathered, and the updates of `jobs`, `gangs`, `tasks` (by primary key). Only on the DB-API
        cursor (bulk.py): `s` may be a transaction without a Session (db.KeptConnection.raw_transaction). `last`:
        nothing follows in the transaction, so a raw one that sent nothing yet may be committed by this one
        statement (bulk.commit_batch, PostgreSQL)."""
        inserts, updates = self.parts(jobs, gangs, tasks)
        created = self._created
        if (s.get_bind().dialect.name == "postgresql" and bulk.fits_one_statement(inserts, updates)
                # one statement's parts share a snapshot: an update cannot see a row inserted beside it
                and not any(j.id in created for j in jobs)
                and not any(g.job_id in created for g in gangs) and not any(t.job_id in created for t in tasks)):
            self._send_one(s, inserts, updates, commit=last and isinstance(s, RawTransaction) and s.fresh)
            return
        if self._jobs:
            _check_pools(s, (j["respool"] for j in self._jobs))
            try:
                bulk.insert_rows(s, _JOBS, inserts[0].cols, inserts[0].rows)
            except DBAPI_INTEGRITY_ERRORS as e:
                raise AlreadyExists(self._taken(), field="id") from e
        for ins in inserts[1:3]:  # gangs, tasks; the events after the updates, as before
            if ins.rows:
                bulk.insert_rows(s, ins.table, ins.cols, ins.rows)
        for up, what in zip(updates, ("jobs", "gangs", "tasks"), strict=True):
            if up.rows:
                _update(s, up.table, up.keys, up.cols, up.rows, what)
        if inserts[3].rows:
            bulk.insert_rows(s, _EVENTS, inserts[3].cols, inserts[3].rows)

    def parts(self, jobs: Sequence[Job] = (), gangs: Sequence[Gang] = (),
              tasks: Sequence[Task] = ()) -> tuple[list[bulk.Insert], list[bulk.Update]]:
        """The rows to send: inserts of jobs, gangs, tasks, events; updates of jobs, gangs, tasks (some empty)."""
        updates = [
            bulk.Update(_JOBS, ("id",), _JOB_COLS, [_job_update_row(j) for j in jobs]),
            bulk.Update(_GANGS, ("job_id", "idx"), _GANG_COLS, [_gang_update_row(g) for g in gangs]),
            bulk.Update(_TASKS, ("job_id", "instance"), _TASK_COLS,
                        [_task_update_row(t) for t in tasks])]
        inserts = [bulk.Insert(_JOBS, tuple(self._jobs[0])) if self._jobs else bulk.Insert(_JOBS, ()),
                   *self._inserts.values()]
        inserts[0].rows = [tuple(r[c] for c in inserts[0].cols) for r in self._jobs]
        return inserts, updates

    def _taken(self) -> str:
        return f"job {self._jobs[0]['id']!r} already exists" if len(self._jobs) == 1 else \
            "a job of this batch already exists"

    def _send_one(self, s: bulk.Tx, inserts: list[bulk.Insert], updates: list[bulk.Update], commit: bool) -> None:
        with_rows = [u for u in updates if u.rows]
        pools = _pools_to_check(j["respool"] for j in self._jobs)
        try:
            if commit:
                assert isinstance(s, RawTransaction)
                bulk.commit_batch(s, inserts, updates, pools)
                return
            counts = bulk.write_batch(s, inserts, updates, pools)
        except bulk.NoPool as e:
            raise _no_pool(pools, e.missing) from e
        except bulk.Missing as e:
            counts = [len(u.rows) for u in with_rows]
            counts[e.index] = e.found
        except Exception as e:
            # a job id (or request id) taken: a unique key of the jobs table, or of its gangs' or tasks' (keyed by
            # job id; the statement's parts run in no set order). psycopg2's own error: no SQLAlchemy here
            if self._jobs and type(e).__name__ == "UniqueViolation" and \
                    getattr(getattr(e, "diag", None), "table_name", None) in (_JOBS.name, _GANGS.name, _TASKS.name):
                raise AlreadyExists(self._taken(), field="id") from e
            raise
        for up, n, what in zip(with_rows, counts,
                               [w for u, w in zip(updates, ("jobs", "gangs", "tasks"), strict=True) if u.rows],
                               strict=True):
            if n != len(up.rows):
                sample = ", ".join("/".join(str(v) for v in r[:len(up.keys)]) for r in up.rows[:5])
                raise NotFound(f"{len(up.rows) - n} of the {what} to update do not exist (batch of {len(up.rows)}: "
                               f"{sample})")


# --- gangs ------------------------------------------------------------------------------------------------
def get_gangs(s: Session, job_id: str, limit: int | None = None) -> list[Gang]:
    """The job's gangs ordered by index (the first `limit`); [] for an unknown job."""
    q = select(_GANGS).where(_GANGS.c.job_id == job_id).order_by(_GANGS.c.idx)
    if limit is not None:
        q = q.limit(limit)
    return [_gang_from_row(r) for r in s.execute(q).all()]


def gang_state_counts(s: Session, job_id: str) -> dict[str, int]:
    """state -> number of the job's gangs in it (states with none are absent); {} for an unknown job."""
    rows = s.execute(select(_GANGS.c.state, func.count()).where(_GANGS.c.job_id == job_id)
                     .group_by(_GANGS.c.state)).all()
    return {state: int(n) for state, n in rows}


def gangs_in_states(s: Session, states: Sequence[GangState]) -> list[Gang]:
    """Every gang (of any job) in one of `states`, ordered by (job_id, index); recovery reads it at start."""
    values = [GangState(st).value for st in states]
    if not values:
        return []
    rows = s.execute(
        select(_GANGS).where(_GANGS.c.state.in_(values)).order_by(_GANGS.c.job_id, _GANGS.c.idx)
    ).all()
    return [_gang_from_row(r) for r in rows]


def update_gangs(s: Session, gangs: Sequence[Gang]) -> None:
    """Batch write of state, attempt, reason, launch_deadline, updated_at, preemptions, plan (instances stay).
    NotFound if a gang does not exist; the other rows of the batch may have been written: the caller rolls back."""
    _update(s, _GANGS, ("job_id", "idx"), _GANG_COLS, [_gang_update_row(g) for g in gangs], "gangs")


def _gang_update_row(g: Gang) -> tuple[Any, ...]:
    return (g.job_id, g.index, GangState(g.state).value, g.attempt, g.reason, g.launch_deadline, g.updated_at,
            g.preemptions, g.plan)


# --- tasks ------------------------------------------------------------------------------------------------
def get_tasks(s: Session, job_id: str, instances: Sequence[int] | None = None, *, after: int | None = None,
              limit: int | None = None) -> list[Task]:
    """The job's tasks ordered by instance (`instances` only when given; from the first after `after`; at most
    `limit`). An unknown job gives [] (callers that must tell the two apart read the job too, in the same
    transaction)."""
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
    """Jobs with all their gangs and tasks, in three queries per chunk of jobs (not three per job): the writer's
    cache fill, inside its write transaction (the writer thread is the one writer of job state, so what it read
    stays true until it commits, on PostgreSQL too). Missing ids are absent from the result."""
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


def update_tasks(s: Session, tasks: Sequence[Task]) -> None:
    """Batch write of every mutable field of each task (attempt, state, host, address, ports, gpu_ids,
    exit_code, reason, message, started_at, finished_at, updated_at). NotFound if a task does not exist
    (the caller must roll back: other rows of the batch may have been written)."""
    _update(s, _TASKS, ("job_id", "instance"), _TASK_COLS,
            [_task_update_row(t) for t in tasks], "tasks")


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
    """Multi-row insert of task history, consecutive tasks' same transition as one row (_event_rows; COPY on
    PostgreSQL for big batches, bulk.py); ids come from the store, and with time they give get_task_events' order.
    Nothing checks the task exists: the foreign key to the job does."""
    if events:
        bulk.insert_rows(s, _EVENTS, _EVENT_COLS, _event_rows(events))


def append_audit_events(s: Session, events: Sequence[AuditEvent]) -> None:
    """Multi-row insert (ids come from the store, increasing in commit order on SQLite, in allocation order on
    PostgreSQL). Text fields are cut to their column's width, so a long value never fails the batch. Its own write
    transaction (api/audit.py's flusher), apart from the call it records."""
    if events:
        _insert_rows(s, _AUDIT, [{"at": e.at, "principal": e.principal[:128], "via": e.via[:32],
                                  "method": e.method[:128], "object": e.object[:512], "allowed": e.allowed,
                                  "code": e.code[:32], "message": e.message[:4096]} for e in events])


def list_audit_events(s: Session, *, principal: str = "", obj: str = "", since: float = 0.0, until: float = 0.0,
                      denied_only: bool = False, limit: int = 100, before_id: int = 0) -> list[AuditEvent]:
    """Newest first (by id, which follows insertion), after the filters (AND; an empty or zero filter is
    none); `before_id` pages. Read transaction."""
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
    """One task's history, oldest first (time, then id); only the `newest` ones when given. [] for an unknown
    task."""
    q = select(_EVENTS).where(*_covering(job_id, instance, instance))
    if newest is not None:
        q = q.order_by(_EVENTS.c.time.desc(), _EVENTS.c.id.desc()).limit(newest)
        rows = list(reversed(s.execute(q).all()))
    else:
        rows = list(s.execute(q.order_by(_EVENTS.c.time, _EVENTS.c.id)).all())
    return [e for r in rows for e in _events_of_row(r, ((instance, instance),))]


def get_attempt_events(s: Session, job_id: str, instance: int, attempt: int, newest: int = 100) -> list[TaskEvent]:
    """One attempt's events of one task, oldest first (time, then id); the `newest` of them. [] for an unknown
    task or attempt. On the (job_id, instance) index, filtered by attempt: found however long the task's history
    (its rows read once; no index of its own: every status change inserts into this table)."""
    q = (select(_EVENTS).where(_EVENTS.c.attempt == attempt, *_covering(job_id, instance, instance))
         .order_by(_EVENTS.c.time.desc(), _EVENTS.c.id.desc()).limit(max(0, int(newest))))
    return [e for r in reversed(s.execute(q).all()) for e in _events_of_row(r, ((instance, instance),))]


def list_task_events(s: Session, job_id: str, instances: Sequence[int] | None = None, newest: int = 1000
                     ) -> tuple[list[TaskEvent], int]:
    """The job's history across its members (`instances` only, when given): the `newest` events, oldest first
    (time, then id, then instance), and how many match in all. One query for the rows (on the (job_id, instance)
    index), one for the total when there are more than `newest`: a gang's members side by side without a read per
    member. Members given as runs of consecutive instances (a gang's, as a rule) are asked for as ranges."""
    newest = max(0, int(newest))
    runs: list[tuple[int, int]] | None = None
    where: list[Any] = [_EVENTS.c.job_id == job_id]
    if instances is not None:
        runs = []
        for i in sorted({int(i) for i in instances}):
            if runs and runs[-1][1] == i - 1:
                runs[-1] = (runs[-1][0], i)
            else:
                runs.append((i, i))
        if not runs:
            return [], 0
        if len(runs) > 64:
            return _scattered_events(s, job_id, runs, newest)
        where = [or_(*[and_(*_covering(job_id, a, b)) for a, b in runs])]
    # each row holds an event asked for, so the newest `newest` rows hold the newest `newest` events
    q = select(_EVENTS).where(*where).order_by(_EVENTS.c.time.desc(), _EVENTS.c.id.desc()).limit(newest)
    rows = list(reversed(s.execute(q).all()))
    events = [e for r in rows for e in _events_of_row(r, runs)]
    if len(rows) < newest:
        return events[-newest:], len(events)
    total = int(s.execute(select(func.coalesce(func.sum(_covered(runs)), 0)).where(*where)).scalar_one())
    return events[-newest:], total


def _scattered_events(s: Session, job_id: str, runs: list[tuple[int, int]], newest: int
                      ) -> tuple[list[TaskEvent], int]:
    """list_task_events for members in too many runs to ask for as ranges: the rows across their whole range, light
    (id, first instance, span, time), counted here against the members; then the newest of those holding one."""
    wanted = [i for a, b in runs for i in range(a, b + 1)]
    light = s.execute(select(_EVENTS.c.time, _EVENTS.c.id, _EVENTS.c.instance, _EVENTS.c.span)
                      .where(*_covering(job_id, runs[0][0], runs[-1][1]))).all()
    held = sorted(((t, rid, n) for t, rid, first, span in light
                   if (n := bisect.bisect_right(wanted, first + span) - bisect.bisect_left(wanted, first))),
                  reverse=True)  # newest first
    ids, got = [], 0
    for _, rid, n in held:
        if got >= newest:
            break
        ids.append(rid)
        got += n
    rows: list[Row[Any]] = []
    for start in range(0, len(ids), _KEY_CHUNK):
        rows += s.execute(select(_EVENTS).where(_EVENTS.c.id.in_(ids[start:start + _KEY_CHUNK]))).all()
    rows.sort(key=lambda r: (r.time, r.id))
    events = [e for r in rows for e in _events_of_row(r, runs)]
    return events[max(0, len(events) - newest):] if newest else [], sum(n for _, _, n in held)


def _covered(runs: Sequence[tuple[int, int]] | None) -> Any:
    """How many of the tasks asked for (`runs`, inclusive ranges; None: all) a task_events row stands for, as SQL."""
    last = _EVENTS.c.instance + _EVENTS.c.span
    if runs is None:
        return _EVENTS.c.span + 1
    terms = []
    for a, b in runs:  # max(0, min(b, last) - max(a, first) + 1), as CASEs (SQLite has no LEAST/GREATEST)
        n = (case((last < b, last), else_=b) - case((_EVENTS.c.instance > a, _EVENTS.c.instance), else_=a) + 1)
        terms.append(case((n > 0, n), else_=0))
    return sum(terms[1:], terms[0])


def count_task_events(s: Session, job_id: str, instance: int) -> int:
    """How many history events one task has (0 for an unknown task)."""
    return int(s.execute(select(func.count()).select_from(_EVENTS)
                         .where(*_covering(job_id, instance, instance))).scalar_one())


# --- resource pools ---------------------------------------------------------------------------------------
# Written by the pool servicer (resmgr/service.py: the tree is checked and written in one transaction, then the
# resource manager reloads it) and at start ('/'); read whole (list_pools) by the resource and job managers.
def lock_pool_tree(s: Session, *paths: str | None) -> None:
    """Serialize the transactions that change the pool tree: each checks the new pool against the whole tree it has
    read (domain/pools.py: children within their parent's reservation), which READ COMMITTED on PostgreSQL lets two
    of them read before either writes (two siblings each passing alone, together over their parent). So each first
    locks the root's row (always there) until it commits. SQLite's writer lock already serializes them (FOR UPDATE
    is not rendered there).

    `paths` (None and '/' ignored): pools whose rows are locked too, in the same statement, after the root's (every
    locker takes the root first: no deadlock). CreatePool locks the parent's before it counts the parent's jobs:
    a new job's batch that holds it (bulk.write_batch, FOR KEY SHARE) commits first and is counted, and one that
    comes after waits for CreatePool and finds the parent a leaf no more (its row's `children`, create_pool)."""
    wanted = sorted({"/", *(p for p in paths if p)})
    where = _POOLS.c.path == "/" if len(wanted) == 1 else _POOLS.c.path.in_(wanted)
    s.execute(select(_POOLS.c.path).where(where).order_by(_POOLS.c.path).with_for_update())


def create_pool(s: Session, pool: ResourcePool) -> None:
    """Insert `pool`, and add 1 to its parent's count of children (`children`, the parent's own row: what a new
    job's commit checks, _check_pools). AlreadyExists (field 'path') if the path exists; NotFound (field 'path') if
    the parent does not exist. Checked by reading first; on PostgreSQL another call may create the pool (or delete
    its parent) between the check and the insert (on SQLite the writer lock serializes them): the keys refuse it,
    as Conflict (field 'path'; the transaction is then unusable: the caller rolls back, the client tries again). The
    callers lock the tree first (lock_pool_tree)."""
    if _pool_exists(s, pool.path):
        raise AlreadyExists(f"resource pool {pool.path!r} already exists", field="path")
    parent = pool.parent
    if parent is not None and not _pool_exists(s, parent):
        raise NotFound(f"parent pool {parent!r} of {pool.path!r} does not exist", field="path")
    try:
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
    except IntegrityError:
        raise Conflict(f"resource pool {pool.path!r} or its parent changed meanwhile; try again", field="path") from None
    if parent is not None:
        _count_child(s, parent, 1)


def _count_child(s: Session, parent: str, delta: int) -> None:
    s.execute(update(ResourcePoolRow).where(ResourcePoolRow.path == parent)
              .values(children=ResourcePoolRow.children + delta).execution_options(**_NO_SYNC))


def update_pool(s: Session, pool: ResourcePool) -> None:
    """Replace everything but the path (and parent, creation time) of an existing pool. NotFound (field 'path')
    if absent. The caller validates the new values against the tree (domain/pools.py) in the same transaction."""
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
    """How many jobs of pool `path` (not its subtree) have not ended."""
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
    """Every pool, ordered by path (the tree is small: the resource manager reloads it whole)."""
    return [_pool_from_row(r) for r in s.execute(select(_POOLS).order_by(_POOLS.c.path)).all()]


def delete_pool(s: Session, path: str) -> None:
    """Delete pool `path`, and take 1 from its parent's count of children. NotFound (field 'path') if absent;
    FailedPrecondition (field 'path') for '/', a pool with children, or a pool with unfinished jobs. A job being
    created in the pool meanwhile is either counted or refused at its commit (the pool's row lock on PostgreSQL,
    the writer lock on SQLite; `_check_pools`)."""
    if path == "/":
        raise FailedPrecondition("the root pool '/' cannot be deleted", field="path")
    # its row locked before its jobs are counted: a create whose batch holds it (bulk.write_batch, FOR KEY SHARE)
    # commits first and is counted; one that comes after waits for this delete and finds the pool gone
    row = s.execute(select(_POOLS.c.parent).where(_POOLS.c.path == path).with_for_update()).first()
    if row is None:
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
    if row.parent is not None:
        _count_child(s, row.parent, -1)


def ensure_root_pool(s: Session, now: float) -> None:
    """Create '/' if it does not exist (idempotent). At start, in its own write transaction."""
    if not _pool_exists(s, "/"):
        create_pool(s, ResourcePool(path="/", created_at=now))


# --- small key/value facts (framework id, schema facts) ------------------------------------------------------
# One row per key: the leaders' epochs (fence.py), the Mesos framework id, the host drains below; each written by
# the process that leads its role. (The store lock's rows live here too; lock.py writes them with its own SQL.)
def get_meta(s: Session, key: str) -> str | None:
    """The value of a small fact (`meta` row), None if unset."""
    return s.execute(select(_META.c.value).where(_META.c.key == key)).scalar_one_or_none()


def set_meta(s: Session, key: str, value: str) -> None:
    """Set a small fact: UPDATE, then INSERT if no row was there. On PostgreSQL two first writes of one key at once
    can collide on the primary key (IntegrityError); the callers (the store lock's holder, fence.py, the Mesos
    framework id) write their keys from one leader only."""
    res = s.execute(update(MetaRow).where(MetaRow.key == key).values(value=value).execution_options(**_NO_SYNC))
    if getattr(res, "rowcount", 0) == 0:
        s.execute(insert(MetaRow), [{"key": key, "value": value}])


# --- task identities: the uid allocated to each principal without a mapped Unix user (run_as.py) -----------------
def get_task_uid(s: Session, principal: str) -> int | None:
    """The uid allocated to `principal`, None if none yet."""
    return s.execute(select(_TASK_UIDS.c.uid).where(_TASK_UIDS.c.principal == principal)).scalar_one_or_none()


def task_uids_taken(s: Session, lo: int, hi: int) -> set[int]:
    """Every uid of lo..hi allocated to some principal."""
    return set(s.execute(select(_TASK_UIDS.c.uid).where(_TASK_UIDS.c.uid.between(lo, hi))).scalars())


def insert_task_uid(s: Session, principal: str, uid: int, now: float) -> None:
    """Allocate `uid` to `principal`. AlreadyExists when the principal already has a uid or the uid is another's (a
    concurrent allocation; the unique keys decide on both stores; the transaction is then unusable: the caller rolls
    back and tries again)."""
    try:
        _core(s).execute(insert(_TASK_UIDS), [{"principal": principal, "uid": uid, "created_at": now}])
    except IntegrityError:
        raise AlreadyExists(f"uid {uid} or principal {principal!r} was allocated meanwhile") from None


# --- stored models (`peloton model ...`) ----------------------------------------------------------------------
# Written by the model servicer (api/model_service.py) from any number of calls at once: replace is a
# compare-and-set on the version, so two replaces of one model never both win; read by planning (jobmgr/planning.py).
def _model_from_row(r: Row[Any]) -> StoredModel:
    return StoredModel(name=r.name, owner=r.owner, document=r.document, version=r.version, created_at=r.created_at,
                       updated_at=r.updated_at)


def create_model(s: Session, m: StoredModel) -> None:
    """Insert model `m`; its version is `m.version` (1). AlreadyExists (field 'name') if a model of that name
    exists, whether seen by the first read or by the primary key (a concurrent create; the transaction is then
    unusable: the caller rolls back)."""
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
    updated_at becomes `now`; owner and created_at stay. NotFound (field 'name') if it is gone; Conflict (field
    'name') if it changed since it was read (another replace, or deleted and created again). The compare-and-set is
    one UPDATE ... WHERE version = `version`, so it holds on PostgreSQL's READ COMMITTED as on SQLite."""
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
    """One page of models by name, in byte order on both stores; only those after `after` (a page's last name);
    at most `limit`."""
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
    """NotFound (field 'name') if absent (one DELETE: nothing to race)."""
    res = s.execute(delete(_MODELS).where(_MODELS.c.name == name).execution_options(**_NO_SYNC))
    if getattr(res, "rowcount", 0) == 0:
        raise NotFound(f"name: no model {name!r}", field="name")


# --- host drains (a small map kept as one meta row: hosts are few, and drains fewer) ---------------------------
_DRAINS_KEY = "host_drains"


def get_drains(s: Session) -> dict[str, float]:
    """Draining hosts -> the deadline of each (clock time; 0: none); {} when none was ever set."""
    raw = get_meta(s, _DRAINS_KEY)
    return {str(k): float(v) for k, v in json.loads(raw).items()} if raw else {}


def set_drains(s: Session, drains: dict[str, float]) -> None:
    """Replace the whole map of draining hosts (one meta row; see set_meta). Last writer wins: the caller (the host
    manager, which holds the map in memory and writes all of it) must not write it from two threads at once."""
    set_meta(s, _DRAINS_KEY, json.dumps(dict(sorted(drains.items()))))


# --- retention ----------------------------------------------------------------------------------------------
# The retention loop (server.py) finds what has aged out here, then deletes it a batch per transaction: jobs through
# the writer (one short commit each), audit records here.
def finished_before(s: Session, before: float, limit: int) -> list[str]:
    """Ids of up to `limit` jobs that ended (SUCCEEDED, FAILED, KILLED) before `before`, oldest first (retention:
    the caller deletes them in later write transactions, a few at a time)."""
    done = [JobState.SUCCEEDED.value, JobState.FAILED.value, JobState.KILLED.value]
    q = (select(JobRow.id).where(JobRow.state.in_(done), JobRow.completed_at < before)
         .order_by(JobRow.completed_at, JobRow.id).limit(limit))
    return list(s.execute(q).scalars())


def delete_audit_before(s: Session, before: float, limit: int) -> int:
    """Delete up to `limit` audit records older than `before` (oldest first); how many went. A batch per write
    transaction, so retention never holds the writer lock long."""
    ids = list(s.execute(select(AuditEventRow.id).where(AuditEventRow.at < before)
                         .order_by(AuditEventRow.id).limit(limit)).scalars())
    if ids:
        s.execute(delete(AuditEventRow).where(AuditEventRow.id.in_(ids)).execution_options(**_NO_SYNC))
    return len(ids)


# --- the census: how many jobs, gangs and tasks are in each state (the metrics' gauges) -------------------------


def count_gangs_by_state(s: Session) -> dict[str, int]:
    """{state: gangs}: one GROUP BY (the cluster summary, per call)."""
    rows = s.execute(select(_GANGS.c.state, func.count()).group_by(_GANGS.c.state)).all()
    return {str(state): int(n) for state, n in rows}


def count_by_state(s: Session) -> dict[str, dict[str, int]]:
    """{"jobs": {state: n}, "gangs": {...}, "tasks": {...}}: one GROUP BY per table (a scan of each; the metrics
    endpoint asks at most every CENSUS_EVERY_S). Three statements: on PostgreSQL they may see different commits."""
    out: dict[str, dict[str, int]] = {}
    for name, table in (("jobs", _JOBS), ("gangs", _GANGS), ("tasks", _TASKS)):
        rows = s.execute(select(table.c.state, func.count()).group_by(table.c.state)).all()
        out[name] = {str(state): int(n) for state, n in rows}
    return out
