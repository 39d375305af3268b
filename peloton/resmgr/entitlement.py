"""Each resource pool's entitlement: how much of the cluster it may use now. Pure: plain data in, plain data out.

Every dimension (cpu, mem, disk, gpu) is divided on its own, top-down from the root, whose entitlement is the
cluster's capacity capped by the root's limit. At each pool its entitlement is divided among its children:

1. Reservations first. A child claims its reservation: all of it when the child is static (held even when idle),
   only what it needs of it when elastic (unused reservation is lent to the others). Claims that together exceed
   the parent's entitlement are scaled down in proportion, so that more capacity never means less for anyone.
2. The rest is water-filled among the children that still need more: each takes at most what it needs beyond its
   claim, and what a satisfied child leaves is shared among the others in proportion to `share` (max-min fair).
3. No child gets beyond its limit: what a pool needs is capped by its limit, and so is a static reservation.

Leftover capacity that nobody wants stays with the parent, unassigned.

What a pool needs is its `want` (`min(allocation + demand, limit)` for a leaf, `min(sum of the children's wants,
limit)` above), raised by the reservations of static pools below it: a static pool holds its reservation even
under an elastic, idle parent, so that parent claims (and passes down) what its static descendants hold.

Gangs may wait in an interior pool too (the root is a common default). An interior pool's own demand and
allocation count as one more, implicit child of that pool: no reservation, elastic, share 1. What it gets is the
part of the pool's entitlement that its children's entitlements do not cover; it appears in no output.

Why entitlements are `Entitlement` (four floats) and not `Resources` (whose gpu is an int): dividing 3 GPUs
between two equal pools gives 1.5 each. Rounding down to whole GPUs would leave capacity unassigned while pools
still want it, and would break the split in proportion to share; rounding with largest remainders is not monotone
in capacity (the Alabama paradox). So the division stays fractional and exact; `Entitlement.whole()` rounds down
to whole GPUs for whoever must compare it with a gang's request.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from peloton.domain.allocation import Entitlement
from peloton.domain.model import ResourcePool
from peloton.domain.resources import Resources
from peloton.resmgr.paths import ancestors

DIMS = ("cpu", "mem", "disk", "gpu")

_OWN_SHARE = 1.0  # the weight of an interior pool's own gangs against its children


@dataclass(frozen=True, slots=True)
class PoolPolicy:
    """How one pool takes part in the division (ports are never part of it)."""

    path: str
    reservation: Resources = Resources()
    limit: Resources | None = None  # None or a 0 in a dimension: unlimited in that dimension
    share: float = 1.0  # weight for the surplus; > 0
    static: bool = False  # static: the reservation is held even when idle; elastic (default): unused reservation is lent

    def __post_init__(self) -> None:
        if not self.path.startswith("/"):
            raise ValueError(f"pool path must start with '/', got {self.path!r}")
        if not (math.isfinite(self.share) and self.share > 0):
            raise ValueError(f"pool {self.path}: share must be a positive number, got {self.share!r}")


def policies(pools: Iterable[ResourcePool]) -> dict[str, PoolPolicy]:
    """Each pool's part in the division, by path."""
    return {p.path: PoolPolicy(p.path, p.reservation, p.limit, p.share, p.reservation_type == "static")
            for p in pools}


@dataclass(frozen=True, slots=True)
class PoolTree:
    """The pools' shape: each one's children and the orders to walk them in. It changes only with the pools, not
    with demand or allocation, so the resource manager makes it once per set of pools (`pool_tree`) rather than
    at every computation of the entitlements (a gang enqueued makes one)."""

    policies: Mapping[str, PoolPolicy]
    kids: Mapping[str, list[str]] = field(repr=False)
    top_down: tuple[str, ...] = field(repr=False)  # parents before their children
    bottom_up: tuple[str, ...] = field(repr=False)  # children before their parents


def pool_tree(pools: Mapping[str, PoolPolicy]) -> PoolTree:
    """The tree of `pools` (every pool by path, "/" and each non-root pool's parent included: ValueError
    otherwise)."""
    return PoolTree(pools, _children(pools), tuple(sorted(pools, key=_depth)),
                    tuple(sorted(pools, key=_depth, reverse=True)))


def _tree_of(pools: Mapping[str, PoolPolicy], tree: PoolTree | None) -> PoolTree:
    """`tree` when it was made of these very pools, else theirs made now."""
    return tree if tree is not None and tree.policies is pools else pool_tree(pools)


def want(
    pools: Mapping[str, PoolPolicy],
    demand: Mapping[str, Resources],
    allocation: Mapping[str, Resources],
    tree: PoolTree | None = None,
) -> dict[str, Resources]:
    """Each pool's want: min(allocation + demand, limit) for a leaf; min(own gangs' + children's wants, limit)
    above. Ports 0. Entries of `demand` and `allocation` for unknown pools are ignored. `tree`: `pool_tree(pools)`
    if the caller keeps it."""
    t = _tree_of(pools, tree)
    per_dim = {dim: _wants(pools, t, dim, demand, allocation)[0] for dim in DIMS}
    return {
        p: Resources(per_dim["cpu"][p], per_dim["mem"][p], per_dim["disk"][p], int(per_dim["gpu"][p]))
        for p in pools
    }


def entitlements(
    pools: Mapping[str, PoolPolicy],
    capacity: Resources,
    demand: Mapping[str, Resources],
    allocation: Mapping[str, Resources],
    tree: PoolTree | None = None,
) -> dict[str, Entitlement]:
    """Every pool's entitlement (the root's and interior pools' included).

    `pools`: every pool by path, "/" included, each non-root pool's parent included (ValueError otherwise).
    `capacity`: the cluster's total. `demand`: per pool, what its waiting gangs need; `allocation`: per pool, what
    its admitted gangs hold now (normally leaves; missing: nothing). `tree`: `pool_tree(pools)`, if the caller
    keeps it (made here otherwise)."""
    t = _tree_of(pools, tree)
    kids = t.kids
    per_dim: dict[str, dict[str, float]] = {}
    for dim in DIMS:
        wants, needs = _wants(pools, t, dim, demand, allocation)
        ent = {"/": min(_nonneg(getattr(capacity, dim)), _limit(pools["/"], dim))}
        for p in t.top_down:
            children = kids[p]
            if not children:
                continue
            claims = [_claim(pools[c], dim, needs[c]) for c in children]
            caps = [needs[c] for c in children]
            shares = [pools[c].share for c in children]
            own = min(_own(p, dim, demand, allocation), _limit(pools[p], dim))
            if own > 0:  # the pool's own gangs: an implicit elastic child without reservation
                claims.append(0.0)
                caps.append(own)
                shares.append(_OWN_SHARE)
            parts = _split(ent[p], claims, caps, shares)
            for c, e in zip(children, parts, strict=False):  # the implicit child, if any, is last and dropped
                ent[c] = e
        per_dim[dim] = ent
    return {p: Entitlement(*(per_dim[dim][p] for dim in DIMS)) for p in pools}


def _split(total: float, claims: list[float], caps: list[float], shares: list[float]) -> list[float]:
    """One parent's entitlement `total` in one dimension among its children: the claims (reservations) first,
    scaled down in proportion when they do not fit; then the rest water-filled by share up to each `cap`.
    Every claim is at most its cap."""
    held = sum(claims)
    if held > total:
        # total >= 0, so held > 0. Scaling (rather than, say, serving claims in order) keeps every child's part
        # a non-decreasing function of total.
        f = total / held
        return [c * f for c in claims]
    room = [max(0.0, cap - c) for cap, c in zip(caps, claims, strict=True)]
    extra = _water_fill(total - held, room, shares)
    # min(cap, ...): float rounding must not lift a child above its cap (and so above its limit)
    return [min(cap, c + x) for cap, c, x in zip(caps, claims, extra, strict=True)]


def _water_fill(amount: float, room: list[float], shares: list[float]) -> list[float]:
    """Divide `amount` in proportion to `shares`, nobody beyond its `room`; what a full one leaves goes to the
    others. Children fill up in the order of room/share, so one pass (at most len(room) rounds) settles it."""
    out = [0.0] * len(room)
    order = sorted((i for i in range(len(room)) if room[i] > 0), key=lambda i: room[i] / shares[i])
    # weight[k]: the shares of order[k:], summed once so that no subtraction drifts
    weight = [0.0] * (len(order) + 1)
    for k in range(len(order) - 1, -1, -1):
        weight[k] = weight[k + 1] + shares[order[k]]
    left = amount
    for k, i in enumerate(order):
        if room[i] * weight[k] <= shares[i] * left:  # the common level reaches its room: it takes all it wants
            out[i] = room[i]
            left = max(0.0, left - room[i])
        else:  # it and every later one (more room per share) stop at the common level
            level = left / weight[k]
            for j in order[k:]:
                out[j] = shares[j] * level
            break
    return out


def _wants(
    pools: Mapping[str, PoolPolicy],
    tree: PoolTree,
    dim: str,
    demand: Mapping[str, Resources],
    allocation: Mapping[str, Resources],
) -> tuple[dict[str, float], dict[str, float]]:
    """(want, need) of every pool in one dimension, bottom-up. need >= want: it also counts what static pools
    in the subtree hold while idle."""
    wants: dict[str, float] = {}
    needs: dict[str, float] = {}
    kids = tree.kids
    for p in tree.bottom_up:
        pol = pools[p]
        lim = _limit(pol, dim)
        own = _own(p, dim, demand, allocation)
        wants[p] = min(lim, own + sum(wants[c] for c in kids[p]))
        need = min(lim, own + sum(needs[c] for c in kids[p]))
        if pol.static and p != "/":  # the root's entitlement is the capacity: nothing to hold there
            need = max(need, min(_nonneg(getattr(pol.reservation, dim)), lim))
        needs[p] = need
    return wants, needs


def _claim(pol: PoolPolicy, dim: str, need: float) -> float:
    """What a child takes of its parent's entitlement before any surplus is divided."""
    r = _nonneg(getattr(pol.reservation, dim))
    if pol.static:
        return min(r, _limit(pol, dim))
    return min(r, need)  # need <= limit already


def _children(pools: Mapping[str, PoolPolicy]) -> dict[str, list[str]]:
    """Each pool's children, in path order (deterministic). Checks the tree is whole."""
    if "/" not in pools:
        raise ValueError("the root pool '/' is missing")
    kids: dict[str, list[str]] = {p: [] for p in pools}
    for path in sorted(pools):
        if pools[path].path != path:
            raise ValueError(f"pool {pools[path].path} is filed under {path}")
        if path == "/":
            continue
        parent = ancestors(path)[1]
        if parent not in pools:
            raise ValueError(f"pool {path}: its parent {parent} is missing")
        kids[parent].append(path)
    return kids


def _depth(path: str) -> int:
    return len(ancestors(path))


def _own(path: str, dim: str, demand: Mapping[str, Resources], allocation: Mapping[str, Resources]) -> float:
    """What the gangs of `path` itself want in one dimension: held plus waiting."""
    d = demand.get(path)
    a = allocation.get(path)
    return (_nonneg(getattr(d, dim)) if d is not None else 0.0) + (_nonneg(getattr(a, dim)) if a is not None else 0.0)


def _limit(pol: PoolPolicy, dim: str) -> float:
    """The pool's limit in one dimension; 0 (or no limit at all) is unlimited."""
    v = float(getattr(pol.limit, dim)) if pol.limit is not None else 0.0
    return v if v > 0 else math.inf


def _nonneg(v: float) -> float:
    """Negative (or NaN) quantities count as nothing."""
    return float(v) if v > 0 else 0.0
