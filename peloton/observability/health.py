"""Whether a periodic loop is stuck, and what the daemon's health says: pure functions over plain data and a clock
reading passed in, so the health service, the `peloton_loop_stuck` metric (and the alert on it) and the tests all
judge alike.

A loop (loop.py) is either waiting for its next pass or in a pass. Waiting is never stuck, however long its period:
a loop that runs every 10 minutes is idle for 10 minutes. It is stuck when

- its thread is not running (never started, or ended);
- its next pass was due and has not begun, well past the wait it meant (a margin of its patience, or of the wait
  itself when that is longer: a back-off after errors);
- a pass has gone longer than its patience without finishing or reporting progress (`loop.progress()`: a long pass
  that is moving, such as the retention loop deleting job after job, is not stuck).

Its patience derives from its period: 90 s (more than the longest deadline of a call a pass makes, 60 s, such as
a launch or a reconciliation a slow host manager answers late; a long poll lasts up to ~11 s), or its period when
that is longer."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

STUCK_FLOOR_S = 90.0
# loops that serve every role of their process: the store loop renews the locks of all of them (a process leads
# all its roles or none), and the health loop reports on all of them
_EVERY_ROLE = frozenset({"store", "health"})


@dataclass(frozen=True, slots=True)
class LoopState:
    name: str
    interval_s: float
    started: bool  # start() was called
    alive: bool  # its thread runs
    stopping: bool  # asked to stop (the daemon is shutting down): not stuck, whatever else
    in_pass: bool
    since: float  # in a pass: when it began or last reported progress; waiting: when the wait began
    wait_s: float  # waiting: how long it waits (its interval, or a back-off after errors)


def patience_s(interval_s: float) -> float:
    """How long a loop may go without a sign of life that its own period does not explain."""
    return max(STUCK_FLOOR_S, interval_s)


def stuck_reason(s: LoopState, now: float) -> str:
    """Why the loop is stuck at `now` (the same clock as its `since`), or "" when it is not."""
    if s.stopping:
        return ""
    if not s.started:
        return "it was never started"
    if not s.alive:
        return "its thread has ended"
    patience = patience_s(s.interval_s)
    if s.in_pass:
        quiet = now - s.since
        if quiet > patience:
            return f"a pass has made no progress for {quiet:.0f} s (its limit: {patience:.0f} s)"
        return ""
    late = now - (s.since + s.wait_s)
    margin = max(patience, s.wait_s)
    if late > margin:
        return f"its next pass is {late:.0f} s overdue (its limit: {margin:.0f} s)"
    return ""


def loop_roles(name: str, roles: Collection[str]) -> frozenset[str]:
    """The roles (of those the process runs) a loop works for: its stall turns their health services
    NOT_SERVING."""
    if name in _EVERY_ROLE:
        return frozenset(roles)
    if name == "placement":
        mine = "placement"
    elif name.startswith(("local-", "mesos-")):  # the host manager's backend's own loops
        mine = "hostmgr"
    else:  # launchers, task events, reconciler, retention
        mine = "jobmgr"
    return frozenset({mine}) & frozenset(roles)


@dataclass(frozen=True, slots=True)
class Verdict:
    serving: bool  # the services "peloton" and ""
    roles: dict[str, bool]  # each role's service, "peloton.<role>"
    stuck: dict[str, str]  # loop name -> why it is stuck


def judge(loops: Sequence[LoopState], roles: Collection[str], now: float, *, store_ok: bool,
          leads: bool) -> Verdict:
    """The daemon's health at `now`: NOT_SERVING while a loop is stuck or the store is not ours to act on
    (`store_ok`: it answers and this process holds its locks and acts); each role NOT_SERVING while one of its
    loops is stuck or the process does not lead (`leads`), and the job manager's also while the store is lost."""
    stuck = {s.name: why for s in loops if (why := stuck_reason(s, now))}
    per_role = {}
    for role in roles:
        mine = [name for name in stuck if role in loop_roles(name, roles)]
        per_role[role] = not mine and leads and (store_ok or role != "jobmgr")
    return Verdict(serving=not stuck and store_ok, roles=per_role, stuck=stuck)
