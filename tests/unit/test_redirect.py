"""A standby's redirect (UNAVAILABLE naming the leader) is followed only to an address of the cluster the user
configured, or where a person at a terminal says yes: the call, its bearer token and the client certificate go to no
other address. Real sockets: a real standby server (grpcio), and at the address it names a fake that records what
reached it."""

from __future__ import annotations

import os
import pty
import select
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from peloton.cli.transport import Channel, RedirectRefused, RpcError, StatusCode, Tls, normal_address
from peloton.leadership.owner import Owner
from peloton.leadership.standby import StandbyServer
from tests.e2e.harness import PELOTON

TOKEN = "pt_secret-token"
AUTH = [("authorization", f"Bearer {TOKEN}")]


class Recorder:
    """A listening socket that records every connection and every byte (TLS: after the handshake, and whether the
    client presented a certificate); it answers nothing, and closes once it has seen the token or 5 s passed."""

    def __init__(self, host: str = "127.0.0.1", tls: ssl.SSLContext | None = None) -> None:
        self.listener = socket.socket()
        self.listener.bind((host, 0))
        self.listener.listen()
        self.address = f"{host}:{self.listener.getsockname()[1]}"
        self.tls = tls
        self.connections = 0
        self.handshakes: list[str] = []  # "ok" or the server side's error
        self.client_certs: list[dict[str, Any]] = []
        self.received = bytearray()
        self.closed = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        conn.settimeout(5)
        try:
            if self.tls is not None:
                try:
                    conn = self.tls.wrap_socket(conn, server_side=True)
                except (ssl.SSLError, OSError) as e:
                    self.handshakes.append(str(e))
                    return
                self.handshakes.append("ok")
                cert = conn.getpeercert()
                if cert:
                    self.client_certs.append(cert)
            deadline = time.monotonic() + 5
            while TOKEN.encode() not in self.received and time.monotonic() < deadline:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                self.received += chunk
        except OSError:
            pass
        finally:
            conn.close()
            self.closed.set()

    def stop(self) -> None:
        self.listener.close()


class Leader:
    """A gRPC server answering every method with an empty message, recording each call's metadata."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, str]]] = []
        leader = self

        class Any_(grpc.GenericRpcHandler):
            def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
                method = details.method

                def answer(request: bytes, context: grpc.ServicerContext) -> bytes:
                    leader.calls.append((method, dict(context.invocation_metadata())))
                    return b""
                return grpc.unary_unary_rpc_method_handler(answer)

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        self.server.add_generic_rpc_handlers((Any_(),))
        self.address = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        self.server.start()

    def stop(self) -> None:
        self.server.stop(None)


def _standby(leader_address: str, credentials: grpc.ServerCredentials | None = None) -> StandbyServer:
    return StandbyServer("127.0.0.1:0", lambda: Owner("node-a", 4242, leader_address, time.time()), credentials)


@pytest.fixture
def leader() -> Iterator[Leader]:
    server = Leader()
    yield server
    server.stop()


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    r = Recorder()
    yield r
    r.stop()


def _call(ch: Channel) -> bytes:
    try:
        return bytes(ch.unary_unary("/peloton.v1.JobService/ListJobs", bytes, bytes)(b"", timeout=10))
    finally:
        ch.close()


@pytest.mark.parametrize(("a", "b", "same"), [
    ("node-a:5391", "NODE-A:5391", True),  # host names are case-insensitive
    ("node-a:5391", "node-a:5392", False),
    ("unix:/run/peloton.sock", "unix:///run/peloton.sock", True),
    ("127.0.0.1:5391", "localhost:5391", False),  # nothing is resolved
    ("[::1]:5391", "[::1]:5391", True),
    (" node-a:5391", "node-a:5391", True),  # as --address a, b is split
])
def test_what_counts_as_the_same_address(a: str, b: str, same: bool) -> None:
    assert (normal_address(a) == normal_address(b)) is same


def test_a_leader_outside_the_configured_addresses_gets_no_call_and_no_token(recorder: Recorder) -> None:
    standby = _standby(recorder.address)
    try:
        for kind in ("unary", "stream"):
            ch = Channel(standby.listen, metadata=AUTH)
            with pytest.raises(RedirectRefused) as e:
                if kind == "unary":
                    _call(ch)
                else:
                    list(ch.unary_stream("/peloton.v1.JobService/WatchJobs", bytes, bytes)(b"", timeout=10))
            assert e.value.code() == StatusCode.FAILED_PRECONDITION
            details = e.value.details()
            assert (f"the daemon at {standby.listen} is a standby and names {recorder.address} as the leader, "
                    f"which is not one of the addresses configured ({standby.listen})") in details
            assert f"--address {standby.listen},{recorder.address}" in details and "\n" not in details
            assert ch.address == standby.listen
        time.sleep(0.2)  # a connection, had one been made, would have been accepted by now
        assert recorder.connections == 0 and not recorder.received
    finally:
        standby.stop()


def test_a_leader_among_the_configured_addresses_gets_the_call_and_the_token(leader: Leader) -> None:
    standby = _standby(leader.address)
    try:
        host, port = leader.address.rsplit(":", 1)
        configured = f"{host.upper()}:{port}"  # as the user wrote it
        ch = Channel(standby.listen, metadata=AUTH, others=[configured])
        assert _call(ch) == b""
        assert ch.address == leader.address
        assert leader.calls == [("/peloton.v1.JobService/ListJobs", leader.calls[0][1])]
        assert leader.calls[0][1]["authorization"] == f"Bearer {TOKEN}"
    finally:
        standby.stop()


def answering(asked: list[tuple[str, str]], answer: bool) -> Callable[[str, str], bool]:
    """A person asked whether to follow a redirect: noted in `asked`, answers `answer`."""
    def confirm(standby: str, to: str) -> bool:
        asked.append((standby, to))
        return answer
    return confirm


def test_a_person_may_allow_another_address(leader: Leader, recorder: Recorder) -> None:
    asked: list[tuple[str, str]] = []
    standby = _standby(recorder.address)
    try:
        ch = Channel(standby.listen, metadata=AUTH, confirm=answering(asked, False))
        with pytest.raises(RedirectRefused):
            _call(ch)
        assert asked == [(standby.listen, recorder.address)]
        assert recorder.connections == 0
    finally:
        standby.stop()
    standby = _standby(leader.address)
    try:
        ch = Channel(standby.listen, metadata=AUTH, confirm=answering(asked, True))
        assert _call(ch) == b""
        assert asked[-1] == (standby.listen, leader.address)
        assert ch.addresses == [standby.listen, leader.address]  # asked once: the command goes on there
        assert leader.calls[0][1]["authorization"] == f"Bearer {TOKEN}"
    finally:
        standby.stop()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from peloton.security import certs

    d = tmp_path_factory.mktemp("pki")
    certs.init(d, [], client="alice")  # the server certificate names localhost and 127.0.0.1, not 127.0.0.2
    return d


def _tls_recorder(pki: Path, host: str) -> Recorder:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(pki / "server.pem", pki / "server-key.pem")
    ctx.load_verify_locations(pki / "ca.pem")
    ctx.verify_mode = ssl.CERT_OPTIONAL  # a client certificate, if the client sends one, is taken and recorded
    ctx.set_alpn_protocols(["h2"])
    return Recorder(host, ctx)


def test_with_tls_a_followed_leader_must_hold_a_certificate_for_its_own_name(pki: Path) -> None:
    """Configured, but its certificate is not for the address's host name: the handshake fails on the client's
    side before its certificate is sent, and no token goes. The same recorder at an address its certificate names
    gets both (what shows that it would see them)."""
    creds = grpc.ssl_server_credentials([((pki / "server-key.pem").read_bytes(), (pki / "server.pem").read_bytes())])
    tls = Tls(str(pki / "ca.pem"), str(pki / "client.pem"), str(pki / "client-key.pem"))
    for host, verifies in (("127.0.0.2", False), ("127.0.0.1", True)):
        rec = _tls_recorder(pki, host)
        standby = _standby(rec.address, creds)
        try:
            ch = Channel(standby.listen, tls=tls, metadata=AUTH, others=[rec.address])
            with pytest.raises(RpcError) as e:
                _call(ch)
            assert rec.closed.wait(10)
            if verifies:
                assert rec.handshakes == ["ok"] and len(rec.client_certs) == 1
                assert TOKEN.encode() in rec.received
                assert e.value.code() == StatusCode.UNAVAILABLE  # it closed without an answer
            else:
                assert e.value.code() == StatusCode.UNAVAILABLE and "IP address mismatch" in e.value.details()
                assert rec.handshakes != ["ok"] and not rec.client_certs and not rec.received
        finally:
            standby.stop()
            rec.stop()


# --- the command --------------------------------------------------------------------------------------------------
def _env() -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "PELOTON_CONFIG": "/nonexistent", "PELOTON_TOKEN": TOKEN}


def test_the_command_without_a_terminal_refuses_in_one_line(leader: Leader) -> None:
    standby = _standby(leader.address)
    try:
        r = subprocess.run([*PELOTON, "--address", standby.listen, "job", "list"], capture_output=True, text=True,
                           stdin=subprocess.DEVNULL, env=_env(), timeout=60)
        assert r.returncode == 1 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
        assert r.stderr.startswith(f"peloton: error: the daemon at {standby.listen} is a standby and names "
                                   f"{leader.address} as the leader"), r.stderr
        assert f"--address {standby.listen},{leader.address}" in r.stderr
        assert leader.calls == []
        # configured: followed, with the token
        r = subprocess.run([*PELOTON, "--address", f"{standby.listen},{leader.address}", "job", "list"],
                           capture_output=True, text=True, stdin=subprocess.DEVNULL, env=_env(), timeout=60)
        assert r.returncode == 0, r.stderr
        assert [(m, md["authorization"]) for m, md in leader.calls] == [("/peloton.v1.JobService/ListJobs",
                                                                        f"Bearer {TOKEN}")]
    finally:
        standby.stop()


def _at_a_terminal(argv: list[str], answer: bytes) -> tuple[int, str]:
    """Run the command with stdin and stderr on a terminal; answer its question. (exit code, what the terminal
    showed)"""
    master, slave = pty.openpty()
    proc = subprocess.Popen(argv, stdin=slave, stderr=slave, stdout=subprocess.PIPE, env=_env())
    os.close(slave)
    shown = b""
    try:
        deadline = time.monotonic() + 30
        while b"[y/N]" not in shown and time.monotonic() < deadline:
            if select.select([master], [], [], 1)[0]:
                shown += os.read(master, 4096)
        os.write(master, answer)
        proc.wait(30)
        while select.select([master], [], [], 0.2)[0]:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # the terminal's other side closed
                break
            if not chunk:
                break
            shown += chunk
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
        assert proc.stdout is not None
        proc.stdout.close()
    return proc.returncode, shown.decode(errors="replace")


@pytest.mark.parametrize(("answer", "followed"), [(b"y\n", True), (b"n\n", False), (b"\n", False)])
def test_the_command_at_a_terminal_asks(leader: Leader, answer: bytes, followed: bool) -> None:
    standby = _standby(leader.address)
    try:
        code, shown = _at_a_terminal([*PELOTON, "--address", standby.listen, "job", "list"], answer)
        assert (f"the daemon at {standby.listen} is a standby and names {leader.address} as the leader, which is not "
                f"one of the addresses configured ({standby.listen}). Send the call and your token to "
                f"{leader.address}? [y/N]") in shown.replace("\r\n", "\n").replace("\n", ""), shown
        if followed:
            assert code == 0, shown
            assert [md["authorization"] for _, md in leader.calls] == [f"Bearer {TOKEN}"]
        else:
            assert code == 1 and "not followed" in shown and "Traceback" not in shown, shown
            assert leader.calls == []
    finally:
        standby.stop()
