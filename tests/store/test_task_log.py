"""`task logs --attempt N` of a task with a long history: the attempt is found by its own events (an index on
(job_id, attempt, instance)), however many newer ones the task has. SQLite and PostgreSQL."""

from __future__ import annotations

import dataclasses

import pytest
from sqlalchemy.orm import Session, sessionmaker

from peloton.domain.model import TaskEvent
from peloton.domain.states import TaskState
from peloton.errors import FailedPrecondition, NotFound
from peloton.jobmgr.manager import MAX_EVENTS_SHOWN, JobManager
from peloton.store import db, repo
from tests.store.test_repo import make_job

ATTEMPTS = MAX_EVENTS_SHOWN // 4 + 50  # four events an attempt: the first attempts are past the newest 1,000 events
LAUNCHED = (TaskState.PENDING, TaskState.LAUNCHING, TaskState.RUNNING, TaskState.FAILED)


class Logs:
    """The host manager's read_log: the task id it was asked for, as the log's content."""

    def read_log(self, task_id: str, stream: str, offset: int, max_bytes: int) -> tuple[bytes, int]:
        return task_id.encode(), len(task_id)


def _history(sessions: sessionmaker[Session]) -> None:
    """Job j1, two members (one gang: each transition one row for both); attempt 3 was killed before it launched;
    the current attempt RUNNING. j2's events, on the same instances, must not be taken for j1's."""
    for job_id in ("j1", "j2"):
        job, gangs, tasks = make_job(job_id, instances=2, min_available=2)
        tasks = [dataclasses.replace(t, attempt=ATTEMPTS, state=TaskState.RUNNING) for t in tasks]
        events = []
        for a in range(1, ATTEMPTS + 1):
            states: tuple[TaskState, ...] = (
                (TaskState.PENDING,) if job_id == "j2" else (TaskState.PENDING, TaskState.KILLED) if a == 3
                else LAUNCHED[:3] if a == ATTEMPTS else LAUNCHED)
            events += [TaskEvent(job_id, i, a, st, a * 10.0 + k) for k, st in enumerate(states) for i in (0, 1)]
        with db.transaction(sessions) as s:
            repo.insert_job(s, job, gangs, tasks)
            repo.append_task_events(s, events)


def test_an_attempts_events_are_read_by_its_number(sessions: sessionmaker[Session]) -> None:
    _history(sessions)
    with db.transaction(sessions) as s:
        assert [(e.instance, e.attempt, e.state) for e in repo.get_attempt_events(s, "j1", 1, 2)] == [
            (1, 2, st) for st in LAUNCHED]
        assert [e.state for e in repo.get_attempt_events(s, "j1", 0, 3)] == [TaskState.PENDING, TaskState.KILLED]
        assert [e.state for e in repo.get_attempt_events(s, "j1", 0, 2, newest=2)] == [TaskState.RUNNING,
                                                                                        TaskState.FAILED]
        assert repo.get_attempt_events(s, "j1", 0, ATTEMPTS + 1) == []
        assert repo.get_attempt_events(s, "j1", 2, 1) == []  # no such member
        assert repo.get_attempt_events(s, "nope", 0, 1) == []


def test_the_log_of_an_attempt_past_the_newest_thousand_events_is_found(sessions: sessionmaker[Session]) -> None:
    _history(sessions)
    jm = JobManager(sessions, sessions, None, Logs())  # type: ignore[arg-type]
    for attempt in (1, 2, ATTEMPTS - 1):
        task_id, content, _, state = jm.task_log("j1", 1, attempt, "", 100, None)
        assert (task_id, content, state) == (f"j1-1-{attempt}", f"j1-1-{attempt}".encode(), "FAILED")
    assert jm.task_log("j1", 0, 0, "", 100, None)[::3] == (f"j1-0-{ATTEMPTS}", "RUNNING")  # 0: the current one
    with pytest.raises(FailedPrecondition, match="attempt 3 of task j1-0 was never launched; no logs"):
        jm.task_log("j1", 0, 3, "", 100, None)
    with pytest.raises(NotFound, match=f"task j1-0 has no attempt {ATTEMPTS + 1}"):
        jm.task_log("j1", 0, ATTEMPTS + 1, "", 100, None)
    with pytest.raises(FailedPrecondition, match="never launched"):  # j2's attempts never launched
        jm.task_log("j2", 0, 2, "", 100, None)
