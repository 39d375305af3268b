"""Goal-state rules for gangs and jobs. Pure: plain records in, the same records updated plus the side effects
to perform (kill, release, enqueue) out. The clock is passed in.

Rules (design.md §2):
- a gang is RUNNING only when every member runs (or has already succeeded);
- a member that fails, is lost, or is killed by someone else applies the gang's policy: `restart_gang` kills the
  other members and re-queues the whole gang as a new attempt (new task ids) until `retry.max_attempts`;
  `fail_job` (or attempts exhausted) kills the rest and fails the job;
- a launch that fails or times out counts as a failed attempt;
- after a daemon restart a gang is adopted whole when every member runs, else torn down and re-queued.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from peloton.domain.model import Gang, Job, Task, TaskEvent, gang_id_for, task_id_for
from peloton.domain.spec import JobSpec, gang_partition
from peloton.domain.states import (
    TASK_TERMINAL,
    GangState,
    JobState,
    TaskState,
    check_gang,
    check_job,
    check_task,
)
from peloton.hostmgr.backend import TaskStatus

G, T = GangState, TaskState


def parse_task_id(task_id: str) -> tuple[str, int, int]:
    """`<job>-<instance>-<attempt>` -> (job, instance, attempt). ValueError if malformed."""
    job_id, instance, attempt = task_id.rsplit("-", 2)
    return job_id, int(instance), int(attempt)


@dataclass(slots=True)
class GangView:
    gang: Gang
    tasks: dict[int, Task]  # instance -> member

    def members(self) -> list[Task]:
        return [self.tasks[i] for i in self.gang.instances]

    def all_members(self, *states: TaskState) -> bool:
        return all(t.state in states for t in self.members())


@dataclass(slots=True)
class JobView:
    job: Job
    gangs: dict[int, GangView]

    @property
    def spec(self) -> JobSpec:
        return self.job.spec


@dataclass(slots=True)
class Effects:
    kill: list[str] = field(default_factory=list)  # task ids
    release: list[tuple[str, int]] = field(default_factory=list)  # (gang_id, attempt) to drop from resmgr
    enqueue: list[tuple[str, int]] = field(default_factory=list)  # (job_id, gang_index) to (re-)queue
    adopt: list[tuple[str, int]] = field(default_factory=list)  # (job_id, gang_index) running after recovery
    events: list[TaskEvent] = field(default_factory=list)
    restarts: int = 0  # gangs re-queued as a new attempt

    def merge(self, o: Effects) -> None:
        self.kill += o.kill
        self.release += o.release
        self.enqueue += o.enqueue
        self.adopt += o.adopt
        self.events += o.events
        self.restarts += o.restarts


def _set_task(t: Task, state: TaskState, now: float, eff: Effects, *, reason: str = "", message: str = "",
              exit_code: int | None = None, host: str | None = None) -> None:
    check_task(t.state, state)
    t.state = state
    t.updated_at = now
    if reason or message:
        t.reason, t.message = reason, message
    if exit_code is not None:
        t.exit_code = exit_code
    if state == T.RUNNING and not t.started_at:
        t.started_at = now
    if state in TASK_TERMINAL:
        t.finished_at = now
    eff.events.append(TaskEvent(t.job_id, t.instance, t.attempt, state, now, host if host is not None else t.host,
                                reason, message, exit_code))


def _set_gang(g: Gang, state: GangState, now: float, reason: str | None = None) -> None:
    check_gang(g.state, state)
    g.state = state
    g.updated_at = now
    if reason is not None:
        g.reason = reason


def _kill_members(gv: GangView, now: float, eff: Effects, reason: str) -> None:
    for t in gv.members():
        if t.state in TASK_TERMINAL or t.state == T.KILLING:
            continue
        if t.state in (T.INITIALIZED, T.PENDING, T.READY, T.PLACING, T.PLACED):
            _set_task(t, T.KILLED, now, eff, reason=reason)  # never launched: nothing to kill
        else:
            _set_task(t, T.KILLING, now, eff, reason=reason)
            eff.kill.append(t.task_id)


def _finish_if_quiet(jv: JobView, gv: GangView, now: float, eff: Effects) -> None:
    if gv.gang.state != G.DONE and gv.all_members(*TASK_TERMINAL):
        _set_gang(gv.gang, G.DONE, now)
        eff.release.append((gv.gang.gang_id, gv.gang.attempt))


def _new_attempt(jv: JobView, gv: GangView, now: float, eff: Effects, reason: str) -> None:
    g = gv.gang
    eff.release.append((g.gang_id, g.attempt))
    g.attempt += 1
    _set_gang(g, G.QUEUED, now, reason=f"attempt {g.attempt}: {reason}")
    g.launch_deadline = 0.0
    for t in gv.members():
        t.attempt = g.attempt
        t.state = T.PENDING  # a new task id: the old attempt's record lives on in the events
        t.host, t.address, t.ports, t.gpu_ids = "", "", [], []
        t.exit_code, t.reason, t.message = None, "", ""
        t.started_at = t.finished_at = 0.0
        t.updated_at = now
        eff.events.append(TaskEvent(t.job_id, t.instance, t.attempt, T.PENDING, now, "", "new attempt", reason))
    eff.enqueue.append((jv.job.id, g.index))
    eff.restarts += 1


def gang_failed(jv: JobView, gv: GangView, now: float, eff: Effects, reason: str, *,
                permanent: bool = False) -> None:
    """Apply the gang's failure policy: kill the rest; restart as a new attempt, or fail the job.
    A `permanent` failure (the task itself is invalid) is never retried unchanged."""
    _kill_members(gv, now, eff, reason="gang member failed")
    spec = jv.spec
    if (spec.on_member_failure == "restart_gang" and gv.gang.attempt < spec.max_attempts
            and jv.job.desired == "RUNNING" and not permanent):
        _new_attempt(jv, gv, now, eff, reason)
        return
    if permanent:
        why = f"gang {gv.gang.index} failed and will not be retried unchanged: {reason}"
    elif spec.on_member_failure == "restart_gang":
        why = f"gang {gv.gang.index} failed on attempt {gv.gang.attempt} of {spec.max_attempts}: {reason}"
    else:
        why = f"gang {gv.gang.index} failed: {reason}"
    _set_gang(gv.gang, G.ABORTING, now, reason=why)
    if not jv.job.reason:
        jv.job.reason = why
    _finish_if_quiet(jv, gv, now, eff)
    # the job has failed: nothing else of it should keep running
    for other in jv.gangs.values():
        if other is not gv:
            stop_gang(jv, other, now, eff, reason="job failed")


def stop_gang(jv: JobView, gv: GangView, now: float, eff: Effects, reason: str = "job stopped") -> None:
    g = gv.gang
    if g.state == G.DONE:
        return
    if g.state in (G.QUEUED, G.ADMITTED):
        _kill_members(gv, now, eff, reason)
        _set_gang(g, G.DONE, now, reason=reason)
        eff.release.append((g.gang_id, g.attempt))
        return
    _kill_members(gv, now, eff, reason)
    if g.state != G.ABORTING:
        _set_gang(g, G.ABORTING, now, reason=reason)
    _finish_if_quiet(jv, gv, now, eff)


def stop_job(jv: JobView, now: float) -> Effects:
    eff = Effects()
    if jv.job.state.terminal:
        return eff
    jv.job.desired = "KILLED"
    for gv in jv.gangs.values():
        stop_gang(jv, gv, now, eff)
    derive_job_state(jv, now)
    return eff


def apply_status(jv: JobView, st: TaskStatus, now: float) -> Effects:
    """One status update from the backend for a member of this job."""
    eff = Effects()
    _, instance, attempt = parse_task_id(st.task_id)
    gv = next((g for g in jv.gangs.values() if instance in g.tasks), None)
    t = gv.tasks.get(instance) if gv else None
    if gv is None or t is None:
        return eff
    if attempt != t.attempt:
        # a member of an attempt already torn down: keep its history; a survivor must not run on
        eff.events.append(TaskEvent(t.job_id, instance, attempt, st.state, now, st.hostname, st.reason,
                                    st.message, st.exit_code))
        if st.state == T.RUNNING:
            eff.kill.append(st.task_id)
        return eff
    if t.state in TASK_TERMINAL:
        return eff  # duplicate or late update for a finished member
    g = gv.gang
    expected_stop = t.state == T.KILLING or g.state in (G.ABORTING, G.DONE) or jv.job.desired == "KILLED"
    if st.state == T.RUNNING:
        if t.state not in (T.KILLING, T.RUNNING):
            _set_task(t, T.RUNNING, now, eff, host=st.hostname)
            if expected_stop:  # came up after its gang was torn down
                _set_task(t, T.KILLING, now, eff, reason="gang no longer wanted")
                eff.kill.append(t.task_id)
        if g.state in (G.PLACED, G.LAUNCHING) and gv.all_members(T.RUNNING, T.SUCCEEDED):
            _set_gang(g, G.RUNNING, now, reason="")
    elif st.state == T.SUCCEEDED:
        _set_task(t, T.SUCCEEDED, now, eff, exit_code=0, reason=st.reason, message=st.message or "exit code 0")
        if g.state in (G.PLACED, G.LAUNCHING) and gv.all_members(T.RUNNING, T.SUCCEEDED):
            _set_gang(g, G.RUNNING, now, reason="")
        _finish_if_quiet(jv, gv, now, eff)
    elif st.state in (T.FAILED, T.LOST, T.KILLED):
        if expected_stop:
            final = T.KILLED if st.state in (T.KILLED, T.LOST) else st.state
            _set_task(t, final, now, eff, exit_code=st.exit_code, reason=st.reason or t.reason,
                      message=st.message)
            _finish_if_quiet(jv, gv, now, eff)
        else:
            _set_task(t, st.state, now, eff, exit_code=st.exit_code, reason=st.reason, message=st.message)
            detail = st.message or st.reason or st.state.value.lower()
            gang_failed(jv, gv, now, eff, f"member {instance} {st.state.value}: {detail}", permanent=st.permanent)
    derive_job_state(jv, now)
    return eff


def launch_failed(jv: JobView, gv: GangView, now: float, message: str) -> Effects:
    """The backend started none of the gang (all-or-none launch failed)."""
    eff = Effects()
    if gv.gang.state not in (G.PLACED, G.LAUNCHING):
        return eff
    for t in gv.members():
        if t.state not in TASK_TERMINAL:
            _set_task(t, T.FAILED, now, eff, reason="launch failed", message=message)
    gang_failed(jv, gv, now, eff, f"launch failed: {message}")
    derive_job_state(jv, now)
    return eff


def check_launch_deadline(jv: JobView, gv: GangView, now: float) -> Effects:
    eff = Effects()
    g = gv.gang
    if g.state not in (G.PLACED, G.LAUNCHING) or not g.launch_deadline or now < g.launch_deadline:
        return eff
    slow = [t.instance for t in gv.members() if t.state not in (T.RUNNING, T.SUCCEEDED)]
    gang_failed(jv, gv, now, eff, f"launch timeout: members {slow} not running after {jv.spec.launch_timeout_s:g}s")
    derive_job_state(jv, now)
    return eff


def recover(jv: JobView, statuses: Mapping[str, TaskStatus], now: float) -> Effects:
    """After a daemon restart: adopt every active gang whose members all run (or succeeded); otherwise tear it
    down and re-queue it. Queued gangs are re-enqueued."""
    eff = Effects()
    for gv in jv.gangs.values():
        g = gv.gang
        if g.state == G.DONE:
            continue
        if g.state in (G.QUEUED, G.ADMITTED):
            if jv.job.desired == "KILLED":
                stop_gang(jv, gv, now, eff)
            else:
                eff.enqueue.append((jv.job.id, g.index))
            continue
        # what each live member's backend says now
        for t in gv.members():
            if t.state in TASK_TERMINAL:
                continue
            st = statuses.get(t.task_id)
            if st is None:
                continue
            if st.state == T.RUNNING and t.state != T.RUNNING and t.state != T.KILLING:
                _set_task(t, T.RUNNING, now, eff, host=st.hostname)
            elif st.state in TASK_TERMINAL:
                final = st.state
                if t.state == T.KILLING or g.state == G.ABORTING or jv.job.desired == "KILLED":
                    final = T.KILLED if st.state in (T.KILLED, T.LOST) else st.state
                _set_task(t, final, now, eff, exit_code=st.exit_code, reason=st.reason or "found at recovery",
                          message=st.message)
        if jv.job.desired == "KILLED" or g.state == G.ABORTING:
            stop_gang(jv, gv, now, eff, reason=g.reason or "job stopped")
            continue
        if gv.all_members(T.RUNNING, T.SUCCEEDED):
            if g.state != G.RUNNING:
                _set_gang(g, G.RUNNING, now, reason="")
            _finish_if_quiet(jv, gv, now, eff)
            if g.state != G.DONE:  # a gang that finished while we were down holds nothing any more
                eff.adopt.append((jv.job.id, g.index))
            continue
        lost = [t.instance for t in gv.members() if t.state not in (T.RUNNING, T.SUCCEEDED)]
        gang_failed(jv, gv, now, eff, f"found partial after daemon restart (members {lost} not running)")
    derive_job_state(jv, now)
    return eff


def derive_job_state(jv: JobView, now: float) -> None:
    job = jv.job
    if job.state.terminal:
        return
    gangs = list(jv.gangs.values())
    if all(gv.gang.state == G.DONE for gv in gangs):
        if job.desired == "KILLED":
            new = JobState.KILLED
        elif all(t.state == T.SUCCEEDED for gv in gangs for t in gv.members()):
            new = JobState.SUCCEEDED
        else:
            new = JobState.FAILED
        job.completed_at = now
    elif job.desired == "KILLED":
        new = JobState.KILLING
    elif any(gv.gang.state == G.RUNNING for gv in gangs):
        new = JobState.RUNNING
    else:
        new = JobState.PENDING
    if new != job.state:
        check_job(job.state, new)
        job.state = new
        job.updated_at = now


def new_job_records(job_id: str, spec: JobSpec, now: float) -> tuple[Job, list[Gang], list[Task]]:
    """The rows CreateJob writes: the job, its gangs (attempt 1, QUEUED) and one task per instance."""
    job = Job(job_id, spec, JobState.PENDING, "RUNNING", "", now, now)
    gangs, tasks = [], []
    for idx, instances in enumerate(gang_partition(spec)):
        gangs.append(Gang(job_id, idx, instances, G.QUEUED, 1, "waiting for placement", 0.0, now))
        for i in instances:
            tasks.append(Task(job_id, i, idx, 1, T.PENDING, updated_at=now))
    return job, gangs, tasks


__all__ = [
    "Effects", "GangView", "JobView", "apply_status", "check_launch_deadline", "derive_job_state",
    "gang_failed", "gang_id_for", "launch_failed", "new_job_records", "parse_task_id", "recover", "stop_gang",
    "stop_job", "task_id_for",
]
