"""The stuck decision and the health verdict (peloton/observability/health.py): pure, over plain loop states and a clock reading."""

from __future__ import annotations

import pytest

from peloton.observability.health import STUCK_FLOOR_S, LoopState, judge, loop_roles, patience_s, stuck_reason

ROLES = ("jobmgr", "resmgr", "placement", "hostmgr")


def waiting(name: str, interval: float, since: float, wait: float | None = None) -> LoopState:
    return LoopState(name, interval, started=True, alive=True, stopping=False, in_pass=False, since=since,
                     wait_s=interval if wait is None else wait)


def in_pass(name: str, interval: float, since: float) -> LoopState:
    return LoopState(name, interval, started=True, alive=True, stopping=False, in_pass=True, since=since, wait_s=0.0)


def test_patience_derives_from_the_period() -> None:
    assert patience_s(0.05) == patience_s(5.0) == STUCK_FLOOR_S == 90.0
    assert patience_s(600.0) == 600.0


@pytest.mark.parametrize("interval", [0.05, 1.0, 5.0, 600.0, 3600.0])
def test_waiting_for_the_next_pass_is_never_stuck_before_it_is_due(interval: float) -> None:
    for idle in (0.0, interval / 2, interval, interval + patience_s(interval)):
        assert stuck_reason(waiting("x", interval, since=1000.0), 1000.0 + idle) == "", idle


def test_a_due_pass_not_begun_is_stuck_past_the_margin() -> None:
    s = waiting("retention", 600.0, since=0.0)
    assert stuck_reason(s, 600.0 + 600.0) == ""
    assert stuck_reason(s, 600.0 + 601.0) == "its next pass is 601 s overdue (its limit: 600 s)"
    fast = waiting("placement", 0.05, since=0.0)
    assert stuck_reason(fast, 90.0) == ""
    assert stuck_reason(fast, 91.0) != ""


def test_a_back_off_is_part_of_the_wait() -> None:
    s = waiting("store", 1.0, since=0.0, wait=10.0)  # backing off after errors: 10 s, not its 1 s
    assert stuck_reason(s, 10.0 + 90.0) == ""
    assert stuck_reason(s, 10.0 + 91.0) != ""
    long_wait = waiting("x", 1.0, since=0.0, wait=200.0)  # a wait longer than its patience: the wait's margin
    assert stuck_reason(long_wait, 200.0 + 200.0) == ""
    assert stuck_reason(long_wait, 200.0 + 201.0) != ""


def test_a_pass_without_progress_past_its_patience_is_stuck() -> None:
    assert stuck_reason(in_pass("reconciler", 5.0, since=0.0), 90.0) == ""
    assert stuck_reason(in_pass("reconciler", 5.0, since=0.0), 91.0) == \
        "a pass has made no progress for 91 s (its limit: 90 s)"
    assert stuck_reason(in_pass("retention", 600.0, since=0.0), 600.0) == ""
    assert stuck_reason(in_pass("retention", 600.0, since=0.0), 601.0) != ""


def test_a_thread_not_running_is_stuck_unless_it_was_asked_to_stop() -> None:
    never = LoopState("x", 1.0, started=False, alive=False, stopping=False, in_pass=False, since=0.0, wait_s=0.0)
    assert stuck_reason(never, 0.0) == "it was never started"
    dead = LoopState("x", 1.0, started=True, alive=False, stopping=False, in_pass=True, since=0.0, wait_s=0.0)
    assert stuck_reason(dead, 0.0) == "its thread has ended"
    stopped = LoopState("x", 1.0, started=True, alive=False, stopping=True, in_pass=True, since=0.0, wait_s=0.0)
    assert stuck_reason(stopped, 1e9) == ""


def test_loops_belong_to_their_roles() -> None:
    assert loop_roles("launcher-2", ROLES) == {"jobmgr"}
    assert loop_roles("retention", ROLES) == {"jobmgr"}
    assert loop_roles("placement", ROLES) == {"placement"}
    assert loop_roles("local-sandboxes", ROLES) == loop_roles("mesos-ticker", ROLES) == {"hostmgr"}
    assert loop_roles("store", ROLES) == loop_roles("health", ROLES) == set(ROLES)
    assert loop_roles("store", ("resmgr",)) == {"resmgr"}  # a process's loops serve only the roles it runs


def test_the_verdict() -> None:
    now = 10_000.0
    idle = [waiting("retention", 600.0, since=now - 500), waiting("placement", 0.05, since=now - 1)]
    v = judge(idle, ROLES, now, store_ok=True, leads=True)
    assert v.serving and all(v.roles.values()) and not v.stuck
    stuck = [*idle, in_pass("local-sandboxes", 600.0, since=now - 700)]
    v = judge(stuck, ROLES, now, store_ok=True, leads=True)
    assert not v.serving and set(v.stuck) == {"local-sandboxes"}
    assert v.roles == {"jobmgr": True, "resmgr": True, "placement": True, "hostmgr": False}
    v = judge(idle, ROLES, now, store_ok=False, leads=True)  # the store is away: the job manager's role
    assert not v.serving and v.roles == {"jobmgr": False, "resmgr": True, "placement": True, "hostmgr": True}
    v = judge(idle, ROLES, now, store_ok=False, leads=False)  # another process leads: every role
    assert not any(v.roles.values())
