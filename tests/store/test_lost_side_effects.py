"""The job manager's side effects to the other components when they are lost, through the real components (the sim
backend, stepped by hand on one clock) on both stores. The job manager is restarted against the same store while
the resource manager and the host manager live on, as in a split deployment (`--role`) or with the local backend,
whose tasks outlive the daemon. Each test failed before its fix.

- A release lost with the job manager (it died after committing a gang DONE, before the release reached resmgr):
  the pool's share stayed counted for ever, and a gang that needs it waited for ever. The queue check now also
  asks resmgr what it holds and releases what the store says is over.
- Kills lost with the job manager (it died after committing members KILLING, before the kill reached the
  backend): recovery sent nothing, and the reconciler only once the records were 10 s old (a stop that was in
  progress finished 10-15 s after the restart, not at once). Recovery now sends them again.
- The reconciler's repeat of a preemption's kill went without the job's grace (the Mesos backend kept that).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest
from sqlalchemy import Engine

from peloton.domain.model import ResourcePool
from peloton.domain.resources import Resources
from peloton.domain.spec import JobSpec
from peloton.domain.states import JobState, TaskState
from peloton.errors import Unavailable
from peloton.hostmgr.inprocess import InProcessHostManager
from peloton.hostmgr.manager import HostManager
from peloton.hostmgr.sim.backend import SimBackend, make_sim_hosts
from peloton.jobmgr.manager import JobManager
from peloton.placement.engine import PlacementEngine
from peloton.resmgr.inprocess import InProcessResourceManager
from peloton.resmgr.manager import ResourceManager
from peloton.store import db, repo

T0 = 1_800_000_000.0
TEAM = "/team"  # the pool the jobs run in: its limit is the cluster's GPUs
MAX_PASSES = 50


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


class Away:
    """A client whose named calls fail as if its peer could not be reached, while `away`; every call recorded.
    `graceful`: a kill with a grace is taken and not passed on (the sim ends a task at once, whatever its grace: the
    members stay running, as in their grace)."""

    def __init__(self, inner: object, *methods: str) -> None:
        self._inner, self._methods = inner, set(methods)
        self.away = False
        self.graceful = False
        self.calls: list[tuple[str, tuple[object, ...]]] = []

    def __getattr__(self, name: str) -> object:
        fn = getattr(self._inner, name)

        def call(*args: object, **kwargs: object) -> object:
            self.calls.append((name, args))
            if self.away and name in self._methods:
                raise Unavailable(f"{name}: connection refused (test)")
            if self.graceful and name == "kill" and len(args) > 1 and args[1] is not None:
                return None
            return fn(*args, **kwargs)

        return call


class Cluster:
    """resmgr, hostmgr (sim backend) and a placement engine that outlive the job manager, which `restart` replaces
    with a new one recovering from the same store (what a job manager process's restart or its standby does)."""

    def __init__(self, engine: Engine, gpus: int = 2) -> None:
        self.clock = clock = Clock()
        self.sessions, self.read = db.make_sessions(engine), db.make_read_sessions(engine)
        with db.transaction(self.sessions) as s:
            repo.ensure_root_pool(s, clock())
            repo.create_pool(s, ResourcePool(TEAM, limit=Resources(cpu=8, mem=8192, gpu=gpus), created_at=clock()))

        def load_pools() -> list[ResourcePool]:
            with db.transaction(self.sessions) as s:
                return repo.list_pools(s)

        self.sim = SimBackend(make_sim_hosts(1, Resources(cpu=8, mem=8192, gpu=gpus)), clock=clock,
                              timer_thread=False)
        self.hostmgr = HostManager(self.sim, clock=clock)
        self.hostmgr.start()
        self.resmgr = ResourceManager(load_pools, clock=clock, rate_clock=clock)
        self.placement = PlacementEngine(InProcessResourceManager(self.resmgr), InProcessHostManager(self.hostmgr),
                                         poll_ms=0, clock=clock)
        self.jm = self._new_jobmgr()

    def _new_jobmgr(self) -> JobManager:
        # the job manager's own clients, so that a test can take its peers away from it alone
        self.rm = Away(InProcessResourceManager(self.resmgr), "enqueue", "remove_gangs")
        self.hm = Away(InProcessHostManager(self.hostmgr), "kill")
        jm = JobManager(self.sessions, self.read, self.rm, self.hm, clock=self.clock)  # type: ignore[arg-type]
        jm.start()
        jm.recover()
        return jm

    def restart(self) -> None:
        """The job manager dies (what its side-effect sender had not sent is lost) and a new one recovers."""
        self.jm.stop()
        self.jm = self._new_jobmgr()

    def close(self) -> None:
        self.jm.stop()
        self.hostmgr.stop()

    def idle(self) -> None:
        for w in self.jm.writer.shards:
            w.read(lambda views: None, ("",))  # (with a job id: after every mutation queued before it)
        self.jm.effects.drain(0.2)  # (a peer that is away keeps it busy: not waited for)

    def settle(self) -> None:
        """Step every component at this instant until a whole pass does nothing."""
        for _ in range(MAX_PASSES):
            self.sim.run_due(self.clock())
            busy = self.jm.events_once(0)
            self.idle()
            busy = self.placement.run_once() or busy
            busy = self.jm.launcher.launch_once(0) or busy
            self.idle()
            busy = self.jm.events_once(0) or busy
            self.idle()
            if not busy:
                return
        raise AssertionError("the components did not settle")

    def reconcile(self) -> None:
        """The reconciler's pass, with its queue check due."""
        self.jm._queue_check_at = 0.0  # noqa: SLF001 - due now
        self.jm.reconcile_once()
        self.idle()

    def state(self, job_id: str) -> JobState:
        with db.transaction(self.read) as s:
            return repo.get_job(s, job_id).state

    def task_states(self, job_id: str) -> list[TaskState]:
        with db.transaction(self.read) as s:
            return [t.state for t in repo.get_tasks(s, job_id)]

    def running_in_backend(self) -> list[str]:
        return sorted(t.task_id for t in self.sim.running())

    def gpus_held(self) -> int:
        held = self.resmgr.usage()[0].get(TEAM)
        return held.gpu if held is not None else 0


def spec(name: str, instances: int = 2, gpu: int = 1, **kw: object) -> JobSpec:
    return JobSpec(name=name, instances=instances, command="train.py", resources=Resources(cpu=1, mem=256, gpu=gpu),
                   respool=TEAM, **kw)  # type: ignore[arg-type]


def kills(calls: Sequence[tuple[str, tuple[object, ...]]]) -> list[str]:
    return [tid for name, args in calls if name == "kill" for tid in args[0]]  # type: ignore[attr-defined]


@pytest.fixture
def cluster(engine: Engine) -> Iterator[Cluster]:
    c = Cluster(engine)
    try:
        yield c
    finally:
        c.close()


# --- 1. a release lost with the job manager ------------------------------------------------------------------------

def test_a_release_lost_with_the_job_manager_is_found_by_the_queue_check(cluster: Cluster) -> None:
    c = cluster
    first = c.jm.create_job(spec("first"))  # both GPUs of the cluster
    c.settle()
    assert c.state(first) == JobState.RUNNING and c.gpus_held() == 2
    c.rm.away = True  # resmgr cannot be reached from the job manager for a while
    c.jm.stop_job(first)
    c.settle()
    assert c.state(first) == JobState.KILLED and c.running_in_backend() == []
    assert c.gpus_held() == 2  # the release is still in the job manager's outbox ...
    c.restart()  # ... and is lost with it
    second = c.jm.create_job(spec("second"))  # needs both GPUs, free on the host
    c.settle()
    assert c.state(second) == JobState.PENDING  # resmgr still counts the first job's gang
    c.clock.now += 60  # the check looks at what has been over for a while: a release may be on its way
    c.reconcile()
    assert c.gpus_held() == 0  # released
    c.settle()
    assert c.state(second) == JobState.RUNNING  # the first job's share was released: the second one runs
    assert c.gpus_held() == 2


# --- 2. kills lost with the job manager ----------------------------------------------------------------------------

def test_kills_lost_with_the_job_manager_are_sent_again_by_its_recovery(cluster: Cluster) -> None:
    c = cluster
    job = c.jm.create_job(spec("stopped"))
    c.settle()
    assert c.state(job) == JobState.RUNNING
    members = c.running_in_backend()
    assert len(members) == 2
    c.hm.away = True  # the host manager cannot be reached: the kills stay in the outbox ...
    c.jm.stop_job(job)
    c.idle()
    assert c.task_states(job) == [TaskState.KILLING] * 2 and c.running_in_backend() == members
    c.clock.now += 1
    c.restart()  # ... and are lost with it: the new job manager finds both members KILLING and running
    c.idle()
    assert sorted(kills(c.hm.calls)) == members  # sent again by the recovery, not 10 s later
    c.reconcile()  # (the reconciler's first pass, at once)
    c.settle()
    assert c.running_in_backend() == []
    assert c.state(job) == JobState.KILLED and c.task_states(job) == [TaskState.KILLED] * 2


def test_a_preemption_the_reconciler_repeats_keeps_its_grace(cluster: Cluster) -> None:
    """Members of a preempted gang run on through their grace (SIGTERM, then SIGKILL after the job's
    sla.preemption_grace), their records PREEMPTING: after 10 s the reconciler finds them running and repeats the
    kill. Repeated without the grace, the Mesos backend took it as the kill's grace from then on (its own repeats
    of a KILL carry the last one's): the master's KILL then carried no kill policy, the task's own (a few seconds),
    where the job had asked for its grace."""
    c = cluster
    job = c.jm.create_job(spec("preempted", preemption_grace_s=60.0))
    c.settle()
    members = c.running_in_backend()
    c.hm.graceful = True
    c.jm.launcher._preempt([(f"{job}/0", 1, "test")])  # noqa: SLF001 - as resmgr's order does
    c.idle()
    assert c.task_states(job) == [TaskState.PREEMPTING] * 2 and c.running_in_backend() == members
    c.hm.calls.clear()
    c.clock.now += 11  # still in their grace
    c.reconcile()
    repeated = [(args[0], args[1] if len(args) > 1 else None) for name, args in c.hm.calls if name == "kill"]
    assert repeated and all(grace == 60.0 for _, grace in repeated)
    assert sorted(t for ids, _ in repeated for t in ids) == members  # type: ignore[attr-defined]
