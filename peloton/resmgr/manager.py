"""Resource manager state: the gang queue, the allocations per pool, and placements waiting for jobmgr.

In memory by design: the job manager owns the durable gang records and re-enqueues on start (recovery), so
a restart of resmgr loses nothing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from prometheus_client import Gauge

from peloton.domain.model import ResourcePool
from peloton.domain.placement import GangPlacement, GangRequest, PlacementFailure
from peloton.domain.resources import Resources
from peloton.resmgr.admission import admit, ancestors

QUEUED = Gauge("peloton_resmgr_queued_gangs", "Gangs waiting for admission or placement")
RETRY_AFTER_FAILED_PLACEMENT_S = 1.0


@dataclass(slots=True)
class _Entry:
    req: GangRequest
    placing: bool = False
    not_before: float = 0.0
    reason: str = ""


class ResourceManager:
    def __init__(self, load_pools: Callable[[], Sequence[ResourcePool]], clock: Callable[[], float] = time.time):
        self._load_pools = load_pools
        self.clock = clock
        self._cond = threading.Condition()
        self._queue: dict[str, _Entry] = {}
        self._ready: dict[str, GangPlacement] = {}
        self._reasons: dict[str, PlacementFailure] = {}
        self._alloc: dict[str, tuple[str, Resources, int]] = {}  # gang id -> (pool, resources, attempt)
        self._pools: dict[str, ResourcePool] = {}
        self.refresh_pools()

    def refresh_pools(self) -> None:
        pools = {p.path: p for p in self._load_pools()}
        with self._cond:
            self._pools = pools
            for e in self._queue.values():
                e.not_before = 0.0
            self._cond.notify_all()

    def pools(self) -> dict[str, ResourcePool]:
        with self._cond:
            return dict(self._pools)

    # --- jobmgr side ----------------------------------------------------------------------------------------
    def enqueue(self, gangs: Sequence[GangRequest], running: Sequence[GangRequest] = ()) -> None:
        with self._cond:
            for g in gangs:
                cur = self._queue.get(g.gang_id)
                if cur is not None and cur.req.attempt > g.attempt:
                    continue
                self._queue[g.gang_id] = _Entry(g)
                self._ready.pop(g.gang_id, None)
                self._alloc.pop(g.gang_id, None)
            for g in running:
                self._alloc[g.gang_id] = (g.respool, g.total, g.attempt)
            QUEUED.set(len(self._queue))
            self._cond.notify_all()

    def remove(self, gang_ids: Sequence[tuple[str, int]]) -> None:
        """Drop gangs (up to the given attempt) from the queue and ready list and release their allocation."""
        with self._cond:
            for gid, attempt in gang_ids:
                e = self._queue.get(gid)
                if e is not None and e.req.attempt <= attempt:
                    del self._queue[gid]
                p = self._ready.get(gid)
                if p is not None and p.attempt <= attempt:
                    del self._ready[gid]
                a = self._alloc.get(gid)
                if a is not None and a[2] <= attempt:
                    del self._alloc[gid]
                self._reasons.pop(gid, None)
            for e in self._queue.values():  # capacity may have freed: retry parked gangs now
                e.not_before = 0.0
            QUEUED.set(len(self._queue))
            self._cond.notify_all()

    def take_placements(self, max_n: int, timeout_s: float) -> tuple[list[GangPlacement], list[PlacementFailure]]:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while not self._ready and not self._reasons:
                left = deadline - time.monotonic()
                if left <= 0:
                    return [], []
                self._cond.wait(left)
            ids = list(self._ready)[:max_n]
            placements = [self._ready.pop(i) for i in ids]
            reasons = list(self._reasons.values())
            self._reasons.clear()
            return placements, reasons

    # --- placement side -------------------------------------------------------------------------------------
    def dequeue(self, max_n: int, timeout_s: float) -> list[GangRequest]:
        """Admitted gangs in priority order (highest first, then oldest). Their allocation is recorded now so
        admission of the next gang sees it."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                out = self._admit_locked(max_n)
                if out:
                    return out
                left = deadline - time.monotonic()
                if left <= 0:
                    return []
                # wake when something is enqueued/removed, or when a parked gang may be retried
                now = self.clock()
                parked = [e.not_before - now for e in self._queue.values() if not e.placing and e.not_before > now]
                self._cond.wait(min([left, *parked]) if parked else left)

    def _admit_locked(self, max_n: int) -> list[GangRequest]:
        now = self.clock()
        waiting = sorted(
            (e for e in self._queue.values() if not e.placing and e.not_before <= now),
            key=lambda e: (-e.req.priority, e.req.enqueued_at, e.req.gang_id),
        )
        out: list[GangRequest] = []
        for e in waiting:
            if len(out) >= max_n:
                break
            reason = admit(e.req.total, e.req.respool, self._pools, self._allocated_locked())
            if reason is not None:
                self._set_reason_locked(e, reason)
                e.not_before = now + RETRY_AFTER_FAILED_PLACEMENT_S
                continue
            e.placing = True
            self._alloc[e.req.gang_id] = (e.req.respool, e.req.total, e.req.attempt)
            out.append(e.req)
        return out

    def _set_reason_locked(self, e: _Entry, reason: str) -> None:
        if e.reason != reason:
            e.reason = reason
            self._reasons[e.req.gang_id] = PlacementFailure(e.req.gang_id, e.req.job_id, e.req.attempt, reason)
            self._cond.notify_all()

    def set_placements(self, placements: Sequence[GangPlacement], failures: Sequence[PlacementFailure]) -> None:
        now = self.clock()
        with self._cond:
            for p in placements:
                e = self._queue.get(p.gang_id)
                if e is None or e.req.attempt != p.attempt:
                    continue  # removed (job stopped) while placing; the lease expires on its own
                del self._queue[p.gang_id]
                self._ready[p.gang_id] = p
            for f in failures:
                e = self._queue.get(f.gang_id)
                if e is None or e.req.attempt != f.attempt:
                    continue
                e.placing = False
                e.not_before = now + RETRY_AFTER_FAILED_PLACEMENT_S
                self._alloc.pop(f.gang_id, None)
                self._set_reason_locked(e, f.reason)
            QUEUED.set(len(self._queue))
            self._cond.notify_all()

    # --- views ----------------------------------------------------------------------------------------------
    def _allocated_locked(self) -> dict[str, Resources]:
        out: dict[str, Resources] = {}
        for pool, r, _ in self._alloc.values():
            for p in ancestors(pool):
                out[p] = out.get(p, Resources()) + r
        return out

    def usage(self) -> tuple[dict[str, Resources], dict[str, int]]:
        with self._cond:
            queued: dict[str, int] = {}
            for e in self._queue.values():
                queued[e.req.respool] = queued.get(e.req.respool, 0) + 1
            return self._allocated_locked(), queued
