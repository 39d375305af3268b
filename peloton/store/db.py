"""Engines, sessions and migrations. SQLite is configured explicitly (WAL, foreign keys, busy timeout,
BEGIN IMMEDIATE for writers, plain BEGIN for readers so that reads never take the write lock); PostgreSQL through
psycopg2, with multi-row UPDATEs batched into few round trips.

A store that cannot be reached (connection refused or lost, SQLite locked past its busy timeout) is reported as
`StoreUnavailable` (an `Unavailable`: the API answers UNAVAILABLE and callers retry), never as an internal error."""

from __future__ import annotations

import contextlib
import functools
import re
import select
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import Counter, Histogram
from sqlalchemy import Engine, create_engine, event, inspect, text
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.exc import DBAPIError, DisconnectionError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from sqlalchemy.orm import Session, sessionmaker

import peloton
from peloton.errors import FailedPrecondition, InvalidArgument, Unavailable
from peloton.files import make_dirs, private_file, tighten

if TYPE_CHECKING:
    from alembic.config import Config

STATEMENTS = Counter("peloton_store_statements_total", "SQL statements sent to the store (round trips)", ["kind"])
TRANSACTIONS = Histogram("peloton_store_transaction_seconds", "One store transaction, begin to commit (or rollback), "
                         "by kind (read, write)", ["kind"],
                         buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0))
_TX = {kind: TRANSACTIONS.labels(kind) for kind in ("read", "write")}
# Which statements those are: the SQL verb and the first table named (a batch of several tables in one statement,
# bulk.write_batch: op "BATCH", table "*"). For the benchmarks' per-gang breakdown (sim_bench.py).
STATEMENT_TARGETS = Counter("peloton_store_statement_targets_total", "SQL statements sent to the store, by SQL verb "
                            "and first table named", ["op", "table"])
_TARGET = re.compile(r'\b(?:FROM|INTO|UPDATE)\s+"?(\w+)', re.IGNORECASE)


def count_statement(op: str, table: str) -> None:
    """One statement sent (the hot paths that bypass SQLAlchemy count their own: bulk.py, fence.py)."""
    _STATEMENT.inc()
    _target_counter(op, table).inc()


_STATEMENT = STATEMENTS.labels("statement")
_COMMIT = STATEMENTS.labels("commit")


@functools.lru_cache(maxsize=512)
def _target_counter(op: str, table: str) -> Any:
    """STATEMENT_TARGETS' child of (op, table), looked up once (a labels() call per statement was measurable on
    the writer's thread)."""
    return STATEMENT_TARGETS.labels(op, table)


def _target(statement: str) -> tuple[str, str]:
    """(verb, first table) of a statement's text, cheaply (once per statement sent through SQLAlchemy)."""
    words = statement.lstrip().split(None, 1)
    op = words[0].upper() if words else "?"
    m = _TARGET.search(statement)
    return op, (m.group(1) if m else "")


def _migrations_dir() -> Path:
    """The Alembic scripts: inside the package when installed from a wheel (setup.py puts them there), else the
    checkout's top-level migrations/ (an editable install, or the source tree)."""
    packaged = Path(peloton.__file__).resolve().parent / "migrations"
    return packaged if (packaged / "env.py").is_file() else Path(peloton.__file__).resolve().parent.parent / "migrations"


MIGRATIONS_DIR = _migrations_dir()


def default_sqlite_url(data_dir: Path) -> str:
    data_dir = Path(data_dir)
    make_dirs(data_dir)  # owner-only, and the missing ones above it (files.py)
    return f"sqlite:///{(data_dir / 'peloton.db').resolve()}"


def _is_sqlite(url: str) -> bool:
    return make_url(url).get_backend_name() == "sqlite"


def sqlite_path(url: str) -> Path | None:
    """The database file of a SQLite URL (None for another store, or an in-memory database)."""
    u = make_url(url)
    if u.get_backend_name() != "sqlite" or not u.database or u.database == ":memory:":
        return None
    return Path(u.database)


def _normalize(url: str) -> str:
    """`postgresql://...` means psycopg2 (SQLAlchemy 2.1 would otherwise pick psycopg 3)."""
    u = make_url(url)
    if u.drivername == "postgresql":
        u = u.set(drivername="postgresql+psycopg2")
    return u.render_as_string(hide_password=False)


def _count_statements(engine: Engine) -> Engine:
    stmt, commit = _STATEMENT, _COMMIT

    @event.listens_for(engine, "before_cursor_execute")
    def _on_execute(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        stmt.inc()
        STATEMENT_TARGETS.labels(*_target(statement)).inc()

    @event.listens_for(engine, "commit")
    def _on_commit(*_args: Any) -> None:
        commit.inc()

    return engine


# What a commit promises (`--store-durability`, docs/architecture.md "Durability"): FULL, the default: once a
# transition is reported to a client, it survives a power loss (SQLite: synchronous=FULL, the WAL synced at every
# commit; PostgreSQL: synchronous_commit=on). RELAXED: it survives the daemon's crash but not the machine's; a power
# loss may take back the last commits, never corrupt the store (SQLite: synchronous=NORMAL, the WAL synced at
# checkpoints only; PostgreSQL: synchronous_commit=off, the server's WAL writer syncs within 3 x wal_writer_delay).
FULL = "full"
RELAXED = "relaxed"
DURABILITIES = (FULL, RELAXED)


def make_engine(url: str, application_name: str = "", durability: str = FULL) -> Engine:
    """`application_name` (PostgreSQL): names this daemon's connections, so that a standby taking over from it
    can end exactly them (leadership/lock.py). `durability`: FULL or RELAXED (above)."""
    if durability not in DURABILITIES:
        raise InvalidArgument(f"store durability: expected one of {', '.join(DURABILITIES)}, got {durability!r}",
                              field="store_durability")
    return _count_statements(_make_engine(url, application_name, durability))


# A PostgreSQL connection that hears nothing back (the server's host lost power, a partition) fails within these
# instead of waiting for the kernel's retransmissions (~15 minutes, tcp_retries2) or, when what was sent had been
# acknowledged (a statement running), for ever; then it is an unavailable store (StoreUnavailable, the writer
# reloads, the connection is replaced). TCP_USER_TIMEOUT bounds data sent and not acknowledged; keepalive probes
# (after this many seconds idle, every so many seconds, so many unanswered) a connection with nothing outstanding.
# Neither fires while the server's host is up, however long a statement runs there: its kernel answers both.
STORE_TCP_USER_TIMEOUT_MS = 30_000
STORE_KEEPALIVE = (10, 5, 3)  # idle s, interval s, count


def _tcp_limits(url: str) -> dict[str, int]:
    """The libpq parameters for the limits above, but those the URL sets itself (`?keepalives_idle=60`)."""
    limits = {"keepalives": 1, "keepalives_idle": STORE_KEEPALIVE[0], "keepalives_interval": STORE_KEEPALIVE[1],
              "keepalives_count": STORE_KEEPALIVE[2], "tcp_user_timeout": STORE_TCP_USER_TIMEOUT_MS}
    given = make_url(url).query
    return {k: v for k, v in limits.items() if k not in given}


def _make_engine(url: str, application_name: str = "", durability: str = FULL) -> Engine:
    url = _normalize(url)
    if _is_sqlite(url):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30.0})

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_connection: Any, _record: Any) -> None:
            # Take transaction control away from pysqlite; we emit BEGIN IMMEDIATE ourselves.
            dbapi_connection.isolation_level = None
            cur = dbapi_connection.cursor()
            try:
                cur.execute("PRAGMA journal_mode=WAL")
                cur.execute("PRAGMA foreign_keys=ON")
                cur.execute("PRAGMA busy_timeout=30000")
                cur.execute("PRAGMA synchronous=FULL" if durability == FULL else "PRAGMA synchronous=NORMAL")
            finally:
                cur.close()

        @event.listens_for(engine, "begin")
        def _on_begin(conn: Connection) -> None:
            # readers BEGIN DEFERRED and never wait for the writer (WAL); writers take the lock up front so two
            # writers never deadlock on a lock upgrade
            conn.exec_driver_sql("BEGIN" if conn.get_execution_options().get(_READ_ONLY) else "BEGIN IMMEDIATE")

        return engine
    # psycopg2 by default; `postgresql+psycopg://` picks psycopg 3 (measured against it: docs/performance.md)
    psycopg2_only = {"executemany_mode": "values_plus_batch"} if make_url(url).get_driver_name() == "psycopg2" else {}
    engine = create_engine(url, pool_size=10, max_overflow=20, pool_timeout=10, **psycopg2_only,
                           connect_args={"connect_timeout": 5,
                                         **({"application_name": application_name} if application_name else {}),
                                         **_tcp_limits(url),
                                         # set either way: the server's own default may be off
                                         "options": f"-c synchronous_commit={'on' if durability == FULL else 'off'}"})
    _ping_idle_connections(engine)
    return engine


IDLE_PING_S = 1.0


def _ping_idle_connections(engine: Engine) -> None:
    """Ping a pooled connection before use only if it sat idle for a while: a connection that was just used is
    almost surely alive, and SQLAlchemy's pool_pre_ping (a round trip on every checkout) cost ~5% of the writer's
    time. One that idled through a database restart is replaced here, transparently; one that breaks while busy
    fails its transaction with StoreUnavailable (the pool then drops every connection made before the break)."""

    @event.listens_for(engine, "checkin")
    def _on_checkin(_dbapi_connection: Any, record: Any) -> None:
        record.info["idle_since"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _on_checkout(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        if time.monotonic() - record.info.get("idle_since", 0.0) < IDLE_PING_S:
            return
        # the pool catches a DisconnectionError, discards the connection and checks out (or opens) another
        _ping(dbapi_connection)


def _ping(dbapi_connection: Any) -> None:
    """A round trip on an idle PostgreSQL connection; DisconnectionError if it is gone."""
    try:
        with contextlib.closing(dbapi_connection.cursor()) as cur:
            cur.execute("SELECT 1")
        # psycopg2 began a transaction for it: end it, so that the caller's transaction begins afresh (its
        # isolation level and read-only setting, see transaction(snapshot=True), can only be set outside one)
        dbapi_connection.rollback()
    except Exception as e:  # noqa: BLE001 - any failure means this connection is gone
        raise DisconnectionError(str(e)) from e


_READ_ONLY = "peloton_read_only"


class StoreUnavailable(Unavailable):
    """The store cannot be reached right now; nothing was written. Retry later."""


def make_sessions(engine: Engine) -> sessionmaker[Session]:
    """Sessions for transactions that write."""
    return sessionmaker(bind=engine, expire_on_commit=False, info={"kind": "write"})


def make_read_sessions(engine: Engine) -> sessionmaker[Session]:
    """Sessions for reads: on SQLite they do not take the write lock."""
    return sessionmaker(bind=engine.execution_options(**{_READ_ONLY: True}), expire_on_commit=False,
                        info={"kind": "read"})


def is_unavailable(e: BaseException) -> bool:
    """The store is down or unreachable (not a bad statement)."""
    if isinstance(e, (DisconnectionError, PoolTimeoutError)):
        return True
    if isinstance(e, DBAPIError):
        return bool(e.connection_invalidated) or isinstance(e, (OperationalError, InterfaceError))
    # the bulk writers (bulk.py) use the DB-API cursor itself: its errors come unwrapped
    return isinstance(e, _DBAPI_UNAVAILABLE)


def _dbapi_errors(*names: str) -> tuple[type[BaseException], ...]:
    """The DB-API exception classes of these names of every driver the store may use (the bulk writers' errors
    come from the driver itself)."""
    import sqlite3

    import psycopg2

    modules: list[Any] = [sqlite3, psycopg2]
    try:
        import psycopg  # psycopg 3, when installed (not a dependency)
    except ImportError:
        pass
    else:
        modules.append(psycopg)
    return tuple(getattr(m, n) for m in modules for n in names)


_DBAPI_UNAVAILABLE = _dbapi_errors("OperationalError", "InterfaceError")
# a unique or foreign key violated, raised by the driver (a bulk write: bulk.py)
DBAPI_INTEGRITY_ERRORS = _dbapi_errors("IntegrityError")


@contextlib.contextmanager
def transaction(sessions: sessionmaker[Session], *, snapshot: bool = False) -> Iterator[Session]:
    """One transaction: commit on success, rollback on error. A store that cannot be reached raises
    StoreUnavailable. `snapshot` (a read that must not mix commits, e.g. jobs and their task counts): every
    statement sees the same snapshot. SQLite's read transactions already do (WAL: the snapshot of the first read);
    PostgreSQL's default READ COMMITTED takes one per statement, so there it is REPEATABLE READ READ ONLY, which
    never waits for or fails with a writer."""
    s = sessions()
    began = time.perf_counter()
    try:
        if snapshot and s.get_bind().dialect.name == "postgresql":
            # psycopg2 puts these on its BEGIN: no round trip of their own; the pool resets them on return
            s.connection(execution_options={"isolation_level": "REPEATABLE READ", "postgresql_readonly": True})
        yield s
        s.commit()
    except BaseException as e:
        with contextlib.suppress(Exception):  # the connection may be gone: rolling back is best effort
            s.rollback()
        if is_unavailable(e):
            raise StoreUnavailable(f"the store is unavailable ({_short(e)}); retry later") from e
        raise
    finally:
        _TX.get(s.info.get("kind", "write"), _TX["write"]).observe(time.perf_counter() - began)
        with contextlib.suppress(Exception):
            s.close()


# PostgreSQL session settings of a kept connection (a job manager writer's), set when it is opened and reset before
# it goes back to the pool. Every statement a writer sends finds its rows by primary key (bulk.py; an UPDATE is
# chunked at 250 rows so that a key lookup a row stays the cheaper plan), but on tables whose statistics are stale
# (never analyzed with autovacuum off, or grown since) the planner may join a batch to a whole-table scan of
# `tasks` or `gangs`, dead rows included, whose cost grows with the table: in a 30 s closed loop PostgreSQL's CPU
# a gang was 6.8 ms against 2.8 ms with no sequential scans (docs/performance.md). So the writers plan without
# them (a table with no usable index is still scanned). And they keep a prepared batch's generic plan: planned
# for parameters unknown, `unnest` counts 100 rows an array where a gang's has 1-16, so its generic plan costs
# about twice its custom one and `plan_cache_mode = auto` plans every execution anew (8% of the server's CPU under
# the closed loop, perf; docs/performance.md). Both plans look rows up by key; the generic one is made once.
WRITER_PG_SETTINGS = (("enable_seqscan", "off"), ("plan_cache_mode", "force_generic_plan"))


class KeptConnection:
    """Write transactions on one connection kept across them, for one thread that commits often (a job manager
    writer shard): `transaction()` is `transaction(sessions)` without the pool's checkout and checkin (and their
    events, the reset on return) on every commit: 40-130 µs of CPU a commit (docs/performance.md). Each
    transaction still gets a Session of its own from `sessions` (its events, e.g. the fence's check before every
    commit, and its info; no identity map carried from one to the next) and, on SQLite, its BEGIN IMMEDIATE (the
    engine's begin event).

    A kept connection is never reused once it may be broken: a transaction that fails with the store unavailable
    (or whose rollback fails) invalidates it and the next one opens another, pinged before use (PostgreSQL); so does
    every other KeptConnection of the same engine (the outage was probably theirs too). One that sat idle for
    IDLE_PING_S, or to which the server sent something between transactions (a terminated backend says so before
    it closes the connection), is pinged before use, as the pool does on checkout, and replaced if it is gone.
    Not thread-safe: one thread uses it; `close` (from that thread, or once it is done) returns the connection to
    the pool."""

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self.sessions = sessions
        engine = sessions.kw["bind"]
        self._engine: Engine = engine
        self._outages = _OUTAGES.setdefault(engine, [0])  # this engine's outages seen by any KeptConnection
        self._conn: Connection | None = None
        self._seen = self._outages[0]
        self._ping = False  # the connection is new after an outage: ping it before its first transaction
        self._used = 0.0  # time.monotonic() at the end of the last transaction

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Session]:
        """One write transaction on the kept connection (see `transaction`): commit on success, rollback on
        error; StoreUnavailable when the store cannot be reached."""
        began = time.perf_counter()
        s: Session | None = None
        try:
            s = self.sessions(bind=self._connection())
            yield s
            s.commit()
        except BaseException as e:
            instead = self._failed(e, None if s is None else s.rollback)
            if instead is not None:
                raise instead from e
            raise
        finally:
            _TX["write"].observe(time.perf_counter() - began)
            if s is not None:
                with contextlib.suppress(Exception):
                    s.close()  # ends the session only: the connection stays
            self._used = time.monotonic()

    @contextlib.contextmanager
    def raw_transaction(self) -> Iterator[RawTransaction]:
        """One write transaction on the kept connection's DB-API connection, with no Session and no SQLAlchemy
        transaction around it: for what the bulk writers (bulk.py) alone write (a group commit whose jobs are all
        cached: no reads, no ORM). The same as `transaction` otherwise: SQLite's BEGIN IMMEDIATE, the commit check
        of the sessions' info (the fence) unless the writes made it (bulk.write_batch), commit on success (unless
        its one statement committed it: bulk.commit_batch), rollback on error, StoreUnavailable when the store cannot
        be reached, the connection dropped when it may be broken.
        The Session and transaction machinery cost ~0.25 ms of CPU a commit on PostgreSQL, more than the bulk
        statement itself (issue 24, docs/performance.md)."""
        began = time.perf_counter()
        dbapi: Any = None
        try:
            conn = self._connection()
            dbapi = conn.connection.dbapi_connection
            tx = RawTransaction(conn, dict(self.sessions.kw.get("info") or {}))
            if conn.dialect.name == "sqlite":
                # what the engine's begin event sends for a writer (pysqlite's own transaction control is off)
                dbapi.execute("BEGIN IMMEDIATE")
                count_statement("BEGIN", "")
            yield tx
            if not tx.committed:
                check = tx.info.get(COMMIT_CHECK)
                if check is not None and not tx.info.pop(COMMIT_CHECKED, False):
                    check.check_raw(tx)
                dbapi.commit()
            _COMMIT.inc()
        except BaseException as e:
            instead = self._failed(e, None if dbapi is None else dbapi.rollback)
            if instead is not None:
                raise instead from e
            raise
        finally:
            _TX["write"].observe(time.perf_counter() - began)
            self._used = time.monotonic()

    def _failed(self, e: BaseException, rollback: Callable[[], None] | None) -> StoreUnavailable | None:
        """After a transaction failed with `e`: roll it back (best effort; None: nothing to roll back), drop the
        connection when it may be broken; the StoreUnavailable to raise instead of `e` when the store is out."""
        unavailable = is_unavailable(e)
        rolled_back = False
        if rollback is not None:
            with contextlib.suppress(Exception):  # the connection may be gone: rolling back is best effort
                rollback()
                rolled_back = True
        if unavailable or not rolled_back:
            self._drop(outage=unavailable)
        return StoreUnavailable(f"the store is unavailable ({_short(e)}); retry later") if unavailable else None

    def _connection(self) -> Connection:
        conn = self._conn
        if conn is not None and self._seen != self._outages[0]:  # another writer of this engine lost its connection
            self._drop(outage=False)
            self._ping = True
            conn = None
        if conn is not None and conn.in_transaction():
            # never so after a clean commit or rollback; a Session would join such a transaction and its commit
            # would commit nothing: start afresh rather than risk telling a client of a change not committed
            self._drop(outage=False)
            conn = None
        if conn is not None and conn.dialect.name == "postgresql" and (
                time.monotonic() - self._used >= IDLE_PING_S or _readable(conn.connection.dbapi_connection)):
            try:
                _ping(conn.connection.dbapi_connection)
            except DisconnectionError:
                self._drop(outage=False)
                conn = None
        if conn is None:
            self._seen = self._outages[0]
            conn = self._engine.connect()  # OperationalError (down) -> the caller's StoreUnavailable
            self._conn = conn
            if self._ping and conn.dialect.name == "postgresql":
                # the pool may hand back a connection from before the outage, used too recently to be pinged
                try:
                    _ping(conn.connection.dbapi_connection)
                except DisconnectionError:
                    self._drop(outage=False)
                    conn = self._conn = self._engine.connect()
            self._ping = False
            if conn.dialect.name == "postgresql":
                _session_settings(conn, [f"SET {k} = {v}" for k, v in WRITER_PG_SETTINGS])
        return conn

    def _drop(self, *, outage: bool) -> None:
        """Forget the kept connection, invalidated (closed, never back in the pool): it may be broken."""
        conn, self._conn = self._conn, None
        if outage:
            self._outages[0] += 1
            self._seen = self._outages[0]
            self._ping = True
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.invalidate()
            with contextlib.suppress(Exception):
                conn.close()

    def close(self) -> None:
        """Return the kept connection to the pool (the next transaction takes one again), its settings reset."""
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                if conn.dialect.name == "postgresql":
                    _session_settings(conn, [f"RESET {k}" for k, _ in WRITER_PG_SETTINGS])
            except Exception:  # noqa: BLE001 - not reset: never back in the pool
                with contextlib.suppress(Exception):
                    conn.invalidate()
            with contextlib.suppress(Exception):
                conn.close()


def _session_settings(conn: Connection, statements: list[str]) -> None:
    """Run SET/RESET statements on a connection outside any transaction of the caller's (committed at once)."""
    for q in statements:
        conn.exec_driver_sql(q)
    conn.commit()


# Session.info keys (bulk.py and leadership/fence.py use them): the object whose `check_raw(tx)` (and, on a
# Session, its before_commit listener) every write commit runs (the fence), and the flag that this transaction's
# writes made that check already (bulk.write_batch reads the epochs in its statement)
COMMIT_CHECK = "peloton.fence"
COMMIT_CHECKED = "peloton.fence.checked"


class RawTransaction:
    """KeptConnection.raw_transaction's transaction: the part of a Session that the bulk writers use (its
    connection, for the DB-API cursor and the dialect; its info, for the fence), on the kept connection.

    `fresh` until the connection is first asked for (nothing sent yet); `committed` once a statement that was the
    whole transaction committed it (bulk.commit_batch): nothing may follow it."""
    __slots__ = ("_conn", "info", "fresh", "committed")

    def __init__(self, conn: Connection, info: dict[str, Any]) -> None:
        self._conn = conn
        self.info = info
        self.fresh = True
        self.committed = False

    def connection(self) -> Connection:
        if self.committed:
            raise RuntimeError("this transaction was committed by its one statement: nothing may follow it")
        self.fresh = False
        return self._conn

    def get_bind(self) -> Connection:
        return self._conn


def _readable(dbapi_connection: Any) -> bool:
    """The server sent something to a connection that is between transactions: a backend that ends (terminated,
    the server shutting down) says why and closes it. One poll, no round trip: nothing waits there otherwise (the
    writer's connections LISTEN to nothing)."""
    try:
        return bool(select.select([dbapi_connection.fileno()], [], [], 0)[0])
    except Exception:  # noqa: BLE001 - no socket to poll: let the ping decide
        return True


# engine -> [how many outages its KeptConnections have seen]: each replaces its connection after one
_OUTAGES: weakref.WeakKeyDictionary[Engine, list[int]] = weakref.WeakKeyDictionary()


def _short(e: BaseException) -> str:
    orig = getattr(e, "orig", None) or e
    text = " ".join(str(orig).split())
    return text[:200]


def _alembic_config(connection: Connection) -> Config:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", connection.engine.url.render_as_string(hide_password=False).replace("%", "%%"))
    cfg.attributes["connection"] = connection
    return cfg


@contextlib.contextmanager
def _connection(url: str) -> Iterator[Connection]:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            yield conn
    finally:
        engine.dispose()


MIGRATION_LOCK_KEY = 0x7065_6C6F_746F_6D  # PostgreSQL: one migrating process at a time (processes of a split deployment)


def upgrade(url: str, revision: str = "head") -> None:
    """Apply the Alembic chain in migrations/ (idempotent). On PostgreSQL under a transaction-level advisory lock:
    processes that start together (the roles of a split deployment) migrate one after the other, and the later
    ones find nothing left to do. A store already at head (every restart) is left to itself without Alembic,
    whose import and reading of the scripts took ~150 ms of a daemon's start (docs/performance.md, "Starting and
    stopping the daemon"); any other revision (older, newer, none, several) goes to Alembic as before."""
    own_sqlite_file(url)
    with _migrating(url) as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": MIGRATION_LOCK_KEY})
        stored = stored_revisions(conn)
        if revision == "head" and stored == [head_revision()]:
            return
        refuse_newer(stored, url)
        from alembic import command

        command.upgrade(_alembic_config(conn), revision)


def refuse_newer(stored: list[str], url: str) -> None:
    """FailedPrecondition (field '--db') when the store's schema is at a revision this release does not have: a
    newer release upgraded it. Alembic's own words were "Can't locate revision identified by '0014'"."""
    unknown = [r for r in stored if r not in known_revisions()]
    if unknown:
        raise FailedPrecondition(
            f"--db: {describe(url)} is at schema revision {unknown[0]}, newer than this release's newest "
            f"({head_revision()}): a newer release upgraded it. Run that release, or go back with its "
            f"`peloton db downgrade {head_revision()}` first (docs/running.md, \"Rolling back a release\")",
            field="--db")


def known_revisions() -> list[str]:
    """This release's revisions, oldest first (each script is `NNNN_what.py`, revision "NNNN")."""
    return sorted(p.name[:4] for p in (MIGRATIONS_DIR / "versions").glob("[0-9][0-9][0-9][0-9]_*.py"))


def head_revision() -> str:
    """The newest migration's revision, from the scripts' names alone (no Alembic): each is `NNNN_what.py` with
    revision "NNNN", one after the other (tests/store/test_migrations.py holds the scripts to that)."""
    return known_revisions()[-1]


def stored_revisions(conn: Connection) -> list[str]:
    """The revisions Alembic recorded in the store (none before its first migration)."""
    if not inspect(conn).has_table("alembic_version"):
        return []
    return [str(r[0]) for r in conn.execute(text("SELECT version_num FROM alembic_version"))]


def downgrade(url: str, revision: str) -> None:
    """Undo the migrations after `revision` ("base": all of them). The caller holds the store lock (`peloton db
    downgrade`: no daemon acts on the store meanwhile)."""
    from alembic import command

    with _migrating(url) as conn:
        refuse_newer(stored_revisions(conn), url)
        command.downgrade(_alembic_config(conn), revision)


@contextlib.contextmanager
def _migrating(url: str) -> Iterator[Connection]:
    """A connection for a migration, committed at the end. On SQLite with foreign keys off while it runs, as
    SQLite's own procedure for schema changes has it: a migration that drops a column copies the table into a new
    one and drops the old, and with foreign keys on that drop fails for a row that refers to the old table (a
    child pool's `parent`) or, for `jobs`, deletes every gang, task and event with it (ON DELETE CASCADE). The keys
    are checked before the commit instead (PRAGMA foreign_key_check): a migration that broke one fails and writes
    nothing. (The pragma is a no-op inside a transaction: it is set before the first statement.)"""
    with _connection(url) as conn:
        sqlite = conn.dialect.name == "sqlite"
        if sqlite:
            conn.connection.dbapi_connection.execute("PRAGMA foreign_keys=OFF")  # type: ignore[union-attr]
        try:
            yield conn
            if sqlite:
                broken = conn.exec_driver_sql("PRAGMA foreign_key_check").all()
                if broken:
                    conn.rollback()
                    raise RuntimeError(f"the migration left {len(broken)} row(s) whose foreign key refers to no row "
                                       f"(table, rowid, parent table): {[tuple(r[:3]) for r in broken[:5]]}; "
                                       "nothing was written")
            conn.commit()
        finally:
            if sqlite:
                conn.connection.dbapi_connection.execute("PRAGMA foreign_keys=ON")  # type: ignore[union-attr]


def own_sqlite_file(url: str) -> None:
    """A SQLite store's file is created owner-only before SQLite creates it with the umask's mode (its -wal, -shm
    and -journal files take the database file's mode); one found looser is tightened (files.py)."""
    path = sqlite_path(url)
    if path is None:
        return
    private_file(path)
    for extra in ("-wal", "-shm"):
        tighten(path.with_name(path.name + extra))


def current_revision(url: str) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with _connection(url) as conn:
        return MigrationContext.configure(conn).get_current_revision()


def describe(url: str) -> str:
    """The store as messages name it: the SQLite file, or the PostgreSQL database and its server."""
    u = make_url(url)
    if u.get_backend_name() == "sqlite":
        return f"the SQLite store {u.database}"
    return f"the PostgreSQL database {u.database} at {u.host or 'localhost'}:{u.port or 5432}"
