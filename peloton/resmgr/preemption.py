"""Which running gangs a waiting gang may preempt, most preferred victim first. Pure: plain records in.

Two kinds (docs/pools.md, "Preemption"):
- **reclaim**: the waiting gang is within its pool's entitlement and no hosts fit it. Preemptible gangs of pools
  that hold more than their entitlement (in a dimension the waiting gang needs) are candidates, the pool most over
  its entitlement first. Within a pool, gangs whose removal leaves the pool at or above its entitlement come
  before those that would take it below (a pool is brought down to its entitlement, not under it, when the gang
  sizes allow).
- **priority**: preemptible gangs of the waiting gang's own pool with a lower priority, whatever the entitlements.

Within either, the lowest priority first, then the gang that has run for the shortest time (it loses the least
work). Non-preemptible gangs, gangs whose hosts are not known yet (still being launched) and gangs already being
preempted are never candidates. The placement engine then picks the victims among these with the placer
(placement/victims.py); the resource manager waits a settling window before it asks, so a blip does not preempt.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping

from peloton.domain.allocation import Entitlement, Holding
from peloton.domain.model import ResourcePool
from peloton.domain.resources import Resources
from peloton.resmgr.admission import chain

_EPS = 1e-6
_DIMS = ("cpu", "mem", "disk", "gpu")


def _victim_order(item: tuple[str, Holding]) -> tuple[int, float, str]:
    gid, h = item
    return h.priority, -h.since, gid


def _eligible(gid: str, h: Holding, excluded: Collection[str]) -> bool:
    return h.preemptible and bool(h.usage) and gid not in excluded


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
    asks for, most over first; within each pool those that keep it at its entitlement first."""
    dims = [d for d in _DIMS if getattr(need, d) > 0]
    over: list[tuple[float, str]] = []
    for p in by_pool:
        if p == pool or p in chain(pool) or p not in ent:
            continue
        e, held = ent[p], own_alloc.get(p, Resources())
        score = sum(max(0.0, getattr(held, d) - float(getattr(e, d))) / max(float(getattr(capacity, d)), 1.0)
                    for d in dims)
        if score > _EPS:
            over.append((-score, p))
    keep_whole: list[str] = []
    then: list[str] = []
    for _, p in sorted(over):
        e, left = ent[p], own_alloc.get(p, Resources())
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
