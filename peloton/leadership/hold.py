"""This process's hold on what it acts on, taken at start and kept: its data dir (one daemon per data dir: its local
backend's tasks are that daemon's) and the locks of its roles in the store (lock.py), or, with --standby, the wait
for them while serving redirects to the leader (standby.py); then the epochs that fence its commits (fence.py) and
the guard that watches the locks (guard.py). What the components do when the hold is lost or regained is the
daemon's business (server.py passes it in); this module knows no component."""

from __future__ import annotations

import fcntl
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import IO, Protocol

import grpc
from sqlalchemy.orm import Session, sessionmaker

from peloton.api.cluster import Leader, Leadership
from peloton.errors import FailedPrecondition
from peloton.files import create_private, private_dir, tasks_run_as_others
from peloton.leadership.fence import EPOCH_KEY, Fence, take_epochs
from peloton.leadership.guard import StoreGuard
from peloton.leadership.lock import (
    OWNER_KEY,
    ROLE_KEYS,
    StoreLock,
    refusal,
    role_leaders,
    session_name,
    standbys,
    store_lock,
)
from peloton.leadership.owner import Owner
from peloton.leadership.standby import StandbyServer, adoption_refusal, data_dir_id, machine_id
from peloton.store import db, repo

log = logging.getLogger("peloton.server")  # (the daemon's start-up story, in one logger)

_ROLE_ORDER = tuple(ROLE_KEYS)  # jobmgr, resmgr, placement, hostmgr (the daemon's roles, settings.ROLE_ORDER)
_ROLES = frozenset(_ROLE_ORDER)
STANDBY_POLL_S = 0.5  # how often a standby tries the locks (and ends a silent leader's lease)


class Settings(Protocol):
    """What of the daemon's settings (settings.ServerConfig) the hold reads."""

    listen: str
    advertise_address: str
    data_dir: Path
    db_url: str | None
    roles: frozenset[str]
    leader_lease_s: float
    standby: bool
    backend: str


class Hold:
    def __init__(self, cfg: Settings, stopped: threading.Event,
                 credentials: Callable[[], grpc.ServerCredentials | None] = lambda: None,
                 on_fenced: Callable[[str], None] = lambda why: None) -> None:
        """`stopped`: set when the daemon stops (a standby stops waiting); `credentials()`: the public port's TLS,
        for what a standby serves meanwhile; `on_fenced(why)`: a commit found that another process took over."""
        self.cfg = cfg
        self._stopped = stopped
        self._credentials = credentials
        self._on_fenced = on_fenced
        self.store_lock: StoreLock | None = None
        self.session = ""  # the application_name of this process's store connections
        self.owner: Owner  # who this process records itself as: set once it tries the locks
        self.fence: Fence | None = None
        self.guard: StoreGuard | None = None
        self._fenced_at: float | None = None  # a commit found a newer epoch (until the locks are ours again)
        self.standby_listen = ""  # where it answered while standing by (served again once it leads)
        self._lock_file: IO[str] | None = None

    def _try_lock_data_dir(self) -> bool:
        """One daemon per data dir (its local backend's tasks are that daemon's). The data dir is owner-only
        (files.py)."""
        if self._lock_file is None:
            private_dir(self.cfg.data_dir, traversable=tasks_run_as_others())
            # (owner-only from the start: files.py) held for the daemon's lifetime
            self._lock_file = os.fdopen(create_private(self.cfg.data_dir / "daemon.lock"), "w")
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False

    def _data_dir_refusal(self) -> FailedPrecondition:
        return FailedPrecondition(
            f"another peloton daemon is running with data dir {self.cfg.data_dir}; stop it first, or start this one "
            "with --standby to take over when it goes", field="--data-dir")

    def lock_data_dir(self) -> None:
        """A process without the job manager (no store lock): the data dir alone; a standby waits for it."""
        if self._try_lock_data_dir():
            return
        if not self.cfg.standby:
            raise self._data_dir_refusal()
        print(f"peloton: standing by: another daemon uses data dir {self.cfg.data_dir}", flush=True)
        while not self._try_lock_data_dir():
            if self._stopped.wait(1.0):
                raise FailedPrecondition("stopped while standing by")

    def advertise(self, listen: str) -> str:
        if self.cfg.advertise_address:
            return self.cfg.advertise_address
        host, port = listen.rpartition(":")[0], listen.rpartition(":")[2]
        if host in ("0.0.0.0", "", "[::]", "::"):
            host = socket.getfqdn()
        return f"{host}:{port}"

    def take_store_lock(self, url: str) -> None:
        """Only one daemon acts on a store (and on a data dir): take both locks, or refuse to start naming the
        holder, or (--standby) serve redirects to the holder until it goes, then take over. On PostgreSQL the
        store's locks are the roles' (one for each role this process runs, all of them or none): a `--role`
        process and its standbys share its roles' locks, not the others'."""
        cfg = self.cfg
        self.session = session_name()
        lock = store_lock(url, self.session, tuple(cfg.roles))
        have_dir = self._try_lock_data_dir()
        self.owner = Owner.me(self.advertise(cfg.listen), self.session, cfg.leader_lease_s, **self._what_it_runs())
        if have_dir and lock.try_acquire(self.owner):
            self.store_lock = lock
            return
        if not cfg.standby:
            holder = lock.holder() if have_dir else None
            lock.release()
            raise refusal(holder, db.describe(url)) if have_dir else self._data_dir_refusal()
        self._refuse_if_cannot_adopt(lock)
        self._stand_by(lock, url, have_dir)
        self.store_lock = lock

    def _what_it_runs(self) -> dict[str, str]:
        """What a standby must share with this daemon to adopt its tasks, recorded with it as the lock's holder
        (standby.adoption_refusal): its host manager's backend and, on the local backend, its machine and data
        dir."""
        cfg = self.cfg
        if "hostmgr" not in cfg.roles:
            return {}
        if cfg.backend != "local":
            return {"backend": cfg.backend}
        return {"backend": cfg.backend, "machine": machine_id(), "data_dir": str(cfg.data_dir.resolve()),
                "data_dir_id": data_dir_id(cfg.data_dir)}

    def _refuse_if_cannot_adopt(self, lock: StoreLock) -> None:
        """A standby that could not adopt the tasks of the host manager's leader (on the local backend: another
        machine, another data dir) refuses to stand by, naming why: taking over would run their gangs again while
        the leader's processes, if it is only paused, still run."""
        refused = adoption_refusal(self.owner, lock.holder("hostmgr") if self.owner.backend else None)
        if refused is not None:
            lock.release()
            raise refused

    def _stand_by(self, lock: StoreLock, url: str, have_dir: bool) -> None:
        """Serve the API's port with redirects to the leader (standby.py) until both locks are ours."""
        cfg = self.cfg
        what = db.describe(url)
        acts = "acts on"
        if cfg.roles != _ROLES:  # a --role process waits for its roles' leader, not the store's
            acts = f"leads {'/'.join(r for r in _ROLE_ORDER if r in cfg.roles)} on"
        leader: list[Owner | None] = [lock.holder()]  # read here only: the lock's connection is not shared
        standby = StandbyServer(cfg.listen, lambda: leader[0], self._credentials())
        self.standby_listen = standby.listen
        self.owner = replace(self.owner, address=self.advertise(standby.listen))
        lock.announce_standby(self.owner.address)
        holder = leader[0]
        who = holder.describe() if holder is not None else (
            "another daemon" if have_dir else f"another daemon with data dir {cfg.data_dir}")
        print(f"peloton: standing by: {who} {acts} {what}; answering on {standby.listen} with its address",
              flush=True)
        log.warning("standing by: %s %s %s; taking over when it goes", who, acts, what)
        try:
            while True:
                have_dir = have_dir or self._try_lock_data_dir()
                if have_dir:
                    self._refuse_if_cannot_adopt(lock)  # again: another leader may have taken over meanwhile
                if have_dir and lock.try_acquire(self.owner):
                    break
                leader[0] = lock.holder()
                if self._stopped.wait(STANDBY_POLL_S):
                    lock.release()
                    raise FailedPrecondition("stopped while standing by")
        finally:
            standby.stop()
        log.warning("took over the %s lock%s of %s", "store" if cfg.roles == _ROLES else "/".join(
            r for r in _ROLE_ORDER if r in cfg.roles), "s" if 1 < len(cfg.roles) < len(_ROLES) else "", what)

    def report(self, read_sessions: sessionmaker[Session] | None) -> Leadership | None:
        """Who leads the store (this daemon, or the one that took over from it), its epoch, and the standbys."""
        if self.store_lock is None:
            return None
        if read_sessions is None:  # a --role placement or hostmgr process that leads with a lock but has no store
            me = _shown(self.owner)
            return Leadership(me, 0, [], [(r, me, 0.0) for r in sorted(self.cfg.roles)])
        sqlite = db.sqlite_path(self.cfg.db_url or db.default_sqlite_url(self.cfg.data_dir)) is not None
        with db.transaction(read_sessions) as s:
            # SQLite: one daemon, this one (its lock file, not the store, says who holds the lock)
            leader = self.owner if sqlite else Owner.from_json(repo.get_meta(s, OWNER_KEY))
            epoch = 0 if sqlite else int(repo.get_meta(s, EPOCH_KEY) or 0)  # (no one to fence on SQLite)
            waiting = [] if sqlite else standbys(s)
            roles = [] if sqlite else role_leaders(s)
        return Leadership(_shown(leader) if leader else None, epoch, waiting,
                          [(r, _shown(o), q) for r, o, q in roles])

    def _fenced(self, why: str) -> None:
        """A commit found a newer epoch: another daemon leads. Stop acting now; the store guard finds the lock
        gone and stands by."""
        self._fenced_at = time.monotonic()
        self._on_fenced(why)

    def leads(self) -> bool:
        """This process acts for its roles: it holds their locks (none to hold on SQLite without the job
        manager), has not been replaced, and renewed its lease recently (a paused process stops at once)."""
        guard, lock = self.guard, self.store_lock
        return guard is None or (guard.acting and self._fenced_at is None and (lock is None or lock.fresh()))

    def leader(self) -> Owner | None:
        return self.guard.leader if self.guard is not None else None

    def serving_at(self, address: str) -> None:
        """The address refused daemons and standbys name is the one served (once the ports are bound)."""
        if self.store_lock is not None:
            self.owner = replace(self.owner, address=self.advertise(address))
            self.store_lock.record(self.owner)

    def record(self) -> None:
        """Say who holds the locks again, now the store's tables exist (a new database)."""
        if self.store_lock is not None:
            self.store_lock.record(self.owner)

    def fence_commits(self, sessions: sessionmaker[Session], postgres: bool) -> None:
        """Every commit of this process checks that no other has taken over since (fence.py)."""
        if self.store_lock is None:
            return
        roles = self.cfg.roles
        self.fence = Fence(take_epochs(sessions, roles), self._fenced)
        self.fence.install(sessions)
        if postgres:
            log.info("leading %s as epoch %d", "the store" if "jobmgr" in roles else "/".join(sorted(roles)),
                     self.fence.epoch)
        else:  # (cluster info shows no epoch there either)
            log.info("leading the store (SQLite: this daemon alone, its data dir's lock held)")

    def watch(self, read_sessions: sessionmaker[Session] | None, on_lost: Callable[[str, str], None],
              on_regained: Callable[[], None], on_change: Callable[[], None]) -> StoreGuard | None:
        """The locks of this process's roles, watched (guard.py; run by the daemon's `store` loop): it stops acting
        when they are lost or taken over, and recovers when they are its own again. None without locks."""
        if self.store_lock is None:
            return None
        self.guard = StoreGuard(self.store_lock, read_sessions, self.owner, on_lost, on_regained, on_change)
        return self.guard

    def regained(self, sessions: sessionmaker[Session] | None, store: bool) -> None:
        """The roles' locks are ours again: the next epochs are this process's (`store`: it runs the job
        manager, which leads the store)."""
        if self.fence is not None:
            assert sessions is not None
            self.fence.take(take_epochs(sessions, self.cfg.roles))
            self._fenced_at = None
            log.warning("leading %s again as epoch %d", "the store" if store else
                        "/".join(sorted(self.cfg.roles)), self.fence.epoch)

    def release_store_lock(self) -> None:
        if self.store_lock is not None:
            self.store_lock.release()

    def release_data_dir(self) -> None:
        """Last at stop: the data dir is free for a standby on this machine, or a restart."""
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None


def _shown(o: Owner) -> Leader:
    """What callers are told of a lock's holder (`peloton cluster info`)."""
    return Leader(o.address, o.host, o.pid, o.since, o.lease)
