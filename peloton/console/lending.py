"""Who lends GPUs to whom (pure), for the pools view: an attribution of what the pools hold now, not a ledger.

The scheduler records no loans: a pool's gangs hold what admission gave them, and a pool holding more than its
reservation is what reclaim preempts when another pool needs its own back (docs/pools.md). To answer "who lends to
whom", each group of sibling pools (the children of one pool, the top-level pools under the root) is read on its
own, in GPUs:

- a pool **borrows** what it holds beyond its reservation (`allocated - reservation`, when positive);
- a pool **lends** the part of its reservation it does not use (`reservation - allocated`, when positive), unless
  its reservation is static (a static pool keeps its idle reservation for itself);
- the borrowing of the group is attributed to the lenders in proportion to what each lends; what the lenders
  cannot cover came from the parent's capacity that no sibling reserves (`unreserved`).

A pool's holdings count its subtree's (what the API reports), so a child's loan inside its parent is read in the
parent's group of children and the parent's own in its group.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

_EPS = 1e-9


@dataclass(frozen=True)
class PoolHolding:
    path: str
    reservation: float  # GPUs
    allocated: float  # GPUs its subtree's gangs hold
    static: bool = False


@dataclass
class Lending:
    """One pool's part: to whom it lends and from whom it borrows (GPUs, by pool path), and what it borrows from
    capacity no sibling reserves."""

    lends_to: dict[str, float] = field(default_factory=dict)
    borrows_from: dict[str, float] = field(default_factory=dict)
    unreserved: float = 0.0


def parent_of(path: str) -> str | None:
    if path == "/":
        return None
    head = path.rsplit("/", 1)[0]
    return head or "/"


def lending(pools: Sequence[PoolHolding]) -> Mapping[str, Lending]:
    """Every pool's lending and borrowing among its siblings (the root neither lends nor borrows). Within a group
    the lenders cover at most what they have idle: of B borrowed in all and L lent idle, min(B, L) is covered, each
    borrower's part in proportion to what it borrows and each lender's in proportion to what it has idle."""
    out = {p.path: Lending() for p in pools}
    groups: dict[str, list[PoolHolding]] = {}
    for p in pools:
        parent = parent_of(p.path)
        if parent is not None:
            groups.setdefault(parent, []).append(p)
    for siblings in groups.values():
        idle = {p.path: p.reservation - p.allocated for p in siblings
                if not p.static and p.reservation - p.allocated > _EPS}
        need = {p.path: p.allocated - p.reservation for p in siblings if p.allocated - p.reservation > _EPS}
        offered, wanted = sum(idle.values()), sum(need.values())
        covered = min(offered, wanted)
        for b, n in need.items():
            for lender, have in idle.items():
                part = covered * (n / wanted) * (have / offered)
                out[b].borrows_from[lender] = part
                out[lender].lends_to[b] = part
            out[b].unreserved = n - (covered * n / wanted if wanted > _EPS else 0.0)
    return out
