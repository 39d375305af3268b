"""The watch hub: every committed change of a job or a task, numbered (a revision per job change) and kept for a
while, so that watchers get them in order and can resume after a disconnect.

The writer publishes after each commit (on its own thread, with the records it just wrote); a watcher reads the
history after the revision it last saw and, when nothing there is for it, waits. A commit wakes only the watchers it
has something for (one wake each per commit; a watcher of other jobs, or of jobs only while tasks changed, sleeps on):
with many streams open, every commit waking every stream's thread would cost each of them a wake and a scan. A watcher too far behind for the
history (or one resuming a stream of a daemon that restarted) gets a snapshot of the jobs it watches instead, or,
watching every job, a `resync` notice. The revision of a stream is in memory: `stream_id` says which stream.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace

from prometheus_client import Gauge

from peloton.domain.model import Job, Task
from peloton.jobmgr import gang_policy as policy

WATCHERS = Gauge("peloton_jobmgr_watchers", "Open WatchJobs streams")
HISTORY = 100_000  # job changes kept for resuming watchers
# What one `wait` hands a watcher, at most (the text of its changes, in characters: at most 4 bytes each in UTF-8,
# plus a few bytes a field): one WatchJobsResponse stays well under a client's default 4 MiB receive limit. Past
# it, the rest waits for the next call (the revision returned is the last change handed); a single change larger
# than this (a snapshot or a create of a job of ~100,000 tasks) goes in parts (`in_parts`).
MAX_BATCH_CHARS = 512 * 1024


@dataclass(frozen=True, slots=True)
class TaskChange:
    instance: int
    task_id: str
    attempt: int
    state: str
    host: str
    exit_code: int | None
    reason: str
    message: str

    @staticmethod
    def of(t: Task) -> TaskChange:
        return TaskChange(t.instance, t.task_id, t.attempt, t.state.value, t.host, t.exit_code, t.reason, t.message)

    def size(self) -> int:
        return len(self.task_id) + len(self.state) + len(self.host) + len(self.reason) + len(self.message) + 16


@dataclass(frozen=True, slots=True)
class JobChange:
    job_id: str
    state: str
    desired: str
    reason: str
    tasks: tuple[TaskChange, ...] = ()
    job_changed: bool = True  # the job's own record changed (not only some of its tasks)
    deleted: bool = False

    def size(self) -> int:
        """About what this change takes in a message: its text, and 16 for each task's and its own other fields."""
        return self.own_size() + sum(t.size() for t in self.tasks)

    def own_size(self) -> int:
        return len(self.job_id) + len(self.state) + len(self.desired) + len(self.reason) + 16

    @staticmethod
    def of(job: Job, tasks: Iterable[Task] = (), job_changed: bool = True) -> JobChange:
        return JobChange(job.id, job.state.value, job.desired, job.reason, tuple(TaskChange.of(t) for t in tasks),
                         job_changed)


def in_parts(changes: list[JobChange], limit: int = MAX_BATCH_CHARS) -> list[list[JobChange]]:
    """`changes` as the messages they go in, in order, each at most `limit` (by `size`) when it can be: a change
    with more tasks than one message holds is split into several changes of its job, each with the job's fields and
    the next of its tasks. Always at least one message (an empty one for no changes)."""
    out: list[list[JobChange]] = []
    part: list[JobChange] = []
    size = 0

    def put(c: JobChange, n: int) -> None:
        nonlocal part, size
        if part and size + n > limit:
            out.append(part)
            part, size = [], 0
        part.append(c)
        size += n

    for c in changes:
        n = c.size()
        if n <= limit or len(c.tasks) < 2:
            put(c, n)
            continue
        base = c.own_size()
        tasks: list[TaskChange] = []
        n = base
        for t in c.tasks:
            if tasks and n + t.size() > limit:
                put(replace(c, tasks=tuple(tasks)), n)
                tasks, n = [], base
            tasks.append(t)
            n += t.size()
        put(replace(c, tasks=tuple(tasks)), n)
    out.append(part)
    return out


@dataclass(eq=False, slots=True)
class Waiter:
    """One watcher waiting for changes: what it watches, the revision it has seen, and the gate it sleeps on
    (acquired once at registration; `WatchHub.append` releases it, once, to wake the watcher)."""
    job_ids: Collection[str]
    tasks: bool
    after: int
    gate: threading.Lock

    def wants(self, c: JobChange) -> bool:
        return (self.tasks or c.job_changed or c.deleted) and (not self.job_ids or c.job_id in self.job_ids)


def woken(waiters: Iterable[Waiter], by_job: Mapping[str, Iterable[Waiter]], changes: Iterable[JobChange]
          ) -> set[Waiter]:
    """The waiters `changes` have something for: `waiters` watch every job, `by_job` those of named jobs."""
    out: set[Waiter] = set()
    every = list(waiters)
    for c in changes:
        for w in every:
            if w not in out and w.wants(c):
                out.add(w)
        for w in by_job.get(c.job_id, ()):
            if w not in out and w.wants(c):
                out.add(w)
    return out


class WatchHub:
    def __init__(self, history: int = HISTORY) -> None:
        self.stream_id = uuid.uuid4().hex
        self._limit = history
        self._lock = threading.Lock()
        self._changes: list[JobChange] = []  # revision = _first + index
        self._first = 1
        self._every: set[Waiter] = set()  # waiting watchers of every job
        self._by_job: dict[str, set[Waiter]] = {}  # waiting watchers of named jobs, by job
        self.closed = False
        self._interrupts = 0  # wake_all calls so far: a wait that began before one returns

    @property
    def revision(self) -> int:
        """The newest revision published (0 before any)."""
        with self._lock:
            return self._first + len(self._changes) - 1

    def publish(self, views: Iterable[policy.JobView], eff: policy.Effects, deleted: Collection[str] = ()) -> None:
        """Record what one commit changed (called by the writer, after the commit)."""
        tasks: dict[str, list[Task]] = {}
        for (jid, _), t in eff.tasks.items():
            tasks.setdefault(jid, []).append(t)
        out = [JobChange.of(jv.job, tasks.get(jv.job.id, ()), jv.job.id in eff.jobs or jv.job.id not in tasks)
               for jv in views]
        out += [JobChange(jid, "", "", "", deleted=True) for jid in deleted]
        if out:
            self.append(out)

    def append(self, changes: list[JobChange]) -> None:
        """Add one commit's changes and wake, once each, the watchers they concern (and any the history's trim
        left behind: they learn it at once, as a `lost`)."""
        with self._lock:
            self._changes.extend(changes)
            if len(self._changes) > self._limit:
                drop = len(self._changes) - self._limit
                del self._changes[:drop]
                self._first += drop
                wake = {w for w in self._waiting() if w.after < self._first - 1}
            else:
                wake = set()
            if self._every or self._by_job:
                wake |= woken(self._every, self._by_job, changes)
            for w in wake:
                self._unregister(w)
                w.gate.release()

    def close(self) -> None:
        """The daemon is stopping: every watcher's wait returns now (their streams end, clients resume elsewhere)."""
        with self._lock:
            self.closed = True
            self._wake_everyone_locked()

    def wake_all(self) -> None:
        """Every watcher's wait returns now (with nothing new): the daemon stopped acting, and each stream is to
        end and its client to move to the daemon that acts."""
        with self._lock:
            self._interrupts += 1
            self._wake_everyone_locked()

    def forget(self) -> None:
        """The history no longer tells every change: the daemon acts again after another one may have acted for
        it. Every watcher learns it as a `lost` (a snapshot of its jobs, or a resync), and no stream resumes from a
        revision before this point."""
        with self._lock:
            self._first += len(self._changes) + 1
            self._changes.clear()
            self._wake_everyone_locked()

    def _wake_everyone_locked(self) -> None:
        for w in set(self._waiting()):
            self._unregister(w)
            w.gate.release()

    def can_resume(self, stream_id: str, after: int) -> bool:
        """Whether every change after `after` of `stream_id` is still in the history."""
        with self._lock:
            return stream_id == self.stream_id and self._first - 1 <= after <= self._first + len(self._changes) - 1

    @property
    def waiting(self) -> int:
        """Watchers asleep in `wait` now."""
        with self._lock:
            return len(set(self._waiting()))

    def _waiting(self) -> Iterator[Waiter]:
        yield from self._every
        for ws in self._by_job.values():
            yield from ws

    def _register(self, w: Waiter) -> None:
        if not w.job_ids:
            self._every.add(w)
        for jid in w.job_ids:
            self._by_job.setdefault(jid, set()).add(w)

    def _unregister(self, w: Waiter) -> None:
        self._every.discard(w)
        for jid in w.job_ids:
            ws = self._by_job.get(jid)
            if ws is not None:
                ws.discard(w)
                if not ws:
                    del self._by_job[jid]

    def _batch(self, after: int, job_ids: Collection[str], tasks: bool) -> tuple[list[JobChange], int]:
        """(Under the lock.) The changes after `after` for this watcher, at most MAX_BATCH_CHARS of them (at least
        one), and the revision they bring it to: the newest when they are all there, else the one before the first
        left for the next call. Every change once, in order, however many commits a slow watcher is behind."""
        out: list[JobChange] = []
        size = 0
        for i in range(after - self._first + 1, len(self._changes)):
            c = self._changes[i]
            if (job_ids and c.job_id not in job_ids) or not (tasks or c.job_changed or c.deleted):
                continue
            if not tasks and c.tasks:
                c = JobChange(c.job_id, c.state, c.desired, c.reason, deleted=c.deleted)
            n = c.size()
            if out and size + n > MAX_BATCH_CHARS:
                return out, self._first + i - 1
            out.append(c)
            size += n
        return out, self._first + len(self._changes) - 1

    def wait(self, after: int, timeout_s: float, job_ids: Collection[str] = (), tasks: bool = False
             ) -> tuple[list[JobChange], int, bool]:
        """Changes after revision `after` (of the watched jobs; without `tasks`, job-level only), waiting up to
        `timeout_s` for one; the revision they bring the watcher to; and whether changes were lost (the watcher
        fell behind the history)."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            interrupts = self._interrupts
        while True:
            with self._lock:
                if self.closed or self._interrupts != interrupts:
                    return [], after, False
                last = self._first + len(self._changes) - 1
                if after < self._first - 1:
                    return [], last, True
                if last > after:
                    out, upto = self._batch(after, job_ids, tasks)
                    if out:
                        return out, upto, False
                    after = last  # nothing for this watcher: keep waiting from here
                left = deadline - time.monotonic()
                if left <= 0:
                    return [], after, False
                gate = threading.Lock()
                gate.acquire()
                w = Waiter(job_ids, tasks, after, gate)
                self._register(w)
            if not w.gate.acquire(timeout=left):  # not woken: gone from the hub unless a wake raced the timeout
                with self._lock:
                    self._unregister(w)
