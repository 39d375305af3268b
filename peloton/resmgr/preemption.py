"""Which running gangs a waiting gang may preempt, most preferred victim first. Pure: plain records in.

Two kinds (docs/pools.md, "Preemption"):
- **reclaim**: the waiting gang is within its pool's entitlement and no hosts fit it. Preemptible gangs of pools
  that hold more than their entitlement (in a dimension the waiting gang needs) are candidates, the pool most over
  its entitlement first. Within a pool, gangs whose removal leaves the pool at or above its entitlement come
  before those that would take it below (a pool is brought down to its entitlement, not under it, when the gang
  sizes allow). The root's own gangs are measured against the part of its entitlement its children do not take.
- **priority**: preemptible gangs of the waiting gang's own pool with a lower priority, whatever the entitlements.

Within either, the lowest priority first, then the gang that has run for the shortest time (it loses the least
work). Non-preemptible gangs, gangs not launching yet (admitted or placed, their placement not yet taken by jobmgr,
which preempts launching and running gangs only) and gangs already being preempted are never candidates. The placement engine then picks the victims among these with the placer
(placement/victims.py); the resource manager waits a settling window before it asks, so a blip does not preempt.

`find_probes` turns the pools' first starved gangs into probes (a waiting gang with its candidates) for the
placement engine; `Preemptions` keeps the victims it chose until they let go, and the orders for jobmgr.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from peloton.domain.allocation import Entitlement, Holding
from peloton.domain.model import ResourcePool
from peloton.domain.placement import GangRequest
from peloton.domain.resources import Resources
from peloton.resmgr.admission import admit, entitled
from peloton.resmgr.holdings import Holdings
from peloton.resmgr.paths import chain
from peloton.resmgr.queues import Entry, State

_EPS = 1e-6
_DIMS = ("cpu", "mem", "disk", "gpu")
PROBE_EVERY_S = 1.0  # a waiting gang asks the placement engine for victims at most this often
RESERVATION_REFRESH_S = 5.0  # a gang holding a reservation asks again this often (its expected start moves)
MAX_CANDIDATES = 256  # per probe
MAX_ENDING = 4096  # gangs with a max_runtime sent with a probe (the earliest ends)
KINDS = ("reclaim", "priority")  # `order`'s kinds: for a gang of another pool, for one of the victim's own pool


@dataclass(frozen=True, slots=True)
class Probe:
    """A waiting gang that only preemption can start, with its candidate victims (most preferred first) and what
    they must free besides hosts."""

    gang: GangRequest
    candidates: tuple[tuple[str, Holding], ...]
    need: Resources
    ending: tuple[tuple[str, Holding], ...] = ()  # placed gangs with a max_runtime, earliest end first


def _victim_order(item: tuple[str, Holding]) -> tuple[int, float, str]:
    gid, h = item
    return h.priority, -h.since, gid


def _eligible(gid: str, h: Holding, excluded: Collection[str]) -> bool:
    return h.preemptible and bool(h.usage) and h.launched and gid not in excluded


def priority_candidates(priority: int, pool: str, holdings: Mapping[str, Holding], in_pool: Iterable[str],
                        excluded: Collection[str] = ()) -> list[str]:
    """Gangs of `pool` (`in_pool`: the ids of those holding resources) with a priority below `priority`."""
    found = [(gid, holdings[gid]) for gid in in_pool if gid in holdings]
    found = [(gid, h) for gid, h in found if h.pool == pool and h.priority < priority and _eligible(gid, h, excluded)]
    return [gid for gid, _ in sorted(found, key=_victim_order)]


def reclaim_candidates(need: Resources, pool: str, holdings: Mapping[str, Holding],
                       by_pool: Mapping[str, Iterable[str]], own_alloc: Mapping[str, Resources],
                       ent: Mapping[str, Entitlement], capacity: Resources,
                       excluded: Collection[str] = ()) -> list[str]:
    """Gangs of other pools that hold more than their entitlement in a dimension `need` (the waiting gang's total)
    asks for, most over first; within each pool those that keep it at its entitlement first. An interior pool's
    own gangs (the root's) count against the part of its entitlement its children do not take."""
    dims = [d for d in _DIMS if getattr(need, d) > 0]
    over: list[tuple[float, str, Entitlement]] = []
    kids = _children_sums(ent)
    for p in by_pool:
        if p == pool or p not in ent:
            continue
        e, held = _own_share(p, ent, kids), own_alloc.get(p, Resources())
        score = sum(max(0.0, getattr(held, d) - float(getattr(e, d))) / max(float(getattr(capacity, d)), 1.0)
                    for d in dims)
        if score > _EPS:
            over.append((-score, p, e))
    keep_whole: list[str] = []
    then: list[str] = []
    for _, p, e in sorted(over, key=lambda o: o[:2]):
        left = own_alloc.get(p, Resources())
        mine = sorted(((gid, holdings[gid]) for gid in by_pool[p] if gid in holdings), key=_victim_order)
        for gid, h in mine:
            if not _eligible(gid, h, excluded):
                continue
            if not any(getattr(left, d) > float(getattr(e, d)) + _EPS for d in dims):
                break  # the pool is at its entitlement now: the rest of its gangs stay
            after = left - h.total
            (keep_whole if all(getattr(after, d) + _EPS >= float(getattr(e, d)) for d in dims) else then).append(gid)
            left = after
    return keep_whole + then


def _children_sums(ent: Mapping[str, Entitlement]) -> dict[str, list[float]]:
    """Per pool with children, its children's entitlements summed (per dimension)."""
    out: dict[str, list[float]] = {}
    for c, e in ent.items():
        if c != "/":
            s = out.setdefault(chain(c)[1], [0.0, 0.0, 0.0, 0.0])
            for i, d in enumerate(_DIMS):
                s[i] += float(getattr(e, d))
    return out


def _own_share(p: str, ent: Mapping[str, Entitlement], kids: Mapping[str, list[float]]) -> Entitlement:
    """What the entitlement of pool `p` gives its own gangs (`by_pool` and `own_alloc` count only those): all of it
    for a leaf; for a pool with children (the root, whose own gangs share the cluster with its children as one more
    child: entitlement.py), what its children's entitlements (`kids`: `_children_sums`) leave. Its own gangs
    beyond that share are as much a reclaim's candidates as another pool's: the root is every pool's ancestor, and
    its gangs that took the whole cluster while the other pools were idle would otherwise keep a reserved pool
    from its share for ever."""
    e, below = ent[p], kids.get(p)
    if below is None:
        return e
    return Entitlement(*(max(0.0, float(getattr(e, d)) - below[i]) for i, d in enumerate(_DIMS)))


def shortfall(total: Resources, pool: str, pools: Mapping[str, ResourcePool], ent: Mapping[str, Entitlement],
              allocated: Mapping[str, Resources]) -> Resources:
    """What the pools on the way to the root (the root itself aside) lack for a gang of `total`: by how much, per
    dimension, the gang would go over the tightest of their entitlements and limits. Victims of the same pool free
    it; zero when nothing on the way blocks the gang."""
    need = {d: 0.0 for d in _DIMS}
    for p in chain(pool):
        if p == "/":
            continue
        used = allocated.get(p, Resources())
        e, limit = ent.get(p), pools[p].limit if p in pools else None
        for d in _DIMS:
            bounds = []
            if e is not None:
                v = float(getattr(e, d))
                bounds.append(float(int(v + _EPS)) if d == "gpu" else v)
            if limit is not None and getattr(limit, d):
                bounds.append(float(getattr(limit, d)))
            if bounds:
                need[d] = max(need[d], getattr(used, d) + getattr(total, d) - min(bounds))
    return Resources(max(0.0, need["cpu"]), max(0.0, need["mem"]), max(0.0, need["disk"]),
                     max(0, math.ceil(need["gpu"] - _EPS)), 0)


def find_probes(heads: Iterable[Entry], now: float, room: int, settle_s: float, preempt: bool, holdings: Holdings,
                pools: Mapping[str, ResourcePool], ent: Mapping[str, Entitlement], capacity: Resources,
                preempting: Collection[str]) -> list[Probe]:
    """At most `room` probes for the placement engine, from `heads` (each pool's first starved gang, best first):
    those past the settling window (`settle_s`), not asked about too recently, not refused by their own
    reservation and not already waiting for victims. A gang blocked by its pool gets the candidates that free
    its pool's share (`preempt` False: none); one within its pool's limits and entitlement but without hosts also
    those of pools over their entitlement, and the gangs that end soonest (the placement engine keeps their hosts
    for it); one without hosts but beyond its entitlement (a borrower) is probed as one its pool blocks. Marks each
    probed entry's `probed_at`."""
    out: list[Probe] = []
    for e in heads:
        if len(out) >= room:
            break
        every = RESERVATION_REFRESH_S if e.reservation is not None else PROBE_EVERY_S
        if (e.starved_since is None or now - e.starved_since < settle_s or now - e.probed_at < every
                or e.block == "reservation" or e.pending_victims(preempting)):
            continue
        e.probed_at = now
        g = e.req
        # only hosts keep it waiting when it is within its pool's limits and entitlement now: a gang that found no
        # hosts after it borrowed beyond its entitlement (or whose entitlement shrank since) takes nothing back
        # from other pools, nor has hosts kept for it; it is probed as one its pool blocks
        hosts = e.block == "hosts" and (admit(g.total, g.respool, pools, holdings.allocated) is None
                                        and entitled(g.total, g.respool, ent, holdings.allocated) is None)
        cands: list[str] = []
        need = Resources()
        if preempt:
            if hosts:  # within its entitlement: other pools over theirs give back first
                cands = reclaim_candidates(g.total, g.respool, holdings.by_gang, holdings.pool_gangs, holdings.own,
                                           ent, capacity, preempting)
            else:
                need = shortfall(g.total, g.respool, pools, ent, holdings.allocated)
            cands += priority_candidates(g.priority, g.respool, holdings.by_gang,
                                         holdings.pool_gangs.get(g.respool, ()), preempting)
        ending: tuple[tuple[str, Holding], ...] = ()
        if hosts:  # entitled, no hosts: the hosts that free up earliest are kept for it
            ending = holdings.earliest_ends(MAX_ENDING)
        if cands or hosts:
            out.append(Probe(g, holdings.of(cands[:MAX_CANDIDATES]), need, ending))
    return out


class Preemptions:
    """The gangs ordered preempted and not yet gone, and the orders jobmgr has not taken yet. An order is given
    again after a while when its gang is still there (the job manager that got it restarted)."""

    def __init__(self) -> None:
        self.preempting: dict[str, tuple[int, float, str]] = {}  # victim -> (attempt, ordered at, reason)
        self.orders: dict[str, tuple[int, str]] = {}  # victim -> (attempt, reason) for jobmgr's next take

    def clear(self) -> None:
        self.preempting.clear()
        self.orders.clear()

    def forget(self, gang_id: str) -> None:
        """The gang released what it held: it is no longer a victim."""
        self.preempting.pop(gang_id, None)
        self.orders.pop(gang_id, None)

    def order(self, e: Entry, attempt: int, victims: Sequence[tuple[str, int]], holdings: Holdings,
              now: float) -> list[tuple[str, str]]:
        """The placement engine chose `victims` (gang id, attempt) for waiting gang attempt `e`/`attempt`: order
        them preempted and make `e` wait for them, unless anything moved on meanwhile (then nothing is ordered and
        the gang simply asks again). Returns (pool, kind) per victim ordered, kind reclaim or priority."""
        if e.req.attempt != attempt or e.state != State.WAITING or not victims:
            return []
        for gid, a in victims:
            h = holdings.get(gid)
            if h is None or h.attempt != a or gid in self.preempting or not h.preemptible:
                return []
        out = []
        for gid, a in victims:
            h = holdings.by_gang[gid]
            kind = "priority" if h.pool == e.req.respool else "reclaim"
            reason = (f"for gang {e.req.gang_id} of pool {e.req.respool} (priority {e.req.priority})"
                      if kind == "priority"
                      else f"pool {h.pool} is over its entitlement and pool {e.req.respool} needs its share back "
                           f"for gang {e.req.gang_id}")
            self.preempting[gid] = (a, now, reason)
            self.orders[gid] = (a, reason)
            out.append((h.pool, kind))
        e.waits_for = tuple(gid for gid, _ in victims)
        return out

    def again(self, now: float, after_s: float) -> None:
        """Order again each victim ordered `after_s` ago or earlier and still there."""
        for gid, (attempt, at, reason) in self.preempting.items():
            if now - at >= after_s:
                self.preempting[gid] = (attempt, now, reason)
                self.orders[gid] = (attempt, reason)

    def take(self) -> list[tuple[str, int, str]]:
        """The orders not yet given, each (gang id, attempt, reason); given now."""
        out = [(gid, attempt, reason) for gid, (attempt, reason) in self.orders.items()]
        self.orders.clear()
        return out
