"""State machines of tasks, gangs and jobs as declared tables, with a pure validator.

Only transitions listed here are legal; `check_*` raise IllegalTransition for anything else.
"""

from __future__ import annotations

from enum import StrEnum

from peloton.errors import FailedPrecondition


class IllegalTransition(FailedPrecondition):
    pass


class TaskState(StrEnum):
    INITIALIZED = "INITIALIZED"
    PENDING = "PENDING"
    READY = "READY"
    PLACING = "PLACING"
    PLACED = "PLACED"
    LAUNCHING = "LAUNCHING"  # write-ahead intent committed (hosts, ports, GPUs, task ids); launch may be in flight
    LAUNCHED = "LAUNCHED"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    KILLING = "KILLING"
    PREEMPTING = "PREEMPTING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    LOST = "LOST"
    KILLED = "KILLED"

    @property
    def terminal(self) -> bool:
        return self in TASK_TERMINAL


TASK_TERMINAL = frozenset({TaskState.SUCCEEDED, TaskState.FAILED, TaskState.LOST, TaskState.KILLED})
T = TaskState

# A member of a gang that is torn down and re-queued goes back to PENDING under a new task id (new attempt);
# that is the only way out of a terminal state.
TASK_TRANSITIONS: dict[TaskState, frozenset[TaskState]] = {
    T.INITIALIZED: frozenset({T.PENDING, T.KILLED}),
    T.PENDING: frozenset({T.READY, T.PLACING, T.PLACED, T.LAUNCHING, T.KILLED, T.FAILED}),
    T.READY: frozenset({T.PLACING, T.PLACED, T.LAUNCHING, T.PENDING, T.KILLED}),
    T.PLACING: frozenset({T.PLACED, T.READY, T.PENDING, T.KILLED}),
    T.PLACED: frozenset({T.LAUNCHING, T.PENDING, T.KILLED}),
    T.LAUNCHING: frozenset({T.LAUNCHED, T.STARTING, T.RUNNING, T.FAILED, T.LOST, T.KILLING, T.PREEMPTING,
                            T.KILLED, T.SUCCEEDED, T.PENDING}),
    T.LAUNCHED: frozenset({T.STARTING, T.RUNNING, T.FAILED, T.LOST, T.KILLING, T.PREEMPTING, T.KILLED,
                           T.SUCCEEDED, T.PENDING}),
    T.STARTING: frozenset({T.RUNNING, T.FAILED, T.LOST, T.KILLING, T.PREEMPTING, T.KILLED, T.SUCCEEDED,
                           T.PENDING}),
    T.RUNNING: frozenset({T.SUCCEEDED, T.FAILED, T.LOST, T.KILLING, T.PREEMPTING, T.KILLED, T.PENDING}),
    T.KILLING: frozenset({T.KILLED, T.SUCCEEDED, T.FAILED, T.LOST, T.PENDING}),
    # SIGTERM sent with the job's grace period; KILLING when the job is stopped meanwhile (the kill is already sent)
    T.PREEMPTING: frozenset({T.KILLED, T.SUCCEEDED, T.FAILED, T.LOST, T.PENDING, T.KILLING}),
    T.SUCCEEDED: frozenset({T.PENDING}),
    T.FAILED: frozenset({T.PENDING}),
    T.LOST: frozenset({T.PENDING}),
    T.KILLED: frozenset({T.PENDING}),
}
assert set(TASK_TRANSITIONS) == set(TaskState)


class GangState(StrEnum):
    QUEUED = "QUEUED"  # waiting in resmgr for admission and placement
    PREEMPTED = "PREEMPTED"  # as QUEUED, after a preemption ended its last run (which used up no attempt)
    ADMITTED = "ADMITTED"
    PLACED = "PLACED"  # placement accepted; unused by the current flows, which commit the intent as LAUNCHING
    LAUNCHING = "LAUNCHING"  # write-ahead intent committed (hosts, ports, GPUs, task ids); launch may be in flight
    RUNNING = "RUNNING"  # every member runs (or has already succeeded)
    PREEMPTING = "PREEMPTING"  # preempted: members have SIGTERM and their grace period; goes to PREEMPTED
    ABORTING = "ABORTING"  # members being killed; goes to QUEUED as the next attempt, or DONE
    DONE = "DONE"

    @property
    def active(self) -> bool:
        """Members may hold resources on hosts."""
        return self in GANG_ACTIVE

    @property
    def waiting(self) -> bool:
        """In resmgr's queue: waiting for admission and placement."""
        return self in GANG_WAITING


G = GangState
GANG_ACTIVE = frozenset({G.PLACED, G.LAUNCHING, G.RUNNING, G.PREEMPTING, G.ABORTING})
GANG_WAITING = frozenset({G.QUEUED, G.PREEMPTED, G.ADMITTED})
GANG_TRANSITIONS: dict[GangState, frozenset[GangState]] = {
    G.QUEUED: frozenset({G.ADMITTED, G.PLACED, G.LAUNCHING, G.DONE}),
    G.PREEMPTED: frozenset({G.ADMITTED, G.PLACED, G.LAUNCHING, G.DONE}),
    G.ADMITTED: frozenset({G.QUEUED, G.PLACED, G.LAUNCHING, G.DONE}),
    G.PLACED: frozenset({G.LAUNCHING, G.RUNNING, G.ABORTING, G.QUEUED, G.DONE}),
    G.LAUNCHING: frozenset({G.RUNNING, G.PREEMPTING, G.ABORTING, G.QUEUED, G.DONE}),
    G.RUNNING: frozenset({G.PREEMPTING, G.ABORTING, G.QUEUED, G.DONE}),
    G.PREEMPTING: frozenset({G.PREEMPTED, G.ABORTING, G.DONE}),
    G.ABORTING: frozenset({G.QUEUED, G.DONE}),
    G.DONE: frozenset(),
}
assert set(GANG_TRANSITIONS) == set(GangState)


class JobState(StrEnum):
    INITIALIZED = "INITIALIZED"  # a big job's rows going in; invisible to the scheduler
    PENDING = "PENDING"  # no gang runs; one waits in its queue (the first attempt, or a restart's next one)
    RUNNING = "RUNNING"  # a gang runs whole
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    FAILING = "FAILING"  # it has failed (a gang failed with no attempt left, or fail_job): its gangs are being torn
    #                      down, and it ends FAILED; never PENDING, which would claim a retry that will not come
    KILLING = "KILLING"  # stopped: its gangs are being torn down, and it ends KILLED
    KILLED = "KILLED"

    @property
    def terminal(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.KILLED)


J = JobState
JOB_TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    J.INITIALIZED: frozenset({J.PENDING, J.KILLING, J.KILLED, J.FAILED}),
    J.PENDING: frozenset({J.RUNNING, J.KILLING, J.KILLED, J.FAILING, J.FAILED, J.SUCCEEDED}),
    J.RUNNING: frozenset({J.PENDING, J.SUCCEEDED, J.FAILING, J.FAILED, J.KILLING, J.KILLED}),
    # a failed job ends FAILED, stopped meanwhile or not: its reason says why it failed
    J.FAILING: frozenset({J.FAILED}),
    J.KILLING: frozenset({J.KILLED, J.FAILED, J.SUCCEEDED}),
    J.SUCCEEDED: frozenset(),
    J.FAILED: frozenset(),
    J.KILLED: frozenset(),
}
assert set(JOB_TRANSITIONS) == set(JobState)


def task_can(frm: TaskState, to: TaskState) -> bool:
    return frm == to or to in TASK_TRANSITIONS[frm]


def gang_can(frm: GangState, to: GangState) -> bool:
    return frm == to or to in GANG_TRANSITIONS[frm]


def job_can(frm: JobState, to: JobState) -> bool:
    return frm == to or to in JOB_TRANSITIONS[frm]


def check_task(frm: TaskState, to: TaskState) -> TaskState:
    if not task_can(frm, to):
        raise IllegalTransition(f"task state {frm.value} -> {to.value} is not allowed")
    return to


def check_gang(frm: GangState, to: GangState) -> GangState:
    if not gang_can(frm, to):
        raise IllegalTransition(f"gang state {frm.value} -> {to.value} is not allowed")
    return to


def check_job(frm: JobState, to: JobState) -> JobState:
    if not job_can(frm, to):
        raise IllegalTransition(f"job state {frm.value} -> {to.value} is not allowed")
    return to
