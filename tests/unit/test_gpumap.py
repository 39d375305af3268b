"""The hosts map's words (domain/gpumap.py), ListHosts' filters and pages and the summary's sums
(hostmgr/listing.py), and the stage latencies' quantiles (observability/gang_metrics.py): pure."""

from __future__ import annotations

import math

import pytest

from peloton.domain import gpumap
from peloton.domain.gpumap import GpuAsk, Waiting
from peloton.domain.launch import HostInfo
from peloton.domain.resources import Resources
from peloton.domain.spec import Constraint
from peloton.hostmgr import listing
from peloton.observability.gang_metrics import quantile

CAP = Resources(cpu=16, mem=65536, disk=0, gpu=4)


def host(name: str, rack: str, gpus_used: dict[int, str], *, cpu: float = 1, state: str = "UP",
         labels: dict[str, str] | None = None) -> HostInfo:
    return HostInfo(name, "127.0.0.1", CAP, Resources(cpu=cpu * len(gpus_used), mem=1024, gpu=len(gpus_used)),
                    labels={"rack": rack, **(labels or {})}, state=state,
                    task_ids=tuple(sorted(set(gpus_used.values()))), gpu_ids=(0, 1, 2, 3),
                    gpu_holders=tuple(gpus_used.items()))


def test_a_host_status_prefers_the_drain_then_health_then_the_backend() -> None:
    assert gpumap.host_status("drained", "unhealthy for 30s", "LOST") == "drained"
    assert gpumap.host_status("", "unhealthy for 30s", "LOST") == "unhealthy"
    assert gpumap.host_status("", "", "LOST") == "down"
    assert gpumap.host_status("", "", "UP") == "up"


def test_free_gpus_are_stranded_only_while_some_gang_asks_for_gpus_and_none_fits() -> None:
    free = Resources(cpu=8, mem=4096, gpu=1)
    two = GpuAsk(Resources(cpu=1, mem=1024, gpu=2))
    one = GpuAsk(Resources(cpu=1, mem=1024, gpu=1))
    assert not gpumap.stranded("up", free, {}, False, ())  # nobody asks: idle, not stranded
    assert gpumap.stranded("up", free, {}, False, (two,))
    assert not gpumap.stranded("up", free, {}, False, (two, one))
    assert not gpumap.stranded("up", free, {}, True, (two,))  # reserved: not stranded
    assert not gpumap.stranded("draining", free, {}, False, (two,))
    assert not gpumap.stranded("up", Resources(cpu=8, mem=4096), {}, False, (two,))  # no free GPU
    # a gang that fits by GPUs but not by memory, or not by its constraints, cannot use the host either
    assert gpumap.stranded("up", free, {}, False, (GpuAsk(Resources(cpu=1, mem=8192, gpu=1)),))
    a100 = GpuAsk(Resources(cpu=1, mem=1024, gpu=1), (Constraint("gpu_model", "eq", "a100"),))
    assert gpumap.stranded("up", free, {"gpu_model": "t4"}, False, (a100,))
    assert not gpumap.stranded("up", free, {"gpu_model": "a100"}, False, (a100,))


def test_each_gpu_is_used_by_its_task_or_takes_the_hosts_word() -> None:
    slots = gpumap.gpu_slots((0, 1, 2, 3), 4, 2, {1: "j-0-1", 3: "k-0-1"}, "up", False, True)
    assert [(s.id, s.state, s.task_id) for s in slots] == [
        (0, "stranded", ""), (1, "used", "j-0-1"), (2, "stranded", ""), (3, "used", "k-0-1")]
    assert [s.state for s in gpumap.gpu_slots((0, 1), 2, 0, {}, "up", True, False)] == ["reserved"] * 2
    assert [s.state for s in gpumap.gpu_slots((0, 1), 2, 1, {0: "j-0-1"}, "drained", False, False)] == [
        "used", "drained"]
    # a backend that counts GPUs without ids (Mesos): positions, the first ones used, no task named
    assert [(s.id, s.state, s.task_id) for s in gpumap.gpu_slots((), 3, 1, {}, "up", False, False)] == [
        (0, "used", ""), (1, "free", ""), (2, "free", "")]


def test_rows_are_by_rack_then_name_and_filters_and_pages_hold() -> None:
    hosts = [(host("h3", "r1", {}), False), (host("h1", "r2", {0: "j-0-1"}), False),
             (host("h2", "r1", {0: "j-1-1", 1: "j-1-1", 2: "j-1-1"}), False),
             (host("h0", "", {}, labels={"gpu_model": "a100"}), False), (host("h4", "r2", {}, state="LOST"), False)]
    waiting = Waiting((GpuAsk(Resources(cpu=1, mem=1024, gpu=2)),), {"h3": "w/0"})
    rows = listing.rows(hosts, {"h1": 0.0}, {}, set(), waiting)
    assert [r.key for r in rows] == [("", "h0"), ("r1", "h2"), ("r1", "h3"), ("r2", "h1"), ("r2", "h4")]
    by = {r.info.hostname: r for r in rows}
    assert by["h1"].status == "draining" and by["h4"].status == "down" and by["h3"].reserved_for == "w/0"
    assert by["h2"].stranded and not by["h0"].stranded and not by["h3"].stranded
    assert [g.state for g in by["h2"].gpus()] == ["used", "used", "used", "stranded"]

    def names(f: listing.HostFilter, size: int = 0, after: tuple[str, str] | None = None) -> list[str]:
        return [r.info.hostname for r in listing.page(rows, f, size, after)[0]]

    assert names(listing.HostFilter(states=frozenset({"up"}))) == ["h0", "h2", "h3"]
    assert names(listing.HostFilter(rack="r2")) == ["h1", "h4"]
    assert names(listing.HostFilter(labels=(("gpu_model", "a100"),))) == ["h0"]
    assert names(listing.HostFilter(labels=(("gpu_model", None), ("rack", "")))) == ["h0"]
    assert names(listing.HostFilter(min_free_gpus=2)) == ["h0", "h3"]  # h1 draining, h4 down: not in service
    assert names(listing.HostFilter(name_contains="4")) == ["h4"]
    got, nxt, total = listing.page(rows, listing.HostFilter(), 2, None)
    assert [r.info.hostname for r in got] == ["h0", "h2"] and nxt == ("r1", "h2") and total == 5
    assert names(listing.HostFilter(), 2, nxt) == ["h3", "h1"]
    last, end, _ = listing.page(rows, listing.HostFilter(), 2, ("r2", "h1"))
    assert [r.info.hostname for r in last] == ["h4"] and end is None
    # a host gone since the token was given: the page goes on after where it was
    assert names(listing.HostFilter(), 1, ("r1", "h25")) == ["h3"]

    s = listing.summarize(rows)
    assert s.hosts == 5 and s.racks == 3 and s.host_states == {"up": 3, "draining": 1, "down": 1}
    assert s.capacity.gpu == 20 and s.allocated.gpu == 4
    assert s.gpus == {"used": 4, "free": 4, "stranded": 1, "reserved": 4, "draining": 3, "down": 4}
    flat: dict[str, int] = {}
    for r in rows:
        gpumap.count_states(r.gpus(), flat)
    assert flat == s.gpus


@pytest.mark.parametrize(("buckets", "q", "want"), [
    ([], 0.5, 0.0),
    ([(1.0, 0.0), (math.inf, 0.0)], 0.5, 0.0),
    ([(1.0, 10.0), (2.0, 10.0), (math.inf, 10.0)], 0.5, 0.5),  # within the first bucket, from 0
    ([(1.0, 0.0), (2.0, 10.0), (math.inf, 10.0)], 0.95, 1.95),
    ([(1.0, 5.0), (2.0, 5.0), (math.inf, 10.0)], 0.99, 2.0),  # past the last finite bound: that bound
])
def test_quantiles_from_buckets_as_prometheus_estimates_them(buckets: list[tuple[float, float]], q: float,
                                                            want: float) -> None:
    assert quantile(buckets, q) == pytest.approx(want)


def test_a_hosts_info_is_kept_until_the_host_changes() -> None:
    from peloton.domain.launch import RunningTask
    from peloton.hostmgr.usage import HostConfig, HostUsage

    h = HostUsage(HostConfig("h", Resources(cpu=8, mem=1024, gpu=2), gpu_ids=(0, 1)))
    first = h.info()
    assert h.info() is first and first.gpu_holders == ()
    h.add(RunningTask("j-0-1", "h", Resources(cpu=1, mem=64, gpu=1), (1,)))
    held = h.info()
    assert held is not first and held.gpu_holders == ((1, "j-0-1"),) and held.allocated.gpu == 1
    h.up = False
    assert h.info().state == "DOWN"
    h.up = True
    h.remove("j-0-1")
    assert h.info().gpu_holders == () and h.info().allocated.gpu == 0 and h.info().state == "UP"
