"""The sim backend: thousands of hosts that exist only in memory, for scale tests and benchmarks.

It runs no processes. A launched member is accounted for on its host exactly like a real one (HostUsage), reported
RUNNING through `on_status`, and ends when the duration its environment asks for has passed (durations.py:
PELOTON_SIM_DURATION, PELOTON_SIM_EXIT_CODE, PELOTON_SIM_START), when it is killed, or when its host is failed
(`fail_host`). Everything above the backend (host manager, placement, resmgr, jobmgr, the store) is what runs in
production.

Deterministic: hosts (names, addresses, racks) depend only on the arguments of make_sim_hosts, and each task's
duration only on (seed, task id, env). Times come from the injected clock; statuses carry the simulated time of
the event (a task's end is reported at start + duration, however late the timer thread wakes).

Concurrency: `_lock` guards everything (hosts' usage, tasks, the timer heaps); `_cond` is a condition on it that
the timer thread waits on. Status and host callbacks are made with no lock held. A launch registers every member
of every gang of the batch first (so their resources are never free in between), then starts the gangs one by
one: a member killed (or whose host failed) before its gang starts is never started. One timer thread sleeps until
the next task end or host recovery (`run_due`, which tests call directly with `timer_thread=False`).
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace

from peloton.domain.hostgroups import HostGroup
from peloton.domain.launch import GangLaunch, HostInfo, LaunchOutcome, LaunchResult, RunningTask, TaskStatus
from peloton.domain.placement import HostOffer
from peloton.domain.resources import Resources
from peloton.domain.states import TaskState
from peloton.errors import InvalidArgument, NotFound, PelotonError
from peloton.hostmgr.backend import HostsCallback, StatusCallback, StatusesCallback
from peloton.hostmgr.sim.durations import behaviour, format_duration, unit_draw
from peloton.hostmgr.usage import HostConfig, HostUsage, accounted, check_gang, offers_of
from peloton.loop import LOOP_ERRORS

log = logging.getLogger(__name__)

SIM_PORT_BASE = 31000
MAX_SIM_HOSTS = 1_000_000
MAX_PORTS_PER_HOST = 65535 - SIM_PORT_BASE + 1
SIM_GPU_MODEL = "sim-gpu"
_FINISHED_CACHE = 10_000  # ended tasks remembered for reconcile and read_log
_INTERNED_MAX = 10_000
_STREAMS = ("stdout", "stderr")

# phases of a task
_REGISTERED = 0  # accounted for on its host; its gang has not started yet
_STARTED = 1  # started; RUNNING not reported yet (a terminal status waits for it)
_ANNOUNCED = 2  # RUNNING reported


@dataclass(frozen=True, slots=True)
class SimSettings:
    """The `--sim-*` flags of `peloton server --backend sim`: `hosts` hosts of `resources` with `labels`, or, when
    `groups` is given (`--sim-host-group`), the groups' hosts instead, in their order."""

    hosts: int = 100
    resources: Resources = Resources(cpu=64, mem=256 * 1024, gpu=8)
    racks: int = 10
    seed: int = 0
    ports_per_host: int = 1000
    labels: tuple[tuple[str, str], ...] = ()  # --sim-host-labels
    groups: tuple[HostGroup, ...] = ()  # --sim-host-group, each

    def host_groups(self) -> tuple[HostGroup, ...]:
        return self.groups or (HostGroup(self.hosts, self.resources, self.labels),)

    def total_hosts(self) -> int:
        return sum(g.count for g in self.groups) if self.groups else self.hosts

    def check(self) -> None:
        """InvalidArgument naming the flag at fault."""
        if self.groups:
            total = self.total_hosts()
            if total > MAX_SIM_HOSTS:
                raise InvalidArgument(f"--sim-host-group: {total} hosts in all, more than {MAX_SIM_HOSTS}",
                                      field="--sim-host-group")
        check_sim_counts(self.total_hosts(), self.racks, self.ports_per_host)
        for g in self.host_groups():
            if not g.resources.cpu > 0:
                flag = "--sim-host-group" if self.groups else "--sim-host-resources"
                raise InvalidArgument(f"{flag}: cpu must be greater than 0", field=flag)


def check_sim_counts(n: int, racks: int, ports_per_host: int) -> None:
    if not 1 <= n <= MAX_SIM_HOSTS:
        raise InvalidArgument(f"--sim-hosts: must be 1..{MAX_SIM_HOSTS}, got {n}", field="--sim-hosts")
    if not 1 <= racks <= n:
        raise InvalidArgument(f"--sim-racks: must be 1..{n} (the number of hosts), got {racks}", field="--sim-racks")
    if not 1 <= ports_per_host <= MAX_PORTS_PER_HOST:
        raise InvalidArgument(f"--sim-ports-per-host: must be 1..{MAX_PORTS_PER_HOST}, got {ports_per_host}",
                              field="--sim-ports-per-host")


def sim_address(index: int) -> str:
    """10.x.y.z of host `index` (0-based): index + 1 in the low 24 bits, so no host is 10.0.0.0."""
    n = index + 1
    return f"10.{(n >> 16) & 255}.{(n >> 8) & 255}.{n & 255}"


def make_sim_hosts(n: int, resources: Resources, racks: int = 1, ports_per_host: int = 1000,
                   seed: int = 0, labels: dict[str, str] | None = None) -> list[HostConfig]:
    """Hosts sim-00000 .. sim-{n-1}, each of size `resources` with GPUs 0..gpu-1 and the ports
    31000..31000+ports_per_host-1 (the same range on every host: their addresses differ). Labels: `host`, `rack`
    (`r0`..`r{racks-1}`), on GPU hosts `gpu_model=sim-gpu`, then `labels` (which may set another gpu_model, or the
    rack). Racks get n/racks hosts each (give or take one); which hosts share a rack is a permutation drawn from
    `seed`."""
    group = HostGroup(n, resources, tuple(sorted((labels or {}).items())))
    return make_sim_host_groups((group,), racks, ports_per_host, seed)


def make_sim_host_groups(groups: Sequence[HostGroup], racks: int = 1, ports_per_host: int = 1000,
                         seed: int = 0) -> list[HostConfig]:
    """make_sim_hosts of several groups of alike hosts: the first group's hosts are sim-00000.., the next group's
    follow; racks are drawn over all of them."""
    n = sum(g.count for g in groups)
    check_sim_counts(n, racks, ports_per_host)
    width = max(5, len(str(n - 1)))
    order = sorted(range(n), key=lambda i: (unit_draw(seed, f"rack:{i}"), i))
    rack_of = [0] * n
    for k, i in enumerate(order):
        rack_of[i] = k * racks // n
    port_range = (SIM_PORT_BASE, SIM_PORT_BASE + ports_per_host - 1)
    hosts = []
    i = 0
    for g in groups:
        res = replace(g.resources, ports=0)
        gpu_ids = tuple(range(g.resources.gpu))
        extra = dict(g.labels)
        for _ in range(g.count):
            name = f"sim-{i:0{width}d}"
            labels = {"host": name, "rack": f"r{rack_of[i]}"}
            if gpu_ids:
                labels["gpu_model"] = SIM_GPU_MODEL
            labels.update(extra)
            hosts.append(HostConfig(hostname=name, resources=res, gpu_ids=gpu_ids, port_range=port_range,
                                    labels=labels, address=sim_address(i)))
            i += 1
    return hosts


class _Task:
    """The book's record of one task: small, since 100,000 of them may run at once."""

    __slots__ = ("usage", "phase", "duration", "exit_code", "started_at", "end", "killed", "lost", "deferred",
                 "metrics")

    def __init__(self, usage: RunningTask, duration: float | None, exit_code: int, metrics: bytes = b"") -> None:
        self.usage = usage
        self.phase = _REGISTERED
        self.duration = duration  # None: runs until killed
        self.exit_code = exit_code
        self.started_at = 0.0
        self.end = 0.0  # started_at + duration once started (the timer heap's key)
        self.killed = False  # kill requested before the gang started
        self.lost = False  # host failed before the gang started
        self.deferred: TaskStatus | None = None  # how it ended before RUNNING was reported
        self.metrics = metrics  # its metrics file (PELOTON_SIM_METRICS, a line); b"": it measures nothing

    @property
    def task_id(self) -> str:
        return self.usage.task_id

    @property
    def hostname(self) -> str:
        return self.usage.hostname


class SimBackend:
    """Backend of simulated hosts and tasks. Thread-safe."""

    def __init__(self, hosts: list[HostConfig], *, seed: int = 0, clock: Callable[[], float] = time.time,
                 timer_thread: bool = True,
                 duration_of: Callable[[GangLaunch], float | None] | None = None) -> None:
        """`duration_of`: how long every member of a gang runs, decided from the placement it got (a replay's work
        model, peloton/replay); None asks each member's environment (PELOTON_SIM_DURATION)."""
        if not hosts:
            raise InvalidArgument("the sim backend needs at least one host", field="hosts")
        self._hosts: dict[str, HostUsage] = {}
        for h in hosts:
            if h.hostname in self._hosts:
                raise InvalidArgument(f"duplicate sim host name {h.hostname!r}", field="hosts")
            self._hosts[h.hostname] = HostUsage(h)
        self.seed = seed
        self._clock = clock
        self._timer_thread = timer_thread
        self._duration_of = duration_of
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._tasks: dict[str, _Task] = {}
        self._finished: OrderedDict[str, tuple[_Task, TaskStatus]] = OrderedDict()
        self._ends: list[tuple[float, str]] = []  # (end time, task id); stale entries are skipped
        self._stale = 0  # entries of _ends whose task ended otherwise (killed, lost)
        self._recoveries: list[tuple[float, str, int]] = []  # (time, hostname, failure generation)
        self._generation: dict[str, int] = {}  # hostname -> how many times it failed
        self._resources: dict[Resources, Resources] = {}  # interned resource vectors of tasks
        self._on_status: StatusCallback | None = None
        self._on_statuses: StatusesCallback | None = None  # a batch in one call (the host manager: one wake)
        self._on_hosts_changed: HostsCallback | None = None
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._started = False

    # ----------------------------------------------------------------------------------------------- lifecycle

    def start(self, on_status: StatusCallback, on_hosts_changed: HostsCallback | None = None,
              on_statuses: StatusesCallback | None = None) -> None:
        if self._started:
            raise RuntimeError("SimBackend already started")
        self._started = True
        self._on_status = on_status
        self._on_statuses = on_statuses
        self._on_hosts_changed = on_hosts_changed
        if self._timer_thread:
            self._thread = threading.Thread(target=self._run_timer, name="sim-timer", daemon=True)
            self._thread.start()

    def lead_again(self) -> None:
        pass  # no other daemon can have acted on this backend's hosts meanwhile

    def demand(self) -> None:
        pass  # its hosts are this daemon's alone: nothing to give back while idle, nothing to ask for again

    def maintenance(self) -> dict[str, float]:
        return {}  # no cluster manager schedules maintenance here: operators drain (`peloton host drain`)

    def stop(self) -> None:
        """Stop the timer. The simulated tasks exist only in memory: a restarted daemon knows none of them (its
        reconciliation finds them LOST and restarts their gangs)."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=5)

    # ----------------------------------------------------------------------------------------------- queries

    def offers(self, hostnames: Collection[str] | None = None, *, with_ids: bool = False) -> list[HostOffer]:
        with self._lock:
            return offers_of(self._hosts, hostnames, with_ids)

    def hosts(self) -> list[HostInfo]:
        with self._lock:
            return [h.info() for h in self._hosts.values()]

    def running(self) -> list[RunningTask]:
        with self._lock:
            return [t.usage for t in self._tasks.values()]

    def acknowledge(self, acks: Sequence[str]) -> None:
        """Nothing to acknowledge: sim statuses are not resent."""

    def reconcile(self, task_ids: Sequence[str]) -> dict[str, TaskStatus]:
        out: dict[str, TaskStatus] = {}
        with self._lock:
            now = self._clock()
            for tid in task_ids:
                t = self._tasks.get(tid)
                if t is not None:
                    if t.phase == _ANNOUNCED:
                        out[tid] = TaskStatus(tid, TaskState.RUNNING, now, t.hostname)
                    continue  # being launched: its status is on its way
                done = self._finished.get(tid)
                out[tid] = done[1] if done is not None else TaskStatus(
                    tid, TaskState.LOST, now, reason="unknown to the sim backend",
                    message="the sim backend has no record of this task (it keeps tasks in memory only)")
        return out

    def remove_sandboxes(self, job_ids: Collection[str]) -> int:
        return 0  # simulated tasks have no sandboxes

    def read_log(self, task_id: str, stream: str, offset: int, max_bytes: int) -> tuple[bytes, int]:
        """A synthetic log: stdout has one line per state change; stderr the reason of an unsuccessful end;
        metrics what the member's PELOTON_SIM_METRICS says (a member without it measures nothing)."""
        if stream not in (*_STREAMS, "metrics"):
            raise InvalidArgument(f"stream must be one of {', '.join(_STREAMS)}, got {stream!r}", field="stream")
        with self._lock:
            t = self._tasks.get(task_id)
            done = self._finished.get(task_id)
            if t is None and done is not None:
                t, final = done
            else:
                final = None
            if t is None:
                raise NotFound(f"no task {task_id!r} in the sim backend")
            h = self._hosts.get(t.hostname)
            address = h.config.address if h is not None else ""
            data = t.metrics if stream == "metrics" else _log_text(t, final, address, stream).encode()
        size = len(data)
        start = max(0, size + offset) if offset < 0 else min(offset, size)
        chunk = data[start:start + max(0, max_bytes)]
        return chunk, start + len(chunk)

    # ----------------------------------------------------------------------------------------------- launch / kill

    def launch(self, gangs: Sequence[GangLaunch]) -> list[LaunchResult]:
        results: dict[int, LaunchResult] = {}
        registered: dict[int, list[_Task]] = {}
        with self._lock:
            for i, g in enumerate(gangs):
                r = self._register_locked(g)
                if isinstance(r, LaunchResult):
                    results[i] = r
                else:
                    registered[i] = r
        for i, tasks in registered.items():
            results[i] = self._start_gang(gangs[i], tasks)
        return [results[i] for i in range(len(gangs))]

    def _register_locked(self, g: GangLaunch) -> LaunchResult | list[_Task]:
        """Account for every member of `g`, or say why not (REFUSED: cannot be accounted for; FAILED: a member
        whose environment makes it fail to start). Nothing is registered unless everything is."""
        for spec in g.tasks:
            if spec.task_id in self._tasks:
                return LaunchResult(g.gang_id, g.attempt, LaunchOutcome.REFUSED, spec.task_id,
                                    "task is already running")
        why = check_gang(self._hosts, g.tasks)
        if why is not None:
            return LaunchResult(g.gang_id, g.attempt, LaunchOutcome.REFUSED, why[0], why[1])
        tasks: list[_Task] = []
        decided = self._duration_of(g) if self._duration_of is not None else None
        for spec in g.tasks:
            try:
                b = behaviour(spec.env, self.seed, spec.task_id)
            except PelotonError as e:
                return LaunchResult(g.gang_id, g.attempt, LaunchOutcome.FAILED, spec.task_id, e.message,
                                    permanent=True)
            if b.start_fails:
                return LaunchResult(g.gang_id, g.attempt, LaunchOutcome.FAILED, spec.task_id,
                                    "simulated start failure (PELOTON_SIM_START)", permanent=b.permanent)
            usage = accounted(spec)
            res = self._resources.setdefault(usage.resources, usage.resources)
            if res is not usage.resources:
                # one shared vector per shape of task: memory at scale
                usage = RunningTask(usage.task_id, usage.hostname, res, usage.gpu_ids, usage.ports)
            tasks.append(_Task(usage, b.duration if decided is None else decided, b.exit_code,
                               (b.metrics + "\n").encode() if b.metrics else b""))
        if len(self._resources) > _INTERNED_MAX:
            self._resources.clear()
        for t in tasks:
            self._tasks[t.task_id] = t
            self._hosts[t.hostname].add(t.usage)
            self._finished.pop(t.task_id, None)
        return tasks

    def _start_gang(self, g: GangLaunch, tasks: list[_Task]) -> LaunchResult:
        with self._lock:
            now = self._clock()
            killed = any(t.killed for t in tasks)
            lost = next((t for t in tasks if t.lost), None)
            if killed or lost is not None:
                for t in tasks:
                    self._unregister_locked(t)
            else:
                for t in tasks:
                    t.phase, t.started_at = _STARTED, now
        if killed:
            self._report_all([TaskStatus(t.task_id, TaskState.KILLED, now, t.hostname, reason="killed",
                                         message="killed before the gang started") for t in tasks])
            return LaunchResult(g.gang_id, g.attempt, LaunchOutcome.REFUSED, message="killed before it started")
        if lost is not None:
            return LaunchResult(g.gang_id, g.attempt, LaunchOutcome.REFUSED, lost.task_id,
                                f"host {lost.hostname} failed before the gang started")
        self._report_all([TaskStatus(t.task_id, TaskState.RUNNING, now, t.hostname) for t in tasks])
        deferred: list[TaskStatus] = []
        with self._lock:
            head = self._ends[0][0] if self._ends else None
            for t in tasks:
                if t.deferred is not None:
                    deferred.append(t.deferred)
                    t.deferred = None
                    continue
                t.phase = _ANNOUNCED
                if t.duration is not None:
                    t.end = t.started_at + t.duration
                    heapq.heappush(self._ends, (t.end, t.task_id))
            if self._ends and (head is None or self._ends[0][0] < head):
                self._cond.notify_all()  # the timer sleeps until an earlier time than it should now
        self._report_all(deferred)
        return LaunchResult(g.gang_id, g.attempt, LaunchOutcome.OK)

    def kill(self, task_ids: Sequence[str], grace_s: float | None = None) -> None:
        """End each task now with KILLED (a simulated task stops at once, whatever its grace). A task whose gang has not started yet
        is never started. Unknown ids are ignored."""
        out: list[TaskStatus] = []
        with self._lock:
            now = self._clock()
            for tid in task_ids:
                t = self._tasks.get(tid)
                if t is None:
                    continue
                if t.phase == _REGISTERED:
                    t.killed = True  # its gang's start sees it
                    continue
                st = self._end_locked(t, TaskStatus(tid, TaskState.KILLED, now, t.hostname, reason="killed",
                                                    message="killed"))
                if st is not None:
                    out.append(st)
        self._report_all(out)

    # ----------------------------------------------------------------------------------------------- failures

    def fail_host(self, hostname: str, recover_after_s: float | None = None) -> int:
        """The host fails: every task on it ends LOST, it offers nothing (state DOWN) until `recover_host`, or
        until `recover_after_s` seconds have passed. Returns how many tasks were lost. NotFound for an unknown
        host; failing a host that is down already only changes when it recovers."""
        if recover_after_s is not None and not recover_after_s > 0:
            raise InvalidArgument(f"recover_after: must be greater than 0, got {recover_after_s}",
                                  field="recover_after")
        out: list[TaskStatus] = []
        with self._lock:
            h = self._hosts.get(hostname)
            if h is None:
                raise NotFound(f"no sim host {hostname!r}")
            now = self._clock()
            h.up = False
            gen = self._generation.get(hostname, 0) + 1
            self._generation[hostname] = gen
            lost = 0
            for tid in sorted(h.tasks):
                t = self._tasks[tid]
                lost += 1
                if t.phase == _REGISTERED:
                    t.lost = True  # its gang's start sees it; it never runs
                    continue
                st = self._end_locked(t, TaskStatus(tid, TaskState.LOST, now, hostname, reason="host failed",
                                                    message=f"host {hostname} failed"))
                if st is not None:
                    out.append(st)
            if recover_after_s is not None:
                heapq.heappush(self._recoveries, (now + recover_after_s, hostname, gen))
                self._cond.notify_all()
        log.info("sim: host %s failed (%d tasks lost)%s", hostname, lost,
                 f", recovers in {format_duration(recover_after_s)}" if recover_after_s is not None else "")
        self._report_all(out)
        self._hosts_changed([hostname])
        return lost

    def recover_host(self, hostname: str) -> bool:
        """The host is back, empty. Returns False when it was not down. NotFound for an unknown host."""
        with self._lock:
            h = self._hosts.get(hostname)
            if h is None:
                raise NotFound(f"no sim host {hostname!r}")
            was_down = not h.up
            h.up = True
            self._generation[hostname] = self._generation.get(hostname, 0) + 1  # a pending recovery is moot
        if was_down:
            log.info("sim: host %s recovered", hostname)
            self._hosts_changed([hostname])
        return was_down

    # ----------------------------------------------------------------------------------------------- timer

    def run_due(self, now: float | None = None) -> float | None:
        """End every task whose time has come and recover every host whose time has come (both as of `now`,
        default the clock), report them, and return when the next one is due (None: nothing is)."""
        out: list[TaskStatus] = []
        recovered: list[str] = []
        with self._lock:
            if now is None:
                now = self._clock()
            while self._ends and self._ends[0][0] <= now:
                end, tid = heapq.heappop(self._ends)
                t = self._tasks.get(tid)
                if t is None or t.phase != _ANNOUNCED or t.end != end:
                    self._stale = max(0, self._stale - 1)
                    continue
                if t.exit_code == 0:
                    st = TaskStatus(tid, TaskState.SUCCEEDED, end, t.hostname, exit_code=0)
                else:
                    st = TaskStatus(tid, TaskState.FAILED, end, t.hostname, exit_code=t.exit_code, reason="failed",
                                    message=f"exit code {t.exit_code}")
                ended = self._end_locked(t, st, stale=False)
                if ended is not None:
                    out.append(ended)
            while self._recoveries and self._recoveries[0][0] <= now:
                _, name, gen = heapq.heappop(self._recoveries)
                h = self._hosts[name]
                if self._generation.get(name) == gen and not h.up:
                    h.up = True
                    recovered.append(name)
            nxt = self._next_due_locked()
        self._report_all(out)
        if recovered:
            log.info("sim: hosts recovered: %s", ", ".join(recovered))
            self._hosts_changed(recovered)
        return nxt

    def _next_due_locked(self) -> float | None:
        heads = [q[0][0] for q in (self._ends, self._recoveries) if q]
        return min(heads) if heads else None

    def _run_timer(self) -> None:
        """Sleep until the next end or recovery (indefinitely when there is none: no CPU while idle)."""
        while True:
            with self._cond:
                while not self._stopping:
                    nxt = self._next_due_locked()
                    if nxt is None:
                        self._cond.wait()
                        continue
                    left = nxt - self._clock()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                if self._stopping:
                    return
            try:
                self.run_due()
            except Exception:  # noqa: BLE001 - the timer must survive a failing callback
                LOOP_ERRORS.labels("sim-timer").inc()
                log.exception("sim backend: timer step failed")

    # ----------------------------------------------------------------------------------------------- internals

    def _end_locked(self, t: _Task, st: TaskStatus, *, stale: bool = True) -> TaskStatus | None:
        """The task ended with `st`: free its resources and remember it. Returns the status to report now, or
        None when RUNNING has not been reported yet (the launch reports it right after)."""
        self._unregister_locked(t)
        self._remember_locked(t, st)
        if stale and t.phase == _ANNOUNCED and t.duration is not None:
            self._stale += 1  # its entry in _ends is dead now
            self._compact_locked()
        if t.phase == _STARTED:
            t.deferred = st
            return None
        return st

    def _unregister_locked(self, t: _Task) -> None:
        if self._tasks.get(t.task_id) is t:
            del self._tasks[t.task_id]
            h = self._hosts.get(t.hostname)
            if h is not None:
                h.remove(t.task_id)

    def _remember_locked(self, t: _Task, st: TaskStatus) -> None:
        self._finished[st.task_id] = (t, st)
        self._finished.move_to_end(st.task_id)
        while len(self._finished) > _FINISHED_CACHE:
            self._finished.popitem(last=False)

    def _compact_locked(self) -> None:
        """Drop the dead entries of the end heap once they are most of it (many long tasks killed)."""
        if self._stale > 1024 and self._stale * 2 > len(self._ends):
            self._ends = [(e, tid) for e, tid in self._ends
                          if (t := self._tasks.get(tid)) is not None and t.phase == _ANNOUNCED and t.end == e]
            heapq.heapify(self._ends)
            self._stale = 0

    def _report_all(self, statuses: Sequence[TaskStatus]) -> None:
        """In order, in one call where the host manager takes a batch (one wake of its event long polls for a
        gang's members, or a timer step's ends, instead of one each)."""
        if not statuses:
            return
        batch = self._on_statuses
        if batch is None:
            for st in statuses:
                self._report(st)
            return
        try:
            batch(statuses)
        except Exception:  # noqa: BLE001 - a failing callback must not kill the timer or a launch
            log.exception("sim backend: status callback failed for %d statuses (%s...)", len(statuses),
                          statuses[0].task_id)

    def _report(self, st: TaskStatus) -> None:
        cb = self._on_status
        if cb is None:
            return
        try:
            cb(st)
        except Exception:  # noqa: BLE001 - a failing callback must not kill the timer or a launch
            log.exception("sim backend: status callback failed for %s", st.task_id)

    def _hosts_changed(self, names: list[str]) -> None:
        cb = self._on_hosts_changed
        if cb is None:
            return
        try:
            cb(names)
        except Exception:  # noqa: BLE001
            log.exception("sim backend: hosts callback failed for %s", names)


def make_sim_backend(settings: SimSettings, *, clock: Callable[[], float] = time.time) -> SimBackend:
    settings.check()
    hosts = make_sim_host_groups(settings.host_groups(), settings.racks, settings.ports_per_host, settings.seed)
    return SimBackend(hosts, seed=settings.seed, clock=clock)


def _stamp(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t * 1000) % 1000:03d}Z"


def _log_text(t: _Task, final: TaskStatus | None, address: str, stream: str) -> str:
    """The synthetic log of a task: derived from its record on every read, so it costs no memory."""
    if stream == "stderr":
        if final is not None and final.state != TaskState.SUCCEEDED:
            return f"{_stamp(final.time)} {final.state.value}: {final.message or final.reason}\n"
        return ""
    if t.phase == _REGISTERED:
        return ""
    u = t.usage
    runs = f"runs {format_duration(t.duration)}" if t.duration is not None else "runs until killed"
    text = (f"{_stamp(t.started_at)} RUNNING on {u.hostname} ({address}): gpus=[{','.join(map(str, u.gpu_ids))}] "
            f"ports=[{','.join(map(str, u.ports))}], {runs}\n")
    if final is not None:
        detail = f"exit code {final.exit_code}" if final.exit_code is not None else (final.message or final.reason)
        text += f"{_stamp(final.time)} {final.state.value}: {detail}\n"
    return text
