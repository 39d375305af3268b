"""KeptConnection (store/db.py): the job manager writers' transactions on one connection kept across commits, on
SQLite and PostgreSQL: one pool checkout for many commits, a failed transaction rolled back, a connection that
may be broken (an outage in a transaction, a backend terminated between two) replaced rather than reused."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from typing import Any

import psycopg2
import pytest
import sqlalchemy
from sqlalchemy import Engine, event, text
from sqlalchemy.orm import Session, sessionmaker

from peloton.store import db, repo
from peloton.store.db import KeptConnection, StoreUnavailable


class Pool:
    """What the engine's pool did: checkouts, and DB-API connections opened (a replaced one is a new one)."""

    def __init__(self) -> None:
        self.checkouts = 0
        self.opened = 0


@pytest.fixture
def pool(engine: Engine) -> Iterator[Pool]:
    out = Pool()

    def on_checkout(*_: Any) -> None:
        out.checkouts += 1

    def on_connect(*_: Any) -> None:
        out.opened += 1

    event.listen(engine, "checkout", on_checkout)
    event.listen(engine, "connect", on_connect)
    yield out
    event.remove(engine, "checkout", on_checkout)
    event.remove(engine, "connect", on_connect)


def _meta(sessions: sessionmaker[Session], key: str) -> str | None:
    with db.transaction(sessions) as s:
        return repo.get_meta(s, key)


def _raw_meta(tx: db.RawTransaction, key: str, value: str) -> None:
    """What the writer's raw transactions send: bulk statements on the DB-API cursor."""
    from peloton.store import bulk
    from peloton.store.models import MetaRow

    bulk.insert_rows(tx, MetaRow.__table__, ("key", "value"), [(key, value)])  # type: ignore[arg-type]


def _outage(db_url: str) -> BaseException:
    """What the driver raises when the store goes away in a statement."""
    if db_url.startswith("postgresql"):
        return psycopg2.OperationalError("server closed the connection unexpectedly")
    return sqlite3.OperationalError("disk I/O error")


def _backend_pid(s: Session) -> int:
    return int(s.execute(text("SELECT pg_backend_pid()")).scalar_one())


def _terminate(db_url: str, pid: int) -> None:
    """End PostgreSQL backend `pid` as an administrator would, and wait until it is gone."""
    admin = sqlalchemy.create_engine(db_url, isolation_level="AUTOCOMMIT")  # pg_stat_activity: fresh per statement
    try:
        with admin.connect() as c:
            c.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid})
            for _ in range(500):
                if not c.execute(text("SELECT 1 FROM pg_stat_activity WHERE pid = :p"), {"p": pid}).first():
                    break
                time.sleep(0.01)
            else:
                raise AssertionError(f"backend {pid} still there")
    finally:
        admin.dispose()


def test_transactions_commit_on_one_connection(sessions: sessionmaker[Session], pool: Pool) -> None:
    kept = KeptConnection(sessions)
    try:
        for i in range(5):
            with kept.transaction() as s:
                repo.set_meta(s, f"k{i}", str(i))
        assert pool.checkouts == 1  # one checkout for all five
    finally:
        kept.close()
    assert [_meta(sessions, f"k{i}") for i in range(5)] == ["0", "1", "2", "3", "4"]  # each one committed


def test_each_transaction_has_a_session_of_its_own(sessions: sessionmaker[Session]) -> None:
    """Nothing loaded in one transaction is served, stale, to the next (no identity map carried over)."""
    kept = KeptConnection(sessions)
    try:
        with kept.transaction() as s:
            repo.set_meta(s, "k", "1")
            first = s
        with db.transaction(sessions) as other:
            repo.set_meta(other, "k", "2")
        with kept.transaction() as s:
            assert s is not first
            assert repo.get_meta(s, "k") == "2"
    finally:
        kept.close()


def test_a_failed_transaction_is_rolled_back_and_the_connection_kept(sessions: sessionmaker[Session],
                                                                     pool: Pool) -> None:
    kept = KeptConnection(sessions)
    try:
        with pytest.raises(ValueError), kept.transaction() as s:
            repo.set_meta(s, "k", "lost")
            raise ValueError("a bug in a mutation")
        with kept.transaction() as s:
            assert repo.get_meta(s, "k") is None  # rolled back
            repo.set_meta(s, "k", "kept")
        with pytest.raises(ValueError), kept.raw_transaction() as tx:  # the same without a Session
            _raw_meta(tx, "raw", "lost")
            raise ValueError("a bug in a mutation")
        with kept.raw_transaction() as tx:
            _raw_meta(tx, "raw", "kept")
        assert pool.checkouts == 1  # rolled back cleanly: the connection was kept
    finally:
        kept.close()
    assert (_meta(sessions, "k"), _meta(sessions, "raw")) == ("kept", "kept")


def test_an_outage_in_a_transaction_replaces_the_connection(sessions: sessionmaker[Session], db_url: str,
                                                           pool: Pool) -> None:
    kept = KeptConnection(sessions)
    try:
        with kept.transaction() as s:
            repo.set_meta(s, "a", "1")
        with pytest.raises(StoreUnavailable), kept.transaction() as s:
            repo.set_meta(s, "b", "lost")
            raise _outage(db_url)
        opened = pool.opened
        with kept.transaction() as s:
            repo.set_meta(s, "c", "3")
        assert pool.checkouts == 2 and pool.opened == opened + 1  # a new connection, not the suspect one
    finally:
        kept.close()
    assert (_meta(sessions, "a"), _meta(sessions, "b"), _meta(sessions, "c")) == ("1", None, "3")


def test_an_outage_seen_by_one_writer_replaces_the_others_connections(sessions: sessionmaker[Session], db_url: str,
                                                                    pool: Pool) -> None:
    one, two = KeptConnection(sessions), KeptConnection(sessions)
    try:
        with two.transaction() as s:
            repo.set_meta(s, "two", "1")
        with pytest.raises(StoreUnavailable), one.transaction():
            raise _outage(db_url)
        checkouts, opened = pool.checkouts, pool.opened
        with two.transaction() as s:
            repo.set_meta(s, "two", "2")
        assert (pool.checkouts, pool.opened) == (checkouts + 1, opened + 1)  # its connection replaced
        with two.transaction() as s:  # and kept again from there
            repo.set_meta(s, "two", "3")
        assert pool.checkouts == checkouts + 1
    finally:
        one.close()
        two.close()
    assert _meta(sessions, "two") == "3"


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)  # SQLite has no server to end a connection (its outage: the tests above)
def test_a_backend_terminated_between_transactions_is_replaced_before_use(sessions: sessionmaker[Session],
                                                                          db_url: str,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """PostgreSQL: a standby taking over ends the old leader's backends, an administrator may end one, a restart
    ends them all; the next transaction runs on a new connection instead of failing on the dead one, however
    recently it was used (what the server sent before closing it is noticed, not its idle time)."""
    monkeypatch.setattr(db, "IDLE_PING_S", 3600.0)
    kept = KeptConnection(sessions)
    try:
        with kept.transaction() as s:
            repo.set_meta(s, "a", "1")
            pid = _backend_pid(s)
        _terminate(db_url, pid)
        with kept.transaction() as s:  # no StoreUnavailable: the dead connection is noticed before use
            repo.set_meta(s, "b", "2")
            assert _backend_pid(s) != pid
    finally:
        kept.close()
    assert _meta(sessions, "b") == "2"


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)  # SQLite has no server to end a connection (its outage: the tests above)
def test_a_backend_terminated_in_a_transaction_is_an_outage_and_the_next_one_commits(
        sessions: sessionmaker[Session], db_url: str) -> None:
    from peloton.store import bulk
    from peloton.store.models import MetaRow

    kept = KeptConnection(sessions)
    try:
        with pytest.raises(StoreUnavailable), kept.transaction() as s:
            _terminate(db_url, _backend_pid(s))
            bulk.insert_rows(s, MetaRow.__table__, ("key", "value"), [("k", "lost")])  # type: ignore[arg-type]
        with kept.transaction() as s:
            repo.set_meta(s, "k", "v")
    finally:
        kept.close()
    assert _meta(sessions, "k") == "v"


def test_a_store_that_cannot_be_reached_is_unavailable(sessions: sessionmaker[Session],
                                                       monkeypatch: pytest.MonkeyPatch, db_url: str) -> None:
    kept = KeptConnection(sessions)
    engine = sessions.kw["bind"]

    def refused() -> Any:
        raise sqlalchemy.exc.OperationalError("connect", {}, _outage(db_url))

    monkeypatch.setattr(engine, "connect", refused)
    with pytest.raises(StoreUnavailable), kept.transaction():
        pass
    monkeypatch.undo()
    with kept.transaction() as s:  # reachable again
        repo.set_meta(s, "k", "v")
    kept.close()
    assert _meta(sessions, "k") == "v"


def test_raw_transactions_commit_on_the_kept_connection_between_session_ones(sessions: sessionmaker[Session],
                                                                            pool: Pool) -> None:
    kept = KeptConnection(sessions)
    try:
        with kept.raw_transaction() as tx:
            _raw_meta(tx, "a", "1")
        with kept.transaction() as s:  # a Session's transaction on the same connection after it
            assert repo.get_meta(s, "a") == "1"
            repo.set_meta(s, "b", "2")
        with kept.raw_transaction() as tx:
            _raw_meta(tx, "c", "3")
        assert pool.checkouts == 1
    finally:
        kept.close()
    assert (_meta(sessions, "a"), _meta(sessions, "b"), _meta(sessions, "c")) == ("1", "2", "3")


def test_an_outage_in_a_raw_transaction_replaces_the_connection(sessions: sessionmaker[Session], db_url: str,
                                                               pool: Pool) -> None:
    kept = KeptConnection(sessions)
    try:
        with pytest.raises(StoreUnavailable), kept.raw_transaction() as tx:
            _raw_meta(tx, "a", "lost")
            raise _outage(db_url)
        opened = pool.opened
        with kept.raw_transaction() as tx:
            _raw_meta(tx, "b", "2")
        assert pool.opened == opened + 1  # a new connection, not the suspect one
    finally:
        kept.close()
    assert (_meta(sessions, "a"), _meta(sessions, "b")) == (None, "2")


def test_a_raw_transaction_runs_the_sessions_commit_check_unless_its_writes_made_it(
        sessions: sessionmaker[Session]) -> None:
    """The fence's check (leadership/fence.py) before a raw commit, as before a Session's: a check that refuses
    rolls the transaction back; one the writes already made (bulk.write_batch) is not run again."""
    from peloton.store import bulk

    class Check:
        def __init__(self) -> None:
            self.calls = 0
            self.refuse = False

        def check_raw(self, tx: bulk.Tx) -> None:
            self.calls += 1
            if self.refuse:
                raise RuntimeError("refused")

    check = Check()
    sessions.kw["info"] = {**sessions.kw.get("info", {}), db.COMMIT_CHECK: check}
    kept = KeptConnection(sessions)
    try:
        with kept.raw_transaction() as tx:
            _raw_meta(tx, "a", "1")
        assert check.calls == 1
        with kept.raw_transaction() as tx:
            _raw_meta(tx, "b", "2")
            tx.info[db.COMMIT_CHECKED] = True
        assert check.calls == 1
        check.refuse = True
        with pytest.raises(RuntimeError, match="refused"), kept.raw_transaction() as tx:
            _raw_meta(tx, "c", "lost")
    finally:
        kept.close()
    assert (_meta(sessions, "a"), _meta(sessions, "b"), _meta(sessions, "c")) == ("1", "2", None)


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)  # bulk.commit_batch is PostgreSQL's
def test_a_raw_transactions_one_statement_commits_it_and_nothing_may_follow(sessions: sessionmaker[Session]) -> None:
    """bulk.commit_batch: the statement is the whole transaction, committed by the server as it ends (no BEGIN or
    COMMIT of its own); an update that finds fewer rows than it has fails it, and nothing of it lands."""
    from peloton.store import bulk
    from peloton.store.models import MetaRow

    table: Any = MetaRow.__table__
    kept = KeptConnection(sessions)
    try:
        with kept.raw_transaction() as tx:
            ins = bulk.Insert(table, ("key", "value"))
            ins.rows.append(("a", "1"))
            bulk.commit_batch(tx, [ins], [])
            assert _meta(sessions, "a") == "1"  # committed before the block ends
            with pytest.raises(RuntimeError, match="nothing may follow"):
                _raw_meta(tx, "b", "lost")
        with pytest.raises(bulk.Missing) as e, kept.raw_transaction() as tx:
            ins = bulk.Insert(table, ("key", "value"))
            ins.rows.append(("c", "lost"))
            bulk.commit_batch(tx, [ins], [bulk.Update(table, ("key",), ("value",), [("a", "2"), ("nope", "2")])])
        assert (e.value.index, e.value.found) == (0, 1)
    finally:
        kept.close()
    assert (_meta(sessions, "a"), _meta(sessions, "b"), _meta(sessions, "c")) == ("1", None, None)


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_a_batch_shape_is_prepared_once_per_connection_and_one_that_cannot_be_goes_as_text(
        sessions: sessionmaker[Session]) -> None:
    from peloton.store import bulk
    from peloton.store.models import MetaRow

    table: Any = MetaRow.__table__
    kept = KeptConnection(sessions)
    try:
        for key in ("a", "b", "c"):
            with kept.raw_transaction() as tx:
                ins = bulk.Insert(table, ("key", "value"))
                ins.rows.append((key, "1"))
                bulk.commit_batch(tx, [ins], [])
        with kept.transaction() as s:
            prepared = s.execute(text("SELECT count(*), sum(generic_plans + custom_plans) FROM pg_prepared_statements"
                                      " WHERE name LIKE 'peloton_batch_%'")).one()
            assert tuple(prepared) == (1, 3)  # one shape, prepared once, executed three times
            cur = bulk.cursor(s)[0]
        cur.connection.autocommit = True
        assert bulk._prepared(cur, "SELECT %s + %s") is None  # noqa: SLF001 - the types cannot be inferred
        assert bulk._PREPARED[cur.connection]["SELECT %s + %s"] is None  # noqa: SLF001 - remembered: not tried again
        cur.connection.autocommit = False
    finally:
        kept.close()
    assert [_meta(sessions, k) for k in ("a", "b", "c")] == ["1", "1", "1"]


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_a_prepared_batch_the_server_session_does_not_know_goes_as_text(sessions: sessionmaker[Session]) -> None:
    """Behind a pooler in transaction mode (PgBouncer) the next transaction may reach a server session that never
    prepared the statement: the batch still commits, as text, and the connection prepares nothing more."""
    from peloton.store import bulk
    from peloton.store.models import MetaRow

    table: Any = MetaRow.__table__
    kept = KeptConnection(sessions)

    def commit(key: str) -> None:
        with kept.raw_transaction() as tx:
            ins = bulk.Insert(table, ("key", "value"))
            ins.rows.append((key, "1"))
            bulk.commit_batch(tx, [ins], [])

    try:
        commit("a")
        with kept.transaction() as s:
            s.execute(text("DEALLOCATE ALL"))  # what another server session looks like: nothing prepared
        commit("b")
        commit("c")
        with kept.transaction() as s:
            assert s.execute(text("SELECT count(*) FROM pg_prepared_statements")).scalar() == 0
    finally:
        kept.close()
    assert [_meta(sessions, k) for k in ("a", "b", "c")] == ["1", "1", "1"]


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_a_writers_connection_plans_by_key_on_a_table_never_analyzed_and_goes_back_to_the_pool_reset(
        sessions: sessionmaker[Session], pool: Pool) -> None:
    """A kept connection plans without sequential scans (db.WRITER_PG_SETTINGS). The writer's batch statement, once
    prepared and planned generically (as a kept connection's bulk.commit_batch always is), updates a gang's tasks by
    a key lookup each even on a table whose statistics were never gathered, where another connection's plan joins
    them to a scan of the whole table, a plan kept for the connection's life as the table grows. Back in the pool,
    the connection plans as any other."""
    from peloton.store import bulk

    with db.transaction(sessions) as s:  # 2,400 tasks the planner knows nothing of (no ANALYZE, no autovacuum yet)
        s.execute(text("INSERT INTO jobs (id, name, owner, respool, spec, state, desired, reason, priority, "
                       "created_at, updated_at, completed_at) SELECT 'j' || i, 'j', '', '/', '{}', 'RUNNING', "
                       "'RUNNING', '', 0, 1, 1, 0 FROM generate_series(0, 299) AS i"))
        s.execute(text("INSERT INTO tasks (job_id, instance, gang_index, attempt, state, host, address, ports, "
                       "gpu_ids, exit_code, reason, message, started_at, finished_at, updated_at) "
                       "SELECT 'j' || (i / 8), i % 8, 0, 1, 'RUNNING', '', '', '[]', '[]', NULL, '', '', 0, 0, 0 "
                       "FROM generate_series(0, 2399) AS i"))
    gang = bulk.Update(repo._TASKS, ("job_id", "instance"), repo._TASK_COLS,
                       [("j1", i, 1, "SUCCEEDED", "h", "", "[]", "[]", 0, "", "", 0.0, 1.0, 1.0) for i in range(8)])
    sql, params = bulk.batch_sql([], [gang], None)
    parts = sql.split("%s")
    numbered = parts[0] + "".join(f"${n}{part}" for n, part in enumerate(parts[1:], 1))

    def plan(s: Session) -> str:
        cur = s.connection().connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        try:
            cur.execute("SET LOCAL plan_cache_mode = force_generic_plan")
            cur.execute(f"PREPARE probe AS {numbered}")
            cur.execute("EXPLAIN EXECUTE probe(" + ", ".join(["%s"] * len(params)) + ")", params)
            return "\n".join(str(r[0]) for r in cur.fetchall())
        finally:
            cur.execute("DEALLOCATE probe")
            cur.close()

    with db.transaction(sessions) as s:
        assert "Seq Scan on tasks" in plan(s), plan(s)  # what the writers would otherwise run
    kept = KeptConnection(sessions)
    try:
        with kept.transaction() as s:
            assert s.execute(text("SHOW enable_seqscan")).scalar_one() == "off"
            shown = plan(s)
            assert "Seq Scan on tasks" not in shown and "Index Scan using pk_tasks" in shown, shown
    finally:
        kept.close()
    opened = pool.opened
    with db.transaction(sessions) as s:  # a connection of the pool, the kept one among them: reset
        assert s.execute(text("SHOW enable_seqscan")).scalar_one() == "on"
        assert "Seq Scan on tasks" in plan(s), plan(s)
    assert pool.opened == opened  # (no new one)


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_a_writers_prepared_batch_is_planned_once_and_the_setting_goes_back_to_the_pool_reset(
        sessions: sessionmaker[Session], pool: Pool) -> None:
    """A kept connection keeps a prepared batch's generic plan (db.WRITER_PG_SETTINGS). Planned for unknown
    parameters, `unnest` counts 100 rows an array, so for a gang's step (its job, gang and 8 tasks updated, an event
    inserted) PostgreSQL's own choice (`plan_cache_mode = auto`) finds the generic plan dearer than a custom one for
    the arrays at hand and plans every execution anew."""
    from peloton.store import bulk

    with db.transaction(sessions) as s:
        s.execute(text("INSERT INTO jobs (id, name, owner, respool, spec, state, desired, reason, priority, "
                       "created_at, updated_at, completed_at) VALUES ('j', 'j', '', '/', '{}', 'RUNNING', "
                       "'RUNNING', '', 0, 1, 1, 0)"))
        s.execute(text("INSERT INTO tasks (job_id, instance, gang_index, attempt, state, host, address, ports, "
                       "gpu_ids, exit_code, reason, message, started_at, finished_at, updated_at) "
                       "SELECT 'j', i, 0, 1, 'RUNNING', '', '', '[]', '[]', NULL, '', '', 0, 0, 0 "
                       "FROM generate_series(0, 7) AS i"))
        s.execute(text("INSERT INTO gangs (job_id, idx, instances, state, attempt, reason, launch_deadline, "
                       "updated_at) VALUES ('j', 0, '[0,1,2,3,4,5,6,7]', 'RUNNING', 1, '', 0, 0)"))
    kept = KeptConnection(sessions)
    try:
        for n in range(10):  # PostgreSQL weighs the generic plan from the sixth execution on
            step = [bulk.Update(repo._JOBS, ("id",), repo._JOB_COLS, [("j", "RUNNING", "RUNNING", "", n, 0.0)]),
                    bulk.Update(repo._GANGS, ("job_id", "idx"), repo._GANG_COLS,
                                [("j", 0, "RUNNING", 1, "", 0.0, float(n), 0, "")]),
                    bulk.Update(repo._TASKS, ("job_id", "instance"), repo._TASK_COLS,
                                [("j", i, 1, "RUNNING", "h", "", "[]", "[]", 0, "", "", 0.0, float(n), float(n))
                                 for i in range(8)])]
            event = bulk.Insert(repo._EVENTS, repo._EVENT_COLS)
            event.rows.append(("j", 0, 8, 1, "RUNNING", float(n), "h", "", "", None))
            with kept.raw_transaction() as tx:
                bulk.commit_batch(tx, [event], step)
        with kept.raw_transaction() as tx:
            cur, _ = bulk.cursor(tx)
            cur.execute("SELECT generic_plans, custom_plans FROM pg_prepared_statements "
                        "WHERE name LIKE 'peloton_batch_%'")
            plans = cur.fetchall()
            cur.execute("SHOW plan_cache_mode")
            assert cur.fetchone()[0] == "force_generic_plan"
            cur.close()
        assert plans == [(10, 0)], plans  # one shape, ten executions, none planned for its own parameters
    finally:
        kept.close()
    with db.transaction(sessions) as s:  # back in the pool: reset
        assert s.execute(text("SHOW plan_cache_mode")).scalar_one() == "auto"
        assert s.execute(text("SELECT max(finished_at) FROM tasks")).scalar_one() == 9.0
