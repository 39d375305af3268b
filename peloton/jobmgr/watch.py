"""The watch hub: every committed change of a job or a task, numbered (a revision per job change) and kept for a
while, so that watchers get them in order and can resume after a disconnect.

The writer publishes after each commit (on its own thread, with the records it just wrote); a watcher waits on
the hub's condition and reads the history after the revision it last saw. A watcher too far behind for the
history (or one resuming a stream of a daemon that restarted) gets a snapshot of the jobs it watches instead, or,
watching every job, a `resync` notice. The revision of a stream is in memory: `stream_id` says which stream.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Collection, Iterable
from dataclasses import dataclass

from prometheus_client import Gauge

from peloton.domain.model import Job, Task
from peloton.jobmgr import gang_policy as policy

WATCHERS = Gauge("peloton_jobmgr_watchers", "Open WatchJobs streams")
HISTORY = 100_000  # job changes kept for resuming watchers


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


@dataclass(frozen=True, slots=True)
class JobChange:
    job_id: str
    state: str
    desired: str
    reason: str
    tasks: tuple[TaskChange, ...] = ()
    job_changed: bool = True  # the job's own record changed (not only some of its tasks)
    deleted: bool = False

    @staticmethod
    def of(job: Job, tasks: Iterable[Task] = (), job_changed: bool = True) -> JobChange:
        return JobChange(job.id, job.state.value, job.desired, job.reason, tuple(TaskChange.of(t) for t in tasks),
                         job_changed)


class WatchHub:
    def __init__(self, history: int = HISTORY) -> None:
        self.stream_id = uuid.uuid4().hex
        self._limit = history
        self._cond = threading.Condition()
        self._changes: list[JobChange] = []  # revision = _first + index
        self._first = 1
        self.closed = False

    @property
    def revision(self) -> int:
        """The newest revision published (0 before any)."""
        with self._cond:
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
        with self._cond:
            self._changes.extend(changes)
            if len(self._changes) > self._limit:
                drop = len(self._changes) - self._limit
                del self._changes[:drop]
                self._first += drop
            self._cond.notify_all()

    def close(self) -> None:
        """The daemon is stopping: every watcher's wait returns now (their streams end, clients resume elsewhere)."""
        with self._cond:
            self.closed = True
            self._cond.notify_all()

    def can_resume(self, stream_id: str, after: int) -> bool:
        """Whether every change after `after` of `stream_id` is still in the history."""
        with self._cond:
            return stream_id == self.stream_id and self._first - 1 <= after <= self._first + len(self._changes) - 1

    def wait(self, after: int, timeout_s: float, job_ids: Collection[str] = (), tasks: bool = False
             ) -> tuple[list[JobChange], int, bool]:
        """Changes after revision `after` (of the watched jobs; without `tasks`, job-level only), waiting up to
        `timeout_s` for one; the revision they bring the watcher to; and whether changes were lost (the watcher
        fell behind the history)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while not self.closed:
                last = self._first + len(self._changes) - 1
                if after < self._first - 1:
                    return [], last, True
                if last > after:
                    new = self._changes[after - self._first + 1:]
                    out = [c for c in new if (not job_ids or c.job_id in job_ids)
                           and (tasks or c.job_changed or c.deleted)]
                    if not tasks:
                        out = [c if not c.tasks else JobChange(c.job_id, c.state, c.desired, c.reason,
                                                               deleted=c.deleted) for c in out]
                    if out:
                        return out, last, False
                    after = last  # nothing for this watcher: keep waiting from here
                left = deadline - time.monotonic()
                if left <= 0:
                    return [], after, False
                self._cond.wait(left)
            return [], after, False
