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
from peloton.errors import AlreadyExists, NotFound, Unavailable
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
    blocker = _busy(w, hold)  # the next 20 mutations queue up behind it
    before = len(rec.published)
    futures = [w.submit(stop(f"j{i}")) for i in range(20)]
    hold.set()
    blocker.result(5)
    for f in futures:
        f.result(10)
    w.run(Mutation(Kind.QUERY, query=lambda views: None))  # (publishing follows the answers, on the writer's thread)
    assert len(rec.published) - before == 1  # one commit for all twenty
    with db.transaction(sessions) as s:
        assert {j.state for j in repo.get_jobs(s, [f"j{i}" for i in range(20)]).values()} == {JobState.KILLED}


def test_a_mutation_that_breaks_fails_alone_and_leaves_its_job_as_the_store_has_it(
    writer: tuple[Writer, Recorded], sessions: sessionmaker[Session]
) -> None:
    w, _ = writer
    a, b = create(w, "a"), create(w, "b")
    hold = threading.Event()
    _busy(w, hold)

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
    real = repo.Writes.send

    def down(self: repo.Writes, s: Session, *args: Any, **kwargs: Any) -> None:
        raise StoreUnavailable("the store is unavailable (test); retry later")

    monkeypatch.setattr(repo.Writes, "send", down)
    performed = len(rec.performed)
    with pytest.raises(StoreUnavailable):
        w.run(stop("a"))
    assert len(rec.performed) == performed  # nothing of a batch that was not committed is acted upon
    monkeypatch.setattr(repo.Writes, "send", real)
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


def test_a_writer_resumed_after_another_daemon_led_reads_its_jobs_afresh(writer: tuple[Writer, Recorded],
                                                                         sessions: sessionmaker[Session]) -> None:
    """Paused (this daemon lost the store lock), the store may change under the cache: resumed with `clear`, the
    first mutation reads the job as the store has it, not the cached view it would have written back."""
    w, _ = writer
    create(w, "a")
    assert w.read(lambda views: views["a"].job.desired) == "RUNNING"  # cached
    for clear in (False, True):
        w.pause("no lock")
        with db.transaction(sessions) as s:  # another daemon stops the job meanwhile
            s.execute(text("UPDATE jobs SET desired = 'KILLED' WHERE id = 'a'"))
        w.resume(clear)
        desired = w.read(lambda views: views["a"].job.desired, ["a"])
        assert desired == ("KILLED" if clear else "RUNNING")  # (without clear: the view from before the pause)


def test_a_status_update_of_a_big_job_writes_a_handful_of_rows(writer: tuple[Writer, Recorded],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    w, _ = writer
    create(w, "big", instances=3000, min_available=1)  # 3000 gangs of one
    written: list[int] = []
    real = repo.Writes.send

    def counting(self: repo.Writes, s: Session, jobs: Any = (), gangs: Any = (), tasks: Any = (), **kwargs: Any) -> None:
        if tasks:
            written.append(len(tasks))
        real(self, s, jobs, gangs, tasks, **kwargs)

    monkeypatch.setattr(repo.Writes, "send", counting)

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
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for f in futures:
        f.result(20)
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


def _statements() -> dict[tuple[str, str], float]:
    """The store's statements so far, by (verb, table) (db.STATEMENT_TARGETS)."""
    return {(s.labels["op"], s.labels["table"]): s.value for m in db.STATEMENT_TARGETS.collect() for s in m.samples
            if s.name.endswith("_total")}


def _sent(before: dict[tuple[str, str], float]) -> dict[tuple[str, str], float]:
    return {k: v - before.get(k, 0.0) for k, v in _statements().items() if v - before.get(k, 0.0)}


def _busy(w: Writer, hold: threading.Event) -> Future[Any]:
    """The writer runs a query that waits for `hold`, once it has begun (a mutation submitted before that could be
    taken with it, in the same take, and committed on its own)."""
    began = threading.Event()

    def wait(views: Views) -> bool:
        began.set()
        return hold.wait(5)

    blocker = w.submit(Mutation(Kind.QUERY, query=wait))
    assert began.wait(5)
    return blocker


def _queued(w: Writer, mutations: list[Mutation[Any]]) -> list[Future[Any]]:
    """Submit `mutations` behind a blocker, so that they are committed as one batch."""
    hold = threading.Event()
    blocker = _busy(w, hold)
    futures = [w.submit(m) for m in mutations]
    hold.set()
    blocker.result(5)
    return futures


def _creating(job_id: str) -> Mutation[Any]:
    spec = JobSpec(name=job_id, instances=2, command="true", resources=Resources(cpu=1))
    job, gangs, tasks = policy.new_job_records(job_id, spec, 10.0)
    return Mutation(Kind.CREATE, view=policy.new_job_view(job, gangs, tasks),
                    events=[TaskEvent(job_id, t.instance, 1, TaskState.PENDING, 10.0) for t in tasks], rows=2)


def test_a_group_commit_sends_one_statement_on_postgresql_and_one_per_table_on_sqlite(
        writer: tuple[Writer, Recorded], sessions: sessionmaker[Session], db_url: str) -> None:
    w, _ = writer
    for i in range(5):
        create(w, f"old{i}")
    before = _statements()
    # new jobs with their first events, and stops of others (updates of jobs, gangs, tasks and more events)
    for f in _queued(w, [_creating(f"new{i}") for i in range(5)] + [stop(f"old{i}") for i in range(5)]):
        f.result(10)
    sent = _sent(before)
    if db_url.startswith("postgresql"):
        assert sent == {("BATCH", "*"): 1, ("PREPARE", "*"): 1}  # its shape's first batch on this connection
    else:
        assert sent == {("INSERT", t): 1 for t in ("jobs", "gangs", "tasks", "task_events")} | {
            ("UPDATE", t): 1 for t in ("jobs", "gangs", "tasks")} | {("BEGIN", ""): 1}  # (BEGIN IMMEDIATE)
    with db.transaction(sessions) as s:
        got = repo.get_jobs(s, [f"{p}{i}" for p in ("old", "new") for i in range(5)])
        assert {j.id: j.state for j in got.values()} == {
            **{f"old{i}": JobState.KILLED for i in range(5)}, **{f"new{i}": JobState.PENDING for i in range(5)}}
        assert [(t.instance, t.state) for t in repo.get_tasks(s, "new3")] == [(0, TaskState.PENDING),
                                                                                (1, TaskState.PENDING)]
        assert len(repo.get_task_events(s, "new3", 0)) == 1
        assert {t.state for t in repo.get_tasks(s, "old2")} == {TaskState.KILLED}


def test_a_taken_job_id_fails_its_create_alone_in_a_batch(writer: tuple[Writer, Recorded],
                                                          sessions: sessionmaker[Session]) -> None:
    w, _ = writer
    create(w, "a")
    futures = _queued(w, [_creating("b"), _creating("a"), _creating("c")])
    assert futures[0].result(10) == "b" and futures[2].result(10) == "c"
    with pytest.raises(AlreadyExists, match="job 'a' already exists") as e:
        futures[1].result(10)
    assert e.value.field == "id"
    with db.transaction(sessions) as s:
        assert set(repo.get_jobs(s, ["a", "b", "c"])) == {"a", "b", "c"}


def test_a_job_created_and_changed_in_one_batch(writer: tuple[Writer, Recorded],
                                                sessions: sessionmaker[Session]) -> None:
    """The update cannot go in the statement that inserts the row (one snapshot): it goes after it."""
    w, _ = writer
    for f in _queued(w, [_creating("a"), stop("a"), _creating("b")]):
        f.result(10)
    with db.transaction(sessions) as s:
        assert repo.get_job(s, "a").state == JobState.KILLED and repo.get_job(s, "b").state == JobState.PENDING
        assert {t.state for t in repo.get_tasks(s, "a")} == {TaskState.KILLED}


def test_an_update_of_a_row_that_is_gone_fails_the_mutation(writer: tuple[Writer, Recorded],
                                                            sessions: sessionmaker[Session]) -> None:
    w, _ = writer
    create(w, "a")
    w.read(lambda views: views["a"], ["a"])  # cached
    with db.transaction(sessions) as s:  # gone behind the writer's back (not something the daemon does)
        s.execute(text("DELETE FROM task_events WHERE job_id = 'a'"))
        s.execute(text("DELETE FROM tasks WHERE job_id = 'a'"))
    with pytest.raises(NotFound, match="of the tasks to update do not exist"):
        w.run(stop("a"))
    with db.transaction(sessions) as s:
        assert repo.get_job(s, "a").state == JobState.PENDING  # rolled back: not half written


def test_the_fence_is_checked_in_the_batch_statement_and_refuses_a_replaced_leader(db_url: str) -> None:
    from peloton.leadership.fence import EPOCH_KEY, Fence, Fenced, take_epochs

    db.upgrade(db_url)
    engines = [db.make_engine(db_url), db.make_engine(db_url)]
    try:
        a, b = db.make_sessions(engines[0]), db.make_sessions(engines[1])
        told: list[str] = []
        Fence(take_epochs(a)[EPOCH_KEY], told.append).install(a)
        rec = Recorded()
        w = Writer(a, rec.publish, rec.perform, clock=lambda: 50.0)
        w.start()
        try:
            create(w, "a")
            before = _statements()
            w.run(stop("a"))
            sent = _sent(before)
            # PostgreSQL: the epochs are read in the batch's statement, not again before the commit
            assert sent == ({("BATCH", "*"): 1, ("PREPARE", "*"): 1} if db_url.startswith("postgresql") else
                            {("UPDATE", "jobs"): 1, ("UPDATE", "gangs"): 1, ("UPDATE", "tasks"): 1,
                             ("INSERT", "task_events"): 1, ("SELECT", "meta"): 1, ("BEGIN", ""): 1})
            take_epochs(b)  # another daemon takes over
            with pytest.raises(Fenced, match="no longer the store's leader"):
                w.run(_creating("late"))
            assert len(told) == 1
        finally:
            w.stop()
        with db.transaction(b) as s:
            assert repo.get_jobs(s, ["late"]) == {}  # rolled back
    finally:
        for e in engines:
            e.dispose()


def test_the_writer_keeps_its_connection_and_replaces_one_that_was_terminated(sessions: sessionmaker[Session],
                                                                              engine: sqlalchemy.Engine,
                                                                              db_url: str) -> None:
    """Its commits share one connection (no pool checkout each); PostgreSQL: a backend ended between two batches
    (a standby taking over, an administrator, a restart) is replaced before the next batch, which commits."""
    checkouts: list[int] = []

    def on_checkout(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
        checkouts.append(id(dbapi_connection))

    sqlalchemy.event.listen(engine, "checkout", on_checkout)
    rec = Recorded()
    w = Writer(sessions, rec.publish, rec.perform, clock=lambda: 50.0)
    w.start()
    try:
        create(w, "a")
        create(w, "b")
        w.run(stop("a"))
        assert len(checkouts) == 1
        if db_url.startswith("postgresql"):
            admin = sqlalchemy.create_engine(db_url, isolation_level="AUTOCOMMIT")  # pg_stat_activity: fresh per statement
            try:
                with admin.connect() as c:
                    pids = c.execute(text("SELECT pg_terminate_backend(pid), pid FROM pg_stat_activity WHERE "
                                          "datname = current_database() AND pid <> pg_backend_pid()")).all()
                    assert pids  # the writer's, at least
                    for _ in range(500):  # until they are gone
                        if not c.execute(text("SELECT 1 FROM pg_stat_activity WHERE pid = ANY(:p)"),
                                         {"p": [p for _, p in pids]}).first():
                            break
                        time.sleep(0.01)
            finally:
                admin.dispose()
        w.run(stop("b"))  # no StoreUnavailable
    finally:
        w.stop()
        sqlalchemy.event.remove(engine, "checkout", on_checkout)
    check = db.make_engine(db_url)
    try:
        with db.transaction(db.make_sessions(check)) as s:
            assert repo.get_job(s, "a").state == JobState.KILLED
            assert repo.get_job(s, "b").state == JobState.KILLED
    finally:
        check.dispose()


def test_a_fence_installed_after_the_writer_started_checks_its_commits(db_url: str) -> None:
    """The writer's kept connection gets a session of its own per commit: a fence installed on the sessions later
    (the daemon takes its epoch once the store is locked) is in every commit from then on."""
    from peloton.leadership.fence import EPOCH_KEY, Fence, Fenced, take_epochs

    db.upgrade(db_url)
    engines = [db.make_engine(db_url), db.make_engine(db_url)]
    try:
        a, b = db.make_sessions(engines[0]), db.make_sessions(engines[1])
        rec = Recorded()
        w = Writer(a, rec.publish, rec.perform, clock=lambda: 50.0)
        w.start()
        try:
            create(w, "early")
            Fence(take_epochs(a)[EPOCH_KEY]).install(a)
            create(w, "a")
            take_epochs(b)  # another daemon takes over
            with pytest.raises(Fenced):
                w.run(_creating("late"))
        finally:
            w.stop()
        with db.transaction(b) as s:
            assert set(repo.get_jobs(s, ["early", "a", "late"])) == {"early", "a"}
    finally:
        for e in engines:
            e.dispose()


@pytest.mark.parametrize("step", ["side effects", "publish"])
def test_a_hand_off_that_raises_after_a_commit_leaves_the_callers_answered_and_the_writer_serving(
        sessions: sessionmaker[Session], step: str) -> None:
    """What a commit hands on (its side effects, then the watchers' publish) runs on the writer's thread after the
    commit: one that raises (a bug there) is logged and counted as the writer's loop error, and the commit's callers
    still get their answers, as do later ones (the thread died with it before: every later caller waited for
    ever)."""
    from peloton.loop import LOOP_ERRORS

    rec = Recorded()
    broken = {"on": True}

    def perform(eff: policy.Effects, views: Views) -> None:
        if step == "side effects" and broken["on"]:
            raise RuntimeError("a bug in a hand-off")
        rec.perform(eff, views)

    def publish(views: Any, eff: policy.Effects, deleted: list[str]) -> None:
        if step == "publish" and broken["on"]:
            raise RuntimeError("a bug in a publish")
        rec.publish(views, eff, deleted)

    errors = LOOP_ERRORS.labels("jobmgr-writer")
    before = errors._value.get()
    w = Writer(sessions, publish, perform, clock=lambda: 50.0)
    w.start()
    try:
        create(w, "a")  # answered, though what followed its commit failed
        assert errors._value.get() == before + 1
        broken["on"] = False
        create(w, "b")
        w.run(stop("a"))
        assert w.alive
    finally:
        w.stop()
    with db.transaction(sessions) as s:
        assert {j for j in ("a", "b") if repo.get_job(s, j) is not None} == {"a", "b"}
        job = repo.get_job(s, "a")
        assert job is not None and job.state.terminal
