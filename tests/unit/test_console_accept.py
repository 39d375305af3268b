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
        monkeypatch.setattr(console_server, "threading",
                            SimpleNamespace(Thread=Thread, current_thread=threading.current_thread))
        monkeypatch.setattr(console_server._Server, "handle_error", lambda *a: None)  # (socketserver's: to stderr)
        for _ in range(MAX_CONNECTIONS + 1):
            assert _get(port) == b""  # closed: no thread to serve it
        failing.clear()
        assert _get(port).startswith(b"HTTP/1.0 200")
    finally:
        c.stop()



def test_a_burst_of_connections_is_taken_at_once_while_the_accept_loop_is_busy() -> None:
    """The listen backlog was socketserver's 5: while the console's accept loop was busy a moment, the handshakes of
    a burst beyond it were dropped by the kernel and retried after 1, 3, 7... s (under CI's load, 64 connections in
    the console's own slot tests took long enough that the first ones' deadlines ended before the last connected).
    Not serving yet (the accept loop not started), the console's socket takes MAX_CONNECTIONS at once."""
    c = Console("127.0.0.1:0")  # bound and listening, not yet accepting
    try:
        port = c.httpd.server_address[1]
        conns = [socket.create_connection(("127.0.0.1", port), timeout=0.5) for _ in range(MAX_CONNECTIONS)]
        for s in conns:
            s.close()
    finally:
        c.httpd.server_close()


def test_the_accept_loop_ends_at_shutdown_without_waiting_for_a_poll() -> None:
    """socketserver's serve_forever looked for its stop every poll_interval, so every daemon's stop waited up to
    half a second for its console (benchmarks/startstop_bench.py --console). Here the interval is an hour: the
    loop must end because shutdown woke it, not because a poll came round."""
    c = Console("127.0.0.1:0")
    serving = threading.Thread(target=c.httpd.serve_forever, args=(3600,), daemon=True)
    serving.start()
    try:
        port = c.httpd.server_address[1]
        assert _get(port).startswith(b"HTTP/1.0 200")  # serving (and so in its select)
        stopper = threading.Thread(target=c.httpd.shutdown, daemon=True)
        stopper.start()
        stopper.join(60)  # a bound for the event, far from both an hour and a prompt stop
        serving.join(60)
        assert not stopper.is_alive() and not serving.is_alive()
    finally:
        if not serving.is_alive():
            c.httpd.server_close()
