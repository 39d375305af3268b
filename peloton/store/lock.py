"""One daemon acts on a store at a time: the store lock.

PostgreSQL: a session-level advisory lock (`pg_try_advisory_lock`) on a connection of its own, held for as long
as the daemon acts; PostgreSQL releases it when that connection ends (the daemon died, or its connection or the
server went away), so a dead daemon never keeps it. SQLite: an exclusive `flock` on `<database>.lock`, released by
the kernel when the process ends.

Whoever holds it writes who they are (host, pid, address, since when) where the next one can read it: the `meta`
table (PostgreSQL) or the lock file (SQLite), so a refused daemon names the one in the way.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from sqlalchemy import create_engine, text
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.pool import NullPool

from peloton.errors import FailedPrecondition

LOCK_KEY = 0x7065_6C6F_746F_6E  # "peloton": the advisory lock's key
OWNER_KEY = "daemon.owner"


@dataclass(frozen=True, slots=True)
class Owner:
    host: str
    pid: int
    address: str
    since: float

    @staticmethod
    def me(address: str) -> Owner:
        return Owner(socket.gethostname(), os.getpid(), address, time.time())

    def to_json(self) -> str:
        return json.dumps({"host": self.host, "pid": self.pid, "address": self.address, "since": self.since})

    @staticmethod
    def from_json(text: str | None) -> Owner | None:
        try:
            d = json.loads(text or "")
            return Owner(str(d["host"]), int(d["pid"]), str(d.get("address", "")), float(d["since"]))
        except (ValueError, KeyError, TypeError):
            return None

    def describe(self) -> str:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since))
        at = f", serving {self.address}" if self.address else ""
        return f"pid {self.pid} on host {self.host}{at}, since {since}"


class StoreLock(Protocol):
    def try_acquire(self, owner: Owner) -> bool:
        """Take the lock if it is free (and record `owner`); False if another daemon holds it."""

    def record(self, owner: Owner) -> None:
        """Write who holds the lock where the next daemon can read it (again: the store's tables may only exist
        once the holder has migrated them)."""

    def holder(self) -> Owner | None:
        """Who holds (or last held) the lock, as they recorded it."""

    def held(self) -> bool:
        """Still ours: False once it is lost (the connection holding it went away)."""

    def release(self) -> None:
        ...


def refusal(holder: Owner | None, what: str) -> FailedPrecondition:
    who = holder.describe() if holder is not None else "another daemon"
    return FailedPrecondition(
        f"another peloton daemon acts on {what}: {who}; stop it first, or start this one with --standby to take "
        "over when it goes", field="--db")


class PostgresLock:
    def __init__(self, url: str) -> None:
        u = make_url(url)
        if u.drivername == "postgresql":
            u = u.set(drivername="postgresql+psycopg2")
        # its own connection, outside any pool: the lock lives and dies with it
        self._engine = create_engine(u, poolclass=NullPool,
                                     connect_args={"connect_timeout": 5, "keepalives": 1, "keepalives_idle": 5,
                                                   "keepalives_interval": 2, "keepalives_count": 3})
        self._conn: Connection | None = None

    def _connect(self) -> Connection:
        if self._conn is None:
            self._conn = self._engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        return self._conn

    def try_acquire(self, owner: Owner) -> bool:
        try:
            conn = self._connect()
            got = bool(conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": LOCK_KEY}).scalar())
        except Exception:  # noqa: BLE001 - no store, no lock: the caller retries
            self._drop()
            return False
        if got:
            self.record(owner)
        return got

    def record(self, owner: Owner) -> None:
        conn = self._connect()
        if conn.execute(text("SELECT to_regclass('meta')")).scalar() is None:
            return  # a new database: the holder records itself once it has created the tables
        conn.execute(text("DELETE FROM meta WHERE key = :k"), {"k": OWNER_KEY})
        conn.execute(text("INSERT INTO meta (key, value) VALUES (:k, :v)"), {"k": OWNER_KEY, "v": owner.to_json()})

    def holder(self) -> Owner | None:
        try:
            row = self._connect().execute(text("SELECT value FROM meta WHERE key = :k"), {"k": OWNER_KEY}).first()
        except Exception:  # noqa: BLE001
            self._drop()
            return None
        return Owner.from_json(row[0] if row else None)

    def held(self) -> bool:
        if self._conn is None:
            return False
        try:
            # the lock is the session's: it is held exactly as long as this connection is alive
            self._conn.execute(text("SELECT 1"))
            return True
        except Exception:  # noqa: BLE001
            self._drop()
            return False

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
                self._conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": LOCK_KEY})
        self._drop()
        self._engine.dispose()


class FileLock:
    """SQLite: a lock file beside the database, held with flock (a second daemon with another data dir but the
    same --db is refused too)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._f: Any = None

    def try_acquire(self, owner: Owner) -> bool:
        f = open(self.path, "a+")  # noqa: SIM115 - held for as long as we act
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

    def holder(self) -> Owner | None:
        try:
            return Owner.from_json(self.path.read_text())
        except OSError:
            return None

    def held(self) -> bool:
        return self._f is not None

    def release(self) -> None:
        if self._f is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._f, fcntl.LOCK_UN)
            self._f.close()
            self._f = None


def store_lock(url: str) -> StoreLock:
    u = make_url(url)
    if u.get_backend_name() == "sqlite":
        db = u.database or ""
        if not db or db == ":memory:":
            raise FailedPrecondition("--db: an in-memory SQLite database cannot be shared or locked", field="--db")
        return FileLock(Path(db).with_name(Path(db).name + ".lock"))
    return PostgresLock(url)
