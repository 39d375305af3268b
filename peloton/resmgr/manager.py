"""Resource manager state: the gang queue, the allocations per pool, and placements on their way to jobmgr.

In memory by design: the job manager owns the durable gang records; it re-enqueues queued gangs and re-registers
the allocations of running ones at its start (recovery) and every 30 s for any gang resmgr does not know (the
reconciler's queue check), so a restart of resmgr on its own loses nothing.

A gang's entry goes WAITING (in the priority queue) -> PLACING (handed to placement, its allocation counted) ->
READY (placed and claimed) -> HANDED (given to jobmgr) and is dropped only when jobmgr acknowledges that the
launch intent is durable; a placement jobmgr could not record goes back to WAITING (AckPlacements retry), and one
handed out and never acknowledged (jobmgr died) goes back after HANDED_TIMEOUT_S. A placement is never lost.

A placement dropped before jobmgr took it (its job stopped while it was being placed or waited READY, or resmgr
was reset when the daemon regained the store) holds a claim in the host manager that nobody will launch: its key
is kept as an orphaned claim and handed to the placement engine with its next dequeue, which releases it before it
claims anything else. Otherwise the claim would hold the hosts until it expires (a minute), so that after a store
outage, say, the cluster would sit idle with a queue waiting.

Back-pressure: at most MAX_IN_FLIGHT gangs are PLACING, READY or HANDED at once. Placement runs ahead of the
launchers otherwise (a 100,000-instance elastic job), and placements that wait longer than their claim lives are
refused at launch and placed again, forever. READY placements are handed out highest priority first.

Admission (admission.py, entitlement.py): a gang is admitted when it fits, whole, in its pool's limit and in the
entitlement of its pool and every ancestor below the root (the root's entitlement is the cluster: whether a gang
fits there is placement's business), and, when it is not preemptible, in its own pool's reservation. The
entitlements are recomputed when their inputs change (a gang enqueued or gone, an allocation released, the pools,
the cluster's capacity, which the placement engine reports with each dequeue), at most once per admission round.

Preemption (preemption.py, placement/victims.py): a gang that has waited a settling window (`preemption_settle_s`)
while within its pool's entitlement with no hosts fitting it (reclaim), or behind lower-priority gangs of its own
pool (priority), and is the first of its pool's queue, is sent to the placement engine as a probe with its
candidate victims. The engine picks the victims with the placer; resmgr records them as preempting, orders jobmgr
(with the placements) to preempt each whole, and the waiting gang says which gangs it waits for until their
allocations are released. An order jobmgr did not act on is given again after ORDER_AGAIN_S.

One condition guards everything (memory only); callers long-poll on it.
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum

from prometheus_client import Counter, Gauge, Histogram

from peloton.domain.allocation import Entitlement, Holding, PoolUsage
from peloton.domain.model import ResourcePool
from peloton.domain.placement import GangPlacement, GangRequest, PlacementFailure
from peloton.domain.resources import BASE_UNITS, Resources
from peloton.observability.gang_metrics import GANG_STAGE
from peloton.placement.reservation import Reservation, describe
from peloton.resmgr.admission import admit, chain, entitled, within_reservation
from peloton.resmgr.entitlement import PoolPolicy, entitlements
from peloton.resmgr.preemption import priority_candidates, reclaim_candidates, shortfall

log = logging.getLogger(__name__)

MAX_RETIRED = 64  # ids of replaced placement engines / job managers remembered (their late calls are refused)


class _Current:
    """Which caller of a kind (the placement engine, the job manager) is the current one, by the id it sends. A
    new id replaces the current one for good: the replaced id is retired, and any later call from it (a long
    poll of a process that died mid-call, a process that was paused) is answered with nothing, so that nothing
    is handed to a caller that will never act on it."""

    def __init__(self) -> None:
        self.id = ""
        self._retired: dict[str, None] = {}

    def asks(self, caller: str) -> tuple[bool, str]:
        """(whether `caller` may be answered, the id it replaced: "" when none)."""
        if not caller or caller == self.id:
            return True, ""
        if caller in self._retired:
            return False, ""
        replaced, self.id = self.id, caller
        if replaced:
            self._retired[replaced] = None
            while len(self._retired) > MAX_RETIRED:
                del self._retired[next(iter(self._retired))]
        return True, replaced

    def superseded(self, caller: str) -> bool:
        return bool(caller) and caller != self.id

QUEUED = Gauge("peloton_resmgr_queued_gangs", "Gangs waiting for admission or placement")
QUEUE_WAIT = Histogram("peloton_resmgr_queue_wait_seconds", "From enqueue to admission (handed to placement)",
                       buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30, 300, 3600))
RETRY_AFTER_FAILED_PLACEMENT_S = 1.0
MAX_IN_FLIGHT = 1024  # gangs admitted and not yet durably launching (see the module docstring)
HANDED_TIMEOUT_S = 60.0
UNPARK_EVERY_S = 0.05
MAX_ORPHANED_CLAIMS = 100_000  # kept for the placement engine to release; beyond this the oldest just expire

GangKey = tuple[str, int]  # (gang id, attempt)
DIMS = ("cpu", "mem", "disk", "gpu")
_ZERO = Resources()
# Per pool, as of the last computation of the entitlements (at most once per admission round, when an input changed)
POOL_ENTITLEMENT = Gauge("peloton_pool_entitlement", "What the pool may use now (GPUs fractional); cpu in cores, "
                         "mem and disk in bytes", ["pool", "resource"])
POOL_ALLOCATION = Gauge("peloton_pool_allocation", "What the gangs of the pool and its subtree hold", ["pool", "resource"])
POOL_DEMAND = Gauge("peloton_pool_demand", "What the waiting gangs of the pool and its subtree ask for",
                    ["pool", "resource"])
POOL_QUEUED = Gauge("peloton_pool_queued_gangs", "Gangs of the pool waiting for admission or placement", ["pool"])
PREEMPTIONS = Counter("peloton_preemptions_total", "Gangs chosen for preemption, by kind (reclaim: for another pool "
                      "below its entitlement; priority: for a higher-priority gang of the same pool)", ["pool", "kind"])
DEFAULT_PREEMPTION_SETTLE_S = 10.0  # a gang waits this long before it may preempt (no action on a blip)
PROBE_EVERY_S = 1.0  # a waiting gang asks the placement engine for victims at most this often
PROBE_ROUND_EVERY_S = 0.25  # the starved gangs are looked over at most this often
MAX_PROBES = 8  # per dequeue
MAX_CANDIDATES = 256  # per probe
MAX_ENDING = 4096  # gangs with a max_runtime sent with a probe (the earliest ends)
RESERVATION_REFRESH_S = 5.0  # a gang holding a reservation asks again this often (its expected start moves)
ORDER_AGAIN_S = 60.0  # a preemption order not acted on (jobmgr restarted) is given again after this long


@dataclass(frozen=True, slots=True)
class Probe:
    """A waiting gang that only preemption can start, with its candidate victims (most preferred first) and what
    they must free besides hosts."""

    gang: GangRequest
    candidates: tuple[tuple[str, Holding], ...]
    need: Resources
    ending: tuple[tuple[str, Holding], ...] = ()  # placed gangs with a max_runtime, earliest end first


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


class _State(Enum):
    WAITING = 1
    PLACING = 2
    READY = 3
    HANDED = 4


@dataclass(slots=True)
class _Entry:
    req: GangRequest
    seq: int  # tells a live heap item from a stale one
    state: _State = _State.WAITING
    not_before: float = 0.0
    hold: bool = False  # parked for a back-off that freed capacity must not cut short (the store is failing)
    reason: str = ""
    placement: GangPlacement | None = None
    handed_at: float = 0.0
    queued_at: float = 0.0
    in_demand: bool = False  # counted in its pool's demand (WAITING)
    starved_since: float = 0.0  # first refused (admission) or unplaced: the settling window runs from here
    block: str = ""  # what refused it last: pool (entitlement/limit) | reservation | hosts
    probed_at: float = float("-inf")
    admitted_at: float = 0.0  # when it was first admitted: the placing stage's start
    waits_for: tuple[str, ...] = ()  # the gangs preempted for it
    reservation: Reservation | None = None  # the hosts the placement engine keeps for it

    def order(self) -> tuple[int, float, str]:
        return -self.req.priority, self.req.enqueued_at, self.req.gang_id


_Item = tuple[tuple[int, float, str], int, str]  # (order, seq, gang id): a queue's heap item


class ResourceManager:
    def __init__(self, load_pools: Callable[[], Sequence[ResourcePool]], clock: Callable[[], float] = time.time,
                 preemption_settle_s: float = DEFAULT_PREEMPTION_SETTLE_S, preemption: bool = True):
        """`preemption_settle_s`: how long a pool's first gang waits before it may preempt or reserve hosts;
        `preemption` False: it only reserves hosts."""
        self._load_pools = load_pools
        self.clock = clock
        self.incarnation = uuid.uuid4().hex  # a new one whenever this forgets every gang (reset)
        self._settle_s = preemption_settle_s
        self._preemption = preemption
        self._cond = threading.Condition()
        self._entries: dict[str, _Entry] = {}  # gang id -> its current attempt's entry
        self._queues: dict[str, list[_Item]] = {}  # pool -> its WAITING entries by order (a heap; lazy deletion)
        self._parked: list[tuple[float, int, str]] = []  # WAITING entries not before a time
        self._ready: list[tuple[tuple[int, float, str], int, str]] = []  # READY entries by order (lazy heap)
        self._handed: dict[str, None] = {}  # HANDED gang ids, oldest first
        self._in_flight: set[str] = set()  # PLACING, READY or HANDED
        self._unpark = False  # capacity freed: move every parked entry back (at most every UNPARK_EVERY_S)
        self._last_unpark = float("-inf")
        self._seq = 0
        self._reasons: dict[str, PlacementFailure] = {}
        self._orphaned: dict[GangKey, None] = {}  # claims of placements dropped before jobmgr took them, oldest first
        self._alloc: dict[str, Holding] = {}  # gang id -> what it holds, where, since when
        self._pool_gangs: dict[str, dict[str, None]] = {}  # pool -> ids of its own gangs in _alloc
        self._ending: dict[str, None] = {}  # ids of gangs in _alloc with a max_runtime
        self._reserving: dict[str, None] = {}  # ids of waiting gangs that hold a reservation
        self._starved: dict[str, None] = {}  # ids of WAITING gangs refused or unplaced (they may preempt)
        self._preempting: dict[str, tuple[int, float, str]] = {}  # victim -> (attempt, ordered at, reason)
        self._orders: dict[str, tuple[int, str]] = {}  # victim -> (attempt, reason) for jobmgr's next take
        self._probes: list[Probe] = []
        self._next_probe_round = float("-inf")
        self._closed = False  # the daemon is stopping: long polls answer at once
        self._engine = _Current()  # the placement engine that asks for gangs
        self._consumer = _Current()  # the job manager that takes placements
        self._allocated: dict[str, Resources] = {}  # pool -> what gangs in it and its descendants hold
        self._own_alloc: dict[str, Resources] = {}  # pool -> what its own gangs hold
        self._pinned: dict[str, Resources] = {}  # pool -> what its own non-preemptible gangs hold
        self._demand: dict[str, Resources] = {}  # pool -> what its own WAITING gangs ask for
        self._capacity: Resources | None = None  # the cluster's, as the placement engine last reported it
        self._ent: dict[str, Entitlement] = {}
        self._ent_dirty = True
        self._pools: dict[str, ResourcePool] = {}
        self.refresh_pools()

    def refresh_pools(self) -> None:
        pools = {p.path: p for p in self._load_pools()}
        with self._cond:
            for gone in set(self._pools) - set(pools):
                _forget_metrics(gone)
            self._pools = pools
            self._changed_locked()
            self._cond.notify_all()

    def _changed_locked(self) -> None:
        """An input of the entitlements changed: recompute them before the next admission, and give the parked
        gangs another look."""
        self._ent_dirty = True
        self._unpark = True

    def close(self) -> None:
        """The daemon is stopping: every long poll (dequeue, take_placements) returns now, and later ones at once."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def pools(self) -> dict[str, ResourcePool]:
        with self._cond:
            return dict(self._pools)

    def reset(self) -> None:
        """Forget everything (the job manager recovers and enqueues again) but the claims of the placements
        jobmgr had not taken: those are released by the placement engine's next round."""
        with self._cond:
            self.incarnation = uuid.uuid4().hex
            for e in self._entries.values():
                if e.state == _State.READY and e.placement is not None:
                    self._orphan_locked(e.placement)
            self._entries.clear()
            self._ready.clear()
            self._handed.clear()
            self._in_flight.clear()
            self._queues.clear()
            self._parked.clear()
            self._reasons.clear()
            self._alloc.clear()
            self._pool_gangs.clear()
            self._ending.clear()
            self._reserving.clear()
            self._starved.clear()
            self._preempting.clear()
            self._orders.clear()
            self._probes.clear()
            self._allocated.clear()
            self._own_alloc.clear()
            self._pinned.clear()
            self._demand.clear()
            self._changed_locked()
            QUEUED.set(0)
            self._cond.notify_all()

    # --- bookkeeping ------------------------------------------------------------------------------------------
    def _orphan_locked(self, p: GangPlacement) -> None:
        self._orphaned[(p.gang_id, p.attempt)] = None
        while len(self._orphaned) > MAX_ORPHANED_CLAIMS:
            del self._orphaned[next(iter(self._orphaned))]

    def take_orphaned_claims(self) -> list[GangKey]:
        """The claims of placements dropped before jobmgr took them, for the placement engine to release."""
        with self._cond:
            out = list(self._orphaned)
            self._orphaned.clear()
            return out

    def _drop_locked(self, gang_id: str) -> None:
        e = self._entries.get(gang_id)
        if e is not None:
            self._undemand_locked(e)
        if e is not None and e.state == _State.READY and e.placement is not None:
            self._orphan_locked(e.placement)  # HANDED ones are jobmgr's: its launcher releases what it drops
        self._entries.pop(gang_id, None)  # its heap items (waiting, ready) go stale
        self._starved.pop(gang_id, None)
        self._reserving.pop(gang_id, None)
        self._handed.pop(gang_id, None)
        self._in_flight.discard(gang_id)

    def _push_locked(self, e: _Entry, now: float, hold: bool = False) -> None:
        """Back to WAITING: in the queue, or parked until e.not_before (`hold`: even when capacity frees)."""
        e.hold = hold
        self._handed.pop(e.req.gang_id, None)
        self._in_flight.discard(e.req.gang_id)
        self._seq += 1
        e.seq = self._seq
        e.state = _State.WAITING
        e.placement = None
        if not e.in_demand:
            e.in_demand = True
            _add(self._demand, e.req.respool, e.req.total)
        if e.not_before > now:
            heapq.heappush(self._parked, (e.not_before, e.seq, e.req.gang_id))
        else:
            self._queue_locked(e)

    def _queue_locked(self, e: _Entry) -> None:
        heapq.heappush(self._queues.setdefault(e.req.respool, []), (e.order(), e.seq, e.req.gang_id))

    def _head_locked(self, pool: str) -> _Item | None:
        """The first live item of the pool's queue (stale ones dropped); None, and the queue forgotten, if none."""
        q = self._queues.get(pool)
        while q:
            item = q[0]
            e = self._entries.get(item[2])
            if e is not None and e.seq == item[1] and e.state == _State.WAITING:
                return item
            heapq.heappop(q)
        self._queues.pop(pool, None)
        return None

    def _undemand_locked(self, e: _Entry) -> None:
        if e.in_demand:
            e.in_demand = False
            _sub(self._demand, e.req.respool, e.req.total)

    def _allocate_locked(self, g: GangRequest) -> None:
        self._release_alloc_locked(g.gang_id, g.attempt)
        total = g.total
        usage = tuple((m.hostname, m.resources) for m in g.members) if all(m.hostname for m in g.members) else ()
        self._alloc[g.gang_id] = Holding(g.respool, total, g.attempt, g.preemptible, g.priority, g.running_since,
                                         usage if g.members else (), g.max_runtime_s)
        self._pool_gangs.setdefault(g.respool, {})[g.gang_id] = None
        if g.max_runtime_s:
            self._ending[g.gang_id] = None
        for p in chain(g.respool):
            _add(self._allocated, p, total)
        _add(self._own_alloc, g.respool, total)
        if not g.preemptible:
            _add(self._pinned, g.respool, total)

    def _release_alloc_locked(self, gang_id: str, up_to_attempt: int) -> bool:
        a = self._alloc.get(gang_id)
        if a is None or a.attempt > up_to_attempt:
            return False
        del self._alloc[gang_id]
        pool, total, preemptible = a.pool, a.total, a.preemptible
        mine = self._pool_gangs.get(pool)
        if mine is not None:
            mine.pop(gang_id, None)
            if not mine:
                del self._pool_gangs[pool]
        self._preempting.pop(gang_id, None)
        self._orders.pop(gang_id, None)
        self._ending.pop(gang_id, None)
        for p in chain(pool):
            _sub(self._allocated, p, total)
        _sub(self._own_alloc, pool, total)
        if not preemptible:
            _sub(self._pinned, pool, total)
        self._ent_dirty = True  # what the pool wants went down
        return True

    def _capacity_freed_locked(self) -> None:
        self._unpark = True

    # --- jobmgr side ----------------------------------------------------------------------------------------
    def enqueue(self, gangs: Sequence[GangRequest], running: Sequence[GangRequest] = ()) -> None:
        """Queue each gang attempt. Idempotent: an attempt already known (queued, placing, placed or handed out)
        is left alone; a newer attempt replaces an older one."""
        now = self.clock()
        with self._cond:
            for g in gangs:
                cur = self._entries.get(g.gang_id)
                if cur is not None and cur.req.attempt >= g.attempt:
                    continue
                if self._release_alloc_locked(g.gang_id, g.attempt):
                    self._capacity_freed_locked()
                self._drop_locked(g.gang_id)
                e = _Entry(g, 0, queued_at=now)
                self._entries[g.gang_id] = e
                self._push_locked(e, now)
            for g in running:
                self._allocate_locked(g)
            self._changed_locked()  # new demand: the entitlements move
            QUEUED.set(len(self._entries))
            self._cond.notify_all()

    def remove(self, gang_ids: Sequence[tuple[str, int]]) -> None:
        """Drop gangs (up to the given attempt) from the queue and release their allocation."""
        with self._cond:
            for gid, attempt in gang_ids:
                e = self._entries.get(gid)
                if e is not None and e.req.attempt <= attempt:
                    self._drop_locked(gid)
                self._release_alloc_locked(gid, attempt)
                self._reasons.pop(gid, None)
            self._changed_locked()
            QUEUED.set(len(self._entries))
            self._cond.notify_all()

    def unknown(self, keys: Sequence[GangKey]) -> list[GangKey]:
        """The gang attempts resmgr neither holds in any state nor counts an allocation for (it restarted, or an
        enqueue was lost): the caller re-enqueues the queued ones and re-registers the running ones."""
        with self._cond:
            out = []
            for gid, attempt in keys:
                e = self._entries.get(gid)
                a = self._alloc.get(gid)
                if (e is None or e.req.attempt < attempt) and (a is None or a.attempt < attempt):
                    out.append((gid, attempt))
            return out

    def take_placements(self, max_n: int, timeout_s: float,
                        consumer: str = "") -> tuple[list[GangPlacement], list[PlacementFailure]]:
        """Placed gangs for jobmgr, kept (HANDED) until `ack_placements`; plus the newest pending reasons.
        `consumer`: the job manager's id (a new one is handed again what the last one did not acknowledge)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            if not self._consumer_asks_locked(consumer):
                return [], []
            while True:
                if self._consumer.superseded(consumer):  # replaced while it waited: hand it nothing
                    return [], []
                self._expire_handed_locked()
                self._trim_ready_locked()
                self._order_again_locked()
                if self._ready or self._reasons or self._orders:
                    break
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    return [], []
                self._cond.wait(min(left, HANDED_TIMEOUT_S))
            now = self.clock()
            out: list[GangPlacement] = []
            while self._ready and len(out) < max_n:
                _, seq, gid = heapq.heappop(self._ready)
                e = self._entries.get(gid)
                if e is None or e.seq != seq or e.state != _State.READY:
                    continue
                assert e.placement is not None
                e.state = _State.HANDED
                e.handed_at = now
                self._handed[gid] = None
                out.append(e.placement)
            reasons = list(self._reasons.values())
            self._reasons.clear()
            return out, reasons

    def take_preemptions(self) -> list[tuple[str, int, str]]:
        """The gangs to preempt, each (gang id, attempt, reason), for jobmgr (with its placements)."""
        with self._cond:
            out = [(gid, attempt, reason) for gid, (attempt, reason) in self._orders.items()]
            self._orders.clear()
            return out

    def _order_again_locked(self) -> None:
        now = self.clock()
        for gid, (attempt, at, reason) in self._preempting.items():
            if now - at >= ORDER_AGAIN_S:
                self._preempting[gid] = (attempt, now, reason)
                self._orders[gid] = (attempt, reason)

    def ack_placements(self, done: Sequence[GangKey], retry: Sequence[GangKey]) -> None:
        now = self.clock()
        with self._cond:
            for gid, attempt in done:
                e = self._entries.get(gid)
                if e is not None and e.req.attempt == attempt and e.state == _State.HANDED:
                    self._drop_locked(gid)
            for gid, attempt in retry:
                e = self._entries.get(gid)
                if e is not None and e.req.attempt == attempt and e.state == _State.HANDED:
                    self._release_alloc_locked(gid, attempt)
                    e.not_before = now + RETRY_AFTER_FAILED_PLACEMENT_S
                    self._push_locked(e, now, hold=True)
            self._capacity_freed_locked()
            QUEUED.set(len(self._entries))
            self._cond.notify_all()

    def _trim_ready_locked(self) -> None:
        while self._ready:
            _, seq, gid = self._ready[0]
            e = self._entries.get(gid)
            if e is not None and e.seq == seq and e.state == _State.READY:
                return
            heapq.heappop(self._ready)

    def _consumer_asks_locked(self, consumer: str) -> bool:
        """Another job manager asks for placements than the last one: that one died or was replaced, and what it
        took and did not acknowledge is handed out again now (same placement, same claims). The new one recovered
        from the store first: a gang whose launch the last one had recorded is its recovery's business, and a
        placement for it is acknowledged as done when it comes. False: `consumer` was replaced."""
        ok, replaced = self._consumer.asks(consumer)
        if replaced and self._handed:
            log.warning("a new job manager asks: %d placements the last one took are handed out again",
                        len(self._handed))
            for gid in list(self._handed):
                e = self._entries[gid]
                self._handed.pop(gid)
                e.state = _State.READY
                heapq.heappush(self._ready, (e.order(), e.seq, gid))
        return ok

    def _expire_handed_locked(self) -> None:
        now = self.clock()
        for gid in list(self._handed):
            e = self._entries[gid]
            if now - e.handed_at <= HANDED_TIMEOUT_S:
                break  # oldest first
            self._release_alloc_locked(gid, e.req.attempt)
            self._push_locked(e, now)

    # --- placement side -------------------------------------------------------------------------------------
    def dequeue(self, max_n: int, timeout_s: float, capacity: Resources | None = None,
                engine: str = "") -> list[GangRequest]:
        """Admitted gangs in priority order (highest first, then oldest). Their allocation is recorded now so
        admission of the next gang sees it. `capacity`: the cluster's, as the placement engine knows it;
        `engine`: the placement engine's id (a new one takes back what the last one was placing)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            if not self._engine_asks_locked(engine):
                return []
            if capacity is not None and capacity != self._capacity:
                self._capacity = capacity
                self._changed_locked()
            while True:
                if self._engine.superseded(engine):  # replaced while it waited: admit nothing for it
                    return []
                out = self._admit_locked(max_n)
                if out or self._orphaned or self._probes:
                    return out
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    return []
                # wake when something is enqueued/removed, or when a parked gang may be retried
                wait = left
                if self._parked:
                    wait = min(wait, max(0.0, self._parked[0][0] - self.clock()))
                if self._unpark and self._parked:
                    wait = min(wait, max(0.0, self._last_unpark + UNPARK_EVERY_S - time.monotonic()))
                if self._starved:
                    wait = min(wait, max(0.05, self._next_probe_round - self.clock()))
                self._cond.wait(wait)

    def _admit_locked(self, max_n: int) -> list[GangRequest]:
        now = self.clock()
        mono = time.monotonic()  # the rate limit protects the CPU: real time, whatever the scheduling clock
        if self._unpark and mono - self._last_unpark >= UNPARK_EVERY_S:
            parked, self._parked = self._parked, []
            for item in parked:
                e = self._entries.get(item[2])
                if e is None or e.seq != item[1] or e.state != _State.WAITING:
                    continue
                if e.hold and e.not_before > now:
                    self._parked.append(item)
                    continue
                e.not_before = 0.0
                self._queue_locked(e)
            heapq.heapify(self._parked)
            self._unpark = False
            self._last_unpark = mono
        while self._parked and self._parked[0][0] <= now:
            _, seq, gid = heapq.heappop(self._parked)
            e = self._entries.get(gid)
            if e is not None and e.seq == seq and e.state == _State.WAITING:
                self._queue_locked(e)
        out: list[GangRequest] = []
        max_n = min(max_n, MAX_IN_FLIGHT - len(self._in_flight))  # back-pressure: launchers are behind
        self._entitlements_locked()  # (only when an input changed)
        # the pools' queues merged by their heads: a round costs O(pools + admitted), not O(waiting gangs)
        heads: list[tuple[tuple[int, float, str], str]] = []
        for pool in list(self._queues):
            head = self._head_locked(pool)
            if head is not None:
                heads.append((head[0], pool))
        heapq.heapify(heads)
        while heads and len(out) < max_n:
            _, pool = heapq.heappop(heads)
            head = self._head_locked(pool)
            if head is None:
                continue
            e = self._entries[head[2]]
            g = e.req
            reason = (admit(g.total, g.respool, self._pools, self._allocated)
                      or entitled(g.total, g.respool, self._ent, self._allocated))
            if reason is not None:
                # the pool's first gang does not fit its pool's limit or entitlement: the gangs behind it wait
                # too (else a stream of small gangs would take every freed share and it would never run)
                self._starve_locked(e, now, "pool")
                self._set_reason_locked(e, reason)
                continue
            heapq.heappop(self._queues[pool])
            nxt = self._head_locked(pool)
            if nxt is not None:
                heapq.heappush(heads, (nxt[0], pool))
            if not g.preemptible:
                reason = within_reservation(g.total, g.respool, self._pools, self._pinned)
                if reason is not None:  # its own rule: the gangs behind it go on
                    self._starve_locked(e, now, "reservation")
                    self._set_reason_locked(e, reason)
                    e.not_before = now + RETRY_AFTER_FAILED_PLACEMENT_S
                    self._push_locked(e, now)
                    continue
            self._undemand_locked(e)
            e.state = _State.PLACING
            self._in_flight.add(g.gang_id)
            self._allocate_locked(e.req)
            QUEUE_WAIT.observe(max(0.0, now - e.queued_at))
            if not e.admitted_at:  # (a gang that failed placement and is admitted again is not counted again)
                GANG_STAGE.labels("queued").observe(max(0.0, now - e.queued_at))
                e.admitted_at = now
            out.append(e.req)
        self._probe_locked(now)
        return out

    # --- preemption -----------------------------------------------------------------------------------------
    def _starve_locked(self, e: _Entry, now: float, block: str) -> None:
        e.block = block
        if not e.starved_since:
            e.starved_since = now
            self._starved[e.req.gang_id] = None

    def _pending_victims_locked(self, e: _Entry) -> list[str]:
        if not e.waits_for:
            return []
        left = [v for v in e.waits_for if v in self._preempting]
        if not left:
            e.waits_for = ()
        return left

    def _probe_locked(self, now: float) -> None:
        """Find the gangs that only preemption can start: the first starved gang of each pool's queue, past the
        settling window, not already waiting for victims. Each becomes a probe for the placement engine."""
        if not self._starved or now < self._next_probe_round or self._capacity is None:
            return
        self._next_probe_round = now + PROBE_ROUND_EVERY_S
        heads: dict[str, _Entry] = {}
        for gid in list(self._starved):
            e = self._entries.get(gid)
            if e is None or not e.starved_since:
                del self._starved[gid]
                continue
            if e.state != _State.WAITING:
                continue
            cur = heads.get(e.req.respool)
            if cur is None or e.order() < cur.order():
                heads[e.req.respool] = e
        for e in sorted(heads.values(), key=_Entry.order):
            if len(self._probes) >= MAX_PROBES:
                break
            every = RESERVATION_REFRESH_S if e.reservation is not None else PROBE_EVERY_S
            if (now - e.starved_since < self._settle_s or now - e.probed_at < every
                    or e.block == "reservation" or self._pending_victims_locked(e)):
                continue
            e.probed_at = now
            g = e.req
            excluded = self._preempting
            cands: list[str] = []
            need = Resources()
            if self._preemption:
                if e.block == "hosts":  # within its entitlement: other pools over theirs give back first
                    cands = reclaim_candidates(g.total, g.respool, self._alloc, self._pool_gangs, self._own_alloc,
                                               self._ent, self._capacity, excluded)
                else:
                    need = shortfall(g.total, g.respool, self._pools, self._ent, self._allocated)
                cands += priority_candidates(g.priority, g.respool, self._alloc,
                                             self._pool_gangs.get(g.respool, ()), excluded)
            ending: tuple[tuple[str, Holding], ...] = ()
            if e.block == "hosts":  # entitled, no hosts: the hosts that free up earliest are kept for it
                ends = [(h.ends_at, gid, h) for gid in self._ending if (h := self._alloc[gid]).ends_at is not None]
                ending = tuple((gid, h) for _, gid, h in heapq.nsmallest(MAX_ENDING, ends))
            if cands or e.block == "hosts":
                self._probes.append(Probe(g, tuple((c, self._alloc[c]) for c in cands[:MAX_CANDIDATES]), need,
                                          ending))

    def reserving(self) -> list[GangKey]:
        """The waiting gangs the placement engine keeps hosts for (it forgets any other reservation)."""
        with self._cond:
            out = []
            for gid in list(self._reserving):
                e = self._entries.get(gid)
                if e is None or e.reservation is None or e.state not in (_State.WAITING, _State.PLACING):
                    del self._reserving[gid]
                else:
                    out.append((gid, e.req.attempt))
            return out

    def take_probes(self) -> list[Probe]:
        """The probes for the placement engine (taken with a dequeue)."""
        with self._cond:
            out, self._probes = self._probes, []
            return out

    def _preempt_locked(self, gang_id: str, attempt: int, victims: Sequence[tuple[str, int]], now: float) -> None:
        """The placement engine chose `victims` for the waiting gang: order them preempted, unless anything moved
        on meanwhile (then the gang simply asks again)."""
        e = self._entries.get(gang_id)
        if e is None or e.req.attempt != attempt or e.state != _State.WAITING or not victims:
            return
        for gid, a in victims:
            h = self._alloc.get(gid)
            if h is None or h.attempt != a or gid in self._preempting or not h.preemptible:
                return
        names = []
        for gid, a in victims:
            h = self._alloc[gid]
            kind = "priority" if h.pool == e.req.respool else "reclaim"
            reason = (f"for gang {gang_id} of pool {e.req.respool} (priority {e.req.priority})" if kind == "priority"
                      else f"pool {h.pool} is over its entitlement and pool {e.req.respool} needs its share back "
                           f"for gang {gang_id}")
            self._preempting[gid] = (a, now, reason)
            self._orders[gid] = (a, reason)
            PREEMPTIONS.labels(h.pool, kind).inc()
            names.append(gid)
        e.waits_for = tuple(names)
        self._set_reason_locked(e, "")
        self._cond.notify_all()

    def _set_reason_locked(self, e: _Entry, reason: str) -> None:
        left = self._pending_victims_locked(e)
        if left:
            more = f" and {len(left) - 5} more" if len(left) > 5 else ""
            reason = f"waiting for preempted gangs to exit: {', '.join(left[:5])}{more}"
        elif e.reservation is not None and e.block == "hosts":
            reason = describe(e.reservation, self.clock())
        if not reason:
            return
        if e.reason != reason:
            e.reason = reason
            self._reasons[e.req.gang_id] = PlacementFailure(e.req.gang_id, e.req.job_id, e.req.attempt, reason)
            self._cond.notify_all()

    def _engine_asks_locked(self, engine: str) -> bool:
        """A placement engine other than the last one asks: the last one is gone (its process died or its standby
        took over), so the gangs it was placing go back to the queue at once, and whatever it claimed for them
        is released by the new one before it claims anything (orphaned claims). False: `engine` was replaced."""
        ok, replaced = self._engine.asks(engine)
        if replaced:
            now = self.clock()
            back = [e for e in self._entries.values() if e.state == _State.PLACING]
            for e in back:
                self._release_alloc_locked(e.req.gang_id, e.req.attempt)
                self._orphaned[(e.req.gang_id, e.req.attempt)] = None
                e.not_before = now
                self._push_locked(e, now)
            if back:
                log.warning("a new placement engine asks: %d gangs the last one was placing go back to the queue",
                            len(back))
        return ok

    def set_placements(self, placements: Sequence[GangPlacement], failures: Sequence[PlacementFailure],
                       stale: Sequence[PlacementFailure] = (),
                       preemptions: Sequence[tuple[GangKey, Sequence[GangKey]]] = (),
                       reservations: Sequence[tuple[GangKey, Sequence[str], float]] = (), engine: str = "") -> None:
        """Placed (and claimed) gangs go to jobmgr; failed ones back to the queue with their reason (retried after
        a back-off), stale ones (refused at claim) back at once. `preemptions` and `reservations`: a probe's
        answers, the victims the placement engine chose for a waiting gang and the hosts it keeps for it
        (hosts, expected start or 0). The answers of a replaced engine (`engine` not the last to ask) are
        dropped, their claims released."""
        now = self.clock()
        with self._cond:
            if self._engine.superseded(engine):
                for p in placements:
                    self._orphan_locked(p)
                log.warning("dropped the answers of a replaced placement engine (%d placements)", len(placements))
                return
            for p in placements:
                e = self._entries.get(p.gang_id)
                if e is None or e.req.attempt != p.attempt or e.state != _State.PLACING:
                    self._orphan_locked(p)  # removed (job stopped, resmgr reset) while placing: nobody launches it
                    continue
                e.state = _State.READY
                e.placement = p
                GANG_STAGE.labels("placing").observe(max(0.0, now - e.admitted_at))
                self._starved.pop(p.gang_id, None)
                self._reserving.pop(p.gang_id, None)
                e.reservation = None
                h = self._alloc.get(p.gang_id)
                if h is not None and h.attempt == p.attempt:
                    h.usage = tuple((m.hostname, m.resources) for m in p.members)
                    h.since = now
                heapq.heappush(self._ready, (e.order(), e.seq, p.gang_id))
            for f, backoff in [(f, RETRY_AFTER_FAILED_PLACEMENT_S) for f in failures] + [(f, 0.0) for f in stale]:
                e = self._entries.get(f.gang_id)
                if e is None or e.req.attempt != f.attempt or e.state != _State.PLACING:
                    continue
                self._release_alloc_locked(f.gang_id, f.attempt)
                e.not_before = now + backoff
                if backoff:
                    self._starve_locked(e, now, "hosts")
                    self._set_reason_locked(e, f.reason)
                self._push_locked(e, now)
            for (gid, attempt), victims in preemptions:
                self._preempt_locked(gid, attempt, victims, now)
            for (gid, attempt), hosts, start in reservations:
                e = self._entries.get(gid)
                if e is not None and e.req.attempt == attempt and e.state in (_State.WAITING, _State.PLACING):
                    e.reservation = Reservation(frozenset(hosts), start or None)
                    self._reserving[gid] = None
                    self._set_reason_locked(e, "")
            QUEUED.set(len(self._entries))
            self._cond.notify_all()

    def _entitlements_locked(self) -> None:
        """Recompute the entitlements if an input changed (a few pools: microseconds to a millisecond), and publish
        them with the pools' allocation, demand and queue as metrics."""
        if not self._ent_dirty:
            return
        self._ent_dirty = False
        if self._capacity is None or "/" not in self._pools:
            self._ent = {}
            return
        policies = {p.path: PoolPolicy(p.path, p.reservation, p.limit, p.share, p.reservation_type == "static")
                    for p in self._pools.values()}
        self._ent = entitlements(policies, self._capacity, self._demand, self._own_alloc)
        demand = _subtree_sums(self._demand, self._pools)
        queued = self._queued_locked()
        for path in self._pools:  # every pool, so a figure that fell to 0 says 0
            ent, alloc, want = self._ent.get(path), self._allocated.get(path, _ZERO), demand.get(path, _ZERO)
            for dim in DIMS:
                unit = BASE_UNITS[dim]
                POOL_ENTITLEMENT.labels(path, dim).set(getattr(ent, dim) * unit if ent is not None else 0.0)
                POOL_ALLOCATION.labels(path, dim).set(getattr(alloc, dim) * unit)
                POOL_DEMAND.labels(path, dim).set(getattr(want, dim) * unit)
            POOL_QUEUED.labels(path).set(queued.get(path, 0))

    def _queued_locked(self) -> dict[str, int]:
        queued: dict[str, int] = {}
        for e in self._entries.values():
            if e.state in (_State.WAITING, _State.PLACING):
                queued[e.req.respool] = queued.get(e.req.respool, 0) + 1
        return queued

    # --- views ----------------------------------------------------------------------------------------------
    def usage(self) -> tuple[dict[str, Resources], dict[str, int]]:
        """(what each pool's gangs hold, with its descendants'; gangs of each pool waiting to be placed)"""
        with self._cond:
            return dict(self._allocated), self._queued_locked()

    def entitlement_if(self, path: str, extra: Resources) -> Entitlement | None:
        """`path`'s entitlement if it also asked for `extra` (what a new job would ask): a what-if, nothing changes.
        None while the cluster's capacity is not known, or for a pool this manager does not have."""
        with self._cond:
            if self._capacity is None or "/" not in self._pools or path not in self._pools:
                return None
            policies = {p.path: PoolPolicy(p.path, p.reservation, p.limit, p.share, p.reservation_type == "static")
                        for p in self._pools.values()}
            demand = dict(self._demand)
            demand[path] = demand.get(path, Resources()) + extra
            capacity = self._capacity
            allocation = dict(self._own_alloc)
        return entitlements(policies, capacity, demand, allocation).get(path)  # pure: outside the lock

    def pool_usage(self) -> dict[str, PoolUsage]:
        """Every pool's allocation, demand (with its subtree's), entitlement and queue, for GetPool/ListPools."""
        with self._cond:
            self._entitlements_locked()
            queued = self._queued_locked()
            demand = _subtree_sums(self._demand, self._pools)
            out = {}
            for path in self._pools:
                out[path] = PoolUsage(self._allocated.get(path, Resources()), demand.get(path, Resources()),
                                      self._ent.get(path) if self._capacity is not None else None,
                                      queued.get(path, 0))
            return out

    def queue(self, pool: str = "", limit: int = 1000) -> tuple[list[QueuedGang], int]:
        """The gangs waiting or being placed, in queue order (priority, then submission time), of `pool` and its
        subtree ("": every pool), with each one's position in its own pool's queue; and how many there are."""
        under = pool.rstrip("/") + "/" if pool else ""
        with self._cond:
            waiting = [e for e in self._entries.values() if e.state in (_State.WAITING, _State.PLACING)
                       and (not pool or e.req.respool == pool or e.req.respool.startswith(under))]
            waiting.sort(key=_Entry.order)
            position: dict[str, int] = {}
            first: dict[str, str] = {}  # pool -> its first waiting gang
            out: list[QueuedGang] = []
            for e in waiting:
                g = e.req
                position[g.respool] = position.get(g.respool, 0) + 1
                reason = e.reason
                if e.state == _State.WAITING:
                    head = first.setdefault(g.respool, g.gang_id)
                    if not reason and head != g.gang_id:
                        reason = f"waiting behind {head}, the first gang of pool {g.respool}'s queue"
                if len(out) < limit:
                    out.append(QueuedGang(g.gang_id, g.job_id, g.attempt, g.respool, g.priority, len(g.members),
                                          g.total, e.queued_at, "waiting" if e.state == _State.WAITING else "placing",
                                          reason, position[g.respool], g.preemptible))
            return out, len(waiting)

    def capacity(self) -> Resources | None:
        """The cluster's capacity as last reported by the placement engine (None: not yet)."""
        with self._cond:
            return self._capacity


def _add(book: dict[str, Resources], key: str, r: Resources) -> None:
    book[key] = book.get(key, Resources()) + r


def _sub(book: dict[str, Resources], key: str, r: Resources) -> None:
    rest = book.get(key, Resources()) - r
    if rest.cpu <= 1e-9 and rest.mem <= 1e-9 and rest.disk <= 1e-9 and rest.gpu <= 0 and rest.ports <= 0:
        book.pop(key, None)
    else:
        book[key] = rest


def _subtree_sums(own: dict[str, Resources], pools: dict[str, ResourcePool]) -> dict[str, Resources]:
    out: dict[str, Resources] = {}
    for path, r in own.items():
        for p in chain(path):
            if p in pools or p == path:
                _add(out, p, r)
    return out


def _forget_metrics(pool: str) -> None:
    for dim in DIMS:
        for g in (POOL_ENTITLEMENT, POOL_ALLOCATION, POOL_DEMAND):
            try:
                g.remove(pool, dim)
            except KeyError:
                pass
    try:
        POOL_QUEUED.remove(pool)
    except KeyError:
        pass
