"""The daemon's hold on its store, watched: whether the store answers, and whether this daemon still holds the
store lock (peloton/leadership/lock.py) and may act on it.

A daemon that loses the lock (PostgreSQL restarted or unreachable, the lock's connection cut) stops acting at once:
its job manager refuses every change (UNAVAILABLE) until the lock is taken again, and then it recovers exactly as
after a restart (whatever another daemon may have done meanwhile is read back from the store and the backend) before
it acts again. A daemon whose store is down stays NOT_SERVING until it answers again; nothing is lost meanwhile:
status updates wait in the host manager unacknowledged, placements go back to their queue.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from prometheus_client import Gauge
from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

from peloton.leadership.lock import StoreLock
from peloton.leadership.owner import Owner
from peloton.store.db import transaction

log = logging.getLogger(__name__)

LEADER = Gauge("peloton_leader", "1 while this process leads for the role: while it holds the role's lock and acts "
               "(a process leads all its roles or none; one without a lock, on SQLite, once it serves); 0 standing by",
               ["role"])


class StoreGuard:
    def __init__(self, lock: StoreLock, sessions: sessionmaker[Session] | None, owner: Owner,
                 on_lost: Callable[[str, str], None], on_regained: Callable[[], None],
                 on_change: Callable[[], None] = lambda: None) -> None:
        """`on_lost(why, leader)` stops acting (`leader`: the address of the daemon that acts instead, once
        known); `on_regained()` recovers and acts again (if it raises, it is tried again later); `on_change()` is
        told whenever `healthy` may have changed. `sessions` None: a process with no store but the lock's (a
        placement process): the lock's renewal is its only contact with the store."""
        self.lock = lock
        self.sessions = sessions
        self.owner = owner
        self._on_lost = on_lost
        self._on_regained = on_regained
        self._on_change = on_change
        self.locked = True  # the daemon starts only once it holds the lock
        self.acting = True
        self.store_ok = True
        self._leader: Owner | None = None  # who took the lock from this daemon, last time it looked

    @property
    def healthy(self) -> bool:
        return self.acting and self.store_ok

    @property
    def leader(self) -> Owner | None:
        """Who acts instead of this process (None while it acts, or before it knows)."""
        return None if self.acting else self._leader

    def run_once(self) -> bool:
        """One round of the `loop-store` thread, the only writer of this guard's state (others read its flags,
        each replaced whole): no lock, so none is held across the ping, the lock's renewal or a recovery."""
        before = self.healthy
        # the lease first: a renewal must not wait behind a slow ping (launches stop when it is late)
        if self.locked and not self.lock.held():
            self.locked = False
        self.store_ok = self._ping()
        if self.acting and not self.locked:
            self.acting = False
            why = "this daemon lost its hold on the store (its lock's connection went away); retry later"
            log.error("%s: stopped acting until it holds the store lock again", why.split(";")[0])
            self._on_lost(why, "")
        if not self.locked and self.store_ok:
            self.locked = self.lock.try_acquire(self.owner)
            if not self.locked:
                self._another_leads(self.lock.holder())
        if self.locked and not self.acting and self.store_ok:
            try:
                self._on_regained()
                self.acting = True
                self._leader = None
                log.warning("this daemon holds the store lock again: recovered, acting")
            except Exception:  # noqa: BLE001 - tried again on the next round
                log.exception("recovery after regaining the store lock failed; trying again")
        changed = before != self.healthy
        if changed:
            self._on_change()
        return False

    def _another_leads(self, holder: Owner | None) -> None:
        """Another daemon holds the lock: this one stands by, and sends callers there."""
        if holder is None or (holder.host, holder.pid) == (self.owner.host, self.owner.pid) or holder == self._leader:
            return
        self._leader = holder
        log.warning("the store lock is held by %s: standing by", holder.describe())
        self._on_lost(f"this daemon is standing by; the leader is {holder.address} ({holder.describe()})",
                      holder.address)

    def _ping(self) -> bool:
        if self.sessions is None:
            return True
        try:
            with transaction(self.sessions) as s:
                s.execute(text("SELECT 1"))
            return True
        except Exception as e:  # noqa: BLE001 - any failure means the store does not answer
            if self.store_ok:
                log.error("the store does not answer: %s", e)
            return False
