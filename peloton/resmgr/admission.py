"""Admission of a whole gang against its pool and every ancestor. Pure.

A gang counts against its pool and all its ancestors. It is admitted when, whole, it fits
- in every `limit` on the way to the root (`admit`);
- in the entitlement of every pool on the way but the root (`entitled`; entitlement.py computes them; the root's is
  the cluster, where placement decides);
- and, when it is not preemptible, in its own pool's reservation (`within_reservation`): work that cannot be
  preempted never sits on capacity borrowed from another pool. The root reserves nothing and takes anything.

`admission_round` applies these to the queues (queues.py) and the holdings (holdings.py) in queue order;
`admission_if` asks the same of a job not yet created (a dry run), changing nothing.
"""

from __future__ import annotations

import bisect
import functools
import heapq
from collections.abc import Container, Mapping, Sequence

from peloton.domain.allocation import AdmissionPreview, Entitlement, GangAsk, Holding, whole_gpus
from peloton.domain.model import ResourcePool
from peloton.domain.placement import GangRequest
from peloton.domain.resources import Resources, within
from peloton.domain.resources import show_quantity as _show  # (one rule for every message)
from peloton.placement.reservation import BACKFILL_SLACK_S, behind
from peloton.resmgr.entitlement import entitlements, policies
from peloton.resmgr.holdings import Holdings
from peloton.resmgr.paths import add, chain
from peloton.resmgr.queues import Entry, Order, Queues, State

_DIMS = ("cpu", "mem", "disk", "gpu")
_EPS = 1e-6
_NONE = Resources()
BACKFILL_DEPTH = 32  # the gangs behind a waiting first gang looked at for backfill, per pool and round
MAX_ENDING = 4096  # the placed gangs with a max_runtime, earliest end first, an admission estimate frees
_AFTER_STOP = -1.0  # a first gang may borrow no sooner than the first one that could not borrow could


def admit(
    gang_total: Resources,
    pool_path: str,
    pools: Mapping[str, ResourcePool],
    allocated: Mapping[str, Resources],
) -> str | None:
    """None when the gang may be admitted; otherwise the reason it waits. `allocated[p]` is what gangs in p and
    its descendants hold now."""
    if pool_path not in pools:
        return f"resource pool {pool_path} does not exist"
    for p in chain(pool_path):
        pool = pools.get(p)
        if pool is None or pool.limit is None:
            continue
        used = allocated.get(p, Resources())
        after = used + gang_total
        short = after.short_of(Resources(pool.limit.cpu, pool.limit.mem, pool.limit.disk, pool.limit.gpu, 10**9))
        short = [d for d in short if _limited(pool.limit, d)]
        if short:
            return (
                f"waiting for admission: pool {p} limit {_limits(pool.limit)} would be exceeded in "
                f"{', '.join(short)} (allocated {used.describe()}, gang needs {gang_total.describe()})"
            )
    return None


def exceeds_limit_forever(gang_total: Resources, pool_path: str, pools: Mapping[str, ResourcePool]) -> str | None:
    """A gang larger than a limit on its path can never be admitted."""
    for p in chain(pool_path):
        pool = pools.get(p)
        if pool is None or pool.limit is None:
            continue
        short = [d for d in gang_total.short_of(Resources(pool.limit.cpu, pool.limit.mem, pool.limit.disk,
                                                            pool.limit.gpu, 10**9)) if _limited(pool.limit, d)]
        if short:
            return f"gang needs {gang_total.describe()}, more than pool {p} limit {_limits(pool.limit)} ({', '.join(short)})"
    return None


def admission_round(queues: Queues, holdings: Holdings, pools: Mapping[str, ResourcePool],
                    ent: Mapping[str, Entitlement], max_n: int, now: float, retry_s: float,
                    preempting: Container[str], fifo: bool = False) -> list[Entry]:
    """Admit up to `max_n` waiting gangs, best first across the pools: each admitted gang goes PLACING and holds
    its total at once, so the next one is checked against it. A pool whose first gang does not fit its pool's
    limit or entitlement admits nothing more within its entitlement this round: the gangs behind it wait too (else
    a stream of small gangs would take every freed share and it would never run), but for two exceptions below. A
    non-preemptible gang refused by its own pool's reservation waits `retry_s` and the gangs behind it go on.
    Refused gangs are marked starved (they may preempt) with their reason. Returns the admitted entries in order.

    Then, with the cluster's capacity known (`ent` has the root's):
    - **borrowing** (work conservation): the pools' first gangs refused by entitlement alone, best first, are
      admitted beyond it while they fit the capacity nobody holds; the first that does not fit stops it, so the
      capacity that frees up goes to it before any later one borrows (`_borrow`);
    - **backfill** (not under `fifo`): behind a first gang still waiting, a gang of its pool with an
      sla.max_runtime that ends before the first one could be admitted at the latest, and that fits its own
      pool's entitlement and the free capacity, is admitted: it cannot delay it (`_backfill`).

    `fifo` (placement order fifo): nothing ordered behind the first gang that waits for hosts (placement found
    none) is admitted, in any pool, until it is placed; the first gang of each pool behind it says so."""
    out: list[Entry] = []
    first = queues.first_unplaced() if fifo else None
    barrier = first.order() if first is not None else None
    refused: list[tuple[Entry, str]] = []  # the pools' first gangs refused by a limit or an entitlement, in order
    # the pools' queues merged by their heads: a round costs O(pools + admitted), not O(waiting gangs)
    heads: list[tuple[Order, str]] = []
    for pool in queues.waiting_pools():
        head = queues.head(pool)
        if head is not None:
            heads.append((head.order(), pool))
    heapq.heapify(heads)
    while heads and len(out) < max_n:
        _, pool = heapq.heappop(heads)
        e = queues.head(pool)
        if e is None:
            continue
        if first is not None and barrier is not None and e.order() > barrier:
            queues.set_reason(e, behind(first.req), now, preempting)
            continue  # (the heads come best first: every one left is behind it too, and says so)
        g = e.req
        reason = (admit(g.total, g.respool, pools, holdings.allocated)
                  or entitled(g.total, g.respool, ent, holdings.allocated))
        if reason is not None:
            refused.append((e, reason))  # (starved and told why below, unless it borrows)
            continue
        queues.pop_head(pool)
        nxt = queues.head(pool)
        if nxt is not None:
            heapq.heappush(heads, (nxt.order(), pool))
        if not g.preemptible:
            reason = within_reservation(g.total, g.respool, pools, holdings.pinned)
            if reason is not None:  # its own rule: the gangs behind it go on
                queues.starve(e, now, "reservation")
                queues.set_reason(e, reason, now, preempting)
                e.not_before = now + retry_s
                queues.push(e, now)
                continue
        _take(queues, holdings, e, out)
    cap = ent.get("/")
    if refused and cap is not None:
        free = _free(cap, holdings.allocated, pools, ent)
        waiting, stop = _borrow(queues, holdings, pools, ent, refused, free, max_n, out)
        if not fifo:
            _backfill(queues, holdings, pools, ent, waiting, stop, free, max_n, now, out)
        refused = [(e, r + _borrowing(e, stop, admit(e.req.total, e.req.respool, pools, holdings.allocated)
                                      is not None)) for e, r in refused if e.state == State.WAITING]
    for e, reason in refused:
        queues.starve(e, now, "pool")
        queues.set_reason(e, reason, now, preempting)
    return out


def _take(queues: Queues, holdings: Holdings, e: Entry, out: list[Entry]) -> None:
    queues.admit(e)
    holdings.hold(e.req)
    out.append(e)


def _borrow(queues: Queues, holdings: Holdings, pools: Mapping[str, ResourcePool], ent: Mapping[str, Entitlement],
            refused: Sequence[tuple[Entry, str]], free: list[float], max_n: int,
            out: list[Entry]) -> tuple[list[tuple[Entry, float | None]], Entry | None]:
    """Admit, best first, the pools' first gangs that only an entitlement refused while they fit the free capacity
    (`free`, taken down by each): without it, two pools whose first gangs are each wider than their pool's share
    would both wait for ever beside idle capacity. A preemptible borrower makes its pool hold more than its
    entitlement, so the pools whose share it uses take it back by preemption (reclaim), when that is on; a
    non-preemptible one still runs only within its own pool's reservation. The first gang that does not fit the
    free capacity stops the borrowing: what frees up is kept for it (else smaller gangs of other pools would borrow
    it first, for ever), and the gangs after it can borrow no earlier than it could be admitted.
    Returns the first gangs still waiting, each with the time it could borrow no earlier than (0: now;
    _AFTER_STOP: when the first that could not borrow could), and that one (None: none)."""
    left: list[tuple[Entry, float | None]] = []
    stop: Entry | None = None
    after = 0.0  # borrowing is open from then on (0: now; _AFTER_STOP: once the first that could not borrow could)
    for e, _ in refused:
        g = e.req
        if (after == 0.0 and len(out) < max_n and queues.head(g.respool) is e
                and admit(g.total, g.respool, pools, holdings.allocated) is None):  # (a limit is never borrowed)
            if not _fits(g.total, free):
                left.append((e, 0.0))
                stop = e
                after = _AFTER_STOP  # the gangs after it borrow no sooner than it could (found when needed)
                continue
            if g.preemptible or within_reservation(g.total, g.respool, pools, holdings.pinned) is None:
                queues.pop_head(g.respool)
                _take(queues, holdings, e, out)
                _use(free, g.total)
                continue
        left.append((e, after))
    return left, stop


def _borrowing(e: Entry, stop: Entry | None, limited: bool) -> str:
    """What a first gang refused by entitlement alone is told besides: when it may borrow beyond it (`stop`: the
    first gang that could not borrow, which the later ones wait for)."""
    if limited or stop is None:
        return ""
    if stop is e:
        return " (or beyond it, borrowing, once the cluster has room for the whole gang)"
    return f" (it may borrow beyond it only after gang {stop.req.gang_id}, ahead of it, does)"


def _backfill(queues: Queues, holdings: Holdings, pools: Mapping[str, ResourcePool], ent: Mapping[str, Entitlement],
              waiting: Sequence[tuple[Entry, float | None]], stop: Entry | None, free: list[float], max_n: int,
              now: float, out: list[Entry]) -> None:
    """Behind each pool's first gang still waiting (`waiting`: with the time it may borrow from), admit the gangs
    of its pool that cannot delay it: each has an sla.max_runtime ending (with BACKFILL_SLACK_S) before the first
    gang could be admitted at the latest (`_earliest`), and fits its pool's limits and entitlement, the free
    capacity and, when not preemptible, its pool's reservation. Nothing backfills while that time is not known
    (the gangs in the way have no max_runtime)."""
    if not holdings.ending:
        return  # nothing ends at a known time: no first gang's admission time is known
    ending: list[tuple[float, Holding]] | None = None  # (the same for every pool: found once, when needed)
    stop_at: list[float | None] = []  # when `stop` could borrow (found once, when needed)
    free0 = list(free)  # (as it was before this backfill: `stop`'s estimate must not move with it)
    for head, borrow_from in waiting:
        if len(out) >= max_n:
            return
        # the gangs that could backfill at all first: most pools have none, and the estimate is the dear part
        behind = [e for e in queues.behind(head.req.respool, BACKFILL_DEPTH)
                  if e.req.max_runtime_s and _fits(e.req.total, free)]
        if not behind:
            continue
        if ending is None:
            ending = _ends(holdings, now)
        if borrow_from == _AFTER_STOP:
            if not stop_at:
                stop_at.append(_earliest(stop.req, pools, ent, holdings, free0, 0.0, ending)[1] if stop else None)
            borrow_from = stop_at[0]
        by = _earliest(head.req, pools, ent, holdings, free, borrow_from, ending)
        start = min((t for t in by if t is not None), default=None)
        if start is None or start <= now:
            continue
        for e in behind:
            if len(out) >= max_n:
                return
            g = e.req
            if now + g.max_runtime_s + BACKFILL_SLACK_S > start or not _fits(g.total, free):
                continue
            if (admit(g.total, g.respool, pools, holdings.allocated) is not None
                    or entitled(g.total, g.respool, ent, holdings.allocated) is not None
                    or (not g.preemptible
                        and within_reservation(g.total, g.respool, pools, holdings.pinned) is not None)):
                continue
            _take(queues, holdings, e, out)  # (its queue item goes stale: `head` and `behind` skip it)
            _use(free, g.total)


def _ends(holdings: Holdings, now: float) -> list[tuple[float, Holding]]:
    """The held gangs with an sla.max_runtime, each with when it ends at the latest (up to MAX_ENDING, earliest
    first): a placed one at its start plus its max_runtime; one admitted and not placed yet at `now` plus it, the
    earliest it can end (it starts no sooner than it is placed). Not placed, it must not be taken to run for ever:
    a backfilled gang still being placed would push the first gang's latest admission time out, and a second gang
    ending after the true time would backfill and delay it. (An end estimated early only backfills less.)"""
    ends = []
    for gid in holdings.ending:
        h = holdings.by_gang[gid]
        end = h.ends_at if h.usage else now + h.max_runtime_s
        if end is not None:
            ends.append((end, gid, h))
    return [(end, h) for end, _, h in heapq.nsmallest(MAX_ENDING, ends, key=lambda x: (x[0], x[1]))]


def _earliest(g: GangRequest, pools: Mapping[str, ResourcePool], ent: Mapping[str, Entitlement],
              holdings: Holdings, free: Sequence[float], borrow_from: float | None,
              ending: Sequence[tuple[float, Holding]]) -> tuple[float | None, float | None]:
    """When gang `g`, waiting at the head of its pool, could be admitted at the latest, as the held gangs with an
    sla.max_runtime end by then (`ending`: `_ends`, earliest first; the others are taken to run for ever): (within
    its pool's limits and entitlements as they are now; as a borrower, within the limits and the free capacity,
    no earlier than `borrow_from`). Each is None when not reached (for borrowing, also when `borrow_from` is
    None)."""
    alloc = {p: holdings.allocated.get(p, _NONE) for p in chain(g.respool)}
    room = list(free)
    t_ent: float | None = None
    t_free: float | None = None
    if admit(g.total, g.respool, pools, alloc) is None and _fits(g.total, room):
        t_free = 0.0  # it fits now: only the order keeps it from borrowing
    for end, h in ending:
        if t_ent is not None and t_free is not None:
            break
        for p in chain(h.pool):
            if p in alloc:
                alloc[p] = alloc[p] - h.total
        room = [room[i] + getattr(h.total, _DIMS[i]) for i in range(4)]
        if admit(g.total, g.respool, pools, alloc) is not None:
            continue
        if t_ent is None and entitled(g.total, g.respool, ent, alloc) is None:
            t_ent = end
        if t_free is None and _fits(g.total, room):
            t_free = end
    if borrow_from is None or t_free is None:
        return t_ent, None
    return t_ent, max(t_free, borrow_from)


def _free(cap: Entitlement, allocated: Mapping[str, Resources], pools: Mapping[str, ResourcePool],
          ent: Mapping[str, Entitlement]) -> list[float]:
    """The capacity a gang may borrow, per dimension (whole GPUs): the cluster's that nobody holds, less what
    static pools hold for themselves while idle (the part of each one's reservation, within its entitlement, that
    its gangs do not use; a static pool inside another counts in both, which only lends less)."""
    held = allocated.get("/", _NONE)
    out = [cap.cpu - held.cpu, cap.mem - held.mem, cap.disk - held.disk, whole_gpus(cap.gpu) - held.gpu]
    for path, pool in pools.items():
        e = ent.get(path)
        if path == "/" or pool.reservation_type != "static" or e is None:
            continue
        used = allocated.get(path, _NONE)
        for i, d in enumerate(_DIMS):
            out[i] -= max(0.0, min(float(getattr(pool.reservation, d)), getattr(e, d)) - getattr(used, d))
    return out


def _fits(total: Resources, free: Sequence[float]) -> bool:
    return (within(total.cpu, free[0], _EPS) and within(total.mem, free[1], _EPS)
            and within(total.disk, free[2], _EPS) and total.gpu <= free[3] + _EPS)


def _use(free: list[float], total: Resources) -> None:
    for i, d in enumerate(_DIMS):
        free[i] -= getattr(total, d)


def admission_if(pool_path: str, gangs: Sequence[GangAsk], pools: Mapping[str, ResourcePool],
                 capacity: Resources | None, demand: Mapping[str, Resources], own: Mapping[str, Resources],
                 allocated: Mapping[str, Resources], pinned: Mapping[str, Resources],
                 waiting: Sequence[int], heads: Sequence[tuple[str, Resources, int]] = ()
                 ) -> list[AdmissionPreview]:
    """Would the gangs of a job not yet created, in pool `pool_path`, be admitted now? For each, in order: why it
    would wait ("": admitted now) by the same rules as `admission_round`, as if the job's earlier gangs were
    admitted (they hold their totals), against entitlements computed as if the pool also asked for the whole job
    (its gangs would be in its demand); and how many of the pool's waiting gangs (`waiting`: their priorities)
    are ahead of it: same or higher priority, queued before it. The arguments are copies; nothing is changed.
    No capacity known yet (or no root pool): no entitlement to check, as admission does then.

    A gang refused by the entitlement alone borrows (`borrows`, as `_borrow` admits it) when it would be its
    pool's first waiting gang (none ahead) and fits the capacity nobody holds (`_free`) once the other pools'
    first waiting gangs (`heads`: pool, total, priority) have had their turn, as an admission round gives it: each
    within its pool's limit and entitlement holds its total first; then those refused by their entitlement alone
    and ahead of it (same or higher priority: queued earlier) borrow in order, and the first of them that does
    not fit stops the borrowing. Only the pools' first gangs are looked at, not the gangs behind them."""
    ent: Mapping[str, Entitlement] = {}
    if capacity is not None and "/" in pools and pool_path in pools:
        with_job = dict(demand)
        for g in gangs:
            add(with_job, pool_path, g.total)
        ent = entitlements(policies(pools.values()), capacity, with_job, own)
    held, held_pinned = dict(allocated), dict(pinned)
    ranked = sorted(waiting)  # the gangs ahead by bisection: a job may have 100,000 gangs, a pool as many waiting
    cap = ent.get("/")
    out = []
    for g in gangs:
        ahead = len(ranked) - bisect.bisect_left(ranked, g.priority)
        limited = admit(g.total, pool_path, pools, held)
        reason = limited or entitled(g.total, pool_path, ent, held)
        borrows = False
        if reason is not None and limited is None and cap is not None and not ahead:
            stop, free = _borrow_room(g, heads, pools, ent, held, cap)
            if stop:
                reason += f" (it may borrow beyond it only after {stop}, ahead of it, does)"
            elif not _fits(g.total, free):
                reason += " (or beyond it, borrowing, once the cluster has room for the whole gang)"
            elif g.preemptible or within_reservation(g.total, pool_path, pools, held_pinned) is None:
                reason, borrows = None, True
        if reason is None and not g.preemptible:
            reason = within_reservation(g.total, pool_path, pools, held_pinned)
        out.append(AdmissionPreview(reason or "", ahead, borrows))
        for p in chain(pool_path):
            add(held, p, g.total)
        if not g.preemptible:
            add(held_pinned, pool_path, g.total)
    return out


def _borrow_room(g: GangAsk, heads: Sequence[tuple[str, Resources, int]], pools: Mapping[str, ResourcePool],
                 ent: Mapping[str, Entitlement], held: Mapping[str, Resources], cap: Entitlement
                 ) -> tuple[str, list[float]]:
    """What an admission round would leave `g` to borrow from: the capacity nobody holds once the other pools'
    first gangs (`heads`) within their limits and entitlements hold theirs, and those refused by their entitlement
    alone and ahead of `g` (same or higher priority) have borrowed, in order; and the first of these that does not
    fit, which stops the borrowing ("" when none)."""
    after = dict(held)
    borrowers = []
    for pool, total, priority in heads:
        if admit(total, pool, pools, after) is not None:
            continue  # (over a limit: it neither holds nor borrows)
        if entitled(total, pool, ent, after) is None:
            for p in chain(pool):
                add(after, p, total)
        elif priority >= g.priority:
            borrowers.append((pool, total))
    free = _free(cap, after, pools, ent)
    for pool, total in borrowers:
        if not _fits(total, free):
            return f"the first waiting gang of pool {pool}", free
        _use(free, total)
    return "", free


def _limits(limit: Resources) -> str:
    """Only the dimensions a limit limits (`gpu=8`, not `cpu=0,mem=0Mi,gpu=8`: a 0 there is no limit)."""
    return ",".join(f"{d}={_show(d, getattr(limit, d))}" for d in _DIMS if getattr(limit, d)) or "none"


def _limited(limit: Resources, dim: str) -> bool:
    # a zero in a limit means "not limited in this dimension" so `limit: {gpu: 8}` limits only GPUs
    return bool(getattr(limit, dim))


def entitled(gang_total: Resources, pool_path: str, ent: Mapping[str, Entitlement],
             allocated: Mapping[str, Resources]) -> str | None:
    """None when the gang fits in the entitlement of its pool and every ancestor below the root (no entitlements
    known: nothing to check); otherwise why it waits, naming the pool, the dimensions and the amounts."""
    if not ent:
        return None
    for p in chain(pool_path):
        e = ent.get(p)
        if p == "/" or e is None:
            continue
        used = allocated.get(p, _NONE)
        if (within(used.cpu + gang_total.cpu, e.cpu, _EPS) and within(used.mem + gang_total.mem, e.mem, _EPS)
                and within(used.disk + gang_total.disk, e.disk, _EPS)
                and used.gpu + gang_total.gpu <= _whole(e, "gpu")):
            continue
        return _over_entitlement(p, (e.cpu, e.mem, e.disk, e.gpu), (used.cpu, used.mem, used.disk, used.gpu),
                                 (gang_total.cpu, gang_total.mem, gang_total.disk, gang_total.gpu))
    return None


@functools.lru_cache(maxsize=4096)
def _over_entitlement(pool: str, ent: tuple[float, ...], used: tuple[float, ...], need: tuple[float, ...]) -> str:
    """The reason, formatted once per distinct case (many waiting gangs of a pool share it)."""
    whole = (ent[0], ent[1], ent[2], whole_gpus(ent[3]))
    short = [i for i in range(4) if not within(used[i] + need[i], whole[i], _EPS)]
    return ("waiting for admission: over pool " + pool + "'s entitlement in " + ", ".join(
        f"{_DIMS[i]} (entitled to {_show(_DIMS[i], ent[i])} now, holds {_show(_DIMS[i], used[i])}, the gang needs "
        f"{_show(_DIMS[i], need[i])})" for i in short))


def within_reservation(gang_total: Resources, pool_path: str, pools: Mapping[str, ResourcePool],
                       pinned: Mapping[str, Resources]) -> str | None:
    """None when a non-preemptible gang fits in its pool's reservation beside the pool's other non-preemptible
    gangs (`pinned`); the root takes anything. Otherwise why it waits."""
    pool = pools.get(pool_path)
    if pool_path == "/" or pool is None:
        return None
    used = pinned.get(pool_path, Resources())
    short = [d for d in _DIMS
             if not within(getattr(used, d) + getattr(gang_total, d), getattr(pool.reservation, d), _EPS)]
    if not short:
        return None
    return ("waiting for admission: the gang is not preemptible, so it runs only within pool " + pool_path
            + "'s reservation, short in " + ", ".join(
                f"{d} (reserves {_show(d, getattr(pool.reservation, d))}, its non-preemptible gangs hold "
                f"{_show(d, getattr(used, d))}, the gang needs {_show(d, getattr(gang_total, d))})" for d in short))


def _whole(e: Entitlement, dim: str) -> float:
    v = float(getattr(e, dim))
    return float(whole_gpus(v)) if dim == "gpu" else v


