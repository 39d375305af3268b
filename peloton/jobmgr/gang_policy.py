"""Goal-state rules for gangs and jobs. Pure: plain records in, the same records updated plus the side effects
to perform (kill, release, enqueue) out. The clock is passed in.

Rules (design.md §2):
- a gang is RUNNING only when every member runs (or has already succeeded);
- a member that fails, is lost, or is killed by someone else applies the gang's policy: `restart_gang` kills the
  other members and re-queues the whole gang as a new attempt (new task ids) until `retry.max_attempts`;
  `fail_job` (or attempts exhausted) kills the rest and fails the job;
- a launch that fails or times out counts as a failed attempt; a launch the system itself refused before starting
  anything (a stale claim, a host that changed) does not: the gang goes back to its queue as the same attempt;
- after a daemon restart a gang is adopted whole when every member runs, else torn down and re-queued;
- a preempted gang (resmgr chose it, whole) gets SIGTERM on every member with the job's grace period, goes
  PREEMPTING, and once every member has ended goes back to its queue as PREEMPTED: a new run (new task ids) that
  uses up no attempt of `retry.max_attempts` (`Gang.preemptions` counts such runs). A daemon crash meanwhile is
  recovered like this too: the members still running are told again, and the gang is never adopted half-killed;
  so are members a stop or a failure was killing (their kill may have been lost with the daemon).

Every record a rule changes is registered in the returned Effects (`tasks`, `gangs`, `jobs`), so the caller writes
exactly those rows: a status update of one member of a 100,000-instance job writes a handful of rows, not the job.
The job's state is derived from counters the JobView keeps up to date (`gang_counts`, `unsucceeded`), so it costs
O(1), not a walk over every gang.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from peloton.domain.launch import TaskStatus
from peloton.domain.model import Gang, Job, Task, TaskEvent, gang_id_for, task_id_for
from peloton.domain.placement import GangPlacement
from peloton.domain.spec import JobSpec, gang_partition
from peloton.domain.states import (
    TASK_TERMINAL,
    GangState,
    JobState,
    TaskState,
    check_gang,
    check_job,
    check_task,
    task_can,
)
from peloton.modelaware import plan as plans

G, T = GangState, TaskState
_UNSUCCESSFUL = frozenset({T.FAILED, T.LOST, T.KILLED})
_NOT_LAUNCHED = frozenset({T.INITIALIZED, T.PENDING, T.READY, T.PLACING, T.PLACED})


def parse_task_id(task_id: str) -> tuple[str, int, int]:
    """`<job>-<instance>-<attempt>` -> (job, instance, attempt). ValueError if malformed."""
    job_id, instance, attempt = task_id.rsplit("-", 2)
    return job_id, int(instance), int(attempt)


@dataclass(slots=True)
class GangView:
    gang: Gang
    tasks: dict[int, Task]  # instance -> member
    # how many members are in each state, kept by the rules (_count_task): "are all members up?" is asked at every
    # member's status update, and a scan of the members each time made a 4,096-member gang's start quadratic
    # (0.7 s of CPU for its RUNNING updates)
    counts: dict[TaskState, int] = field(init=False)

    def __post_init__(self) -> None:
        self.counts = dict.fromkeys(TaskState, 0)
        for t in self.tasks.values():  # (a store missing some of a gang's rows: those count in no state)
            self.counts[t.state] += 1

    def members(self) -> list[Task]:
        return [self.tasks[i] for i in self.gang.instances]

    def all_members(self, *states: TaskState) -> bool:
        return sum(self.counts[s] for s in set(states)) == len(self.gang.instances)


@dataclass(slots=True)
class JobView:
    """A job with every gang and task, plus counters kept current by the rules below (never set a gang's or a
    task's state directly: go through the rules, or the counters drift)."""

    job: Job
    gangs: dict[int, GangView]
    tasks: dict[int, Task] = field(init=False)  # instance -> task, every gang's
    gang_counts: dict[GangState, int] = field(init=False)
    unsucceeded: int = field(init=False)  # tasks in FAILED, LOST or KILLED

    def __post_init__(self) -> None:
        self.tasks = {}
        self.gang_counts = dict.fromkeys(GangState, 0)
        self.unsucceeded = 0
        for gv in self.gangs.values():
            self.gang_counts[gv.gang.state] += 1
            for t in gv.tasks.values():
                self.tasks[t.instance] = t
                if t.state in _UNSUCCESSFUL:
                    self.unsucceeded += 1

    @property
    def spec(self) -> JobSpec:
        return self.job.spec

    def gang_of(self, instance: int) -> GangView | None:
        t = self.tasks.get(instance)
        return self.gangs.get(t.gang_index) if t is not None else None


@dataclass(frozen=True, slots=True)
class Note:
    """A line for the daemon's log, written once the change it tells of is committed (the shell logs it with the
    ids as fields of their own: `--log-format json`). `level` is a logging level's name."""

    level: str
    text: str
    job_id: str
    gang_id: str = ""


@dataclass(slots=True)
class Effects:
    kill: list[str] = field(default_factory=list)  # task ids
    preempt: list[tuple[str, float]] = field(default_factory=list)  # (task id, grace seconds before SIGKILL)
    release: list[tuple[str, int]] = field(default_factory=list)  # (gang_id, attempt) to drop from resmgr
    enqueue: list[tuple[str, int]] = field(default_factory=list)  # (job_id, gang_index) to (re-)queue
    adopt: list[tuple[str, int]] = field(default_factory=list)  # (job_id, gang_index) running after recovery
    events: list[TaskEvent] = field(default_factory=list)
    restarts: int = 0  # gangs re-queued as a new attempt
    # gangs that began to run whole: (seconds from the launch intent, seconds from the job's submission)
    started: list[tuple[float, float]] = field(default_factory=list)
    notes: list[Note] = field(default_factory=list)  # what the log says of gangs and jobs
    # the records changed, for the caller to write (keyed so that a record changed twice is written once)
    tasks: dict[tuple[str, int], Task] = field(default_factory=dict)
    gangs: dict[tuple[str, int], Gang] = field(default_factory=dict)
    jobs: dict[str, Job] = field(default_factory=dict)

    def merge(self, o: Effects) -> None:
        self.kill += o.kill
        self.preempt += o.preempt
        self.release += o.release
        self.enqueue += o.enqueue
        self.adopt += o.adopt
        self.events += o.events
        self.restarts += o.restarts
        self.started += o.started
        self.notes += o.notes
        self.tasks.update(o.tasks)
        self.gangs.update(o.gangs)
        self.jobs.update(o.jobs)

    def touch_task(self, t: Task) -> None:
        self.tasks[(t.job_id, t.instance)] = t

    def touch_gang(self, g: Gang) -> None:
        self.gangs[(g.job_id, g.index)] = g

    def touch_job(self, j: Job) -> None:
        self.jobs[j.id] = j


def _count_task(jv: JobView, t: Task, new: TaskState) -> None:
    """`t` goes from its state to `new`: the job's and its gang's counters follow (before `t.state` is set)."""
    old = t.state
    jv.unsucceeded += (new in _UNSUCCESSFUL) - (old in _UNSUCCESSFUL)
    counts = jv.gangs[t.gang_index].counts
    counts[old] -= 1
    counts[new] += 1


def _set_task(jv: JobView, t: Task, state: TaskState, now: float, eff: Effects, *, reason: str = "",
              message: str = "", exit_code: int | None = None, host: str | None = None,
              event_reason: str | None = None) -> None:
    """Move a task to `state` and record the event (`event_reason` for the history only, not kept on the task)."""
    check_task(t.state, state)
    _count_task(jv, t, state)
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
    eff.touch_task(t)
    eff.events.append(TaskEvent(t.job_id, t.instance, t.attempt, state, now, host if host is not None else t.host,
                                reason if event_reason is None else event_reason, message, exit_code))


# What the log says of a gang entering a state: failures, restarts and preemptions at info or warning (the events an
# operator looks for), the everyday ones at debug (a 100,000-gang job would otherwise write 200,000 lines)
_GANG_NOTES = {G.RUNNING: ("debug", "running"), G.DONE: ("debug", "done"), G.ABORTING: ("warning", "failed"),
               G.PREEMPTING: ("info", "preempted"), G.QUEUED: ("info", "queued again")}
_STOP_NOTE = ("debug", "stopped")


def _set_gang(jv: JobView, g: Gang, state: GangState, now: float, eff: Effects, reason: str | None = None,
              note: tuple[str, str] | None = None) -> None:
    """`note`: (level, what) for the log line instead of the state's own (_GANG_NOTES)."""
    check_gang(g.state, state)
    jv.gang_counts[g.state] -= 1
    jv.gang_counts[state] += 1
    before = g.state
    g.state = state
    g.updated_at = now
    if reason is not None:
        g.reason = reason
    eff.touch_gang(g)
    if note is None:
        note = _GANG_NOTES.get(state)
    if note is not None and before != state:
        level, what = note
        why = f": {g.reason}" if g.reason and state in (G.ABORTING, G.PREEMPTING, G.QUEUED, G.DONE) else ""
        eff.notes.append(Note(level, f"gang {g.gang_id} attempt {g.attempt} {what}{why}", g.job_id, g.gang_id))


def _reset_task(jv: JobView, t: Task, attempt: int, now: float, eff: Effects, reason: str, message: str) -> None:
    """Back to PENDING with nothing assigned, as `attempt` (a new task id when the attempt changes)."""
    _count_task(jv, t, T.PENDING)
    t.attempt = attempt
    t.state = T.PENDING
    t.host, t.address, t.ports, t.gpu_ids = "", "", [], []
    t.exit_code, t.reason, t.message = None, "", ""
    t.started_at = t.finished_at = 0.0
    t.updated_at = now
    eff.touch_task(t)
    eff.events.append(TaskEvent(t.job_id, t.instance, t.attempt, T.PENDING, now, "", reason, message))


def _kill_members(jv: JobView, gv: GangView, now: float, eff: Effects, reason: str, *,
                  grace_s: float | None = None) -> None:
    """Stop every live member: KILLING, or PREEMPTING when `grace_s` is given (SIGTERM, then SIGKILL after it)."""
    for t in gv.members():
        if t.state in TASK_TERMINAL or t.state == T.KILLING or (grace_s is not None and t.state == T.PREEMPTING):
            continue
        if t.state in _NOT_LAUNCHED:
            _set_task(jv, t, T.KILLED, now, eff, reason=reason)  # never launched: nothing to kill
        elif grace_s is not None:
            _set_task(jv, t, T.PREEMPTING, now, eff, reason=reason)
            eff.preempt.append((t.task_id, grace_s))
        else:
            _set_task(jv, t, T.KILLING, now, eff, reason=reason)
            eff.kill.append(t.task_id)


def _gang_runs(jv: JobView, g: Gang, now: float, eff: Effects) -> None:
    """Every member runs: the gang is RUNNING (and how long its launch and its whole wait took, for metrics)."""
    intent = g.launch_deadline - jv.spec.launch_timeout_s if g.launch_deadline else now
    eff.started.append((max(0.0, now - intent), max(0.0, now - jv.job.created_at)))
    _set_gang(jv, g, G.RUNNING, now, eff, reason="")


def _finish_if_quiet(jv: JobView, gv: GangView, now: float, eff: Effects) -> None:
    g = gv.gang
    if g.state == G.DONE or not gv.all_members(*TASK_TERMINAL):
        return
    if g.state == G.PREEMPTING and jv.job.desired == "RUNNING":
        # its run is over: back to the queue as a new run, keeping its place (the job's submission time)
        eff.release.append((g.gang_id, g.attempt))
        g.preemptions += 1
        _requeue(jv, gv, now, eff, g.attempt + 1, g.reason, "preempted",
                 "preempted; queued again without using up an attempt", state=G.PREEMPTED)
        return
    _set_gang(jv, g, G.DONE, now, eff)
    eff.release.append((g.gang_id, g.attempt))


def _requeue(jv: JobView, gv: GangView, now: float, eff: Effects, attempt: int, reason: str, event_reason: str,
             message: str, state: GangState = G.QUEUED) -> None:
    g = gv.gang
    g.attempt = attempt
    _set_gang(jv, g, state, now, eff, reason=reason)
    g.launch_deadline = 0.0
    for t in gv.members():
        _reset_task(jv, t, attempt, now, eff, event_reason, message)
    eff.enqueue.append((jv.job.id, g.index))


def attempts_used(g: Gang) -> int:
    """The runs that count against retry.max_attempts: every run but those a preemption ended."""
    return g.attempt - g.preemptions


def _new_attempt(jv: JobView, gv: GangView, now: float, eff: Effects, reason: str) -> None:
    g = gv.gang
    eff.release.append((g.gang_id, g.attempt))
    nxt = attempts_used(g) + 1
    _requeue(jv, gv, now, eff, g.attempt + 1, f"attempt {nxt}: {reason}", "new attempt", reason)
    eff.restarts += 1


def preempt_gang(jv: JobView, gv: GangView, attempt: int, now: float, reason: str, *,
                 force: bool = False) -> Effects:
    """Preempt the gang whole, as resmgr decided for `attempt`: SIGTERM to every member, the job's
    sla.preemption_grace to checkpoint, then SIGKILL; once all have ended it goes back to its queue (PREEMPTED).
    Nothing happens when the gang has moved on (another run, finished, being stopped) or is not preemptible
    (unless `force`d: its host is being taken out of service)."""
    eff = Effects()
    g = gv.gang
    if (g.attempt != attempt or g.state not in (G.LAUNCHING, G.RUNNING) or jv.job.desired != "RUNNING"
            or not (jv.spec.preemptible or force)):
        return eff
    eff.touch_job(jv.job)
    why = f"preempted: {reason}"
    _set_gang(jv, g, G.PREEMPTING, now, eff, reason=why)
    _kill_members(jv, gv, now, eff, why, grace_s=jv.spec.preemption_grace_s)
    _finish_if_quiet(jv, gv, now, eff)
    derive_job_state(jv, now, eff)
    return eff


def gang_failed(jv: JobView, gv: GangView, now: float, eff: Effects, reason: str, *,
                permanent: bool = False) -> None:
    """Apply the gang's failure policy: kill the rest; restart as a new attempt, or fail the job.
    A `permanent` failure (the task itself is invalid) is never retried unchanged."""
    eff.touch_job(jv.job)
    _kill_members(jv, gv, now, eff, reason="gang member failed")
    spec = jv.spec
    used = attempts_used(gv.gang)
    if (spec.on_member_failure == "restart_gang" and used < spec.max_attempts
            and jv.job.desired == "RUNNING" and not permanent):
        _new_attempt(jv, gv, now, eff, reason)
        return
    if permanent:
        why = f"gang {gv.gang.index} failed and will not be retried unchanged: {reason}"
    elif spec.on_member_failure == "restart_gang":
        why = f"gang {gv.gang.index} failed on attempt {used} of {spec.max_attempts}: {reason}"
    else:
        why = f"gang {gv.gang.index} failed: {reason}"
    _set_gang(jv, gv.gang, G.ABORTING, now, eff, reason=why)
    if not jv.job.reason:
        jv.job.reason = why
    _finish_if_quiet(jv, gv, now, eff)
    # the job has failed: nothing else of it should keep running
    for other in jv.gangs.values():
        if other is not gv:
            stop_gang(jv, other, now, eff, reason="job failed")


def on_hosts(gv: GangView, hosts: frozenset[str]) -> str | None:
    """The first of `hosts` a live member of this launching or running gang is on (None: none)."""
    if gv.gang.state not in (G.LAUNCHING, G.RUNNING):
        return None
    for t in gv.members():
        if t.host in hosts and not t.state.terminal:
            return t.host
    return None


def evict_from_hosts(jv: JobView, gv: GangView, hosts: frozenset[str], now: float) -> Effects:
    """A drained host's deadline has passed: a gang still on it is preempted whole, preemptible or not."""
    host = on_hosts(gv, hosts)
    if host is None:
        return Effects()
    return preempt_gang(jv, gv, gv.gang.attempt, now, f"host {host} was drained and its deadline passed", force=True)


def stop_gang(jv: JobView, gv: GangView, now: float, eff: Effects, reason: str = "job stopped") -> None:
    g = gv.gang
    if g.state == G.DONE:
        return
    if g.state.waiting:
        _kill_members(jv, gv, now, eff, reason)
        _set_gang(jv, g, G.DONE, now, eff, reason=reason, note=_STOP_NOTE)
        eff.release.append((g.gang_id, g.attempt))
        return
    _kill_members(jv, gv, now, eff, reason)
    if g.state != G.ABORTING:
        # ABORTING as a failed gang is, but a stop is asked for (the user's, or the job's end after another gang
        # failed, which was logged as a warning itself): not a warning, or a stopped 1,000-gang job writes 1,000
        _set_gang(jv, g, G.ABORTING, now, eff, reason=reason, note=_STOP_NOTE)
    _finish_if_quiet(jv, gv, now, eff)


def stop_job(jv: JobView, now: float, gangs: range | None = None) -> Effects:
    """The job's desired state becomes KILLED and the gangs with an index in `gangs` (every gang when None) are
    stopped. A big job is stopped a range at a time, each its own commit; once KILLED is desired, recovery and
    the reconciler finish whatever a crash or an outage left running (see `needs_stopping`)."""
    eff = Effects()
    if jv.job.state.terminal:
        return eff
    first = jv.job.desired != "KILLED"
    if first:
        eff.touch_job(jv.job)
        jv.job.desired = "KILLED"
    if gangs is None:
        for gv in jv.gangs.values():
            stop_gang(jv, gv, now, eff)
    else:
        for i in gangs:
            one = jv.gangs.get(i)
            if one is not None:
                stop_gang(jv, one, now, eff)
        if first:
            # the queue gives up every queued gang at once (ranges not stopped yet included), so that placement
            # does not keep placing gangs whose launch would be refused; each is marked DONE when its range comes
            eff.release += [(gv.gang.gang_id, gv.gang.attempt) for gv in jv.gangs.values()
                            if gv.gang.state.waiting and gv.gang.index not in gangs]
    derive_job_state(jv, now, eff)
    return eff


def needs_stopping(jv: JobView) -> bool:
    """KILLED is desired and a gang has not been told to stop (a stop in ranges cut short)."""
    if jv.job.desired != "KILLED" or jv.job.state.terminal:
        return False
    c = jv.gang_counts
    return c[G.DONE] + c[G.ABORTING] < len(jv.gangs)


def apply_status(jv: JobView, st: TaskStatus, now: float) -> Effects:
    """One status update from the backend for a member of this job."""
    eff = Effects()
    _, instance, attempt = parse_task_id(st.task_id)
    gv = jv.gang_of(instance)
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
        # duplicate or late update for a finished member. A record that ended without success never runs again,
        # yet its task may: one reported LOST (Mesos TASK_UNREACHABLE, an "unknown" answer) comes back RUNNING
        # when its agent returns. With no new attempt its id is unchanged, so nothing else would kill it.
        if st.state == T.RUNNING and t.state in _UNSUCCESSFUL:
            eff.kill.append(st.task_id)
        return eff
    if t.state in _NOT_LAUNCHED:
        # about a task id the backend never started (its launch was refused and the gang re-queued as the same
        # attempt; a reconciliation answer that arrived after that): nothing to change, but nothing may run
        if st.state == T.RUNNING:
            eff.kill.append(st.task_id)
        return eff
    eff.touch_job(jv.job)
    g = gv.gang
    expected_stop = (t.state in (T.KILLING, T.PREEMPTING) or g.state in (G.ABORTING, G.PREEMPTING, G.DONE)
                     or jv.job.desired == "KILLED")
    if st.state == T.RUNNING:
        if t.state not in (T.KILLING, T.PREEMPTING, T.RUNNING):
            _set_task(jv, t, T.RUNNING, now, eff, host=st.hostname)
            if expected_stop:  # came up after its gang was torn down
                _kill_members(jv, gv, now, eff, "gang no longer wanted",
                              grace_s=jv.spec.preemption_grace_s if g.state == G.PREEMPTING else None)
        if g.state in (G.PLACED, G.LAUNCHING) and gv.all_members(T.RUNNING, T.SUCCEEDED):
            _gang_runs(jv, g, now, eff)
    elif st.state == T.SUCCEEDED:
        _set_task(jv, t, T.SUCCEEDED, now, eff, exit_code=0, reason=st.reason, message=st.message or "exit code 0")
        if g.state in (G.PLACED, G.LAUNCHING) and gv.all_members(T.RUNNING, T.SUCCEEDED):
            _gang_runs(jv, g, now, eff)
        _finish_if_quiet(jv, gv, now, eff)
    elif st.state in (T.FAILED, T.LOST, T.KILLED):
        if expected_stop:
            final = T.KILLED if st.state in (T.KILLED, T.LOST) else st.state
            _set_task(jv, t, final, now, eff, exit_code=st.exit_code, reason=st.reason or t.reason,
                      message=st.message)
            _finish_if_quiet(jv, gv, now, eff)
        else:
            _set_task(jv, t, st.state, now, eff, exit_code=st.exit_code, reason=st.reason, message=st.message)
            detail = st.message or st.reason or st.state.value.lower()
            gang_failed(jv, gv, now, eff, f"member {instance} {st.state.value}: {detail}", permanent=st.permanent)
    derive_job_state(jv, now, eff)
    return eff


def launch_intent(jv: JobView, p: GangPlacement, now: float) -> Effects | None:
    """Record the write-ahead intent of a placement: the gang LAUNCHING with its deadline, every member LAUNCHING
    with its host, address, ports and GPUs. None when the placement is stale (the job was stopped, the gang
    restarted, or it is not waiting for a placement any more); the caller releases it."""
    gv = jv.gangs.get(_gang_index(p.gang_id))
    if (gv is None or jv.job.desired != "RUNNING" or gv.gang.attempt != p.attempt
            or not gv.gang.state.waiting):
        return None
    eff = Effects()
    eff.touch_job(jv.job)
    g = gv.gang
    _set_gang(jv, g, G.LAUNCHING, now, eff, reason="")
    g.launch_deadline = now + jv.spec.launch_timeout_s
    g.plan = json.dumps(plans.choice_to_dict(p.plan)) if p.plan is not None else ""
    for m in p.members:
        t = gv.tasks[m.instance]
        t.host, t.address, t.ports, t.gpu_ids = m.hostname, m.address, list(m.ports), list(m.gpu_ids)
        _set_task(jv, t, T.LAUNCHING, now, eff, host=m.hostname, event_reason="placed")
    derive_job_state(jv, now, eff)
    return eff


def intent_recorded(jv: JobView, p: GangPlacement) -> bool:
    """The gang is as `launch_intent` of this placement left it: LAUNCHING as its attempt, every member LAUNCHING
    on the host it was placed on."""
    gv = jv.gangs.get(_gang_index(p.gang_id))
    if gv is None or gv.gang.attempt != p.attempt or gv.gang.state != G.LAUNCHING:
        return False
    return all(m.instance in gv.tasks and gv.tasks[m.instance].state == T.LAUNCHING
               and gv.tasks[m.instance].host == m.hostname for m in p.members)


def launch_refused(jv: JobView, gv: GangView, attempt: int, now: float, reason: str) -> Effects:
    """The backend refused the launch before starting any member (a stale claim, a host that changed, a member
    killed before it was launched). Not the job's fault: the gang goes back to its queue as the same attempt
    (same task ids; nothing of them ever ran). A gang being torn down just ends."""
    eff = Effects()
    g = gv.gang
    if g.attempt != attempt or g.state not in (G.PLACED, G.LAUNCHING, G.PREEMPTING, G.ABORTING):
        return eff
    eff.touch_job(jv.job)
    if g.state in (G.ABORTING, G.PREEMPTING) or jv.job.desired != "RUNNING":  # (a preempted one: queued again)
        for t in gv.members():
            if t.state not in TASK_TERMINAL:
                _set_task(jv, t, T.KILLED, now, eff, reason=t.reason or "killed before it was launched",
                          message="never started")
        _finish_if_quiet(jv, gv, now, eff)
    else:
        # resmgr may still hold this attempt as handed out (the launcher acknowledges placements with its next
        # poll): an enqueue of an attempt it knows is ignored, so the release goes first (the same call, applied
        # first) and the enqueue then queues it anew, its allocation released meanwhile
        eff.release.append((g.gang_id, g.attempt))
        _requeue(jv, gv, now, eff, g.attempt, f"re-queued: launch refused: {reason}", "launch refused",
                 f"{reason}; re-queued without counting an attempt")
    derive_job_state(jv, now, eff)
    return eff


def launch_failed(jv: JobView, gv: GangView, now: float, message: str, *, permanent: bool = False) -> Effects:
    """A member could not be started; the backend stopped the rest (all-or-none launch failed)."""
    eff = Effects()
    if gv.gang.state not in (G.PLACED, G.LAUNCHING):
        return eff
    for t in gv.members():
        if t.state not in TASK_TERMINAL:
            _set_task(jv, t, T.FAILED, now, eff, reason="launch failed", message=message)
    gang_failed(jv, gv, now, eff, f"launch failed: {message}", permanent=permanent)
    derive_job_state(jv, now, eff)
    return eff


def refused_by_resmgr(jv: JobView, gv: GangView, attempt: int, now: float, message: str) -> Effects:
    """resmgr refused this attempt's enqueue (or, for a running gang, its adoption) for good (jobmgr/effects.py):
    the request itself was at fault, and would be refused again unchanged, so the job fails, saying why. A waiting
    gang's members fail (they never ran) and it is over; a running one fails as any failed gang does, not retried.
    Nothing happens when the gang has moved on (another attempt, over)."""
    eff = Effects()
    g = gv.gang
    if g.attempt != attempt or g.state == G.DONE:
        return eff
    reason = f"refused by the resource manager: {message}"
    if g.state.waiting:
        eff.touch_job(jv.job)
        why = f"gang {g.index} was {reason}; it will not be retried unchanged"
        for t in gv.members():
            if t.state in TASK_TERMINAL:
                continue
            _set_task(jv, t, T.FAILED if task_can(t.state, T.FAILED) else T.KILLED, now, eff,
                      reason="refused by the resource manager", message=message)
        _set_gang(jv, g, G.DONE, now, eff, reason=why, note=("warning", "failed"))
        if not jv.job.reason:
            jv.job.reason = why
        for other in jv.gangs.values():  # the job has failed: nothing else of it should keep running
            if other is not gv:
                stop_gang(jv, other, now, eff, reason="job failed")
    elif g.state.active and g.state not in (G.ABORTING, G.PREEMPTING):
        gang_failed(jv, gv, now, eff, reason, permanent=True)
    derive_job_state(jv, now, eff)
    return eff


def to_send(views: Mapping[str, JobView], eff: Effects) -> tuple[list[tuple[JobView, int]], list[tuple[JobView, int]]]:
    """The enqueues and adoptions of `eff` to send once it has committed, each as its gang is now: an enqueue of a
    gang still waiting in a job that still wants to run, an adoption of a gang still active. A rule records an
    enqueue when a gang is queued, and a later rule of the same commit may end the gang (recovery re-enqueues a
    queued gang, then a gang after it fails the job and stops it; a batch's first status restarts a gang, a later
    one fails the job). The sender sends the releases first: sent, that enqueue would queue in resmgr a gang that is
    over (placed for nothing, its pool's share counted, until the queue check released it)."""
    enqueue, adopt = [], []
    for j, i in eff.enqueue:
        jv = views.get(j)
        gv = jv.gangs.get(i) if jv is not None else None
        if jv is not None and gv is not None and gv.gang.state.waiting and jv.job.desired == "RUNNING":
            enqueue.append((jv, i))
    for j, i in eff.adopt:
        jv = views.get(j)
        gv = jv.gangs.get(i) if jv is not None else None
        if jv is not None and gv is not None and gv.gang.state.active:
            adopt.append((jv, i))
    return enqueue, adopt


def set_pending_reason(jv: JobView, gang_index: int, attempt: int, reason: str, now: float) -> Effects:
    """Why a queued gang is still waiting (admission or placement), shown by `job get`."""
    eff = Effects()
    gv = jv.gangs.get(gang_index)
    if gv is None:
        return eff
    g = gv.gang
    if g.state == G.PREEMPTED:
        reason = f"preempted, queued again; {reason}"  # why it was preempted: in its members' history
    if g.attempt == attempt and g.state.waiting and g.reason != reason:
        g.reason = reason
        g.updated_at = now
        eff.touch_gang(g)
    return eff


def holds_in_vain(jv: JobView | None, gang_id: str, attempt: int, now: float, min_age: float) -> bool:
    """resmgr holds `attempt` of this gang (queues it, or counts its allocation) and should not: its job is gone
    (`jv` None), or the gang has been DONE, or on a later attempt, for `min_age` at least (the release of a change
    committed just now may still be on its way). Its release was lost: sent by a job manager that died before it
    went, while resmgr, in a process of its own, lived on. Nothing would release it: its pool's share stays
    counted for ever."""
    if jv is None:
        return True
    gv = jv.gangs.get(_gang_index(gang_id))
    if gv is None:
        return True
    g = gv.gang
    over = (g.state == G.DONE and g.attempt >= attempt) or g.attempt > attempt
    return over and now - g.updated_at >= min_age


def check_launch_deadline(jv: JobView, gv: GangView, now: float) -> Effects:
    eff = Effects()
    g = gv.gang
    if g.state not in (G.PLACED, G.LAUNCHING) or not g.launch_deadline or now < g.launch_deadline:
        return eff
    slow = [t.instance for t in gv.members() if t.state not in (T.RUNNING, T.SUCCEEDED)]
    gang_failed(jv, gv, now, eff, f"launch timeout: members {slow} not running after {jv.spec.launch_timeout_s:g}s")
    derive_job_state(jv, now, eff)
    return eff


def running_since(gv: GangView) -> float:
    """When the gang began to run whole: its last member's start (0: not all have started)."""
    starts = [t.started_at for t in gv.members()]
    return max(starts) if starts and all(starts) else 0.0


def check_max_runtime(jv: JobView, gv: GangView, now: float) -> Effects:
    """A gang running longer than sla.max_runtime is killed whole and its job fails, saying why (not retried:
    another attempt would run as long)."""
    eff = Effects()
    limit, since = jv.spec.max_runtime_s, running_since(gv)
    if gv.gang.state != G.RUNNING or not limit or not since or now - since < limit:
        return eff
    gang_failed(jv, gv, now, eff, f"sla.max_runtime exceeded: it ran {now - since:.0f}s, the limit is {limit:g}s",
                permanent=True)
    derive_job_state(jv, now, eff)
    return eff


def recover(jv: JobView, statuses: Mapping[str, TaskStatus], now: float) -> Effects:
    """After a daemon restart: adopt every active gang whose members all run (or succeeded); otherwise tear it
    down and re-queue it. Queued gangs are re-enqueued. Kills committed before the crash are sent again."""
    eff = Effects()
    for gv in jv.gangs.values():
        g = gv.gang
        if g.state == G.DONE:
            continue
        if g.state.waiting:
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
            if st.state == T.RUNNING and t.state not in (T.RUNNING, T.KILLING, T.PREEMPTING):
                _set_task(jv, t, T.RUNNING, now, eff, host=st.hostname)
            elif st.state in TASK_TERMINAL:
                final = st.state
                if (t.state in (T.KILLING, T.PREEMPTING) or g.state in (G.ABORTING, G.PREEMPTING)
                        or jv.job.desired == "KILLED"):
                    final = T.KILLED if st.state in (T.KILLED, T.LOST) else st.state
                _set_task(jv, t, final, now, eff, exit_code=st.exit_code, reason=st.reason or "found at recovery",
                          message=st.message)
        # a kill committed before the crash may never have reached the backend, and the rules below pass over a
        # member already KILLING: sent again (kills are idempotent), else the stop waits for the reconciler
        eff.kill += [t.task_id for t in gv.members() if t.state == T.KILLING]
        if jv.job.desired == "KILLED" or g.state == G.ABORTING:
            stop_gang(jv, gv, now, eff, reason=g.reason or "job stopped")
            continue
        if g.state == G.PREEMPTING:
            # a preemption the crash interrupted: finish it (the members still running are told again; their
            # grace starts over) and keep its allocation counted until it has ended
            for t in gv.members():
                if t.state == T.PREEMPTING:
                    eff.preempt.append((t.task_id, jv.spec.preemption_grace_s))
            _kill_members(jv, gv, now, eff, g.reason, grace_s=jv.spec.preemption_grace_s)
            _finish_if_quiet(jv, gv, now, eff)
            if g.state == G.PREEMPTING:
                eff.adopt.append((jv.job.id, g.index))
            continue
        if gv.all_members(T.RUNNING, T.SUCCEEDED):
            if g.state != G.RUNNING:
                _set_gang(jv, g, G.RUNNING, now, eff, reason="")
            _finish_if_quiet(jv, gv, now, eff)
            if g.state != G.DONE:  # a gang that finished while we were down holds nothing any more
                eff.adopt.append((jv.job.id, g.index))
            continue
        if g.state == G.LAUNCHING and _still_starting(gv, statuses):
            # its launch was in flight (a takeover, a restart mid-launch): every member is on its way (or done), so it
            # goes on as launching; its RUNNING updates follow, and its launch deadline still holds
            for t in gv.members():
                if t.state.terminal:  # (one that has succeeded)
                    continue
                st = statuses[t.task_id]
                if st.state in _ON_THEIR_WAY and st.state != t.state and task_can(t.state, st.state):
                    _set_task(jv, t, st.state, now, eff, host=st.hostname)
            eff.adopt.append((jv.job.id, g.index))
            continue
        # a member that failed on its own while the daemon was down is the gang's failure, said as it would have
        # been live (its exit code, and whether a retry can help); otherwise members were lost with the daemon
        ended = [(t.instance, statuses[t.task_id]) for t in gv.members()
                 if t.task_id in statuses and statuses[t.task_id].state == T.FAILED and t.state == T.FAILED]
        if ended:
            instance, st = ended[0]
            detail = st.message or st.reason or st.state.value.lower()
            gang_failed(jv, gv, now, eff, f"member {instance} {st.state.value}: {detail} (while the daemon was down)",
                        permanent=st.permanent)
        else:
            lost = [t.instance for t in gv.members() if t.state not in (T.RUNNING, T.SUCCEEDED)]
            gang_failed(jv, gv, now, eff, f"found partial after daemon restart (members {lost} not running)")
    derive_job_state(jv, now, eff)
    return eff


_ON_THEIR_WAY = frozenset({T.LAUNCHED, T.STARTING, T.RUNNING})


def _still_starting(gv: GangView, statuses: Mapping[str, TaskStatus]) -> bool:
    """Every member of a launching gang is known to the backend and launched, starting or running, or has already
    succeeded (as live, where a member that exits 0 before the rest are up leaves its gang launching)."""
    return all(t.state == T.SUCCEEDED
               or (t.task_id in statuses and statuses[t.task_id].state in _ON_THEIR_WAY and not t.state.terminal)
               for t in gv.members())


def derive_job_state(jv: JobView, now: float, eff: Effects | None = None) -> None:
    """The job's state from its gangs, in O(1) from the view's counters. A change is registered in `eff`.
    PENDING only while a gang waits for a run that will come; FAILING (not PENDING) once the job has failed and
    its last gangs are torn down."""
    job = jv.job
    if job.state.terminal:
        return
    counts = jv.gang_counts
    # Gangs ABORTING while RUNNING is still desired: one failed for good (gang_failed) and the job's gangs are being
    # torn down. It has failed, whatever happens next (a stop, a member that exits 0 while it is killed).
    failing = job.state == JobState.FAILING or (job.desired == "RUNNING" and counts[G.ABORTING] > 0)
    if counts[G.DONE] == len(jv.gangs):
        if failing:
            new = JobState.FAILED
        elif job.desired == "KILLED":
            new = JobState.KILLED
        elif jv.unsucceeded == 0:  # every gang DONE means every task terminal
            new = JobState.SUCCEEDED
        else:
            new = JobState.FAILED
        job.completed_at = now
    elif failing:
        new = JobState.FAILING
    elif job.desired == "KILLED":
        new = JobState.KILLING
    elif counts[G.RUNNING]:
        new = JobState.RUNNING
    else:
        new = JobState.PENDING
    if new != job.state:
        check_job(job.state, new)
        job.state = new
        job.updated_at = now
        if eff is not None:
            eff.touch_job(job)
            if new.terminal or new == JobState.FAILING:
                level = "info" if new in (JobState.SUCCEEDED, JobState.KILLED) else "warning"
                eff.notes.append(Note(level, f"job {job.id} {new.value}" + (f": {job.reason}" if job.reason else ""),
                                      job.id))


def new_job_records(job_id: str, spec: JobSpec, now: float) -> tuple[Job, list[Gang], list[Task]]:
    """The rows CreateJob writes: the job, its gangs (attempt 1, QUEUED) and one task per instance. Linear."""
    job = Job(job_id, spec, JobState.PENDING, "RUNNING", "", now, now)
    gangs, tasks = [], []
    for idx, instances in enumerate(gang_partition(spec)):
        gangs.append(Gang(job_id, idx, instances, G.QUEUED, 1, "waiting for placement", 0.0, now))
        for i in instances:
            tasks.append(Task(job_id, i, idx, 1, T.PENDING, updated_at=now))
    return job, gangs, tasks


def first_events(tasks: Sequence[Task], now: float) -> list[TaskEvent]:
    """Each new task's first event, written with the job's rows by CreateJob."""
    return [TaskEvent(t.job_id, t.instance, 1, T.PENDING, now, reason="job created") for t in tasks]


def new_job_view(job: Job, gangs: list[Gang], tasks: list[Task]) -> JobView:
    """The view of records made by `new_job_records` (or loaded): tasks grouped by gang in one pass."""
    by_gang: dict[int, dict[int, Task]] = {g.index: {} for g in gangs}
    for t in tasks:
        by_gang[t.gang_index][t.instance] = t
    return JobView(job, {g.index: GangView(g, by_gang[g.index]) for g in gangs})


def _gang_index(gang_id: str) -> int:
    return int(gang_id.rpartition("/")[2])


__all__ = [
    "Effects", "GangView", "JobView", "apply_status", "attempts_used", "evict_from_hosts", "on_hosts", "preempt_gang", "check_launch_deadline", "check_max_runtime", "derive_job_state",
    "gang_failed", "gang_id_for", "holds_in_vain", "intent_recorded", "launch_failed", "launch_intent", "launch_refused", "new_job_records",
    "first_events", "new_job_view", "parse_task_id", "recover", "set_pending_reason", "stop_gang", "stop_job", "task_id_for", "to_send",
]
