"""ListJobs reads the jobs and their task counts in one snapshot, on SQLite and PostgreSQL: a commit that lands
between the two reads (a stop: the job KILLING, its tasks KILLING) is seen by both or by neither."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session, sessionmaker

from peloton.domain.states import JobState, TaskState
from peloton.jobmgr.manager import JobManager
from peloton.store import db, repo
from tests.store.test_repo import add_job


def test_a_listing_never_mixes_two_commits(engine: Engine, sessions: sessionmaker[Session],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    job, _, tasks = add_job(sessions, "j1", instances=2, min_available=2)
    with db.transaction(sessions) as s:
        repo.update_jobs(s, [dataclasses.replace(job, state=JobState.RUNNING)])
        repo.update_tasks(s, [dataclasses.replace(t, state=TaskState.RUNNING) for t in tasks])
    stub: Any = None  # listing talks to the store only
    jm = JobManager(sessions, db.make_read_sessions(engine), stub, stub)

    counts = repo.task_state_counts
    stopped = False

    def stop_between_the_reads(s: Session, job_ids: list[str]) -> dict[str, dict[str, int]]:
        nonlocal stopped
        if not stopped:  # a StopJob commits after the job rows were read, before their tasks are counted
            stopped = True
            with db.transaction(sessions) as w:
                repo.update_jobs(w, [dataclasses.replace(job, state=JobState.KILLING)])
                repo.update_tasks(w, [dataclasses.replace(t, state=TaskState.KILLING) for t in tasks])
        return counts(s, job_ids)

    monkeypatch.setattr(repo, "task_state_counts", stop_between_the_reads)
    (rec,), _ = jm.list_jobs([], "", "", "", 0, "")
    assert stopped
    assert (rec.job.state, rec.task_states) == (JobState.RUNNING, {"RUNNING": 2})  # the snapshot before the stop
    (rec,), _ = jm.list_jobs([], "", "", "", 0, "")
    assert (rec.job.state, rec.task_states) == (JobState.KILLING, {"KILLING": 2})


def test_a_snapshot_leaves_the_pooled_connection_as_it_found_it(engine: Engine,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A snapshot can begin on a connection the pool has just pinged (the ping's own transaction is ended), and
    the next transaction on that connection reads committed and may write again (PostgreSQL)."""
    if engine.dialect.name != "postgresql":
        return  # SQLite: nothing is set
    monkeypatch.setattr(db, "IDLE_PING_S", 0.0)  # every checkout pings
    eng = db.make_engine(engine.url.render_as_string(hide_password=False))
    try:
        one = sessionmaker(bind=eng.execution_options())  # pool of its own, used serially: the same connection
        with db.transaction(one, snapshot=True) as s:
            assert s.execute(text("SHOW transaction_isolation")).scalar() == "repeatable read"
            assert s.execute(text("SHOW transaction_read_only")).scalar() == "on"
        with db.transaction(one) as s:
            assert s.execute(text("SHOW transaction_isolation")).scalar() == "read committed"
            assert s.execute(text("SHOW transaction_read_only")).scalar() == "off"
    finally:
        eng.dispose()
