"""The job manager's writer on a real store (SQLite and PostgreSQL): group commit, one bad mutation failing alone,
store outages, pausing, writing only what changed, the cache of active jobs."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import pytest
import sqlalchemy
from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

from peloton.domain.launch import TaskStatus
from peloton.domain.model import TaskEvent
from peloton.domain.resources import Resources
from peloton.domain.spec import JobSpec
from peloton.domain.states import JobState, TaskState
from peloton.errors import NotFound, Unavailable
from peloton.jobmgr import gang_policy as policy
from peloton.jobmgr.writer import Kind, Mutation, Views, Writer
from peloton.store import db, repo
from peloton.store.db import StoreUnavailable


class Recorded:
    def __init__(self) -> None:
        self.published: list[list[str]] = []
        self.performed: list[policy.Effects] = []

    def publish(self, views: Any, eff: policy.Effects, deleted: list[str]) -> None:
        self.published.append(sorted(jv.job.id for jv in views))

    def perform(self, eff: policy.Effects, views: Views) -> None:
        self.performed.append(eff)


@pytest.fixture
def writer(sessions: sessionmaker[Session]) -> Iterator[tuple[Writer, Recorded]]:
    rec = Recorded()
    w = Writer(sessions, rec.publish, rec.perform, clock=lambda: 50.0)
    w.start()
    yield w, rec
    w.stop()


def create(w: Writer, job_id: str, instances: int = 2, min_available: int = 0) -> policy.JobView:
    spec = JobSpec(name=job_id, instances=instances, command="true", resources=Resources(cpu=1),
                   min_available=min_available)
    job, gangs, tasks = policy.new_job_records(job_id, spec, 10.0)
    jv = policy.new_job_view(job, gangs, tasks)
    events = [TaskEvent(job_id, t.instance, 1, TaskState.PENDING, 10.0) for t in tasks]
    assert w.run(Mutation(Kind.CREATE, view=jv, events=events, rows=len(tasks))) == job_id
    return jv


def stop(job_id: str) -> Mutation[policy.Effects]:
    return Mutation(Kind.APPLY, [job_id], apply=lambda v, now: policy.stop_job(v[job_id], now))


def test_changes_that_arrive_together_are_committed_together(writer: tuple[Writer, Recorded],
                                                             sessions: sessionmaker[Session]) -> None:
    w, rec = writer
    for i in range(20):
        create(w, f"j{i}")
    hold = threading.Event()
    # keep the writer busy so that the next 20 mutations queue up behind it
    blocker = w.submit(Mutation(Kind.QUERY, query=lambda views: hold.wait(5)))
    futures = [w.submit(stop(f"j{i}")) for i in range(20)]
    before = len(rec.published)
    hold.set()
    blocker.result(5)
    for f in futures:
        f.result(10)
    assert len(rec.published) - before == 1  # one commit for all twenty
    with db.transaction(sessions) as s:
        assert {j.state for j in repo.get_jobs(s, [f"j{i}" for i in range(20)]).values()} == {JobState.KILLED}


def test_a_mutation_that_breaks_fails_alone_and_leaves_its_job_as_the_store_has_it(
    writer: tuple[Writer, Recorded], sessions: sessionmaker[Session]
) -> None:
    w, _ = writer
    a, b = create(w, "a"), create(w, "b")
    hold = threading.Event()
    w.submit(Mutation(Kind.QUERY, query=lambda views: hold.wait(5)))

    def breaks(views: Views, now: float) -> policy.Effects:
        policy.stop_job(views["b"], now)  # changes b in memory...
        raise RuntimeError("a bug in a rule")  # ...then fails

    good = w.submit(stop("a"))
    bad = w.submit(Mutation[None](Kind.APPLY, ["b"], apply=breaks))
    hold.set()
    good.result(10)
    with pytest.raises(RuntimeError, match="a bug"):
        bad.result(10)
    state = w.read(lambda views: (views["a"].job.state, views["b"].job.state, views["b"].job.desired), ["a", "b"])
    assert state == (JobState.KILLED, JobState.PENDING, "RUNNING")  # b reloaded from the store, unchanged
    with db.transaction(sessions) as s:
        assert repo.get_job(s, "b").state == JobState.PENDING
    assert a.job.id == "a" and b.job.id == "b"


def test_a_check_that_refuses_fails_only_its_mutation(writer: tuple[Writer, Recorded]) -> None:
    w, _ = writer
    create(w, "a")

    def check(views: Views) -> None:
        raise NotFound("no such thing")

    with pytest.raises(NotFound):
        w.run(Mutation(Kind.APPLY, ["a"], check=check, apply=lambda v, n: policy.stop_job(v["a"], n)))
    assert w.read(lambda views: views["a"].job.state, ["a"]) == JobState.PENDING


def test_a_store_outage_fails_the_batch_with_unavailable_and_forgets_nothing(
    writer: tuple[Writer, Recorded], monkeypatch: pytest.MonkeyPatch, sessions: sessionmaker[Session]
) -> None:
    w, rec = writer
    create(w, "a")
    real = repo.update_jobs

    def down(s: Session, jobs: Any) -> None:
        raise StoreUnavailable("the store is unavailable (test); retry later")

    monkeypatch.setattr(repo, "update_jobs", down)
    performed = len(rec.performed)
    with pytest.raises(StoreUnavailable):
        w.run(stop("a"))
    assert len(rec.performed) == performed  # nothing of a batch that was not committed is acted upon
    monkeypatch.setattr(repo, "update_jobs", real)
    assert w.read(lambda views: views["a"].job.state, ["a"]) == JobState.PENDING  # as the store has it
    w.run(stop("a"))
    with db.transaction(sessions) as s:
        assert repo.get_job(s, "a").state == JobState.KILLED


def test_a_paused_writer_refuses_until_resumed(writer: tuple[Writer, Recorded]) -> None:
    w, _ = writer
    create(w, "a")
    w.pause("no lock")
    with pytest.raises(Unavailable, match="no lock"):
        w.run(stop("a"))
    w.resume()
    w.run(stop("a"))


def test_a_status_update_of_a_big_job_writes_a_handful_of_rows(writer: tuple[Writer, Recorded],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    w, _ = writer
    create(w, "big", instances=3000, min_available=1)  # 3000 gangs of one
    written: list[int] = []
    real = repo.update_tasks

    def counting(s: Session, tasks: Any) -> None:
        written.append(len(tasks))
        real(s, tasks)

    monkeypatch.setattr(repo, "update_tasks", counting)

    def launch_first(views: Views, now: float) -> policy.Effects:
        from peloton.domain.placement import GangPlacement, MemberAssignment

        jv = views["big"]
        t = jv.tasks[7]
        p = GangPlacement(f"big/{t.gang_index}", "big", 1,
                          (MemberAssignment(7, t.task_id, "h", "", Resources(cpu=1)),))
        eff = policy.launch_intent(jv, p, now)
        assert eff is not None
        return eff

    w.mutate(["big"], launch_first)
    st = TaskStatus("big-7-1", TaskState.RUNNING, 60.0, "h")
    w.mutate(["big"], lambda v, now: policy.apply_status(v["big"], st, now))
    assert written == [1, 1]


def test_finished_jobs_leave_the_cache(writer: tuple[Writer, Recorded]) -> None:
    w, _ = writer
    create(w, "a")
    assert w.read(lambda views: "a" in views)
    w.run(stop("a"))  # queued gangs only: the job is KILLED at once
    assert not w.read(lambda views: "a" in views)
    assert w.read(lambda views: views["a"].job.state, ["a"]) == JobState.KILLED  # loaded again when asked for


def test_many_callers_at_once(writer: tuple[Writer, Recorded]) -> None:
    w, _ = writer
    ids = [f"c{i}" for i in range(40)]
    for j in ids:
        create(w, j)
    futures: list[Future[Any]] = []
    threads = [threading.Thread(target=lambda j=j: futures.append(w.submit(stop(j)))) for j in ids]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for f in futures:
        f.result(20)
    assert time.monotonic() - t0 < 20
    assert w.read(lambda views: [j for j in ids if j in views]) == []


def test_a_connection_lost_in_a_bulk_statement_is_an_outage_not_a_bug(sessions: sessionmaker[Session],
                                                                       db_url: str) -> None:
    """The bulk writers use the DB-API cursor, whose errors come unwrapped by SQLAlchemy: a connection cut
    in the middle of one is still StoreUnavailable (the caller retries), never INTERNAL. PostgreSQL: the server
    really ends the session; SQLite: the driver's own OperationalError (a lock timeout, say)."""
    import sqlite3

    from peloton.store import bulk
    from peloton.store.models import MetaRow

    table = MetaRow.__table__
    with pytest.raises(StoreUnavailable), db.transaction(sessions) as s:
        if db_url.startswith("postgresql"):
            pid = s.execute(text("SELECT pg_backend_pid()")).scalar_one()
            admin = sqlalchemy.create_engine(db_url)
            with admin.connect() as c:
                c.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid})
            admin.dispose()
            bulk.insert_rows(s, table, ("key", "value"), [("k", "v")])  # type: ignore[arg-type]
        else:
            raise sqlite3.OperationalError("database is locked")
    with db.transaction(sessions) as s:  # and the store is usable again
        assert repo.get_meta(s, "k") is None
