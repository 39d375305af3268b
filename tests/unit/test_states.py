"""The state machines: every transition docs/architecture.md ("State machines") lists is legal, everything else
raises IllegalTransition. The expected answers come from the documented tables, written out below as literal
data, never from the tables under test (peloton/domain/states.py)."""

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

# The rules as docs/architecture.md ("State machines") states them, written out independently of the tables
# under test: state -> the states it may go to. Staying in the same state is always allowed on top of these.
TERMINAL_TASK_TO = {"PENDING"}  # only as a new attempt with a new task id
DOC_TASK: dict[str, set[str]] = {
    "INITIALIZED": {"PENDING", "KILLED"},
    "PENDING": {"READY", "PLACING", "PLACED", "LAUNCHING", "KILLED", "FAILED"},
    "READY": {"PLACING", "PLACED", "LAUNCHING", "PENDING", "KILLED"},
    "PLACING": {"PLACED", "READY", "PENDING", "KILLED"},
    "PLACED": {"LAUNCHING", "PENDING", "KILLED"},
    "LAUNCHING": {"LAUNCHED", "STARTING", "RUNNING", "FAILED", "LOST", "KILLING", "PREEMPTING", "KILLED", "SUCCEEDED",
                  "PENDING"},
    "LAUNCHED": {"STARTING", "RUNNING", "FAILED", "LOST", "KILLING", "PREEMPTING", "KILLED", "SUCCEEDED", "PENDING"},
    "STARTING": {"RUNNING", "FAILED", "LOST", "KILLING", "PREEMPTING", "KILLED", "SUCCEEDED", "PENDING"},
    "RUNNING": {"SUCCEEDED", "FAILED", "LOST", "KILLING", "PREEMPTING", "KILLED", "PENDING"},
    "KILLING": {"KILLED", "SUCCEEDED", "FAILED", "LOST", "PENDING"},
    "PREEMPTING": {"KILLED", "SUCCEEDED", "FAILED", "LOST", "PENDING", "KILLING"},
    "SUCCEEDED": TERMINAL_TASK_TO,
    "FAILED": TERMINAL_TASK_TO,
    "LOST": TERMINAL_TASK_TO,
    "KILLED": TERMINAL_TASK_TO,
}
DOC_GANG: dict[str, set[str]] = {
    "QUEUED": {"ADMITTED", "PLACED", "LAUNCHING", "DONE"},
    "PREEMPTED": {"ADMITTED", "PLACED", "LAUNCHING", "DONE"},
    "ADMITTED": {"QUEUED", "PLACED", "LAUNCHING", "DONE"},
    "PLACED": {"LAUNCHING", "RUNNING", "ABORTING", "QUEUED", "DONE"},
    "LAUNCHING": {"RUNNING", "PREEMPTING", "ABORTING", "QUEUED", "DONE"},
    "RUNNING": {"PREEMPTING", "ABORTING", "QUEUED", "DONE"},
    "PREEMPTING": {"PREEMPTED", "ABORTING", "DONE"},
    "ABORTING": {"QUEUED", "DONE"},
    "DONE": set(),
}
DOC_JOB: dict[str, set[str]] = {
    "INITIALIZED": {"PENDING", "KILLING", "KILLED", "FAILED"},
    "PENDING": {"RUNNING", "KILLING", "KILLED", "FAILING", "FAILED", "SUCCEEDED"},
    "RUNNING": {"PENDING", "SUCCEEDED", "FAILING", "FAILED", "KILLING", "KILLED"},
    "FAILING": {"FAILED"},
    "KILLING": {"KILLED", "FAILED", "SUCCEEDED"},
    "SUCCEEDED": set(),
    "FAILED": set(),
    "KILLED": set(),
}

DOC_MACHINES: list[tuple[str, type[Enum], dict[str, set[str]], Callable[[Any, Any], Any]]] = [
    ("task", TaskState, DOC_TASK, check_task),
    ("gang", GangState, DOC_GANG, check_gang),
    ("job", JobState, DOC_JOB, check_job),
]
CHECKS = {name: check for name, _, _, check in DOC_MACHINES}
TABLES: dict[str, dict[Any, frozenset[Any]]] = {"task": TASK_TRANSITIONS, "gang": GANG_TRANSITIONS,
                                                "job": JOB_TRANSITIONS}


def doc_allows(doc: dict[str, set[str]], frm: str, to: str) -> bool:
    return frm == to or to in doc[frm]


def _all_pairs() -> list[Any]:
    out = []
    for name, enum, doc, _ in DOC_MACHINES:
        for frm, to in itertools.product([s.value for s in enum], repeat=2):
            out.append(pytest.param(name, frm, to, doc_allows(doc, frm, to), id=f"{name}-{frm}-{to}"))
    return out


@pytest.mark.parametrize("name,enum,doc", [m[:3] for m in DOC_MACHINES], ids=[m[0] for m in DOC_MACHINES])
def test_the_documented_states_are_the_states_of_the_code(name: str, enum: type[Enum], doc: dict[str, set[str]]) -> None:
    values = {s.value for s in enum}
    assert set(doc) == values, f"{name}: documented {sorted(doc)} vs code {sorted(values)}"
    for targets in doc.values():
        assert targets <= values
    table = TABLES[name]
    assert set(table) == set(enum)
    for allowed in table.values():
        assert allowed <= set(enum)


@pytest.mark.parametrize("name,frm,to,legal", _all_pairs())
def test_exhaustive_pairs_follow_the_documented_tables(name: str, frm: str, to: str, legal: bool) -> None:
    enum = next(e for n, e, _, _ in DOC_MACHINES if n == name)
    check = CHECKS[name]
    f, t = enum(frm), enum(to)
    if legal:
        assert check(f, t) == t
    else:
        with pytest.raises(IllegalTransition) as err:
            check(f, t)
        assert frm in str(err.value) and to in str(err.value)
        assert isinstance(err.value, FailedPrecondition)


def test_staying_in_a_state_is_allowed() -> None:
    for _, enum, _, check in DOC_MACHINES:
        for s in enum:
            assert check(s, s) == s


def test_terminal_task_states_only_lead_to_pending() -> None:
    assert {s.value for s in TASK_TERMINAL} == {"SUCCEEDED", "FAILED", "LOST", "KILLED"}  # as documented
    for s in TASK_TERMINAL:
        assert s.terminal
        assert TASK_TRANSITIONS[s] == frozenset({TaskState.PENDING})
        for to in TaskState:
            if to not in (s, TaskState.PENDING):
                with pytest.raises(IllegalTransition):
                    check_task(s, to)
    assert not any(s.terminal for s in TaskState if s not in TASK_TERMINAL)


def test_terminal_job_and_done_gang_are_dead_ends() -> None:
    assert {s.value for s in JobState if s.terminal} == {"SUCCEEDED", "FAILED", "KILLED"}  # as documented
    for s in JobState:
        assert (JOB_TRANSITIONS[s] == frozenset()) == s.terminal
    assert GANG_TRANSITIONS[GangState.DONE] == frozenset()
    assert {s for s in GangState if s.active} == {
        GangState.PLACED,
        GangState.LAUNCHING,
        GangState.RUNNING,
        GangState.PREEMPTING,
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
@given(data=st.data(), machine=st.sampled_from(DOC_MACHINES), steps=st.integers(0, 30))
def test_random_walks_following_the_documented_table_never_raise(data: st.DataObject, machine: Any,
                                                                  steps: int) -> None:
    _, enum, doc, check = machine
    state = data.draw(st.sampled_from(sorted(doc)))
    for _ in range(steps):
        nxt = data.draw(st.sampled_from(sorted(doc[state] | {state})))
        assert check(enum(state), enum(nxt)) == enum(nxt)
        state = nxt
