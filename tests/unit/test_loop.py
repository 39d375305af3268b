"""The one loop pattern: errors back off without ever outlasting the health check; work runs the next iteration at
once; the heartbeat says whether a loop is alive."""

from __future__ import annotations

import threading
import time

from peloton.errors import Unavailable
from peloton.loop import MAX_BACKOFF_S, Loop


def test_the_backoff_doubles_per_error_and_stays_under_the_health_checks_staleness() -> None:
    lp = Loop("x", lambda: False, 5.0)
    assert lp.backoff_s() == 5.0
    waits = []
    for n in range(1, 40):
        lp.consecutive_errors = n
        waits.append(lp.backoff_s())
    assert waits[0] == MAX_BACKOFF_S == 10.0  # 5 s doubled, then capped
    assert max(waits) == MAX_BACKOFF_S < 60.0
    fast = Loop("y", lambda: False, 0.05)
    fast.consecutive_errors = 1
    assert fast.backoff_s() == 0.1
    fast.consecutive_errors = 3
    assert fast.backoff_s() == 0.4
    fast.consecutive_errors = 1000
    assert fast.backoff_s() == MAX_BACKOFF_S
    slow = Loop("z", lambda: False, 30.0)  # a loop slower than the cap is never made faster by an error
    slow.consecutive_errors = 3
    assert slow.backoff_s() == 30.0


def test_a_loop_survives_errors_and_resumes_when_its_dependency_returns() -> None:
    calls: list[float] = []
    ok = threading.Event()

    def run_once() -> bool:
        calls.append(time.monotonic())
        if len(calls) < 3:
            raise Unavailable("the store is unavailable")
        ok.set()
        return False

    lp = Loop("flaky", run_once, 0.01)
    lp.start()
    try:
        assert ok.wait(5), calls
        assert lp.consecutive_errors == 0
        assert lp.healthy(time.time())
    finally:
        lp.stop()
    assert not lp._thread or not lp._thread.is_alive()  # noqa: SLF001


def test_work_runs_the_next_iteration_at_once_and_idleness_waits_the_interval() -> None:
    n = 0
    done = threading.Event()

    def run_once() -> bool:
        nonlocal n
        n += 1
        if n == 50:
            done.set()
        return n < 50  # work, work, ... then idle

    lp = Loop("busy", run_once, 3600.0)
    t0 = time.monotonic()
    lp.start()
    try:
        assert done.wait(5)
        assert time.monotonic() - t0 < 5  # 50 iterations did not wait an hour each
        time.sleep(0.05)
        assert n == 50  # idle now: waits its interval
    finally:
        lp.stop()


def test_a_loop_whose_thread_is_gone_or_silent_is_unhealthy() -> None:
    lp = Loop("quiet", lambda: False, 3600.0)
    assert not lp.healthy(time.time())  # never started
    lp.start()
    try:
        assert lp.healthy(time.time())
        assert not lp.healthy(time.time() + 61)  # no heartbeat for a minute: stuck
    finally:
        lp.stop()
