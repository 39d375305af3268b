"""The console's and the API's edge checks against requests that are not what they seem (a rebound name, idle
connections, filters a store cannot take), each tried against the real daemon (sim backend, its console on
loopback) over plain HTTP from the standard library and over gRPC."""

from __future__ import annotations

import contextlib
import http.client
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from peloton.api.v1 import audit_pb2, audit_pb2_grpc
from peloton.console.server import MAX_CONNECTIONS, REQUEST_DEADLINE_S, REQUEST_TIMEOUT_S
from tests.e2e.console import Browser, ConsoleDaemon
from tests.e2e.harness import serving

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def open_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleDaemon]:
    """The single-user default: no principals file, the console on loopback asks no login (every caller is the
    API's anonymous admin), so its only guard against other sites' pages is the Host check."""
    tmp = tmp_path_factory.mktemp("edge-open")
    d = ConsoleDaemon(tmp / "data", f"sqlite:///{tmp / 'peloton.db'}", auth=False)
    with serving(d):
        yield d


@pytest.mark.parametrize("host", ["127.0.0.1.nip.io", "127.attacker.example", "127.0.0.1.evil.example:{port}",
                                  "localhost.evil.example:{port}", "[::1].evil.example"])
def test_a_rebound_name_that_merely_starts_like_loopback_is_refused(open_daemon: ConsoleDaemon, host: str,
                                                                   tmp_path: Path) -> None:
    """DNS rebinding with a name such as 127.0.0.1.nip.io (or any name of the attacker's starting `127.`): the
    browser sends that name as Host, and the console took it for loopback because it starts with `127.`; the page
    then reads /api/session's CSRF token (same origin, in the browser's eyes) and stops jobs as the admin."""
    b = Browser(open_daemon.ui)
    rebound = host.format(port=b.port)
    a = b.get("/api/session", headers={"Host": rebound})
    assert a.status == 421 and a.json()["field"] == "Host", (rebound, a.status, a.body[:200])
    job = open_daemon.submit(tmp_path, "rebound")
    forged = b.request("POST", f"/api/jobs/{job}/stop", headers={"Host": rebound, "Origin": f"http://{rebound}",
                                                                 "X-CSRF-Token": b.csrf()})
    assert forged.status == 421, forged.body[:200]
    assert open_daemon.state(job) not in ("KILLING", "KILLED")


def test_loopback_names_are_still_answered(open_daemon: ConsoleDaemon) -> None:
    b = Browser(open_daemon.ui)
    for host in (f"127.0.0.1:{b.port}", "127.0.0.1", f"localhost:{b.port}", "localhost", f"127.1.2.3:{b.port}",
                 f"[::1]:{b.port}", "[::1]"):
        assert b.get("/api/session", headers={"Host": host}).status == 200, host


def test_idle_connections_without_credentials_do_not_hold_the_console_for_everyone(open_daemon: ConsoleDaemon
                                                                                  ) -> None:
    """The console serves at most MAX_CONNECTIONS at once and closes any beyond; a connection that sent nothing
    held its slot for ever (no timeout after accept), so anyone who reaches the port, without any credential,
    could shut every tenant out of the console with 64 idle sockets. Now a connection that sends no request for
    REQUEST_TIMEOUT_S is let go."""
    b = Browser(open_daemon.ui)
    idle = [socket.create_connection((b.host, b.port), timeout=30) for _ in range(MAX_CONNECTIONS)]
    try:
        time.sleep(0.5)  # each accepted and given its slot

        def answered() -> bool:
            try:
                return b.get("/api/session", timeout=5).status == 200
            except (OSError, http.client.HTTPException):
                return False

        deadline = time.monotonic() + REQUEST_TIMEOUT_S + 20
        while not answered():
            assert time.monotonic() < deadline, "the console is still held by connections that never sent a request"
            time.sleep(0.5)
    finally:
        for s in idle:
            s.close()


def test_connections_trickling_their_request_do_not_hold_the_console_for_everyone(open_daemon: ConsoleDaemon
                                                                                 ) -> None:
    """A client that sends its request a byte every second never leaves a read silent for REQUEST_TIMEOUT_S, so
    MAX_CONNECTIONS of them held every slot for as long as they trickled. Now a request must have come whole
    within REQUEST_DEADLINE_S of its connection."""
    b = Browser(open_daemon.ui)
    # (a generous timeout: the listen backlog is short, and on a loaded machine the accepts lag behind the connects)
    trickling = [socket.create_connection((b.host, b.port), timeout=30) for _ in range(MAX_CONNECTIONS)]
    stop = threading.Event()

    def trickle() -> None:
        head = b"GET /api/session HTTP/1.0\r\nX-Slow: " + b"a" * 1000
        for i in range(len(head)):
            for s in trickling:
                with contextlib.suppress(OSError):  # (let go: the console closed it)
                    s.send(head[i:i + 1])
            if stop.wait(1.0):
                return

    t = threading.Thread(target=trickle, daemon=True)
    t.start()
    try:
        time.sleep(1.5)  # each accepted, given its slot, and trickling

        def answered() -> bool:
            try:
                return b.get("/api/session", timeout=5).status == 200
            except (OSError, http.client.HTTPException):
                return False

        held_by = time.monotonic() + 10
        while answered():  # (the slots are all held, else this test shows nothing: each accepted in a moment)
            assert time.monotonic() < held_by, "the trickling connections do not hold the console's slots"
            time.sleep(0.2)
        deadline = time.monotonic() + REQUEST_DEADLINE_S + 20
        while not answered():
            assert time.monotonic() < deadline, "the console is still held by connections trickling their requests"
            time.sleep(0.5)
    finally:
        stop.set()
        t.join()
        for s in trickling:
            s.close()


@pytest.mark.parametrize("field", ["principal", "object"])
def test_audit_filters_are_checked_as_every_other_requests_text(db_url: str, tmp_path: Path, field: str) -> None:
    """ListAuditEvents handed its principal and object filters to the store unchecked: on PostgreSQL a NUL in
    either was an INTERNAL error (and a traceback in the daemon's log) where every other request's text is
    INVALID_ARGUMENT naming the field; on both stores a filter longer than any recorded value was searched for."""
    d = ConsoleDaemon(tmp_path / "data", db_url)
    with serving(d):
        stub = audit_pb2_grpc.AuditServiceStub(grpc.insecure_channel(d.address))
        md = (("authorization", f"Bearer {d.tokens['alice']}"),)
        for value in ("a\x00b", "x" * 100_000):
            with pytest.raises(grpc.RpcError) as e:
                stub.ListAuditEvents(_filter(field, value), metadata=md, timeout=15)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (value[:10], e.value.details())
            assert e.value.details().startswith(f"{field}:"), e.value.details()
        stub.ListAuditEvents(_filter(field, "alice"), metadata=md, timeout=15)  # a fitting filter is answered


def _filter(field: str, value: str) -> audit_pb2.ListAuditEventsRequest:
    r = audit_pb2.ListAuditEventsRequest()
    setattr(r, field, value)
    return r
