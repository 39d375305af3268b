"""Placement engine shell. One round: take admitted gangs from resmgr (long poll), bring its own copy of the
cluster's free resources up to date with the hosts that changed since the last round (SyncHosts), decide with the
pure placer, claim what it decided in the host manager (which re-checks each gang whole against the truth and
picks the concrete GPUs and ports), and hand claimed placements and failures back to resmgr. Many gangs a round;
the copy of the cluster persists between rounds, so a round costs what changed, not the size of the cluster.

Single-threaded: the engine's HostIndex belongs to the loop thread.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING

from prometheus_client import Counter, Histogram

from peloton.api.clients import HostManagerClient, Probe, Reserved, ResourceManagerClient, Victim
from peloton.domain.placement import PlacementFailure
from peloton.domain.resources import Resources
from peloton.placement.index import HostIndex
from peloton.placement.reservation import ORDERS, Reservation, place_around, reserve, reserve_after
from peloton.placement.victims import Candidate, choose_victims

if TYPE_CHECKING:
    from peloton.api.clients import Preemption
    from peloton.domain.placement import GangPlacement

log = logging.getLogger(__name__)

ROUNDS = Histogram("peloton_placement_round_seconds", "Duration of one placement round",
                   buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5))
# Per gang attempt, each counted once: `placed` when it is placed; `unplaced` the first round no host fitted it
# (however many rounds it then waits; placed later, it counts in both). TRIES counts every try of every round.
GANGS = Counter("peloton_placement_gangs_total", "Gang attempts placed, and those no host fitted at their first "
                "try (once each)", ["result"])
TRIES = Counter("peloton_placement_tries_total", "Gangs tried in placement rounds, by result (a gang waiting for "
                "hosts is tried again every round)", ["result"])
UNPLACED_MEMORY_S = 3600.0  # an unplaced gang attempt not tried again for this long is forgotten (it went away)
ORPHANED_CLAIMS = Counter("peloton_placement_orphaned_claims_released_total",
                          "Claims of placements dropped before launch (job stopped, resmgr reset), released")
SYNCED_HOSTS = Counter("peloton_placement_synced_hosts_total", "Host states brought up to date from hostmgr")
PROBES = Counter("peloton_placement_preemption_probes_total", "Waiting gangs checked for victims, by result",
                 ["result"])
# the series every round adds to, looked up once (labels() takes the counter's lock and hashes the label)
_TRIED = {r: TRIES.labels(r) for r in ("placed", "unplaced", "stale")}
_PLACED, _UNPLACED = GANGS.labels("placed"), GANGS.labels("unplaced")
_PROBED = {True: PROBES.labels("victims"), False: PROBES.labels("none")}


class PlacementEngine:
    def __init__(
        self,
        resmgr: ResourceManagerClient,
        hostmgr: HostManagerClient,
        batch: int = 500,
        poll_ms: int = 1000,
        clock: Callable[[], float] = time.time,
        order: str = "backfill",
    ) -> None:
        """`order`: "backfill" (head-of-line reservation and backfill) or "fifo" (the first gang of a round that
        does not fit stops the round: reservation.place_around)."""
        if order not in ORDERS:
            raise ValueError(f"order: must be one of {', '.join(ORDERS)}, got {order!r}")
        self._given_order = order  # this process's setting
        self.order = order  # the order it places by: the resource manager's once it says it (run_once)
        self.resmgr = resmgr
        self.hostmgr = hostmgr
        self.batch = batch
        self.poll_ms = poll_ms
        self.index = HostIndex()
        self._stream_id = ""
        self._version = 0
        self._synced_at = -float("inf")  # time.monotonic() of the last sync
        self._capacity: dict[str, Resources] = {}  # every host's total (not its free part)
        self._total: Resources | None = None  # their sum, what the pools' entitlements divide; None: not synced
        self.clock = clock
        self.id = uuid.uuid4().hex  # resmgr takes back what an engine of another id did not place
        # hosts kept for waiting gangs (resmgr lists the live ones with every dequeue)
        self.reservations: dict[tuple[str, int], Reservation] = {}
        # gang attempts counted as unplaced (so that their retries are not), with when they were last tried
        self._unplaced: dict[tuple[str, int], float] = {}
        self._unplaced_pruned = time.monotonic()
        # what the last dequeue said: resmgr holds no gang. Told to the host manager with every sync (a Mesos
        # backend gives its offers back while idle, and asks for them again at the first sync that is not). Not
        # idle until resmgr says so: a gang may be waiting already
        self._idle = False

    def _sync(self) -> None:
        r = self.hostmgr.sync_hosts(self._version, self._stream_id, idle=self._idle)
        offers = r.offers
        if r.full:
            self.index = HostIndex(offers)
            self._capacity = {o.hostname: o.capacity for o in offers}
            total = Resources()
            for c in self._capacity.values():
                total = total + c
            self._total = total
        else:
            total = self._total or Resources()
            for o in offers:  # mostly free resources changing: the capacity seldom does
                self.index.upsert(o)
                old = self._capacity.get(o.hostname)
                if old != o.capacity:
                    total = total + o.capacity - (old or Resources())
                    self._capacity[o.hostname] = o.capacity
            for name in r.removed:
                self.index.remove(name)
                gone = self._capacity.pop(name, None)
                if gone is not None:
                    total = total - gone
            self._total = total
        self._stream_id, self._version = r.stream_id, r.version
        self._synced_at = time.monotonic()
        SYNCED_HOSTS.inc(len(offers))

    def _follow_order(self, told: str) -> None:
        """The resource manager's placement order is the one: it admits by it, and the two must agree (fifo's
        rounds stop where its admission stops). A process given another one (a split deployment) says so once."""
        if not told or told == self.order or told not in ORDERS:
            return
        if told != self._given_order:
            log.warning("placement engine: --placement-order %s given, but the resource manager places by %s: "
                        "following it (give both processes the same --placement-order)", self._given_order, told)
        self.order = told

    def run_once(self) -> bool:
        # the capacity resmgr divides among the pools (cheap: only what changed), unless the last round's sync
        # is younger than a poll (a busy engine: one SyncHosts a round, not two; idle, one a poll as before)
        if self._version == 0 or time.monotonic() - self._synced_at >= self.poll_ms / 1000:
            self._sync()
        resp = self.resmgr.dequeue(self.batch, self.poll_ms / 1000, self._total, self.id)
        self._idle = resp.idle and not resp.gangs and not resp.probes
        if resp.release_claims:
            # before this round claims anything: a gang placed again claims under the same key
            self.hostmgr.release_claims(resp.release_claims)
            ORPHANED_CLAIMS.inc(len(resp.release_claims))
        self._follow_order(resp.placement_order)
        live = set(resp.reserving)
        for key in [k for k in self.reservations if k not in live]:
            del self.reservations[key]
        preemptions, reservations = self._probe(resp.probes) if resp.probes else ([], [])
        if not resp.gangs:
            if preemptions or reservations:
                self.resmgr.set_placements([], [], [], preemptions, reservations, self.id)
            return bool(resp.release_claims) or bool(resp.probes)
        with ROUNDS.time():
            gangs = resp.gangs
            placements: list[GangPlacement] = []
            try:
                self._sync()
                placements, failures = place_around(gangs, self.index, self.reservations, self.clock(),
                                                   self.order)
                claimed: list[GangPlacement] = []
                refused: list[PlacementFailure] = []
                if placements:
                    claimed, refused = self.hostmgr.claim(placements)
                    if refused:
                        # the hosts changed under us: give back what the copy took; the next sync corrects it
                        gone = {(f.gang_id, f.attempt) for f in refused}
                        for p in placements:
                            if (p.gang_id, p.attempt) in gone:
                                self.index.release(p)
            except Exception:
                # nothing was decided: every gang goes back to its queue at once
                self._version = 0  # and the next round starts from a full copy
                # ...but those it placed: the claim call may have made their claims all the same (its answer
                # lost), which would hold the hosts and refuse these very gang attempts as already claimed (tried
                # again at once, round after round) until they expire. Left unanswered, resmgr takes them back at
                # this engine's next dequeue and has their claims released before anyone claims them again.
                tried = {(p.gang_id, p.attempt) for p in placements}
                self.resmgr.set_placements([], [], [PlacementFailure(g.gang_id, g.job_id, g.attempt,
                                                                     "placement round failed")
                                                    for g in gangs if (g.gang_id, g.attempt) not in tried],
                                           [], [], self.id)
                raise
            self.resmgr.set_placements(claimed, failures, refused, preemptions, reservations, self.id)
        self._count(claimed, failures, refused)
        if claimed:
            log.debug("placed %d gangs (%d unplaced, %d stale)", len(claimed), len(failures), len(refused))
        return True

    def _count(self, claimed: Sequence[GangPlacement], failures: Sequence[PlacementFailure],
               refused: Sequence[PlacementFailure]) -> None:
        _TRIED["placed"].inc(len(claimed))
        _TRIED["unplaced"].inc(len(failures))
        _TRIED["stale"].inc(len(refused))
        _PLACED.inc(len(claimed))
        for p in claimed:
            self._unplaced.pop((p.gang_id, p.attempt), None)
        now = time.monotonic()
        for f in failures:
            key = (f.gang_id, f.attempt)
            if key not in self._unplaced:
                _UNPLACED.inc()
            self._unplaced[key] = now
        if now - self._unplaced_pruned > 60:
            self._unplaced = {k: t for k, t in self._unplaced.items() if now - t < UNPLACED_MEMORY_S}
            self._unplaced_pruned = now

    def _draining(self) -> set[str]:
        """The draining hosts (the operators' drains and maintenance windows), for the preemption probes: the sync
        shows them with nothing free, which the what-ifs cannot tell from full. Unknown (the host manager did
        not answer): none, as before (the claim still refuses a placement there)."""
        try:
            return set(self.hostmgr.drains())
        except Exception as e:
            log.warning("placement engine: the host manager's drains are unknown this round: %s", e)
            return set()

    def _probe(self, probes: Sequence[Probe]) -> tuple[list[Preemption], list[Reserved]]:
        """For each waiting gang resmgr sent: the victims whose removal lets the placer place it, if any will do,
        and the hosts it is to get (kept from other gangs until it is placed). On this round's copy of the hosts,
        left as it was."""
        preemptions: list[Preemption] = []
        reservations: list[Reserved] = []
        draining = self._draining()
        for probe in probes:
            gang = probe.gang
            key = (gang.gang_id, gang.attempt)
            victims = choose_victims(gang, _candidates(probe.candidates, draining), probe.need,
                                     self.index) if probe.candidates else None
            _PROBED[bool(victims)].inc()
            if victims:
                preemptions.append((key, [(v.gang_id, v.attempt) for v in victims]))
                r = reserve_after(gang, victims, self.index)
            else:
                ending = [(c, v.ends_at) for c, v in zip(_candidates(probe.ending, draining), probe.ending,
                                                         strict=True)]
                r = reserve(gang, ending, self.index, draining)
            if r is None:
                self.reservations.pop((gang.gang_id, gang.attempt), None)
                continue
            self.reservations[(gang.gang_id, gang.attempt)] = r
            reservations.append((key, sorted(r.hosts), r.start or 0.0))
        return preemptions, reservations


def _candidates(victims: Sequence[Victim], draining: Collection[str] = ()) -> list[Candidate]:
    """The victims as the what-ifs take them. What one holds on a draining host is not freed in them: no new gang
    goes there, so stopping it there makes no room (and keeping such a host for the waiting gang would wait for
    nothing). Its total still counts: it is what the victim gives back to its pool's entitlement."""
    out = []
    for v in victims:
        total = Resources()
        for _, r in v.usage:
            total = total + r
        usage = tuple(u for u in v.usage if u[0] not in draining)
        out.append(Candidate(v.gang_id, v.attempt, usage, total))
    return out
