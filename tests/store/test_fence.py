"""Leadership in the store: epochs that refuse a replaced leader's writes (both stores), and the lease that lets a
standby end a leader that went silent with its connections still open (PostgreSQL: a SQLite store is one file
that one process at a time may use, held by a flock that dies with it)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool

from peloton.leadership.fence import EPOCH_KEY, Fence, Fenced, take_epochs
from peloton.leadership.lock import HEARTBEAT_KEY, PostgresLock, role_leaders, standbys
from peloton.leadership.owner import Owner
from peloton.store import db, repo
from tests.dbutil import postgres_database


def take_epoch(sessions: sessionmaker[Session]) -> int:
    """The job manager's next epoch (take_epochs of the job manager alone)."""
    return take_epochs(sessions)[EPOCH_KEY]


def current_epoch(sessions: sessionmaker[Session]) -> int:
    with db.transaction(sessions) as s:
        return int(repo.get_meta(s, EPOCH_KEY) or 0)


@pytest.fixture
def two(db_url: str) -> Iterator[tuple[sessionmaker[Session], sessionmaker[Session]]]:
    """The write sessions of two daemons on one store (each its own engine, as two processes would have)."""
    db.upgrade(db_url)
    engines = [db.make_engine(db_url), db.make_engine(db_url)]
    try:
        yield db.make_sessions(engines[0]), db.make_sessions(engines[1])
    finally:
        for e in engines:
            e.dispose()


def _write(sessions: sessionmaker[Session], key: str) -> None:
    with db.transaction(sessions) as s:
        repo.set_meta(s, key, "x")


def _has(sessions: sessionmaker[Session], key: str) -> bool:
    with db.transaction(sessions) as s:
        return repo.get_meta(s, key) is not None


def test_a_replaced_leader_cannot_commit_and_is_told_once(
        two: tuple[sessionmaker[Session], sessionmaker[Session]]) -> None:
    a, b = two
    told: list[str] = []
    fa = Fence(take_epoch(a), told.append)
    fa.install(a)
    _write(a, "by-a")  # it leads: its commits land
    fb = Fence(take_epoch(b))
    fb.install(b)
    assert (fa.epoch, fb.epoch) == (1, 2) and current_epoch(b) == 2
    for key in ("late-1", "late-2"):
        with pytest.raises(Fenced, match=r"no longer the store's leader \(its epoch 1, the store's 2\)"):
            _write(a, key)
        assert not _has(b, key)  # rolled back: nothing of it landed
    assert len(told) == 1 and "another daemon took over" in told[0]
    _write(b, "by-b")
    # the first one takes the lock back later: it leads again with a newer epoch, and the other is refused
    fa.take(take_epoch(a))
    _write(a, "by-a-again")
    with pytest.raises(Fenced):
        _write(b, "by-b-late")
    assert _has(a, "by-a") and _has(a, "by-b") and _has(a, "by-a-again") and not _has(a, "by-b-late")


def test_taking_the_epoch_waits_for_a_transaction_that_checked_the_old_one(
        two: tuple[sessionmaker[Session], sessionmaker[Session]]) -> None:
    """No transaction that read the old epoch commits after the new one is taken: taking it waits for them
    (PostgreSQL: FOR UPDATE against FOR KEY SHARE; SQLite: writers are serialized by BEGIN IMMEDIATE)."""
    a, b = two
    fa = Fence(take_epoch(a))
    fa.install(a)
    s = a()
    repo.set_meta(s, "in-flight", "x")
    s.flush()
    s.execute(text("SELECT 1"))
    fa._check(s)  # what its commit does first: it is at epoch 1, and holds that row
    taken: list[int] = []
    t = threading.Thread(target=lambda: taken.append(take_epoch(b)))
    t.start()
    t.join(0.7)
    assert t.is_alive() and not taken, "the new epoch was taken while a transaction that checked the old one was open"
    s.commit()  # lands: it was checked before the new epoch existed
    s.close()
    t.join(30)
    assert taken == [2]
    assert _has(b, "in-flight")
    with pytest.raises(Fenced):
        _write(a, "after")


# --- the lease (PostgreSQL) ---------------------------------------------------------------------------------------


@pytest.fixture
def pg() -> Iterator[str]:
    with postgres_database() as url:
        db.upgrade(url)
        yield url


def _owner(session: str, lease: float) -> Owner:
    return Owner("node", 1, f"{session}:5391", time.time(), session, lease)


def _connections(url: str, app: str) -> int:
    eng = create_engine(url, poolclass=NullPool)
    try:
        with eng.connect() as c:
            return int(c.execute(text("SELECT count(*) FROM pg_stat_activity WHERE application_name = :a"),
                                 {"a": app}).scalar() or 0)
    finally:
        eng.dispose()


def test_a_renewing_holder_keeps_the_lock_and_a_silent_one_is_ended(pg: str) -> None:
    holder, standby = PostgresLock(pg, "peloton-holder"), PostgresLock(pg, "peloton-standby1")
    work: Engine = db.make_engine(pg, "peloton-holder")  # the holder's pooled connections
    try:
        assert holder.try_acquire(_owner("peloton-holder", 3.0))
        assert holder.fresh()
        s = db.make_sessions(work)()
        repo.set_meta(s, "in-flight", "x")  # a transaction the holder has open (and would commit later)
        s.flush()
        # renewing every half second: the standby never gets it, however long it tries
        deadline = time.monotonic() + 4.0
        while time.monotonic() < deadline:
            assert holder.held()
            assert not standby.try_acquire(_owner("peloton-standby1", 3.0))
            time.sleep(0.5)
        assert _connections(pg, "peloton-holder") == 2
        # silent (paused, cut off): it stops trusting itself after half the lease, the standby ends it after it
        time.sleep(1.6)
        assert not holder.fresh()
        got = False
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:
            got = standby.try_acquire(_owner("peloton-standby1", 3.0))
            time.sleep(0.1)
        assert got and standby.fresh()
        assert _connections(pg, "peloton-holder") == 0  # its lock connection and its pool's
        with pytest.raises(Exception):  # noqa: B017 - its connection was ended: the open transaction is gone
            s.commit()
        s.close()
        assert not holder.held() and not holder.fresh()
        holder_view = standby.holder()
        assert holder_view is not None and holder_view.session == "peloton-standby1"
    finally:
        work.dispose()
        holder.release()
        standby.release()


def test_standbys_are_listed_by_their_address(pg: str) -> None:
    holder, waiting = PostgresLock(pg, "peloton-h"), PostgresLock(pg, "peloton-w")
    try:
        assert holder.try_acquire(_owner("peloton-h", 6.0))
        assert not waiting.try_acquire(_owner("peloton-w", 6.0))
        waiting.announce_standby("node-b:5391")
        eng = create_engine(pg, poolclass=NullPool)
        with eng.connect() as c:
            assert [(a, roles) for a, _, roles in standbys(c)] == [("node-b:5391", ("jobmgr",))]
            beat = c.execute(text("SELECT value FROM meta WHERE key = :k"), {"k": HEARTBEAT_KEY}).scalar()
            assert beat is not None and abs(float(beat) - time.time()) < 60
        holder.release()
        assert waiting.try_acquire(_owner("peloton-w", 6.0))  # it leads now: no longer listed as a standby
        with eng.connect() as c:
            assert standbys(c) == []
        eng.dispose()
    finally:
        holder.release()
        waiting.release()


def test_each_role_has_a_lock_of_its_own_taken_all_or_none(pg: str) -> None:
    """A split deployment: the job manager's process and a hostmgr process lead at once (their roles' locks); a
    second hostmgr process waits; a process that runs a role another leads takes none of its locks."""
    jm = PostgresLock(pg, "peloton-jm", ("jobmgr", "resmgr", "placement"))
    hm, hm2 = PostgresLock(pg, "peloton-hm", ("hostmgr",)), PostgresLock(pg, "peloton-hm2", ("hostmgr",))
    greedy = PostgresLock(pg, "peloton-greedy", ("hostmgr", "placement"))
    alone = PostgresLock(pg, "peloton-pl", ("placement",))
    eng = create_engine(pg, poolclass=NullPool)
    try:
        assert jm.try_acquire(_owner("peloton-jm", 6.0)) and hm.try_acquire(_owner("peloton-hm", 6.0))
        assert not hm2.try_acquire(_owner("peloton-hm2", 6.0))
        hm2.announce_standby("node-c:5391")
        holder = hm2.holder()  # the holder of the role it waits for
        assert holder is not None and holder.session == "peloton-hm"
        jm.release()
        # placement is free now, hostmgr is not: the greedy process takes neither (a process leads all or none)
        assert not greedy.try_acquire(_owner("peloton-greedy", 6.0))
        assert alone.try_acquire(_owner("peloton-pl", 6.0))
        with eng.connect() as c:
            leaders = {role: o.session for role, o, silent in role_leaders(c) if silent < 60}
            assert leaders["hostmgr"] == "peloton-hm" and leaders["placement"] == "peloton-pl"
            assert [(a, roles) for a, _, roles in standbys(c)] == [("node-c:5391", ("hostmgr",))]
        hm.release()
        assert hm2.try_acquire(_owner("peloton-hm2", 6.0)) and hm2.held()
    finally:
        eng.dispose()
        for lock in (jm, hm, hm2, greedy, alone):
            lock.release()


def test_a_lock_taken_before_the_tables_exist_records_its_holder_once_they_do() -> None:
    """A process without a store of its own (placement) may lead before the job manager's process has migrated
    an empty database: it keeps its lease and says who leads once the tables are there."""
    with postgres_database() as url:
        lock = PostgresLock(url, "peloton-early", ("placement",))
        eng = create_engine(url, poolclass=NullPool)
        try:
            assert lock.try_acquire(_owner("peloton-early", 6.0))
            assert lock.held() and lock.fresh()  # no tables: still held
            db.upgrade(url)
            assert lock.held()
            with eng.connect() as c:
                assert [(r, o.session) for r, o, _ in role_leaders(c)] == [("placement", "peloton-early")]
        finally:
            eng.dispose()
            lock.release()


def test_each_role_is_fenced_by_its_own_epoch(two: tuple[sessionmaker[Session], sessionmaker[Session]]) -> None:
    """A resmgr process replaced by its standby has its late writes refused; the job manager's epoch, and the
    commits of the process that leads it, are not touched."""
    a, b = two
    fa = Fence(take_epochs(a, ("resmgr",)))
    fa.install(a)
    jobs = Fence(take_epoch(b))  # the job manager's process, apart
    _write(a, "by-resmgr")
    fb = Fence(take_epochs(b, ("resmgr",)))  # the standby resmgr took over
    assert fb.epoch == 2 and jobs.epoch == 1 and current_epoch(b) == 1
    with pytest.raises(Fenced, match=r"no longer the resmgr leader \(its epoch 1, the store's 2\)"):
        _write(a, "late")
    assert not _has(b, "late")
    # a process that leads several roles checks them all in each commit
    both = Fence(take_epochs(a, ("jobmgr", "resmgr")))
    assert both.epochs == {"daemon.epoch": 2, "daemon.epoch.resmgr": 3} and both.epoch == 2


def test_a_replaced_leader_cannot_commit_a_raw_transaction(two: tuple[sessionmaker[Session], sessionmaker[Session]]) -> None:
    """The job manager writer's transactions without a Session (db.KeptConnection.raw_transaction) are fenced too:
    by the epochs read in its one statement on PostgreSQL (bulk.write_batch), else by the check before the commit."""
    from peloton.store import bulk
    from peloton.store.models import MetaRow

    a, b = two
    Fence(take_epoch(a)).install(a)
    kept = db.KeptConnection(a)
    try:
        with kept.raw_transaction() as tx:
            bulk.insert_rows(tx, MetaRow.__table__, ("key", "value"), [("by-a", "x")])  # type: ignore[arg-type]
        Fence(take_epoch(b)).install(b)
        with pytest.raises(Fenced), kept.raw_transaction() as tx:  # checked at the commit
            bulk.insert_rows(tx, MetaRow.__table__, ("key", "value"), [("late", "x")])  # type: ignore[arg-type]
        if tx.get_bind().dialect.name == "postgresql":  # the writer's one statement there reads the epochs itself
            with pytest.raises(Fenced), kept.raw_transaction() as tx:
                ins = bulk.Insert(MetaRow.__table__, ("key", "value"))  # type: ignore[arg-type]
                ins.rows.append(("late", "x"))
                bulk.write_batch(tx, [ins], [])
            with pytest.raises(Fenced), kept.raw_transaction() as tx:  # ... and when it is the whole transaction
                bulk.commit_batch(tx, [ins], [])
    finally:
        kept.close()
    assert _has(b, "by-a") and not _has(b, "late")
