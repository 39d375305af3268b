"""The resource manager's gangs on their way to a launch: each gang attempt's entry and the queues it moves
through. Pure: plain data, the clock passed in, no lock (the shell, manager.py, calls it under its one lock).

An entry goes WAITING (in its pool's queue, or parked until a time) -> PLACING (admitted, handed to placement) ->
READY (placed and claimed) -> HANDED (given to jobmgr), and is dropped when jobmgr acknowledges it; it goes back
to WAITING from PLACING or HANDED. Each pool's queue is ordered by `--queue-order` (ordering.py): priority (highest
first), then, under `gpu-time`, the gang's queue of expected service (promoted to the first after a wait), then
submission time, then gang id. An entry's key is computed when it is queued and again when it is promoted. The queues are heaps with lazy deletion: an entry's `seq` changes whenever it is queued again, so a
heap item whose seq is not its entry's current one (or whose entry is gone or moved on) is stale and skipped; a
pool's queue is rebuilt without its stale items once it holds twice its live ones (and WAITING_COMPACT_MIN).
"""

from __future__ import annotations

import heapq
from collections.abc import Container
from dataclasses import dataclass
from enum import Enum

from peloton.domain.placement import GangPlacement, GangRequest, PlacementFailure
from peloton.domain.resources import Resources
from peloton.placement.reservation import Reservation, describe
from peloton.resmgr.ordering import ARRIVAL, Order, QueueOrder, promote_at, rank
from peloton.resmgr.paths import add, sub

Item = tuple[Order, int, str]  # (order, seq, gang id): a queue's heap item
WAITING_COMPACT_MIN = 1024  # a pool's queue is rebuilt without its stale items past this many and twice its live ones


class State(Enum):
    WAITING = 1
    PLACING = 2
    READY = 3
    HANDED = 4


@dataclass(slots=True)
class Entry:
    req: GangRequest
    seq: int  # tells a live heap item from a stale one
    state: State = State.WAITING
    not_before: float = 0.0
    hold: bool = False  # parked for a back-off that freed capacity must not cut short (the store is failing)
    reason: str = ""
    placement: GangPlacement | None = None
    handed_at: float = 0.0
    queued_at: float = 0.0
    in_demand: bool = False  # counted in its pool's demand (WAITING)
    starved_since: float | None = None  # first refused (admission) or unplaced: the settling window runs from here
    # (None: never; a clock may read 0.0, a replay's does at its start)
    block: str = ""  # what refused it last: pool (entitlement/limit) | reservation | hosts
    probed_at: float = float("-inf")
    admitted_at: float = 0.0  # when it was first admitted: the placing stage's start
    waits_for: tuple[str, ...] = ()  # the gangs preempted for it
    reservation: Reservation | None = None  # the hosts the placement engine keeps for it
    engine: str = ""  # the placement engine that dequeued it (PLACING): only its answers count
    key: Order | None = None  # its place in the queue order, as of its last queueing or promotion

    def order(self) -> Order:
        if self.key is not None:
            return self.key
        return -self.req.priority, 0, self.req.enqueued_at, self.req.gang_id

    def pending_victims(self, preempting: Container[str]) -> list[str]:
        """The gangs preempted for it that still hold their share (forgotten once none does)."""
        if not self.waits_for:
            return []
        left = [v for v in self.waits_for if v in preempting]
        if not left:
            self.waits_for = ()
        return left


@dataclass(frozen=True, slots=True)
class QueuedGang:
    """A gang waiting or being placed, as `peloton queue` shows it."""

    gang_id: str
    job_id: str
    attempt: int
    pool: str
    priority: int
    members: int
    total: Resources
    queued_at: float
    state: str  # waiting | placing
    reason: str
    position: int  # in its own pool's queue, 1 = next
    preemptible: bool
    reserved_hosts: tuple[str, ...] = ()  # its head-of-line reservation, sorted; () when it holds none
    expected_start: float | None = None  # when the reserved hosts are expected to free; None: not known
    start_basis: str = ""  # what expected_start rests on: max_runtime | preemption | unknown ("": no reservation)


class Queues:
    """Every gang attempt the resource manager knows by state, with the indexes the shell's rounds need.
    `entries` and the index dicts are read directly; the transitions go through the methods."""

    def __init__(self, order: QueueOrder = ARRIVAL) -> None:
        self.queue_order = order
        self.entries: dict[str, Entry] = {}  # gang id -> its current attempt's entry
        self._waiting: dict[str, list[Item]] = {}  # pool -> its WAITING entries by order (a heap; lazy deletion)
        self._compact_at: dict[str, int] = {}  # pool -> the length of its heap at which its stale items go
        self._parked: list[tuple[float, int, str]] = []  # WAITING entries not before a time
        self._promote: list[tuple[float, int, str]] = []  # queued WAITING entries due for promotion (gpu-time)
        self._ready: list[Item] = []  # READY entries by order (lazy heap)
        self.handed: dict[str, None] = {}  # HANDED gang ids, oldest first
        self.in_flight: set[str] = set()  # PLACING, READY or HANDED
        self.demand: dict[str, Resources] = {}  # pool -> what its own WAITING gangs ask for
        self._n_demand: dict[str, int] = {}  # pool -> how many gangs its demand sums (paths.sub)
        self.starved: dict[str, None] = {}  # ids of WAITING gangs refused or unplaced (they may preempt)
        self.reserving: dict[str, None] = {}  # ids of waiting gangs that hold a reservation
        self.reasons: dict[str, PlacementFailure] = {}  # why gangs wait, not yet given to jobmgr
        self.reason_changes = 0  # counts every change of a reason (the shell wakes jobmgr's long poll on news)
        self._seq = 0

    def clear(self) -> None:
        for d in (self.entries, self._waiting, self._compact_at, self.handed, self.demand, self._n_demand,
                  self.starved, self.reserving, self.reasons):
            d.clear()
        self._parked.clear()
        self._promote.clear()
        self._ready.clear()
        self.in_flight.clear()

    def __len__(self) -> int:
        return len(self.entries)

    def get(self, gang_id: str) -> Entry | None:
        return self.entries.get(gang_id)

    def live(self, gang_id: str, attempt: int, *states: State) -> Entry | None:
        """The entry of that gang attempt if it is in one of `states`."""
        e = self.entries.get(gang_id)
        return e if e is not None and e.req.attempt == attempt and e.state in states else None

    # --- transitions -------------------------------------------------------------------------------------------
    def add(self, g: GangRequest, now: float) -> Entry:
        """A new gang attempt, WAITING (the caller dropped any older attempt first)."""
        e = Entry(g, 0, queued_at=now)
        self.entries[g.gang_id] = e
        self.push(e, now)
        return e

    def drop(self, gang_id: str) -> Entry | None:
        """Forget the gang (its heap items go stale); the entry dropped, if any."""
        e = self.entries.pop(gang_id, None)
        if e is not None:
            self._undemand(e)
        self.starved.pop(gang_id, None)
        self.reserving.pop(gang_id, None)
        self.handed.pop(gang_id, None)
        self.in_flight.discard(gang_id)
        return e

    def push(self, e: Entry, now: float, hold: bool = False) -> None:
        """Back to WAITING: in the queue, or parked until e.not_before (`hold`: even when capacity frees)."""
        e.hold = hold
        self.handed.pop(e.req.gang_id, None)
        self.in_flight.discard(e.req.gang_id)
        self._seq += 1
        e.seq = self._seq
        e.state = State.WAITING
        e.placement = None
        if not e.in_demand:
            e.in_demand = True
            add(self.demand, e.req.respool, e.req.total, self._n_demand)
        if e.not_before > now:
            heapq.heappush(self._parked, (e.not_before, e.seq, e.req.gang_id))
        else:
            self._queue(e, now)

    def admit(self, e: Entry) -> None:
        """WAITING -> PLACING (the caller popped it from its pool's queue)."""
        self._undemand(e)
        e.state = State.PLACING
        self.in_flight.add(e.req.gang_id)

    def place(self, e: Entry, p: GangPlacement) -> None:
        """PLACING -> READY: it waits to be handed to jobmgr, highest priority first."""
        e.state = State.READY
        e.placement = p
        self.starved.pop(p.gang_id, None)
        self.reserving.pop(p.gang_id, None)
        e.reservation = None
        heapq.heappush(self._ready, (e.order(), e.seq, p.gang_id))

    def hand(self, max_n: int, now: float) -> list[GangPlacement]:
        """READY -> HANDED: up to `max_n` placements, best first."""
        out: list[GangPlacement] = []
        while self._ready and len(out) < max_n:
            _, seq, gid = heapq.heappop(self._ready)
            e = self.entries.get(gid)
            if e is None or e.seq != seq or e.state != State.READY:
                continue
            assert e.placement is not None
            e.state = State.HANDED
            e.handed_at = now
            self.handed[gid] = None
            out.append(e.placement)
        return out

    def hand_back(self) -> int:
        """HANDED -> READY for every entry (the job manager that took them is gone); how many."""
        n = len(self.handed)
        for gid in list(self.handed):
            e = self.entries[gid]
            self.handed.pop(gid)
            e.state = State.READY
            heapq.heappush(self._ready, (e.order(), e.seq, gid))
        return n

    def expired(self, now: float, timeout_s: float) -> list[Entry]:
        """The HANDED entries handed out more than `timeout_s` ago (the caller pushes them back), oldest first."""
        out = []
        for gid in self.handed:
            e = self.entries[gid]
            if now - e.handed_at <= timeout_s:
                break  # oldest first
            out.append(e)
        return out

    def has_ready(self) -> bool:
        """Whether a live READY entry waits (stale heap items at the top dropped)."""
        while self._ready:
            _, seq, gid = self._ready[0]
            e = self.entries.get(gid)
            if e is not None and e.seq == seq and e.state == State.READY:
                return True
            heapq.heappop(self._ready)
        return False

    def placing(self) -> list[Entry]:
        return [e for e in self.entries.values() if e.state == State.PLACING]

    # --- the waiting queues ------------------------------------------------------------------------------------
    def _queue(self, e: Entry, now: float) -> None:
        g = e.req
        e.key = rank(self.queue_order, g.priority, g.total.gpu, g.max_runtime_s, g.enqueued_at, g.gang_id,
                     e.queued_at, now)
        q = self._waiting.setdefault(g.respool, [])
        heapq.heappush(q, (e.key, e.seq, g.gang_id))
        if len(q) > self._compact_at.get(g.respool, WAITING_COMPACT_MIN):
            self._compact(g.respool, q)
        due = promote_at(self.queue_order, e.key[1], e.queued_at)
        if due is not None:
            heapq.heappush(self._promote, (due, e.seq, g.gang_id))

    def promote_due(self, now: float) -> int:
        """The queued gangs whose promotion time has come move to the first queue (queue order gpu-time): each
        is queued again under a new seq, its old heap item going stale. How many moved."""
        n = 0
        while self._promote and self._promote[0][0] <= now:
            _, seq, gid = heapq.heappop(self._promote)
            e = self.entries.get(gid)
            if e is None or e.seq != seq or e.state != State.WAITING or e.not_before > now:
                continue  # gone, moved on, or parked (queued again with its new key when it is unparked)
            self._seq += 1
            e.seq = self._seq
            self._queue(e, now)
            n += 1
        return n

    def next_promotion(self) -> float | None:
        """When the first queued gang is due for promotion (None: none), stale items at the top dropped."""
        while self._promote:
            _, seq, gid = self._promote[0]
            e = self.entries.get(gid)
            if e is not None and e.seq == seq and e.state == State.WAITING:
                return self._promote[0][0]
            heapq.heappop(self._promote)
        return None

    def _compact(self, pool: str, q: list[Item]) -> None:
        """Rebuild the pool's queue without its stale items (gangs stopped, requeued or admitted since): a head
        that waits long kept every one behind it, for as long as the pool stayed busy. Amortised: the next
        rebuild comes once the queue has doubled again."""
        live = [item for item in q if (e := self.entries.get(item[2])) is not None and e.seq == item[1]
                and e.state == State.WAITING]
        heapq.heapify(live)
        q[:] = live
        self._compact_at[pool] = max(WAITING_COMPACT_MIN, 2 * len(live))

    def _undemand(self, e: Entry) -> None:
        if e.in_demand:
            e.in_demand = False
            sub(self.demand, e.req.respool, e.req.total, self._n_demand)

    def waiting_pools(self) -> list[str]:
        """The pools with a queue (possibly of stale items only)."""
        return list(self._waiting)

    def head(self, pool: str) -> Entry | None:
        """The pool's first WAITING entry (stale items dropped); None, and the queue forgotten, if none."""
        q = self._waiting.get(pool)
        while q:
            _, seq, gid = q[0]
            e = self.entries.get(gid)
            if e is not None and e.seq == seq and e.state == State.WAITING:
                return e
            heapq.heappop(q)
        self._waiting.pop(pool, None)
        self._compact_at.pop(pool, None)
        return None

    def behind(self, pool: str, n: int) -> list[Entry]:
        """Up to `n` of the pool's WAITING entries after its first, in queue order (admission's backfill looks at
        them), the queue unchanged: O(queue length). Stale items among the first are skipped, so fewer may come back."""
        q = self._waiting.get(pool)
        if not q:
            return []
        out: list[Entry] = []
        for _, seq, gid in heapq.nsmallest(4 * n + 8, q):
            e = self.entries.get(gid)
            if e is not None and e.seq == seq and e.state == State.WAITING:
                out.append(e)
        return out[1:n + 1]

    def pop_head(self, pool: str) -> None:
        """Take the pool's first item off its queue (after `head` returned it)."""
        heapq.heappop(self._waiting[pool])

    def unpark_all(self, now: float) -> None:
        """Capacity freed: every parked entry goes back in its queue now, but those held for a back-off."""
        parked, self._parked = self._parked, []
        for item in parked:
            e = self.entries.get(item[2])
            if e is None or e.seq != item[1] or e.state != State.WAITING:
                continue
            if e.hold and e.not_before > now:
                self._parked.append(item)
                continue
            e.not_before = 0.0
            self._queue(e, now)
        heapq.heapify(self._parked)

    def unpark_due(self, now: float) -> None:
        """The parked entries whose time has come go back in their queue."""
        while self._parked and self._parked[0][0] <= now:
            _, seq, gid = heapq.heappop(self._parked)
            e = self.entries.get(gid)
            if e is not None and e.seq == seq and e.state == State.WAITING:
                self._queue(e, now)

    def next_unpark(self) -> float | None:
        """When the first parked entry is due (None: none parked)."""
        return self._parked[0][0] if self._parked else None

    def next_held_unpark(self) -> float | None:
        """When the first parked entry held for a back-off is due (the others also return when capacity frees)."""
        due = [t for t, seq, gid in self._parked
               if (e := self.entries.get(gid)) is not None and e.seq == seq and e.hold]
        return min(due) if due else None

    def waiting_priorities(self, pool: str) -> list[int]:
        """The priorities of the pool's own WAITING entries, queued or parked (a dry run counts those ahead of a
        new gang): its queue's live items and the parked ones, not every entry."""
        out = []
        for _, seq, gid in [*self._waiting.get(pool, ()), *self._parked]:
            e = self.entries.get(gid)
            if e is not None and e.seq == seq and e.state == State.WAITING and e.req.respool == pool:
                out.append(e.req.priority)
        return out

    # --- why a gang waits --------------------------------------------------------------------------------------
    def starve(self, e: Entry, now: float, block: str) -> None:
        """`e` was refused (`block`: pool | reservation | hosts); its settling window runs from the first time."""
        e.block = block
        if e.starved_since is None:
            e.starved_since = now
            self.starved[e.req.gang_id] = None

    def set_reason(self, e: Entry, reason: str, now: float, preempting: Container[str]) -> bool:
        """Say why `e` waits (jobmgr records it on the job): the victims it waits for, or the hosts kept for it,
        before `reason`; "" keeps the last reason. True when the reason changed (jobmgr has news)."""
        left = e.pending_victims(preempting)
        if left:
            more = f" and {len(left) - 5} more" if len(left) > 5 else ""
            reason = f"waiting for preempted gangs to exit: {', '.join(left[:5])}{more}"
        elif e.reservation is not None and e.block == "hosts":
            reason = describe(e.reservation, now)
        if not reason or e.reason == reason:
            return False
        e.reason = reason
        self.reasons[e.req.gang_id] = PlacementFailure(e.req.gang_id, e.req.job_id, e.req.attempt, reason)
        self.reason_changes += 1
        return True

    def first_unplaced(self) -> Entry | None:
        """The first WAITING gang the placement engine found no hosts for (placement order fifo admits nothing
        behind it); None: none waits for hosts."""
        first: Entry | None = None
        for gid in self.starved:
            e = self.entries.get(gid)
            if e is not None and e.state == State.WAITING and e.block == "hosts" and (first is None
                                                                                      or e.order() < first.order()):
                first = e
        return first

    def starved_heads(self) -> list[Entry]:
        """Each pool's first starved WAITING entry, best first (entries no longer starved are forgotten)."""
        heads: dict[str, Entry] = {}
        for gid in list(self.starved):
            e = self.entries.get(gid)
            if e is None or e.starved_since is None:
                del self.starved[gid]
                continue
            if e.state != State.WAITING:
                continue
            cur = heads.get(e.req.respool)
            if cur is None or e.order() < cur.order():
                heads[e.req.respool] = e
        return sorted(heads.values(), key=Entry.order)

    def live_reservations(self, barrier: Entry | None = None) -> list[tuple[str, int]]:
        """The waiting gangs that hold a reservation (the others are forgotten). `barrier` (placement order fifo:
        the first gang waiting for hosts): a gang ordered behind it loses its reservation, which would keep hosts
        from it (a gang admitted later, by borrowing or once its pool's entitlement grew, may be ahead of a gang
        that got its reservation earlier) while nothing behind it may start anyway."""
        out = []
        for gid in list(self.reserving):
            e = self.entries.get(gid)
            if e is not None and barrier is not None and e is not barrier and e.order() > barrier.order():
                e.reservation = None
            if e is None or e.reservation is None or e.state not in (State.WAITING, State.PLACING):
                del self.reserving[gid]
            else:
                out.append((gid, e.req.attempt))
        return out

    # --- views -------------------------------------------------------------------------------------------------
    def queued(self) -> dict[str, int]:
        """Per pool, how many of its own gangs wait or are being placed."""
        queued: dict[str, int] = {}
        for e in self.entries.values():
            if e.state in (State.WAITING, State.PLACING):
                queued[e.req.respool] = queued.get(e.req.respool, 0) + 1
        return queued

    def listing(self, pool: str = "", limit: int = 1000) -> tuple[list[QueuedGang], int]:
        """The gangs waiting or being placed, in queue order, of `pool` and its subtree ("": every pool), with
        each one's position in its own pool's queue; and how many there are."""
        under = pool.rstrip("/") + "/" if pool else ""
        waiting = [e for e in self.entries.values() if e.state in (State.WAITING, State.PLACING)
                   and (not pool or e.req.respool == pool or e.req.respool.startswith(under))]
        waiting.sort(key=Entry.order)
        position: dict[str, int] = {}
        first: dict[str, str] = {}  # pool -> its first waiting gang
        out: list[QueuedGang] = []
        for e in waiting:
            g = e.req
            position[g.respool] = position.get(g.respool, 0) + 1
            reason = e.reason
            if e.state == State.WAITING:
                head = first.setdefault(g.respool, g.gang_id)
                if not reason and head != g.gang_id:
                    reason = f"waiting behind {head}, the first gang of pool {g.respool}'s queue"
            if len(out) < limit:
                r = e.reservation
                out.append(QueuedGang(g.gang_id, g.job_id, g.attempt, g.respool, g.priority, len(g.members),
                                      g.total, e.queued_at, "waiting" if e.state == State.WAITING else "placing",
                                      reason, position[g.respool], g.preemptible,
                                      tuple(sorted(r.hosts)) if r is not None else (),
                                      r.start if r is not None else None, _basis(e)))
        return out, len(waiting)


def _basis(e: Entry) -> str:
    """What a reserved gang's expected start rests on: the sla.max_runtime ends of the gangs on its hosts (the
    placement engine's what-if, reservation.py), victims being preempted for it (their grace: no time known), or
    nothing (a gang there has no max_runtime)."""
    r = e.reservation
    if r is None:
        return ""
    if r.start is not None:
        return "max_runtime"
    return "preemption" if e.waits_for else "unknown"
