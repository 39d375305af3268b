"""A job created in a pool while the pool tree changes under it, through the real components in one daemon (sim
backend) and through the store's functions on two connections held in a set order, on both stores:

- the pool is deleted: either the delete sees the job and is refused, or the create finds the pool gone at its commit
  and is refused. Never both done: a job in a pool that no longer exists (its gangs queued in no pool);
- a child pool is created in it: either CreatePool sees the job (a pool with unfinished jobs gets no children) and is
  refused, or the create finds the pool a leaf no more at its commit and is refused. Never both done: a job in a
  pool with children (jobs go to leaf pools, the root apart)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

import peloton.jobmgr.manager as jobmgr_manager
from peloton.api.v1 import job_pb2, job_pb2_grpc, respool_pb2, respool_pb2_grpc
from peloton.domain.model import Gang, Job, ResourcePool, Task
from peloton.domain.resources import Resources
from peloton.domain.spec import JobSpec
from peloton.errors import FailedPrecondition, InvalidArgument
from peloton.hostmgr.sim.backend import SimSettings
from peloton.jobmgr import gang_policy as policy
from peloton.jobmgr.writer import Kind, Mutation
from peloton.resmgr import service
from peloton.server import Daemon
from peloton.settings import ServerConfig
from peloton.store import bulk, db, repo
from peloton.store.db import transaction

T = 15.0


class Api:
    def __init__(self, daemon: Daemon, ch: grpc.Channel) -> None:
        self.daemon = daemon
        self.jobs = job_pb2_grpc.JobServiceStub(ch)
        self.pools = respool_pb2_grpc.ResourcePoolServiceStub(ch)

    def create_pool(self, path: str) -> None:
        self.pools.CreatePool(respool_pb2.CreatePoolRequest(pool=respool_pb2.ResourcePool(path=path)), timeout=T)

    def delete_pool(self, path: str) -> grpc.RpcError | None:
        try:
            self.pools.DeletePool(respool_pb2.DeletePoolRequest(path=path), timeout=T)
        except grpc.RpcError as e:
            return e
        return None

    def create_job(self, pool: str) -> str | grpc.RpcError:
        s = job_pb2.JobSpec(name="j", instances=1, respool=pool)
        s.task.command = "train.py"
        s.task.resources.cpu = 1
        s.task.resources.mem = "1Gi"
        try:
            return str(self.jobs.CreateJob(job_pb2.CreateJobRequest(spec=s), timeout=T).job_id)
        except grpc.RpcError as e:
            return e

    def create_pool_or_error(self, path: str) -> grpc.RpcError | None:
        try:
            self.create_pool(path)
        except grpc.RpcError as e:
            return e
        return None

    def misplaced(self) -> list[tuple[str, str]]:
        """(job id, pool) of every job whose pool has children, but the root's, as the store has them."""
        assert self.daemon.sessions is not None
        with transaction(self.daemon.sessions) as s:
            parents = {p.parent for p in repo.list_pools(s)}
            jobs = repo.list_jobs(s, limit=10_000)
        return [(j.id, j.spec.respool) for j in jobs if j.spec.respool in parents and j.spec.respool != "/"]

    def orphans(self) -> list[tuple[str, str]]:
        """(job id, pool) of every job whose pool does not exist, as the store has them."""
        assert self.daemon.sessions is not None
        with transaction(self.daemon.sessions) as s:
            pools = {p.path for p in repo.list_pools(s)}
            jobs = repo.list_jobs(s, limit=10_000)
        return [(j.id, j.spec.respool) for j in jobs if j.spec.respool not in pools]


@pytest.fixture
def api(db_url: str, tmp_path: Path) -> Iterator[Api]:
    d = Daemon(ServerConfig(listen="127.0.0.1:0", db_url=db_url, data_dir=tmp_path / "data", metrics_listen="",
                            backend="sim", unix_socket="",
                            sim=SimSettings(hosts=1, resources=Resources(cpu=8, mem=8192, gpu=0), racks=1)))
    ch = grpc.insecure_channel(d.start())
    try:
        yield Api(d, ch)
    finally:
        ch.close()
        d.stop()


def _refused_for_its_pool(r: str | grpc.RpcError, pool: str) -> bool:
    return (isinstance(r, grpc.RpcError) and r.code() == grpc.StatusCode.INVALID_ARGUMENT
            and r.details().startswith(f"respool: resource pool {pool} does not exist"))


def _before_the_commit(api: Api, monkeypatch: pytest.MonkeyPatch, big: bool, change: Callable[[], None]) -> None:
    """`change` made once, after the next create checked its pool and before its rows go in: before the writer
    runs its mutation (the group commit), or, `big`, before its first chunk (repo.insert_job)."""
    jm = api.daemon.jobmgr
    assert jm is not None
    done: list[bool] = []
    if big:
        monkeypatch.setattr(jobmgr_manager, "BIG_JOB_ROWS", 0)
        insert = repo.insert_job

        def change_then_insert(*a: Any) -> None:
            if not done:
                done.append(True)
                change()
            insert(*a)

        monkeypatch.setattr(repo, "insert_job", change_then_insert)
    else:
        run = jm.writer.run

        def change_first(m: Mutation[Any]) -> Any:
            if m.kind == Kind.CREATE and not done:
                done.append(True)
                change()
            return run(m)

        monkeypatch.setattr(jm.writer, "run", change_first)


@pytest.mark.parametrize("big", [False, True], ids=["group-commit", "chunked"])
def test_a_pool_deleted_between_a_creates_check_and_its_commit_gets_no_job(
        api: Api, monkeypatch: pytest.MonkeyPatch, big: bool) -> None:
    """The create checked the pool (it existed); the delete then finds no job in it (none is committed yet) and
    deletes it; the create's commit must not put the job in the pool that is gone. Whether the job goes in with
    the writer's group commit or, a big one, in chunks before it."""
    api.create_pool("/p")
    deleted: list[grpc.RpcError | None] = []
    _before_the_commit(api, monkeypatch, big, lambda: deleted.append(api.delete_pool("/p")))
    created = api.create_job("/p")
    assert deleted == [None]  # the delete saw no job: done
    assert _refused_for_its_pool(created, "/p"), created
    assert api.orphans() == []


def test_a_job_committed_while_the_delete_checks_for_jobs_keeps_its_pool(
        api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    """The delete counted the pool's jobs (none) and has not deleted it yet when a create commits a job in it
    (PostgreSQL: another connection; SQLite: the create's writer waits for the delete's write lock). One of the two
    must be refused."""
    api.create_pool("/p")
    count = repo.unfinished_jobs_in
    created: list[str | grpc.RpcError] = []

    def create_meanwhile(s: Any, path: str) -> int:
        n = count(s, path)
        if path == "/p" and not created:
            t = threading.Thread(target=lambda: created.append(api.create_job("/p")))
            t.start()
            t.join(1.5)  # committed by then, unless the delete's locks hold it up (it then goes on after)
        return n

    monkeypatch.setattr(repo, "unfinished_jobs_in", create_meanwhile)
    deleted = api.delete_pool("/p")
    monkeypatch.setattr(repo, "unfinished_jobs_in", count)
    _wait(lambda: created)
    if deleted is None:
        assert _refused_for_its_pool(created[0], "/p"), created
    else:
        assert isinstance(created[0], str), created
    assert api.orphans() == []


def test_creates_and_deletes_at_once_never_leave_a_job_in_a_deleted_pool(api: Api) -> None:
    """Real concurrency, nothing held: a create and a delete of its pool started together, again and again."""
    for i in range(12):
        pool = f"/r{i}"
        api.create_pool(pool)
        barrier = threading.Barrier(2, timeout=10)
        out: dict[str, Any] = {}

        def create(pool: str = pool, barrier: threading.Barrier = barrier, out: dict[str, Any] = out) -> None:
            barrier.wait()
            out["create"] = api.create_job(pool)

        def delete(pool: str = pool, barrier: threading.Barrier = barrier, out: dict[str, Any] = out) -> None:
            barrier.wait()
            out["delete"] = api.delete_pool(pool)

        threads = [threading.Thread(target=create), threading.Thread(target=delete)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not (isinstance(out["create"], str) and out["delete"] is None), (pool, out)
        assert api.orphans() == [], (pool, out)


def _wait(pred: Callable[[], Any], timeout: float = 20.0) -> None:
    done = threading.Event()
    for _ in range(int(timeout / 0.05)):
        if pred():
            return
        done.wait(0.05)
    raise AssertionError("timed out")


# --- the store's part, below the job manager: each way a batch of new jobs is sent -------------------------------
def _new_job(job_id: str, pool: str) -> tuple[Job, list[Gang], list[Task]]:
    return policy.new_job_records(job_id, JobSpec(name=job_id, respool=pool, instances=1, command="true",
                                                  resources=Resources(cpu=1)), 10.0)


@pytest.fixture(params=["one statement", "a statement per table"])
def sent_as(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """How repo.Writes sends the batch on PostgreSQL: its one statement (bulk.write_batch), or a statement per table
    (a big batch); SQLite always sends the latter."""
    if request.param != "one statement":
        monkeypatch.setattr(bulk, "fits_one_statement", lambda *a: False)
    return str(request.param)


@pytest.mark.usefixtures("sent_as")
def test_a_batch_with_a_new_job_in_a_missing_pool_is_refused_naming_respool(sessions: sessionmaker[Session]) -> None:
    with db.transaction(sessions) as s:
        repo.ensure_root_pool(s, 1.0)
        repo.create_pool(s, ResourcePool(path="/team"))
    w = repo.Writes()
    w.insert_job(*_new_job("a", "/team"))
    w.insert_job(*_new_job("b", "/gone"))
    w.insert_job(*_new_job("c", "/"))  # the root, never deleted: not checked
    with (pytest.raises(InvalidArgument, match=r"^respool: one of the resource pools /gone, /team does not exist") as e,
          db.transaction(sessions) as s):
        w.send(s, last=True)
    assert e.value.field == "respool"
    w = repo.Writes()
    w.insert_job(*_new_job("a", "/team"))
    w.insert_job(*_new_job("c", "/"))
    with db.transaction(sessions) as s:
        w.send(s, last=True)
    with db.transaction(sessions) as s:
        assert set(repo.get_jobs(s, ["a", "b", "c"])) == {"a", "c"}


@pytest.mark.usefixtures("sent_as")
def test_a_delete_waits_for_the_uncommitted_batch_that_checked_its_pool_then_counts_its_job(
        sessions: sessionmaker[Session]) -> None:
    """Two connections: the batch's transaction has checked the pool and inserted its job, not committed yet; the
    delete, on the other, waits for it (PostgreSQL: the pool's row; SQLite: the writer lock), then sees the job."""
    with db.transaction(sessions) as s:
        repo.ensure_root_pool(s, 1.0)
        repo.create_pool(s, ResourcePool(path="/team"))
    w = repo.Writes()
    w.insert_job(*_new_job("a", "/team"))
    outcome: list[BaseException | None] = []
    with db.transaction(sessions) as s:
        w.send(s)

        def delete() -> None:
            try:
                with db.transaction(sessions) as d:
                    repo.lock_pool_tree(d)
                    repo.delete_pool(d, "/team")
                outcome.append(None)
            except BaseException as e:  # noqa: BLE001 - the test looks at it
                outcome.append(e)

        t = threading.Thread(target=delete)
        t.start()
        t.join(0.5)
        assert t.is_alive() and outcome == []  # held up by the batch's transaction
    t.join(30)
    assert len(outcome) == 1 and isinstance(outcome[0], FailedPrecondition), outcome
    assert "has 1 unfinished job(s)" in str(outcome[0])
    with db.transaction(sessions) as s:
        assert [p.path for p in repo.list_pools(s)] == ["/", "/team"]


# --- a child pool created in a new job's pool ----------------------------------------------------------------------
def _refused_as_no_leaf(r: str | grpc.RpcError, pool: str) -> bool:
    return (isinstance(r, grpc.RpcError) and r.code() == grpc.StatusCode.INVALID_ARGUMENT
            and r.details().startswith(f"respool: {pool} has child pools"))


@pytest.mark.parametrize("big", [False, True], ids=["group-commit", "chunked"])
def test_a_child_created_between_a_creates_check_and_its_commit_gets_no_job_beside_it(
        api: Api, monkeypatch: pytest.MonkeyPatch, big: bool) -> None:
    """The create checked the pool (a leaf then); CreatePool then finds no job in it (none is committed yet) and
    creates a child; the create's commit must not put the job in a pool that has a child now."""
    api.create_pool("/p")
    made: list[grpc.RpcError | None] = []
    _before_the_commit(api, monkeypatch, big, lambda: made.append(api.create_pool_or_error("/p/c")))
    created = api.create_job("/p")
    assert made == [None]  # CreatePool saw no job: done
    assert _refused_as_no_leaf(created, "/p"), created
    assert api.misplaced() == []


def test_a_job_committed_while_create_pool_counts_the_parents_jobs_gets_no_child_beside_it(
        api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    """CreatePool counted the parent's jobs (none) and has not created the child yet when a create commits a job in
    the parent (PostgreSQL: another connection; SQLite: the create's writer waits for CreatePool's write lock). One
    of the two must be refused."""
    api.create_pool("/p")
    count = repo.unfinished_jobs_in
    created: list[str | grpc.RpcError] = []

    def create_meanwhile(s: Any, path: str) -> int:
        n = count(s, path)
        if path == "/p" and not created:
            t = threading.Thread(target=lambda: created.append(api.create_job("/p")))
            t.start()
            t.join(1.5)  # committed by then, unless CreatePool's locks hold it up (it then goes on after)
        return n

    monkeypatch.setattr(repo, "unfinished_jobs_in", create_meanwhile)
    made = api.create_pool_or_error("/p/c")
    monkeypatch.setattr(repo, "unfinished_jobs_in", count)
    _wait(lambda: created)
    if made is None:
        assert _refused_as_no_leaf(created[0], "/p"), created
    else:
        assert isinstance(created[0], str), (made, created)
        assert made.code() == grpc.StatusCode.FAILED_PRECONDITION and "unfinished job" in made.details(), made
    assert api.misplaced() == []


def test_creates_and_child_pools_at_once_never_leave_a_job_beside_a_child(api: Api) -> None:
    """Real concurrency, nothing held: a create and a CreatePool of a child of its pool started together."""
    for i in range(12):
        pool = f"/r{i}"
        api.create_pool(pool)
        barrier = threading.Barrier(2, timeout=10)
        out: dict[str, Any] = {}

        def create(pool: str = pool, barrier: threading.Barrier = barrier, out: dict[str, Any] = out) -> None:
            barrier.wait()
            out["create"] = api.create_job(pool)

        def child(pool: str = pool, barrier: threading.Barrier = barrier, out: dict[str, Any] = out) -> None:
            barrier.wait()
            out["child"] = api.create_pool_or_error(pool + "/c")

        threads = [threading.Thread(target=create), threading.Thread(target=child)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not (isinstance(out["create"], str) and out["child"] is None), (pool, out)
        assert api.misplaced() == [], (pool, out)


# --- the store's part: CreatePool's transaction (resmgr/service.py: create_pool) against a batch's ------------------
@pytest.fixture(params=["one statement", "one statement, committed as it runs", "a statement per table"])
def committed_as(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """How the job manager's writer commits a batch on PostgreSQL: its one statement in a transaction
    (bulk.write_batch), that statement as the whole transaction in autocommit (bulk.commit_batch, a raw transaction
    of a kept connection), or a statement per table (a big batch); SQLite always sends the latter."""
    if request.param == "a statement per table":
        monkeypatch.setattr(bulk, "fits_one_statement", lambda *a: False)
    return str(request.param)


def _commit(sessions: sessionmaker[Session], w: repo.Writes, how: str) -> None:
    if how != "one statement, committed as it runs":
        with db.transaction(sessions) as s:
            w.send(s, last=True)
        return
    kept = db.KeptConnection(sessions)
    try:
        with kept.raw_transaction() as tx:
            w.send(tx, last=True)
    finally:
        kept.close()


def _tree(sessions: sessionmaker[Session], *paths: str) -> None:
    with db.transaction(sessions) as s:
        repo.ensure_root_pool(s, 1.0)
        for path in paths:
            repo.create_pool(s, ResourcePool(path=path))


def _children(sessions: sessionmaker[Session]) -> dict[str, int]:
    """Each pool's count of children, as its own row holds it."""
    with db.transaction(sessions) as s:
        return {r[0]: r[1] for r in s.execute(text("SELECT path, children FROM resource_pools"))}


def test_a_batch_with_a_new_job_in_a_pool_with_children_is_refused_naming_respool(
        sessions: sessionmaker[Session], committed_as: str) -> None:
    _tree(sessions, "/team", "/p", "/p/c")
    w = repo.Writes()
    w.insert_job(*_new_job("a", "/team"))
    w.insert_job(*_new_job("b", "/p"))
    w.insert_job(*_new_job("c", "/"))  # the root takes jobs whatever its children
    with pytest.raises(InvalidArgument, match=r"^respool: one of the resource pools /p, /team has child pools") as e:
        _commit(sessions, w, committed_as)
    assert e.value.field == "respool"
    w = repo.Writes()
    w.insert_job(*_new_job("b", "/p"))
    with pytest.raises(InvalidArgument, match=r"^respool: /p has child pools .*; jobs go to a leaf pool"):
        _commit(sessions, w, committed_as)
    w = repo.Writes()
    w.insert_job(*_new_job("a", "/team"))
    w.insert_job(*_new_job("c", "/"))
    _commit(sessions, w, committed_as)
    with db.transaction(sessions) as s:
        assert set(repo.get_jobs(s, ["a", "b", "c"])) == {"a", "c"}


def test_a_big_jobs_first_chunk_into_a_pool_with_children_is_refused_naming_respool(
        sessions: sessionmaker[Session]) -> None:
    _tree(sessions, "/p", "/p/c")
    with pytest.raises(InvalidArgument, match=r"^respool: /p has child pools") as e, db.transaction(sessions) as s:
        repo.insert_job(s, *_new_job("a", "/p"))
    assert e.value.field == "respool"
    with db.transaction(sessions) as s:
        repo.insert_job(s, *_new_job("a", "/p/c"))
        repo.insert_job(s, *_new_job("b", "/"))


def test_a_batch_waits_for_create_pool_holding_its_pool_then_is_refused(
        sessions: sessionmaker[Session], committed_as: str) -> None:
    """Two connections: CreatePool's transaction has locked the parent, counted its jobs (none) and inserted the
    child, not committed yet; the batch with a job in the parent, on the other, waits for it (PostgreSQL: the
    parent's row; SQLite: the writer lock), then finds the parent a leaf no more. On PostgreSQL the child's row is
    not in the snapshot of the batch's statement, begun before it was committed: only the parent's own row, read
    again once its lock is free, can say so."""
    _tree(sessions, "/p")
    holding, release = threading.Event(), threading.Event()
    outcome: list[BaseException | None] = []

    def create_child() -> None:
        with db.transaction(sessions) as s:
            service.create_pool(s, ResourcePool(path="/p/c"), None)
            holding.set()
            release.wait(30)

    creator = threading.Thread(target=create_child)
    creator.start()
    try:
        assert holding.wait(30)
        w = repo.Writes()
        w.insert_job(*_new_job("a", "/p"))

        def commit() -> None:
            try:
                _commit(sessions, w, committed_as)
                outcome.append(None)
            except BaseException as e:  # noqa: BLE001 - the test looks at it
                outcome.append(e)

        batch = threading.Thread(target=commit)
        batch.start()
        batch.join(0.5)
        assert batch.is_alive() and outcome == [], outcome  # held up by CreatePool's transaction
    finally:
        release.set()
        creator.join(30)
    batch.join(30)
    assert len(outcome) == 1 and isinstance(outcome[0], InvalidArgument), outcome
    assert str(outcome[0]).startswith("respool: /p has child pools") and outcome[0].field == "respool"
    with db.transaction(sessions) as s:
        assert repo.get_jobs(s, ["a"]) == {}
        assert [p.path for p in repo.list_pools(s)] == ["/", "/p", "/p/c"]


@pytest.mark.usefixtures("sent_as")
def test_create_pool_waits_for_the_uncommitted_batch_that_checked_its_parent_then_counts_its_job(
        sessions: sessionmaker[Session]) -> None:
    """Two connections: the batch's transaction has checked the pool and inserted its job, not committed yet;
    CreatePool of a child of that pool, on the other, waits for it (PostgreSQL: the pool's row; SQLite: the writer
    lock), then counts the job and is refused."""
    _tree(sessions, "/p")
    w = repo.Writes()
    w.insert_job(*_new_job("a", "/p"))
    outcome: list[BaseException | None] = []
    with db.transaction(sessions) as s:
        w.send(s)

        def create_child() -> None:
            try:
                with db.transaction(sessions) as d:
                    service.create_pool(d, ResourcePool(path="/p/c"), None)
                outcome.append(None)
            except BaseException as e:  # noqa: BLE001 - the test looks at it
                outcome.append(e)

        t = threading.Thread(target=create_child)
        t.start()
        t.join(0.5)
        assert t.is_alive() and outcome == [], outcome  # held up by the batch's transaction
    t.join(30)
    assert len(outcome) == 1 and isinstance(outcome[0], FailedPrecondition), outcome
    assert "/p has 1 unfinished job(s)" in str(outcome[0])
    with db.transaction(sessions) as s:
        assert [p.path for p in repo.list_pools(s)] == ["/", "/p"]
    assert _children(sessions) == {"/": 1, "/p": 0}


def test_a_pools_row_counts_its_children_through_creates_and_deletes(sessions: sessionmaker[Session]) -> None:
    _tree(sessions, "/a", "/a/x", "/a/y", "/b")
    assert _children(sessions) == {"/": 2, "/a": 2, "/a/x": 0, "/a/y": 0, "/b": 0}
    with db.transaction(sessions) as s:
        repo.lock_pool_tree(s)
        repo.delete_pool(s, "/a/x")
    with pytest.raises(FailedPrecondition), db.transaction(sessions) as s:  # refused: nothing changes
        repo.delete_pool(s, "/a")
    assert _children(sessions) == {"/": 2, "/a": 1, "/a/y": 0, "/b": 0}
    with db.transaction(sessions) as s:
        repo.delete_pool(s, "/a/y")
        repo.delete_pool(s, "/a")
    assert _children(sessions) == {"/": 1, "/b": 0}
    w = repo.Writes()
    w.insert_job(*_new_job("j", "/b"))
    with db.transaction(sessions) as s:
        w.send(s, last=True)


def test_a_create_into_the_root_sends_no_pool_check(
        sessions: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch) -> None:
    """The root is never deleted and takes jobs whatever its children: its creates' statement is the batch's as it
    was before any pool check (PostgreSQL; SQLite sends no one statement)."""
    _tree(sessions, "/team")
    sent: list[str] = []
    text_of = bulk.batch_sql

    def seen(*a: Any, **k: Any) -> tuple[str, list[Any]]:
        sql, params = text_of(*a, **k)
        sent.append(sql)
        return sql, params

    monkeypatch.setattr(bulk, "batch_sql", seen)
    w = repo.Writes()
    w.insert_job(*_new_job("r", "/"))
    with db.transaction(sessions) as s:
        w.send(s, last=True)
        postgres = s.get_bind().dialect.name == "postgresql"
    assert len(sent) == (1 if postgres else 0)
    assert all("resource_pools" not in sql for sql in sent)
