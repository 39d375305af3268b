"""Entitlements: reservations first, the surplus water-filled by share, limits respected; properties on random trees."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from peloton.domain.allocation import Entitlement
from peloton.domain.resources import Resources
from peloton.resmgr.entitlement import DIMS, PoolPolicy, entitlements, pool_tree, want
from peloton.resmgr.paths import ancestors

R = Resources
P = PoolPolicy

REL = 1e-6  # float tolerance, relative to the magnitudes involved
ABS = 1e-6


def close_le(a: float, b: float) -> bool:
    """a <= b, give or take float rounding."""
    return a <= b + REL * max(abs(a), abs(b)) + ABS


def tree(*policies: PoolPolicy) -> dict[str, PoolPolicy]:
    out = {"/": P("/")}
    out.update({p.path: p for p in policies})
    return out


def lim(p: PoolPolicy, dim: str) -> float:
    v = getattr(p.limit, dim) if p.limit is not None else 0
    return v if v > 0 else math.inf


def children_of(pools: dict[str, PoolPolicy]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {p: [] for p in pools}
    for p in pools:
        if p != "/":
            out[ancestors(p)[1]].append(p)
    return out


# ---------------------------------------------------------------------------------------------------- examples

def test_an_idle_elastic_team_lends_its_reservation() -> None:
    pools = tree(P("/a", reservation=R(gpu=16)), P("/b", reservation=R(gpu=16)))
    e = entitlements(pools, R(gpu=32), demand={"/b": R(gpu=32)}, allocation={})
    assert e["/b"].gpu == 32 and e["/a"].gpu == 0 and e["/"].gpu == 32


def test_a_lent_reservation_is_bounded_by_the_borrowers_limit() -> None:
    pools = tree(P("/a", reservation=R(gpu=16)), P("/b", reservation=R(gpu=16), limit=R(gpu=24)))
    e = entitlements(pools, R(gpu=32), demand={"/b": R(gpu=32)}, allocation={})
    assert e["/b"].gpu == 24 and e["/a"].gpu == 0


def test_an_idle_static_team_holds_its_reservation() -> None:
    pools = tree(P("/a", reservation=R(gpu=16), static=True), P("/b", reservation=R(gpu=16)))
    e = entitlements(pools, R(gpu=32), demand={"/b": R(gpu=32)}, allocation={})
    assert e["/a"].gpu == 16 and e["/b"].gpu == 16


def test_a_static_reservation_above_the_limit_is_capped() -> None:
    pools = tree(P("/a", reservation=R(gpu=16), limit=R(gpu=4), static=True))
    assert entitlements(pools, R(gpu=32), {}, {})["/a"].gpu == 4


def test_a_limit_caps_even_with_capacity_to_spare() -> None:
    pools = tree(P("/a", limit=R(cpu=10)), P("/b", limit=R(gpu=2)))  # /b: cpu unlimited, gpu limited
    e = entitlements(pools, R(cpu=100, gpu=8), demand={"/a": R(cpu=50), "/b": R(cpu=50, gpu=8)}, allocation={})
    assert e["/a"].cpu == 10 and e["/b"].cpu == 50 and e["/b"].gpu == 2
    assert e["/"].cpu == 100  # the remaining 40 cpus stay unassigned


def test_the_root_limit_caps_the_capacity() -> None:
    pools = {"/": P("/", limit=R(cpu=10)), "/a": P("/a")}
    e = entitlements(pools, R(cpu=100), demand={"/a": R(cpu=50)}, allocation={})
    assert e["/"].cpu == 10 and e["/a"].cpu == 10


def test_shares_two_to_one_split_the_surplus_two_to_one() -> None:
    pools = tree(P("/a", share=2), P("/b", share=1))
    e = entitlements(pools, R(cpu=30), demand={"/a": R(cpu=100), "/b": R(cpu=100)}, allocation={})
    assert e["/a"].cpu == pytest.approx(20) and e["/b"].cpu == pytest.approx(10)
    # with a reservation, only the surplus beyond it is split 2:1
    pools = tree(P("/a", share=2, reservation=R(cpu=6)), P("/b", share=1))
    e = entitlements(pools, R(cpu=30), demand={"/a": R(cpu=100), "/b": R(cpu=100)}, allocation={})
    assert e["/a"].cpu == pytest.approx(6 + 16) and e["/b"].cpu == pytest.approx(8)


def test_what_a_satisfied_pool_leaves_goes_to_the_others_by_share() -> None:
    pools = tree(P("/a", share=1), P("/b", share=1), P("/c", share=3))
    e = entitlements(pools, R(cpu=40), demand={"/a": R(cpu=2), "/b": R(cpu=100), "/c": R(cpu=100)}, allocation={})
    assert e["/a"].cpu == pytest.approx(2)
    assert e["/b"].cpu == pytest.approx(9.5) and e["/c"].cpu == pytest.approx(28.5)


def test_allocation_counts_as_want_like_demand() -> None:
    pools = tree(P("/a"), P("/b"))
    e = entitlements(pools, R(cpu=10), demand={"/b": R(cpu=10)}, allocation={"/a": R(cpu=8)})
    assert e["/a"].cpu == pytest.approx(5) and e["/b"].cpu == pytest.approx(5)


def test_nested_pools() -> None:
    pools = tree(
        P("/team", reservation=R(gpu=24)),
        P("/team/x", reservation=R(gpu=16)),
        P("/team/y", share=3),
        P("/other", reservation=R(gpu=8)),
    )
    demand = {"/team/x": R(gpu=4), "/team/y": R(gpu=100), "/other": R(gpu=100)}
    e = entitlements(pools, R(gpu=32), demand, {})
    # /team claims its 24, /other its 8: nothing is left over at the root
    assert e["/team"].gpu == pytest.approx(24) and e["/other"].gpu == pytest.approx(8)
    # /team/x lends 12 of its 16 to /team/y
    assert e["/team/x"].gpu == pytest.approx(4) and e["/team/y"].gpu == pytest.approx(20)
    w = want(pools, demand, {})
    assert w["/team"] == R(gpu=104) and w["/"] == R(gpu=204) and w["/team/x"] == R(gpu=4)


def test_a_static_pool_holds_through_an_idle_elastic_parent() -> None:
    pools = tree(
        P("/team", reservation=R(gpu=16)),
        P("/team/s", reservation=R(gpu=8), static=True),
        P("/other", reservation=R(gpu=16)),
    )
    e = entitlements(pools, R(gpu=32), demand={"/other": R(gpu=32)}, allocation={})
    assert e["/team/s"].gpu == 8 and e["/team"].gpu == 8 and e["/other"].gpu == 24


def test_reservations_beyond_the_capacity_are_scaled_in_proportion() -> None:
    pools = tree(P("/a", reservation=R(cpu=30), static=True), P("/b", reservation=R(cpu=10), static=True))
    e = entitlements(pools, R(cpu=20), {}, {})
    assert e["/a"].cpu == pytest.approx(15) and e["/b"].cpu == pytest.approx(5)


def test_capacity_nobody_wants_stays_unassigned() -> None:
    pools = tree(P("/a", reservation=R(cpu=4)), P("/b"))
    e = entitlements(pools, R(cpu=100, mem=1024), demand={"/a": R(cpu=1)}, allocation={})
    assert e["/a"] == Entitlement(cpu=1) and e["/b"] == Entitlement()
    assert e["/"] == Entitlement(cpu=100, mem=1024)


def test_gpus_divide_fractionally_and_whole_rounds_down() -> None:
    pools = tree(P("/a"), P("/b"))
    e = entitlements(pools, R(gpu=3), demand={"/a": R(gpu=3), "/b": R(gpu=3)}, allocation={})
    assert e["/a"].gpu == pytest.approx(1.5) and e["/b"].gpu == pytest.approx(1.5)
    assert e["/a"].whole() == R(gpu=1)
    assert Entitlement(cpu=2.5, gpu=15.9999999999).whole() == R(cpu=2.5, gpu=16)


def test_an_interior_pools_own_gangs_share_with_its_children() -> None:
    pools = tree(P("/t"), P("/t/a"))
    e = entitlements(pools, R(cpu=10), demand={"/t": R(cpu=10), "/t/a": R(cpu=10)}, allocation={})
    assert e["/t"].cpu == pytest.approx(10) and e["/t/a"].cpu == pytest.approx(5)  # /t keeps 5 for its own
    e = entitlements(pools, R(cpu=10), demand={"/": R(cpu=4), "/t/a": R(cpu=10)}, allocation={})
    assert e["/t"].cpu == pytest.approx(6) and e["/t/a"].cpu == pytest.approx(6)  # the root's own gangs: 4
    assert want(pools, {"/t": R(cpu=3)}, {"/t/a": R(cpu=2)})["/t"] == R(cpu=5)


def test_unknown_pools_in_demand_and_allocation_are_ignored() -> None:
    pools = tree(P("/a"))
    e = entitlements(pools, R(cpu=10), demand={"/gone": R(cpu=5)}, allocation={"/gone": R(cpu=5)})
    assert e["/a"] == Entitlement()


def test_malformed_input_is_refused() -> None:
    with pytest.raises(ValueError, match="share"):
        P("/a", share=0)
    with pytest.raises(ValueError, match="share"):
        P("/a", share=float("nan"))
    with pytest.raises(ValueError, match="'/'"):
        P("a")
    with pytest.raises(ValueError, match="root"):
        entitlements({"/a": P("/a")}, R(cpu=1), {}, {})
    with pytest.raises(ValueError, match="parent /a is missing"):
        entitlements(tree(P("/a/b")), R(cpu=1), {}, {})


# ---------------------------------------------------------------------------------------------------- generators

# The generator costs far more than the code under test, so it makes one plain integer choice per dimension.
# Quantities are often whole, sometimes fractional (multiples of 1/8, and of 1/10: inexact in binary floating
# point), and often 0 in the sparse variant (a zero limit dimension: unlimited).
def _quantity(k: int) -> float:
    k = max(k, 0)
    return k / 10 if k % 3 == 1 else k / 8 if k % 3 == 2 else float(k // 3 % 41)


_K, _K0 = st.integers(0, 400), st.integers(-150, 400)
_G, _G0 = st.integers(0, 40), st.integers(-15, 40)
_SHARES = [1.0, 0.5, 2.0, 3.0, 1.0, 0.3, 1.7, 7.25, 10.0]  # index 0 first: failures shrink towards share 1
SPARSE_VECTORS = st.builds(
    R, cpu=_K0.map(_quantity), mem=_K0.map(_quantity), disk=_K0.map(_quantity), gpu=_G0.map(lambda g: max(g, 0))
)


def _vector(draw: st.DrawFn, sparse: bool = True) -> Resources:
    k, g = (_K0, _G0) if sparse else (_K, _G)
    return R(_quantity(draw(k)), _quantity(draw(k)), _quantity(draw(k)), max(draw(g), 0))


def _maybe_vector(draw: st.DrawFn) -> Resources | None:
    return _vector(draw) if draw(st.booleans()) else None


@dataclass
class Scenario:
    pools: dict[str, PoolPolicy]
    capacity: Resources
    demand: dict[str, Resources] = field(default_factory=dict)
    allocation: dict[str, Resources] = field(default_factory=dict)


def _min_vec(a: Resources, b: Resources) -> Resources:
    return R(min(a.cpu, b.cpu), min(a.mem, b.mem), min(a.disk, b.disk), min(a.gpu, b.gpu))


def _cap(r: Resources, limit: Resources | None) -> Resources:
    """r capped by a limit (zero dimensions unlimited)."""
    if limit is None:
        return r
    big = 10**9
    return _min_vec(r, R(limit.cpu or big, limit.mem or big, limit.disk or big, limit.gpu or big))


@st.composite
def scenarios(draw: st.DrawFn, consistent: bool = False, interior_demand: bool = False) -> Scenario:
    """A random pool tree (up to 12 pools, depth up to 3 below the root) with random policies, and random
    demand and allocation on its leaves (on interior pools too when `interior_demand`).

    `consistent`: reservations fit everywhere: each pool's is within its limit, the root's children's sum to at
    most the root's entitlement (capacity capped by the root's limit), and every pool's children's sum to at most
    its own reservation."""
    capacity = _vector(draw, sparse=False)
    root_limit = _maybe_vector(draw)
    pools = {"/": P("/", limit=root_limit)}
    budget = {"/": _cap(capacity, root_limit)}  # what the children's reservations may still take
    n = draw(st.integers(1, 11))
    for i in range(n):
        parents = sorted(p for p in pools if len(ancestors(p)) <= 3)
        parent = parents[draw(st.integers(0, len(parents) - 1))]
        path = f"{parent.rstrip('/')}/p{i}"
        limit = _maybe_vector(draw)
        reservation = _vector(draw) if draw(st.booleans()) else R()
        if consistent:
            reservation = _cap(_min_vec(reservation, budget[parent]), limit)
            budget[parent] = budget[parent] - reservation
            budget[path] = reservation
        pools[path] = P(
            path,
            reservation=reservation,
            limit=limit,
            share=_SHARES[draw(st.integers(0, len(_SHARES) - 1))],
            static=draw(st.booleans()),
        )
    kids = children_of(pools)
    holders = [p for p in pools if interior_demand or not kids[p]]
    demand = {p: v for p in holders if (v := _maybe_vector(draw)) is not None}
    allocation = {p: v for p in holders if (v := _maybe_vector(draw)) is not None}
    return Scenario(pools, capacity, demand, allocation)


def _has_static_below(pools: dict[str, PoolPolicy], path: str) -> bool:
    return any(pools[q].static for q in pools if path in ancestors(q))


# ---------------------------------------------------------------------------------------------------- properties

# Generating a tree costs ~6 ms of Hypothesis' time; 150 trees a property keeps the file near 8 s on 2 cores.
PROPERTY = settings(max_examples=150, deadline=None)


@given(scenarios(interior_demand=True))
@PROPERTY
def test_within_capacity_parents_and_limits(s: Scenario) -> None:
    """The root gets at most the capacity, children together at most their parent, and nobody beyond its limit
    in a limited dimension."""
    e = entitlements(s.pools, s.capacity, s.demand, s.allocation)
    assert set(e) == set(s.pools)
    kids = children_of(s.pools)
    for dim in DIMS:
        assert close_le(getattr(e["/"], dim), getattr(s.capacity, dim))
        for p, cs in kids.items():
            assert getattr(e[p], dim) >= 0
            assert getattr(e[p], dim) <= lim(s.pools[p], dim), (p, dim)  # exact: the algorithm clamps
            assert close_le(sum(getattr(e[c], dim) for c in cs), getattr(e[p], dim)), (p, dim)


@given(scenarios(consistent=True))
@PROPERTY
def test_reservations_that_fit_are_honoured(s: Scenario) -> None:
    """With consistent reservations, a pool whose want covers its reservation, and any static pool, gets at
    least its reservation."""
    e = entitlements(s.pools, s.capacity, s.demand, s.allocation)
    w = want(s.pools, s.demand, s.allocation)
    for p, pol in s.pools.items():
        if p == "/":
            continue
        for dim in DIMS:
            r = getattr(pol.reservation, dim)
            if pol.static or getattr(w[p], dim) >= r:
                assert close_le(r, getattr(e[p], dim)), (p, dim)


@given(scenarios(interior_demand=True))
@PROPERTY
def test_work_conserving(s: Scenario) -> None:
    """A pool short of its want means its parent gave everything away: to its children, and to its own gangs
    no more than they want (with demand on leaves only: all of it to the children)."""
    e = entitlements(s.pools, s.capacity, s.demand, s.allocation)
    w = want(s.pools, s.demand, s.allocation)
    kids = children_of(s.pools)
    for p in s.pools:
        if p == "/":
            continue
        parent = ancestors(p)[1]
        for dim in DIMS:
            if close_le(getattr(w[p], dim), getattr(e[p], dim)):
                continue  # satisfied
            own = sum(getattr(m.get(parent, R()), dim) for m in (s.demand, s.allocation))
            given_out = sum(getattr(e[c], dim) for c in kids[parent])
            assert close_le(getattr(e[parent], dim), given_out + own), (p, dim)


@given(scenarios(interior_demand=True))
@PROPERTY
def test_unsatisfied_siblings_split_by_share(s: Scenario) -> None:
    """Among elastic siblings without reservation, the unsatisfied ones all stand at one level of entitlement
    per share, and no sibling stands above it (max-min fair)."""
    e = entitlements(s.pools, s.capacity, s.demand, s.allocation)
    w = want(s.pools, s.demand, s.allocation)
    kids = children_of(s.pools)
    for cs in kids.values():
        plain = [c for c in cs if not s.pools[c].static and s.pools[c].reservation == R()]
        for dim in DIMS:
            def level(c: str, dim: str = dim) -> float:
                return getattr(e[c], dim) / s.pools[c].share
            short = [c for c in plain if not close_le(getattr(w[c], dim), getattr(e[c], dim))]
            for a in short:
                for b in plain:
                    assert close_le(level(b), level(a)), (a, b, dim)
                    if b in short:
                        assert level(a) == pytest.approx(level(b), rel=REL, abs=ABS), (a, b, dim)


@given(scenarios(interior_demand=True))
@PROPERTY
def test_elastic_pools_get_no_more_than_they_want(s: Scenario) -> None:
    """Without a static pool in its subtree, a pool (other than the root) is entitled to at most its want:
    nothing is handed to a pool that cannot use it."""
    e = entitlements(s.pools, s.capacity, s.demand, s.allocation)
    w = want(s.pools, s.demand, s.allocation)
    for p in s.pools:
        if p != "/" and not _has_static_below(s.pools, p):
            for dim in DIMS:
                assert close_le(getattr(e[p], dim), getattr(w[p], dim)), (p, dim)


@given(scenarios(interior_demand=True), SPARSE_VECTORS)
@PROPERTY
def test_more_capacity_never_lowers_an_entitlement(s: Scenario, more: Resources) -> None:
    e = entitlements(s.pools, s.capacity, s.demand, s.allocation)
    bigger = entitlements(s.pools, s.capacity + more, s.demand, s.allocation)
    for p in s.pools:
        for dim in DIMS:
            assert close_le(getattr(e[p], dim), getattr(bigger[p], dim)), (p, dim)


@given(scenarios(interior_demand=True))
@settings(max_examples=100, deadline=None)
def test_want_is_capped_demand_plus_allocation_summed_up_the_tree(s: Scenario) -> None:
    w = want(s.pools, s.demand, s.allocation)
    kids = children_of(s.pools)
    for p, pol in s.pools.items():
        assert w[p].ports == 0
        for dim in DIMS:
            own = sum(getattr(m.get(p, R()), dim) for m in (s.demand, s.allocation))
            below = sum(getattr(w[c], dim) for c in kids[p])
            assert getattr(w[p], dim) == pytest.approx(min(own + below, lim(pol, dim)), rel=REL, abs=ABS)


@given(scenarios(interior_demand=True))
@settings(max_examples=60, deadline=None)
def test_a_kept_tree_gives_what_a_tree_made_anew_gives(s: Scenario) -> None:
    """The resource manager keeps the pools' tree between computations (pool_tree): the answers are the same as
    without it, and a tree of other pools is not used."""
    t = pool_tree(s.pools)
    assert entitlements(s.pools, s.capacity, s.demand, s.allocation, t) == entitlements(
        s.pools, s.capacity, s.demand, s.allocation)
    assert want(s.pools, s.demand, s.allocation, t) == want(s.pools, s.demand, s.allocation)
    other = pool_tree(tree(P("/x"), P("/x/y")))
    assert entitlements(s.pools, s.capacity, s.demand, s.allocation, other) == entitlements(
        s.pools, s.capacity, s.demand, s.allocation)


def test_the_tree_orders_parents_before_children_and_checks_the_tree() -> None:
    t = pool_tree(tree(P("/a"), P("/a/b"), P("/a/b/c"), P("/d")))
    assert t.kids["/"] == ["/a", "/d"] and t.kids["/a"] == ["/a/b"] and t.kids["/a/b/c"] == []
    for order, parent_first in ((t.top_down, True), (t.bottom_up, False)):
        for child, parent in (("/a", "/"), ("/a/b", "/a"), ("/a/b/c", "/a/b"), ("/d", "/")):
            assert (order.index(parent) < order.index(child)) == parent_first
    with pytest.raises(ValueError, match="parent /x is missing"):
        pool_tree(tree(P("/x/y")))
