"""The pools a create checks (its pool's access list, limits, root): read by the pools loop ahead of the creates
while they come, so that a create does not wait for that read itself, and still never older than POOLS_TTL_S (a
pool's new access list or limit applies to creates within that bound). SQLite and PostgreSQL."""

from __future__ import annotations

import time
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from peloton.domain.model import ResourcePool
from peloton.jobmgr import manager
from peloton.jobmgr.manager import POOLS_AHEAD_S, POOLS_TTL_S, JobManager
from peloton.store import db, repo


class _Clock:
    """`time` for the manager's module, with a monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many times the pools were read from the store."""
    n = [0]
    real = repo.list_pools

    def counted(s: Session) -> list[ResourcePool]:
        n[0] += 1
        return real(s)

    monkeypatch.setattr(repo, "list_pools", counted)
    return n


def _pool(path: str, submitters: tuple[str, ...] = ()) -> ResourcePool:
    return ResourcePool(path=path, submitters=submitters)


def test_while_creates_come_the_loop_reads_the_pools_ahead_of_them(sessions: sessionmaker[Session],
                                                                   reads: list[int],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    clock = _Clock()
    monkeypatch.setattr(manager, "time", clock)
    with db.transaction(sessions) as s:
        repo.ensure_root_pool(s, 0.0)
        repo.create_pool(s, _pool("/team", ("alice",)))
    jm = JobManager(sessions, sessions, None, None)  # type: ignore[arg-type]  # pools come from the store only

    assert jm.access_list("/team") == ("/team", ("alice",)) and reads == [1]  # nothing read yet: the create reads
    assert jm.read_pools_ahead() is False and reads == [2]  # a create looked: the loop reads them again
    assert jm.read_pools_ahead() is False and reads == [2]  # none since: an idle daemon reads nothing

    # creates keep coming: each pass of the loop after one reads ahead (the first follows none), and no create
    # reads the pools itself, however long the creates go on
    for _ in range(6):
        clock.now += POOLS_AHEAD_S
        jm.read_pools_ahead()
        clock.now += POOLS_AHEAD_S / 2
        jm.access_list("/team")
    assert reads == [7]

    # a new access list reaches the creates by the loop's next pass, without a create's read
    with db.transaction(sessions) as s:
        repo.update_pool(s, _pool("/team", ("alice", "bob")))
    clock.now += POOLS_AHEAD_S
    jm.read_pools_ahead()
    assert jm.access_list("/team") == ("/team", ("alice", "bob")) and reads == [8]


def test_a_create_still_reads_a_copy_past_the_bound_or_a_pool_it_does_not_know(sessions: sessionmaker[Session],
                                                                               reads: list[int],
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    clock = _Clock()
    monkeypatch.setattr(manager, "time", clock)
    with db.transaction(sessions) as s:
        repo.ensure_root_pool(s, 0.0)
    jm = JobManager(sessions, sessions, None, None)  # type: ignore[arg-type]
    assert jm.access_list("/") == ("", ()) and reads == [1]
    clock.now += POOLS_TTL_S / 2
    assert jm.access_list("/") == ("", ()) and reads == [1]  # young enough
    # after a quiet spell (the loop read nothing: no create looked), the first create reads them itself
    clock.now += POOLS_TTL_S
    assert jm.access_list("/") == ("", ()) and reads == [2]
    # a pool just created is read at once, whatever the copy's age
    with db.transaction(sessions) as s:
        repo.create_pool(s, _pool("/new", ("carol",)))
    assert jm.access_list("/new") == ("/new", ("carol",)) and reads == [3]
