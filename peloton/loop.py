"""The one loop pattern for every periodic component: `run_once()` in a thread, start/stop, and a heartbeat
that feeds health and metrics."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from prometheus_client import Counter, Gauge

log = logging.getLogger(__name__)

LOOP_RUNS = Counter("peloton_loop_runs_total", "Iterations of each periodic loop", ["loop"])
LOOP_ERRORS = Counter("peloton_loop_errors_total", "Iterations that raised", ["loop"])
LOOP_HEARTBEAT = Gauge("peloton_loop_heartbeat_timestamp_seconds", "Last completed iteration", ["loop"])


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
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

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
            except Exception:
                self.consecutive_errors += 1
                LOOP_ERRORS.labels(self.name).inc()
                log.exception("loop %s failed (%d in a row)", self.name, self.consecutive_errors)
            self.last_heartbeat = time.time()
            LOOP_RUNS.labels(self.name).inc()
            LOOP_HEARTBEAT.labels(self.name).set(self.last_heartbeat)
            if not did_work:
                # back off on repeated errors so a broken dependency is not hammered
                wait = self.interval_s * min(2 ** min(self.consecutive_errors, 5), 30)
                self._stop.wait(wait)
