"""Victim choice for a preemption, checked with the placer. Pure: the host index in, the index exactly as it was
out.

The resource manager names a waiting gang, the running gangs it may preempt (its candidates, most preferred victim
first: see resmgr/preemption.py) and what they must free in total besides hosts (`need`: the part of a pool's
entitlement or limit the waiting gang lacks). Summing resources is not enough: eight free GPUs on eight hosts do not
run a gang of two 4-GPU members. So the choice frees candidates on a what-if copy of their hosts, one at a time in
order, until the placer places the waiting gang whole and the sum covers `need`; then it tries to keep each chosen
victim running again, least preferred first, and keeps it when the gang still fits without it. What is left is a
small set (not always the smallest: that search is exponential) whose removal lets the gang be placed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from peloton.domain.placement import GangRequest
from peloton.domain.resources import Resources
from peloton.placement.index import HostIndex
from peloton.placement.placer import can_ever_fit

_EPS = 1e-6


@dataclass(frozen=True, slots=True)
class Candidate:
    """A running gang that may be preempted: where it holds what."""

    gang_id: str
    attempt: int
    usage: tuple[tuple[str, Resources], ...]  # (hostname, resources) per member
    total: Resources


def choose_victims(gang: GangRequest, candidates: Sequence[Candidate], need: Resources,
                   index: HostIndex) -> list[Candidate] | None:
    """The victims (in candidate order) whose removal lets `gang` be placed and frees at least `need`; None when
    even every candidate would not do. `index` is left as it was."""
    chosen: list[Candidate] = []
    freed = Resources()
    try:
        for c in candidates:
            index.shift(c.usage, 1)
            chosen.append(c)
            freed = freed + c.total
            if _covers(freed, need) and can_ever_fit(gang, index) is None:
                break
        else:
            return None
        for c in reversed(chosen[:]):  # keep the least preferred ones running when the gang fits without them
            index.shift(c.usage, -1)
            rest = freed - c.total
            if _covers(rest, need) and can_ever_fit(gang, index) is None:
                chosen.remove(c)
                freed = rest
            else:
                index.shift(c.usage, 1)
        return chosen
    finally:
        for c in chosen:
            index.shift(c.usage, -1)


def _covers(freed: Resources, need: Resources) -> bool:
    return (freed.cpu + _EPS >= need.cpu and freed.mem + _EPS >= need.mem and freed.disk + _EPS >= need.disk
            and freed.gpu >= need.gpu)
