"""The one loop pattern: errors back off; work runs the next iteration at once; what a loop is doing (waiting for
its next pass, or in a pass since when) says whether it is stuck, by its own period, and a long pass that reports
progress is not."""

from __future__ import annotations

import random
import sys
import threading
import time

import pytest
from prometheus_client import REGISTRY

from peloton.errors import Unavailable
from peloton.loop import MAX_BACKOFF_S, Loop, progress
from tests.clocks import ManualClock, settle


def test_the_backoff_doubles_per_error_up_to_a_cap() -> None:
    top = lambda: 1.0  # noqa: E731 - the un-jittered delay
    lp = Loop("x", lambda: False, 5.0, rand=top)
    assert lp.backoff_s() == 5.0
    waits = []
    for n in range(1, 40):
        lp.consecutive_errors = n
        waits.append(lp.backoff_s())
    assert waits[0] == MAX_BACKOFF_S == 10.0  # 5 s doubled, then capped
    assert max(waits) == MAX_BACKOFF_S < 60.0
    fast = Loop("y", lambda: False, 0.05, rand=top)
    fast.consecutive_errors = 1
    assert fast.backoff_s() == 0.1
    fast.consecutive_errors = 3
    assert fast.backoff_s() == 0.4
    fast.consecutive_errors = 1000
    assert fast.backoff_s() == MAX_BACKOFF_S
    slow = Loop("z", lambda: False, 30.0, rand=lambda: 0.0)  # a loop slower than the cap is never made faster
    slow.consecutive_errors = 3
    assert slow.backoff_s() == 30.0
    spin = Loop("w", lambda: False, 0.0, rand=lambda: 0.0)  # no interval: an error still pauses
    spin.consecutive_errors = 1
    assert spin.backoff_s() > 0


def test_the_backoff_after_errors_is_jittered_within_half_of_its_delay() -> None:
    rng = random.Random(7)
    lp = Loop("x", lambda: False, 0.05, rand=rng.random)
    lp.consecutive_errors = 3  # 0.4 s un-jittered
    waits = [lp.backoff_s() for _ in range(200)]
    assert all(0.2 <= w <= 0.4 for w in waits)
    assert max(waits) - min(waits) > 0.15  # spread over the range, not one value
    lp.consecutive_errors = 0
    assert lp.backoff_s() == 0.05  # a healthy loop keeps its period exactly


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
        assert not lp.stuck(time.monotonic())
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
    lp.start()
    try:
        assert done.wait(5)  # 50 iterations did not wait an hour each
        time.sleep(0.05)
        assert n == 50  # idle now: waits its interval
    finally:
        lp.stop()


def _waiting(clock: ManualClock, lp: Loop) -> None:
    settle(lambda: clock.idle({f"loop-{lp.name}"}), f"{lp.name} waiting")


def test_a_loop_waiting_for_its_next_pass_is_not_stuck_however_long_its_period() -> None:
    clock = ManualClock()
    passes: list[float] = []

    def one_pass() -> bool:
        passes.append(clock.now())
        return False

    lp = Loop("slow", one_pass, 600.0, clock)
    assert lp.stuck(clock.now()) == "it was never started"
    lp.start()
    try:
        _waiting(clock, lp)
        for _ in range(3 * 600 // 50):  # three of its periods, in steps of 50 s
            clock.advance(50)
            _waiting(clock, lp)
            assert lp.stuck(clock.now()) == ""
            assert REGISTRY.get_sample_value("peloton_loop_stuck", {"loop": "slow"}) == 0.0
        assert len(passes) == 1 + 3  # at start, then every 600 s of its clock
    finally:
        lp.stop()
    assert lp.stuck(clock.now()) == ""  # stopped on purpose: not stuck


def test_a_pass_that_blocks_is_stuck_past_its_patience_and_progress_keeps_a_long_pass_alive() -> None:
    clock = ManualClock()
    go, entered = threading.Event(), threading.Event()
    steps: list[int] = []

    def long_pass() -> bool:
        entered.set()
        while not go.wait(0.005):
            if steps:
                steps.pop()
                progress()
        return False

    lp = Loop("long", long_pass, 5.0, clock)
    lp.start()
    try:
        assert entered.wait(10)
        clock.advance(90)
        assert lp.stuck(clock.now()) == ""  # 90 s without progress: at its patience, not past it
        for _ in range(12):  # ten minutes more, reporting progress every 50 s
            clock.advance(50)
            steps.append(1)
            settle(lambda: not steps, "the pass to report progress")
            assert lp.stuck(clock.now()) == ""
        clock.advance(91)
        assert lp.stuck(clock.now()) == "a pass has made no progress for 91 s (its limit: 90 s)"
        assert REGISTRY.get_sample_value("peloton_loop_stuck", {"loop": "long"}) == 1.0
        go.set()
        _waiting(clock, lp)
        assert lp.stuck(clock.now()) == ""
        assert REGISTRY.get_sample_value("peloton_loop_stuck", {"loop": "long"}) == 0.0
    finally:
        go.set()
        lp.stop()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_loop_whose_thread_ended_is_stuck() -> None:
    clock = ManualClock()

    def dies() -> bool:
        raise SystemExit  # not an Exception: the loop does not survive it

    lp = Loop("dies", dies, 1.0, clock)
    lp.start()
    settle(lambda: not lp.state().alive, "the thread to end")
    assert lp.stuck(clock.now()) == "its thread has ended"
    assert REGISTRY.get_sample_value("peloton_loop_stuck", {"loop": "dies"}) == 1.0


def test_progress_outside_a_loop_does_nothing() -> None:
    progress()  # recovery at start, a request thread: no loop to tell


def test_a_thread_that_dies_of_an_uncaught_exception_is_logged_and_counted(caplog: pytest.LogCaptureFixture
                                                                            ) -> None:
    """The daemon's safety net (run_server installs it): a thread ended by a bug past its own error handling is
    counted for the alert and logged with its traceback, not only printed to stderr."""
    from peloton.loop import count_thread_deaths, thread_kind

    assert [thread_kind(n) for n in ("jobmgr-writer-1", "grpc_3", "console", "Thread-5 (run)", "local-journal")] == [
        "jobmgr-writer", "grpc", "console", "unnamed", "local-journal"]

    def deaths() -> float:
        return REGISTRY.get_sample_value("peloton_thread_deaths_total", {"thread": "doomed-worker"}) or 0.0

    def boom() -> None:
        raise KeyError("a bug")

    before, hook = deaths(), threading.excepthook
    count_thread_deaths()
    try:
        t = threading.Thread(target=boom, name="doomed-worker-2")
        t.start()
        t.join(5)
        quiet = threading.Thread(target=sys.exit, name="doomed-worker-3")  # (SystemExit ends a thread as asked)
        quiet.start()
        quiet.join(5)
    finally:
        threading.excepthook = hook
    assert deaths() - before == 1
    (rec,) = [r for r in caplog.records if "doomed-worker" in r.getMessage()]
    assert rec.levelname == "CRITICAL" and "doomed-worker-2" in rec.getMessage() and rec.exc_info is not None
    assert rec.exc_info[0] is KeyError
