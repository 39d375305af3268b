"""The job manager's launch, status and reconciliation paths in the cases that went wrong before (each test failed
before its fix): a member reported LOST that comes back RUNNING, launch intents one writer shard recorded in a call
that failed on another, a clock set back."""

from __future__ import annotations

import pytest

from peloton.domain.launch import TaskStatus
from peloton.domain.model import task_id_for
from peloton.domain.states import GangState, JobState, TaskState
from peloton.jobmgr import gang_policy as policy
from tests.unit.test_gang_policy import JOB, T0, apply, make_spec, make_view, place, run_all

G, T, J = GangState, TaskState, JobState


@pytest.mark.parametrize("max_attempts,on_failure", [(1, "restart_gang"), (3, "fail_job")])
def test_a_member_reported_lost_that_comes_back_running_is_killed(max_attempts: int, on_failure: str) -> None:
    """Mesos reports a member whose agent is unreachable as LOST (TASK_UNREACHABLE; a reconciliation answer
    "unknown" is LOST too) and the task may come back RUNNING when the agent returns. With no retry left (or
    `fail_job`) the gang is not re-queued, so the member keeps its task id and its record stays LOST: its RUNNING
    must be answered with a kill, or it runs on, holding its GPUs, unknown to every record until a restart."""
    jv = make_view(make_spec(2, max_attempts=max_attempts, on_member_failure=on_failure))
    gv = place(jv)
    run_all(jv)
    apply(jv, 0, T.LOST, now=T0 + 10)
    assert gv.gang.attempt == 1 and gv.tasks[0].state == T.LOST
    apply(jv, 1, T.KILLED, now=T0 + 11)
    assert jv.job.state == J.FAILED
    eff = apply(jv, 0, T.RUNNING, now=T0 + 20)  # the agent came back
    assert eff.kill == [task_id_for(JOB, 0, 1)]
    assert gv.tasks[0].state == T.LOST and jv.job.state == J.FAILED  # the record does not come back


def test_a_member_of_a_stopped_job_lost_then_back_is_killed() -> None:
    """Stopped: a member that is lost while it is killed is recorded KILLED; if it comes back it must not run on."""
    jv = make_view(make_spec(2))
    gv = place(jv)
    run_all(jv)
    policy.stop_job(jv, T0 + 5)
    apply(jv, 0, T.LOST, now=T0 + 6)
    apply(jv, 1, T.KILLED, now=T0 + 6)
    assert gv.tasks[0].state == T.KILLED and jv.job.state == J.KILLED
    eff = policy.apply_status(jv, TaskStatus(task_id_for(JOB, 0, 1), T.RUNNING, T0 + 9, hostname="host-0"), T0 + 9)
    assert eff.kill == [task_id_for(JOB, 0, 1)]


# --- launch intents over several writer shards ------------------------------------------------------------------
def _ids_on_two_shards() -> tuple[str, str]:
    from peloton.jobmgr.writer import shard_of

    ids = [f"job{i}" for i in range(50)]
    a = next(j for j in ids if shard_of(j, 2) == 0)
    b = next(j for j in ids if shard_of(j, 2) == 1)
    return a, b


def test_intents_one_shard_committed_are_launched_when_another_shard_failed(tmp_path: object) -> None:
    """With several writer shards (PostgreSQL: 2 by default) a batch of intents commits shard by shard. When one
    shard's commit fails, the intents the other shard committed are durable: those gangs are LAUNCHING in the
    store. They must be launched (and their placements acknowledged), not sent back to resmgr with their claims
    released: else they sit LAUNCHING, never launched, until their launch deadline fails them (an attempt used
    for the store's hiccup) while resmgr places them again for nothing."""
    from pathlib import Path

    from peloton.jobmgr.launcher import Launcher
    from peloton.jobmgr.writer import Kind, Mutation, Writers
    from peloton.store import db
    from tests.unit.test_launcher import FakeHostmgr, FakeResmgr, job, placed

    url = db.default_sqlite_url(Path(str(tmp_path)) / "data")
    db.upgrade(url)
    engine = db.make_engine(url)
    writers = Writers(2, db.make_sessions(engine), lambda *a: None, lambda *a: None, clock=lambda: 100.0)
    writers.start()
    try:
        a_id, b_id = _ids_on_two_shards()
        a, b = job(a_id), job(b_id)
        for jv in (a, b):
            writers.run(Mutation(Kind.CREATE, view=jv, events=policy.first_events(list(jv.tasks.values()), 1.0),
                                 rows=5))
        failing = writers.shards[1]
        real_commit = failing._commit
        calls = [0]

        def commit_fails_once(batch):  # type: ignore[no-untyped-def]
            calls[0] += 1
            if calls[0] == 1:
                raise db.StoreUnavailable("the store connection dropped (test)")
            return real_commit(batch)

        failing._commit = commit_fails_once  # type: ignore[method-assign]
        rm, hm = FakeResmgr([placed(a), placed(b)]), FakeHostmgr()
        launcher = Launcher(writers, rm, hm)  # type: ignore[arg-type]
        try:
            launcher.launch_once(timeout_ms=0)
        except db.StoreUnavailable:
            pass  # (the pass may say that part of it failed)
        launcher.launch_once(timeout_ms=0)  # the next poll carries the acknowledgements

        def state(job_id: str) -> tuple[GangState, int]:
            got = writers.read_each(lambda views: (views[job_id].gangs[0].gang.state,
                                                   views[job_id].gangs[0].gang.attempt), [job_id])
            return got[0]

        assert state(a_id) == (G.LAUNCHING, 1)  # durable
        assert hm.launched == [[f"{a_id}-0-1", f"{a_id}-1-1"]]  # ... so launched
        assert (f"{a_id}/0", 1) not in hm.released
        done = [k for d, _ in rm.acks for k in d]
        retried = [k for _, r in rm.acks for k in r]
        assert (f"{a_id}/0", 1) in done and (f"{a_id}/0", 1) not in retried
        # b's intent was not recorded: back to resmgr's queue, its claim released, nothing launched
        assert state(b_id) == (G.QUEUED, 1)
        assert (f"{b_id}/0", 1) in retried and (f"{b_id}/0", 1) in hm.released
    finally:
        writers.stop()
        engine.dispose()


# --- the reconciler's timers and a clock that goes back -----------------------------------------------------------
def test_a_clock_that_goes_back_does_not_hold_up_the_queue_check_and_the_full_reconciliation() -> None:
    """The reconciler schedules its queue check (every 30 s) and its full reconciliation (every 10 min) on the
    clock passed in (wall time). Set back an hour (an NTP step, a VM restored), a due time computed before lies an
    hour ahead: without a guard, lost enqueues are not repaired and live tasks not reconciled for that hour."""
    import threading
    from typing import Any

    from peloton.jobmgr import manager as jm_mod
    from peloton.jobmgr.manager import JobManager

    class Writer:
        def read_each(self, query: Any, job_ids: Any = None) -> list[Any]:
            return [query({})]

    class Effects:
        def mark(self) -> int:
            return 0

        def wait_sent(self, mark: int, timeout: float) -> bool:
            return True

        def take_refused(self) -> list[Any]:
            return []

    class Hostmgr:
        def drains(self) -> dict[str, float]:
            return {}

    class Resmgr:
        def held_gangs(self, page_token: str) -> tuple[list[tuple[str, int]], str]:
            return [], ""

    class Launcher:
        def launching(self) -> set[tuple[str, int]]:
            return set()

    now = [10_000.0]
    mgr = JobManager.__new__(JobManager)
    mgr.clock = lambda: now[0]
    mgr.writer, mgr.effects, mgr.hostmgr, mgr.resmgr = Writer(), Effects(), Hostmgr(), Resmgr()  # type: ignore[assignment]
    mgr.launcher = Launcher()  # type: ignore[assignment]
    mgr._stopping, mgr._stopping_lock = set(), threading.Lock()
    mgr._check_every_gang = False
    mgr._full_reconcile_at = now[0] + jm_mod.FULL_RECONCILE_S
    mgr._queue_check_at = now[0] + jm_mod.QUEUE_CHECK_S
    now[0] -= 3600.0  # the clock is set back an hour
    mgr.reconcile_once()
    # both ran (and are due again one period from the clock as it reads now), not an hour and more from now
    assert mgr._queue_check_at == now[0] + jm_mod.QUEUE_CHECK_S
    assert mgr._full_reconcile_at == now[0] + jm_mod.FULL_RECONCILE_S
