"""Head-of-line reservation and backfill. Pure: the host index in, the index exactly as it was out (but for `hide`,
which the caller undoes).

When the first gang of a pool's queue is within its pool's entitlement and no hosts fit it, the resource manager
asks (with a probe) for the hosts it will get. The answer:
- the hosts that free up earliest: running gangs with an sla.max_runtime end by then, so they are freed on a
  what-if copy in the order of their ends until the placer places the gang; its expected start is the end of the
  last one freed;
- otherwise (the gangs in the way have no max_runtime) the hosts with the most free now, emptied on the what-if in
  growing batches until the gang fits; its start is not known.

Nothing else is placed on reserved hosts (the placement engine hides them), except a gang whose own max_runtime ends
before the reserved gang's expected start (backfill): it uses capacity that would otherwise stay idle and is gone
in time. A gang without max_runtime never backfills, and nothing backfills when the start is not known. The
reserved gang therefore starts within a bound: as soon as the gangs on its hosts end, at the latest at their
max_runtime.

Placement order `fifo` (`--placement-order fifo`) goes further: in the order the resource manager hands gangs out,
the first gang that does not fit stops the round, and none behind it is placed (no backfill at all, whatever their
max_runtime); the resource manager then admits nothing ordered behind it until it is placed (admission.py).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace

from peloton.domain.placement import GangPlacement, GangRequest, PlacementFailure
from peloton.placement.index import HostIndex, Vec
from peloton.placement.placer import place
from peloton.placement.victims import Candidate

BACKFILL_SLACK_S = 5.0  # margin on a max_runtime: it is enforced by a check every 5 s, not to the second
ORDERS = ("backfill", "fifo")  # --placement-order: head-of-line reservation and backfill | strict first in, first out


@dataclass(frozen=True, slots=True)
class Reservation:
    hosts: frozenset[str]
    start: float | None  # expected start (clock time); None: not known


def reserve(gang: GangRequest, ending: Sequence[tuple[Candidate, float]], index: HostIndex,
            closed: Collection[str] = ()) -> Reservation | None:
    """The hosts to keep for `gang` and when it is expected to start; None if it fits now or never would. `closed`
    hosts (draining) are never emptied for it: no new gang goes there, however empty they get."""
    freed: list[Candidate] = []
    emptied: dict[str, Vec] = {}
    try:
        hosts = _where(gang, index)
        if hosts is not None:
            return None
        for c, end in sorted(ending, key=lambda x: (x[1], x[0].gang_id)):
            index.shift(c.usage, 1)
            freed.append(c)
            hosts = _where(gang, index)
            if hosts is not None:
                return Reservation(hosts, end)
        # the rest: the hosts with the most free first (GPUs, then cpu), emptied whole, in batches of 1, 2, 4...
        order = sorted((h for h in index.states() if h.name not in closed), key=lambda h: (-h.gpu, -h.cpu, h.name))
        i, batch = 0, 1
        while i < len(order):
            for h in order[i:i + batch]:
                f = h.free()
                used: Vec = (h.capacity[0] - f[0], h.capacity[1] - f[1], h.capacity[2] - f[2],
                             h.capacity[3] - f[3], h.capacity[4] - f[4])
                if any(used):
                    emptied[h.name] = used
                    index.add_free({h.name: used}, 1)
            i, batch = i + batch, batch * 2
            hosts = _where(gang, index)
            if hosts is not None:
                return Reservation(hosts, None)
        return None
    finally:
        index.add_free(emptied, -1)
        for c in freed:
            index.shift(c.usage, -1)


def _where(gang: GangRequest, index: HostIndex) -> frozenset[str] | None:
    placed, _ = place([gang], index)
    if not placed:
        return None
    index.release(placed[0])
    return frozenset(m.hostname for m in placed[0].members)


def may_backfill(max_runtime_s: float, now: float, r: Reservation) -> bool:
    """Whether a gang with this sla.max_runtime (0: none) may use `r`'s hosts: only when it ends before `r`'s
    gang is expected to start."""
    return bool(max_runtime_s) and r.start is not None and now + max_runtime_s + BACKFILL_SLACK_S <= r.start


def describe(r: Reservation, now: float) -> str:
    """Why the reserved gang waits, for `job get` and `peloton queue`."""
    hosts = sorted(r.hosts)
    names = ", ".join(hosts[:4]) + (f" and {len(hosts) - 4} more" if len(hosts) > 4 else "")
    if r.start is None:
        return (f"waiting for reserved hosts {names} to free up (start not known: gangs there have no "
                f"sla.max_runtime)")
    return f"waiting for reserved hosts {names} to free up: expected to start in {max(0, math.ceil(r.start - now))}s"



def reserve_after(gang: GangRequest, victims: Sequence[Candidate], index: HostIndex) -> Reservation | None:
    """The hosts `gang` will get once `victims` (being preempted) are gone; start not known (their grace)."""
    for c in victims:
        index.shift(c.usage, 1)
    try:
        hosts = _where(gang, index)
    finally:
        for c in victims:
            index.shift(c.usage, -1)
    return Reservation(hosts, None) if hosts is not None else None


def place_around(gangs: Sequence[GangRequest], index: HostIndex, reservations: Mapping[tuple[str, int], Reservation],
                 now: float, order: str = "backfill") -> tuple[list[GangPlacement], list[PlacementFailure]]:
    """`place`, in order, but each gang sees the hosts reserved for others as full unless it may backfill.
    `order` "fifo": the first gang that does not fit stops the round; every gang after it fails too, untried,
    saying which gang it waits behind."""
    if order not in ORDERS:
        raise ValueError(f"order: must be one of {', '.join(ORDERS)}, got {order!r}")
    fifo = order == "fifo"
    if not reservations and not fifo:
        return place(gangs, index)
    placements: list[GangPlacement] = []
    failures: list[PlacementFailure] = []
    hidden: dict[str, Vec] = {}
    hidden_for: frozenset[str] = frozenset()
    blocker: GangRequest | None = None
    try:
        for g in gangs:
            if blocker is not None:
                failures.append(PlacementFailure(g.gang_id, g.job_id, g.attempt, behind(blocker)))
                continue
            keep_out = frozenset(h for key, r in reservations.items()
                                 if key != (g.gang_id, g.attempt) and not may_backfill(g.max_runtime_s, now, r)
                                 for h in r.hosts)
            if keep_out != hidden_for:
                index.unhide(hidden)
                hidden, hidden_for = index.hide(keep_out), keep_out
            p, f = place([g], index)
            placements += p
            if f and keep_out:
                f = [replace(f[0], reason=f"{f[0].reason} ({len(keep_out)} host(s) kept for gangs ahead in their "
                                          f"queues)")]
            failures += f
            if f and fifo:
                blocker = g
    finally:
        index.unhide(hidden)
    return placements, failures


def behind(blocker: GangRequest) -> str:
    """Why a gang waits under placement order fifo: one ahead of it does not fit yet."""
    return (f"waiting behind gang {blocker.gang_id} (pool {blocker.respool}), which is ahead of it and does not fit "
            f"yet (placement order fifo: nothing is placed before it)")
