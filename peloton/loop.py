"""The one loop pattern for every periodic component: `run_once()` in a thread, start/stop, what it is doing now
(waiting for its next pass, or in a pass since when) for health and metrics (health.py judges it), and `progress()`
for a long pass to say it is still moving.

The clock is passed in: the system's (monotonic, for the waits and the stuck decision), or a test's that it moves
by hand, so a test can run a daemon's loops through hours without waiting for them."""

from __future__ import annotations

import logging
import random
import re
import threading
import time
from collections.abc import Callable
from typing import Protocol

from prometheus_client import Counter, Gauge

from peloton.errors import Unavailable
from peloton.observability.health import LoopState, stuck_reason
from peloton.retry import Backoff

log = logging.getLogger(__name__)

LOOP_RUNS = Counter("peloton_loop_runs_total", "Iterations of each periodic loop", ["loop"])
LOOP_ERRORS = Counter("peloton_loop_errors_total", "Iterations that raised", ["loop"])
MAX_BACKOFF_S = 10.0
MIN_ERROR_WAIT_S = 0.01  # a loop with no interval still pauses after an error (a failing pass must not spin)
LOOP_HEARTBEAT = Gauge("peloton_loop_heartbeat_timestamp_seconds", "Last completed iteration (an idle loop completes "
                       "one per period: its age alone does not say stuck; peloton_loop_stuck does)", ["loop"])
LOOP_STUCK = Gauge("peloton_loop_stuck", "1 while the loop is stuck, as health judges it when scraped (its thread "
                   "gone, a due pass not begun, or a pass without progress past its patience); 0 otherwise", ["loop"])


THREAD_DEATHS = Counter("peloton_thread_deaths_total", "Threads that ended by an exception nothing caught: a bug, and "
                        "the work that thread did has stopped (its log has the traceback); restart the daemon",
                        ["thread"])


def thread_kind(name: str) -> str:
    """A thread's name without what numbers it among its kind (`jobmgr-writer-1`, `grpc_3`), so that the metric has
    one series per kind; threads the daemon did not name (`Thread-5 (run)`) are `unnamed`."""
    if name.startswith("Thread-"):
        return "unnamed"
    return re.sub(r"[-_]?\d+$", "", name) or "unnamed"


def count_thread_deaths() -> None:
    """The safety net under every thread of the daemon: one that ends by an uncaught exception (every long-lived
    thread catches what its work raises, docs/architecture.md; this is for a bug past that) is logged with its
    traceback and counted (peloton_thread_deaths_total), which the PelotonThreadDied alert pages on, rather than
    printed to stderr and forgotten while the daemon looks healthy."""
    def hook(args: threading.ExceptHookArgs) -> None:
        if args.exc_type is SystemExit:
            return
        name = args.thread.name if args.thread is not None else "unknown"
        THREAD_DEATHS.labels(thread_kind(name)).inc()
        log.critical("thread %s died of an uncaught exception; the work it did has stopped (restart the daemon)",
                     name, exc_info=args.exc_value or True)

    threading.excepthook = hook


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on a clock that never goes back (not the wall clock: a stuck decision must survive NTP)."""

    def wait(self, event: threading.Event, timeout: float) -> bool:
        """Until `event` is set (True) or `timeout` seconds of this clock have passed (False)."""


class SystemClock:
    def now(self) -> float:
        return time.monotonic()

    def wait(self, event: threading.Event, timeout: float) -> bool:
        return event.wait(timeout)


SYSTEM_CLOCK = SystemClock()
_current = threading.local()  # the Loop whose thread this is (progress() finds it there)


def progress() -> None:
    """A long pass says it is still moving (a job deleted, a chunk of members reconciled): the loop whose thread
    calls it is not stuck while this goes on. Anywhere else (recovery at start, a request thread) it does nothing,
    so code shared by loops and others calls it freely."""
    lp: Loop | None = getattr(_current, "loop", None)
    if lp is not None:
        lp.progressed()


def _unavailable(e: BaseException) -> bool:
    if isinstance(e, Unavailable):
        return True
    code = getattr(e, "code", None)  # a gRPC error that reached a loop unmapped (by its code's name: no grpcio here)
    if callable(code):
        try:
            return getattr(code(), "name", "") in ("UNAVAILABLE", "DEADLINE_EXCEEDED")
        except Exception:  # noqa: BLE001 - not a gRPC error after all
            return False
    return False


def _message(e: BaseException) -> str:
    details = getattr(e, "details", None)
    if callable(details):
        try:
            return str(details())
        except Exception:  # noqa: BLE001
            pass
    return str(e)


class Loop:
    """Calls `run_once()` every `interval_s` in a daemon thread. `run_once` may block (long polls) and returns
    True when it did work, in which case the next iteration starts at once."""

    def __init__(self, name: str, run_once: Callable[[], bool], interval_s: float,
                 clock: Clock = SYSTEM_CLOCK, rand: Callable[[], float] | None = None) -> None:
        self.name = name
        self._run_once = run_once
        self.interval_s = interval_s
        self._clock = clock
        # after the n-th error in a row: the interval doubled n times, at most MAX_BACKOFF_S (or the interval if
        # longer), with jitter so that the loops of daemons that lost one dependency together do not return in step
        cap = max(interval_s, MAX_BACKOFF_S)
        self._backoff = Backoff(min(max(interval_s, MIN_ERROR_WAIT_S) * 2, cap), cap)
        self._rand = rand if rand is not None else random.random
        self._stop = threading.Event()
        self._wake = threading.Event()  # set by stop and by wake(): ends the wait between passes
        self._thread: threading.Thread | None = None
        self.last_heartbeat = 0.0  # wall clock at the end of the last pass (the heartbeat metric)
        self.consecutive_errors = 0
        # (in a pass, since, wait): replaced whole, so a reader on another thread never sees half of a change
        self._phase: tuple[bool, float, float] = (False, 0.0, 0.0)

    def start(self) -> None:
        self._stop.clear()
        self._wake.clear()
        self._phase = (True, self._clock.now(), 0.0)  # its first pass begins now
        self._thread = threading.Thread(target=self._run, name=f"loop-{self.name}", daemon=True)
        self._thread.start()
        # judged when scraped, by the same rule as health: the two cannot disagree, and no thread has to be alive
        # for the metric to say that one is not
        LOOP_STUCK.labels(self.name).set_function(lambda: 1.0 if self.stuck(self._clock.now()) else 0.0)

    def stop(self, timeout: float = 5.0) -> None:
        self.signal_stop()
        self.join(timeout)

    def signal_stop(self) -> None:
        """Ask the loop to stop after its current pass (see `join`)."""
        self._stop.set()
        self._wake.set()

    def wake(self) -> None:
        """Begin the next pass now rather than after the wait (work arrived early); a pass in progress is followed
        by another at once. Cheap and lock-free: callable under a caller's lock."""
        self._wake.set()

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(max(0.0, timeout))

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def state(self) -> LoopState:
        in_pass, since, wait = self._phase
        t = self._thread
        return LoopState(self.name, self.interval_s, started=t is not None, alive=t is not None and t.is_alive(),
                         stopping=self.stopping, in_pass=in_pass, since=since, wait_s=wait)

    def stuck(self, now: float) -> str:
        """Why the loop is stuck at `now` (its clock's), or "" (health.py)."""
        return stuck_reason(self.state(), now)

    def progressed(self) -> None:
        """The pass in progress moved (see `progress()`)."""
        if self._phase[0]:
            self._phase = (True, self._clock.now(), 0.0)

    def _run(self) -> None:
        _current.loop = self
        # this loop's series, looked up once (not at every pass); a loop's name lives as long as the process
        runs, heartbeat = LOOP_RUNS.labels(self.name), LOOP_HEARTBEAT.labels(self.name)
        while not self._stop.is_set():
            self._phase = (True, self._clock.now(), 0.0)
            did_work = False
            try:
                did_work = bool(self._run_once())
                self.consecutive_errors = 0
            except Exception as e:  # noqa: BLE001 - a loop never dies of an error: it backs off and tries again
                if self._stop.is_set():
                    return  # the daemon is stopping: the error is its shutdown's (channels closed under a call)
                self.consecutive_errors += 1
                LOOP_ERRORS.labels(self.name).inc()
                if _unavailable(e):  # expected while a dependency (the store, a component) is away: one line
                    if self.consecutive_errors in (1, 10) or self.consecutive_errors % 100 == 0:
                        log.warning("loop %s: %s (%d in a row; backing off)", self.name, _message(e),
                                    self.consecutive_errors)
                else:
                    log.exception("loop %s failed (%d in a row)", self.name, self.consecutive_errors)
            self.last_heartbeat = time.time()
            runs.inc()
            heartbeat.set(self.last_heartbeat)
            if not did_work:
                wait = self.backoff_s()
                self._phase = (False, self._clock.now(), wait)
                self._clock.wait(self._wake, wait)
            if not self._stop.is_set():
                self._wake.clear()

    def backoff_s(self) -> float:
        """The wait before the next iteration: the interval, doubled for each error in a row (a broken dependency
        is not hammered) up to MAX_BACKOFF_S, so that a loop resumes soon after its dependency returns, less up
        to half at random (peloton.retry's jitter). The wait is part of the loop's state: health allows for it
        (health.py)."""
        if not self.consecutive_errors:
            return self.interval_s
        # never shorter than the interval: an error does not make a slow loop faster
        return max(self.interval_s, self._backoff.delay(self.consecutive_errors - 1, self._rand()))
