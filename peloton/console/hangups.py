"""Browsers that hang up on an event stream, noticed at once.

An `EventSource` sends nothing after its request, so the only thing its socket can turn readable for is the
browser closing it (a reload, a click to another page, a closed tab). One thread waits on every open stream's
socket and, when one turns readable, calls that stream's `on_hangup` (which cancels its watch of the daemon), so
the stream's thread and its place among the console's MAX_STREAMS are freed at once, not at the next heartbeat's
failed write (5 to 10 s later): a browser reloaded a few times a second cannot run the streams out."""

from __future__ import annotations

import logging
import selectors
import socket
import threading
from collections.abc import Callable

from peloton.loop import LOOP_ERRORS

log = logging.getLogger("peloton.console")


class Hangups:
    def __init__(self) -> None:
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._lock = threading.Lock()
        # (fd, callback) to watch, or (fd, None) to forget: applied by the thread, in order (an fd closed and
        # reused by a new connection is forgotten before it is watched again)
        self._todo: list[tuple[int, Callable[[], None] | None]] = []
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="console-hangups", daemon=True)
        self._thread.start()

    def watch(self, fd: int, on_hangup: Callable[[], None]) -> None:
        """Call `on_hangup` (on this module's thread; it must not block) when `fd` turns readable."""
        self._do(fd, on_hangup)

    def forget(self, fd: int) -> None:
        """The stream ended on its own: before its socket is closed (its fd may be reused at once)."""
        self._do(fd, None)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._poke()
        self._thread.join(5)

    def _do(self, fd: int, on_hangup: Callable[[], None] | None) -> None:
        with self._lock:
            if self._closed:
                return
            self._todo.append((fd, on_hangup))
        self._poke()

    def _poke(self) -> None:
        try:
            self._wake_w.send(b"x")
        except OSError:  # wakes enough queued already (or closing: the thread is gone)
            pass

    def _run(self) -> None:
        try:
            while True:
                for key, _ in self._sel.select():
                    if key.data is None:
                        if not self._apply():
                            return
                        continue
                    self._unregister(key.fd)
                    try:
                        key.data()
                    except Exception:  # noqa: BLE001 - one stream's cancel must not end the others' watch
                        LOOP_ERRORS.labels("console-hangups").inc()
                        log.exception("console: ending a stream whose browser hung up")
        finally:
            self._sel.close()
            self._wake_r.close()
            self._wake_w.close()

    def _apply(self) -> bool:
        try:
            while self._wake_r.recv(4096):
                pass
        except BlockingIOError:
            pass
        with self._lock:
            todo, self._todo = self._todo, []
            closed = self._closed
        for fd, on_hangup in todo:
            self._unregister(fd)
            if on_hangup is not None:
                try:
                    self._sel.register(fd, selectors.EVENT_READ, on_hangup)
                except (OSError, ValueError):  # closed already: its stream is ending anyway
                    pass
        return not closed

    def _unregister(self, fd: int) -> None:
        try:
            self._sel.unregister(fd)
        except KeyError:
            pass
