"""A clock for loops (peloton.loop.Clock) that moves only when a test moves it: a daemon's loops run through hours
of it in seconds, each pass when its own period says, and health judges them by it."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Collection


class ManualClock:
    def __init__(self, start: float = 1_000_000.0) -> None:
        self._now = start
        self._cond = threading.Condition()
        self._waiting: dict[str, float] = {}  # thread name -> when its wait ends

    def now(self) -> float:
        with self._cond:
            return self._now

    def wait(self, event: threading.Event, timeout: float) -> bool:
        name = threading.current_thread().name
        with self._cond:
            until = self._now + timeout
            self._waiting[name] = until
            try:
                while not event.is_set() and self._now < until:
                    self._cond.wait(0.1)  # real seconds, to see `event` (setting an Event notifies no condition)
            finally:
                self._waiting.pop(name, None)
            return event.is_set()

    def advance(self, seconds: float) -> None:
        with self._cond:
            self._now += seconds
            self._cond.notify_all()

    def idle(self, threads: Collection[str]) -> bool:
        """Every one of these threads waits on this clock and none of them is due: each has done what the time so
        far asked of it."""
        with self._cond:
            return all(self._waiting.get(name, -math.inf) > self._now for name in threads)


def settle(pred: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    """Until `pred()` holds (real time; the timeout only ends a test that would otherwise hang)."""
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"never settled: {what}")
        time.sleep(0.005)
