"""The one loop pattern for every periodic component: `run_once()` in a thread, start/stop, and a heartbeat
that feeds health and metrics."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import grpc
from prometheus_client import Counter, Gauge

from peloton.errors import Unavailable

log = logging.getLogger(__name__)

LOOP_RUNS = Counter("peloton_loop_runs_total", "Iterations of each periodic loop", ["loop"])
LOOP_ERRORS = Counter("peloton_loop_errors_total", "Iterations that raised", ["loop"])
MAX_BACKOFF_S = 10.0
LOOP_HEARTBEAT = Gauge("peloton_loop_heartbeat_timestamp_seconds", "Last completed iteration", ["loop"])


def _unavailable(e: BaseException) -> bool:
    if isinstance(e, Unavailable):
        return True
    code = getattr(e, "code", None)
    if callable(code):
        try:
            return code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
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

    def __init__(self, name: str, run_once: Callable[[], bool], interval_s: float) -> None:
        self.name = name
        self._run_once = run_once
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.last_heartbeat = 0.0
        self.consecutive_errors = 0

    def start(self) -> None:
        self._stop.clear()
        self.last_heartbeat = time.time()  # healthy from the start, not stale until the first iteration ends
        self._thread = threading.Thread(target=self._run, name=f"loop-{self.name}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self.signal_stop()
        self.join(timeout)

    def signal_stop(self) -> None:
        """Ask the loop to stop after its current pass (see `join`)."""
        self._stop.set()

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(max(0.0, timeout))

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def healthy(self, now: float, stale_after_s: float = 60.0) -> bool:
        return self._thread is not None and self._thread.is_alive() and now - self.last_heartbeat < stale_after_s

    def _run(self) -> None:
        while not self._stop.is_set():
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
            LOOP_RUNS.labels(self.name).inc()
            LOOP_HEARTBEAT.labels(self.name).set(self.last_heartbeat)
            if not did_work:
                self._stop.wait(self.backoff_s())

    def backoff_s(self) -> float:
        """The wait before the next iteration: the interval, doubled for each error in a row (a broken dependency
        is not hammered) up to MAX_BACKOFF_S, so that a loop resumes soon after its dependency returns and its
        heartbeat stays well inside the health check's 60 s."""
        if not self.consecutive_errors:
            return self.interval_s
        return min(self.interval_s * 2 ** min(self.consecutive_errors, 10), max(self.interval_s, MAX_BACKOFF_S))
