"""The state tables: every listed transition is legal, everything else raises IllegalTransition."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from enum import Enum
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from peloton.domain.states import (
    GANG_TRANSITIONS,
    JOB_TRANSITIONS,
    TASK_TERMINAL,
    TASK_TRANSITIONS,
    GangState,
    IllegalTransition,
    JobState,
    TaskState,
    check_gang,
    check_job,
    check_task,
)
from peloton.errors import FailedPrecondition

MACHINES: list[tuple[str, type[Enum], dict[Any, frozenset[Any]], Callable[[Any, Any], Any]]] = [
    ("task", TaskState, TASK_TRANSITIONS, check_task),
    ("gang", GangState, GANG_TRANSITIONS, check_gang),
    ("job", JobState, JOB_TRANSITIONS, check_job),
]


def _all_pairs() -> list[tuple[str, Any, Any, bool]]:
    out = []
    for name, enum, table, _ in MACHINES:
        for frm, to in itertools.product(list(enum), repeat=2):
            out.append((name, frm, to, frm == to or to in table[frm]))
    return out


CHECKS = {name: check for name, _, _, check in MACHINES}


@pytest.mark.parametrize("name,enum,table,check", MACHINES, ids=[m[0] for m in MACHINES])
def test_table_covers_every_state(name: str, enum: type[Enum], table: dict[Any, frozenset[Any]], check: Any) -> None:
    assert set(table) == set(enum)
    for targets in table.values():
        assert targets <= set(enum)


@pytest.mark.parametrize("name,frm,to,legal", _all_pairs(), ids=lambda v: getattr(v, "value", str(v)))
def test_exhaustive_pairs(name: str, frm: Any, to: Any, legal: bool) -> None:
    check = CHECKS[name]
    if legal:
        assert check(frm, to) == to
    else:
        with pytest.raises(IllegalTransition) as err:
            check(frm, to)
        assert frm.value in str(err.value) and to.value in str(err.value)
        assert isinstance(err.value, FailedPrecondition)


def test_staying_in_a_state_is_allowed() -> None:
    for _, enum, _, check in MACHINES:
        for s in enum:
            assert check(s, s) == s


def test_terminal_task_states_only_lead_to_pending() -> None:
    assert {TaskState.SUCCEEDED, TaskState.FAILED, TaskState.LOST, TaskState.KILLED} == TASK_TERMINAL
    for s in TASK_TERMINAL:
        assert s.terminal
        assert TASK_TRANSITIONS[s] == frozenset({TaskState.PENDING})
        for to in TaskState:
            if to not in (s, TaskState.PENDING):
                with pytest.raises(IllegalTransition):
                    check_task(s, to)
    assert not any(s.terminal for s in TaskState if s not in TASK_TERMINAL)


def test_terminal_job_and_done_gang_are_dead_ends() -> None:
    for s in JobState:
        assert (JOB_TRANSITIONS[s] == frozenset()) == s.terminal
    assert GANG_TRANSITIONS[GangState.DONE] == frozenset()
    assert {s for s in GangState if s.active} == {
        GangState.PLACED,
        GangState.LAUNCHING,
        GangState.RUNNING,
        GangState.ABORTING,
    }


def test_every_task_state_reaches_a_terminal_state() -> None:
    for start in TaskState:
        seen, todo = {start}, [start]
        while todo:
            s = todo.pop()
            for t in TASK_TRANSITIONS[s]:
                if t not in seen:
                    seen.add(t)
                    todo.append(t)
        assert seen & TASK_TERMINAL


@settings(max_examples=200, deadline=None)
@given(data=st.data(), machine=st.sampled_from(MACHINES), steps=st.integers(0, 30))
def test_random_walks_following_the_table_never_raise(data: st.DataObject, machine: Any, steps: int) -> None:
    _, enum, table, check = machine
    state = data.draw(st.sampled_from(list(enum)))
    for _ in range(steps):
        options = sorted(table[state] | {state}, key=lambda s: s.value)
        nxt = data.draw(st.sampled_from(options))
        state = check(state, nxt)
        assert state == nxt
