"""ListTaskEvents' answer stays under its byte budget (pure): the newest events kept, the oldest left out."""

from __future__ import annotations

from peloton.api.v1 import task_pb2
from peloton.jobmgr.service import MAX_PAGE_BYTES, newest_within


def test_the_newest_events_that_fit_the_budget_are_kept() -> None:
    events = [task_pb2.TaskEvent(instance=i, state="FAILED", time=float(i), message="x" * 1000) for i in range(10)]
    each = events[9].ByteSize()  # (the first, of instance 0 and time 0, encodes neither: it is smaller)
    assert newest_within(events, 10 * (each + 4)) == events  # all fit
    kept = newest_within(events, 3 * (each + 4) + 1)
    assert [e.instance for e in kept] == [7, 8, 9]  # the newest three, still oldest first
    assert newest_within(events, 0) == [] and newest_within([], 100) == []


def test_an_answer_of_big_messages_stays_under_two_mib() -> None:
    events = [task_pb2.TaskEvent(instance=i, state="FAILED", time=float(i), message="m" * 4096) for i in range(1000)]
    kept = newest_within(events, MAX_PAGE_BYTES)
    answer = task_pb2.ListTaskEventsResponse(events=kept, total=len(events))
    assert 0 < len(kept) < len(events) and kept[-1].instance == 999
    assert answer.ByteSize() <= MAX_PAGE_BYTES
