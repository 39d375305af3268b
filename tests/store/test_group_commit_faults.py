"""The job manager's group commit and the store's raw fast path under awkward conditions, on a real SQLite and a
real PostgreSQL: text that an array literal must quote, one bad update among good ones, a statement that fails in
the middle of a batch, a leader fenced mid-commit, a prepared batch on a connection that was replaced, a batch
that fails with a job's create and a change of that job in it."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy
from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

from peloton.domain.model import TaskEvent
from peloton.domain.resources import Resources
from peloton.domain.spec import JobSpec
from peloton.domain.states import JobState, TaskState
from peloton.errors import NotFound
from peloton.jobmgr import gang_policy as policy
from peloton.jobmgr.writer import Kind, Mutation, Views, Writer
from peloton.store import bulk, db, repo
from tests.store.test_writer import _queued


class Recorded:
    def __init__(self) -> None:
        self.published = 0
        self.performed = 0

    def publish(self, views: Any, eff: policy.Effects, deleted: list[str]) -> None:
        self.published += 1

    def perform(self, eff: policy.Effects, views: Views) -> None:
        self.performed += 1


@pytest.fixture
def writer(sessions: sessionmaker[Session]) -> Iterator[Writer]:
    w = Writer(sessions, Recorded().publish, Recorded().perform, clock=lambda: 50.0)
    w.start()
    yield w
    w.stop()


def _creating(job_id: str, instances: int = 2) -> Mutation[Any]:
    spec = JobSpec(name=job_id, instances=instances, command="true", resources=Resources(cpu=1))
    job, gangs, tasks = policy.new_job_records(job_id, spec, 10.0)
    return Mutation(Kind.CREATE, view=policy.new_job_view(job, gangs, tasks),
                    events=[TaskEvent(job_id, t.instance, 1, TaskState.PENDING, 10.0) for t in tasks],
                    rows=1 + len(gangs) + 2 * len(tasks))


def _stop(job_id: str) -> Mutation[policy.Effects]:
    return Mutation(Kind.APPLY, [job_id], apply=lambda v, now: policy.stop_job(v[job_id], now))


AWKWARD = ["", "NULL", "null", '"', "\\", '\\"', "a,b", "{x}", "{", "}", " lead", "trail ", "\t\n\r", "é日本🎉",
           "'", "''", 'a"b\\c', " ", '"NULL"', "\\.", "\\N", "%s", "%(x)s", "$1", "x" * 100_000]


def test_awkward_text_round_trips_through_every_way_a_batch_goes(writer: Writer,
                                                                 sessions: sessionmaker[Session]) -> None:
    """Job reason, gang reason and each task's message and reason, written by the writer's bulk updates: on
    PostgreSQL as array literals (bulk.pg_array) in one self-committing statement, as text the first time and
    through the prepared statement the next; on SQLite with executemany."""
    n = len(AWKWARD)
    writer.run(_creating("a", instances=n))

    def setting(suffix: str) -> Any:
        def apply(views: Views, now: float) -> policy.Effects:
            jv, eff = views["a"], policy.Effects()
            jv.job.reason = AWKWARD[3] + suffix
            eff.touch_job(jv.job)
            for gv in jv.gangs.values():
                gv.gang.reason = AWKWARD[4] + suffix
                eff.touch_gang(gv.gang)
            for i, t in jv.tasks.items():
                t.message, t.reason = AWKWARD[i] + suffix, AWKWARD[(i + 1) % n] + suffix
                eff.touch_task(t)
            return eff
        return apply

    for suffix in ("", "!"):  # the second time: the same shape, prepared (PostgreSQL)
        writer.mutate(["a"], setting(suffix))
        with db.transaction(sessions) as s:
            assert repo.get_job(s, "a").reason == AWKWARD[3] + suffix
            assert {g.reason for g in repo.get_gangs(s, "a")} == {AWKWARD[4] + suffix}
            got = {t.instance: (t.message, t.reason) for t in repo.get_tasks(s, "a")}
        assert got == {i: (AWKWARD[i] + suffix, AWKWARD[(i + 1) % n] + suffix) for i in range(n)}


def test_one_update_of_a_row_that_is_gone_fails_alone_in_a_group_commit(writer: Writer,
                                                                        sessions: sessionmaker[Session]) -> None:
    """The batch's statement fails (PostgreSQL: its update count check; SQLite: the row count): each mutation is
    committed again on its own, and every future is resolved."""
    for j in ("a", "b", "c"):
        writer.run(_creating(j))
    writer.read(lambda views: None, ["a", "b", "c"])  # cached: the batch below is a raw one
    with db.transaction(sessions) as s:  # b's tasks gone behind the writer's back
        s.execute(text("DELETE FROM task_events WHERE job_id = 'b'"))
        s.execute(text("DELETE FROM tasks WHERE job_id = 'b'"))
    futures = _queued(writer, [_stop("a"), _stop("b"), _stop("c")])
    futures[0].result(10)
    futures[2].result(10)
    with pytest.raises(Exception):  # noqa: B017 - on its own, b is reloaded without its tasks (a KeyError then)
        futures[1].result(10)
    with db.transaction(sessions) as s:
        states = {j: repo.get_job(s, j).state for j in ("a", "b", "c")}
    assert states == {"a": JobState.KILLED, "b": JobState.PENDING, "c": JobState.KILLED}


def test_a_missing_row_is_reported_for_its_own_table_when_earlier_updates_are_empty(
        sessions: sessionmaker[Session]) -> None:
    """Missing's index counts only the updates with rows (bulk.batch_sql skips the empty ones): no jobs updated,
    the gangs found, one task not: it is the tasks that are reported, on every path of Writes.send."""
    w = Writer(sessions, Recorded().publish, Recorded().perform, clock=lambda: 50.0)
    w.start()
    try:
        w.run(_creating("a"))
        jv = w.read(lambda views: views["a"], ["a"])
    finally:
        w.stop()
    gang = next(iter(jv.gangs.values())).gang
    task = jv.tasks[0]
    ghost = dataclasses.replace(task, instance=99)  # no such task
    kept = db.KeptConnection(sessions)
    try:
        for raw in (True, False):
            with pytest.raises(NotFound, match=r"1 of the tasks to update do not exist"), \
                    (kept.raw_transaction() if raw else kept.transaction()) as tx:
                repo.Writes().send(tx, [], [gang], [task, ghost], last=True)
    finally:
        kept.close()


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_a_statement_error_in_the_middle_of_a_batch_fails_only_its_mutation(
        writer: Writer, sessions: sessionmaker[Session]) -> None:
    """PostgreSQL refuses a host longer than its column (SQLite keeps it): the others of the batch commit."""
    for j in ("a", "b", "c"):
        writer.run(_creating(j))
    writer.read(lambda views: None, ["a", "b", "c"])

    def long_host(views: Views, now: float) -> policy.Effects:
        eff = policy.Effects()
        t = views["b"].tasks[0]
        t.host = "h" * 300
        eff.touch_task(t)
        return eff

    futures = _queued(writer, [_stop("a"), Mutation(Kind.APPLY, ["b"], apply=long_host), _stop("c")])
    futures[0].result(10)
    futures[2].result(10)
    with pytest.raises(Exception, match="too long"):
        futures[1].result(10)
    with db.transaction(sessions) as s:
        assert {j: repo.get_job(s, j).state for j in ("a", "b", "c")} == {
            "a": JobState.KILLED, "b": JobState.PENDING, "c": JobState.KILLED}
        assert {t.host for t in repo.get_tasks(s, "b")} == {""}


def test_a_leader_fenced_mid_commit_leaves_nothing_and_commits_again_once_it_leads(db_url: str) -> None:
    from peloton.leadership.fence import EPOCH_KEY, Fence, Fenced, take_epochs

    db.upgrade(db_url)
    engines = [db.make_engine(db_url), db.make_engine(db_url)]
    try:
        a, b = db.make_sessions(engines[0]), db.make_sessions(engines[1])
        fence = Fence(take_epochs(a)[EPOCH_KEY])
        fence.install(a)
        w = Writer(a, Recorded().publish, Recorded().perform, clock=lambda: 50.0)
        w.start()
        try:
            for j in ("x", "y"):
                w.run(_creating(j))
            w.run(_stop("x"))  # the shape prepared (PostgreSQL)
            take_epochs(b)  # another daemon takes over
            futures = _queued(w, [_stop("y"), _creating("late")])
            for f in futures:
                with pytest.raises(Fenced):
                    f.result(10)
            with db.transaction(b) as s:
                assert repo.get_job(s, "y").state == JobState.PENDING
                assert repo.get_jobs(s, ["late"]) == {}
                assert {t.state for t in repo.get_tasks(s, "y")} == {TaskState.PENDING}
            fence.take(take_epochs(a))  # this one leads again
            w.run(_stop("y"))
        finally:
            w.stop()
        with db.transaction(b) as s:
            assert repo.get_job(s, "y").state == JobState.KILLED
    finally:
        for e in engines:
            e.dispose()


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_a_prepared_batch_is_prepared_again_on_a_connection_that_replaced_its_own(
        sessions: sessionmaker[Session], db_url: str) -> None:
    """bulk._PREPARED is per DB-API connection: the connection that replaces a terminated one prepares the shape
    itself before it executes it (never an EXECUTE of a name it does not have)."""
    from peloton.store.models import MetaRow

    table: Any = MetaRow.__table__
    kept = db.KeptConnection(sessions)

    def commit(key: str) -> int:
        with kept.raw_transaction() as tx:
            ins = bulk.Insert(table, ("key", "value"))
            ins.rows.append((key, "1"))
            bulk.commit_batch(tx, [ins], [])
        with kept.transaction() as s:
            return int(s.execute(text("SELECT pg_backend_pid()")).scalar_one())

    try:
        first = commit("a")
        admin = sqlalchemy.create_engine(db_url, isolation_level="AUTOCOMMIT")
        try:
            with admin.connect() as c:
                c.execute(text("SELECT pg_terminate_backend(:p)"), {"p": first})
                for _ in range(500):
                    if not c.execute(text("SELECT 1 FROM pg_stat_activity WHERE pid = :p"), {"p": first}).first():
                        break
                    time.sleep(0.01)
        finally:
            admin.dispose()
        second = commit("b")
        assert second != first
        with kept.transaction() as s:
            assert s.execute(text("SELECT count(*) FROM pg_prepared_statements")).scalar() == 1
    finally:
        kept.close()
    with db.transaction(sessions) as s:
        assert (repo.get_meta(s, "a"), repo.get_meta(s, "b")) == ("1", "1")


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_a_prepared_batchs_name_stands_for_its_text_whichever_client_prepared_it(
        sessions: sessionmaker[Session]) -> None:
    """Behind a pooler in transaction mode, one server session serves several clients, each with its own idea of
    what it prepared there. Were names handed out in order (the first shape a client prepares is `..._0`), a
    client's EXECUTE could reach a session where another client had prepared that name as another shape, and run
    that statement with this one's parameters. A name is a hash of the text: a client that finds its name prepared
    already uses it, and another shape has another name. (One connection stands for the shared session here; its
    record of what it prepared is forgotten, as another client's would never have had it.)"""
    from peloton.store.models import MetaRow

    table: Any = MetaRow.__table__
    kept = db.KeptConnection(sessions)

    def commit(*keys: str) -> None:
        with kept.raw_transaction() as tx:
            ins = bulk.Insert(table, ("key", "value"))
            ins.rows += [(k, "1") for k in keys]
            bulk.commit_batch(tx, [ins], [])

    def prepared() -> dict[str, str]:
        with kept.transaction() as s:
            return dict(s.execute(text("SELECT name, statement FROM pg_prepared_statements")).all())

    try:
        commit("a")  # one row: a shape prepared by "the first client"
        (one,) = prepared()
        with kept.raw_transaction() as tx:
            cur, _ = bulk.cursor(tx)
            bulk._PREPARED.pop(cur.connection)  # "another client" on the same server session
            cur.close()
        commit("b", "c")  # another shape: another name, not the first client's
        commit("d")  # the first shape again: found prepared there, used
        names = prepared()
        assert len(names) == 2 and one in names
        with kept.raw_transaction() as tx:
            cur, _ = bulk.cursor(tx)
            assert set(bulk._PREPARED[cur.connection].values()) == set(names)  # (both executed by name)
            cur.close()
    finally:
        kept.close()
    with db.transaction(sessions) as s:
        assert [repo.get_meta(s, k) for k in "abcd"] == ["1", "1", "1", "1"]


def test_a_job_created_and_stopped_in_a_batch_that_fails_is_created_as_it_was_on_its_own(
        writer: Writer, sessions: sessionmaker[Session]) -> None:
    """A group commit that fails for another mutation (here a taken job id) is committed again a mutation at a
    time: the create must insert the job as it was created, not as the stop after it left the view in memory in
    the failed attempt (the job then went in already KILLED, its tasks' KILLED events lost)."""
    writer.run(_creating("taken"))
    futures = _queued(writer, [_creating("a"), _stop("a"), _creating("taken")])
    futures[0].result(10)
    futures[1].result(10)
    with pytest.raises(Exception, match="already exists"):
        futures[2].result(10)
    with db.transaction(sessions) as s:
        assert repo.get_job(s, "a").state == JobState.KILLED
        events = [(e.instance, e.state) for e in repo.get_task_events(s, "a", 0)]
    assert events == [(0, TaskState.PENDING), (0, TaskState.KILLED)]


def test_a_broken_change_of_a_job_created_in_the_same_batch_is_not_committed_with_its_create(
        writer: Writer, sessions: sessionmaker[Session]) -> None:
    """A mutation that changes a job and then raises fails alone: its change must not land, not even by way of
    the job's create in the same batch, committed again on its own."""
    def breaks(views: Views, now: float) -> policy.Effects:
        views["a"].job.reason = "half done"
        raise RuntimeError("a bug in a rule")

    futures = _queued(writer, [_creating("a"), Mutation(Kind.APPLY, ["a"], apply=breaks)])
    assert futures[0].result(10) == "a"
    with pytest.raises(RuntimeError, match="a bug"):
        futures[1].result(10)
    with db.transaction(sessions) as s:
        assert repo.get_job(s, "a").reason == ""
    assert writer.read(lambda views: views["a"].job.reason, ["a"]) == ""
