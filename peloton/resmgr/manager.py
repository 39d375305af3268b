"""Resource manager state: the gang queue, the allocations per pool, and placements on their way to jobmgr.

In memory by design: the job manager owns the durable gang records; it re-enqueues queued gangs and re-registers
the allocations of running ones at its start (recovery) and every 30 s for any gang resmgr does not know (the
reconciler's queue check), so a restart of resmgr on its own loses nothing.

A gang's entry goes WAITING (in the priority queue) -> PLACING (handed to placement, its allocation counted) ->
READY (placed and claimed) -> HANDED (given to jobmgr) and is dropped only when jobmgr acknowledges that the
launch intent is durable; a placement jobmgr could not record goes back to WAITING (AckPlacements retry), and one
handed out and never acknowledged (jobmgr died) goes back after HANDED_TIMEOUT_S. A placement is never lost; nor
is a gang an engine was handed and never answered for (its answer lost): it goes back at that engine's next dequeue.

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

This module is the shell: it owns the one lock that guards everything (memory only), with a condition for each side
that long-polls on it (`_cond`: the placement engines' dequeue; `_ready`: the job manager's launchers), the clock,
the long polls and the metrics, and leaves every decision to the pure cores over plain data: queues.py
(the entries and their queues), holdings.py (what each gang and pool holds), admission.py (who is admitted, in which
order), entitlement.py (each pool's share), preemption.py (probes, candidates and orders). No core takes a lock.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType

from prometheus_client import Counter, Gauge, Histogram

from peloton.domain.allocation import AdmissionPreview, Entitlement, GangAsk, PoolUsage
from peloton.domain.gpumap import GpuAsk, Waiting, distinct_asks
from peloton.domain.model import ResourcePool
from peloton.domain.placement import GangPlacement, GangRequest, PlacementFailure
from peloton.domain.resources import BASE_UNITS, Resources
from peloton.observability.gang_metrics import STAGE
from peloton.placement.reservation import ORDERS, Reservation
from peloton.resmgr.admission import admission_if, admission_round
from peloton.resmgr.callers import ENGINE_LEASE_S, ENGINE_MODES, Current, Engines, orphan_release
from peloton.resmgr.entitlement import PoolTree, entitlements, policies, pool_tree
from peloton.resmgr.holdings import Holdings
from peloton.resmgr.ordering import ARRIVAL, QueueOrder
from peloton.resmgr.paths import subtree_sums
from peloton.resmgr.preemption import KINDS, PROBE_EVERY_S, RESERVATION_REFRESH_S, Preemptions, Probe, find_probes
from peloton.resmgr.queues import Entry, QueuedGang, Queues, State

log = logging.getLogger(__name__)

QUEUED = Gauge("peloton_resmgr_queued_gangs", "Gangs waiting for admission or placement")
QUEUE_WAIT = Histogram("peloton_resmgr_queue_wait_seconds", "From enqueue to admission (handed to placement)",
                       buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30, 300, 3600))
RETRY_AFTER_FAILED_PLACEMENT_S = 1.0
MAX_IN_FLIGHT = 1024  # gangs admitted and not yet durably launching (see the module docstring)
HANDED_TIMEOUT_S = 60.0
UNPARK_EVERY_S = 0.05
CALLS_REMEMBERED = 4096  # apply_call: ids of the latest calls (a sender retries one call until it goes through)
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
PROBE_ROUND_EVERY_S = 0.25  # the starved gangs are looked over at most this often
MAX_PROBES = 8  # per dequeue
ORDER_AGAIN_S = 60.0  # a preemption order not acted on (jobmgr restarted) is given again after this long


class ResourceManager:
    def __init__(self, load_pools: Callable[[], Sequence[ResourcePool]], clock: Callable[[], float] = time.time,
                 preemption_settle_s: float = DEFAULT_PREEMPTION_SETTLE_S, preemption: bool = True,
                 rate_clock: Callable[[], float] = time.monotonic, placement_order: str = "backfill",
                 queue_order: QueueOrder = ARRIVAL, placement_engines: str = "leader",
                 engine_lease_s: float = ENGINE_LEASE_S):
        """`preemption_settle_s`: how long a pool's first gang waits before it may preempt or reserve hosts;
        `preemption` False: it only reserves hosts. `rate_clock`: what the unpark rate limit counts in (real time;
        a replay passes its virtual clock so that the limit, too, is deterministic). `placement_order` "fifo":
        nothing behind the first gang waiting for hosts is admitted, and only gangs up to it may preempt (the
        placement engine's own order must be the same: --placement-order sets both). `queue_order`: the order of
        each pool's waiting gangs (--queue-order, ordering.py). `placement_engines` "leader": one placement engine
        at a time, and one that asks under a new id replaces the last (its standby took over); "shared": several
        act at once (--placement-engines shared), each placing the gangs it dequeued, and one silent for
        `engine_lease_s` (its `rate_clock`) is gone: the gangs it was placing go back to the queue."""
        if placement_order not in ORDERS:
            raise ValueError(f"placement_order: must be one of {', '.join(ORDERS)}, got {placement_order!r}")
        if placement_engines not in ENGINE_MODES:
            raise ValueError(f"placement_engines: must be one of {', '.join(ENGINE_MODES)}, got {placement_engines!r}")
        self._shared = placement_engines == "shared"
        self._fifo = placement_order == "fifo"
        self.placement_order = placement_order  # told to the placement engines with each dequeue
        self._load_pools = load_pools
        self.clock = clock
        self._rate_clock = rate_clock
        self.incarnation = uuid.uuid4().hex  # a new one whenever this forgets every gang (reset)
        self._settle_s = preemption_settle_s
        self._preemption = preemption
        # One lock, two conditions on it, so that a change wakes only the side it is news to: `_cond` (the
        # placement engines waiting in dequeue: something may be admitted) and `_ready` (the launchers waiting in
        # take_placements: placements, reasons or orders to take). A batch of placements wakes one launcher, which
        # passes the wake on if it left some (a wake per launcher per batch was among the hottest frames).
        self._mu = threading.RLock()  # (re-entrant, as the one condition's default lock was)
        self._cond = threading.Condition(self._mu)
        self._ready = threading.Condition(self._mu)
        # the state, all guarded by _cond's lock: the cores' books, then what only the shell keeps
        self._q = Queues(queue_order)
        self._pre = Preemptions()
        self._held = Holdings(on_release=self._released_locked)
        self._unpark = False  # capacity freed: move every parked entry back (at most every UNPARK_EVERY_S)
        self._last_unpark = float("-inf")
        self._orphaned: dict[GangKey, None] = {}  # claims of placements dropped before jobmgr took them, oldest first
        self._probes: list[Probe] = []
        # each waiting gang's distinct GPU asks, made once for its request (a gang of 512 alike members is one):
        # the hosts map asks for them at every page (waiting())
        self._gpu_asks: dict[str, tuple[GangRequest, tuple[GpuAsk, ...]]] = {}
        self._next_probe_round = float("-inf")
        self._closed = False  # the daemon is stopping: long polls answer at once
        self._engine = Current()  # the placement engine that asks for gangs ("leader")
        self._engines = Engines(engine_lease_s)  # the placement engines that act at once ("shared")
        # per engine, the gang attempts its dequeues handed it since its last dequeue began (see _unanswered_locked)
        self._dequeued: dict[str, dict[str, int]] = {}
        self._calls: OrderedDict[str, None] = OrderedDict()  # the latest calls applied (apply_call), oldest first
        self._warned_replaced = False  # a replaced engine kept asking ("leader"): said once
        self._consumer = Current()  # the job manager that takes placements
        self._capacity: Resources | None = None  # the cluster's, as the placement engine last reported it
        self._ent: dict[str, Entitlement] = {}
        self._ent_dirty = True
        # replaced whole when the pools are read again, never changed in place: held_pools reads it without the lock
        self._pools: dict[str, ResourcePool] = {}
        self._tree: PoolTree | None = None  # the pools' policies and shape, made when the pools change
        self._gauges: dict[str, _PoolGauges] = {}  # each pool's metric series, looked up once
        self._preempted: dict[tuple[str, str], Counter] = {}  # (pool, kind) -> its PREEMPTIONS series, looked up once
        self._gauges_of = _FORGOTTEN[0]  # (series removed since, by any manager: looked up again)
        self.refresh_pools()

    def refresh_pools(self) -> None:
        pools = {p.path: p for p in self._load_pools()}
        with self._cond:
            for gone in set(self._pools) - set(pools):
                _forget_metrics(gone)
                self._gauges.pop(gone, None)
            self._pools = pools
            self._tree = None  # (made again when next needed: _tree_locked)
            self._changed_locked()
            self._cond.notify_all()

    def _news_for_consumer_locked(self) -> None:
        """Placements, reasons or orders to take: wake one waiting launcher (it passes the wake on if it leaves
        some: take_placements), not all of them for one batch."""
        self._ready.notify()

    def _consumer_news_left_locked(self) -> bool:
        return self._q.has_ready() or bool(self._q.reasons) or bool(self._pre.orders)

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
            self._ready.notify_all()

    def pools(self) -> dict[str, ResourcePool]:
        with self._cond:
            return dict(self._pools)

    def held_pools(self) -> Mapping[str, ResourcePool]:
        """The pools as last read, read-only and without the lock (a create asks for them; the lock is the
        scheduling round's)."""
        return MappingProxyType(self._pools)

    def reset(self) -> None:
        """Forget everything (the job manager recovers and enqueues again) but the claims of the placements
        jobmgr had not taken: those are released by the placement engine's next round."""
        with self._cond:
            self.incarnation = uuid.uuid4().hex
            for e in self._q.entries.values():
                if e.state == State.READY and e.placement is not None:
                    self._orphan_locked(e.placement)
            self._q.clear()
            self._held.clear()
            self._pre.clear()
            self._probes.clear()
            self._changed_locked()
            QUEUED.set(0)
            self._cond.notify_all()
            self._ready.notify_all()

    # --- bookkeeping ------------------------------------------------------------------------------------------
    def _orphan_locked(self, p: GangPlacement) -> None:
        self._orphaned[(p.gang_id, p.attempt)] = None
        while len(self._orphaned) > MAX_ORPHANED_CLAIMS:
            del self._orphaned[next(iter(self._orphaned))]

    def take_orphaned_claims(self, engine: str = "") -> list[GangKey]:
        """The claims of placements dropped before jobmgr took them, for the placement engine `engine` to release
        (with several engines, only those no other engine may claim again first: callers.orphan_release)."""
        with self._cond:
            if not self._shared:
                out = list(self._orphaned)
                self._orphaned.clear()
                return out
            out = []
            for key in list(self._orphaned):
                e = self._q.get(key[0])
                state = None if e is None or e.req.attempt != key[1] else e.state.name.lower()
                what = orphan_release(state, e.engine if e is not None else "", engine)
                if what != "keep":
                    del self._orphaned[key]
                if what == "give":
                    out.append(key)
            return out

    def _orphan_late_locked(self, p: GangPlacement) -> None:
        """An engine claimed `p` for a gang attempt it no longer places. Released by some engine, unless the same
        attempt was placed since (by another engine, whose claim then succeeded: the late one is gone already)."""
        e = self._q.live(p.gang_id, p.attempt, State.READY, State.HANDED)
        if not (self._shared and e is not None):
            self._orphan_locked(p)

    def _drop_locked(self, gang_id: str) -> None:
        e = self._q.drop(gang_id)
        if e is not None and e.state == State.READY and e.placement is not None:
            self._orphan_locked(e.placement)  # HANDED ones are jobmgr's: its launcher releases what it drops
        elif e is not None and e.state == State.PLACING and self._shared:
            # its engine may be gone (with several, nothing else says so) and have claimed it: any engine releases
            # it (one that is alive and claims it later answers with the claim, which is released then)
            self._orphaned[(e.req.gang_id, e.req.attempt)] = None

    def _release_alloc_locked(self, gang_id: str, up_to_attempt: int) -> bool:
        return self._held.release(gang_id, up_to_attempt) is not None

    def _released_locked(self, gang_id: str) -> None:
        """A holding was dropped (by any path, admission's replacing an older attempt's included)."""
        self._pre.forget(gang_id)
        self._ent_dirty = True  # what the pool wants went down

    def _set_reason_locked(self, e: Entry, reason: str, now: float) -> None:
        if self._q.set_reason(e, reason, now, self._pre.preempting):
            self._news_for_consumer_locked()

    # --- jobmgr side ----------------------------------------------------------------------------------------
    def enqueue(self, gangs: Sequence[GangRequest], running: Sequence[GangRequest] = ()) -> None:
        """Queue each gang attempt. Idempotent: an attempt already known (queued, placing, placed or handed out)
        is left alone; a newer attempt replaces an older one."""
        now = self.clock()
        with self._cond:
            for g in gangs:
                cur = self._q.get(g.gang_id)
                if cur is not None and cur.req.attempt >= g.attempt:
                    continue
                if self._release_alloc_locked(g.gang_id, g.attempt):
                    self._unpark = True  # capacity freed
                self._drop_locked(g.gang_id)
                self._q.add(g, now)
            for g in running:
                self._held.hold(g)
            self._changed_locked()  # new demand: the entitlements move
            QUEUED.set(len(self._q))
            self._cond.notify_all()

    def apply_call(self, call_id: str, remove: Sequence[tuple[str, int]], gangs: Sequence[GangRequest] = (),
                   running: Sequence[GangRequest] = ()) -> None:
        """`remove`, then `enqueue(gangs, running)`, as one call of the job manager's side effects: once per
        `call_id` (its sender tries a call again when it failed, and the failure may have been its answer's alone).
        Applied again, a call whose gangs have meanwhile been placed and launched would release what they hold and
        queue them again: their pool over-admitted until they end. An empty id: applied every time."""
        with self._cond:  # (re-entrant: remove and enqueue take it too, and nothing runs between them)
            if call_id and call_id in self._calls:
                return
            if remove:
                self.remove(remove)
            if gangs or running:
                self.enqueue(gangs, running)
            if call_id:
                self._calls[call_id] = None
                while len(self._calls) > CALLS_REMEMBERED:
                    self._calls.popitem(last=False)

    def remove(self, gang_ids: Sequence[tuple[str, int]]) -> None:
        """Drop gangs (up to the given attempt) from the queue and release their allocation."""
        with self._cond:
            for gid, attempt in gang_ids:
                e = self._q.get(gid)
                if e is not None and e.req.attempt <= attempt:
                    self._drop_locked(gid)
                self._release_alloc_locked(gid, attempt)
                self._q.reasons.pop(gid, None)
            self._changed_locked()
            QUEUED.set(len(self._q))
            self._cond.notify_all()

    def unknown(self, keys: Sequence[GangKey]) -> list[GangKey]:
        """The gang attempts resmgr neither holds in any state nor counts an allocation for (it restarted, or an
        enqueue was lost): the caller re-enqueues the queued ones and re-registers the running ones."""
        with self._cond:
            out = []
            for gid, attempt in keys:
                e = self._q.get(gid)
                a = self._held.get(gid)
                if (e is None or e.req.attempt < attempt) and (a is None or a.attempt < attempt):
                    out.append((gid, attempt))
            return out

    def gangs(self) -> list[GangKey]:
        """Every gang attempt this manager holds in any state or counts an allocation for (the newest of each gang),
        sorted by gang id: the job manager releases those whose gang is over in its records (a release it lost)."""
        with self._cond:
            newest = {gid: e.req.attempt for gid, e in self._q.entries.items()}
            for gid, h in self._held.by_gang.items():
                newest[gid] = max(h.attempt, newest.get(gid, h.attempt))
        return sorted(newest.items())

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
                    if self._consumer_news_left_locked():
                        self._news_for_consumer_locked()  # (the wake was meant for the current one)
                    return [], []
                now = self.clock()
                expired = self._q.expired(now, HANDED_TIMEOUT_S)
                for e in expired:  # jobmgr died with them: placed again
                    self._release_alloc_locked(e.req.gang_id, e.req.attempt)
                    self._q.push(e, now)
                if expired:
                    self._cond.notify_all()  # the placement side has them to admit again
                self._pre.again(now, ORDER_AGAIN_S)
                if self._consumer_news_left_locked():
                    break
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    return [], []
                self._ready.wait(min(left, HANDED_TIMEOUT_S))
            out = self._q.hand(max_n, self.clock())
            reasons = list(self._q.reasons.values())
            self._q.reasons.clear()
            if self._q.has_ready():
                self._news_for_consumer_locked()  # more than this caller takes: the next launcher's turn
            return out, reasons

    def take_preemptions(self) -> list[tuple[str, int, str]]:
        """The gangs to preempt, each (gang id, attempt, reason), for jobmgr (with its placements)."""
        with self._cond:
            return self._pre.take()

    def ack_placements(self, done: Sequence[GangKey], retry: Sequence[GangKey]) -> None:
        now = self.clock()
        with self._cond:
            for gid, attempt in done:
                if self._q.live(gid, attempt, State.HANDED) is not None:
                    self._drop_locked(gid)
                    self._held.launched(gid, attempt)
            for gid, attempt in retry:
                e = self._q.live(gid, attempt, State.HANDED)
                if e is not None:
                    self._release_alloc_locked(gid, attempt)
                    e.not_before = now + RETRY_AFTER_FAILED_PLACEMENT_S
                    self._q.push(e, now, hold=True)
            self._unpark = True  # capacity freed
            QUEUED.set(len(self._q))
            self._cond.notify_all()

    def _consumer_asks_locked(self, consumer: str) -> bool:
        """Another job manager asks for placements than the last one: that one died or was replaced, and what it
        took and did not acknowledge is handed out again now (same placement, same claims). The new one recovered
        from the store first: a gang whose launch the last one had recorded is its recovery's business, and a
        placement for it is acknowledged as done when it comes. False: `consumer` was replaced."""
        ok, replaced = self._consumer.asks(consumer)
        if replaced and self._q.handed:
            log.warning("a new job manager asks: %d placements the last one took are handed out again",
                        self._q.hand_back())
        return ok

    # --- placement side -------------------------------------------------------------------------------------
    @property
    def shared(self) -> bool:
        """--placement-engines shared: several placement engines act at once."""
        return self._shared

    def dequeue(self, max_n: int, timeout_s: float, capacity: Resources | None = None,
                engine: str = "", gone: Callable[[], bool] | None = None) -> list[GangRequest]:
        """Admitted gangs in priority order (highest first, then oldest). Their allocation is recorded now so
        admission of the next gang sees it. `capacity`: the cluster's, as the placement engine knows it;
        `engine`: the placement engine's id (a new one takes back what the last one was placing); `gone`: true
        once the caller has gone (its call cancelled: wake_engines wakes the wait), which then takes nothing."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            if self._shared:
                self._engine_begins_locked(engine)
                self._unanswered_locked(engine)
                try:
                    return self._dequeue_locked(max_n, deadline, capacity, engine, gone)
                finally:
                    self._engines.end(engine, self._rate_clock())
            if not self._engine_asks_locked(engine):
                return []
            self._unanswered_locked(engine)
            return self._dequeue_locked(max_n, deadline, capacity, engine, gone)

    def _unanswered_locked(self, engine: str) -> None:
        """An engine answers a round (set_placements) before it dequeues again, so a gang its earlier dequeues
        handed it that is still PLACING as its own now will never be answered: the answer was lost (a failed
        SetPlacements, a DequeueGangs answer cut on its way back). Nothing else takes it back from an engine that
        keeps asking under the same id, so it would hold its pool's share, placed by nobody, for ever: it goes
        back to the queue now, its claim (if one was made) to be released before it is claimed again."""
        if not engine:
            return
        mine = self._dequeued.pop(engine, None)
        if mine:
            self._take_back_locked([e for gid, attempt in mine.items()
                                    if (e := self._q.live(gid, attempt, State.PLACING)) is not None
                                    and e.engine == engine])

    def wake_engines(self) -> None:
        """A placement engine's call ended (with several engines, one that died: its long poll is to end now,
        taking nothing, and its lease then runs out; dequeue's `gone`)."""
        with self._cond:
            self._cond.notify_all()

    def _dequeue_locked(self, max_n: int, deadline: float, capacity: Resources | None,
                        engine: str, gone: Callable[[], bool] | None) -> list[GangRequest]:
        if capacity is not None and capacity != self._capacity:
            self._capacity = capacity
            self._changed_locked()
        while True:
            if gone is not None and gone():  # the engine died in its long poll: what it took would wait for its lease
                return []
            if not self._shared and self._engine.superseded(engine):  # replaced while it waited: admit nothing
                return []
            out = self._admit_locked(max_n, engine)
            if out or self._probes or (self._orphaned and (not self._shared or self._orphans_for_locked(engine))):
                return out
            left = deadline - time.monotonic()
            if left <= 0 or self._closed:
                return []
            # wake when something is enqueued/removed, or when a parked gang may be retried
            wait = left
            promote = self._q.next_promotion()
            if promote is not None:
                wait = min(wait, max(0.0, promote - self.clock()))
            due = self._q.next_unpark()
            if due is not None:
                wait = min(wait, max(0.0, due - self.clock()))
                if self._unpark:
                    wait = min(wait, max(0.0, self._last_unpark + UNPARK_EVERY_S - time.monotonic()))
            if self._q.starved:
                wait = min(wait, max(0.05, self._next_probe_round - self.clock()))
            self._cond.wait(wait)

    def _admit_locked(self, max_n: int, engine: str = "") -> list[GangRequest]:
        now = self.clock()
        mono = self._rate_clock()  # the rate limit protects the CPU: real time, whatever the scheduling clock
        if self._unpark and mono - self._last_unpark >= UNPARK_EVERY_S:
            self._q.unpark_all(now)
            self._unpark = False
            self._last_unpark = mono
        self._q.unpark_due(now)
        self._q.promote_due(now)
        max_n = min(max_n, MAX_IN_FLIGHT - len(self._q.in_flight))  # back-pressure: launchers are behind
        self._entitlements_locked()  # (only when an input changed)
        changes = self._q.reason_changes
        admitted = admission_round(self._q, self._held, self._pools, self._ent, max_n, now,
                                   RETRY_AFTER_FAILED_PLACEMENT_S, self._pre.preempting, self._fifo)
        if self._q.reason_changes != changes:
            self._news_for_consumer_locked()  # news for jobmgr's long poll: why gangs wait
        out = []
        mine = self._dequeued.setdefault(engine, {}) if engine and admitted else None
        for e in admitted:
            e.engine = engine
            if mine is not None:
                mine[e.req.gang_id] = e.req.attempt
            QUEUE_WAIT.observe(max(0.0, now - e.queued_at))
            if not e.admitted_at:  # (a gang that failed placement and is admitted again is not counted again)
                STAGE["queued"].observe(max(0.0, now - e.queued_at))
                e.admitted_at = now
            out.append(e.req)
        self._probe_locked(now)
        return out

    def _engine_asks_locked(self, engine: str) -> bool:
        """A placement engine other than the last one asks: the last one is gone (its process died or its standby
        took over), so the gangs it was placing go back to the queue at once, and whatever it claimed for them
        is released by the new one before it claims anything (orphaned claims). False: `engine` was replaced."""
        ok, replaced = self._engine.asks(engine)
        if replaced:
            self._dequeued.pop(replaced, None)
            back = self._take_back_locked(self._q.placing())
            if back:
                log.warning("a new placement engine asks: %d gangs the last one was placing go back to the queue",
                            back)
        elif not ok and not self._warned_replaced:
            self._warned_replaced = True
            log.warning("a replaced placement engine asks again and is given nothing: if several placement engines "
                        "run at once, start the resource manager with --placement-engines shared")
        return ok

    def _take_back_locked(self, entries: Sequence[Entry]) -> int:
        """Gangs an engine that is gone was placing: back to the queue at once, their claims (if it made any) to
        be released by the engine that places them next, before it claims them again."""
        now = self.clock()
        for e in entries:
            self._release_alloc_locked(e.req.gang_id, e.req.attempt)
            self._orphaned[(e.req.gang_id, e.req.attempt)] = None
            e.not_before = now
            e.engine = ""
            self._q.push(e, now)
        if entries:
            self._cond.notify_all()
        return len(entries)

    def _engine_begins_locked(self, engine: str) -> None:
        """--placement-engines shared: a call of `engine` begins (see _engines_heard_locked)."""
        if self._engines.begin(engine, self._rate_clock()):
            log.info("placement engine %s asks: %d engines act", engine[:8], len(self._engines))
        self._engines_gone_locked()

    def _engines_heard_locked(self, engine: str) -> None:
        """--placement-engines shared: `engine` answered; any engine silent past its lease is gone, and the gangs
        it was placing go back to the queue."""
        if self._engines.heard(engine, self._rate_clock()):
            log.info("placement engine %s answers: %d engines act", engine[:8], len(self._engines))
        self._engines_gone_locked()

    def _engines_gone_locked(self) -> None:
        gone = self._engines.gone(self._rate_clock())
        if not gone:
            return
        for g in gone:
            self._dequeued.pop(g, None)
        back = self._take_back_locked([e for e in self._q.placing() if e.engine in gone])
        log.warning("placement engine(s) %s silent for %.0f s: %d gangs they were placing go back to the queue",
                    ", ".join(g[:8] for g in gone), self._engines.lease_s, back)

    def _orphans_for_locked(self, engine: str) -> bool:
        """Some orphaned claim is for `engine` to release now (--placement-engines shared)."""
        for gid, attempt in self._orphaned:
            e = self._q.get(gid)
            if e is None or e.req.attempt != attempt or orphan_release(
                    e.state.name.lower(), e.engine, engine) != "keep":
                return True
        return False

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
            if self._shared:
                self._engines_heard_locked(engine)
            elif self._engine.superseded(engine):
                for p in placements:
                    self._orphan_locked(p)
                log.warning("dropped the answers of a replaced placement engine (%d placements)", len(placements))
                self._cond.notify_all()  # the current engine releases their claims
                return
            orphaned = False
            for p in placements:
                e = self._q.live(p.gang_id, p.attempt, State.PLACING)
                if e is None or (self._shared and e.engine != engine):
                    # removed (job stopped, resmgr reset) while placing, or taken back from this engine (it was
                    # silent past its lease): nobody launches it
                    self._orphan_late_locked(p)
                    orphaned = True
                    continue
                if self._shared:
                    self._orphaned.pop((p.gang_id, p.attempt), None)  # its new claim succeeded: the old one is gone
                self._q.place(e, p)
                STAGE["placing"].observe(max(0.0, now - e.admitted_at))
                self._held.placed(p.gang_id, p.attempt, tuple((m.hostname, m.resources) for m in p.members), now)
            for f, backoff in [(f, RETRY_AFTER_FAILED_PLACEMENT_S) for f in failures] + [(f, 0.0) for f in stale]:
                e = self._q.live(f.gang_id, f.attempt, State.PLACING)
                if e is None or (self._shared and e.engine != engine):
                    continue
                self._release_alloc_locked(f.gang_id, f.attempt)
                e.not_before = now + backoff
                if backoff:
                    self._q.starve(e, now, "hosts")
                    self._set_reason_locked(e, f.reason, now)
                self._q.push(e, now)
            for (gid, attempt), victims in preemptions:
                e = self._q.get(gid)
                ordered = self._pre.order(e, attempt, victims, self._held, now) if e is not None else []
                for pool, kind in ordered:
                    self._count_preemption_locked(pool, kind)
                if e is not None and ordered:
                    self._set_reason_locked(e, "", now)
            for (gid, attempt), hosts, start in reservations:
                e = self._q.live(gid, attempt, State.WAITING, State.PLACING)
                if e is not None:
                    e.reservation = Reservation(frozenset(hosts), start or None)
                    self._q.reserving[gid] = None
                    self._set_reason_locked(e, "", now)
            QUEUED.set(len(self._q))
            if placements or preemptions:
                self._news_for_consumer_locked()  # one wake for the batch (take_placements passes it on)
            if failures or stale or preemptions or reservations or orphaned:
                self._cond.notify_all()  # the queue or admission's inputs changed: news for any other engine

    # --- preemption -----------------------------------------------------------------------------------------
    def _probe_locked(self, now: float) -> None:
        """Find the gangs that only preemption can start: the first starved gang of each pool's queue, past the
        settling window, not already waiting for victims. Each becomes a probe for the placement engine."""
        if not self._q.starved or now < self._next_probe_round or self._capacity is None:
            return
        self._next_probe_round = now + PROBE_ROUND_EVERY_S
        heads = self._starved_heads_locked()
        if len(self._probes) < MAX_PROBES and heads:
            self._probes += find_probes(heads, now, MAX_PROBES - len(self._probes), self._settle_s, self._preemption,
                                        self._held, self._pools, self._ent, self._capacity, self._pre.preempting)

    def _starved_heads_locked(self) -> list[Entry]:
        """The gangs that may be probed: each pool's first starved gang; under placement order fifo only those up to
        the first gang waiting for hosts (one behind it cannot start before it, so it takes nothing from others)."""
        heads = self._q.starved_heads()
        first = self._q.first_unplaced() if self._fifo else None
        return heads if first is None else [e for e in heads if e.order() <= first.order()]

    def next_due(self, retries: bool = True) -> float | None:
        """The earliest time (this manager's clock) at which a pass with nothing new to act on may act anyway: a
        parked gang's retry, a rate-limited unpark, a starved gang's next probe. None: nothing timed is pending.
        Never later than the truth (an early answer only costs a pass): a replay jumps its clock here.
        `retries` False leaves out what can only repeat the last answer while nothing else changes: a gang parked
        after an unplaced round (capacity freed brings it back anyway) and the probe again of a starved gang
        already probed, or refreshing its reservation (a replay steps at every change, and both come due then)."""
        with self._cond:
            first = self._q.next_unpark() if retries else self._q.next_held_unpark()
            due = [first] if first is not None else []
            promote = self._q.next_promotion()  # (a promotion changes the order: never left out)
            if promote is not None:
                due.append(promote)
            if self._unpark:
                due.append(self._last_unpark + UNPARK_EVERY_S)
            if self._q.starved and self._capacity is not None:
                for e in self._starved_heads_locked():
                    since = e.starved_since
                    if since is None or not retries and (e.probed_at >= since or e.block == "reservation"
                                                         or e.pending_victims(self._pre.preempting)):
                        continue  # (the last two wait for hosts to free: a change; a head is starved: never None)
                    every = RESERVATION_REFRESH_S if e.reservation is not None else PROBE_EVERY_S
                    due.append(max(self._next_probe_round, since + self._settle_s, e.probed_at + every))
            return min(due) if due else None

    @property
    def idle(self) -> bool:
        """No gang in the queue (waiting, being placed, placed, or handed to the job manager and not launched
        yet): the cluster's resources are not wanted now. Told to the placement engines with each dequeue, and by
        them to the host manager (a Mesos backend declines its offers and SUPPRESSes them while idle)."""
        with self._cond:
            return len(self._q) == 0

    def reserving(self) -> list[GangKey]:
        """The waiting gangs the placement engine keeps hosts for (it forgets any other reservation)."""
        with self._cond:
            return self._q.live_reservations(self._q.first_unplaced() if self._fifo else None)

    def take_probes(self) -> list[Probe]:
        """The probes for the placement engine (taken with a dequeue)."""
        with self._cond:
            out, self._probes = self._probes, []
            return out

    def _entitlements_locked(self) -> None:
        """Recompute the entitlements if an input changed (a few pools: microseconds to a millisecond), and publish
        them with the pools' allocation, demand and queue as metrics."""
        if not self._ent_dirty:
            return
        self._ent_dirty = False
        tree = self._tree_locked()
        if self._capacity is None or tree is None:
            self._ent = {}
            return
        self._ent = entitlements(tree.policies, self._capacity, self._q.demand, self._held.own, tree)
        demand = subtree_sums(self._q.demand, self._pools)
        queued = self._q.queued()
        allocated = self._held.allocated
        for path in self._pools:  # every pool, so a figure that fell to 0 says 0
            ent, alloc, want = self._ent.get(path), allocated.get(path, _ZERO), demand.get(path, _ZERO)
            g = self._pool_gauges_locked(path)
            for dim, entitled, held, wanted in g.dims:
                unit = BASE_UNITS[dim]
                entitled.set(getattr(ent, dim) * unit if ent is not None else 0.0)
                held.set(getattr(alloc, dim) * unit)
                wanted.set(getattr(want, dim) * unit)
            g.queued.set(queued.get(path, 0))

    def _kept_series_locked(self) -> None:
        """Forget the series kept when any pool's were removed from the registry since (by any manager): a kept
        one may be gone from it, so it is looked up again."""
        if self._gauges_of != _FORGOTTEN[0]:
            self._gauges, self._preempted, self._gauges_of = {}, {}, _FORGOTTEN[0]

    def _pool_gauges_locked(self, path: str) -> _PoolGauges:
        """The pool's gauges, looked up once (a labels() lookup costs a few microseconds: 13 a pool, at every
        recomputation)."""
        self._kept_series_locked()
        g = self._gauges.get(path)
        if g is None:
            g = self._gauges[path] = _PoolGauges(path)
        return g

    def _count_preemption_locked(self, pool: str, kind: str) -> None:
        """A gang of `pool` chosen for preemption: its series looked up once, made at the pool's first preemption
        of `kind` (a pool that never had one shows none)."""
        self._kept_series_locked()
        c = self._preempted.get((pool, kind))
        if c is None:
            c = self._preempted[(pool, kind)] = PREEMPTIONS.labels(pool, kind)
        c.inc()

    def _tree_locked(self) -> PoolTree | None:
        """The pools' tree (None without a root pool), made once for each set of pools."""
        if self._tree is None and "/" in self._pools:
            self._tree = pool_tree(policies(self._pools.values()))
        return self._tree

    # --- views ----------------------------------------------------------------------------------------------
    def usage(self) -> tuple[dict[str, Resources], dict[str, int]]:
        """(what each pool's gangs hold, with its descendants'; gangs of each pool waiting to be placed)"""
        with self._cond:
            return dict(self._held.allocated), self._q.queued()

    def entitlement_if(self, path: str, extra: Resources) -> Entitlement | None:
        """`path`'s entitlement if it also asked for `extra` (what a new job would ask): a what-if, nothing changes.
        None while the cluster's capacity is not known, or for a pool this manager does not have."""
        with self._cond:
            tree = self._tree_locked()
            if self._capacity is None or tree is None or path not in self._pools:
                return None
            demand = dict(self._q.demand)
            demand[path] = demand.get(path, Resources()) + extra
            capacity = self._capacity
            allocation = dict(self._held.own)
        return entitlements(tree.policies, capacity, demand, allocation, tree).get(path)  # pure: outside the lock

    def admission_if(self, pool: str, gangs: Sequence[GangAsk]) -> list[AdmissionPreview]:
        """Would these gangs of a job not yet created be admitted in `pool` now, and how many of its waiting gangs
        are ahead of each (a dry run; admission.admission_if decides): a what-if, nothing changes."""
        with self._cond:  # copies of the books (a few dicts of pools, the pool's queue), decided outside the lock
            pools = dict(self._pools)
            capacity = self._capacity
            demand, own = dict(self._q.demand), dict(self._held.own)
            allocated, pinned = dict(self._held.allocated), dict(self._held.pinned)
            waiting = self._q.waiting_priorities(pool)
            firsts = [e for e in (self._q.head(p) for p in self._q.waiting_pools() if p != pool) if e is not None]
            heads = [(e.req.respool, e.req.total, e.req.priority) for e in sorted(firsts, key=lambda e: e.order())]
        return admission_if(pool, gangs, pools, capacity, demand, own, allocated, pinned, waiting, heads)

    def pool_usage(self) -> dict[str, PoolUsage]:
        """Every pool's allocation, demand (with its subtree's), entitlement and queue, for GetPool/ListPools."""
        with self._cond:
            self._entitlements_locked()
            queued = self._q.queued()
            demand = subtree_sums(self._q.demand, self._pools)
            out = {}
            for path in self._pools:
                out[path] = PoolUsage(self._held.allocated.get(path, Resources()), demand.get(path, Resources()),
                                      self._ent.get(path) if self._capacity is not None else None,
                                      queued.get(path, 0))
            return out

    def queue(self, pool: str = "", limit: int = 1000) -> tuple[list[QueuedGang], int]:
        """The gangs waiting or being placed, in queue order (priority, then submission time), of `pool` and its
        subtree ("": every pool), with each one's position in its own pool's queue; and how many there are."""
        with self._cond:
            return self._q.listing(pool, limit)

    def waiting(self) -> Waiting:
        """What the hosts map needs of the queue (domain/gpumap.py): the distinct member asks of the gangs waiting
        or being placed that ask for GPUs, and the hosts kept for a waiting gang (its reservation)."""
        asks: list[GpuAsk] = []
        reserved: dict[str, str] = {}
        with self._cond:  # memory only: a pass over the queue's entries (each gang's asks made once, below)
            known, self._gpu_asks = self._gpu_asks, {}
            for e in self._q.entries.values():
                if e.state not in (State.WAITING, State.PLACING):
                    continue
                g = e.req
                mine = known.get(g.gang_id)
                if mine is None or mine[0] is not g:
                    mine = (g, distinct_asks(GpuAsk(m.resources, g.constraints) for m in g.members
                                             if m.resources.gpu > 0))
                self._gpu_asks[g.gang_id] = mine
                asks += mine[1]
                if e.reservation is not None:
                    for h in e.reservation.hosts:
                        reserved.setdefault(h, g.gang_id)
        return Waiting(distinct_asks(asks), reserved)

    def capacity(self) -> Resources | None:
        """The cluster's capacity as last reported by the placement engine (None: not yet)."""
        with self._cond:
            return self._capacity


class _PoolGauges:
    """One pool's metric series (POOL_ENTITLEMENT, _ALLOCATION, _DEMAND per dimension; POOL_QUEUED)."""

    __slots__ = ("dims", "queued")

    def __init__(self, pool: str) -> None:
        self.dims = tuple((dim, POOL_ENTITLEMENT.labels(pool, dim), POOL_ALLOCATION.labels(pool, dim),
                           POOL_DEMAND.labels(pool, dim)) for dim in DIMS)
        self.queued = POOL_QUEUED.labels(pool)


_FORGOTTEN = [0]  # how many times pools' series were removed: a kept series may be gone from the registry


def _forget_metrics(pool: str) -> None:
    _FORGOTTEN[0] += 1
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
    for kind in KINDS:
        try:
            PREEMPTIONS.remove(pool, kind)
        except KeyError:
            pass
