"""Host manager shell: one backend, the claims placed gangs hold until they launch, the versioned view of every
host's free resources that placement syncs from, and the ordered log of task status events that jobmgr
long-polls. Thread-safe.

Locks: `_lock` guards the claims, host versions, drains and kill tombstones (memory only); `_events` has its own
condition. The backend is called with `_lock` held only for its in-memory reads (`offers`, `maintenance`), never
for I/O: launch, kill and reconcile run outside it, and so does the store write of a drain (`_drain_cond`, on
`_lock`, lets one drain change be written at a time; `_launch_ended`, on `_lock`, lets a drain wait for the launches
under way on its host). Lock order: `_lock` before the backend's own lock; backends never call back
while holding theirs.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace

from prometheus_client import Counter, Histogram

from peloton.domain.launch import GangLaunch, HostInfo, LaunchOutcome, LaunchResult, TaskStatus
from peloton.domain.placement import GangPlacement, HostOffer, PlacementFailure
from peloton.domain.resources import Resources
from peloton.domain.states import TaskState
from peloton.errors import NotFound, Unavailable
from peloton.hostmgr.backend import Backend
from peloton.hostmgr.claims import ClaimBook, ClaimKey

log = logging.getLogger(__name__)

TASK_STATUSES = Counter("peloton_hostmgr_task_status_total", "Task status updates from the backend", ["state"])
_STATUS_COUNTERS: dict[TaskState, Counter] = {}  # TASK_STATUSES' series by state, looked up once
LAUNCHES = Counter("peloton_hostmgr_gang_launches_total", "Gang launches", ["result"])
LAUNCH_FAILURES = Counter("peloton_hostmgr_launch_failures_total", "Gang launches refused or failed, by reason: "
                          "killed_before_launch, stale_claim, claim_mismatch, host_closed (a host drained or "
                          "unhealthy since the claim) (refused); task_error (the task's own "
                          "fault: the gang fails), host_error (the host's: it counts toward the host's health)",
                          ["reason"])
CLAIMS = Counter("peloton_hostmgr_claims_total", "Placements claimed or refused at claim time", ["result"])
LAUNCH_SECONDS = Histogram("peloton_hostmgr_launch_seconds", "Time the backend takes to start a batch of gangs")
# The series each launch and claim adds to, looked up once (labels() takes the metric's lock and hashes the labels:
# once a gang adds up on the gang path). Every label value is one of a fixed few, so none ever needs dropping.
_CLAIMED, _REFUSED = CLAIMS.labels("claimed"), CLAIMS.labels("refused")
_LAUNCHES = {o: LAUNCHES.labels(o.value.lower()) for o in LaunchOutcome}
_FAILURE_REASONS = ("killed_before_launch", "stale_claim", "claim_mismatch", "host_closed", "task_error",
                    "host_error")
_CLOSED = (" is draining", " is draining for maintenance", " is unhealthy")  # why `_closed_locked` closes a host
_LAUNCH_FAILURES = {reason: LAUNCH_FAILURES.labels(reason) for reason in _FAILURE_REASONS}

GONE_REMEMBERED = 1024  # removed hosts whose removal a sync still reports; an older sync gets every host
EVENT_LOG_LIMIT = 500_000  # unacknowledged status events kept; beyond it the oldest go and jobmgr reconciles
TOMBSTONE_S = 600.0  # a task id killed before its launch is refused for this long
DEFAULT_CLAIM_TTL_S = 60.0
DRAIN_LAUNCH_WAIT_S = 60.0  # how long a drain waits, at most, for the launches under way on its host


@dataclass(frozen=True, slots=True)
class HostSync:
    """What changed since a version: the free resources (counts) of every host that changed."""

    stream_id: str
    version: int
    full: bool  # `offers` is every host (the caller replaces its view)
    offers: list[HostOffer]
    removed: list[str]


UNHEALTHY_AFTER = 3  # launches failing on a host in a row (not the tasks' fault) before it is skipped
UNHEALTHY_S = 60.0  # the first back-off; it doubles while the failures go on
MAX_UNHEALTHY_S = 900.0


@dataclass(slots=True)
class HostHealth:
    failures: int = 0  # in a row, since the last start that worked or the last back-off
    last: str = ""
    until: float = 0.0  # skipped until then
    backoff: float = 0.0
    reported_back: bool = True  # placement told that its back-off ended


class HostManager:
    def __init__(self, backend: Backend, clock: Callable[[], float] = time.time,
                 claim_ttl_s: float = DEFAULT_CLAIM_TTL_S,
                 save_drains: Callable[[dict[str, float]], None] | None = None,
                 may_act: Callable[[], bool] = lambda: True) -> None:
        """`save_drains`: makes the draining hosts durable (the store); called before a drain takes effect.
        `may_act()`: whether this daemon may still launch and kill (its lease on the store is fresh: a leader that
        was paused or cut off, and may have been replaced, does neither until it knows)."""
        self.backend = backend
        self._may_act = may_act
        self.clock = clock
        self.claim_ttl_s = claim_ttl_s
        self._save_drains = save_drains
        self._drains: dict[str, float] = {}  # draining host -> its deadline (0: none)
        self._health: dict[str, HostHealth] = {}  # hosts whose launches failed lately
        self.stream_id = uuid.uuid4().hex
        self._lock = threading.Lock()
        self._drain_cond = threading.Condition(self._lock)  # a drain change waits for the one being written
        self._drain_saving = False
        self._launch_ended = threading.Condition(self._lock)  # a launch under way ended (a drain may wait for it)
        self._claims = ClaimBook()
        self._version = 1  # a sync answers at least 1, so "since 0" always means "everything"
        self._versions: dict[str, int] = {}  # host -> version of its last change, in version order
        # hosts a sync reported removed (gone from the backend), oldest first: past GONE_REMEMBERED the oldest leave
        # _versions too, and a sync from before the newest of those (`_forgot_up_to`) gets every host again
        self._gone: OrderedDict[str, None] = OrderedDict()
        self._forgot_up_to = 0
        self._capacity_version = 1
        self._tombstones: OrderedDict[str, float] = OrderedDict()  # killed task id -> when
        self._cond = threading.Condition()
        self._closed = False  # the daemon is stopping: event long polls answer at once
        self._events: list[TaskStatus] = []  # seq = _first_seq + index
        self._first_seq = 1
        self._acked_seq = 0

    def start(self) -> None:
        self.backend.start(self._on_status, self._on_hosts_changed, self._on_statuses)

    def close(self) -> None:
        """The daemon is stopping: `wait_events` returns now, and later calls at once (the backend runs on)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def stop(self) -> None:
        self.backend.stop()

    # --- versions -----------------------------------------------------------------------------------------
    def _touch_locked(self, hosts: Collection[str]) -> None:
        for h in hosts:
            self._version += 1
            self._versions.pop(h, None)
            self._versions[h] = self._version
            if self._gone:
                self._gone.pop(h, None)  # (back, or its removal to be reported again: the next sync tells)

    def _forget_removed_locked(self, removed: Collection[str]) -> None:
        """Hosts a sync found gone from the backend: their version entry and launch health are forgotten once
        GONE_REMEMBERED later removals are reported (a node pool that comes and goes would otherwise keep every
        hostname it ever had; one that is back sooner keeps its back-off, as a flapping agent should)."""
        for h in removed:
            self._gone.pop(h, None)
            self._gone[h] = None
        while len(self._gone) > GONE_REMEMBERED:
            h, _ = self._gone.popitem(last=False)
            self._health.pop(h, None)
            v = self._versions.pop(h, None)
            if v is not None:
                self._forgot_up_to = max(self._forgot_up_to, v)

    @property
    def version(self) -> int:
        """Moves whenever a host's free resources, claims, drain or health change (after the change)."""
        with self._lock:
            return self._version

    def _on_hosts_changed(self, hosts: Collection[str]) -> None:
        with self._lock:
            self._touch_locked(hosts)
            self._capacity_version += 1

    # --- status events ------------------------------------------------------------------------------------
    def _on_status(self, status: TaskStatus) -> None:
        self._on_statuses((status,))

    def _on_statuses(self, statuses: Sequence[TaskStatus]) -> None:
        """Statuses from the backend, in order: appended to the event log with one wake of its long polls for
        the lot (a gang's RUNNING came as a wake per member: a poll woken for each, answering one each)."""
        ended: set[str] = set()
        counts: dict[TaskState, int] = {}
        for status in statuses:
            counts[status.state] = counts.get(status.state, 0) + 1
            if status.state.terminal and status.hostname:
                ended.add(status.hostname)
        for state, n in counts.items():  # (each inc and labels() takes a lock: once a state, not once a status)
            counter = _STATUS_COUNTERS.get(state)
            if counter is None:
                counter = _STATUS_COUNTERS[state] = TASK_STATUSES.labels(state.value)
            counter.inc(n)
        if ended:
            with self._lock:
                self._touch_locked(ended)
        with self._cond:
            self._events += statuses
            if len(self._events) > EVENT_LOG_LIMIT:
                drop = len(self._events) - EVENT_LOG_LIMIT
                del self._events[:drop]
                self._first_seq += drop
                log.error("status event log over %d events: the oldest %d were dropped (jobmgr reconciles)",
                          EVENT_LOG_LIMIT, drop)
            self._cond.notify_all()

    @property
    def last_seq(self) -> int:
        return self._first_seq + len(self._events) - 1

    def wait_events(self, after_seq: int, max_events: int, timeout_s: float) -> tuple[list[tuple[int, TaskStatus]], bool]:
        """Events after `after_seq` (long poll), and whether some were lost: dropped unacknowledged (the log
        overflowed) after `after_seq`. Events acknowledged already are not lost (whoever acknowledged them had
        persisted them): a new job manager starts from 0 and gets what is left."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self.last_seq < max(after_seq + 1, self._first_seq):
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    return [], False
                self._cond.wait(left)
            gap = self._first_seq - 1 > max(after_seq, self._acked_seq)
            start = max(after_seq + 1, self._first_seq)
            i = start - self._first_seq
            chunk = self._events[i:i + max_events]
            return [(start + k, st) for k, st in enumerate(chunk)], gap

    def ack_events(self, up_to_seq: int) -> int:
        """Every update up to `up_to_seq` is persisted: acknowledge them upstream and forget them."""
        with self._cond:
            if up_to_seq <= self._acked_seq:
                return 0
            n = min(up_to_seq, self.last_seq) - self._first_seq + 1
            done = self._events[:max(0, n)]
            del self._events[:max(0, n)]
            self._first_seq += max(0, n)
            self._acked_seq = up_to_seq
        acks = [st.ack for st in done if st.ack]
        if acks:
            self.backend.acknowledge(acks)
        return len(acks)

    # --- placement side -----------------------------------------------------------------------------------
    def sync(self, since: int, stream_id: str, idle: bool = False) -> HostSync:
        """Free resources (counts) of the hosts that changed after version `since` of stream `stream_id`; every
        host when the stream is another one (this host manager restarted) or `since` is 0. `idle`: the caller
        has no work waiting for hosts (the resource manager holds no gang); else the backend hears of demand."""
        with self._lock:
            if not idle:
                self.backend.demand()
            self._touch_locked(self._claims.expire(self.clock()))
            closed = self._closed_locked(self.clock())  # (first: it may touch hosts)
            # (a consumer from before a forgotten removal would never hear of it: everything, as after a restart)
            full = since <= 0 or stream_id != self.stream_id or since < self._forgot_up_to
            names: list[str] | None = None
            if not full:
                names = []
                for h, v in reversed(self._versions.items()):
                    if v <= since:
                        break
                    names.append(h)
            version = self._version
            offers = self.backend.offers(names)
            out = [self._claims.free(o) for o in offers]
            if closed:  # a draining or unhealthy host takes no new gangs: nothing of it is free for placement
                out = [replace(o, free=Resources(), gpu_ids=(), ports=()) if o.hostname in closed else o
                       for o in out]
            offered = {o.hostname for o in offers}
            removed = sorted(set(names) - offered) if names else []
            gone = [h for h in self._versions if h not in offered] if full else removed
            if gone:
                self._forget_removed_locked(gone)
        return HostSync(self.stream_id, version, full, out, removed)

    def claim(self, placements: Sequence[GangPlacement]) -> tuple[list[GangPlacement], list[PlacementFailure]]:
        """Hold each placement whole (choosing its GPU ids and ports) or refuse it."""
        claimed: list[GangPlacement] = []
        refused: list[PlacementFailure] = []
        hosts = {m.hostname for p in placements for m in p.members}
        with self._lock:
            now = self.clock()
            self._touch_locked(self._claims.expire(now))
            offers = {o.hostname: o for o in self.backend.offers(hosts, with_ids=True)}
            closed = self._closed_locked(now)
            for p in placements:
                shut = sorted({m.hostname for m in p.members} & closed.keys())
                if shut:  # placed on a copy older than the drain, or than the host's failures
                    refused.append(PlacementFailure(p.gang_id, p.job_id, p.attempt,
                                                    f"host {shut[0]} is {closed[shut[0]]}"))
                    continue
                r = self._claims.claim(p, offers, now, self.claim_ttl_s)
                if isinstance(r, str):
                    refused.append(PlacementFailure(p.gang_id, p.job_id, p.attempt, r))
                else:
                    claimed.append(r)
                    self._touch_locked({m.hostname for m in r.members})
        _CLAIMED.inc(len(claimed))
        _REFUSED.inc(len(refused))
        return claimed, refused

    def release_claims(self, keys: Sequence[ClaimKey]) -> None:
        """Drop claims nobody will launch. One whose launch is in progress stays: it is dropped once the backend
        accounts for its members (a late release must not free what a launch is about to use)."""
        with self._lock:
            for key in keys:
                c = self._claims.get(key)
                if c is not None and not c.launching:
                    self._touch_locked(self._claims.release(key))

    def held_hosts(self) -> set[str]:
        with self._lock:
            self._touch_locked(self._claims.expire(self.clock()))
            return self._claims.held_hosts()

    # --- launch and kill ----------------------------------------------------------------------------------
    def launch(self, gangs: Sequence[GangLaunch]) -> list[LaunchResult]:
        """Start each gang whole, or refuse it (stale claim, a member killed before its launch, a host drained or
        found unhealthy since the claim), or report it failed. The claim is dropped only after the backend accounts
        for the members."""
        self._check_may_act("launch")
        results: dict[ClaimKey, LaunchResult] = {}
        go: list[GangLaunch] = []
        with self._lock:
            now = self.clock()
            self._expire_tombstones_locked(now)
            # a host closed since the gang was claimed there (a drain accepted meanwhile) takes no new gang either:
            # refused, the gang is queued again whole, as the same attempt, and placed elsewhere
            closed = self._closed_locked(now)
            for g in gangs:
                key = (g.gang_id, g.attempt)
                killed = [t.task_id for t in g.tasks if t.task_id in self._tombstones]
                why = f"{killed[0]} was killed before its launch" if killed else None
                shut = sorted({t.hostname for t in g.tasks} & closed.keys()) if closed and why is None else ()
                if shut:
                    why = f"host {shut[0]} is {closed[shut[0]]}"
                if why is None:
                    why = self._claims.begin_launch(key, g.tasks, now)
                else:
                    c = self._claims.get(key)
                    if c is None or not c.launching:  # (a launch of it under way keeps its claim until it ends)
                        self._touch_locked(self._claims.release(key))
                if why is not None:
                    results[key] = LaunchResult(g.gang_id, g.attempt, LaunchOutcome.REFUSED, message=why)
                else:
                    go.append(g)
        started: list[LaunchResult] = []
        if go:
            with LAUNCH_SECONDS.time():
                try:
                    started = self.backend.launch(go)
                finally:
                    with self._lock:
                        for g in go:
                            self._touch_locked(self._claims.release((g.gang_id, g.attempt)))
                        self._launch_ended.notify_all()
        late: list[str] = []
        with self._lock:
            now = self.clock()
            for r, g in zip(started, go, strict=True):
                results[(g.gang_id, g.attempt)] = r
                if r.outcome == LaunchOutcome.OK:
                    late += [t.task_id for t in g.tasks if t.task_id in self._tombstones]
                self._judge_hosts_locked(g, r, now)
        if late:  # killed while the backend was starting them: they must not run on
            self.backend.kill(late)
        out = [results[(g.gang_id, g.attempt)] for g in gangs]
        for r in out:
            _LAUNCHES[r.outcome].inc()
            if r.outcome != LaunchOutcome.OK:
                _LAUNCH_FAILURES[_failure_reason(r)].inc()
        return out

    def _judge_hosts_locked(self, g: GangLaunch, r: LaunchResult, now: float) -> None:
        """A host whose launches keep failing (a member that would not start, not the task's own fault) is
        skipped for a back-off that doubles while it goes on; a launch that starts resets it."""
        if r.outcome == LaunchOutcome.OK:
            for host in {t.hostname for t in g.tasks}:
                if self._health.pop(host, None) is not None:
                    self._touch_locked({host})
            return
        if r.outcome != LaunchOutcome.FAILED or r.permanent:
            return
        host = next((t.hostname for t in g.tasks if t.task_id == r.task_id), "")
        if not host:
            return
        h = self._health.setdefault(host, HostHealth())
        h.failures += 1
        h.last = r.message or "launch failed"
        if h.failures >= UNHEALTHY_AFTER and now >= h.until:
            h.backoff = min(MAX_UNHEALTHY_S, h.backoff * 2) if h.backoff else UNHEALTHY_S
            h.until = now + h.backoff
            h.failures = 0
            h.reported_back = False
            self._touch_locked({host})
            log.warning("host %s: %d launches failed in a row (last: %s); skipped for %.0fs", host,
                        UNHEALTHY_AFTER, h.last, h.backoff)

    def _closed_locked(self, now: float) -> dict[str, str]:
        """The hosts no new gang goes to now, and why (draining, unhealthy). A host whose back-off just ended is
        reported to placement again."""
        out = dict.fromkeys(self._drains, "draining")
        for host in self.backend.maintenance():
            out.setdefault(host, "draining for maintenance")
        for host, h in self._health.items():
            if h.until > now:
                out.setdefault(host, "unhealthy")
            elif h.until and not h.reported_back:
                h.reported_back = True
                self._touch_locked({host})
        return out

    def health(self) -> dict[str, str]:
        """Why each unhealthy host is skipped, and for how long still."""
        now = self.clock()
        with self._lock:
            return {host: f"unhealthy for {h.until - now:.0f}s more: launches kept failing (last: {h.last})"
                    for host, h in self._health.items() if h.until > now}

    def kill(self, task_ids: Sequence[str], grace_s: float | None = None) -> None:
        if not task_ids:
            return
        self._check_may_act("kill")
        with self._lock:
            now = self.clock()
            for tid in task_ids:
                self._tombstones[tid] = now
                self._tombstones.move_to_end(tid)
        self.backend.kill(task_ids, grace_s)

    def _check_may_act(self, what: str) -> None:
        if not self._may_act():
            raise Unavailable(f"this daemon does not {what} now: its lease on the store is not fresh (paused, or the "
                              "store is slow or gone), and another daemon may have taken over; retry later")

    def _expire_tombstones_locked(self, now: float) -> None:
        while self._tombstones:
            tid, t = next(iter(self._tombstones.items()))
            if now - t < TOMBSTONE_S and len(self._tombstones) <= 1_000_000:
                break
            self._tombstones.popitem(last=False)

    def reconcile(self, task_ids: Sequence[str]) -> dict[str, TaskStatus]:
        return self.backend.reconcile(task_ids)

    def running_task_ids(self) -> list[str]:
        return sorted(t.task_id for t in self.backend.running())

    # --- views --------------------------------------------------------------------------------------------
    def capacity(self, if_version: int = 0) -> tuple[int, list[HostOffer] | None]:
        """Every host at full capacity (for "can this gang ever fit?"), or None when unchanged since
        `if_version`."""
        with self._lock:
            version = self._capacity_version
        if if_version == version:
            return version, None
        return version, [
            HostOffer(hostname=h.hostname, address=h.address, free=h.capacity, labels=dict(h.labels),
                      capacity=h.capacity, has_gpus=h.capacity.gpu > 0)
            for h in self.backend.hosts()
        ]

    # --- drains -----------------------------------------------------------------------------------------------
    def load_drains(self, drains: dict[str, float]) -> None:
        """The draining hosts as the store has them (at start, and when the daemon leads again: another daemon
        may have drained or undrained hosts meanwhile, so the hosts of both maps changed)."""
        with self._lock:
            while self._drain_saving:  # a drain being written would put its own map back over this one
                self._drain_cond.wait()
            changed = set(self._drains) | set(drains)
            self._drains = dict(drains)
            self._touch_locked(changed)

    def drains(self) -> dict[str, float]:
        """Every draining host and its deadline (0: none): the operators' drains, and the hosts in a maintenance
        window the cluster manager announced (deadline: the window's start; the earlier one when both)."""
        windows = self.backend.maintenance()
        with self._lock:
            out = dict(self._drains)
        for host, start in windows.items():
            own = out.get(host)
            out[host] = start if not own else min(own, start)
        return out

    def maintenance(self) -> set[str]:
        """The hosts in a maintenance window (Mesos): drained by the cluster manager, not by `host drain`."""
        return set(self.backend.maintenance())

    def drain(self, hostname: str, deadline: float) -> None:
        """No new gangs on the host (from the next placement round on); `deadline` (clock time, 0: none) is when
        the job manager preempts the gangs still running there. NotFound for a host the backend does not know."""
        self._known(hostname)
        self._set_drain(hostname, deadline)

    def undrain(self, hostname: str) -> None:
        """Back in service (a host that is not draining: nothing to do)."""
        self._set_drain(hostname, None)

    def _set_drain(self, hostname: str, deadline: float | None) -> None:
        with self._lock:
            # one drain change at a time: each writes the whole map, so two at once could lose one (waiting here
            # releases `_lock`: claims and launches go on while a drain is written)
            while self._drain_saving:
                self._drain_cond.wait()
            drains = dict(self._drains)
            if deadline is None:
                if drains.pop(hostname, None) is None:
                    return
            else:
                drains[hostname] = deadline
            self._drain_saving = True
        try:
            if self._save_drains is not None:
                self._save_drains(drains)  # durable before it takes effect (a crash keeps the host drained)
        except BaseException:
            with self._lock:
                self._drain_saving = False
                self._drain_cond.notify()
            raise
        with self._lock:
            self._drains = drains
            self._touch_locked({hostname})
            self._drain_saving = False
            self._drain_cond.notify()
            if deadline is None:
                return
            # From here every launch on the host is refused; one that began before goes on (its members may be
            # starting now). The drain returns once it is done, so that nothing starts there after it returned:
            # what did start is a running gang, which the drain's deadline applies to.
            until = time.monotonic() + DRAIN_LAUNCH_WAIT_S
            while self._claims.launching_on(hostname):
                left = until - time.monotonic()
                if left <= 0:
                    log.warning("host drain: %s: a launch there still under way after %.0fs; not waiting for it",
                                hostname, DRAIN_LAUNCH_WAIT_S)
                    break
                self._launch_ended.wait(left)

    def _known(self, hostname: str) -> None:
        names = [h.hostname for h in self.backend.hosts()]
        if hostname not in names:
            shown = ", ".join(sorted(names)[:5]) + (", ..." if len(names) > 5 else "")
            raise NotFound(f"hostname: no host {hostname} (hosts: {shown or 'none'})", field="hostname")

    def remove_sandboxes(self, job_ids: Sequence[str]) -> int:
        return self.backend.remove_sandboxes(job_ids)

    def census(self) -> list[tuple[HostInfo, str]]:
        """Each host and its state for the metrics: its backend state when not UP (lowercase), else drained or
        draining, unhealthy, up."""
        now = self.clock()
        drains = set(self.drains())
        with self._lock:
            unhealthy = {host for host, h in self._health.items() if h.until > now}
        special = drains | unhealthy

        def state(h: HostInfo) -> str:
            if h.state != "UP":
                return h.state.lower()
            if h.hostname in drains:
                return "drained" if not h.task_ids else "draining"
            return "unhealthy" if h.hostname in unhealthy else "up"

        # one comprehension, the usual host decided inline: this runs over every host at every scrape
        return [(h, "up" if h.state == "UP" and h.hostname not in special else state(h)) for h in self.backend.hosts()]

    def hosts(self) -> list[tuple[HostInfo, bool]]:
        held = self.held_hosts()
        return [(h, h.holds_offer or h.hostname in held) for h in self.backend.hosts()]

    def read_log(self, task_id: str, stream: str, offset: int, max_bytes: int) -> tuple[bytes, int]:
        return self.backend.read_log(task_id, stream, offset, max_bytes)


def _failure_reason(r: LaunchResult) -> str:
    """A bounded label for a launch that did not start (the message itself is free text)."""
    if r.outcome == LaunchOutcome.FAILED:
        return "task_error" if r.permanent else "host_error"
    message = r.message or ""
    if "killed before its launch" in message:
        return "killed_before_launch"
    if message.startswith("host ") and message.endswith(_CLOSED):
        return "host_closed"
    if "expired or is unknown" in message or "already being launched" in message:
        return "stale_claim"
    return "claim_mismatch"
