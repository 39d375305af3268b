"""Fencing: the store refuses the writes of a daemon that is no longer the leader.

Each daemon that takes the store lock (lock.py) takes the next epoch too (`take_epoch`, a counter in `meta`), and
every transaction it commits first reads the epoch again with `FOR KEY SHARE` in that same transaction (`Fence`).
A daemon that lost the lock without knowing it yet (it was paused, or cut off, and a standby took over) therefore
finds a newer epoch and its transaction is rolled back (`Fenced`, UNAVAILABLE) instead of landing on top of the new
leader's. The row lock makes it exact: the new leader takes the epoch with `FOR UPDATE`, which waits for any
transaction that read the old one to end, so no transaction that checked the old epoch commits after the new one is
taken.

On SQLite the check is a plain read: every writer there begins with BEGIN IMMEDIATE, so transactions that write
are serialized anyway (and a SQLite store is used by one daemon at a time: the flock of lock.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from sqlalchemy import event, text
from sqlalchemy.orm import Session, sessionmaker

from peloton.errors import Unavailable
from peloton.store import repo
from peloton.store.db import transaction

log = logging.getLogger(__name__)

EPOCH_KEY = "daemon.epoch"
_CHECK = text("SELECT value FROM meta WHERE key = :k FOR KEY SHARE")
_TAKE = text("SELECT value FROM meta WHERE key = :k FOR UPDATE")
_CHECK_SQLITE = text("SELECT value FROM meta WHERE key = :k")
_TAKING = "peloton.fence.taking"  # Session.info flag: this transaction takes the next epoch (not checked)


class Fenced(Unavailable):
    """This daemon is no longer the store's leader; its transaction was rolled back."""


def take_epoch(sessions: sessionmaker[Session]) -> int:
    """The next epoch, now this daemon's (call once the store lock is held and the schema is current)."""
    with transaction(sessions) as s:
        s.info[_TAKING] = True
        sql = _CHECK_SQLITE if s.get_bind().dialect.name == "sqlite" else _TAKE
        current = s.execute(sql, {"k": EPOCH_KEY}).scalar()
        epoch = int(current or 0) + 1
        repo.set_meta(s, EPOCH_KEY, str(epoch))
    return epoch


def current_epoch(sessions: sessionmaker[Session]) -> int:
    with transaction(sessions) as s:
        return int(repo.get_meta(s, EPOCH_KEY) or 0)


class Fence:
    """Checks, before each commit of `sessions`, that the store's epoch is still `epoch`."""

    def __init__(self, epoch: int, on_fenced: Callable[[str], None] = lambda why: None) -> None:
        """`on_fenced(why)` is told the first time a commit is refused (the daemon stops acting at once)."""
        self.epoch = epoch
        self._on_fenced = on_fenced
        self._told = False

    def install(self, sessions: sessionmaker[Session]) -> None:
        event.listen(sessions, "before_commit", self._check)

    def take(self, epoch: int) -> None:
        """This daemon leads again (it took the lock back), as `epoch`."""
        self.epoch = epoch
        self._told = False

    def _check(self, session: Session) -> None:
        if session.info.pop(_TAKING, False):
            return
        session.flush()  # the ORM's pending changes go out first: they are checked with the rest
        sql = _CHECK_SQLITE if session.get_bind().dialect.name == "sqlite" else _CHECK
        found = session.execute(sql, {"k": EPOCH_KEY}).scalar()
        if int(found or 0) == self.epoch:
            return
        why = (f"this daemon is no longer the store's leader (its epoch {self.epoch}, the store's {found}): another "
               "daemon took over; retry against it")
        if not self._told:
            self._told = True
            log.error("%s: a write was refused; stopping", why.split(":")[0])
            self._on_fenced(why)
        raise Fenced(why)
