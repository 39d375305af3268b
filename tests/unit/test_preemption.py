"""Preemption as pure functions (candidate order, shortfall, victim choice checked with the placer) and through the
resource manager with a fake clock (settling window, probes, orders, the waiting gang's reason)."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY

from peloton.domain.allocation import Entitlement, Holding
from peloton.domain.model import ResourcePool
from peloton.domain.placement import GangPlacement, GangRequest, HostOffer, MemberAssignment, MemberRequest
from peloton.domain.resources import Resources
from peloton.placement.index import HostIndex
from peloton.placement.placer import can_ever_fit
from peloton.placement.victims import Candidate, choose_victims
from peloton.resmgr.entitlement import PoolPolicy, entitlements
from peloton.resmgr.manager import (
    ORDER_AGAIN_S,
    PREEMPTIONS,
    ResourceManager,
)
from peloton.resmgr.preemption import PROBE_EVERY_S, priority_candidates, reclaim_candidates, shortfall
from tests.unit.test_resmgr import SHORT, Clock, Pools, failure, gang

CAP = Resources(cpu=16, mem=16384, gpu=8)


def holding(pool: str, gpus: int, *, priority: int = 0, since: float = 0.0, hosts: tuple[str, ...] = ("h1",),
            preemptible: bool = True) -> Holding:
    per = Resources(cpu=1, mem=256, gpu=gpus // len(hosts))
    return Holding(pool, Resources(cpu=len(hosts), mem=256 * len(hosts), gpu=gpus), 1, preemptible, priority, since,
                   tuple((h, per) for h in hosts))


# --- candidates ---------------------------------------------------------------------------------------------
def test_priority_candidates_are_lower_priority_preemptible_gangs_of_the_pool_lowest_then_newest_first() -> None:
    held = {"a": holding("/p", 1, priority=1, since=10), "b": holding("/p", 1, priority=0, since=5),
            "c": holding("/p", 1, priority=0, since=9), "d": holding("/p", 1, priority=3),
            "e": holding("/p", 1, priority=0, preemptible=False), "f": holding("/q", 1, priority=0),
            "g": dataclasses.replace(holding("/p", 1), usage=()), "h": holding("/p", 1)}
    got = priority_candidates(3, "/p", held, held, excluded={"h"})
    assert got == ["c", "b", "a"]  # d: same priority; e: not preemptible; f: another pool; g: not placed; h: going


def test_reclaim_takes_from_the_pool_most_over_its_entitlement_and_keeps_it_at_its_entitlement_first() -> None:
    held = {"b1": holding("/b", 2, since=1), "b2": holding("/b", 2, since=2), "b3": holding("/b", 2, since=3),
            "c1": holding("/c", 2, since=1), "c2": holding("/c", 1, since=2),
            "a1": holding("/a", 1, since=9)}
    by_pool = {"/a": ["a1"], "/b": ["b1", "b2", "b3"], "/c": ["c1", "c2"]}
    own = {"/a": Resources(gpu=1), "/b": Resources(gpu=6), "/c": Resources(gpu=3)}
    ent = {"/a": Entitlement(gpu=2), "/b": Entitlement(gpu=3), "/c": Entitlement(gpu=2.5), "/": Entitlement(gpu=8)}
    got = reclaim_candidates(Resources(gpu=2), "/a", held, by_pool, own, ent, CAP)
    # /b is 3 over, /c 0.5: /b first, newest first; b3 leaves /b at 4 >= 3 (kept whole), b2 would take it to 2;
    # /c's c2 (the newest) would take it to 2 < 2.5; then /b is at its entitlement and b1 stays
    assert got == ["b3", "b2", "c2"]
    # a pool the waiting gang's own, or one not over in the dimensions it needs, gives nothing
    assert reclaim_candidates(Resources(cpu=1), "/a", held, by_pool, own, ent, CAP) == []


def test_the_roots_own_gangs_beyond_their_share_give_a_reserved_pool_its_share_back() -> None:
    """The root's own gangs share the cluster with its children as one more child (elastic, share 1, no
    reservation: docs/pools.md). Gangs of / that took the whole cluster while /a was idle were never reclaim
    candidates (the root is an ancestor of every pool), so /a, entitled to its reservation, waited for them to end
    however long they ran."""
    pools = {"/": PoolPolicy("/"), "/a": PoolPolicy("/a", reservation=Resources(gpu=4))}
    held = {"r1": holding("/", 4, since=1), "r2": holding("/", 4, since=2)}
    by_pool = {"/": ["r1", "r2"]}
    own = {"/": Resources(cpu=2, mem=512, gpu=8)}
    ent = entitlements(pools, CAP, {"/a": Resources(cpu=1, mem=256, gpu=4)}, own)
    assert ent["/a"].gpu == 4 and ent["/"].gpu == 8  # / keeps 4 for its own gangs, which hold 8
    # the newest first; r2 leaves the root's gangs at their share of 4 (kept whole first)
    assert reclaim_candidates(Resources(cpu=1, mem=256, gpu=4), "/a", held, by_pool, own, ent, CAP) == ["r2"]
    # within their share, they give nothing
    own_within = {"/": Resources(cpu=1, mem=256, gpu=4)}
    ent2 = entitlements(pools, CAP, {"/a": Resources(cpu=1, mem=256, gpu=4)}, own_within)
    assert reclaim_candidates(Resources(cpu=1, mem=256, gpu=4), "/a", {"r1": held["r1"]}, {"/": ["r1"]},
                              own_within, ent2, CAP) == []


def test_shortfall_is_what_the_tightest_bound_on_the_way_lacks() -> None:
    pools = {"/": ResourcePool("/"), "/t": ResourcePool("/t", limit=Resources(gpu=6)),
             "/t/x": ResourcePool("/t/x")}
    ent = {"/": Entitlement(gpu=8), "/t": Entitlement(cpu=10, mem=1e6, gpu=7),
           "/t/x": Entitlement(cpu=10, mem=1e6, gpu=4.5)}
    alloc = {"/t": Resources(gpu=5), "/t/x": Resources(gpu=4)}
    # /t/x: 4 + 2 - 4 (4.5 rounded down) = 2; /t: 5 + 2 - min(7, 6) = 1
    assert shortfall(Resources(gpu=2), "/t/x", pools, ent, alloc) == Resources(gpu=2)
    assert shortfall(Resources(gpu=0, cpu=1), "/t/x", pools, ent, alloc) == Resources()


# --- victim choice with the placer --------------------------------------------------------------------------
def hosts(n: int, gpus: int = 4) -> HostIndex:
    cap = Resources(cpu=8, mem=8192, gpu=gpus, ports=100)
    return HostIndex([HostOffer(f"h{i}", "127.0.0.1", cap, capacity=cap, has_gpus=gpus > 0) for i in range(n)])


def waiting(n: int, gpus: int) -> GangRequest:
    r = Resources(cpu=1, mem=256, gpu=gpus)
    return GangRequest("w/0", "w", 1, tuple(MemberRequest(i, f"w-{i}-1", r) for i in range(n)))


def occupy(index: HostIndex, gid: str, usage: list[tuple[str, int]]) -> Candidate:
    u = tuple((h, Resources(cpu=1, mem=256, gpu=g)) for h, g in usage)
    index.shift(u, -1)
    total = Resources()
    for _, r in u:
        total = total + r
    return Candidate(gid, 1, u, total)


def test_victims_must_make_the_gang_placeable_not_only_sum_up() -> None:
    index = hosts(2)  # two hosts of 4 GPUs, every GPU held by 2-GPU gangs
    a = occupy(index, "a", [("h0", 2)])
    b = occupy(index, "b", [("h1", 2)])
    c = occupy(index, "c", [("h0", 2)])
    d = occupy(index, "d", [("h1", 2)])
    before = sorted((o.hostname, o.free) for o in index.offers())
    # one member of 4 GPUs: a and b free 4 GPUs in sum, but on two hosts; a and c free h0
    got = choose_victims(waiting(1, 4), [a, b, c, d], Resources(), index)
    assert got is not None and [v.gang_id for v in got] == ["a", "c"]
    assert sorted((o.hostname, o.free) for o in index.offers()) == before  # left as it was


def test_victims_not_needed_once_the_gang_fits_are_kept_running() -> None:
    index = hosts(2)
    a = occupy(index, "a", [("h0", 1)])
    b = occupy(index, "b", [("h0", 3)])
    c = occupy(index, "c", [("h1", 4)])
    got = choose_victims(waiting(1, 4), [a, b, c], Resources(), index)
    assert got is not None and [v.gang_id for v in got] == ["a", "b"]
    # the gang needs 3 GPUs: a (1) alone does not do, b alone does: a is kept
    got = choose_victims(waiting(1, 3), [a, b, c], Resources(), index)
    assert got is not None and [v.gang_id for v in got] == ["b"]
    # `need`: a pool must get 5 GPUs back although 3 would place the gang: a and c (c's host fits it)
    got = choose_victims(waiting(1, 3), [a, b, c], Resources(gpu=5), index)
    assert got is not None and [v.gang_id for v in got] == ["a", "c"]
    assert choose_victims(waiting(3, 4), [a, b, c], Resources(), index) is None  # 3 hosts' worth: never


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(1, 4)), min_size=1, max_size=8), st.integers(1, 3),
       st.integers(1, 4))
def test_chosen_victims_always_let_the_gang_be_placed_and_every_one_is_needed(
        gangs: list[tuple[int, int]], members: int, gpus: int) -> None:
    index = hosts(3)
    free = {f"h{i}": 4 for i in range(3)}
    cands = []
    for k, (h, g) in enumerate(gangs):
        host = f"h{h}"
        g = min(g, free[host])
        if g == 0:
            continue
        free[host] -= g
        cands.append(occupy(index, f"g{k}", [(host, g)]))
    gang_ = waiting(members, gpus)
    got = choose_victims(gang_, cands, Resources(), index)
    fits_without = can_ever_fit(gang_, index) is None
    if got is None:
        for c in cands:
            index.shift(c.usage, 1)
        assert can_ever_fit(gang_, index) is not None  # not even with every candidate gone
        return
    if fits_without:
        assert got == [] or got  # the caller only asks when it does not fit; any answer frees enough
    for c in got:
        index.shift(c.usage, 1)
    assert can_ever_fit(gang_, index) is None
    for c in got:  # each victim is needed: keeping any one running makes the gang unplaceable
        index.shift(c.usage, -1)
        assert fits_without or can_ever_fit(gang_, index) is not None
        index.shift(c.usage, 1)


# --- through the resource manager ---------------------------------------------------------------------------
A = ResourcePool("/a", reservation=Resources(cpu=4, mem=4096, gpu=4))
B = ResourcePool("/b")
CLUSTER = Resources(cpu=16, mem=16384, gpu=8)


def placed(g: GangRequest, host: str = "h1") -> GangPlacement:
    return GangPlacement(g.gang_id, g.job_id, g.attempt, tuple(
        MemberAssignment(m.instance, m.task_id, host, "127.0.0.1", m.resources) for m in g.members))


def run(rm: ResourceManager, gangs: list[GangRequest]) -> None:
    """Admit, place and hand out `gangs` (they hold their resources from then on)."""
    rm.enqueue(gangs)
    got = rm.dequeue(100, SHORT, CLUSTER)
    assert sorted(g.gang_id for g in got) == sorted(g.gang_id for g in gangs)
    rm.set_placements([placed(g) for g in got], [])
    taken, _ = rm.take_placements(100, SHORT)  # jobmgr takes them...
    rm.ack_placements([(p.gang_id, p.attempt) for p in taken], [])  # ... and their launch intents are durable


def test_reclaim_waits_the_settling_window_then_probes_and_orders_the_chosen_victims() -> None:
    clock = Clock()
    pools = Pools(A, B)
    rm = ResourceManager(pools, clock=clock, preemption_settle_s=10.0)
    bs = [gang(f"b{i}", n=1, gpu=2, pool="/b", at=i) for i in range(4)]
    for i, g in enumerate(bs):  # /b takes the cluster while /a is idle, one gang a second
        clock.t = 1000.0 + i
        run(rm, [g])
    a = gang("a", n=2, gpu=1, pool="/a", at=100)
    rm.enqueue([a])

    def round_at(t: float) -> None:
        """A placement round at `t`: /a's gang, admitted (within its pool's entitlement), fits no host."""
        clock.t = t
        for _ in range(5):  # (a failed gang is tried again at once when something changed meanwhile)
            got = rm.dequeue(10, SHORT, CLUSTER)
            if not got:
                return  # it waits (parked)
            assert [g.gang_id for g in got] == ["a/0"]
            assert rm.take_probes() == []  # being placed: not a candidate for a probe
            rm.set_placements([], [failure(a, "hosts short of: gpu 2")])
            clock.t += 0.3  # (starved gangs are looked over at most every PROBE_ROUND_EVERY_S)
        raise AssertionError("the gang never waited")

    round_at(1010.0)
    assert rm.take_probes() == []  # settling
    round_at(1015.0)
    assert rm.take_probes() == []
    round_at(1020.5)
    probes = rm.take_probes()
    assert len(probes) == 1 and probes[0].gang.gang_id == "a/0" and probes[0].need == Resources()
    # /a wants 2 GPUs (its reservation is 4, elastic: up to its demand), so /b is entitled to 6 and holds 8: its
    # newest gang would bring it back to its entitlement; the older ones stay
    assert [gid for gid, _ in probes[0].candidates] == ["b3/0"]
    assert probes[0].candidates[0][1].usage == (("h1", Resources(cpu=1, mem=256, gpu=2)),)
    before = PREEMPTIONS.labels("/b", "reclaim")._value.get()
    rm.set_placements([], [], preemptions=[(("a/0", 1), [("b3/0", 1)])])
    assert rm.take_preemptions() == [
        ("b3/0", 1, "pool /b is over its entitlement and pool /a needs its share back for gang a/0")]
    assert PREEMPTIONS.labels("/b", "reclaim")._value.get() == before + 1
    queued = {q.gang_id: q for q in rm.queue()[0]}
    assert queued["a/0"].reason == "waiting for preempted gangs to exit: b3/0"
    # not asked again while its victim exits; an order not acted on is given again
    round_at(1030.0)
    assert rm.take_probes() == [] and rm.take_preemptions() == []
    clock.t = 1021.0 + ORDER_AGAIN_S + 1
    rm.take_placements(10, SHORT)
    assert [v[0] for v in rm.take_preemptions()] == ["b3/0"]
    # the victim ends (jobmgr queues its next run): /a's gang is admitted
    rm.enqueue([dataclasses.replace(bs[3], attempt=2)])
    assert [g.gang_id for g in rm.dequeue(10, SHORT, CLUSTER)] == ["a/0"]
    # the pool's preemptions are dropped with the pool, as its other series are
    pools.pools = [ResourcePool("/"), A]
    rm.refresh_pools()
    assert REGISTRY.get_sample_value("peloton_preemptions_total", {"pool": "/b", "kind": "reclaim"}) is None


def test_a_gang_whose_placement_jobmgr_has_not_taken_is_no_victim_until_it_has() -> None:
    """jobmgr preempts launching and running gangs only: an order for a gang placed but not yet taken (its launch
    not begun) would be ignored, and the waiting gang would wait for a victim that never lets go until the order is
    given again. Such a gang is no candidate; once jobmgr took its placement it is."""
    clock = Clock()
    pools = Pools(A, B)
    rm = ResourceManager(pools, clock=clock, preemption_settle_s=10.0)
    bs = [gang(f"b{i}", n=1, gpu=2, pool="/b", at=i) for i in range(4)]
    for i, g in enumerate(bs[:3]):
        clock.t = 1000.0 + i
        run(rm, [g])
    clock.t = 1003.0
    rm.enqueue([bs[3]])  # the newest: placed, its placement not taken by jobmgr yet
    assert rm.dequeue(10, SHORT, CLUSTER) == [bs[3]]
    rm.set_placements([placed(bs[3])], [])
    a = gang("a", n=2, gpu=1, pool="/a", at=100)
    rm.enqueue([a])

    def probe_at(t: float) -> list[str]:
        clock.t = t
        for _ in range(5):
            got = rm.dequeue(10, SHORT, CLUSTER)
            if not got:
                break
            rm.set_placements([], [failure(a, "hosts short of: gpu 2")])
            clock.t += 0.3
        probes = rm.take_probes()
        return [gid for p in probes for gid, _ in p.candidates]

    probe_at(1010.0)
    assert probe_at(1020.5) == ["b2/0"]  # (the newest that could go: b3 is not launching yet)
    rm.set_placements([], [], preemptions=[(("a/0", 1), [])])  # (no victims chosen: asked again later)
    (p,), _ = rm.take_placements(10, SHORT)
    rm.ack_placements([(p.gang_id, p.attempt)], [])  # jobmgr took b3's placement: LAUNCHING
    assert probe_at(1020.5 + PROBE_EVERY_S + 1) == ["b3/0"]


def test_a_higher_priority_gang_over_its_pools_entitlement_preempts_in_its_pool_only() -> None:
    clock = Clock()
    rm = ResourceManager(Pools(B), clock=clock, preemption_settle_s=0.0)
    lows = [gang(f"l{i}", n=1, gpu=4, pool="/b", priority=1, at=i) for i in range(2)]
    run(rm, lows)
    same = gang("s", n=1, gpu=4, pool="/b", priority=1, at=50)
    rm.enqueue([same])
    rm.dequeue(10, SHORT, CLUSTER)
    assert rm.take_probes() == []  # equal priority: nobody to preempt
    high = gang("h", n=1, gpu=4, pool="/b", priority=5, at=60)
    rm.enqueue([high])
    clock.t += 2
    rm.dequeue(10, SHORT, CLUSTER)
    probes = rm.take_probes()
    assert [p.gang.gang_id for p in probes] == ["h/0"]  # the head of /b's queue only
    assert [gid for gid, _ in probes[0].candidates] == ["l0/0", "l1/0"] or \
        [gid for gid, _ in probes[0].candidates] == ["l1/0", "l0/0"]
    assert probes[0].need == Resources(gpu=4)  # what /b's entitlement (the cluster) lacks: GPUs only


def test_no_preemption_when_disabled_or_for_a_non_preemptible_gang_beyond_its_reservation() -> None:
    clock = Clock()
    rm = ResourceManager(Pools(A, B), clock=clock, preemption_settle_s=0.0, preemption=False)
    run(rm, [gang("b0", n=1, gpu=8, pool="/b")])
    rm.enqueue([gang("h", n=1, gpu=4, pool="/b", priority=9, at=5)])
    clock.t += 100
    rm.dequeue(10, SHORT, CLUSTER)
    assert rm.take_probes() == []  # over its pool's entitlement: only preemption would help
    a = gang("a", n=1, gpu=4, pool="/a", priority=0, at=6)
    rm.enqueue([a])
    assert [g.gang_id for g in rm.dequeue(10, SHORT, CLUSTER)] == ["a/0"]  # within /a's entitlement
    rm.set_placements([], [failure(a)])
    clock.t += 100
    while rm.dequeue(10, SHORT, CLUSTER):  # tried again at once (something changed): no hosts still
        rm.set_placements([], [failure(a)])
        clock.t += 0.5
    probes = rm.take_probes()  # no hosts: a reservation is asked for, with no victims
    assert [(p.gang.gang_id, p.candidates) for p in probes] == [("a/0", ())]
    rm = ResourceManager(Pools(A, B), clock=clock, preemption_settle_s=0.0)
    run(rm, [gang("a0", n=1, gpu=4, pool="/a", priority=0)])
    pinned = dataclasses.replace(gang("p", n=1, gpu=4, pool="/a", priority=9, at=5), preemptible=False)
    rm.enqueue([pinned])
    clock.t += 100
    rm.dequeue(10, SHORT, CLUSTER)
    assert rm.take_probes() == []  # beyond /a's reservation: preempting /a's own gangs does not change that


# --- reservations and backfill ------------------------------------------------------------------------------
def test_a_reservation_takes_the_hosts_that_free_up_earliest_and_knows_when() -> None:
    from peloton.placement.reservation import reserve

    index = hosts(3)  # three hosts of 4 GPUs
    early = occupy(index, "early", [("h0", 4)])
    late = occupy(index, "late", [("h1", 4)])
    never = occupy(index, "never", [("h2", 4)])
    before = sorted((o.hostname, o.free) for o in index.offers())
    r = reserve(waiting(2, 4), [(late, 500.0), (early, 100.0)], index)  # `never` has no max_runtime
    assert r is not None and r.hosts == {"h0", "h1"} and r.start == 500.0
    r = reserve(waiting(1, 4), [(late, 500.0), (early, 100.0)], index)
    assert r is not None and r.hosts == {"h0"} and r.start == 100.0
    # without ends known: the hosts with the most free, emptied; no start
    r = reserve(waiting(3, 4), [(early, 100.0)], index)
    assert r is not None and r.hosts == {"h0", "h1", "h2"} and r.start is None
    assert sorted((o.hostname, o.free) for o in index.offers()) == before
    del never


def test_a_gang_that_fits_now_or_never_needs_no_reservation() -> None:
    from peloton.placement.reservation import reserve

    index = hosts(2)
    assert reserve(waiting(1, 4), [], index) is None  # fits now
    assert reserve(waiting(3, 4), [], index) is None  # never: 2 hosts


def test_only_gangs_that_end_before_the_expected_start_backfill_into_reserved_hosts() -> None:
    from peloton.placement.reservation import BACKFILL_SLACK_S, Reservation, describe, may_backfill, place_around

    r = Reservation(frozenset({"h0"}), 1000.0)
    assert may_backfill(100.0, 1000.0 - 100.0 - BACKFILL_SLACK_S, r)
    assert not may_backfill(100.0, 1000.0 - 100.0 - BACKFILL_SLACK_S + 1, r)
    assert not may_backfill(0.0, 0.0, r)  # no max_runtime: never
    assert not may_backfill(1.0, 0.0, Reservation(frozenset({"h0"}), None))  # start not known: nothing backfills
    assert describe(r, 900.5) == "waiting for reserved hosts h0 to free up: expected to start in 100s"
    assert describe(Reservation(frozenset({"h1", "h0"}), None), 0).startswith(
        "waiting for reserved hosts h0, h1 to free up (start not known")

    index = hosts(2)
    reserved = {("big/0", 1): Reservation(frozenset({"h0"}), 1000.0)}
    short = dataclasses.replace(waiting(1, 2), gang_id="s/0", job_id="s", max_runtime_s=50.0)
    unbounded = dataclasses.replace(waiting(1, 2), gang_id="u/0", job_id="u")
    big = dataclasses.replace(waiting(1, 4), gang_id="big/0", job_id="big")
    other = dataclasses.replace(waiting(1, 4), gang_id="o/0", job_id="o")
    placements, failures = place_around([other, unbounded, short, big], index, reserved, now=900.0)
    where = {p.gang_id: {m.hostname for m in p.members} for p in placements}
    # `other` may not use h0: it takes h1; `unbounded` finds nothing left; `short` backfills on h0; `big` may use
    # its own reservation but h0 is not free enough any more
    assert where == {"o/0": {"h1"}, "s/0": {"h0"}}
    assert {f.gang_id for f in failures} == {"u/0", "big/0"}
    assert next(f for f in failures if f.gang_id == "u/0").reason.endswith(
        "(1 host(s) kept for gangs ahead in their queues)")
    assert sorted(o.free.gpu for o in index.offers()) == [0, 2]  # the hiding undone


def test_fifo_stops_the_round_at_the_first_gang_that_does_not_fit() -> None:
    from peloton.placement.reservation import place_around

    def g(name: str, n: int, gpus: int, max_runtime_s: float = 0.0) -> GangRequest:
        return dataclasses.replace(waiting(n, gpus), gang_id=f"{name}/0", job_id=name, max_runtime_s=max_runtime_s)

    gangs = [g("a", 1, 4), g("big", 2, 4), g("small", 1, 2, max_runtime_s=10.0), g("tiny", 1, 1)]
    index = hosts(2)
    placements, failures = place_around(gangs, index, {}, now=0.0)  # backfill: the small ones go around big
    assert [p.gang_id for p in placements] == ["a/0", "small/0", "tiny/0"]
    assert [f.gang_id for f in failures] == ["big/0"]

    index = hosts(2)
    placements, failures = place_around(gangs, index, {}, now=0.0, order="fifo")
    assert [p.gang_id for p in placements] == ["a/0"]  # what is ahead of big is placed
    assert [f.gang_id for f in failures] == ["big/0", "small/0", "tiny/0"]
    assert failures[0].reason.startswith("gang of 2 needs") and failures[0].short_hosts  # big's own, the placer's
    assert failures[1].reason == failures[2].reason and failures[1].reason.startswith(
        "waiting behind gang big/0 (pool /), which is ahead of it and does not fit yet")
    assert sorted(o.free.gpu for o in index.offers()) == [0, 4]  # only a's GPUs taken: the rest untouched

    # a reservation is honoured the same way before the first failure
    from peloton.placement.reservation import Reservation
    index = hosts(2)
    placements, failures = place_around([g("x", 1, 4), g("y", 1, 1)], index,
                                        {("r/0", 1): Reservation(frozenset({"h0"}), None)}, now=0.0, order="fifo")
    assert [p.gang_id for p in placements] == ["x/0"] and [f.gang_id for f in failures] == ["y/0"]
    assert "kept for gangs ahead" in failures[0].reason


def test_placement_order_must_be_backfill_or_fifo() -> None:
    import pytest

    from peloton.placement.reservation import place_around

    with pytest.raises(ValueError, match="order: must be one of backfill, fifo"):
        place_around([], hosts(1), {}, now=0.0, order="lifo")
    with pytest.raises(ValueError, match="placement_order"):
        ResourceManager(Pools(), placement_order="lifo")


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 3), st.sampled_from([1, 2, 4])), min_size=1, max_size=10),
       st.lists(st.tuples(st.integers(0, 2), st.integers(1, 4)), max_size=6))
def test_fifo_places_a_prefix_of_the_gangs_in_order_exactly_as_the_placer_would(
        gangs: list[tuple[int, int]], busy: list[tuple[int, int]]) -> None:
    """Whatever the gangs and the hosts: fifo places the longest prefix that fits one after the other, exactly
    what `place` does with that prefix; every gang after it fails, and the hosts hold only the prefix's members."""
    from peloton.placement.placer import place
    from peloton.placement.reservation import place_around

    def cluster() -> HostIndex:
        index = hosts(3)
        for k, (h, g) in enumerate(busy):
            free = next(o.free.gpu for o in index.offers() if o.hostname == f"h{h}")
            if min(g, free):
                occupy(index, f"busy{k}", [(f"h{h}", min(g, free))])
        return index

    reqs = [dataclasses.replace(waiting(n, g), gang_id=f"g{k}/0", job_id=f"g{k}") for k, (n, g) in enumerate(gangs)]
    index = cluster()
    placements, failures = place_around(reqs, index, {}, now=0.0, order="fifo")
    k = len(placements)
    assert [p.gang_id for p in placements] == [g.gang_id for g in reqs[:k]]
    assert [f.gang_id for f in failures] == [g.gang_id for g in reqs[k:]]
    alone = cluster()
    expected, first_failure = place(reqs[:k + 1], alone)
    assert expected == placements and (k == len(reqs) or [f.gang_id for f in first_failure] == [reqs[k].gang_id])
    assert sorted((o.hostname, o.free) for o in index.offers()) == sorted((o.hostname, o.free) for o in alone.offers())
