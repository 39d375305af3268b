"""gang_policy: the pure goal-state rules of gangs and jobs, as table tests and Hypothesis properties."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from peloton.domain.launch import TaskStatus
from peloton.domain.model import Gang, Job, Task, gang_id_for, task_id_for
from peloton.domain.placement import GangPlacement, MemberAssignment
from peloton.domain.resources import Resources
from peloton.domain.spec import JobSpec
from peloton.domain.states import TASK_TERMINAL, GangState, JobState, TaskState
from peloton.jobmgr import gang_policy as policy
from peloton.jobmgr.gang_policy import Effects, GangView, JobView
from tests.unit.test_states import DOC_JOB

G, T, J = GangState, TaskState, JobState
JOB = "job1"
T0 = 1000.0


# --- helpers ------------------------------------------------------------------------------------------------
def make_spec(instances: int = 3, **kw: object) -> JobSpec:
    base: dict[str, object] = dict(name="train", instances=instances, command="sleep 1",
                                   resources=Resources(cpu=1, mem=256), launch_timeout_s=60.0)
    base.update(kw)
    return JobSpec(**base)  # type: ignore[arg-type]


def make_view(spec: JobSpec | None = None, now: float = T0) -> JobView:
    spec = spec or make_spec()
    return policy.new_job_view(*policy.new_job_records(JOB, spec, now))


def place(jv: JobView, idx: int = 0, now: float = T0 + 1) -> GangView:
    """What the launcher does for an accepted placement: the write-ahead intent."""
    gv = jv.gangs[idx]
    g = gv.gang
    assert g.state.waiting
    members = tuple(MemberAssignment(t.instance, t.task_id, f"host-{t.instance}", "127.0.0.1", jv.spec.resources,
                                     (), (31000 + t.instance,)) for t in gv.members())
    eff = policy.launch_intent(jv, GangPlacement(g.gang_id, JOB, g.attempt, members), now)
    assert eff is not None
    return gv


def status(jv: JobView, instance: int, state: TaskState, *, attempt: int | None = None, exit_code: int | None = None,
           message: str = "", permanent: bool = False, now: float = T0 + 2) -> TaskStatus:
    gv = next(g for g in jv.gangs.values() if instance in g.tasks)
    a = gv.tasks[instance].attempt if attempt is None else attempt
    if exit_code is None and state == T.FAILED:
        exit_code = 1
    return TaskStatus(task_id_for(jv.job.id, instance, a), state, now, hostname=f"host-{instance}",
                      exit_code=exit_code, message=message, permanent=permanent)


def apply(jv: JobView, instance: int, state: TaskState, now: float = T0 + 2, **kw: object) -> Effects:
    return policy.apply_status(jv, status(jv, instance, state, now=now, **kw), now)  # type: ignore[arg-type]


def run_all(jv: JobView, idx: int = 0, now: float = T0 + 2) -> Effects:
    eff = Effects()
    for i in jv.gangs[idx].gang.instances:
        eff.merge(apply(jv, i, T.RUNNING, now))
    return eff


def states(gv: GangView) -> list[TaskState]:
    return [t.state for t in gv.members()]


def snapshot(jv: JobView) -> tuple[Job, list[tuple[Gang, list[Task]]]]:
    return dataclasses.replace(jv.job, spec=jv.spec), [
        (dataclasses.replace(gv.gang, instances=list(gv.gang.instances)),
         [dataclasses.replace(t, ports=list(t.ports), gpu_ids=list(t.gpu_ids)) for t in gv.members()])
        for gv in jv.gangs.values()
    ]


def _states_only(snap: tuple[Job, list[tuple[Gang, list[Task]]]]) -> object:
    job, gangs = snap
    return job.state, job.reason, [(g.state, g.attempt, g.reason, [(t.state, t.attempt, t.exit_code, t.host)
                                                                   for t in ts]) for g, ts in gangs]


# --- records ------------------------------------------------------------------------------------------------
def test_new_job_records_make_one_queued_gang_of_every_instance() -> None:
    job, gangs, tasks = policy.new_job_records(JOB, make_spec(4), T0)
    assert job.state == J.PENDING and job.desired == "RUNNING" and job.created_at == T0
    assert len(gangs) == 1
    g = gangs[0]
    assert (g.index, g.instances, g.state, g.attempt) == (0, [0, 1, 2, 3], G.QUEUED, 1)
    assert g.gang_id == gang_id_for(JOB, 0) == "job1/0"
    assert [(t.instance, t.gang_index, t.attempt, t.state) for t in tasks] == [(i, 0, 1, T.PENDING) for i in range(4)]
    assert tasks[2].task_id == "job1-2-1"


def test_elastic_job_has_a_gang_of_min_available_plus_single_member_gangs() -> None:
    job, gangs, tasks = policy.new_job_records(JOB, make_spec(5, min_available=2), T0)
    assert [g.instances for g in gangs] == [[0, 1], [2], [3], [4]]
    assert [g.index for g in gangs] == [0, 1, 2, 3]
    assert {t.instance: t.gang_index for t in tasks} == {0: 0, 1: 0, 2: 1, 3: 2, 4: 3}
    assert all(g.state == G.QUEUED and g.attempt == 1 for g in gangs)


@pytest.mark.parametrize("task_id,expected", [
    ("abc-0-1", ("abc", 0, 1)),
    ("a-b-c-12-3", ("a-b-c", 12, 3)),
    ("0123456789ab-7-42", ("0123456789ab", 7, 42)),
])
def test_parse_task_id(task_id: str, expected: tuple[str, int, int]) -> None:
    assert policy.parse_task_id(task_id) == expected
    assert task_id_for(*expected) == task_id


@pytest.mark.parametrize("bad", ["nodashes", "a-b", "job-x-1", "job-1-y"])
def test_parse_task_id_rejects_malformed(bad: str) -> None:
    with pytest.raises(ValueError):
        policy.parse_task_id(bad)


# --- the happy path -----------------------------------------------------------------------------------------
def test_gang_runs_only_when_every_member_runs_then_job_runs() -> None:
    jv = make_view()
    gv = place(jv)
    assert gv.gang.state == G.LAUNCHING and jv.job.state == J.PENDING
    apply(jv, 0, T.RUNNING)
    apply(jv, 1, T.RUNNING)
    assert gv.gang.state == G.LAUNCHING and jv.job.state == J.PENDING
    eff = apply(jv, 2, T.RUNNING, now=T0 + 5)
    assert gv.gang.state == G.RUNNING and jv.job.state == J.RUNNING
    assert states(gv) == [T.RUNNING] * 3
    assert gv.tasks[2].started_at == T0 + 5
    assert eff.kill == [] and eff.enqueue == [] and eff.release == []
    assert [(e.instance, e.state) for e in eff.events] == [(2, T.RUNNING)]


def test_job_succeeds_only_when_every_task_succeeded() -> None:
    jv = make_view()
    gv = place(jv)
    run_all(jv)
    apply(jv, 0, T.SUCCEEDED)
    apply(jv, 1, T.SUCCEEDED)
    assert jv.job.state == J.RUNNING and gv.gang.state == G.RUNNING
    eff = apply(jv, 2, T.SUCCEEDED, now=T0 + 9)
    assert gv.gang.state == G.DONE
    assert jv.job.state == J.SUCCEEDED and jv.job.completed_at == T0 + 9
    assert eff.release == [(gang_id_for(JOB, 0), 1)]
    assert all(t.exit_code == 0 and t.finished_at == T0 + 9 for t in gv.members() if t.instance == 2)


def test_members_succeeding_before_all_run_still_count_as_running() -> None:
    jv = make_view()
    gv = place(jv)
    apply(jv, 0, T.SUCCEEDED)
    assert gv.gang.state == G.LAUNCHING
    apply(jv, 1, T.RUNNING)
    apply(jv, 2, T.RUNNING)
    assert gv.gang.state == G.RUNNING and jv.job.state == J.RUNNING


def test_all_members_succeeding_straight_from_launching_finish_the_job() -> None:
    jv = make_view(make_spec(2))
    gv = place(jv)
    apply(jv, 0, T.SUCCEEDED)
    apply(jv, 1, T.SUCCEEDED)
    assert gv.gang.state == G.DONE and jv.job.state == J.SUCCEEDED


def test_elastic_job_runs_when_its_core_gang_runs_and_succeeds_when_all_tasks_do() -> None:
    jv = make_view(make_spec(4, min_available=2))
    place(jv, 0)
    run_all(jv, 0)
    assert jv.job.state == J.RUNNING
    assert len(jv.gangs) == 3
    for idx in (1, 2):
        place(jv, idx)
        run_all(jv, idx)
    for i in range(4):
        apply(jv, i, T.SUCCEEDED)
    assert all(gv.gang.state == G.DONE for gv in jv.gangs.values())
    assert jv.job.state == J.SUCCEEDED


def test_job_is_not_succeeded_when_a_member_was_killed_and_the_rest_succeeded() -> None:
    jv = make_view(make_spec(3, min_available=1, on_member_failure="restart_gang", max_attempts=1))
    for idx in range(3):
        place(jv, idx)
        run_all(jv, idx)
    apply(jv, 0, T.SUCCEEDED)
    apply(jv, 1, T.SUCCEEDED)
    apply(jv, 2, T.FAILED)
    assert jv.job.state == J.FAILED


# --- failures -----------------------------------------------------------------------------------------------
def test_member_failure_restarts_the_whole_gang_as_a_new_attempt() -> None:
    jv = make_view()
    gv = place(jv)
    run_all(jv)
    old_ids = [t.task_id for t in gv.members()]
    eff = apply(jv, 1, T.FAILED, now=T0 + 10, message="exit code 3", exit_code=3)
    assert sorted(eff.kill) == sorted([old_ids[0], old_ids[2]])
    assert eff.release == [(gang_id_for(JOB, 0), 1)]
    assert eff.enqueue == [(JOB, 0)]
    assert eff.restarts == 1
    g = gv.gang
    assert g.state == G.QUEUED and g.attempt == 2 and g.launch_deadline == 0.0
    assert "member 1 FAILED" in g.reason and "attempt 2" in g.reason
    for t in gv.members():
        assert (t.state, t.attempt, t.host, t.ports, t.exit_code) == (T.PENDING, 2, "", [], None)
        assert t.started_at == t.finished_at == 0.0
    assert [t.task_id for t in gv.members()] == [task_id_for(JOB, i, 2) for i in range(3)]
    assert jv.job.state == J.PENDING
    # the failure is recorded in the events under the old attempt, then the new attempt is pending
    failed = [e for e in eff.events if e.state == T.FAILED]
    assert [(e.instance, e.attempt, e.exit_code) for e in failed] == [(1, 1, 3)]
    assert {(e.instance, e.attempt) for e in eff.events if e.state == T.PENDING} == {(0, 2), (1, 2), (2, 2)}


@pytest.mark.parametrize("state", [T.FAILED, T.LOST, T.KILLED])
def test_any_unexpected_member_end_restarts_the_gang(state: TaskState) -> None:
    jv = make_view()
    gv = place(jv)
    run_all(jv)
    eff = apply(jv, 0, state)
    assert gv.gang.state == G.QUEUED and gv.gang.attempt == 2
    assert eff.enqueue == [(JOB, 0)]
    assert sorted(eff.kill) == [task_id_for(JOB, 1, 1), task_id_for(JOB, 2, 1)]


def test_restart_leaves_other_gangs_of_an_elastic_job_alone() -> None:
    jv = make_view(make_spec(3, min_available=2))
    place(jv, 0)
    run_all(jv, 0)
    place(jv, 1)
    run_all(jv, 1)
    eff = apply(jv, 0, T.FAILED)
    assert jv.gangs[0].gang.state == G.QUEUED and jv.gangs[0].gang.attempt == 2
    assert jv.gangs[1].gang.state == G.RUNNING and states(jv.gangs[1]) == [T.RUNNING]
    assert eff.kill == [task_id_for(JOB, 1, 1)]
    assert jv.job.state == J.RUNNING  # gang 1 still runs


def test_attempts_exhausted_fails_the_job_once_every_member_is_terminal() -> None:
    jv = make_view(make_spec(3, max_attempts=2))
    gv = place(jv)
    run_all(jv)
    apply(jv, 0, T.FAILED)
    assert gv.gang.attempt == 2
    place(jv)
    run_all(jv)
    eff = apply(jv, 2, T.FAILED, message="boom")
    assert gv.gang.state == G.ABORTING and gv.gang.attempt == 2
    assert eff.enqueue == [] and eff.restarts == 0
    assert sorted(eff.kill) == [task_id_for(JOB, 0, 2), task_id_for(JOB, 1, 2)]
    assert states(gv) == [T.KILLING, T.KILLING, T.FAILED]
    assert jv.job.state == J.FAILING  # not PENDING: no attempt is coming
    assert "gang 0" in jv.job.reason and "attempt 2 of 2" in jv.job.reason and "boom" in jv.job.reason
    apply(jv, 0, T.KILLED)
    assert gv.gang.state == G.ABORTING and jv.job.state == J.FAILING
    eff = apply(jv, 1, T.KILLED, now=T0 + 20)
    assert states(gv) == [T.KILLED, T.KILLED, T.FAILED]
    assert gv.gang.state == G.DONE and eff.release == [(gang_id_for(JOB, 0), 2)]
    assert jv.job.state == J.FAILED and jv.job.completed_at == T0 + 20
    assert "gang 0" in jv.job.reason
    # what the log says once committed: the job's end, with its id for the JSON log's field
    (note,) = [n for n in eff.notes if n.text.startswith(f"job {JOB}")]
    assert (note.level, note.job_id) == ("warning", JOB) and note.text.startswith(f"job {JOB} FAILED: gang 0")


def test_the_log_notes_say_a_failed_gang_was_queued_again_and_a_new_run_began() -> None:
    jv = make_view()
    gv = place(jv)
    eff = run_all(jv)
    assert [(n.level, n.text) for n in eff.notes] == [("debug", f"gang {gang_id_for(JOB, 0)} attempt 1 running")]
    eff = apply(jv, 1, T.FAILED, now=T0 + 10, message="exit code 3", exit_code=3)
    (note,) = eff.notes
    assert note.level == "info" and note.gang_id == gang_id_for(JOB, 0) and note.job_id == JOB
    assert note.text.startswith(f"gang {gang_id_for(JOB, 0)} attempt 2 queued again: ") and "member 1 FAILED" in note.text
    assert gv.gang.attempt == 2


def test_fail_job_policy_fails_on_the_first_member_failure_and_stops_other_gangs() -> None:
    jv = make_view(make_spec(4, min_available=2, on_member_failure="fail_job", max_attempts=5))
    assert [gv.gang.instances for gv in jv.gangs.values()] == [[0, 1], [2], [3]]
    place(jv, 0)
    run_all(jv, 0)
    place(jv, 1)
    run_all(jv, 1)
    # gang 2 is still queued
    eff = apply(jv, 1, T.FAILED, message="segfault")
    assert jv.gangs[0].gang.state == G.ABORTING and jv.gangs[0].gang.attempt == 1
    assert "gang 0 failed" in jv.job.reason and "segfault" in jv.job.reason
    assert jv.gangs[1].gang.state == G.ABORTING
    assert sorted(eff.kill) == [task_id_for(JOB, 0, 1), task_id_for(JOB, 2, 1)]
    assert jv.gangs[2].gang.state == G.DONE and states(jv.gangs[2]) == [T.KILLED]
    assert (gang_id_for(JOB, 2), 1) in eff.release
    assert eff.enqueue == []
    assert jv.job.state == J.FAILING
    apply(jv, 0, T.KILLED)
    assert jv.job.state == J.FAILING
    apply(jv, 2, T.KILLED)
    assert jv.job.state == J.FAILED
    assert jv.job.reason.startswith("gang 0 failed")


def job_states_through(jv: JobView, steps: list[Callable[[], object]]) -> list[str]:
    """The job states after each step, without repeats (what `job wait` prints)."""
    seen = [jv.job.state.value]
    for step in steps:
        step()
        if jv.job.state.value != seen[-1]:
            seen.append(jv.job.state.value)
    return seen


def test_the_last_attempt_torn_down_is_failing_never_pending() -> None:
    """max_attempts 2, a member fails each time: a restart is PENDING (its next attempt is queued), the last
    failure FAILING until every member has ended, then FAILED."""
    jv = make_view(make_spec(2, max_attempts=2))
    seen = job_states_through(jv, [
        lambda: place(jv), lambda: run_all(jv),
        lambda: apply(jv, 0, T.FAILED, now=T0 + 3),  # attempt 2 queued at once
        lambda: place(jv, now=T0 + 4), lambda: run_all(jv, now=T0 + 5),
        lambda: apply(jv, 0, T.FAILED, now=T0 + 6),  # no attempt left: instance 1 is being killed
        lambda: apply(jv, 1, T.KILLED, now=T0 + 7),
    ])
    assert seen == ["PENDING", "RUNNING", "PENDING", "RUNNING", "FAILING", "FAILED"]


def test_a_failing_job_stopped_meanwhile_still_ends_failed() -> None:
    jv = make_view(make_spec(2, max_attempts=1))
    place(jv)
    run_all(jv)
    apply(jv, 0, T.FAILED, now=T0 + 3)
    assert jv.job.state == J.FAILING
    policy.stop_job(jv, T0 + 4)
    assert jv.job.state == J.FAILING and jv.job.desired == "KILLED"
    apply(jv, 1, T.KILLED, now=T0 + 5)
    assert jv.job.state == J.FAILED and "failed" in jv.job.reason


def test_a_member_that_exits_0_while_its_failed_gang_is_killed_does_not_make_the_job_succeed() -> None:
    """The launch deadline failed the gang; the slow member then ended well: the job still failed (its reason
    says why), not SUCCEEDED."""
    jv = make_view(make_spec(1, max_attempts=1))
    place(jv)
    policy.check_launch_deadline(jv, jv.gangs[0], T0 + 1000)
    assert jv.job.state == J.FAILING
    apply(jv, 0, T.SUCCEEDED, now=T0 + 1001)
    assert jv.job.state == J.FAILED and "launch timeout" in jv.job.reason


def test_a_stored_failing_job_stays_failing_through_recovery() -> None:
    jv = make_view(make_spec(2, max_attempts=1))
    place(jv)
    run_all(jv)
    apply(jv, 0, T.FAILED, now=T0 + 3)
    assert jv.job.state == J.FAILING
    policy.recover(jv, {task_id_for(JOB, 1, 1): TaskStatus(task_id_for(JOB, 1, 1), T.RUNNING, T0 + 9)}, T0 + 9)
    assert jv.job.state == J.FAILING and jv.gangs[0].gang.state == G.ABORTING
    apply(jv, 1, T.KILLED, now=T0 + 10)
    assert jv.job.state == J.FAILED


def test_permanent_failure_is_never_retried() -> None:
    jv = make_view(make_spec(2, max_attempts=5))
    gv = place(jv)
    eff = apply(jv, 0, T.FAILED, permanent=True, message="bad image")
    assert gv.gang.state == G.ABORTING and gv.gang.attempt == 1 and eff.enqueue == []
    assert "not be retried" in jv.job.reason and "bad image" in jv.job.reason
    apply(jv, 1, T.KILLED)
    assert jv.job.state == J.FAILED


def test_stale_attempt_running_status_kills_that_task_and_changes_nothing_else() -> None:
    jv = make_view()
    place(jv)
    run_all(jv)
    apply(jv, 0, T.FAILED)
    before = snapshot(jv)
    st = status(jv, 2, T.RUNNING, attempt=1)
    eff = policy.apply_status(jv, st, T0 + 30)
    assert eff.kill == [task_id_for(JOB, 2, 1)]
    assert eff.release == eff.enqueue == eff.adopt == []
    assert [(e.instance, e.attempt, e.state) for e in eff.events] == [(2, 1, T.RUNNING)]
    assert snapshot(jv) == before


@pytest.mark.parametrize("state", [T.SUCCEEDED, T.FAILED, T.LOST, T.KILLED])
def test_stale_attempt_terminal_status_only_records_history(state: TaskState) -> None:
    jv = make_view()
    place(jv)
    run_all(jv)
    apply(jv, 0, T.FAILED)
    before = snapshot(jv)
    eff = policy.apply_status(jv, status(jv, 1, state, attempt=1), T0 + 30)
    assert eff.kill == eff.release == eff.enqueue == []
    assert [(e.attempt, e.state) for e in eff.events] == [(1, state)]
    assert snapshot(jv) == before


def test_status_for_unknown_instance_is_ignored() -> None:
    jv = make_view(make_spec(2))
    place(jv)
    before = snapshot(jv)
    eff = policy.apply_status(jv, TaskStatus(task_id_for(JOB, 9, 1), T.RUNNING, T0), T0)
    assert eff == Effects() and snapshot(jv) == before


@pytest.mark.parametrize("state", [T.RUNNING, T.SUCCEEDED, T.FAILED, T.KILLED, T.LOST])
def test_duplicate_statuses_are_idempotent(state: TaskState) -> None:
    jv = make_view()
    place(jv)
    run_all(jv)
    st_ = status(jv, 0, state, now=T0 + 5)  # the same task id both times
    policy.apply_status(jv, st_, T0 + 5)
    after_first = snapshot(jv)
    second = policy.apply_status(jv, st_, T0 + 6)
    assert _states_only(snapshot(jv)) == _states_only(after_first)
    assert second.kill == second.release == second.enqueue == second.adopt == []



def test_duplicate_running_status_records_no_second_event() -> None:
    jv = make_view()
    place(jv)
    run_all(jv)
    st_ = status(jv, 0, T.RUNNING, now=T0 + 5)
    before = snapshot(jv)
    eff = policy.apply_status(jv, st_, T0 + 6)
    assert eff.events == []
    assert snapshot(jv) == before


def test_duplicate_success_after_job_succeeded_changes_nothing() -> None:
    jv = make_view(make_spec(1))
    place(jv)
    apply(jv, 0, T.SUCCEEDED)
    assert jv.job.state == J.SUCCEEDED
    before = snapshot(jv)
    for s in (T.SUCCEEDED, T.FAILED, T.RUNNING, T.KILLED):
        eff = apply(jv, 0, s)
        assert eff.kill == eff.release == eff.enqueue == [] and eff.events == []
    assert snapshot(jv) == before


# --- stopping -----------------------------------------------------------------------------------------------
def test_stop_job_on_a_queued_gang_kills_nothing_and_ends_killed() -> None:
    jv = make_view()
    eff = policy.stop_job(jv, T0 + 3)
    gv = jv.gangs[0]
    assert jv.job.desired == "KILLED"
    assert states(gv) == [T.KILLED] * 3 and gv.gang.state == G.DONE
    assert eff.kill == [] and eff.release == [(gang_id_for(JOB, 0), 1)] and eff.enqueue == []
    assert jv.job.state == J.KILLED and jv.job.completed_at == T0 + 3
    assert {e.state for e in eff.events} == {T.KILLED}


def test_stop_job_on_a_running_gang_kills_members_then_ends_killed() -> None:
    jv = make_view()
    gv = place(jv)
    run_all(jv)
    eff = policy.stop_job(jv, T0 + 3)
    assert sorted(eff.kill) == [task_id_for(JOB, i, 1) for i in range(3)]
    assert states(gv) == [T.KILLING] * 3 and gv.gang.state == G.ABORTING
    assert eff.release == [] and eff.enqueue == []
    assert jv.job.state == J.KILLING
    apply(jv, 0, T.KILLED)
    apply(jv, 1, T.FAILED, exit_code=143)  # a member exiting non-zero on SIGTERM
    assert jv.job.state == J.KILLING
    eff = apply(jv, 2, T.LOST)
    assert states(gv) == [T.KILLED, T.FAILED, T.KILLED]
    assert gv.gang.state == G.DONE and eff.release == [(gang_id_for(JOB, 0), 1)] and eff.enqueue == []
    assert jv.job.state == J.KILLED and gv.gang.attempt == 1


def test_a_user_stop_is_not_logged_as_a_failure_while_a_real_failure_still_is() -> None:
    """A stopped gang goes through ABORTING as a failed one does; the log must not call it failed (a warning per
    gang per stop drowned the real failures)."""
    jv = make_view(make_spec(4, min_available=2))
    for i in range(len(jv.gangs)):
        place(jv, i)
        run_all(jv, i)
    eff = policy.stop_job(jv, T0 + 3)
    gang_notes = [n for n in eff.notes if n.gang_id]
    assert gang_notes and all(n.level == "debug" and " stopped: job stopped" in n.text for n in gang_notes)
    assert not [n for n in eff.notes if n.level == "warning"]
    queued = make_view()  # a gang stopped while still queued: DONE at once, quietly too
    eff = policy.stop_job(queued, T0 + 3)
    assert [(n.level, n.text) for n in eff.notes if n.gang_id] == [
        ("debug", f"gang {gang_id_for(JOB, 0)} attempt 1 stopped: job stopped")]
    failing = make_view(make_spec(4, min_available=2, on_member_failure="fail_job"))
    for i in range(len(failing.gangs)):
        place(failing, i)
        run_all(failing, i)
    eff = apply(failing, 1, T.FAILED, message="segfault")
    warnings = [n.text for n in eff.notes if n.level == "warning"]
    assert any(" failed: " in w and "segfault" in w for w in warnings)  # the failed gang and the job
    assert all("job failed" not in w for w in warnings)  # the gangs stopped because of it are not warnings


def test_stop_job_twice_and_on_a_finished_job_is_a_no_op() -> None:
    jv = make_view()
    place(jv)
    run_all(jv)
    policy.stop_job(jv, T0 + 3)
    before = snapshot(jv)
    eff = policy.stop_job(jv, T0 + 4)
    assert eff.kill == [] and eff.release == [] and eff.enqueue == []
    assert snapshot(jv) == before
    for i in range(3):
        apply(jv, i, T.KILLED)
    assert jv.job.state == J.KILLED
    before = snapshot(jv)
    assert policy.stop_job(jv, T0 + 5) == Effects()
    assert snapshot(jv) == before


def test_stop_job_a_range_at_a_time_gives_up_every_queued_gang_first() -> None:
    jv = make_view(make_spec(5, min_available=1))  # five gangs of one
    place(jv, 0)
    run_all(jv, 0)
    assert not policy.needs_stopping(jv)
    eff = policy.stop_job(jv, T0 + 3, range(0, 2))
    assert jv.job.desired == "KILLED" and jv.job.state == J.KILLING
    assert eff.kill == [task_id_for(JOB, 0, 1)]
    assert [jv.gangs[i].gang.state for i in range(5)] == [G.ABORTING, G.DONE, G.QUEUED, G.QUEUED, G.QUEUED]
    # gang 1 stopped now; 2..4 given up by the queue at once, marked DONE when their range comes
    assert sorted(eff.release) == [(gang_id_for(JOB, i), 1) for i in range(1, 5)]
    assert policy.needs_stopping(jv)
    eff = policy.stop_job(jv, T0 + 4, range(2, 4))
    assert sorted(eff.release) == [(gang_id_for(JOB, i), 1) for i in (2, 3)]  # no second mass release
    assert not eff.jobs  # KILLED was desired already
    eff = policy.stop_job(jv, T0 + 4, range(4, 6))  # past the last gang: only what exists
    assert [jv.gangs[i].gang.state for i in range(5)] == [G.ABORTING] + [G.DONE] * 4
    assert not policy.needs_stopping(jv) and jv.job.state == J.KILLING
    apply(jv, 0, T.KILLED, now=T0 + 5)
    assert jv.job.state == J.KILLED and not policy.needs_stopping(jv)


def test_member_coming_up_after_stop_is_killed() -> None:
    jv = make_view(make_spec(2))
    gv = place(jv)
    apply(jv, 0, T.RUNNING)
    policy.stop_job(jv, T0 + 3)
    # the member was LAUNCHING, so it is KILLING; its late RUNNING does not resurrect it
    eff = apply(jv, 1, T.RUNNING)
    assert gv.tasks[1].state == T.KILLING and eff.kill == []
    assert gv.gang.state == G.ABORTING


def test_stop_job_with_a_failure_in_flight_does_not_restart() -> None:
    jv = make_view()
    gv = place(jv)
    run_all(jv)
    policy.stop_job(jv, T0 + 3)
    eff = apply(jv, 0, T.FAILED)
    assert eff.enqueue == [] and gv.gang.attempt == 1 and gv.tasks[0].state == T.FAILED


# --- launch failures and deadlines --------------------------------------------------------------------------
def test_launch_failed_counts_as_a_failed_attempt() -> None:
    jv = make_view()
    gv = place(jv)
    eff = policy.launch_failed(jv, gv, T0 + 2, "no such file")
    assert gv.gang.state == G.QUEUED and gv.gang.attempt == 2
    assert eff.enqueue == [(JOB, 0)] and eff.release == [(gang_id_for(JOB, 0), 1)] and eff.kill == []
    assert "launch failed: no such file" in gv.gang.reason
    assert {(e.attempt, e.state) for e in eff.events if e.attempt == 1} == {(1, T.FAILED)}


def test_launch_failed_on_last_attempt_fails_the_job() -> None:
    jv = make_view(make_spec(2, max_attempts=1))
    gv = place(jv)
    eff = policy.launch_failed(jv, gv, T0 + 2, "no such file")
    assert gv.gang.state == G.DONE and jv.job.state == J.FAILED
    assert eff.enqueue == [] and eff.release == [(gang_id_for(JOB, 0), 1)]
    assert "launch failed" in jv.job.reason


@pytest.mark.parametrize("gstate", [G.QUEUED, G.RUNNING, G.DONE])
def test_launch_failed_ignores_gangs_not_launching(gstate: GangState) -> None:
    jv = make_view()
    gv = jv.gangs[0]
    if gstate != G.QUEUED:
        place(jv)
        run_all(jv)
    if gstate == G.DONE:
        for i in range(3):
            apply(jv, i, T.SUCCEEDED)
    assert gv.gang.state == gstate
    before = snapshot(jv)
    assert policy.launch_failed(jv, gv, T0 + 5, "x") == Effects()
    assert snapshot(jv) == before


def test_launch_deadline_before_and_after() -> None:
    jv = make_view()  # launch_timeout_s = 60
    gv = place(jv, now=T0)
    apply(jv, 0, T.RUNNING)
    before = snapshot(jv)
    assert policy.check_launch_deadline(jv, gv, T0 + 59.9) == Effects()
    assert snapshot(jv) == before
    eff = policy.check_launch_deadline(jv, gv, T0 + 60)
    assert gv.gang.state == G.QUEUED and gv.gang.attempt == 2
    assert eff.kill == [task_id_for(JOB, 0, 1), task_id_for(JOB, 1, 1), task_id_for(JOB, 2, 1)] or \
        sorted(eff.kill) == sorted(task_id_for(JOB, i, 1) for i in range(3))
    assert eff.enqueue == [(JOB, 0)]
    assert "launch timeout" in gv.gang.reason and "[1, 2]" in gv.gang.reason and "60s" in gv.gang.reason


def test_launch_deadline_ignored_once_running_or_without_a_deadline() -> None:
    jv = make_view()
    gv = place(jv, now=T0)
    run_all(jv)
    assert policy.check_launch_deadline(jv, gv, T0 + 1e6) == Effects()
    jv2 = make_view()
    gv2 = place(jv2, now=T0)
    gv2.gang.launch_deadline = 0.0
    assert policy.check_launch_deadline(jv2, gv2, T0 + 1e6) == Effects()
    jv3 = make_view()
    assert policy.check_launch_deadline(jv3, jv3.gangs[0], T0 + 1e6) == Effects()


def test_launch_deadline_on_the_last_attempt_fails_the_job() -> None:
    jv = make_view(make_spec(2, max_attempts=1))
    gv = place(jv, now=T0)
    policy.check_launch_deadline(jv, gv, T0 + 61)
    assert gv.gang.state == G.ABORTING
    assert "launch timeout" in jv.job.reason
    apply(jv, 0, T.KILLED)
    apply(jv, 1, T.KILLED)
    assert jv.job.state == J.FAILED


def test_max_runtime_kills_the_gang_whole_and_fails_the_job_saying_why() -> None:
    jv = make_view(make_spec(3, max_runtime_s=100.0, max_attempts=3))
    gv = place(jv, now=T0)
    apply(jv, 0, T.RUNNING, T0 + 2)
    apply(jv, 1, T.RUNNING, T0 + 2)
    assert policy.running_since(gv) == 0.0  # not running whole yet: no clock
    assert policy.check_max_runtime(jv, gv, T0 + 1e6) == Effects()
    apply(jv, 2, T.RUNNING, T0 + 5)
    assert policy.running_since(gv) == T0 + 5
    assert policy.check_max_runtime(jv, gv, T0 + 104.9) == Effects()
    eff = policy.check_max_runtime(jv, gv, T0 + 105)
    assert sorted(eff.kill) == sorted(task_id_for(JOB, i, 1) for i in range(3))
    assert gv.gang.state == G.ABORTING and gv.gang.attempt == 1  # not retried: another attempt would run as long
    assert "sla.max_runtime exceeded: it ran 100s, the limit is 100s" in jv.job.reason
    for i in range(3):
        apply(jv, i, T.KILLED, T0 + 106)
    assert jv.job.state == J.FAILED


def test_no_max_runtime_means_no_limit() -> None:
    jv = make_view()
    gv = place(jv, now=T0)
    run_all(jv)
    assert policy.check_max_runtime(jv, gv, T0 + 1e9) == Effects()


# --- recovery -----------------------------------------------------------------------------------------------
def _statuses(jv: JobView, per_instance: dict[int, TaskState]) -> dict[str, TaskStatus]:
    out = {}
    for i, s in per_instance.items():
        st = status(jv, i, s)
        out[st.task_id] = st
    return out


def test_recover_adopts_a_gang_whose_members_all_run() -> None:
    jv = make_view()
    gv = place(jv)
    run_all(jv)
    eff = policy.recover(jv, _statuses(jv, {0: T.RUNNING, 1: T.RUNNING, 2: T.RUNNING}), T0 + 100)
    assert eff.adopt == [(JOB, 0)] and eff.kill == [] and eff.enqueue == [] and eff.release == []
    assert gv.gang.state == G.RUNNING and jv.job.state == J.RUNNING


def test_recover_adopts_a_launching_gang_found_running() -> None:
    jv = make_view()
    gv = place(jv)
    eff = policy.recover(jv, _statuses(jv, {0: T.RUNNING, 1: T.RUNNING, 2: T.SUCCEEDED}), T0 + 100)
    assert eff.adopt == [(JOB, 0)]
    assert gv.gang.state == G.RUNNING and states(gv) == [T.RUNNING, T.RUNNING, T.SUCCEEDED]
    assert jv.job.state == J.RUNNING


def test_recover_keeps_a_launching_gang_whose_members_are_all_on_their_way() -> None:
    """A takeover (or restart) in the middle of a launch: every member is known to the backend and starting, so
    the gang goes on launching (same attempt, adopted); the RUNNING updates that follow make it RUNNING."""
    jv = make_view()
    gv = place(jv)
    eff = policy.recover(jv, _statuses(jv, {0: T.STARTING, 1: T.RUNNING, 2: T.LAUNCHED}), T0 + 100)
    assert eff.adopt == [(JOB, 0)] and eff.kill == [] and eff.enqueue == []
    assert gv.gang.state == G.LAUNCHING and gv.gang.attempt == 1
    assert states(gv) == [T.STARTING, T.RUNNING, T.LAUNCHED]
    # one member the backend does not know (its launch never went out): partial, torn down as before
    jv = make_view()
    gv = place(jv)
    eff = policy.recover(jv, _statuses(jv, {0: T.STARTING, 1: T.RUNNING}), T0 + 100)
    assert eff.adopt == [] and eff.enqueue == [(JOB, 0)] and gv.gang.attempt == 2


@pytest.mark.parametrize("before_the_crash", [True, False])
def test_recover_keeps_a_launching_gang_whose_quick_member_already_succeeded(before_the_crash: bool) -> None:
    """Live, a member that exits 0 while the rest are still starting leaves its gang LAUNCHING (it counts as up:
    test_members_succeeding_before_all_run_still_count_as_running). A restart then must not tear the gang down as
    partial: that cost an attempt (with none left, the job failed) for a member that did its work. Whether its
    success was recorded before the crash or is found at recovery."""
    jv = make_view()
    gv = place(jv)
    found = {1: T.RUNNING, 2: T.STARTING}
    if before_the_crash:
        apply(jv, 0, T.SUCCEEDED)
        assert gv.gang.state == G.LAUNCHING
    else:
        found[0] = T.SUCCEEDED
    eff = policy.recover(jv, _statuses(jv, found), T0 + 100)
    assert gv.gang.attempt == 1 and gv.gang.state == G.LAUNCHING, gv.gang.reason
    assert eff.adopt == [(JOB, 0)] and eff.kill == [] and eff.enqueue == []
    assert states(gv) == [T.SUCCEEDED, T.RUNNING, T.STARTING]
    apply(jv, 2, T.RUNNING, now=T0 + 101)  # the last one comes up: the gang runs whole
    assert gv.gang.state == G.RUNNING and jv.job.state == J.RUNNING


def test_recover_names_the_member_that_failed_while_the_daemon_was_down() -> None:
    """A member that exited non-zero while the daemon was down fails its gang as it would have live: its exit
    code is the reason (not "partial"), and a permanent failure is not retried."""
    jv = make_view()
    gv = place(jv)
    run_all(jv)
    ended = status(jv, 1, T.FAILED, exit_code=3, message="exit code 3")
    eff = policy.recover(jv, {**_statuses(jv, {0: T.RUNNING, 2: T.RUNNING}), ended.task_id: ended}, T0 + 100)
    assert sorted(eff.kill) == [task_id_for(JOB, 0, 1), task_id_for(JOB, 2, 1)]
    assert "member 1 FAILED: exit code 3 (while the daemon was down)" in gv.gang.reason
    assert "partial" not in gv.gang.reason
    # members the backend lost with the daemon (no exit code): partial, as before
    jv = make_view()
    gv = place(jv)
    run_all(jv)
    policy.recover(jv, _statuses(jv, {0: T.RUNNING, 1: T.LOST, 2: T.RUNNING}), T0 + 100)
    assert "found partial after daemon restart (members [1] not running)" in (jv.job.reason or gv.gang.reason)


def test_recover_tears_down_a_partial_gang_and_requeues_it() -> None:
    jv = make_view()
    gv = place(jv)
    run_all(jv)
    eff = policy.recover(jv, _statuses(jv, {0: T.RUNNING, 1: T.LOST, 2: T.RUNNING}), T0 + 100)
    assert sorted(eff.kill) == [task_id_for(JOB, 0, 1), task_id_for(JOB, 2, 1)]
    assert eff.adopt == []
    assert eff.enqueue == [(JOB, 0)] and eff.release == [(gang_id_for(JOB, 0), 1)]
    assert gv.gang.state == G.QUEUED and gv.gang.attempt == 2
    assert all(t.state == T.PENDING and t.attempt == 2 for t in gv.members())
    assert "daemon restart" in gv.gang.reason


def test_recover_finishes_a_gang_whose_members_all_succeeded() -> None:
    jv = make_view()
    gv = place(jv)
    run_all(jv)
    eff = policy.recover(jv, _statuses(jv, {i: T.SUCCEEDED for i in range(3)}), T0 + 100)
    assert gv.gang.state == G.DONE and jv.job.state == J.SUCCEEDED
    assert eff.release == [(gang_id_for(JOB, 0), 1)] and eff.kill == [] and eff.enqueue == []



def test_recover_adopts_no_finished_gang() -> None:
    jv = make_view()
    gv = place(jv)
    run_all(jv)
    eff = policy.recover(jv, _statuses(jv, {i: T.SUCCEEDED for i in range(3)}), T0 + 100)
    assert gv.gang.state == G.DONE
    assert eff.adopt == []


def test_recover_requeues_queued_gangs() -> None:
    jv = make_view(make_spec(3, min_available=1))
    place(jv, 0)
    run_all(jv, 0)
    eff = policy.recover(jv, _statuses(jv, {0: T.RUNNING}), T0 + 100)
    assert eff.adopt == [(JOB, 0)]
    assert sorted(eff.enqueue) == [(JOB, 1), (JOB, 2)]
    assert eff.restarts == 0  # re-queueing after a restart of the daemon is not a gang restart
    assert jv.gangs[1].gang.state == G.QUEUED


def test_recover_of_a_stopped_job_finishes_the_stop() -> None:
    jv = make_view(make_spec(2, min_available=1))
    place(jv, 0)
    run_all(jv, 0)
    jv.job.desired = "KILLED"  # StopJob committed; the daemon died before its side effects
    eff = policy.recover(jv, _statuses(jv, {0: T.RUNNING}), T0 + 100)
    assert eff.kill == [task_id_for(JOB, 0, 1)] and eff.enqueue == [] and eff.adopt == []
    assert jv.gangs[0].tasks[0].state == T.KILLING
    assert jv.gangs[1].gang.state == G.DONE and states(jv.gangs[1]) == [T.KILLED]
    assert jv.job.state == J.KILLING
    apply(jv, 0, T.KILLED)
    assert jv.gangs[0].gang.state == G.DONE and jv.job.state == J.KILLED



def test_recover_of_a_stopped_job_marks_running_gangs_aborting() -> None:
    jv = make_view(make_spec(2))
    place(jv, 0)
    run_all(jv, 0)
    jv.job.desired = "KILLED"
    policy.recover(jv, _statuses(jv, {0: T.RUNNING, 1: T.RUNNING}), T0 + 100)
    assert states(jv.gangs[0]) == [T.KILLING, T.KILLING]
    assert jv.gangs[0].gang.state == G.ABORTING  # RUNNING means "every member runs"


def test_recover_of_an_aborting_gang_waits_for_its_members() -> None:
    jv = make_view(make_spec(2, on_member_failure="fail_job"))
    gv = place(jv)
    run_all(jv)
    apply(jv, 0, T.FAILED)
    assert gv.gang.state == G.ABORTING and states(gv) == [T.FAILED, T.KILLING]
    eff = policy.recover(jv, _statuses(jv, {1: T.KILLED}), T0 + 100)
    assert eff.enqueue == [] and eff.adopt == []
    assert gv.gang.state == G.DONE and states(gv) == [T.FAILED, T.KILLED]
    assert jv.job.state == J.FAILED


def test_recover_sends_again_the_kills_of_members_still_killing() -> None:
    """The daemon died after committing the stop (members KILLING), maybe before the kills reached the backend:
    recovery kills every member still KILLING again (kills are idempotent), not only those it newly stops; one
    the backend reports ended is not killed again."""
    jv = make_view(make_spec(3))
    gv = place(jv)
    run_all(jv)
    policy.stop_job(jv, T0 + 5)
    assert states(gv) == [T.KILLING] * 3
    eff = policy.recover(jv, _statuses(jv, {0: T.RUNNING, 1: T.KILLED}), T0 + 6)  # 2: no answer
    assert sorted(eff.kill) == [task_id_for(JOB, 0, 1), task_id_for(JOB, 2, 1)]
    assert states(gv) == [T.KILLING, T.KILLED, T.KILLING] and gv.gang.state == G.ABORTING
    # a gang that failed (fail_job): the member being killed with its gang is killed again too
    jv = make_view(make_spec(2, on_member_failure="fail_job"))
    gv = place(jv)
    run_all(jv)
    apply(jv, 0, T.FAILED)
    assert states(gv) == [T.FAILED, T.KILLING]
    assert policy.recover(jv, _statuses(jv, {1: T.RUNNING}), T0 + 6).kill == [task_id_for(JOB, 1, 1)]


def test_recover_ignores_done_gangs() -> None:
    jv = make_view(make_spec(1))
    place(jv)
    apply(jv, 0, T.SUCCEEDED)
    before = snapshot(jv)
    assert policy.recover(jv, {}, T0 + 100) == Effects()
    assert snapshot(jv) == before


def test_resmgr_holds_in_vain_only_a_gang_that_has_been_over_for_a_while() -> None:
    """The queue check releases what resmgr holds for a gang that is over (its release lost with a job manager
    that died): DONE, on a later attempt, or of a job gone; not while a release just sent may be on its way."""
    jv = make_view(make_spec(1))
    place(jv)
    assert not policy.holds_in_vain(jv, "job1/0", 1, T0 + 100, 30)  # launching: resmgr holds it rightly
    apply(jv, 0, T.SUCCEEDED, now=T0 + 2)
    assert jv.gangs[0].gang.state == G.DONE
    assert not policy.holds_in_vain(jv, "job1/0", 1, T0 + 10, 30)  # its release may be on its way
    assert policy.holds_in_vain(jv, "job1/0", 1, T0 + 40, 30)
    assert policy.holds_in_vain(None, "job1/0", 1, T0, 30)  # its job was deleted
    jv = make_view(make_spec(2))
    place(jv)
    run_all(jv)
    apply(jv, 0, T.FAILED, now=T0 + 5)  # restarted as attempt 2, queued
    assert jv.gangs[0].gang.attempt == 2
    assert policy.holds_in_vain(jv, "job1/0", 1, T0 + 40, 30)  # the first attempt's allocation
    assert not policy.holds_in_vain(jv, "job1/0", 2, T0 + 40, 30)


# --- Hypothesis: random status storms ------------------------------------------------------------------------
ACTIVE_GANG = (G.PLACED, G.LAUNCHING, G.RUNNING, G.ABORTING)
STATUS_STATES = [T.RUNNING, T.SUCCEEDED, T.FAILED, T.LOST, T.KILLED]

_status_op = st.tuples(st.just("status"), st.integers(0, 5), st.sampled_from([T.RUNNING, *STATUS_STATES]),
                      st.booleans(), st.booleans())
op_strategy = st.one_of(
    _status_op, _status_op, _status_op,
    st.tuples(st.just("place"), st.integers(0, 5)),
    st.tuples(st.just("place"), st.integers(0, 5)),
    st.tuples(st.just("deadline"), st.floats(0, 200)),
    st.tuples(st.just("launch_failed"), st.integers(0, 5)),
    st.tuples(st.just("refused"), st.integers(0, 5)),
    st.tuples(st.just("stop"), st.integers(0, 7)),  # acts when 0: stopping ends everything, so rarely
    st.tuples(st.just("recover"), st.lists(st.sampled_from([None, *STATUS_STATES]), min_size=4, max_size=4)),
)


def _documented_job_state(jv: JobView, failed: bool) -> JobState:
    """The job state docs/architecture.md derives from the gangs: all gangs DONE -> FAILED (the job has failed:
    `failed`), KILLED (desired KILLED), SUCCEEDED (every task succeeded) or FAILED; otherwise FAILING if it has
    failed, KILLING if stopped, RUNNING if any gang runs, else PENDING. It has failed once a gang was ABORTING
    while RUNNING was desired."""
    gangs = list(jv.gangs.values())
    if all(gv.gang.state == G.DONE for gv in gangs):
        if failed:
            return J.FAILED
        if jv.job.desired == "KILLED":
            return J.KILLED
        return J.SUCCEEDED if all(t.state == T.SUCCEEDED for gv in gangs for t in gv.members()) else J.FAILED
    if failed:
        return J.FAILING
    if jv.job.desired == "KILLED":
        return J.KILLING
    return J.RUNNING if any(gv.gang.state == G.RUNNING for gv in gangs) else J.PENDING


def _records(jv: JobView) -> dict[object, tuple[object, ...]]:
    """Every record of the view as plain values, keyed like Effects' registers."""
    out: dict[object, tuple[object, ...]] = {("job", jv.job.id): dataclasses.astuple(dataclasses.replace(jv.job, spec=None))}  # type: ignore[arg-type]
    for gv in jv.gangs.values():
        out[("gang", gv.gang.job_id, gv.gang.index)] = dataclasses.astuple(gv.gang)
        for t in gv.tasks.values():
            out[("task", t.job_id, t.instance)] = dataclasses.astuple(t)
    return out


def _check_tracked(before: dict[object, tuple[object, ...]], jv: JobView, eff: Effects) -> None:
    """Every record a rule changed is registered in its Effects: the writer writes exactly those rows."""
    tracked = ({("job", j) for j in eff.jobs} | {("gang", *k) for k in eff.gangs} | {("task", *k) for k in eff.tasks})
    changed = {k for k, v in _records(jv).items() if before.get(k) != v}
    assert changed <= tracked, f"changed but not registered for writing: {sorted(map(str, changed - tracked))}"


def _check_counters(jv: JobView) -> None:
    """The counters derive_job_state relies on match a recount."""
    fresh = JobView(jv.job, jv.gangs)
    assert jv.gang_counts == fresh.gang_counts and jv.unsucceeded == fresh.unsucceeded
    for gv in jv.gangs.values():  # each gang's members by state (what all_members reads)
        assert gv.counts == GangView(gv.gang, gv.tasks).counts, gv.gang.gang_id


def _intent(jv: JobView, idx: int, now: float) -> Effects:
    gv = jv.gangs[idx]
    members = tuple(MemberAssignment(t.instance, t.task_id, "h", "127.0.0.1", jv.spec.resources, (), ())
                    for t in gv.members())
    eff = policy.launch_intent(jv, GangPlacement(gv.gang.gang_id, JOB, gv.gang.attempt, members), now)
    assert eff is not None
    return eff


def _check_invariants(jv: JobView) -> None:
    spec = jv.spec
    for gv in jv.gangs.values():
        g = gv.gang
        assert 1 <= g.attempt <= spec.max_attempts
        for t in gv.members():
            assert t.attempt == g.attempt, (t, g)
        if g.state == G.RUNNING:
            assert gv.all_members(T.RUNNING, T.SUCCEEDED, T.KILLING), states(gv)
        if g.state == G.QUEUED:
            assert gv.all_members(T.PENDING), states(gv)
        if g.state == G.DONE:
            assert gv.all_members(*TASK_TERMINAL), states(gv)
        if g.state in (G.LAUNCHING, G.PLACED):
            assert not any(t.state == T.PENDING for t in gv.members())
    if jv.job.state.terminal:
        assert all(gv.gang.state == G.DONE for gv in jv.gangs.values())
    if jv.job.state == J.SUCCEEDED:
        assert all(t.state == T.SUCCEEDED for gv in jv.gangs.values() for t in gv.members())


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    instances=st.integers(1, 4),
    min_avail=st.integers(0, 4),
    policy_name=st.sampled_from(["restart_gang", "fail_job"]),
    max_attempts=st.integers(1, 3),
    ops=st.lists(op_strategy, max_size=60),
)
def test_random_status_sequences_keep_the_invariants(instances: int, min_avail: int, policy_name: str,
                                                     max_attempts: int, ops: list[tuple]) -> None:
    spec = make_spec(instances, min_available=min(min_avail, instances), on_member_failure=policy_name,
                     max_attempts=max_attempts)
    jv = make_view(spec)
    now = T0
    terminal_snapshot = None
    history = [jv.job.state]  # every job state the walk passes through, in order
    failed = False  # a gang has been ABORTING while RUNNING was desired: the job failed
    _check_invariants(jv)
    for op in ops:
        now += 1.0
        kind = op[0]
        gvs = list(jv.gangs.values())
        before = _records(jv)
        eff = Effects()
        if kind == "status":
            _, inst, state, stale, _ = op
            inst %= instances
            gv = next(g for g in gvs if inst in g.tasks)
            t = gv.tasks[inst]
            current = attempt = t.attempt
            if stale and attempt > 1:
                attempt -= 1
            elif t.state == T.PENDING:
                continue  # never launched: the backend cannot report on it
            st_ = TaskStatus(task_id_for(JOB, inst, attempt), state, now, hostname="h")
            eff = policy.apply_status(jv, st_, now)
            if attempt != current:
                assert eff.kill == ([st_.task_id] if state == T.RUNNING else [])
                assert eff.release == eff.enqueue == []
        elif kind == "place":
            gv = gvs[op[1] % len(gvs)]
            if gv.gang.state == G.QUEUED and jv.job.desired == "RUNNING":
                eff = _intent(jv, gv.gang.index, now)
        elif kind == "deadline":
            for gv in gvs:
                eff.merge(policy.check_launch_deadline(jv, gv, now + op[1]))
        elif kind == "launch_failed":
            gv = gvs[op[1] % len(gvs)]
            if gv.gang.state in (G.PLACED, G.LAUNCHING) and all(t.state == T.LAUNCHING for t in gv.members()):
                eff = policy.launch_failed(jv, gv, now, "launch failed")
        elif kind == "refused":
            gv = gvs[op[1] % len(gvs)]
            eff = policy.launch_refused(jv, gv, gv.gang.attempt, now, "claim expired")
        elif kind == "stop":
            if op[1] == 0:
                eff = policy.stop_job(jv, now)
        elif kind == "recover":  # a daemon restart: the backend reports what it knows of live members
            found = {}
            for gv in gvs:
                if gv.gang.state in ACTIVE_GANG:
                    for t in gv.members():
                        s_ = op[1][t.instance % 4]
                        if s_ is not None and not t.state.terminal:
                            found[t.task_id] = TaskStatus(t.task_id, s_, now, hostname="h")
            eff = policy.recover(jv, found, now)
            adopted = {i for _, i in eff.adopt}
            # an adopted gang runs, or is being torn down because a sibling failed the job (its allocation is
            # released when it is DONE); a gang adopted and DONE at once is test_recover_adopts_no_finished_gang
            assert all(jv.gangs[i].gang.state in (G.RUNNING, G.ABORTING, G.DONE) for i in adopted)
            assert len(eff.adopt) == len(adopted)
        _check_invariants(jv)
        _check_tracked(before, jv, eff)
        _check_counters(jv)
        if jv.job.state != history[-1]:
            history.append(jv.job.state)
        failed = failed or (jv.job.desired == "RUNNING" and any(gv.gang.state == G.ABORTING for gv in gvs))
        if terminal_snapshot is None:  # (a terminal job never changes again: checked below)
            gang_states = [gv.gang.state for gv in jv.gangs.values()]
            assert jv.job.state == _documented_job_state(jv, failed), (jv.job.state, jv.job.desired, gang_states)
        if jv.job.state in (J.PENDING, J.RUNNING):  # never while the job has failed: no retry is coming
            assert not failed, [s.value for s in history]
        if terminal_snapshot is not None:
            assert snapshot(jv)[0] == terminal_snapshot, "a terminal job changed"
        elif jv.job.state.terminal:
            terminal_snapshot = snapshot(jv)[0]
    # created PENDING, and each change of state is one the documented job state machine allows
    assert history[0] == J.PENDING
    for frm, to in zip(history, history[1:], strict=False):
        assert to.value in DOC_JOB[frm.value], f"job went {frm.value} -> {to.value}: {[s.value for s in history]}"


def test_a_status_about_a_refused_launch_changes_nothing() -> None:
    """The reconciler asked about a LAUNCHING member; meanwhile the launch was refused and the gang went back to
    its queue as the same attempt (same task id); the backend's "unknown: LOST" answer must not apply."""
    jv = make_view()
    gv = place(jv)
    eff = policy.launch_refused(jv, gv, 1, T0 + 2, "the claim expired")
    assert gv.gang.state == G.QUEUED and states(gv) == [T.PENDING] * 3
    # resmgr may still hold the attempt as handed out: released first, then enqueued anew (same attempt)
    assert eff.release == [(gv.gang.gang_id, 1)] and eff.enqueue == [(JOB, 0)] and gv.gang.attempt == 1
    before = snapshot(jv)
    eff = apply(jv, 0, T.LOST, now=T0 + 3)
    assert snapshot(jv) == before and eff == Effects()
    eff = apply(jv, 1, T.RUNNING, now=T0 + 3)  # cannot happen; if it did, it must not run on
    assert eff.kill == ["job1-1-1"] and snapshot(jv) == before


def test_effects_merge_concatenates() -> None:
    a = Effects(kill=["a"], release=[("g", 1)], enqueue=[("j", 0)], adopt=[("j", 1)], restarts=1)
    b = Effects(kill=["b"], release=[("h", 2)], enqueue=[("j", 2)], adopt=[("j", 3)], restarts=2)
    a.merge(b)
    assert a.restarts == 3
    assert a.kill == ["a", "b"] and a.release == [("g", 1), ("h", 2)]
    assert a.enqueue == [("j", 0), ("j", 2)] and a.adopt == [("j", 1), ("j", 3)]


# --- preemption ---------------------------------------------------------------------------------------------
def test_a_preempted_gang_gets_its_grace_then_goes_back_to_its_queue_without_using_an_attempt() -> None:
    jv = make_view(make_spec(2, max_attempts=1, preemption_grace_s=7.0))
    gv = place(jv, now=T0)
    run_all(jv)
    eff = policy.preempt_gang(jv, gv, 1, T0 + 10, "for gang x/0 of pool / (priority 5)")
    assert eff.preempt == [(task_id_for(JOB, 0, 1), 7.0), (task_id_for(JOB, 1, 1), 7.0)] and eff.kill == []
    assert gv.gang.state == G.PREEMPTING and states(gv) == [T.PREEMPTING] * 2
    assert gv.gang.reason == "preempted: for gang x/0 of pool / (priority 5)"
    assert eff.events[-1].reason == "preempted: for gang x/0 of pool / (priority 5)"
    # a second order for the same run changes nothing; one for another run neither
    assert policy.preempt_gang(jv, gv, 1, T0 + 11, "again") == Effects()
    # a member that checkpoints and exits 0 in its grace, one killed at its end: the run is over, whole
    apply(jv, 0, T.SUCCEEDED, T0 + 12, exit_code=0)
    assert gv.gang.state == G.PREEMPTING
    eff = apply(jv, 1, T.KILLED, T0 + 17)
    assert gv.gang.state == G.PREEMPTED and gv.gang.attempt == 2 and gv.gang.preemptions == 1
    assert policy.attempts_used(gv.gang) == 1
    assert states(gv) == [T.PENDING] * 2 and {t.task_id for t in gv.members()} == {f"{JOB}-0-2", f"{JOB}-1-2"}
    assert eff.release == [(gv.gang.gang_id, 1)] and eff.enqueue == [(JOB, 0)]
    assert jv.job.state == J.PENDING and jv.unsucceeded == 0
    # why it waits now keeps saying it was preempted
    policy.set_pending_reason(jv, 0, 2, "waiting for admission: over pool /b's entitlement", T0 + 18)
    assert gv.gang.reason == "preempted, queued again; waiting for admission: over pool /b's entitlement"
    # run 2 is placed and fails: its job allows one attempt, and this is the first that counts
    place(jv, now=T0 + 20)
    run_all(jv, now=T0 + 21)
    apply(jv, 0, T.FAILED, T0 + 22)
    assert gv.gang.state == G.ABORTING and "failed on attempt 1 of 1" in jv.job.reason


def test_preemption_is_refused_for_another_run_a_stopped_job_or_a_gang_not_running() -> None:
    jv = make_view(make_spec(2))
    gv = jv.gangs[0]
    assert policy.preempt_gang(jv, gv, 1, T0, "x") == Effects()  # queued: nothing to preempt
    place(jv)
    run_all(jv)
    assert policy.preempt_gang(jv, gv, 2, T0, "x") == Effects()
    pinned = make_view(make_spec(2, preemptible=False))
    place(pinned)
    run_all(pinned)
    assert policy.preempt_gang(pinned, pinned.gangs[0], 1, T0, "x") == Effects()
    policy.stop_job(jv, T0 + 3)
    assert policy.preempt_gang(jv, gv, 1, T0 + 4, "x") == Effects()


def test_a_job_stopped_during_a_preemption_ends_and_is_not_queued_again() -> None:
    jv = make_view(make_spec(2))
    gv = place(jv)
    run_all(jv)
    policy.preempt_gang(jv, gv, 1, T0 + 5, "x")
    eff = policy.stop_job(jv, T0 + 6)
    assert gv.gang.state == G.ABORTING and states(gv) == [T.KILLING] * 2
    assert sorted(eff.kill) == [f"{JOB}-0-1", f"{JOB}-1-1"]
    apply(jv, 0, T.KILLED, T0 + 7)
    eff = apply(jv, 1, T.KILLED, T0 + 7)
    assert gv.gang.state == G.DONE and eff.enqueue == [] and jv.job.state == J.KILLED


def test_a_member_seen_running_again_during_a_preemption_stays_preempting() -> None:
    jv = make_view(make_spec(2))
    gv = place(jv)
    apply(jv, 0, T.RUNNING)  # member 1 still launching
    policy.preempt_gang(jv, gv, 1, T0 + 5, "x")
    assert states(gv) == [T.PREEMPTING, T.PREEMPTING]
    eff = apply(jv, 1, T.RUNNING, T0 + 6)  # its RUNNING arrives late: still to be stopped
    assert states(gv) == [T.PREEMPTING, T.PREEMPTING] and eff.kill == [] and eff.preempt == []


def test_recover_finishes_a_preemption_the_crash_interrupted() -> None:
    jv = make_view(make_spec(3, preemption_grace_s=9.0))
    gv = place(jv)
    run_all(jv)
    policy.preempt_gang(jv, gv, 1, T0 + 5, "x")
    # down meanwhile: member 0 ended; 1 and 2 still in their grace
    ids = [t.task_id for t in gv.members()]
    statuses = {ids[0]: TaskStatus(ids[0], T.KILLED, T0 + 6, "host-0"),
                ids[1]: TaskStatus(ids[1], T.RUNNING, T0 + 6, "host-1"),
                ids[2]: TaskStatus(ids[2], T.RUNNING, T0 + 6, "host-2")}
    eff = policy.recover(jv, statuses, T0 + 7)
    assert gv.gang.state == G.PREEMPTING and states(gv) == [T.KILLED, T.PREEMPTING, T.PREEMPTING]
    assert eff.preempt == [(ids[1], 9.0), (ids[2], 9.0)]  # told again (a kill lost in the crash)
    assert eff.adopt == [(JOB, 0)] and eff.enqueue == []  # its allocation stays counted until it has ended
    apply(jv, 1, T.KILLED, T0 + 8)
    apply(jv, 2, T.KILLED, T0 + 9)
    assert gv.gang.state == G.PREEMPTED and gv.gang.preemptions == 1
    # all ended while the daemon was down: queued again at recovery
    jv = make_view(make_spec(2))
    gv = place(jv)
    run_all(jv)
    policy.preempt_gang(jv, gv, 1, T0 + 5, "x")
    ids = [t.task_id for t in gv.members()]
    eff = policy.recover(jv, {i: TaskStatus(i, T.KILLED, T0 + 6, "h") for i in ids}, T0 + 7)
    assert gv.gang.state == G.PREEMPTED and eff.enqueue == [(JOB, 0)] and eff.adopt == []


def test_a_gang_on_a_drained_host_is_preempted_even_if_not_preemptible() -> None:
    jv = make_view(make_spec(2, preemptible=False, max_attempts=1))
    gv = place(jv)  # members on host-0 and host-1
    run_all(jv)
    assert policy.on_hosts(gv, frozenset({"host-9"})) is None
    assert policy.evict_from_hosts(jv, gv, frozenset({"host-9"}), T0 + 5) == Effects()
    assert policy.preempt_gang(jv, gv, 1, T0 + 5, "x") == Effects()  # not for resmgr's preemption
    eff = policy.evict_from_hosts(jv, gv, frozenset({"host-1"}), T0 + 5)
    assert gv.gang.state == G.PREEMPTING and len(eff.preempt) == 2
    assert gv.gang.reason == "preempted: host host-1 was drained and its deadline passed"
    apply(jv, 0, T.KILLED, T0 + 6)
    apply(jv, 1, T.KILLED, T0 + 6)
    assert gv.gang.state == G.PREEMPTED and policy.attempts_used(gv.gang) == 1


def test_a_gang_preempted_while_its_launch_is_refused_goes_back_to_its_queue() -> None:
    jv = make_view(make_spec(2))
    gv = place(jv)  # LAUNCHING: the launch is in flight
    policy.preempt_gang(jv, gv, 1, T0 + 2, "x")
    assert gv.gang.state == G.PREEMPTING and states(gv) == [T.PREEMPTING] * 2
    eff = policy.launch_refused(jv, gv, 1, T0 + 3, "a member was killed before its launch")
    assert gv.gang.state == G.PREEMPTED and gv.gang.preemptions == 1 and eff.enqueue == [(JOB, 0)]


def test_a_gang_running_whole_reports_its_launch_and_its_wait() -> None:
    jv = make_view(make_spec(2, launch_timeout_s=60.0), now=T0)
    place(jv, now=T0 + 10)  # the intent at T0 + 10
    eff = apply(jv, 0, T.RUNNING, T0 + 11)
    assert eff.started == []
    eff = apply(jv, 1, T.RUNNING, T0 + 12.5)
    assert eff.started == [(2.5, 12.5)]


# --- a gang resmgr refused for good (jobmgr/effects.py) ---------------------------------------------------------

def test_a_queued_gang_resmgr_refused_for_good_fails_its_job_saying_why() -> None:
    jv = make_view(make_spec(4, min_available=2))  # gangs 0 (instances 0, 1), 1, 2
    place(jv, 1)
    run_all(jv, 1)
    eff = policy.refused_by_resmgr(jv, jv.gangs[0], 1, T0 + 3, "Received message larger than max (9 vs. 4)")
    g = jv.gangs[0].gang
    assert g.state == G.DONE and "refused by the resource manager: Received message larger than max" in g.reason
    assert states(jv.gangs[0]) == [T.FAILED, T.FAILED]
    assert jv.gangs[0].tasks[0].reason == "refused by the resource manager"
    assert jv.gangs[2].gang.state == G.DONE and jv.gangs[1].gang.state == G.ABORTING  # the rest stopped
    assert jv.job.state == J.FAILING and jv.job.reason.startswith("gang 0 was refused by the resource manager")
    assert ("job1/0", 1) not in eff.release and not eff.enqueue  # never queued again, never held
    assert [n.level for n in eff.notes if n.gang_id == "job1/0"] == ["warning"]
    for i in jv.gangs[1].gang.instances:
        apply(jv, i, T.KILLED, T0 + 4)
    assert jv.job.state == J.FAILED


def test_a_refusal_of_an_attempt_the_gang_has_left_behind_changes_nothing() -> None:
    jv = make_view(make_spec(2, on_member_failure="restart_gang", max_attempts=3))
    place(jv)
    run_all(jv)
    apply(jv, 0, T.FAILED)  # attempt 2 queued
    assert jv.gangs[0].gang.attempt == 2
    assert not policy.refused_by_resmgr(jv, jv.gangs[0], 1, T0 + 3, "bad").gangs
    assert jv.gangs[0].gang.state == G.QUEUED and jv.job.state == J.PENDING


def test_a_running_gang_whose_adoption_resmgr_refused_for_good_fails_and_is_not_retried() -> None:
    jv = make_view(make_spec(2, on_member_failure="restart_gang", max_attempts=3))
    place(jv)
    run_all(jv)
    eff = policy.refused_by_resmgr(jv, jv.gangs[0], 1, T0 + 3, "gangs[0]: not finite")
    assert jv.gangs[0].gang.state == G.ABORTING and sorted(eff.kill) == ["job1-0-1", "job1-1-1"]
    assert jv.gangs[0].gang.attempt == 1 and jv.job.state == J.FAILING  # no other attempt
    assert "refused by the resource manager: gangs[0]: not finite" in jv.job.reason
