"""The placement engine between a real resmgr and a real host manager (over a fake backend), spoken to over real
gRPC (the typed clients of a split deployment) and in one process (the in-process clients): placements are claimed and handed to resmgr, and the claim of a placement resmgr dropped before jobmgr took
it (job stopped, resmgr reset) is released before the next claims instead of holding the hosts until it expires."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from peloton.domain.model import ResourcePool
from peloton.domain.placement import GangRequest, MemberRequest
from peloton.domain.resources import Resources
from peloton.hostmgr.inprocess import InProcessHostManager
from peloton.hostmgr.manager import HostManager
from peloton.placement.engine import PlacementEngine
from peloton.resmgr.inprocess import InProcessResourceManager
from peloton.resmgr.manager import ResourceManager
from tests.unit.internal_services import resmgr_and_hostmgr_clients
from tests.unit.test_hostmgr_manager import FakeBackend

SHORT = 0.05


def gang(job: str, n: int = 2) -> GangRequest:
    """A gang that takes both GPUs of both hosts of the fake backend (n=2: each member takes 2 GPUs)."""
    r = Resources(cpu=1, mem=10, gpu=2)
    return GangRequest(gang_id=f"{job}/0", job_id=job, attempt=1,
                       members=tuple(MemberRequest(i, f"{job}-{i}-1", r) for i in range(n)))


@pytest.fixture(params=["grpc", "inprocess"])
def parts(request: pytest.FixtureRequest) -> Iterator[tuple[PlacementEngine, ResourceManager, HostManager]]:
    rm = ResourceManager(lambda: [ResourcePool("/")], clock=lambda: 1000.0)
    hm = HostManager(FakeBackend(), clock=lambda: 1000.0, claim_ttl_s=3600)  # claims never expire here
    hm.start()
    try:
        with resmgr_and_hostmgr_clients(request.param, rm, hm) as (rmc, hmc):
            yield PlacementEngine(rmc, hmc, poll_ms=50), rm, hm
    finally:
        hm.stop()


def test_a_gang_is_placed_claimed_and_handed_to_resmgr(
        parts: tuple[PlacementEngine, ResourceManager, HostManager]) -> None:
    engine, rm, hm = parts
    rm.enqueue([gang("a")])
    assert engine.run_once()
    (p,), _ = rm.take_placements(10, SHORT)
    assert p.gang_id == "a/0" and sorted(m.gpu_ids for m in p.members) == [(0, 1), (0, 1)]
    assert hm.held_hosts() == {"h1", "h2"}


@pytest.mark.parametrize("drop", ["job stopped", "resmgr reset"])
def test_the_claim_of_a_dropped_placement_is_released_before_the_next_claims(
        parts: tuple[PlacementEngine, ResourceManager, HostManager], drop: str) -> None:
    engine, rm, hm = parts
    rm.enqueue([gang("a")])
    assert engine.run_once()  # placed and claimed: every GPU of the cluster; READY in resmgr
    if drop == "job stopped":
        rm.remove([("a/0", 1)])
    else:
        rm.reset()  # the daemon regained the store; its recovery enqueues what is still queued
    rm.enqueue([gang("b")])
    assert engine.run_once()
    placed, pending = rm.take_placements(10, SHORT)
    assert [p.gang_id for p in placed] == ["b/0"] and pending == []  # not refused: a's claim was released
    assert hm.held_hosts() == {"h1", "h2"}  # by b's claim alone
    assert rm.take_orphaned_claims() == []


def test_a_round_with_only_orphaned_claims_releases_them(
        parts: tuple[PlacementEngine, ResourceManager, HostManager]) -> None:
    engine, rm, hm = parts
    rm.enqueue([gang("a")])
    assert engine.run_once()
    rm.remove([("a/0", 1)])
    assert engine.run_once()  # no gangs to place, but work was done
    assert hm.held_hosts() == set()
    assert not engine.run_once()  # an idle round


def test_a_gang_waiting_for_hosts_counts_once_as_unplaced_however_often_it_is_tried(
        parts: tuple[PlacementEngine, ResourceManager, HostManager]) -> None:
    """peloton_placement_gangs_total counts gang attempts; peloton_placement_tries_total every try of a round."""
    from prometheus_client import REGISTRY

    def sample(name: str, result: str) -> float:
        return REGISTRY.get_sample_value(name, {"result": result}) or 0.0

    before = {(n, r): sample(n, r) for n in ("peloton_placement_gangs_total", "peloton_placement_tries_total")
              for r in ("placed", "unplaced")}

    def counted(name: str, result: str) -> float:
        return sample(name, result) - before[(name, result)]

    engine, rm, _ = parts
    one_gpu = Resources(cpu=1, mem=10, gpu=1)
    rm.enqueue([GangRequest(gang_id="a/0", job_id="a", attempt=1, strategy="spread",  # a GPU of each host
                            members=tuple(MemberRequest(i, f"a-{i}-1", one_gpu) for i in range(2)))])
    assert engine.run_once()
    rm.enqueue([gang("b", n=1)])  # 2 GPUs on one host: the cluster has them, no host does
    now = 1000.0
    for _ in range(3):
        rm.clock = lambda t=now: t  # type: ignore[misc]  # past the back-off of a failed placement
        assert engine.run_once()
        now += 5
    assert counted("peloton_placement_tries_total", "unplaced") == 3
    assert counted("peloton_placement_gangs_total", "unplaced") == 1
    assert counted("peloton_placement_gangs_total", "placed") == 1  # a
    rm.remove([("a/0", 1)])
    rm.clock = lambda: now
    assert engine.run_once()
    placed, _ = rm.take_placements(10, SHORT)
    assert [p.gang_id for p in placed] == ["b/0"]  # once a went away
    assert counted("peloton_placement_gangs_total", "placed") == 2  # placed after waiting: in both
    assert counted("peloton_placement_gangs_total", "unplaced") == 1


@pytest.mark.parametrize("order", ["backfill", "fifo"])
def test_under_fifo_no_gang_behind_one_that_does_not_fit_is_placed_across_rounds(order: str) -> None:
    """a takes one host; big wants both; small would fit on the other. Backfill places small around big; fifo
    places nothing behind big, in this round or the next ones (resmgr admits nothing behind it), until big runs."""
    clock = [1000.0]
    rm = ResourceManager(lambda: [ResourcePool("/")], clock=lambda: clock[0], rate_clock=lambda: clock[0],
                         placement_order=order)
    hm = HostManager(FakeBackend(), clock=lambda: clock[0], claim_ttl_s=3600)
    hm.start()
    try:
        engine = PlacementEngine(InProcessResourceManager(rm), InProcessHostManager(hm), poll_ms=0,
                                 clock=lambda: clock[0], order=order)
        rm.enqueue([gang("a", 1), gang("big", 2), gang("small", 1)])  # queue order a, big, small (by gang id)
        assert engine.run_once()
        placed, waiting = rm.take_placements(10, 0)
        why = {f.gang_id: f.reason for f in waiting}
        if order == "backfill":
            assert sorted(p.gang_id for p in placed) == ["a/0", "small/0"]
            return
        assert [p.gang_id for p in placed] == ["a/0"]
        assert why["small/0"].startswith("waiting behind gang big/0 (pool /)")
        for _ in range(3):  # later rounds: big is tried alone, small is not even handed out
            clock[0] += 2.0
            engine.run_once()
            assert rm.take_placements(10, 0)[0] == []
            assert [g.gang_id for g in rm.queue()[0] if g.state == "placing"] == []
        rm.remove([("a/0", 1)])  # a goes away (jobmgr took its placement: it releases the claim): big fits
        hm.release_claims([("a/0", 1)])
        clock[0] += 2.0
        assert engine.run_once()
        placed, _ = rm.take_placements(10, 0)
        assert [p.gang_id for p in placed] == ["big/0"]
        clock[0] += 2.0
        engine.run_once()  # small's turn now, and no host is left for it
        assert rm.take_placements(10, 0)[0] == []
        assert [(g.gang_id, g.state) for g in rm.queue()[0]] == [("small/0", "waiting")]
    finally:
        hm.stop()


def test_the_placement_order_is_checked() -> None:
    rm = ResourceManager(lambda: [ResourcePool("/")])
    hm = HostManager(FakeBackend(), claim_ttl_s=3600)
    with pytest.raises(ValueError, match="order: must be one of backfill, fifo, got 'random'"):
        PlacementEngine(InProcessResourceManager(rm), InProcessHostManager(hm), order="random")


@pytest.mark.parametrize("via", ["grpc", "inprocess"])
def test_the_engine_places_by_the_resource_managers_order_whatever_its_own(via: str,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    """A split deployment whose placement process was given backfill, beside a resmgr on fifo: fifo it is (else
    the engine would place small around big, which resmgr's admission then holds behind big), and it says so."""
    rm = ResourceManager(lambda: [ResourcePool("/")], clock=lambda: 1000.0, placement_order="fifo")
    hm = HostManager(FakeBackend(), clock=lambda: 1000.0, claim_ttl_s=3600)
    hm.start()
    try:
        with resmgr_and_hostmgr_clients(via, rm, hm) as (rmc, hmc):
            engine = PlacementEngine(rmc, hmc, poll_ms=0, order="backfill")
            rm.enqueue([gang("a", 1), gang("big", 2), gang("small", 1)])
            with caplog.at_level("WARNING", logger="peloton.placement.engine"):
                assert engine.run_once()
                engine.run_once()
            placed, _ = rm.take_placements(10, 0)
            assert [p.gang_id for p in placed] == ["a/0"] and engine.order == "fifo"
            said = [r.getMessage() for r in caplog.records if "placement-order" in r.getMessage()]
            assert len(said) == 1 and "backfill given, but the resource manager places by fifo" in said[0]
    finally:
        hm.stop()


def test_a_busy_engine_syncs_the_hosts_once_a_round(parts: tuple[PlacementEngine, ResourceManager, HostManager]) -> None:
    """SyncHosts before the dequeue (the capacity resmgr divides) only when the last sync is older than a poll: a
    round right after another syncs once, inside the round; the first round, and one after a quiet poll, twice."""
    engine, rm, _ = parts
    engine.poll_ms = 60_000  # no round here waits: each finds a gang queued
    calls: list[int] = []
    sync = engine.hostmgr.sync_hosts

    def counted(since_version: int, stream_id: str = "", timeout_s: float = 30,  # type: ignore[no-untyped-def]
                idle: bool = False):
        calls.append(since_version)
        return sync(since_version, stream_id, timeout_s, idle)

    engine.hostmgr.sync_hosts = counted  # type: ignore[method-assign]
    one_gpu = Resources(cpu=1, mem=10, gpu=1)
    for i, expected in enumerate((2, 1, 2)):
        if i == 2:
            engine._synced_at -= 61  # a poll went by since the last sync
        rm.enqueue([GangRequest(gang_id=f"g{i}/0", job_id=f"g{i}", attempt=1,
                                members=(MemberRequest(0, f"g{i}-0-1", one_gpu),))])
        calls.clear()
        assert engine.run_once()
        assert len(calls) == expected, (i, calls)
    placed, _ = rm.take_placements(10, SHORT)
    assert sorted(p.gang_id for p in placed) == ["g0/0", "g1/0", "g2/0"]


def test_the_host_manager_hears_of_demand_only_while_resmgr_holds_gangs(
        parts: tuple[PlacementEngine, ResourceManager, HostManager]) -> None:
    """The engine syncs hosts every poll, busy or not. Demand (what makes a Mesos backend REVIVE, and its absence
    SUPPRESS offers after a while) is resmgr holding gangs: said with each dequeue, passed on with each sync."""
    engine, rm, hm = parts
    backend = hm.backend
    assert isinstance(backend, FakeBackend)
    engine.run_once()  # the first sync: demand (resmgr has not said yet that it holds nothing)
    engine.run_once()
    idle_since = backend.demanded
    for _ in range(3):
        assert not engine.run_once()  # idle polls, each with a sync
    assert backend.demanded == idle_since
    rm.enqueue([gang("a")])
    assert engine.run_once()
    assert backend.demanded > idle_since
    (p,), _ = rm.take_placements(10, SHORT)  # placed, not launched: still held by resmgr
    engine.run_once()
    still = backend.demanded
    engine.run_once()
    assert backend.demanded > still
    rm.ack_placements([(p.gang_id, p.attempt)], [])  # launched: resmgr holds nothing
    engine.run_once()
    idle_again = backend.demanded
    for _ in range(3):
        engine.run_once()
    assert backend.demanded == idle_again
