"""A member's timeline (peloton/console/timeline.py, pure): segments from its state events."""

from __future__ import annotations

from peloton.console.timeline import Event, Segment, segments


def test_each_state_lasts_until_the_next_and_a_live_one_until_now() -> None:
    evs = [Event(1, "PENDING", 10.0), Event(1, "LAUNCHING", 12.0, "h1"), Event(1, "RUNNING", 13.0, "h1")]
    assert segments(evs, now=20.0) == [Segment(1, "PENDING", 10.0, 12.0, "", ""),
                                       Segment(1, "LAUNCHING", 12.0, 13.0, "h1", ""),
                                       Segment(1, "RUNNING", 13.0, 20.0, "h1", "")]


def test_a_final_state_is_a_point_and_runs_follow_each_other() -> None:
    evs = [Event(2, "RUNNING", 30.0, "h2"), Event(1, "RUNNING", 10.0, "h1"),
           Event(1, "PREEMPTED", 20.0, "h1", "preempted for /prod"), Event(2, "SUCCEEDED", 40.0, "h2")]
    got = segments(evs, now=100.0)
    assert [(g.run, g.state, g.start, g.end) for g in got] == [
        (1, "RUNNING", 10.0, 20.0), (1, "PREEMPTED", 20.0, 30.0), (2, "RUNNING", 30.0, 40.0),
        (2, "SUCCEEDED", 40.0, 40.0)]
    assert got[1].reason == "preempted for /prod"


def test_no_segment_runs_backwards_when_clocks_disagree() -> None:
    got = segments([Event(1, "RUNNING", 50.0), Event(1, "FAILED", 50.0)], now=10.0)
    assert all(g.end >= g.start for g in got) and segments([], now=1.0) == []
    assert segments([Event(1, "RUNNING", 50.0)], now=10.0) == [Segment(1, "RUNNING", 50.0, 50.0, "", "")]
