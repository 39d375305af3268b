"""The hosts' metrics read at scrape time: the cluster's totals always; the per-host series only while the cluster
has at most --metrics-host-limit hosts (8 series a host, built at every scrape)."""

from __future__ import annotations

import pytest

from peloton.domain.launch import HostInfo
from peloton.domain.resources import Resources
from peloton.observability.census import ClusterCensus


def _hosts(n: int) -> list[tuple[HostInfo, str]]:
    return [(HostInfo(f"h{i}", "10.0.0.1", Resources(cpu=4, mem=1024, gpu=1), Resources(cpu=1, mem=512)), "up")
            for i in range(n)]


def _samples(c: ClusterCensus) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for fam in c.collect() for s in fam.samples}


@pytest.mark.parametrize(("hosts", "limit", "per_host"), [(3, 3, True), (3, 2, False), (3, 0, False), (1, 1000, True)])
def test_per_host_series_only_up_to_the_limit_and_the_totals_always(hosts: int, limit: int, per_host: bool) -> None:
    c = ClusterCensus()
    c.attach(lambda: _hosts(hosts), host_limit=limit)
    got = _samples(c)
    assert got[("peloton_cluster_capacity", (("resource", "cpu"),))] == 4 * hosts
    assert got[("peloton_cluster_allocated", (("resource", "mem"),))] == 512 * 2**20 * hosts  # bytes
    assert got[("peloton_hosts", (("state", "up"),))] == hosts
    series = [k for k in got if k[0] in ("peloton_host_capacity", "peloton_host_allocated")]
    assert len(series) == (8 * hosts if per_host else 0)
    if per_host:
        assert got[("peloton_host_allocated", (("host", "h0"), ("resource", "cpu")))] == 1


def test_the_store_is_counted_by_one_scrape_at_a_time_with_no_lock_held() -> None:
    """Scrapes at once make one count, the others get its answer; the count runs with the census' lock free."""
    import threading
    import time

    from peloton.observability.census import StoreCensus

    c = StoreCensus(every_s=60.0)
    go, entered = threading.Event(), threading.Event()
    counts: list[bool] = []

    def count() -> dict[str, dict[str, int]]:
        free = c._mu.acquire(blocking=False)  # the lock is free while the store is read
        if free:
            c._mu.release()
        counts.append(free)
        entered.set()
        assert go.wait(10)
        return {"jobs": {"RUNNING": 3}}

    c.attach(count)
    got: list[dict[str, dict[str, int]]] = []
    scrapes = [threading.Thread(target=lambda: got.append(c._counts())) for _ in range(3)]
    for t in scrapes:
        t.start()
    assert entered.wait(10)
    time.sleep(0.1)
    go.set()
    for t in scrapes:
        t.join(10)
    assert counts == [True]  # one count, lock free
    assert got == [{"jobs": {"RUNNING": 3}}] * 3
    assert c._counts() == {"jobs": {"RUNNING": 3}} and counts == [True]  # not again within every_s
