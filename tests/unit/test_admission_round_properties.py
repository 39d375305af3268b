"""The admission round on random pool trees and gang queues (Hypothesis): the rules docs/pools.md ("Admission",
"Borrowing", "Backfill at admission") promises, held whatever the pools, the holdings and the queues.

- whole gangs: an admitted gang holds its whole total;
- a limit is never exceeded (it was not before the round);
- a non-preemptible gang runs only within its own pool's reservation (the root aside);
- head of line: within a pool, the gangs admitted are the first ones of its queue in order, but for the gangs
  that backfill (each with an sla.max_runtime) and the non-preemptible ones its reservation refused;
- a gang admitted beyond its pool's entitlement (borrowing, backfill) fits the capacity nobody holds.
"""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

import peloton.resmgr.admission as admission
from peloton.domain.model import ResourcePool
from peloton.domain.placement import GangRequest, MemberRequest
from peloton.domain.resources import Resources
from peloton.resmgr.admission import admission_round, admit, entitled
from peloton.resmgr.entitlement import entitlements, policies
from peloton.resmgr.holdings import Holdings
from peloton.resmgr.paths import chain
from peloton.resmgr.preemption import find_probes
from peloton.resmgr.queues import Queues, State

R = Resources
DIMS = ("cpu", "mem", "disk", "gpu")
EPS = 1e-6


@dataclasses.dataclass
class World:
    pools: dict[str, ResourcePool]
    capacity: Resources
    running: list[GangRequest]
    waiting: list[GangRequest]
    now: float


_CPU = st.sampled_from([0.0, 0.1, 0.5, 1.0, 2.0, 3.0, 0.3])
_GPU = st.integers(0, 4)


def _vec(draw: st.DrawFn, big: bool = False) -> Resources:
    k = 8 if big else 1
    return R(cpu=draw(_CPU) * k, mem=float(draw(st.sampled_from([0, 256, 1024]))) * k, gpu=draw(_GPU) * k)


@st.composite
def worlds(draw: st.DrawFn) -> World:
    pools = {"/": ResourcePool("/")}
    for i in range(draw(st.integers(1, 5))):
        parents = sorted(p for p in pools if len(chain(p)) <= 2)
        parent = draw(st.sampled_from(parents))
        path = f"{parent.rstrip('/')}/p{i}"
        limit = _vec(draw, big=True) if draw(st.booleans()) else None
        reservation = _vec(draw, big=True) if draw(st.booleans()) else R()
        pools[path] = ResourcePool(path, reservation=reservation, limit=limit,
                                   share=draw(st.sampled_from([1.0, 2.0, 0.5])),
                                   reservation_type=draw(st.sampled_from(["elastic", "static"])))
    leaves = sorted(p for p in pools if not any(q != p and p in chain(q) for q in pools)) + ["/"]
    # small clusters too, where pools contend and some hold beyond their share
    capacity = R(cpu=float(draw(st.sampled_from([2, 4, 8, 16, 64]))), mem=float(draw(st.integers(0, 64 * 1024))),
                 gpu=draw(st.sampled_from([0, 2, 4, 8, 32])))
    now = 1000.0

    def gang(i: int, running: bool) -> GangRequest:
        pool = draw(st.sampled_from(leaves))
        n = draw(st.integers(1, 3))
        r = _vec(draw)
        host = "h1" if running else ""
        members = tuple(MemberRequest(m, f"g{i}-{m}-1", r, host) for m in range(n))
        return GangRequest(f"g{i}/0", f"g{i}", 1, members, draw(st.integers(0, 2)), pool,
                           enqueued_at=float(i), preemptible=draw(st.booleans()),
                           max_runtime_s=float(draw(st.sampled_from([0, 0, 100, 500, 5000]))),
                           running_since=now - draw(st.sampled_from([10.0, 400.0])) if running else 0.0)

    nr = draw(st.integers(0, 6))
    running = [gang(i, True) for i in range(nr)]
    waiting = [gang(i, False) for i in range(nr, nr + draw(st.integers(1, 12)))]
    return World(pools, capacity, running, waiting, now)


def _within(a: Resources, b: Resources, dims: tuple[str, ...] = DIMS) -> bool:
    return all(getattr(a, d) <= getattr(b, d) + EPS for d in dims)


def _run(w: World, fifo: bool = False) -> tuple[Queues, Holdings, list[str], dict[str, Resources], dict]:
    q, h = Queues(), Holdings()
    for g in w.running:
        h.hold(g)
        h.placed(g.gang_id, 1, tuple((m.hostname, m.resources) for m in g.members), g.running_since)
    for g in w.waiting:
        q.add(g, 0.0)
    before = dict(h.allocated)
    ent = entitlements(policies(w.pools.values()), w.capacity, q.demand, h.own)
    got = admission_round(q, h, w.pools, ent, 100, w.now, 1.0, set(), fifo=fifo)
    return q, h, [e.req.gang_id for e in got], before, ent


PROPERTY = settings(max_examples=200, deadline=None)


@given(worlds(), st.booleans())
@PROPERTY
def test_whole_gangs_within_every_limit_and_non_preemptible_within_the_reservation(w: World, fifo: bool) -> None:
    q, h, got, before, _ = _run(w, fifo)
    by_id = {g.gang_id: g for g in w.waiting}
    for gid in got:
        e = q.get(gid)
        assert e is not None and e.state == State.PLACING
        held = h.get(gid)
        assert held is not None and held.total == by_id[gid].total  # the whole gang, never a part
    for p, pool in w.pools.items():
        if pool.limit is None:
            continue
        dims = tuple(d for d in DIMS if getattr(pool.limit, d))
        if _within(before.get(p, R()), pool.limit, dims):
            assert _within(h.allocated.get(p, R()), pool.limit, dims), (p, h.allocated.get(p))
    for p, pool in w.pools.items():
        if p != "/" and _within(sum((g.total for g in w.running if g.respool == p and not g.preemptible), R()),
                                pool.reservation):
            assert _within(h.pinned.get(p, R()), pool.reservation), (p, h.pinned.get(p))


@given(worlds(), st.booleans())
@PROPERTY
def test_within_a_pool_only_the_first_gangs_in_order_are_admitted_but_for_backfill(w: World, fifo: bool) -> None:
    q, h, got, _, _ = _run(w, fifo)
    admitted = set(got)
    for pool in {g.respool for g in w.waiting}:
        line = sorted((g for g in w.waiting if g.respool == pool), key=lambda g: (-g.priority, g.enqueued_at))
        passed_over = False  # a gang ahead waits (for its pool, not for its reservation)
        for g in line:
            e = q.get(g.gang_id)
            assert e is not None
            if g.gang_id in admitted:
                if passed_over:  # only a backfill passes a waiting gang, and only one that ends at a known time
                    assert not fifo and g.max_runtime_s > 0, (pool, g.gang_id)
            elif e.block != "reservation":
                passed_over = True


@given(worlds())
@PROPERTY
def test_what_goes_beyond_the_entitlements_fits_the_capacity_nobody_holds(w: World) -> None:
    """Every gang of a pool below the root that is admitted while its pool (or an ancestor) ends the round beyond
    its entitlement borrowed: all such gangs together fit in what the round found free."""
    q, h, got, before, ent = _run(w)
    cap = ent["/"]
    free0 = [cap.cpu - before.get("/", R()).cpu, cap.mem - before.get("/", R()).mem,
             cap.disk - before.get("/", R()).disk, float(int(cap.gpu + EPS)) - before.get("/", R()).gpu]
    by_id = {g.gang_id: g for g in w.waiting}
    beyond = R()
    for gid in got:
        g = by_id[gid]
        if g.respool == "/":
            continue
        over = any(getattr(h.allocated.get(p, R()), d) > (float(int(getattr(ent[p], d) + EPS)) if d == "gpu"
                                                            else getattr(ent[p], d)) + EPS
                   for p in chain(g.respool) if p != "/" for d in DIMS)
        if over:
            beyond = beyond + g.total
    for i, d in enumerate(DIMS):
        if getattr(beyond, d) > EPS:
            assert getattr(beyond, d) <= max(free0[i], 0.0) + EPS, (d, beyond, free0)


# --- float rounding: a pool that should fit exactly --------------------------------------------------------------
def _equal_gangs(n: int, r: Resources, pool: str) -> list[GangRequest]:
    return [GangRequest(f"e{i}/0", f"e{i}", 1, (MemberRequest(0, f"e{i}-0-1", r),), 0, pool, enqueued_at=float(i))
            for i in range(n)]


def test_a_limit_filled_exactly_by_equal_gangs_admits_every_one() -> None:
    """1000 gangs of 1.1Gi in a pool limited to 1100Gi: the sum of 1126.4 MiB taken 1000 times is
    1126400.0000000088 in floating point, and an absolute tolerance of 1e-9 refused the last gang for ever
    ('limit ... would be exceeded in mem')."""
    pools = {"/": ResourcePool("/"), "/p": ResourcePool("/p", limit=R(mem=1100 * 1024))}
    q, h = Queues(), Holdings()
    for g in _equal_gangs(1000, R(cpu=1, mem=1.1 * 1024), "/p"):
        q.add(g, 0.0)
    got = admission_round(q, h, pools, {}, 2000, 0.0, 1.0, set())
    assert len(got) == 1000, q.reasons.get("e999/0")


def test_an_entitlement_filled_exactly_by_equal_gangs_admits_every_one() -> None:
    """10,000 gangs of 1.1Gi in the only pool of a cluster of 11,000Gi: its entitlement is the cluster's, and the
    float sum of what it holds overshoots it by 2e-6 MiB, beyond an absolute tolerance of 1e-6."""
    pools = {"/": ResourcePool("/"), "/p": ResourcePool("/p")}
    q, h = Queues(), Holdings()
    for g in _equal_gangs(10_000, R(cpu=1, mem=1.1 * 1024), "/p"):
        q.add(g, 0.0)
    ent = entitlements(policies(pools.values()), R(cpu=10**6, mem=11_000 * 1024), q.demand, h.own)
    assert ent["/p"].mem == 11_000 * 1024
    got = admission_round(q, h, pools, ent, 20_000, 0.0, 1.0, set())
    assert len(got) == 10_000, q.reasons.get("e9999/0")


# --- backfill never delays the first gang: a pool's timeline with and without it ---------------------------------
@dataclasses.dataclass
class Line:
    pool: ResourcePool
    capacity: Resources
    running: list[GangRequest]  # placed at 1.0; those of "/" share the cluster with the pool
    waiting: list[GangRequest]  # in the pool


@st.composite
def lines(draw: st.DrawFn) -> Line:
    limit = R(gpu=draw(st.integers(4, 16))) if draw(st.booleans()) else None
    pool = ResourcePool("/p", limit=limit)
    capacity = R(cpu=1000, mem=10**6, gpu=draw(st.integers(4, 24)))

    def gang(i: int, pool: str, running: bool) -> GangRequest:
        r = R(cpu=1, mem=1, gpu=draw(st.integers(0, 3)))
        n = draw(st.integers(1, 3))
        members = tuple(MemberRequest(m, f"g{i}-{m}-1", r, "h" if running else "") for m in range(n))
        return GangRequest(f"g{i}/0", f"g{i}", 1, members, draw(st.integers(0, 1)), pool, enqueued_at=float(i),
                           preemptible=True,
                           max_runtime_s=float(draw(st.sampled_from([0, 50, 100, 300, 1000, 3000]))),
                           running_since=1.0 if running else 0.0)

    nr = draw(st.integers(0, 5))
    running = [gang(i, draw(st.sampled_from(["/", "/p"])), True) for i in range(nr)]
    waiting = [gang(i, "/p", False) for i in range(nr, nr + draw(st.integers(2, 8)))]
    return Line(pool, capacity, running, waiting)


def _admitted_at(line: Line, first: str, backfill: bool, lag: bool) -> float:
    """When gang `first` is admitted if every admitted gang is placed and runs its max_runtime (those without one:
    for ever), with admission rounds at every end. `lag`: gangs are placed 1 s after their admission, and a round
    runs before (another placement engine asks meanwhile); else at once."""
    pools = {"/": ResourcePool("/"), "/p": line.pool}
    q, h = Queues(), Holdings()
    for g in line.running:
        h.hold(g)
        h.placed(g.gang_id, 1, tuple((m.hostname, m.resources) for m in g.members), 1.0)
    for g in line.waiting:
        q.add(g, 0.0)
    now, depth = 10.0, admission.BACKFILL_DEPTH
    admission.BACKFILL_DEPTH = depth if backfill else 0
    try:
        for _ in range(64):
            ent = entitlements(policies(pools.values()), line.capacity, q.demand, h.own)
            admitted = [e.req for e in admission_round(q, h, pools, ent, 100, now, 1.0, set())]
            if first in [g.gang_id for g in admitted]:
                return now
            if lag and admitted:
                now += 1.0
                ent = entitlements(policies(pools.values()), line.capacity, q.demand, h.own)
                more = [e.req for e in admission_round(q, h, pools, ent, 100, now, 1.0, set())]
                if first in [g.gang_id for g in more]:
                    return now
                admitted += more
            for g in admitted:
                h.placed(g.gang_id, 1, (("h", g.total),), now)
            ends = [x.ends_at for x in h.by_gang.values() if x.ends_at is not None and x.ends_at > now]
            if not ends:
                return float("inf")
            now = min(ends)
            for gid in [gid for gid, x in h.by_gang.items() if x.ends_at is not None and x.ends_at <= now]:
                h.release(gid, 1)
                q.drop(gid)
        return float("inf")
    finally:
        admission.BACKFILL_DEPTH = depth


@given(lines(), st.booleans())
@settings(max_examples=200, deadline=None)
def test_backfill_never_delays_the_first_gang_of_the_pool(line: Line, lag: bool) -> None:
    """docs/pools.md, backfill at admission: a gang admitted behind the pool's first waiting gang cannot delay it.
    On one pool's timeline (the root's own gangs beside it), the first gang that waits is admitted no later with
    backfill than without, whether gangs are placed at once or a round passes before."""
    first = sorted(line.waiting, key=lambda g: (-g.priority, g.enqueued_at))[0].gang_id
    assert _admitted_at(line, first, True, lag) <= _admitted_at(line, first, False, lag)


# --- preemption candidates ---------------------------------------------------------------------------------------
@given(worlds(), st.data())
@PROPERTY
def test_preemption_candidates_are_whole_preemptible_gangs_of_lower_priority_or_of_pools_over_their_share(
        w: World, data: st.DataObject) -> None:
    """Whatever the pools and queues: every candidate of a probe is a launched, preemptible gang not already being
    preempted, and either of the waiting gang's own pool with a lower priority, or (the waiting gang within its
    pool's limits and entitlement, waiting for hosts) of another pool holding more than its share in a dimension
    the waiting gang needs."""
    q, h = Queues(), Holdings()
    for g in w.running:
        h.hold(g)
        h.placed(g.gang_id, 1, tuple((m.hostname, m.resources) for m in g.members), g.running_since)
        if data.draw(st.booleans()):
            h.launched(g.gang_id, 1)
    preempting = {g.gang_id for g in w.running if data.draw(st.integers(0, 4)) == 0}
    for g in w.waiting:
        e = q.add(g, 0.0)
        q.starve(e, 1.0, data.draw(st.sampled_from(["pool", "hosts"])))
    ent = entitlements(policies(w.pools.values()), w.capacity, q.demand, h.own)
    kids: dict[str, list[str]] = {}
    for p in ent:
        if p != "/":
            kids.setdefault(chain(p)[1], []).append(p)

    def own_share(p: str, d: str) -> float:
        return getattr(ent[p], d) - sum(getattr(ent[c], d) for c in kids.get(p, []))

    for probe in find_probes(q.starved_heads(), 100.0, 100, 10.0, True, h, w.pools, ent, w.capacity, preempting):
        g = probe.gang
        within = (admit(g.total, g.respool, w.pools, h.allocated) is None
                  and entitled(g.total, g.respool, ent, h.allocated) is None)
        for gid, held in probe.candidates:
            assert held.preemptible and held.launched and held.usage and gid not in preempting, gid
            if held.pool == g.respool and held.priority < g.priority:
                continue
            assert within and q.get(g.gang_id).block == "hosts", (gid, g.gang_id)  # type: ignore[union-attr]
            assert held.pool != g.respool
            over = [d for d in DIMS if getattr(g.total, d) > 0
                    and getattr(h.own.get(held.pool, R()), d) > own_share(held.pool, d) + EPS]
            assert over, (gid, held.pool)
