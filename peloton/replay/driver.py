"""Replay: the production job manager, resource manager, placement engine and host manager (sim backend) run a
trace in virtual time, deterministically, as fast as the CPU allows (docs/architecture.md, "Virtual time (replay)").

No loop thread runs. The driver builds the components as server.py does, then at each virtual instant steps them
in a fixed order (jobs due are submitted; the sim backend ends the tasks whose time has come; the job manager
applies their statuses; the placement engine runs a round; the launcher launches what was placed; statuses again)
until a pass does nothing, and jumps the clock to the next thing that is due: a submission, a sim task's end, or a
timer of resmgr's (a parked gang's retry, a probe for a starved gang, `ResourceManager.next_due`), or a deadline
of the job manager's reconciler (a gang's `sla.max_runtime` or launch deadline, `JobManager.next_deadline`), which
is stepped at every instant as its loop would run. Every long poll
is asked with a zero timeout, so nothing waits on the real clock. The job manager's writer and side-effect threads
are work queues, not timers: after each step the driver waits until both are idle (a query through every writer
shard, then `SideEffects.drain`), so each step sees everything the one before it caused, in the same order on
every run.
"""

from __future__ import annotations

import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from peloton.domain.launch import GangLaunch
from peloton.domain.model import ResourcePool, StoredModel
from peloton.domain.resources import Resources
from peloton.domain.spec import JobSpec
from peloton.hostmgr.inprocess import InProcessHostManager
from peloton.hostmgr.manager import HostManager
from peloton.hostmgr.sim.backend import SimBackend, make_sim_hosts
from peloton.jobmgr.manager import JobManager
from peloton.placement.engine import PlacementEngine
from peloton.placement.reservation import ORDERS
from peloton.resmgr.inprocess import InProcessResourceManager
from peloton.resmgr.manager import ResourceManager
from peloton.resmgr.ordering import ARRIVAL, QueueOrder
from peloton.store import db, repo

EPOCH = 1_700_000_000.0  # virtual time 0 on the components' clock (0.0 means "unset" in many records)
MIN_STEP_S = 0.25  # a timer found due but acted on by no component is looked at again this much later
TIMER_SLACK_S = 1e-6
SAME_INSTANT_S = 1e-6  # between jobs the trace submits at the same second
MAX_PASSES = 1000  # passes at one instant before the driver calls the components stuck (a bug, not a trace)
DRAIN_TIMEOUT_S = 30.0  # real seconds the side-effect thread may take to send one step's effects
MAX_SECONDS = 1e9  # a submission's at_s, a run's duration: past it, EPOCH + time loses the microseconds the
#                    driver orders by (traces.MAX_TRACE_SECONDS)


class Stalled(RuntimeError):
    """Gangs wait and nothing that could start them will ever come due: the scheduler cannot go on (the message
    says why the first gang of each pool's queue waits)."""


class VirtualClock:
    """loop.Clock and the components' `clock()`: time moves only when the driver says so. `wait` never blocks
    (nothing waits in a replay: every poll has a zero timeout)."""

    def __init__(self, start: float = EPOCH) -> None:
        self.t = start

    def __call__(self) -> float:
        return self.t

    def now(self) -> float:
        return self.t

    def wait(self, event: threading.Event, timeout: float) -> bool:
        return event.is_set()

    def advance_to(self, t: float) -> None:
        if t < self.t:
            raise ValueError(f"the virtual clock goes back: {t} < {self.t}")
        self.t = t


@dataclass(frozen=True, slots=True)
class Cluster:
    """`hosts` sim hosts of `gpus` GPUs each, spread over `racks` racks (drawn from `seed`)."""

    hosts: int
    gpus: int
    racks: int = 1
    cpu: float = 64.0
    mem_mb: float = 256 * 1024.0
    seed: int = 0
    labels: tuple[tuple[str, str], ...] = ()  # on every host (gpu_model, nic_gbps, gpu_link: what a plan sees)


@dataclass(frozen=True, slots=True)
class Submission:
    """A trace's job: submitted at `at_s` (virtual seconds from the start), known by `name` in the results."""

    at_s: float
    name: str
    spec: JobSpec


@dataclass(frozen=True, slots=True)
class Placement:
    """Where one run of a gang went: (hostname, GPUs there) per host, in host order; and its racks."""

    hosts: tuple[tuple[str, int], ...]
    racks: tuple[str, ...]

    @property
    def gpus(self) -> int:
        return sum(n for _, n in self.hosts)


@dataclass(frozen=True, slots=True)
class Run:
    """One run of a job's gang: from when every member ran to when the last one stopped (None: still running)."""

    start_s: float
    end_s: float | None
    placement: Placement


@dataclass(slots=True)
class JobResult:
    """Virtual seconds from the start of the replay. `running_s`: when every member of its first run ran (a gang
    starts whole); `last_start_s`: its last run's start (later when it was preempted); `end_s`: when it ended."""

    name: str
    job_id: str
    submitted_s: float
    state: str = ""
    running_s: float | None = None
    last_start_s: float | None = None
    end_s: float | None = None
    placement: Placement | None = None  # its last run's
    runs: int = 0
    preemptions: int = 0
    history: list[Run] = field(default_factory=list)  # every run, in order (a preempted gang's earlier ones)


@dataclass(frozen=True, slots=True)
class Sample:
    """The cluster at virtual second `t`, after every component acted: GPUs held by running members, gangs queued
    (waiting for admission or placement)."""

    t: float
    gpus_allocated: int
    queued: int
    partial_gpus: int = 0  # GPUs held by gangs some of whose members run and others do not (must stay 0)


@dataclass(slots=True)
class ReplayResult:
    jobs: list[JobResult]
    timeline: list[Sample]
    total_gpus: int
    instants: int = 0  # virtual instants stepped
    wall_s: float = 0.0


DurationOf = Callable[[Submission, Placement], float]  # Replay.history(name) has the job's earlier runs


class Replay:
    """One replay: `run()` once. `duration_of(submission, placement)`: how long a run of the job's gang lasts on
    that placement (the work model's answer), in virtual seconds."""

    def __init__(self, cluster: Cluster, submissions: Sequence[Submission], duration_of: DurationOf, *,
                 pools: Sequence[ResourcePool] = (), preemption: bool = True, preemption_settle_s: float = 10.0,
                 store_url: str | None = None, seed: int = 0, order: str = "backfill",
                 queue_order: QueueOrder = ARRIVAL,
                 models: Sequence[StoredModel] = ()) -> None:
        if order not in ORDERS:
            raise ValueError(f"order: must be one of {', '.join(ORDERS)}, got {order!r}")
        names = [s.name for s in submissions]
        if len(set(names)) != len(names):
            raise ValueError("submissions: names must be unique")
        for s in submissions:
            if not 0 <= s.at_s <= MAX_SECONDS:
                raise ValueError(f"submissions[{s.name}].at_s: must be within 0..{MAX_SECONDS:.0f}, got {s.at_s}")
        self.cluster = cluster
        # by time, ties in the order given (the trace's: the file's, as traces.read_trace keeps it and the pools are
        # dealt in it), not by name: the first of two jobs submitted together is the first in line
        self.subs = sorted(submissions, key=lambda s: s.at_s)
        self.duration_of = duration_of
        self.clock = VirtualClock()
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if store_url is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="peloton-replay-")
            store_url = f"sqlite:///{Path(self._tmp.name) / 'replay.db'}"
        self.url = store_url
        self._pools = list(pools)
        self._preemption = preemption
        self._settle_s = preemption_settle_s
        self._seed = seed
        self._order = order  # --placement-order: the resource manager's and the placement engine's
        self._queue_order = queue_order  # --queue-order (and --queue-promote-after): the resource manager's
        self._models = list(models)  # stored models (`peloton model create`) the model-aware jobs name
        self._job_seq = 0
        self._results: dict[str, JobResult] = {}
        self._by_job: dict[str, JobResult] = {}
        self._subs_by_name = {s.name: s for s in self.subs}
        self._live: dict[str, tuple[str, ...]] = {}  # job id -> the task ids of its gang's run now

    # --- wiring (as server.py, without loops) -----------------------------------------------------------------
    def _build(self) -> None:
        c, clock = self.cluster, self.clock
        db.upgrade(self.url)
        self.engine_db = db.make_engine(self.url)
        sessions, read = db.make_sessions(self.engine_db), db.make_read_sessions(self.engine_db)
        with db.transaction(sessions) as s:
            repo.ensure_root_pool(s, clock())
            for p in self._pools:
                repo.create_pool(s, p)
            for m in self._models:
                repo.create_model(s, m)

        def load_pools() -> list[ResourcePool]:
            with db.transaction(sessions) as s:
                return repo.list_pools(s)

        hosts = make_sim_hosts(c.hosts, Resources(cpu=c.cpu, mem=c.mem_mb, gpu=c.gpus), racks=c.racks,
                               seed=c.seed, labels=dict(c.labels))
        self._rack = {h.hostname: h.labels["rack"] for h in hosts}
        self.sim = SimBackend(hosts, seed=self._seed, clock=clock, timer_thread=False, duration_of=self._launched)
        self.hostmgr = HostManager(self.sim, clock=clock)
        self.resmgr = ResourceManager(load_pools, clock=clock, preemption_settle_s=self._settle_s,
                                      preemption=self._preemption, rate_clock=clock, placement_order=self._order,
                                      queue_order=self._queue_order)
        rm, hm = InProcessResourceManager(self.resmgr), InProcessHostManager(self.hostmgr)
        self.hostmgr.start()
        self.jobmgr = JobManager(sessions, read, rm, hm, clock=clock, job_ids=self._job_id)
        self.placement = PlacementEngine(rm, hm, poll_ms=0, clock=clock, order=self._order)
        self.jobmgr.start()
        self.jobmgr.recover()

    def _job_id(self) -> str:
        """Job ids in submission order (12 hex digits, as the daemon's): ties that resmgr and preemption break by
        gang id fall the same way on every run."""
        self._job_seq += 1
        return f"{self._job_seq:012x}"

    def _close(self) -> None:
        self.jobmgr.stop()
        self.hostmgr.stop()
        self.engine_db.dispose()
        if self._tmp is not None:
            self._tmp.cleanup()

    # --- the sim backend asks how long a gang runs (at its launch: every member RUNNING at this instant) ------
    def _launched(self, g: GangLaunch) -> float | None:
        r = self._by_job.get(g.tasks[0].job_id) if g.tasks else None
        if r is None:
            return None  # not a job of this replay's (none is): the member's own environment decides
        per_host: dict[str, int] = {}
        for t in g.tasks:
            per_host[t.hostname] = per_host.get(t.hostname, 0) + len(t.gpu_ids)
        hosts = tuple(sorted(per_host.items()))
        p = Placement(hosts, tuple(sorted({self._rack[h] for h, _ in hosts})))
        now = self.clock() - EPOCH
        if r.running_s is None:
            r.running_s = now
        r.last_start_s, r.placement = now, p
        r.runs += 1
        self._end_run(r, now)  # a gang runs once at a time: its earlier run has ended
        d = float(self.duration_of(self._subs_by_name[r.name], p))
        if not 0 < d <= MAX_SECONDS:
            raise ValueError(f"duration_of({r.name}): must be > 0 seconds and at most {MAX_SECONDS:.0f}, got {d}")
        r.history.append(Run(now, None, p))
        self._live[r.job_id] = tuple(t.task_id for t in g.tasks)
        return d

    def history(self, name: str) -> tuple[Run, ...]:
        """The runs of job `name` so far (for `duration_of`, asked at a launch: the earlier runs, all ended)."""
        r = self._results.get(name)
        return tuple(r.history) if r is not None else ()

    def _end_run(self, r: JobResult, now: float) -> None:
        if r.history and r.history[-1].end_s is None:
            last = r.history[-1]
            r.history[-1] = Run(last.start_s, now, last.placement)
        self._live.pop(r.job_id, None)

    # --- stepping -----------------------------------------------------------------------------------------------
    def _idle(self) -> None:
        """Wait until the writer threads and the side-effect thread have done everything asked of them so far."""
        for w in self.jobmgr.writer.shards:
            w.read(lambda views: None)
        if not self.jobmgr.effects.drain(DRAIN_TIMEOUT_S):
            raise RuntimeError("replay: the job manager's side effects were not sent in time")

    def _settle(self) -> None:
        """Step every component at this instant until a whole pass does nothing."""
        now = self.clock()
        self.jobmgr.reconcile_once()  # (its loop's work: max_runtime and launch deadlines, stopped jobs, drift)
        self._idle()
        for _ in range(MAX_PASSES):
            self.sim.run_due(now)
            busy = self.jobmgr.events_once(0)
            self._idle()
            busy = self.placement.run_once() or busy
            busy = self.jobmgr.launcher.launch_once(0) or busy
            self._idle()
            busy = self.jobmgr.events_once(0) or busy
            self._idle()
            if not busy:
                return
        raise RuntimeError(f"replay: the components did not settle at virtual second {now - EPOCH:.3f}")

    def _next(self, submit_at: float | None) -> float | None:
        now = self.clock()
        rm = self.resmgr.next_due(retries=False)
        jm = self.jobmgr.next_deadline()
        # (resmgr compares differences of clock readings: a hair later, so that 0.05 s after is not 0.0499999)
        due = [t for t in (submit_at, self.sim.run_due(now), rm + TIMER_SLACK_S if rm is not None else None,
                           jm + TIMER_SLACK_S if jm is not None else None) if t is not None]
        if not due:
            return None
        return max(min(due), now + MIN_STEP_S) if min(due) <= now else min(due)

    def _sample(self, timeline: list[Sample]) -> None:
        running = {t.task_id: t.resources.gpu for t in self.sim.running()}
        gpus = sum(running.values())
        _, queued = self.resmgr.queue("", 0)
        now = self.clock() - EPOCH
        partial = 0
        for job_id, tasks in list(self._live.items()):
            up = [running[t] for t in tasks if t in running]
            if not up:
                self._end_run(self._by_job[job_id], now)  # ended (done, failed or preempted) at this instant
            elif len(up) < len(tasks):
                partial += sum(up)
        s = Sample(now, gpus, queued, partial)
        if not timeline or (timeline[-1].gpus_allocated, timeline[-1].queued, timeline[-1].partial_gpus) != (
                gpus, queued, partial):
            timeline.append(s)

    def _done(self, submitted: int) -> bool:
        if submitted < len(self.subs) or self.sim.running():
            return False
        _, queued = self.resmgr.queue("", 0)
        return queued == 0

    def run(self) -> ReplayResult:
        start = time.perf_counter()
        self._build()
        try:
            timeline: list[Sample] = []
            i, instants = 0, 0
            while True:
                now = self.clock() - EPOCH
                while i < len(self.subs) and self.subs[i].at_s <= now:
                    sub = self.subs[i]
                    if i and self.subs[i - 1].at_s == sub.at_s:
                        # resmgr breaks a tie of priority and submission time by gang id, a random one: jobs
                        # submitted together are a hair apart, in the trace's order, so that every run agrees
                        self.clock.advance_to(self.clock() + SAME_INSTANT_S)
                    job_id = self.jobmgr.create_job(sub.spec)
                    r = self._results[sub.name] = JobResult(sub.name, job_id, sub.at_s)
                    self._by_job[job_id] = r
                    i += 1
                self._settle()
                self._sample(timeline)
                instants += 1
                if self._done(i):
                    break
                nxt = self._next(EPOCH + self.subs[i].at_s if i < len(self.subs) else None)
                if nxt is None:
                    gangs, queued = self.resmgr.queue("", 1000)
                    heads = "; ".join(f"{self._name_of(g.job_id)} ({g.pool}): {g.reason}" for g in gangs
                                      if g.position == 1)
                    raise Stalled(f"replay stalled at virtual second {now:.3f}: {queued} gangs queued and nothing "
                                  f"due that could start them. {heads}")
                self.clock.advance_to(nxt)
            self._collect()
        finally:
            self._close()
        total = self.cluster.hosts * self.cluster.gpus
        return ReplayResult([self._results[s.name] for s in self.subs], timeline, total, instants,
                            time.perf_counter() - start)

    def _name_of(self, job_id: str) -> str:
        r = self._by_job.get(job_id)
        return r.name if r is not None else job_id

    def _collect(self) -> None:
        """End state, end time and preemptions from the job manager's records (the store's)."""
        for r in self._results.values():
            rec = self.jobmgr.get_job(r.job_id)
            r.state = rec.job.state.value
            r.end_s = rec.job.completed_at - EPOCH if rec.job.completed_at else None
            r.preemptions = sum(g.preemptions for g in rec.gangs)

