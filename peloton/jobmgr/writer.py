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
request cannot fail others). After the commit: the futures are resolved, the changes are published to watchers,
and the side effects (kills, queue updates) are handed to the SideEffects sender, in commit order.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Generic, TypeVar

from prometheus_client import Counter, Histogram
from sqlalchemy.orm import Session, sessionmaker

from peloton.domain.model import TaskEvent
from peloton.errors import PelotonError, Unavailable
from peloton.jobmgr import gang_policy as policy
from peloton.store import repo
from peloton.store.db import StoreUnavailable, transaction

log = logging.getLogger(__name__)

BATCHES = Histogram("peloton_jobmgr_commit_seconds", "One group commit: load, rules, write, commit",
                    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10))
BATCH_SIZE = Histogram("peloton_jobmgr_commit_mutations", "Mutations per group commit",
                       buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024))
ROWS = Counter("peloton_jobmgr_rows_written_total", "Rows written by the job manager", ["table"])

Views = dict[str, policy.JobView]
T = TypeVar("T")

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
                 perform: Callable[[policy.Effects, Views], None], clock: Callable[[], float] = time.time) -> None:
        """`publish(changed views, effects, deleted job ids)` tells watchers what a commit changed;
        `perform(effects, views)` hands the side effects on. Both run on the writer thread and must not block."""
        self.sessions = sessions
        self._publish = publish
        self._perform = perform
        self.clock = clock
        self.cache: Views = {}
        self._reload: set[str] = set()  # dropped after a failed batch; reloaded first thing
        self._cond = threading.Condition()
        self._queue: list[Mutation[Any]] = []
        self._stop = False
        self._paused: str | None = None  # why mutations are refused (not acting: no store lock)
        self._thread: threading.Thread | None = None
        self.last_error: BaseException | None = None

    # --- lifecycle ----------------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="jobmgr-writer", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(10)

    def pause(self, why: str) -> None:
        """Refuse every mutation with Unavailable(why) until `resume` (the daemon does not hold the store lock)."""
        with self._cond:
            self._paused = why

    def resume(self) -> None:
        with self._cond:
            self._paused = None

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # --- submitting ---------------------------------------------------------------------------------------
    def submit(self, m: Mutation[T]) -> Future[T]:
        with self._cond:
            if self._stop:
                raise Unavailable("the job manager is shutting down")
            if self._paused is not None:
                raise Unavailable(self._paused)
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
            batch: list[Mutation[Any]] = []
            rows = 0
            while self._queue and len(batch) < MAX_BATCH:
                m = self._queue[0]
                if batch and rows + m.rows > MAX_BATCH_ROWS:
                    break
                batch.append(self._queue.pop(0))
                rows += m.rows
            return batch

    def _run(self) -> None:
        while True:
            batch = self._take()
            if batch is None:
                return
            queries = [m for m in batch if m.kind == Kind.QUERY and not m.job_ids]
            writes = [m for m in batch if m not in queries]
            for m in queries:  # nothing to load: answer from the cache, no transaction
                self._answer(m)
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
        with transaction(self.sessions) as s:
            need = set(self._reload)
            for m in batch:
                need.update(m.job_ids)
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
                    if not m.inserted:
                        repo.insert_job(s, jv.job, [gv.gang for gv in jv.gangs.values()], list(jv.tasks.values()))
                        repo.append_task_events(s, m.events)
                        ROWS.labels("tasks").inc(len(jv.tasks))
                    else:
                        eff.touch_job(jv.job)
                    self.cache[jv.job.id] = jv
                    created.append(jv)
                    eff.enqueue += [(jv.job.id, i) for i in jv.gangs]
                    results.append((m, jv.job.id))
                elif m.kind == Kind.DELETE:
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
            self._write(s, eff)

        def done() -> None:
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
            self._publish(changed.values(), eff, deleted)
            self._perform(eff, self.cache)
            for jid in [j for j in set(changed) | need if j in self.cache and self.cache[j].job.state.terminal]:
                self.cache.pop(jid, None)  # finished: nothing changes it any more (a late update reloads it)

        return done

    @staticmethod
    def _write(s: Session, eff: policy.Effects) -> None:
        if eff.jobs:
            repo.update_jobs(s, list(eff.jobs.values()))
            ROWS.labels("jobs").inc(len(eff.jobs))
        if eff.gangs:
            repo.update_gangs(s, list(eff.gangs.values()))
            ROWS.labels("gangs").inc(len(eff.gangs))
        if eff.tasks:
            repo.update_tasks(s, list(eff.tasks.values()))
            ROWS.labels("tasks").inc(len(eff.tasks))
        if eff.events:
            repo.append_task_events(s, eff.events)
            ROWS.labels("task_events").inc(len(eff.events))

