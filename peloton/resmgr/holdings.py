"""What the admitted, placed and running gangs hold: per gang, and summed per pool. Pure: plain data, no lock (the
resource manager's shell, manager.py, calls it under its one lock).

A gang holds its total from admission until jobmgr reports it gone (or its placement failed and it waits again).
The sums are what admission checks against (`allocated`: a pool's and its descendants' gangs, against limits and
entitlements; `pinned`: a pool's own non-preemptible gangs, against its reservation) and what the entitlements
are computed from (`own`).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable

from peloton.domain.allocation import Holding
from peloton.domain.placement import GangRequest
from peloton.domain.resources import Resources
from peloton.resmgr.paths import add, chain, sub


class Holdings:
    """The book of holdings. Its dicts are read directly by the cores that decide on them (admission,
    preemption); only `hold` and `release` write them, so the per-pool sums always match the gangs."""

    def __init__(self, on_release: Callable[[str], None] = lambda gang_id: None) -> None:
        """`on_release(gang id)`: called whenever a holding is dropped (a victim that let go is no longer one)."""
        self._on_release = on_release
        self.by_gang: dict[str, Holding] = {}  # gang id -> what it holds, where, since when
        self.pool_gangs: dict[str, dict[str, None]] = {}  # pool -> ids of its own gangs in by_gang
        self.ending: dict[str, None] = {}  # ids of gangs in by_gang with a max_runtime
        self.allocated: dict[str, Resources] = {}  # pool -> what gangs in it and its descendants hold
        self.own: dict[str, Resources] = {}  # pool -> what its own gangs hold
        self.pinned: dict[str, Resources] = {}  # pool -> what its own non-preemptible gangs hold
        # how many gangs each figure of the three books sums (paths.sub drops a figure with its last gang)
        self._n_allocated: dict[str, int] = {}
        self._n_own: dict[str, int] = {}
        self._n_pinned: dict[str, int] = {}

    def clear(self) -> None:
        for d in (self.by_gang, self.pool_gangs, self.ending, self.allocated, self.own, self.pinned,
                  self._n_allocated, self._n_own, self._n_pinned):
            d.clear()

    def get(self, gang_id: str) -> Holding | None:
        return self.by_gang.get(gang_id)

    def hold(self, g: GangRequest) -> None:
        """Record what gang attempt `g` holds (an older attempt's holding is replaced). Its members' hosts are
        known only for a running gang adopted after a restart; a placed gang gets them with `placed`. An attempt
        older than the one held is ignored: replacing it would leave the newer one's total in the sums for ever."""
        cur = self.by_gang.get(g.gang_id)
        if cur is not None and cur.attempt > g.attempt:
            return
        self.release(g.gang_id, g.attempt)
        total = g.total
        usage = tuple((m.hostname, m.resources) for m in g.members) if all(m.hostname for m in g.members) else ()
        self.by_gang[g.gang_id] = Holding(g.respool, total, g.attempt, g.preemptible, g.priority, g.running_since,
                                          usage if g.members else (), g.max_runtime_s, launched=bool(usage))
        self.pool_gangs.setdefault(g.respool, {})[g.gang_id] = None
        if g.max_runtime_s:
            self.ending[g.gang_id] = None
        for p in chain(g.respool):
            add(self.allocated, p, total, self._n_allocated)
        add(self.own, g.respool, total, self._n_own)
        if not g.preemptible:
            add(self.pinned, g.respool, total, self._n_pinned)

    def placed(self, gang_id: str, attempt: int, usage: tuple[tuple[str, Resources], ...], now: float) -> None:
        """The gang attempt was placed: where its members are, and since when (preemption prefers the newest)."""
        h = self.by_gang.get(gang_id)
        if h is not None and h.attempt == attempt:
            h.usage = usage
            h.since = now

    def launched(self, gang_id: str, attempt: int) -> None:
        """jobmgr took the gang attempt's placement: it may be preempted from now on."""
        h = self.by_gang.get(gang_id)
        if h is not None and h.attempt == attempt:
            h.launched = True

    def release(self, gang_id: str, up_to_attempt: int) -> Holding | None:
        """Drop the gang's holding if its attempt is `up_to_attempt` or older; the holding dropped, else None."""
        h = self.by_gang.get(gang_id)
        if h is None or h.attempt > up_to_attempt:
            return None
        del self.by_gang[gang_id]
        mine = self.pool_gangs.get(h.pool)
        if mine is not None:
            mine.pop(gang_id, None)
            if not mine:
                del self.pool_gangs[h.pool]
        self.ending.pop(gang_id, None)
        for p in chain(h.pool):
            sub(self.allocated, p, h.total, self._n_allocated)
        sub(self.own, h.pool, h.total, self._n_own)
        if not h.preemptible:
            sub(self.pinned, h.pool, h.total, self._n_pinned)
        self._on_release(gang_id)
        return h

    def earliest_ends(self, n: int) -> tuple[tuple[str, Holding], ...]:
        """The `n` placed gangs with a max_runtime that end first, earliest first (the hosts that free up next)."""
        ends = [(h.ends_at, gid, h) for gid in self.ending if (h := self.by_gang[gid]).ends_at is not None]
        return tuple((gid, h) for _, gid, h in heapq.nsmallest(n, ends))

    def of(self, ids: Iterable[str]) -> tuple[tuple[str, Holding], ...]:
        return tuple((gid, self.by_gang[gid]) for gid in ids)
