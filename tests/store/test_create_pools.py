"""Which pools a create judges by (JobManager._pools): where the resource manager runs in the same process, the
pools it holds, which it reads again after each pool write, so nothing is read from the store on a create's way;
otherwise (a split deployment) the store's, read at most every POOLS_TTL_S and at once for a pool not among those
read. The real ResourceManager over a real store; SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import pytest
from prometheus_client import REGISTRY
from sqlalchemy.orm import Session, sessionmaker

from peloton.domain.model import ResourcePool
from peloton.jobmgr import manager as jobmgr
from peloton.jobmgr.manager import JobManager
from peloton.resmgr.inprocess import InProcessResourceManager
from peloton.resmgr.manager import ResourceManager
from peloton.store import db, repo


def _pool_reads() -> float:
    """Statements that read resource_pools, sent by anything in this process so far."""
    v = REGISTRY.get_sample_value("peloton_store_statement_targets_total", {"op": "SELECT", "table": "resource_pools"})
    return v or 0.0


def _write(sessions: sessionmaker[Session], pool: ResourcePool, update: bool = False) -> None:
    with db.transaction(sessions) as s:
        if update:
            repo.update_pool(s, pool)
        else:
            repo.create_pool(s, pool)


class _OtherProcess:
    """A resource manager client of a split deployment: resmgr's pools are in another process."""

    def held_pools(self) -> Mapping[str, ResourcePool] | None:
        return None


@pytest.fixture
def pools(sessions: sessionmaker[Session]) -> ResourcePool:
    with db.transaction(sessions) as s:
        repo.ensure_root_pool(s, 0.0)
    lab = ResourcePool(path="/lab", submitters=("alice",), created_at=0.0)
    _write(sessions, lab)
    return lab


def test_a_create_judges_by_the_pools_resmgr_holds_and_reads_none_itself(
        sessions: sessionmaker[Session], pools: ResourcePool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jobmgr, "POOLS_TTL_S", 0.0)  # a read of the store would be due at every create

    def load() -> list[ResourcePool]:
        with db.transaction(sessions) as s:
            return repo.list_pools(s)

    rm = ResourceManager(load)
    try:
        stub: Any = None  # the pools' checks call neither the host manager nor anything else of resmgr
        jm = JobManager(sessions, sessions, InProcessResourceManager(rm), stub)
        before = _pool_reads()
        for _ in range(3):
            assert jm.access_list("/lab") == ("/lab", ("alice",))
            assert not jm.root_allowed("/lab")
        assert _pool_reads() == before

        # a pool write (the servicer's): the store, then resmgr reads the pools again; the next create sees it
        _write(sessions, replace(pools, submitters=("bob",), allow_root=True), update=True)
        rm.refresh_pools()
        before = _pool_reads()
        assert jm.access_list("/lab") == ("/lab", ("bob",)) and jm.root_allowed("/lab")
        assert _pool_reads() == before

        # a pool resmgr has not read (being created as the create comes): the store is read for it
        _write(sessions, ResourcePool(path="/new", submitters=("carol",), created_at=0.0))
        before = _pool_reads()
        assert jm.access_list("/new") == ("/new", ("carol",))
        assert _pool_reads() == before + 1
    finally:
        rm.close()


def test_in_a_split_deployment_the_store_is_read_at_most_every_ttl(
        sessions: sessionmaker[Session], pools: ResourcePool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jobmgr, "POOLS_TTL_S", 3600.0)
    stub: Any = None
    jm = JobManager(sessions, sessions, _OtherProcess(), stub)  # type: ignore[arg-type]
    before = _pool_reads()
    assert jm.access_list("/lab") == ("/lab", ("alice",))
    assert jm.access_list("/lab") == ("/lab", ("alice",))
    assert _pool_reads() == before + 1  # read once, then kept

    _write(sessions, replace(pools, submitters=("bob",)), update=True)
    _write(sessions, ResourcePool(path="/new", created_at=0.0))
    before = _pool_reads()
    assert jm.access_list("/lab") == ("/lab", ("alice",))  # within the TTL: the copy read
    assert jm.access_list("/new") == ("", ())  # a pool not among those read: read at once (the others with it)
    assert jm.access_list("/lab") == ("/lab", ("bob",))
    assert _pool_reads() == before + 1

    monkeypatch.setattr(jobmgr, "POOLS_TTL_S", 0.0)
    _write(sessions, replace(pools, submitters=("carol",)), update=True)
    assert jm.access_list("/lab") == ("/lab", ("carol",))  # past the TTL: read again
