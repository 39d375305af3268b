"""gang_policy: Hypothesis walks over every rule the job manager applies (status updates of any attempt in any order,
placements, launch outcomes, preemptions at any point, drained hosts, resmgr refusals, deadlines, stops whole or by
range, daemon restarts with the view rebuilt from the stored rows), then a quiet phase in which the backend confirms
everything it was told. test_gang_policy.py's walk checks the state invariants step by step; this one checks what
must hold at the end: no job is left stuck, a stopped job starts nothing new, attempts stay within
retry.max_attempts, no gang is left partly running."""

from __future__ import annotations

import copy

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from peloton.domain.launch import TaskStatus
from peloton.domain.model import task_id_for
from peloton.domain.placement import GangPlacement, MemberAssignment
from peloton.domain.states import TASK_TERMINAL, GangState, JobState, TaskState
from peloton.jobmgr import gang_policy as policy
from peloton.jobmgr.gang_policy import Effects, GangView, JobView
from tests.unit.test_gang_policy import JOB, T0, _check_counters, _check_tracked, _records, make_spec

G, T, J = GangState, TaskState, JobState
STOPPING = (T.KILLING, T.PREEMPTING)
ON_THE_WAY = (T.LAUNCHING, T.LAUNCHED, T.STARTING)

_gang = st.integers(0, 5)
op_strategy = st.one_of(
    st.tuples(st.just("status"), st.integers(0, 5), st.sampled_from([T.RUNNING, T.RUNNING, T.SUCCEEDED, T.FAILED,
                                                                      T.LOST, T.KILLED]),
              st.sampled_from([0, 0, 0, 1, 2]), st.booleans()),
    st.tuples(st.just("status"), st.integers(0, 5), st.sampled_from([T.RUNNING, T.FAILED]), st.just(0),
              st.just(False)),
    st.tuples(st.just("place"), _gang),
    st.tuples(st.just("place"), _gang),
    st.tuples(st.just("preempt"), _gang, st.booleans()),
    st.tuples(st.just("evict"), _gang),
    st.tuples(st.just("launch_failed"), _gang, st.booleans()),
    st.tuples(st.just("launch_refused"), _gang),
    st.tuples(st.just("resmgr_refused"), _gang, st.integers(0, 5)),
    st.tuples(st.just("deadline"), st.floats(0, 200)),
    st.tuples(st.just("max_runtime"), st.floats(0, 200)),
    st.tuples(st.just("stop"), st.integers(0, 12)),  # acts on 0 (whole) and 1-3 (a range): stopping ends all
    st.tuples(st.just("restart"), st.lists(st.sampled_from([None, T.RUNNING, T.STARTING, T.SUCCEEDED, T.FAILED,
                                                            T.LOST, T.KILLED]), min_size=4, max_size=4),
              st.booleans()),  # resmgr restarted with it (one process: it forgot every gang) or lived on
)


def _pick(jv: JobView, n: int, *states: GangState) -> GangView:
    """The n-th gang (cyclically) of those in `states`, or of all when none is: most operations then act."""
    gvs = [gv for gv in jv.gangs.values() if gv.gang.state in states] or list(jv.gangs.values())
    return gvs[n % len(gvs)]


def _place(jv: JobView, idx: int, now: float) -> Effects | None:
    gv = jv.gangs[idx]
    members = tuple(MemberAssignment(t.instance, t.task_id, f"h{t.instance}", "127.0.0.1", jv.spec.resources, (),
                                     ()) for t in gv.members())
    return policy.launch_intent(jv, GangPlacement(gv.gang.gang_id, JOB, gv.gang.attempt, members), now)


def _reload(jv: JobView) -> JobView:
    """A job manager restart: the view rebuilt from the stored rows (its counters recounted)."""
    job = copy.deepcopy(jv.job)
    gangs = [copy.deepcopy(gv.gang) for gv in jv.gangs.values()]
    tasks = [copy.deepcopy(t) for gv in jv.gangs.values() for t in gv.tasks.values()]
    return policy.new_job_view(job, gangs, tasks)


def _send(held: set[tuple[str, int]], jv: JobView, eff: Effects) -> None:
    """What resmgr holds (queued, or its allocation counted) once the side effects are sent as the job manager sends
    them (`_perform`): the releases first, then the enqueues and adoptions still wanted, of the gang as it is at the
    commit (policy.to_send)."""
    held.difference_update(eff.release)
    enqueue, adopt = policy.to_send({jv.job.id: jv}, eff)
    for _, i in enqueue + adopt:
        g = jv.gangs[i].gang
        held.add((g.gang_id, g.attempt))


def _check_step(jv: JobView, eff: Effects, stopped: bool, failed: bool, max_attempts: int) -> None:
    for gv in jv.gangs.values():
        g = gv.gang
        assert 1 <= policy.attempts_used(g) <= max_attempts, (g.attempt, g.preemptions)
        assert all(t.attempt == g.attempt for t in gv.members())
        if g.state == G.RUNNING:  # the gang promise: RUNNING means every member has started
            assert all(t.state in (T.RUNNING, T.SUCCEEDED, T.KILLING) for t in gv.members()), g
    if stopped or failed:  # nothing of a stopped or failed job is queued again
        assert eff.enqueue == [], (eff.enqueue, stopped, failed)


def _quiesce(jv: JobView, now: float, stopped: bool, failed: bool, held: set[tuple[str, int]]) -> float:
    """The events stop; the backend confirms: every kill and preemption ends the member, every member on its way
    starts; the launch deadlines and the max runtimes pass; a stop cut short is finished (the reconciler's
    needs_stopping), after the rest, as a reconciler pass that comes later would."""
    for _ in range(20):
        before = _records(jv)
        eff = Effects()
        for gv in list(jv.gangs.values()):
            for t in gv.members():
                now += 1.0
                if t.state in STOPPING:
                    eff.merge(policy.apply_status(jv, TaskStatus(t.task_id, T.KILLED, now), now))
                elif t.state in ON_THE_WAY:
                    eff.merge(policy.apply_status(jv, TaskStatus(t.task_id, T.RUNNING, now, hostname=t.host), now))
        now += 10_000.0
        for gv in list(jv.gangs.values()):
            eff.merge(policy.check_launch_deadline(jv, gv, now))
            eff.merge(policy.check_max_runtime(jv, gv, now))
        if _records(jv) == before and policy.needs_stopping(jv):
            eff.merge(policy.stop_job(jv, now))
        _send(held, jv, eff)
        _check_tracked(before, jv, eff)
        _check_step(jv, eff, stopped, failed, jv.spec.max_attempts)
        if _records(jv) == before:
            return now
    raise AssertionError("the rules never settled")


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    instances=st.integers(1, 4),
    min_avail=st.integers(0, 2),  # 1 or 2 (of more instances): an elastic job, a gang and single-member gangs
    policy_name=st.sampled_from(["restart_gang", "restart_gang", "fail_job"]),
    max_attempts=st.integers(1, 3),
    max_runtime=st.sampled_from([0.0, 50.0]),
    preemptible=st.booleans(),
    ops=st.lists(op_strategy, min_size=10, max_size=60),
)
def test_no_job_is_left_stuck_and_no_gang_half_running(instances: int, min_avail: int, policy_name: str,
                                                       max_attempts: int, max_runtime: float, preemptible: bool,
                                                       ops: list[tuple]) -> None:
    spec = make_spec(instances, min_available=min(min_avail, instances), on_member_failure=policy_name,
                     max_attempts=max_attempts, max_runtime_s=max_runtime, preemptible=preemptible)
    jv = policy.new_job_view(*policy.new_job_records(JOB, spec, T0))
    now = T0
    failed = stopped = False
    attempts = {i: gv.gang.attempt for i, gv in jv.gangs.items()}
    held = {(gv.gang.gang_id, 1) for gv in jv.gangs.values()}  # what resmgr queues or counts: CreateJob enqueues
    preemptions = dict.fromkeys(jv.gangs, 0)
    killed: set[str] = set()  # task ids a kill (or a preemption) was sent for
    preempted: set[str] = set()
    for op in ops:
        now += 1.0
        states_before = {i: gv.gang.state for i, gv in jv.gangs.items()}
        kind = op[0]
        gvs = list(jv.gangs.values())
        before = _records(jv)
        eff = Effects()
        if kind == "status":
            _, inst, state, older, permanent = op
            launched = sorted(t.instance for g in gvs for t in g.tasks.values() if t.state not in (T.PENDING,))
            inst = launched[inst % len(launched)] if launched else inst % instances  # mostly about launched ones
            gv = next(g for g in gvs if inst in g.tasks)
            t = gv.tasks[inst]
            attempt = max(1, t.attempt - older)
            if attempt == t.attempt and t.state in (T.PENDING, T.INITIALIZED):
                continue  # never launched: the backend cannot report on it
            eff = policy.apply_status(jv, TaskStatus(task_id_for(JOB, inst, attempt), state, now, hostname="h",
                                                     permanent=permanent), now)
        elif kind == "place":
            gv = _pick(jv, op[1], G.QUEUED, G.PREEMPTED)
            if (gv.gang.gang_id, gv.gang.attempt) not in held:
                continue  # resmgr places only what it queues
            placed = _place(jv, gv.gang.index, now)
            if placed is not None:
                assert jv.job.desired == "RUNNING" and not failed
                eff = placed
        elif kind == "preempt":
            gv = _pick(jv, op[1], G.LAUNCHING, G.RUNNING)
            eff = policy.preempt_gang(jv, gv, gv.gang.attempt - (1 if op[2] else 0), now, "a higher priority")
        elif kind == "evict":
            gv = _pick(jv, op[1], G.LAUNCHING, G.RUNNING)
            eff = policy.evict_from_hosts(jv, gv, frozenset(t.host for t in gv.members() if t.host), now)
        elif kind == "launch_failed":
            gv = _pick(jv, op[1], G.LAUNCHING)
            # (members may run already: the launch's answer comes after their RUNNING updates)
            eff = policy.launch_failed(jv, gv, now, "no such image", permanent=op[2])
        elif kind == "launch_refused":
            gv = _pick(jv, op[1], G.LAUNCHING, G.PREEMPTING, G.ABORTING)
            if all(t.state not in (T.RUNNING, T.STARTING, T.LAUNCHED, T.SUCCEEDED) for t in gv.members()):
                eff = policy.launch_refused(jv, gv, gv.gang.attempt, now, "claim expired")
        elif kind == "resmgr_refused":
            if op[2]:
                continue  # rare: it fails the job
            gv = gvs[op[1] % len(gvs)]
            held.discard((gv.gang.gang_id, gv.gang.attempt))  # it refused its enqueue (or adoption): holds nothing
            eff = policy.refused_by_resmgr(jv, gv, gv.gang.attempt, now, "no such pool")
        elif kind == "deadline":
            for gv in gvs:
                eff.merge(policy.check_launch_deadline(jv, gv, now + op[1]))
        elif kind == "max_runtime":
            for gv in gvs:
                eff.merge(policy.check_max_runtime(jv, gv, now + op[1]))
        elif kind == "stop":
            if op[1] == 0:
                eff = policy.stop_job(jv, now)
            elif op[1] <= 3:  # the first commit of a stop in ranges: the rest come later (a crash may cut them)
                eff = policy.stop_job(jv, now, range(0, op[1]))
        elif kind == "restart":
            if op[2]:
                held.clear()
            jv = _reload(jv)
            before = _records(jv)
            found = {}
            for gv in jv.gangs.values():
                if gv.gang.state.active:
                    for t in gv.members():
                        s_ = op[1][t.instance % 4]
                        if s_ is not None and not t.state.terminal:
                            found[t.task_id] = TaskStatus(t.task_id, s_, now, hostname="h")
            eff = policy.recover(jv, found, now)
            if policy.needs_stopping(jv):  # the reconciler finishes a stop cut short
                eff.merge(policy.stop_job(jv, now))
        _send(held, jv, eff)
        _check_tracked(before, jv, eff)
        _check_counters(jv)
        # a member recorded as being stopped has been told (else only the reconciler would, 10 s on)
        for tid in eff.kill:  # never a member the records count on: one being stopped, over, or never launched
            _, inst, att = policy.parse_task_id(tid)
            t = jv.tasks[inst]
            assert att != t.attempt or t.state in (T.KILLING, T.PENDING, *TASK_TERMINAL), (t, op)
        killed.update(eff.kill)
        preempted.update(tid for tid, _ in eff.preempt)
        for gv in jv.gangs.values():
            for t in gv.members():
                assert t.state != T.KILLING or t.task_id in killed | preempted, (t, op)
                assert t.state != T.PREEMPTING or t.task_id in preempted, (t, op)
        _check_step(jv, eff, stopped, failed, max_attempts)
        if stopped or failed:  # a stopped or failed job starts no new attempt
            assert {i: gv.gang.attempt for i, gv in jv.gangs.items()} == attempts, (attempts, op)
        # peloton_jobmgr_gang_restarts_total counts each new attempt a failure started (not a preemption's new run)
        restarted = sum(gv.gang.attempt - attempts[i] - (gv.gang.preemptions - preemptions[i])
                        for i, gv in jv.gangs.items())
        assert eff.restarts == restarted, (eff.restarts, restarted, op)
        # a gang that began to run whole is timed once (the launch and submission-to-running histograms)
        began = sum(1 for i, gv in jv.gangs.items()  # (or DONE, every member succeeded straight from LAUNCHING)
                    if states_before[i] == G.LAUNCHING and (gv.gang.state == G.RUNNING or (
                        gv.gang.state == G.DONE and all(t.state == T.SUCCEEDED for t in gv.members()))))
        assert len(eff.started) == began or kind == "restart", (eff.started, began, op)
        stopped = jv.job.desired == "KILLED"
        failed = failed or (jv.job.state in (J.FAILING, J.FAILED))
        attempts = {i: gv.gang.attempt for i, gv in jv.gangs.items()}
        preemptions = {i: gv.gang.preemptions for i, gv in jv.gangs.items()}

    # the events stop, the backend confirms
    now = _quiesce(jv, now, stopped, failed, held)
    # resmgr holds each open gang's current attempt (queued, or its allocation counted), and nothing else: a gang
    # it lacks would wait for the queue check (or never be placed), one it holds in vain keeps its pool's share
    open_ = {(gv.gang.gang_id, gv.gang.attempt) for gv in jv.gangs.values() if gv.gang.state != G.DONE}
    assert held == open_, (held, open_)
    job = jv.job
    event(f"final {job.state} preempted={any(gv.gang.preemptions for gv in jv.gangs.values())} "
          f"maxatt={max(gv.gang.attempt for gv in jv.gangs.values())}")
    left = {gv.gang.index: (gv.gang.state, [t.state for t in gv.members()]) for gv in jv.gangs.values()}
    if job.desired == "KILLED" or failed:
        assert job.state in (J.KILLED, J.FAILED, J.SUCCEEDED), (job.state, left)
    if job.state.terminal:
        assert all(gv.gang.state == G.DONE for gv in jv.gangs.values()), left
        return
    # not over: every gang runs whole, waits in its queue for a run to come (saying why), or is done
    for gv in jv.gangs.values():
        g = gv.gang
        assert g.state in (G.RUNNING, G.QUEUED, G.PREEMPTED, G.DONE), left
        if g.state == G.RUNNING:
            assert all(t.state in (T.RUNNING, T.SUCCEEDED) for t in gv.members()), left
        if g.state.waiting:
            assert all(t.state == T.PENDING for t in gv.members()) and g.reason, left
    assert job.desired == "RUNNING" and job.state in (J.RUNNING, J.PENDING), (job.state, left)
    # a job whose gangs are all done is over
    assert any(gv.gang.state != G.DONE for gv in jv.gangs.values()), (job.state, left)


def test_recovery_sends_no_enqueue_of_a_queued_gang_that_a_later_gang_failed_with_the_job() -> None:
    """Found by the walk above: recovery re-enqueues queued gang 0, then finds gang 1's launch partial with no
    attempt left, which fails the job and stops gang 0 (DONE, released). Sent as recorded, the enqueue went after
    the release (the sender sends releases first) and queued a gang that was over."""
    spec = make_spec(2, min_available=1, max_attempts=1)
    jv = policy.new_job_view(*policy.new_job_records(JOB, spec, T0))
    assert _place(jv, 1, T0 + 1) is not None
    jv = _reload(jv)
    eff = policy.recover(jv, {}, T0 + 3)  # the backend knows nothing of gang 1's members
    assert jv.gangs[0].gang.state == G.DONE and (jv.gangs[0].gang.gang_id, 1) in eff.release
    assert policy.to_send({JOB: jv}, eff) == ([], [])
