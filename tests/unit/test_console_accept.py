"""console/server.py's accept loop: a connection whose thread cannot be started (the process out of threads or
memory for a moment) gives its slot back, so the console serves again once threads can start."""

from __future__ import annotations

import socket
import threading
from types import SimpleNamespace

import pytest

from peloton.console import server as console_server
from peloton.console.server import MAX_CONNECTIONS, Console


def _get(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"GET /favicon.ico HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out


def test_a_connection_whose_thread_cannot_start_gives_its_slot_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each failed start kept its slot: after MAX_CONNECTIONS of them (a moment of RLIMIT_NPROC or memory pressure),
    the console closed every connection at once, for ever, while the daemon looked healthy."""
    c = Console("127.0.0.1:0")
    c.start("127.0.0.1:1", "secret", authenticated=False)
    try:
        port = c.httpd.server_address[1]
        failing = threading.Event()
        failing.set()

        class Thread(threading.Thread):
            def start(self) -> None:
                if failing.is_set():
                    raise RuntimeError("can't start new thread")
                super().start()

        # (the module's threads only: the console's own thread runs already)
        monkeypatch.setattr(console_server, "threading", SimpleNamespace(Thread=Thread))
        monkeypatch.setattr(console_server._Server, "handle_error", lambda *a: None)  # (socketserver's: to stderr)
        for _ in range(MAX_CONNECTIONS + 1):
            assert _get(port) == b""  # closed: no thread to serve it
        failing.clear()
        assert _get(port).startswith(b"HTTP/1.0 200")
    finally:
        c.stop()

