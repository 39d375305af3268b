"""A member's timeline (pure): its state events, oldest first, as segments of time in one state, run by run, for
the job page to draw. A segment lasts until the next event of the member (or `now` for the last one of a member
that has not ended)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

ENDED = frozenset({"SUCCEEDED", "FAILED", "KILLED", "LOST", "PREEMPTED"})


@dataclass(frozen=True)
class Event:
    run: int
    state: str
    time: float
    host: str = ""
    reason: str = ""


@dataclass(frozen=True)
class Segment:
    run: int
    state: str
    start: float
    end: float
    host: str
    reason: str


def segments(events: Iterable[Event], now: float) -> list[Segment]:
    """Each event starts a segment that ends at the next one; the last ends at `now` unless its state is final
    (then it is a point: start == end). Events out of order (clocks of different hosts) are taken by time."""
    ordered = sorted(events, key=lambda e: (e.time, e.run))
    out = []
    for i, e in enumerate(ordered):
        if i + 1 < len(ordered):
            end = max(e.time, ordered[i + 1].time)
        else:
            end = e.time if e.state in ENDED else max(e.time, now)
        out.append(Segment(e.run, e.state, e.time, end, e.host, e.reason))
    return out
