"""Concurrent changes of the pool tree over the public API (a real daemon in-process, real gRPC, SQLite and
PostgreSQL): each is checked against the tree as the other left it, never against the tree both read before
either wrote."""

from __future__ import annotations

import contextlib
import random
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from peloton.api.v1 import respool_pb2, respool_pb2_grpc
from peloton.domain.resources import Resources
from peloton.resmgr import service
from peloton.server import Daemon
from peloton.settings import ServerConfig
from tests.asroot import AS_ROOT_SETTINGS
from tests.dbutil import postgres_database

RPC_TIMEOUT = 15.0


@pytest.fixture(params=["sqlite", "postgresql"])
def pools(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[respool_pb2_grpc.ResourcePoolServiceStub]:
    with contextlib.ExitStack() as stack:
        url = f"sqlite:///{tmp_path}/p.db" if request.param == "sqlite" else stack.enter_context(postgres_database())
        d = Daemon(ServerConfig(listen="127.0.0.1:0", db_url=url, data_dir=tmp_path / "data", local_hosts=1,
                                local_host_resources=Resources(cpu=4, mem=4096, gpu=2),
                                local_port_base=random.randrange(42000, 58001, 2000), metrics_listen="",
                                **AS_ROOT_SETTINGS))
        address = d.start()
        stack.callback(d.stop)
        ch = grpc.insecure_channel(address)
        stack.callback(ch.close)
        yield respool_pb2_grpc.ResourcePoolServiceStub(ch)


def _pool(path: str, cpu: float = 0.0) -> respool_pb2.ResourcePool:
    p = respool_pb2.ResourcePool(path=path)
    p.reservation.cpu = cpu
    return p


def _both_check_then_write(monkeypatch: pytest.MonkeyPatch, calls: list[Callable[[], Any]]) -> list[Any]:
    """Run `calls` at once, each held after its tree check until the other has checked too (or 2 s passed: a store
    that serializes the two never lets the second check before the first commits)."""
    barrier = threading.Barrier(len(calls), timeout=2.0)
    real = service.check_pool

    def held(*a: Any, **kw: Any) -> list[str]:
        out = real(*a, **kw)
        with contextlib.suppress(threading.BrokenBarrierError):
            barrier.wait()
        return out

    monkeypatch.setattr(service, "check_pool", held)
    results: list[Any] = [None] * len(calls)

    def run(i: int) -> None:
        try:
            results[i] = calls[i]()
        except grpc.RpcError as e:
            results[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    monkeypatch.setattr(service, "check_pool", real)
    return results


def _reserved_by_children(pools: respool_pb2_grpc.ResourcePoolServiceStub, parent: str) -> float:
    listed = pools.ListPools(respool_pb2.ListPoolsRequest(), timeout=RPC_TIMEOUT).pools
    return sum(p.reservation.cpu for p in listed if p.path.rpartition("/")[0] == parent)


def test_two_concurrent_creates_cannot_together_reserve_more_than_the_parent(
        pools: respool_pb2_grpc.ResourcePoolServiceStub, monkeypatch: pytest.MonkeyPatch) -> None:
    pools.CreatePool(respool_pb2.CreatePoolRequest(pool=_pool("/team", cpu=10)), timeout=RPC_TIMEOUT)
    results = _both_check_then_write(monkeypatch, [
        lambda: pools.CreatePool(respool_pb2.CreatePoolRequest(pool=_pool("/team/a", cpu=6)), timeout=RPC_TIMEOUT),
        lambda: pools.CreatePool(respool_pb2.CreatePoolRequest(pool=_pool("/team/b", cpu=6)), timeout=RPC_TIMEOUT),
    ])
    refused = [r for r in results if isinstance(r, grpc.RpcError)]
    assert len(refused) == 1, results
    assert refused[0].code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused[0].details().startswith("pool.reservation.cpu: ")
    assert _reserved_by_children(pools, "/team") == 6


def test_a_parent_shrunk_while_a_child_is_created_is_checked_against_it(
        pools: respool_pb2_grpc.ResourcePoolServiceStub, monkeypatch: pytest.MonkeyPatch) -> None:
    pools.CreatePool(respool_pb2.CreatePoolRequest(pool=_pool("/team", cpu=10)), timeout=RPC_TIMEOUT)
    results = _both_check_then_write(monkeypatch, [
        lambda: pools.UpdatePool(respool_pb2.UpdatePoolRequest(pool=_pool("/team", cpu=2)), timeout=RPC_TIMEOUT),
        lambda: pools.CreatePool(respool_pb2.CreatePoolRequest(pool=_pool("/team/a", cpu=6)), timeout=RPC_TIMEOUT),
    ])
    assert sum(isinstance(r, grpc.RpcError) for r in results) == 1, results
    team = pools.GetPool(respool_pb2.GetPoolRequest(path="/team"), timeout=RPC_TIMEOUT).pool
    assert _reserved_by_children(pools, "/team") <= team.reservation.cpu

