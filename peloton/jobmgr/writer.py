"""The job manager's writer: every change to jobs, gangs and tasks goes through it, and what arrives together is
committed together (group commit): one transaction, one commit, one fsync for a batch of creates, status updates,
stops and launch intents from many callers.

It owns the cache of active jobs (every job that is not finished, whole: job, gangs, tasks), so a mutation loads
nothing in the common case, and writes only the rows the rules changed. The cache is only ever touched by the
writer thread: callers hand it functions and wait for the result (a Future), so there is no lock around the
job records at all, and no caller holds anything while the transaction does I/O.

A mutation is `check(views)` (may raise a PelotonError: that mutation alone fails, nothing changed) followed by
`apply(views, now) -> Effects` (must not raise; if it does, the batch is rolled back, the cache entries of its
jobs are dropped and reloaded from the store, and each mutation of the batch is run again on its own, so one bad
request cannot fail others). After the commit, in commit order: the side effects (kills, queue updates) are handed
to the SideEffects sender, the futures are resolved, and the changes are published to watchers.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
import zlib
from collections.abc import Callable, Collection, Iterable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Generic, TypeVar

from prometheus_client import Counter, Histogram
from sqlalchemy.orm import Session, sessionmaker

from peloton.domain.model import TaskEvent
from peloton.errors import PelotonError, Unavailable
from peloton.jobmgr import gang_policy as policy
from peloton.loop import LOOP_ERRORS
from peloton.store import bulk, repo
from peloton.store.db import KeptConnection, StoreUnavailable

log = logging.getLogger(__name__)

BATCHES = Histogram("peloton_jobmgr_commit_seconds", "One group commit: load, rules, write, commit",
                    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10))
BATCH_SIZE = Histogram("peloton_jobmgr_commit_mutations", "Mutations per group commit",
                       buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024))
ROWS = Counter("peloton_jobmgr_rows_written_total", "Rows written by the job manager", ["table"])
# the children, looked up once: labels() on every commit showed in the writer's profile
_ROWS_JOBS, _ROWS_GANGS, _ROWS_TASKS, _ROWS_EVENTS = (ROWS.labels(t) for t in ("jobs", "gangs", "tasks", "task_events"))

Views = dict[str, policy.JobView]
T = TypeVar("T")
U = TypeVar("U")

MAX_BATCH = 512  # mutations per commit
MAX_BATCH_ROWS = 20_000  # rows of created jobs per commit (big jobs are inserted in chunks beforehand)


class Kind(Enum):
    APPLY = 1
    CREATE = 2  # insert a new job's rows (or, with `inserted`, activate one whose rows are already in)
    DELETE = 3
    QUERY = 4  # read the cache on the writer thread; no transaction unless jobs must be loaded


@dataclass(slots=True)
class Mutation(Generic[T]):
    kind: Kind
    job_ids: Collection[str] = ()
    check: Callable[[Views], None] | None = None
    apply: Callable[[Views, float], policy.Effects] | None = None
    query: Callable[[Views], T] | None = None
    view: policy.JobView | None = None  # CREATE
    events: list[TaskEvent] = field(default_factory=list)  # CREATE: the first event of every task
    inserted: bool = False  # CREATE: the rows are in already (chunked insert); only activate
    future: Future[Any] = field(default_factory=Future)
    rows: int = 0


class Writer:
    def __init__(self, sessions: sessionmaker[Session],
                 publish: Callable[[Iterable[policy.JobView], policy.Effects, list[str]], None],
                 perform: Callable[[policy.Effects, Views], None], clock: Callable[[], float] = time.time,
                 name: str = "jobmgr-writer") -> None:
        """`publish(changed views, effects, deleted job ids)` tells watchers what a commit changed;
        `perform(effects, views)` hands the side effects on. Both run on the writer thread and must not block
        (with several shards, on several threads at once: both must be thread-safe)."""
        self.name = name
        self.sessions = sessions
        # one connection across this writer's commits (no pool checkout and checkin per commit); a broken one is
        # replaced (store/db.py)
        self._store = KeptConnection(sessions)
        self._publish = publish
        self._perform = perform
        self.clock = clock
        self.cache: Views = {}
        self._reload: set[str] = set()  # dropped after a failed batch; reloaded first thing
        self._cond = threading.Condition()
        self._queue: list[Mutation[Any]] = []
        self._stop = False
        self._paused: str | None = None  # why mutations are refused (not acting: no store lock)
        self._leader = ""  # ... and which daemon acts instead, when known
        self._thread: threading.Thread | None = None
        self.last_error: BaseException | None = None

    # --- lifecycle ----------------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(10)

    def pause(self, why: str, leader: str = "") -> None:
        """Refuse every mutation with Unavailable(why) until `resume` (the daemon does not hold the store lock;
        `leader`: the address of the daemon that does, when known)."""
        with self._cond:
            self._paused = why
            self._leader = leader

    def resume(self, clear: bool = False) -> None:
        """Take mutations again. `clear`: the store may have changed while paused (another daemon led): the cache
        is dropped first, by a query put ahead of everything queued in the same hold of the lock that resumes, so
        that no mutation submitted from then on runs on a view from before the pause (and writes it back over what
        the other daemon wrote, the fence passing for this daemon's new epoch)."""
        with self._cond:
            if clear:
                self._queue.insert(0, Mutation(Kind.QUERY, query=_clearing(self)))
                self._cond.notify()
            self._paused = None

    def refusal(self) -> Unavailable | None:
        """What a mutation submitted now is refused with (paused), or None."""
        with self._cond:
            return None if self._paused is None else Unavailable(self._paused, leader=self._leader)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # --- submitting ---------------------------------------------------------------------------------------
    def submit(self, m: Mutation[T]) -> Future[T]:
        with self._cond:
            if self._stop:
                raise Unavailable("the job manager is shutting down")
            if self._paused is not None:
                raise Unavailable(self._paused, leader=self._leader)
            self._queue.append(m)
            self._cond.notify()
        return m.future

    def run(self, m: Mutation[T], timeout: float | None = None) -> T:
        return self.submit(m).result(timeout)

    def mutate(self, job_ids: Collection[str], apply: Callable[[Views, float], policy.Effects],
               check: Callable[[Views], None] | None = None) -> policy.Effects:
        return self.run(Mutation(Kind.APPLY, job_ids, check=check, apply=apply))

    def read(self, query: Callable[[Views], T], job_ids: Collection[str] = ()) -> T:
        """Run `query` on the writer thread against the cache (with `job_ids` loaded if they exist)."""
        return self.run(Mutation(Kind.QUERY, job_ids, query=query))

    # --- the writer thread ----------------------------------------------------------------------------------
    def _take(self) -> list[Mutation[Any]] | None:
        with self._cond:
            while not self._queue and not self._stop:
                self._cond.wait()
            if self._stop and not self._queue:
                return None
            # everything queued, in one take (one wake of this thread for all of it), up to the batch's bounds
            n, rows = 0, 0
            for m in self._queue:
                if n == MAX_BATCH or (n and rows + m.rows > MAX_BATCH_ROWS):
                    break
                n += 1
                rows += m.rows
            batch = self._queue[:n]
            del self._queue[:n]
            return batch

    def _run(self) -> None:
        try:
            self._serve()
        finally:
            self._store.close()

    def _serve(self) -> None:
        while True:
            batch = self._take()
            if batch is None:
                return
            writes: list[Mutation[Any]] = []
            for m in batch:
                if m.kind == Kind.QUERY and not m.job_ids:  # nothing to load: answer from the cache, no transaction
                    self._answer(m)
                else:
                    writes.append(m)
            if writes:
                self._commit_batch(writes)

    def _answer(self, m: Mutation[Any]) -> None:
        assert m.query is not None
        try:
            m.future.set_result(m.query(self.cache))
        except Exception as e:  # noqa: BLE001 - the caller gets it
            m.future.set_exception(e)

    def _commit_batch(self, batch: list[Mutation[Any]]) -> None:
        start = time.perf_counter()
        try:
            done = self._commit(batch)
        except StoreUnavailable as e:
            self.last_error = e
            self._invalidate(batch)
            for m in batch:
                if not m.future.done():
                    m.future.set_exception(e)
            return
        except Exception as e:  # noqa: BLE001 - a bug in one mutation must not fail the others
            self._invalidate(batch)
            if len(batch) == 1:
                log.exception("job manager: mutation failed")
                if not batch[0].future.done():
                    batch[0].future.set_exception(e)
                return
            log.warning("job manager: a batch of %d failed (%s); committing each on its own", len(batch), e)
            for m in batch:
                if not m.future.done():
                    self._commit_batch([m])
            return
        self.last_error = None
        BATCHES.observe(time.perf_counter() - start)
        BATCH_SIZE.observe(len(batch))
        done()

    def _invalidate(self, batch: list[Mutation[Any]]) -> None:
        for m in batch:
            ids = set(m.job_ids)
            if m.view is not None:
                ids.add(m.view.job.id)
            for jid in ids:
                if self.cache.pop(jid, None) is not None:
                    self._reload.add(jid)

    def _load(self, s: Session, ids: Collection[str]) -> None:
        missing = [j for j in dict.fromkeys(ids) if j not in self.cache]
        if not missing:
            return
        for jid, (job, gangs, tasks) in repo.get_job_records(s, missing).items():
            self.cache[jid] = policy.new_job_view(job, gangs, tasks)

    def clear(self) -> None:
        """Drop the whole cache (recovery reloads what it needs). Writer thread only: use via `read`."""
        self.cache.clear()
        self._reload.clear()

    def _commit(self, batch: list[Mutation[Any]]) -> Callable[[], None]:
        """Run the batch in one transaction; returns what to do once it is committed."""
        now = self.clock()
        eff = policy.Effects()
        results: list[tuple[Mutation[Any], Any]] = []
        failed: list[tuple[Mutation[Any], BaseException]] = []
        created: list[policy.JobView] = []
        deleted: list[str] = []
        need = set(self._reload)
        for m in batch:
            need.update(m.job_ids)
        # the common batch (its jobs cached, nothing to delete) is bulk writes alone: a transaction without a
        # Session (no ORM, no SQLAlchemy transaction: ~0.25 ms of CPU less a commit on PostgreSQL)
        raw = all(j in self.cache for j in need) and not any(m.kind == Kind.DELETE for m in batch)
        with self._store.raw_transaction() if raw else self._store.transaction() as s:
            writes = repo.Writes()  # sent together at the end: on PostgreSQL one statement (store/bulk.py)
            if not raw:
                assert isinstance(s, Session)
                self._load(s, need)
            self._reload.clear()  # loaded, or gone from the store
            for m in batch:
                views = {j: self.cache[j] for j in m.job_ids if j in self.cache}
                if m.check is not None:
                    try:
                        m.check(views)
                    except PelotonError as e:
                        failed.append((m, e))
                        continue
                if m.kind == Kind.QUERY:
                    assert m.query is not None
                    results.append((m, m.query(views)))
                elif m.kind == Kind.CREATE:
                    assert m.view is not None
                    jv = m.view
                    if jv.job.id in need:
                        # another mutation of this batch names the job and will change the cached view in place:
                        # the cache gets a copy, so that m.view stays as created. Should the batch fail, this create
                        # is committed again on its own, and must not insert the others' uncommitted changes
                        jv = copy.deepcopy(jv)
                    if not m.inserted:
                        writes.insert_job(jv.job, [gv.gang for gv in jv.gangs.values()], list(jv.tasks.values()))
                        _ROWS_EVENTS.inc(writes.append_task_events(m.events))
                        _ROWS_TASKS.inc(len(jv.tasks))
                    else:
                        eff.touch_job(jv.job)
                    self.cache[jv.job.id] = jv
                    created.append(jv)
                    eff.enqueue += [(jv.job.id, i) for i in jv.gangs]
                    results.append((m, jv.job.id))
                elif m.kind == Kind.DELETE:
                    assert isinstance(s, Session)
                    writes.send(s)  # a job created earlier in this batch is in the store before it is deleted
                    writes = repo.Writes()
                    for jid in m.job_ids:
                        repo.delete_job(s, jid)
                        self.cache.pop(jid, None)
                        deleted.append(jid)
                    results.append((m, None))
                else:
                    assert m.apply is not None
                    applied = m.apply(views, now)
                    eff.merge(applied)
                    results.append((m, applied))
            self._write(s, writes, eff)

        def done() -> None:
            # the side effects first: a new gang's enqueue is the next step of its way to running (the caller of a
            # create, woken next, waits for nothing more); a commit of status updates or intents has none. What is
            # committed is committed: a hand-off or publish that raises (a bug) is logged and counted, and the
            # callers are still answered and the thread goes on (else every later caller waited for ever)
            self._after_commit("side effects", self._perform, eff, self.cache)
            for m, r in results:
                m.future.set_result(r)
            for m, err in failed:
                m.future.set_exception(err)
            changed = {jid: self.cache[jid] for jid in eff.jobs if jid in self.cache}
            for jv in created:
                changed[jv.job.id] = jv
            for key in list(eff.tasks) + list(eff.gangs):
                if key[0] in self.cache:
                    changed[key[0]] = self.cache[key[0]]
            self._after_commit("publish", self._publish, changed.values(), eff, deleted)
            for jid in [j for j in set(changed) | need if j in self.cache and self.cache[j].job.state.terminal]:
                self.cache.pop(jid, None)  # finished: nothing changes it any more (a late update reloads it)

        return done

    @staticmethod
    def _after_commit(step: str, fn: Callable[..., None], *args: Any) -> None:
        try:
            fn(*args)
        except Exception:  # noqa: BLE001 - see done()
            LOOP_ERRORS.labels("jobmgr-writer").inc()
            log.exception("job manager: %s after a commit failed", step)

    @staticmethod
    def _write(s: bulk.Tx, writes: repo.Writes, eff: policy.Effects) -> None:
        events = writes.append_task_events(eff.events)
        writes.send(s, list(eff.jobs.values()), list(eff.gangs.values()), list(eff.tasks.values()), last=True)
        _ROWS_JOBS.inc(len(eff.jobs))
        _ROWS_GANGS.inc(len(eff.gangs))
        _ROWS_TASKS.inc(len(eff.tasks))
        _ROWS_EVENTS.inc(events)  # rows: a gang's transition is one



def shard_of(job_id: str, shards: int) -> int:
    return zlib.crc32(job_id.encode()) % shards


class Writers:
    """The job manager's writers, one per shard of jobs: a job's changes always go through the writer of its
    shard, so they are serialized per job (in commit order), while the shards commit concurrently, each on its own
    connection. SQLite has one writer at a time anyway: one shard there.

    A mutation on jobs of several shards is split: each shard runs it (check, apply or query) on its own jobs in its
    own transaction, and the caller gets the merged Effects (a query: the results in a list, see `read_each`) once
    all are committed, or the first error. The parts are therefore not atomic with each other; every multi-job
    change (status updates, launch intents, deadlines, recovery) is a set of per-job changes that stand alone.

    So a function given to `mutate` for several jobs sees, on each call, only the jobs of one shard: a job missing
    from its views may be another shard's. One that acts on a job's absence (a deleted job's tasks are killed) must
    use `mutate_by_job`, which hands each shard's call only that shard's items."""

    def __init__(self, shards: int, sessions: sessionmaker[Session],
                 publish: Callable[[Iterable[policy.JobView], policy.Effects, list[str]], None],
                 perform: Callable[[policy.Effects, Views], None], clock: Callable[[], float] = time.time) -> None:
        if shards < 1:
            raise ValueError("at least one writer")
        self.shards = [Writer(sessions, publish, perform, clock, name=f"jobmgr-writer-{i}") for i in range(shards)]

    # --- lifecycle: every shard ---------------------------------------------------------------------------
    def start(self) -> None:
        for w in self.shards:
            w.start()

    def stop(self) -> None:
        for w in self.shards:
            w.stop()

    def pause(self, why: str, leader: str = "") -> None:
        for w in self.shards:
            w.pause(why, leader)

    def resume(self, clear: bool = False) -> None:
        for w in self.shards:
            w.resume(clear)

    def refusal(self) -> Unavailable | None:
        """What a mutation is refused with while paused (every shard is paused and resumed together), or None."""
        return self.shards[0].refusal()

    @property
    def alive(self) -> bool:
        return all(w.alive for w in self.shards)

    @property
    def last_error(self) -> BaseException | None:
        return next((w.last_error for w in self.shards if w.last_error is not None), None)

    def clear(self) -> None:
        """Drop every shard's cache (each on its own thread), e.g. before recovery."""
        futures: list[Future[None]] = []
        for w in self.shards:
            futures.append(w.submit(Mutation(Kind.QUERY, query=_clearing(w))))
        for f in futures:
            f.result()

    # --- routing ------------------------------------------------------------------------------------------
    def _writer(self, job_id: str) -> Writer:
        return self.shards[shard_of(job_id, len(self.shards))]

    def _split(self, job_ids: Collection[str]) -> dict[int, list[str]]:
        parts: dict[int, list[str]] = {}
        for jid in job_ids:
            parts.setdefault(shard_of(jid, len(self.shards)), []).append(jid)
        return parts

    def submit(self, m: Mutation[Any]) -> Future[Any]:
        """Queue `m` on the writer(s) of its jobs. Split over shards, the Future's result is the merged Effects of
        an APPLY, the list of the shards' results of a QUERY, None for a DELETE."""
        if m.kind == Kind.CREATE:
            assert m.view is not None
            return self._writer(m.view.job.id).submit(m)
        if len(self.shards) == 1:
            return self.shards[0].submit(m)
        parts = self._split(m.job_ids)
        if not parts:  # a query of no particular job: the first shard answers (see read_each for all)
            return self.shards[0].submit(m)
        if len(parts) == 1:
            (i, ids), = parts.items()
            return self.shards[i].submit(m)
        subs = [self.shards[i].submit(Mutation(m.kind, ids, check=m.check, apply=m.apply, query=m.query))
                for i, ids in parts.items()]
        return _joined(m, subs)

    def run(self, m: Mutation[T], timeout: float | None = None) -> T:
        return self.submit(m).result(timeout)

    def mutate(self, job_ids: Collection[str], apply: Callable[[Views, float], policy.Effects],
               check: Callable[[Views], None] | None = None) -> policy.Effects:
        return self.run(Mutation(Kind.APPLY, job_ids, check=check, apply=apply))

    def mutate_by_job(self, items: Mapping[str, U],
                      make: Callable[[Mapping[str, U]], Callable[[Views, float], policy.Effects]]) -> policy.Effects:
        """`make(part)` is the apply function of one shard's part of `items` (keyed by job id): in it, a job of
        `part` missing from the views is gone from the store. The merged Effects of every part."""
        parts = self._split(items)
        futures: list[Future[policy.Effects]] = [self.shards[i].submit(Mutation(Kind.APPLY, ids, apply=make({j: items[j] for j in ids})))
                   for i, ids in parts.items()]
        eff = policy.Effects()
        for f in futures:
            eff.merge(f.result())
        return eff

    def read_each(self, query: Callable[[Views], T], job_ids: Collection[str] | None = None) -> list[T]:
        """`query` run on each shard's cache, on its thread (with `job_ids` loaded if they exist; None: every
        shard, over what it has cached): one result per shard that was asked."""
        targets: list[tuple[Writer, Collection[str]]]
        if job_ids is None:
            targets = [(w, ()) for w in self.shards]
        else:
            targets = [(self.shards[i], ids) for i, ids in self._split(job_ids).items()]
        futures = [w.submit(Mutation(Kind.QUERY, ids, query=query)) for w, ids in targets]
        return [f.result() for f in futures]


def _clearing(w: Writer) -> Callable[[Views], None]:
    return lambda views: w.clear()


def _joined(m: Mutation[Any], subs: list[Future[Any]]) -> Future[Any]:
    """One Future for the parts of a split mutation: done when every part is."""
    out = m.future
    left = [len(subs)]
    lock = threading.Lock()

    def done(_: Future[Any]) -> None:
        with lock:
            left[0] -= 1
            if left[0]:
                return
        errors = [f.exception() for f in subs if f.exception() is not None]
        if errors:
            out.set_exception(errors[0])
        elif m.kind == Kind.APPLY:
            eff = policy.Effects()
            for f in subs:
                eff.merge(f.result())
            out.set_result(eff)
        elif m.kind == Kind.QUERY:
            out.set_result([f.result() for f in subs])
        else:
            out.set_result(None)

    for f in subs:
        f.add_done_callback(done)
    return out
