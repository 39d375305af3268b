"""One daemon acts on a store at a time: the store lock.

PostgreSQL: a session-level advisory lock (`pg_try_advisory_lock`) on a connection of its own, held for as long
as the daemon acts; PostgreSQL releases it when that connection ends (the daemon died, or its connection or the
server went away), so a dead daemon never keeps it. SQLite: an exclusive `flock` on `<database>.lock`, released by
the kernel when the process ends.

Whoever holds it writes who they are (host, pid, address, since when) where the next one can read it: the `meta`
table (PostgreSQL) or the lock file (SQLite), so a refused daemon names the one in the way.

The lease (PostgreSQL). An advisory lock outlives a daemon that is paused (SIGSTOP, a long stall) or whose machine
was cut off without closing its connection: the kernel still answers for it. So the holder renews a heartbeat in
the store every second, on the lock's own connection (a renewal that succeeds proves the lock is still held), and
trusts itself to act only for half a lease after the last renewal it began (`fresh`, its own monotonic clock). A
standby that finds the heartbeat older than the holder's lease (by the store's clock: one clock for both) ends every
connection of the holder's (by their application_name), which frees the lock and rolls back whatever the holder had
in flight, and takes the lock. Epochs (fence.py) refuse the late writes of a holder that wakes up after that.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import secrets
import time
from pathlib import Path
from typing import Any, Protocol

from sqlalchemy import bindparam, create_engine, text
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.exc import ProgrammingError
from sqlalchemy.pool import NullPool

from peloton.errors import FailedPrecondition
from peloton.files import create_private
from peloton.leadership.owner import LEASE_S, Owner

log = logging.getLogger(__name__)

LOCK_KEY = 0x7065_6C6F_746F_6E  # "peloton": the advisory lock's key (the job manager's: the store lock)
OWNER_KEY = "daemon.owner"
HEARTBEAT_KEY = "daemon.heartbeat"  # the store's clock (Unix seconds) at the holder's last renewal
# One leader per role: a process takes the lock of each role it runs (PostgreSQL). The job manager's is the store
# lock above; its rows keep their names.
ROLE_KEYS = {"jobmgr": LOCK_KEY, "resmgr": LOCK_KEY + 1, "placement": LOCK_KEY + 2, "hostmgr": LOCK_KEY + 3}


def owner_key(role: str) -> str:
    return OWNER_KEY if role == "jobmgr" else f"{OWNER_KEY}.{role}"


def heartbeat_key(role: str) -> str:
    return HEARTBEAT_KEY if role == "jobmgr" else f"{HEARTBEAT_KEY}.{role}"


_RENEW = text("UPDATE meta SET value = CAST(EXTRACT(EPOCH FROM clock_timestamp()) AS TEXT) WHERE key IN :k").bindparams(
    bindparam("k", expanding=True))
UNDEFINED_TABLE = "42P01"


def session_name() -> str:
    """The application_name of every store connection of this process: a standby that breaks this daemon's lease
    ends exactly these (pg_stat_activity), and `peloton cluster info` lists standbys by theirs."""
    return f"peloton-{secrets.token_hex(6)}"


class StoreLock(Protocol):
    def try_acquire(self, owner: Owner) -> bool:
        """Take the lock if it is free (and record `owner`); False if another daemon holds it."""

    def record(self, owner: Owner) -> None:
        """Write who holds the lock where the next daemon can read it (again: the store's tables may only exist
        once the holder has migrated them)."""

    def holder(self, role: str = "") -> Owner | None:
        """Who holds (or last held) the lock, as they recorded it: of `role` (PostgreSQL: each role's lock has its
        own record), by default the one last found taken."""

    def held(self) -> bool:
        """Still ours: False once it is lost (the connection holding it went away). Renews the lease."""

    def announce_standby(self, address: str) -> None:
        """While waiting: let the holder list this daemon as a standby answering on `address`."""

    def fresh(self) -> bool:
        """Held, as far as this process can tell without asking: the last renewal began less than half a lease
        ago. A daemon acts on its backend (launches, kills) only while this holds."""

    def release(self) -> None:
        ...


def refusal(holder: Owner | None, what: str) -> FailedPrecondition:
    who = holder.describe() if holder is not None else "another daemon"
    return FailedPrecondition(
        f"another peloton daemon acts on {what}: {who}; stop it first, or start this one with --standby to take "
        "over when it goes", field="--db")


class PostgresLock:
    def __init__(self, url: str, session: str = "", roles: tuple[str, ...] = ("jobmgr",)) -> None:
        """`session`: the application_name of this daemon's store connections (session_name()); `roles`: the
        roles whose locks it takes, all or none (a process leads every role it runs)."""
        u = make_url(url)
        if u.drivername == "postgresql":
            u = u.set(drivername="postgresql+psycopg2")
        # its own connection, outside any pool: the lock lives and dies with it
        args: dict[str, Any] = {"connect_timeout": 5, "keepalives": 1, "keepalives_idle": 5,
                                "keepalives_interval": 2, "keepalives_count": 3}
        if session:
            args["application_name"] = session
        self._engine = create_engine(u, poolclass=NullPool, connect_args=args)
        self._session = session
        self.roles = tuple(sorted(roles, key=list(ROLE_KEYS).index))
        self.contested = self.roles[0]  # the role whose lock another holds (last time it was tried)
        self._name = session  # the lock connection's application_name now (a standby's names its address)
        self._conn: Connection | None = None
        self._lease = LEASE_S
        self._renewed: float | None = None  # monotonic time at which the last successful renewal began
        self._owner: Owner | None = None  # who this process recorded itself as (again if its rows are missing)

    def _connect(self) -> Connection:
        if self._conn is None:
            self._conn = self._engine.connect().execution_options(isolation_level="AUTOCOMMIT")
            if self._name != self._session:
                self._conn.execute(text("SELECT set_config('application_name', :n, false)"), {"n": self._name})
        return self._conn

    def announce_standby(self, address: str) -> None:
        """Name the lock's connection as a standby answering on `address`: the leader lists it (`standbys`)."""
        self._rename(f"{STANDBY_PREFIX}{_role_code(self.roles)} {address}"[:63])

    def _rename(self, name: str) -> None:
        self._name = name
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.execute(text("SELECT set_config('application_name', :n, false)"), {"n": name})

    def try_acquire(self, owner: Owner) -> bool:
        began = time.monotonic()
        try:
            conn = self._connect()
            taken: list[int] = []
            got = True
            for role in self.roles:  # all of them or none: a process leads every role it runs
                key = ROLE_KEYS[role]
                if not conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": key}).scalar():
                    self.contested, got = role, False
                    break
                taken.append(key)
            if not got:
                for key in taken:
                    conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": key})
        except Exception:  # noqa: BLE001 - no store, no lock: the caller retries
            self._drop()
            return False
        if not got:
            try:
                self._end_if_silent(owner)
            except Exception:  # noqa: BLE001 - the store went away meanwhile: the caller retries
                self._drop()
            return False
        self._lease = owner.lease
        self._renewed = began
        if self._name != self._session:
            self._rename(self._session)  # a standby no more: a later one ends this connection by its name
        self.record(owner)
        return True

    def _end_if_silent(self, me: Owner) -> None:
        """The holder has not renewed its heartbeat for longer than its lease (paused, or its machine cut off
        with its connections still open): end all its connections, which frees the lock (taken on the next try)
        and rolls back what it had in flight."""
        conn = self._connect()
        if conn.execute(text("SELECT to_regclass('meta')")).scalar() is None:
            return
        holder = self.holder()
        if holder is None or not holder.session or holder.session == me.session:
            return
        silent = conn.execute(text("SELECT EXTRACT(EPOCH FROM clock_timestamp()) - CAST(value AS DOUBLE PRECISION) "
                                   "FROM meta WHERE key = :k"), {"k": heartbeat_key(self.contested)}).scalar()
        if silent is None or float(silent) <= holder.lease:
            return
        ended = conn.execute(text("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                                  "WHERE application_name = :app AND datname = current_database() "
                                  "AND pid <> pg_backend_pid()"),
                             {"app": holder.session}).scalar()
        log.warning("the %s lock's holder (%s) has not renewed its lease for %.1f s (lease %.0f s): ended its %s "
                    "store connection(s) to take over", self.contested, holder.describe(), float(silent), holder.lease,
                    ended)

    def record(self, owner: Owner) -> None:
        self._owner = owner
        conn = self._connect()
        if conn.execute(text("SELECT to_regclass('meta')")).scalar() is None:
            return  # a new database: the holder records itself once it has created the tables
        for role in self.roles:
            conn.execute(text("DELETE FROM meta WHERE key IN (:k, :h)"),
                         {"k": owner_key(role), "h": heartbeat_key(role)})
            conn.execute(text("INSERT INTO meta (key, value) VALUES (:k, :v)"),
                         {"k": owner_key(role), "v": owner.to_json()})
            conn.execute(text("INSERT INTO meta (key, value) VALUES (:k, CAST(EXTRACT(EPOCH FROM "
                              "clock_timestamp()) AS TEXT))"), {"k": heartbeat_key(role)})

    def holder(self, role: str = "") -> Owner | None:
        """Who holds the lock of `role`, by default of the role last found taken (the first role before any
        try)."""
        try:
            row = self._connect().execute(text("SELECT value FROM meta WHERE key = :k"),
                                          {"k": owner_key(role or self.contested)}).first()
        except Exception:  # noqa: BLE001
            self._drop()
            return None
        return Owner.from_json(row[0] if row else None)

    def held(self) -> bool:
        if self._conn is None:
            return False
        began = time.monotonic()
        try:
            # the lock is the session's: it is held exactly as long as this connection is alive; renewing the
            # heartbeat on it proves both
            renewed = self._conn.execute(_RENEW, {"k": [heartbeat_key(r) for r in self.roles]}).rowcount
        except ProgrammingError as e:
            if getattr(e.orig, "pgcode", None) != UNDEFINED_TABLE:
                self._drop()
                return False
            renewed = -1  # no tables yet: a process without a store, started before the one that migrates
        except Exception:  # noqa: BLE001
            self._drop()
            return False
        if 0 <= renewed < len(self.roles) and self._owner is not None:
            self.record(self._owner)  # the tables came after the lock: say who leads now that they exist
        self._renewed = began
        return True

    def fresh(self) -> bool:
        return (self._conn is not None and self._renewed is not None
                and time.monotonic() - self._renewed < self._lease / 2)

    def _drop(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.invalidate()
            with contextlib.suppress(Exception):
                self._conn.close()
        self._conn = None

    def release(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                for role in self.roles:
                    self._conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": ROLE_KEYS[role]})
        self._renewed = None
        self._drop()
        self._engine.dispose()


class FileLock:
    """SQLite: a lock file beside the database, held with flock (a second daemon with another data dir but the
    same --db is refused too)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._f: Any = None

    def try_acquire(self, owner: Owner) -> bool:
        # held for as long as we act; owner-only from the start (files.py)
        f = os.fdopen(create_private(self.path, os.O_RDWR | os.O_APPEND), "a+")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            return False
        self._f = f
        self.record(owner)
        return True

    def record(self, owner: Owner) -> None:
        f = self._f
        f.seek(0)
        f.truncate()
        f.write(owner.to_json())
        f.flush()

    def holder(self, role: str = "") -> Owner | None:
        try:  # (one record: SQLite's lock is the job manager's, whatever roles its holder runs)
            return Owner.from_json(self.path.read_text())
        except OSError:
            return None

    def held(self) -> bool:
        return self._f is not None

    def announce_standby(self, address: str) -> None:
        pass  # one machine, one file: nobody lists SQLite standbys

    def fresh(self) -> bool:
        return self._f is not None  # the kernel holds the flock for exactly as long as this process lives

    def release(self) -> None:
        if self._f is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._f, fcntl.LOCK_UN)
            self._f.close()
            self._f = None


STANDBY_PREFIX = "peloton-standby "


_CODES = {"jobmgr": "j", "resmgr": "r", "placement": "p", "hostmgr": "h"}


def _role_code(roles: tuple[str, ...]) -> str:
    """`jrph`: the roles in a standby's application_name (63 characters at most)."""
    return "".join(_CODES[r] for r in ROLE_KEYS if r in roles)


def standbys(conn: Connection | Any) -> list[tuple[str, float, tuple[str, ...]]]:
    """(address, connected since, roles) of each standby waiting for a lock of this PostgreSQL database."""
    rows = conn.execute(text("SELECT application_name, EXTRACT(EPOCH FROM backend_start) FROM pg_stat_activity "
                             "WHERE datname = current_database() AND application_name LIKE :p ORDER BY 2"),
                        {"p": STANDBY_PREFIX + "%"}).all()
    out = []
    for name, since in rows:
        code, _, address = str(name)[len(STANDBY_PREFIX):].partition(" ")
        roles = tuple(r for r, c in _CODES.items() if c in code)
        out.append((address, float(since), roles))
    return out


def role_leaders(conn: Connection | Any) -> list[tuple[str, Owner, float]]:
    """(role, its leader, seconds since its last renewal by the store's clock) of each role with a recorded
    leader (PostgreSQL)."""
    keys = [k for r in ROLE_KEYS for k in (owner_key(r), heartbeat_key(r))]
    rows = dict(conn.execute(text("SELECT key, value FROM meta WHERE key IN :k")
                             .bindparams(bindparam("k", expanding=True)), {"k": keys}).all())
    now = float(conn.execute(text("SELECT EXTRACT(EPOCH FROM clock_timestamp())")).scalar() or 0.0)
    out = []
    for role in ROLE_KEYS:
        owner = Owner.from_json(rows.get(owner_key(role)))
        if owner is None:
            continue
        try:
            silent = max(0.0, now - float(rows.get(heartbeat_key(role)) or 0.0))
        except ValueError:
            silent = 0.0
        out.append((role, owner, silent))
    return out


def store_lock(url: str, session: str = "", roles: tuple[str, ...] = ("jobmgr",)) -> StoreLock:
    u = make_url(url)
    if u.get_backend_name() == "sqlite":
        db = u.database or ""
        if not db or db == ":memory:":
            raise FailedPrecondition("--db: an in-memory SQLite database cannot be shared or locked", field="--db")
        return FileLock(Path(db).with_name(Path(db).name + ".lock"))
    return PostgresLock(url, session, roles)
