"""Fencing: the store refuses the writes of a daemon that is no longer the leader.

Each daemon that takes the store lock (lock.py) takes the next epoch too (`take_epochs`, a counter in `meta`), and
every transaction it commits first reads the epoch again with `FOR KEY SHARE` in that same transaction (`Fence`).
A daemon that lost the lock without knowing it yet (it was paused, or cut off, and a standby took over) therefore
finds a newer epoch and its transaction is rolled back (`Fenced`, UNAVAILABLE) instead of landing on top of the new
leader's. The row lock makes it exact: the new leader takes the epoch with `FOR UPDATE`, which waits for any
transaction that read the old one to end, so no transaction that checked the old epoch commits after the new one is
taken.

A process that leads other roles than the job manager (`--role`) takes and checks an epoch for each of them
(`daemon.epoch.<role>`): a resmgr or hostmgr process replaced by its standby has its late writes refused too.

On SQLite the check is a plain read: every writer there begins with BEGIN IMMEDIATE, so transactions that write
are serialized anyway (and a SQLite store is used by one daemon at a time: the flock of lock.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping

from sqlalchemy import bindparam, event, text
from sqlalchemy.orm import Session, sessionmaker

from peloton.errors import Unavailable
from peloton.store import bulk, repo
from peloton.store.db import count_statement, transaction

log = logging.getLogger(__name__)

EPOCH_KEY = "daemon.epoch"  # the job manager's (the store lock's); each other role has one of its own
# several keys are locked in one statement, in key order, by both the check and the take: no deadlock between them
_CHECK_PG = "SELECT key, value FROM meta WHERE key = ANY(%s) ORDER BY key FOR KEY SHARE"
_CHECK_SQLITE_RAW = "SELECT key, value FROM meta WHERE key IN ({})"
_TAKE = text("SELECT key, value FROM meta WHERE key IN :k ORDER BY key FOR UPDATE").bindparams(
    bindparam("k", expanding=True))
_CHECK_SQLITE = text("SELECT key, value FROM meta WHERE key IN :k").bindparams(bindparam("k", expanding=True))
_TAKING = "peloton.fence.taking"  # Session.info flag: this transaction takes the next epoch (not checked)


class Fenced(Unavailable):
    """This daemon is no longer the store's leader; its transaction was rolled back."""


def epoch_key(role: str) -> str:
    return EPOCH_KEY if role == "jobmgr" else f"{EPOCH_KEY}.{role}"


def take_epochs(sessions: sessionmaker[Session], roles: Iterable[str] = ("jobmgr",)) -> dict[str, int]:
    """The next epoch of each role, now this process's (call once it holds the roles' locks and the schema is
    current): {meta key: epoch}."""
    keys = sorted(epoch_key(r) for r in roles)
    with transaction(sessions) as s:
        s.info[_TAKING] = True
        sql = _CHECK_SQLITE if s.get_bind().dialect.name == "sqlite" else _TAKE
        current: dict[str, str] = {str(k): str(v) for k, v in s.execute(sql, {"k": keys}).all()}
        out = {k: int(current.get(k) or 0) + 1 for k in keys}
        for k, epoch in out.items():
            repo.set_meta(s, k, str(epoch))
    return out


class Fence:
    """Checks, before each commit of `sessions`, that the store's epochs are still this process's: `epochs`, an
    epoch (the job manager's) or {meta key: epoch} for each role the process leads (take_epochs)."""

    def __init__(self, epochs: int | Mapping[str, int], on_fenced: Callable[[str], None] = lambda why: None) -> None:
        """`on_fenced(why)` is told the first time a commit is refused (the daemon stops acting at once)."""
        self._on_fenced = on_fenced
        self.take(epochs)

    @property
    def epoch(self) -> int:
        """The job manager's epoch, else the first role's (what operators see)."""
        return self.epochs.get(EPOCH_KEY) or next(iter(self.epochs.values()))

    def install(self, sessions: sessionmaker[Session]) -> None:
        event.listen(sessions, "before_commit", self._check)
        # a writer that sends its whole batch in one statement (bulk.write_batch) reads the epochs in it, and the
        # commit then does not read them again
        sessions.kw["info"] = {**sessions.kw.get("info", {}), bulk.FENCE_INFO: self}

    @property
    def keys(self) -> list[str]:
        """The meta keys of the epochs, in the order they are locked."""
        return self._keys

    def take(self, epochs: int | Mapping[str, int]) -> None:
        """This process leads (again: it took the locks back), as `epochs`."""
        self.epochs = {EPOCH_KEY: epochs} if isinstance(epochs, int) else dict(epochs)
        self._keys = sorted(self.epochs)
        self._check_sqlite = _CHECK_SQLITE_RAW.format(", ".join("?" for _ in self._keys))
        self._told = False

    def _check(self, session: Session) -> None:
        if session.info.pop(_TAKING, False) or session.info.pop(bulk.FENCE_CHECKED, False):
            return
        session.flush()  # the ORM's pending changes go out first: they are checked with the rest
        self._read(session)

    def check_raw(self, tx: bulk.Tx) -> None:
        """The check before the commit of a transaction without a Session (db.KeptConnection.raw_transaction)."""
        self._read(tx)

    def _read(self, tx: bulk.Tx) -> None:
        # on the DB-API cursor: every write transaction pays this, and SQLAlchemy's statement machinery cost more
        # than the round trip (sim_bench: 1,100 -> 1,290 tasks/s without any check; docs/performance.md)
        cur, dialect = bulk.cursor(tx)
        try:
            if dialect == "postgresql":
                cur.execute(_CHECK_PG, (self._keys,))
            else:
                cur.execute(self._check_sqlite, self._keys)
            rows = cur.fetchall()
        finally:
            cur.close()
        count_statement("SELECT", "meta")
        self._verify(rows)

    def checked(self, session: bulk.Tx, rows: Iterable[tuple[str, str | None]]) -> None:
        """The epochs (key, value) were read, locked, in this transaction (bulk.write_batch): Fenced if another
        process took over, else the commit need not read them again."""
        self._verify(rows)
        session.info[bulk.FENCE_CHECKED] = True

    def _verify(self, rows: Iterable[tuple[str, str | None]]) -> None:
        found = {k: int(v or 0) for k, v in rows}
        stale = [k for k in self._keys if found.get(k, 0) != self.epochs[k]]
        if not stale:
            return
        k = stale[0]
        role = k[len(EPOCH_KEY) + 1:] if k != EPOCH_KEY else ""
        what = f"the {role} leader" if role else "the store's leader"
        why = (f"this daemon is no longer {what} (its epoch {self.epochs[k]}, the store's {found.get(k, 0)}): another "
               "daemon took over; retry against it")
        if not self._told:
            self._told = True
            log.error("%s: a write was refused; stopping", why.split(":")[0])
            self._on_fenced(why)
        raise Fenced(why)
