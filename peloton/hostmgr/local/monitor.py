"""Watches task processes without polling: one thread waits in epoll on a pidfd per process (readable once the
process has exited; works for adopted processes that are not our children), on the cgroup.events files of task
cgroups being emptied (EPOLLPRI once the cgroup's state changed), and on an eventfd that wakes it for new work, with
timers for kill escalation and retries. An idle daemon spends no CPU here."""

from __future__ import annotations

import contextlib
import heapq
import logging
import os
import select
import threading
import time
from collections.abc import Callable

from peloton.loop import LOOP_ERRORS

log = logging.getLogger(__name__)


class ProcessMonitor:
    def __init__(self, on_exit: Callable[[str], None], on_timer: Callable[[str], None],
                 on_exits: Callable[[list[str]], None] | None = None) -> None:
        """`on_exit(key)` when the watched process has exited; `on_timer(key)` when a timer set with `call_at`
        is due. Both run on the monitor thread, with no lock of the monitor held. With `on_exits`, the keys that
        one poll found exited are handed to it at once instead (a gang that ends together: one batch)."""
        self._on_exit = on_exit
        self._on_exits = on_exits
        self._on_timer = on_timer
        self._ep = select.epoll()
        self._wake = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._ep.register(self._wake, select.EPOLLIN)
        self._lock = threading.Lock()
        self._fds: dict[int, str] = {}  # pidfd -> key
        self._keys: dict[str, int] = {}  # key -> pidfd
        self._events: dict[int, int] = {}  # pidfd -> the events it is watched for
        self._timers: list[tuple[float, str]] = []
        self._stop = False
        self._thread: threading.Thread | None = None

    def watch(self, key: str, pid: int) -> bool:
        """Start watching process `pid` under `key`; False if it is already gone."""
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            return False
        self.watch_fd(key, fd)
        return True

    def watch_fd(self, key: str, fd: int, events: int = select.EPOLLIN) -> None:
        """Start watching the process of pidfd `fd` under `key` (the monitor owns the descriptor from now on);
        `on_exit(key)` once it is ready for `events` (a pidfd: EPOLLIN, the process exited; a cgroup.events file:
        EPOLLPRI, it changed), and the descriptor is closed then."""
        os.set_inheritable(fd, False)
        with self._lock:
            old = self._keys.pop(key, None)
            if old is not None:
                self._fds.pop(old, None)
                self._events.pop(old, None)
            self._fds[fd] = key
            self._keys[key] = fd
            self._events[fd] = events
        if old is not None:
            self._close(old)
        self._ep.register(fd, events)

    def unwatch(self, key: str) -> None:
        with self._lock:
            fd = self._keys.pop(key, None)
            if fd is not None:
                self._fds.pop(fd, None)
                self._events.pop(fd, None)
        if fd is not None:
            self._close(fd)

    def signal_group(self, key: str, pgid: int, sig: int) -> bool:
        """Send `sig` to process group `pgid`, led by the process watched under `key`, only while that process has
        not exited (its pidfd is not readable); False, nothing sent, once it has or when `key` is not watched. A
        number is given to no new process while its process lives, and that one is reaped the moment it ends
        (its parent ignores SIGCHLD): by the number alone, a signal in the moment after its end (before its exit
        is handled) reached whatever process took the number and leads a group of it. Under the lock, so that the
        pidfd is not closed (nor its number reused) between the look and the signal; what is left between them
        is a syscall, far too short for the kernel to hand out every other pid first."""
        with self._lock:
            fd = self._keys.get(key)
            if fd is None or self._events.get(fd) != select.EPOLLIN or _ready(fd, select.EPOLLIN):
                return False
            try:
                os.killpg(pgid, sig)
            except OSError:
                return False
            return True

    def call_at(self, when: float, key: str) -> None:
        """Call `on_timer(key)` at monotonic time `when`."""
        with self._lock:
            heapq.heappush(self._timers, (when, key))
        os.eventfd_write(self._wake, 1)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="local-monitor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop = True
        os.eventfd_write(self._wake, 1)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5)
        with self._lock:
            fds = list(self._fds)
            self._fds.clear()
            self._keys.clear()
            self._events.clear()
        for fd in fds:
            self._close(fd)

    def _close(self, fd: int) -> None:
        with contextlib.suppress(OSError, ValueError):
            self._ep.unregister(fd)
        with contextlib.suppress(OSError):
            os.close(fd)

    def _run(self) -> None:
        while not self._stop:
            with self._lock:
                timeout = max(0.0, self._timers[0][0] - time.monotonic()) if self._timers else -1.0
            try:
                events = self._ep.poll(timeout)
            except InterruptedError:
                continue
            self._handle(events)

    def _handle(self, events: list[tuple[int, int]]) -> None:
        """One poll's events: the processes that exited, then the timers that are due."""
        exited: list[str] = []
        done: list[int] = []
        with self._lock:
            for fd, _ in events:
                if fd == self._wake or fd not in self._fds:
                    # not ours any more: unwatched (its owner closed it) between the poll and now. Its number may
                    # already name another file of this process, which must not be closed here
                    continue
                if not _ready(fd, self._events.get(fd, select.EPOLLIN)):
                    # the event was of an earlier descriptor with this number, closed and reused by a new watch
                    # since the poll: this process has not exited
                    continue
                key = self._fds.pop(fd)
                self._events.pop(fd, None)
                self._keys.pop(key, None)
                exited.append(key)
                done.append(fd)
            due: list[str] = []
            now = time.monotonic()
            while self._timers and self._timers[0][0] <= now:
                due.append(heapq.heappop(self._timers)[1])
        # the closes outside the lock: these descriptors are the monitor's alone now (popped above)
        if any(fd == self._wake for fd, _ in events):
            with contextlib.suppress(BlockingIOError):
                os.eventfd_read(self._wake)
        for fd in done:
            self._close(fd)
        if self._on_exits is not None and len(exited) > 1:
            try:
                self._on_exits(exited)
            except Exception:  # noqa: BLE001 - one bad task must not stop the monitor
                LOOP_ERRORS.labels("local-monitor").inc()  # (exits maybe not reported: an operator must hear of it)
                log.exception("local backend monitor: handling %d exits failed", len(exited))
        else:
            for key in exited:
                self._safe(self._on_exit, key)
        for key in due:
            self._safe(self._on_timer, key)

    @staticmethod
    def _safe(fn: Callable[[str], None], key: str) -> None:
        try:
            fn(key)
        except Exception:  # noqa: BLE001 - one bad task must not stop the monitor
            LOOP_ERRORS.labels("local-monitor").inc()
            log.exception("local backend monitor: handling %s failed", key)


def _ready(fd: int, events: int) -> bool:
    """Whether `fd` is ready for `events` now (a zero-timeout poll of that one descriptor; it does not wait)."""
    p = select.poll()
    p.register(fd, events)
    return bool(p.poll(0))
