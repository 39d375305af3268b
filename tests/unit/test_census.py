"""The hosts' metrics read at scrape time: the cluster's totals always; the per-host series only while the cluster
has at most --metrics-host-limit hosts (8 series a host). Kept between scrapes, they always equal a full recount."""

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


def _recount(hosts: list[tuple[HostInfo, str]], limit: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The census' figures counted from scratch, as its definition says (sums exact, rounded once)."""
    from peloton.observability.census import RESOURCES, SCALE, exact_sum

    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    states: dict[str, int] = {}
    for _, state in hosts:
        states[state] = states.get(state, 0) + 1
    for state, n in states.items():
        out[("peloton_hosts", (("state", state),))] = n
    for r in RESOURCES:
        have = [float(getattr(h.capacity, r)) * SCALE[r] for h, s in hosts if s == "up"]
        used = [float(getattr(h.allocated, r)) * SCALE[r] for h, _ in hosts]
        out[("peloton_cluster_capacity", (("resource", r),))] = exact_sum(have)
        out[("peloton_cluster_allocated", (("resource", r),))] = exact_sum(used)
        if 0 < len(hosts) <= limit:
            for h, _ in hosts:
                out[("peloton_host_capacity", (("host", h.hostname), ("resource", r)))] = (
                    float(getattr(h.capacity, r)) * SCALE[r])
                out[("peloton_host_allocated", (("host", h.hostname), ("resource", r)))] = (
                    float(getattr(h.allocated, r)) * SCALE[r])
    out[("peloton_hostmgr_offers_held", ())] = sum(bool(h.holds_offer) for h, _ in hosts)
    return out


@pytest.mark.parametrize("seed", range(8))
def test_the_incremental_census_equals_a_full_recount_after_random_changes(seed: int) -> None:
    """Hosts added, removed, changed in place (new HostInfo, or an equal one built anew as Mesos does) or in state,
    with awkward fractions: after each batch of changes a scrape gives what counting everything anew gives."""
    import random
    from dataclasses import replace

    rng = random.Random(seed)
    limit = rng.choice([0, 5, 40])

    def info(name: str) -> HostInfo:
        return HostInfo(name, "10.0.0.1", Resources(cpu=rng.choice([0.1, 0.3, 1 / 3, 4, 7.7]), mem=rng.random() * 1e6,
                                                    disk=rng.choice([0, 1e-9, 5e5]), gpu=rng.randint(0, 8)),
                        Resources(cpu=rng.random() * 3, mem=rng.choice([0, 0.1, 1024]), gpu=rng.randint(0, 2)),
                        holds_offer=rng.random() < 0.3)

    states = ["up", "draining", "drained", "unhealthy", "lost"]
    hosts: dict[str, tuple[HostInfo, str]] = {f"h{i}": (info(f"h{i}"), "up") for i in range(rng.randint(0, 30))}
    c = ClusterCensus()
    c.attach(lambda: list(hosts.values()), host_limit=limit)
    for n in range(60):
        for _ in range(rng.randint(0, 6)):
            what = rng.random()
            names = sorted(hosts)
            if what < 0.2 or not names:
                name = f"n{n}-{rng.randint(0, 10**6)}"
                hosts[name] = (info(name), rng.choice(states))
            elif what < 0.35:
                del hosts[rng.choice(names)]
            elif what < 0.6:
                name = rng.choice(names)
                hosts[name] = (info(name), hosts[name][1])
            elif what < 0.7:
                name = rng.choice(names)
                hosts[name] = (replace(hosts[name][0]), hosts[name][1])  # equal, not the same object
            elif what < 0.8:  # one field only, in an object built anew
                name = rng.choice(names)
                h = hosts[name][0]
                one = rng.randrange(3)
                h = (replace(h, capacity=Resources(cpu=rng.choice([0.1, 2.5]), gpu=1)) if one == 0 else
                     replace(h, allocated=Resources(cpu=0.7)) if one == 1 else replace(h, holds_offer=not h.holds_offer))
                hosts[name] = (h, hosts[name][1])
            else:
                name = rng.choice(names)
                hosts[name] = (hosts[name][0], rng.choice(states))
        want = _recount(list(hosts.values()), limit)
        assert _samples(c) == want, f"seed {seed}, round {n}"


def test_an_unchanged_cluster_is_answered_with_the_last_families() -> None:
    hosts = _hosts(3)
    c = ClusterCensus()
    c.attach(lambda: hosts)
    first = list(c.collect())
    assert [id(f) for f in c.collect()] == [id(f) for f in first]
    hosts[1] = (hosts[1][0], "draining")
    again = _samples(c)
    assert again[("peloton_hosts", (("state", "draining"),))] == 1
    assert again[("peloton_cluster_capacity", (("resource", "cpu"),))] == 8


def test_scrapes_while_hosts_change_each_give_the_figures_of_one_snapshot() -> None:
    """Scrapes on several threads while another changes the hosts: each gives exactly the recount of the hosts'
    snapshot it took (never half of one change, never another scrape's)."""
    import random
    import threading

    rng = random.Random(7)
    hosts: dict[str, tuple[HostInfo, str]] = dict((h.hostname, (h, s)) for h, s in _hosts(50))
    mine = threading.local()
    stop = threading.Event()

    def snapshot() -> list[tuple[HostInfo, str]]:
        mine.seen = list(hosts.values())  # (one C call: the dict cannot change under it)
        return mine.seen

    c = ClusterCensus()
    c.attach(snapshot, host_limit=20)
    bad: list[str] = []

    def change() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            name = f"h{rng.randrange(60)}"
            if name in hosts and rng.random() < 0.3:
                hosts.pop(name, None)
            else:
                hosts[name] = (HostInfo(name, "10.0.0.1", Resources(cpu=rng.choice([1, 0.1, 3.3])),
                                        Resources(cpu=rng.random())), rng.choice(["up", "draining"]))

    def scrape() -> None:
        for _ in range(200):
            got = _samples(c)
            want = _recount(mine.seen, 20)
            if got != want:
                bad.append(f"{len(mine.seen)} hosts: {sorted(set(got.items()) ^ set(want.items()))[:3]}")

    import sys

    changer = threading.Thread(target=change)
    scrapers = [threading.Thread(target=scrape) for _ in range(3)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch often: interleavings that a 5 ms slice would rarely show
    try:
        changer.start()
        for t in scrapers:
            t.start()
        for t in scrapers:
            t.join(60)
    finally:
        stop.set()
        changer.join(10)
        sys.setswitchinterval(interval)
    assert bad == []
    assert _samples(c) == _recount(list(hosts.values()), 20)
