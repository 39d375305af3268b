"""The CLI's own gRPC transport (no grpcio on the client side) against a real grpcio server over real sockets:
statuses and their details, deadlines, flow control both ways, size limits, streams and their cancellation,
calls in flight together, a server that goes away and comes back, Unix sockets."""

from __future__ import annotations

import os
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from peloton.cli.transport import Channel, RpcError, StatusCode, Tls


def _raw(b: bytes) -> bytes:
    return b


class Echo:
    """A service of raw-bytes methods: what a test needs the server to do."""

    def __init__(self) -> None:
        self.cancelled = threading.Event()
        self.released = threading.Event()  # `wait` calls answer once it is set (the fixture sets it at the end)
        self.together = threading.Barrier(3)  # `together` calls answer once three are in at once

    def unary(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        cmd, _, arg = request.partition(b":")
        if cmd == b"echo":
            return arg
        if cmd == b"size":  # a response of that many bytes
            return b"x" * int(arg)
        if cmd == b"len":  # how big the request was
            return str(len(request)).encode()
        if cmd == b"wait":  # no answer until the test ends: only the client's own deadline ends the call
            self.released.wait(60)
            return b"released"
        if cmd == b"together":  # three of them served at once, or none answered (BrokenBarrierError after 30 s)
            self.together.wait(30)
            return b"met"
        if cmd == b"fail":
            context.set_trailing_metadata((("retry-after-ms", "1000"),))
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, arg.decode())
        if cmd == b"unavailable":
            context.abort(grpc.StatusCode.UNAVAILABLE, "store down")
        return b""

    def stream(self, request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        cmd, _, arg = request.partition(b":")
        if cmd == b"count":
            for i in range(int(arg)):
                yield str(i).encode()
            return
        if cmd == b"forever":  # one message, then silence until cancelled
            context.add_callback(self.cancelled.set)
            yield b"first"
            while context.is_active():
                time.sleep(0.01)
            return
        if cmd == b"fail-after":
            yield b"one"
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "job_ids: at most 1000 jobs")


def _server(address: str, echo: Echo) -> tuple[grpc.Server, int]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8), options=[("grpc.http2.bdp_probe", 0)])
    handlers = {
        "Unary": grpc.unary_unary_rpc_method_handler(echo.unary, request_deserializer=_raw, response_serializer=_raw),
        "Stream": grpc.unary_stream_rpc_method_handler(echo.stream, request_deserializer=_raw,
                                                       response_serializer=_raw),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("test.Echo", handlers),))
    port = server.add_insecure_port(address)
    server.start()
    return server, port


@pytest.fixture
def echo() -> Iterator[tuple[Echo, str]]:
    e = Echo()
    server, port = _server("127.0.0.1:0", e)
    yield e, f"127.0.0.1:{port}"
    e.released.set()
    server.stop(None)


def _unary(ch: Channel) -> Any:
    return ch.unary_unary("/test.Echo/Unary", _raw, _raw)


def _stream(ch: Channel) -> Any:
    return ch.unary_stream("/test.Echo/Stream", _raw, _raw)


def test_a_call_and_its_answer(echo: tuple[Echo, str]) -> None:
    ch = Channel(echo[1])
    assert _unary(ch)(b"echo:hello", timeout=5) == b"hello"
    assert _unary(ch)(b"echo:", timeout=5) == b""  # an empty message
    assert _unary(ch)(b"echo:again") == b"again"  # same connection, no deadline


def test_an_error_keeps_its_code_details_and_metadata(echo: tuple[Echo, str]) -> None:
    ch = Channel(echo[1])
    details = "spec.name: 'ü 100% wrong\nsecond line'"  # percent-encoded on the wire
    with pytest.raises(RpcError) as e:
        _unary(ch)(b"fail:" + details.encode(), timeout=5)
    assert e.value.code() == StatusCode.FAILED_PRECONDITION
    assert e.value.details() == details
    assert ("retry-after-ms", "1000") in e.value.trailing_metadata()
    assert _unary(ch)(b"echo:still fine", timeout=5) == b"still fine"


def test_an_unknown_method_is_unimplemented(echo: tuple[Echo, str]) -> None:
    with pytest.raises(RpcError) as e:
        Channel(echo[1]).unary_unary("/test.Echo/Nope", _raw, _raw)(b"", timeout=5)
    assert e.value.code() == StatusCode.UNIMPLEMENTED


def test_a_deadline_ends_the_call_and_not_the_connection(echo: tuple[Echo, str]) -> None:
    ch = Channel(echo[1])
    with pytest.raises(RpcError) as e:
        _unary(ch)(b"wait:", timeout=0.2)  # the server never answers while the test runs
    assert e.value.code() == StatusCode.DEADLINE_EXCEEDED
    assert _unary(ch)(b"echo:next", timeout=5) == b"next"


def test_big_messages_both_ways_follow_flow_control(echo: tuple[Echo, str]) -> None:
    """3 MiB up (the server's window starts at 64 KiB: we must wait for its updates) and down."""
    ch = Channel(echo[1])
    big = b"len:" + b"y" * (3 * 1024 * 1024)
    assert _unary(ch)(big, timeout=10) == str(len(big)).encode()
    assert len(_unary(ch)(b"size:%d" % (3 * 1024 * 1024), timeout=10)) == 3 * 1024 * 1024
    for _ in range(3):  # the connection's window is refilled as it is used
        assert len(_unary(ch)(b"size:%d" % (4 * 1024 * 1024 - 100), timeout=10)) == 4 * 1024 * 1024 - 100


def test_a_response_over_the_limit_is_refused(echo: tuple[Echo, str]) -> None:
    ch = Channel(echo[1])
    with pytest.raises(RpcError) as e:
        _unary(ch)(b"size:%d" % (5 * 1024 * 1024), timeout=10)
    assert e.value.code() == StatusCode.RESOURCE_EXHAUSTED
    assert _unary(ch)(b"echo:ok", timeout=5) == b"ok"


def test_calls_in_flight_together(echo: tuple[Echo, str]) -> None:
    ch = Channel(echo[1])
    slow = [_unary(ch).future(b"together:", timeout=60) for _ in range(3)]  # answered only when all 3 are in
    fast = _unary(ch).future(b"echo:fast", timeout=5)
    assert fast.result() == b"fast"  # read while the slow ones are open
    assert [f.result() for f in slow] == [b"met"] * 3  # together, not one after another


def test_a_stream_and_its_status(echo: tuple[Echo, str]) -> None:
    ch = Channel(echo[1])
    assert [int(m) for m in _stream(ch)(b"count:500", timeout=10)] == list(range(500))
    call = _stream(ch)(b"fail-after:", timeout=10)
    it = iter(call)
    assert next(it) == b"one"
    with pytest.raises(RpcError) as e:
        next(it)
    assert e.value.code() == StatusCode.INVALID_ARGUMENT and "at most 1000" in e.value.details()
    assert call.cancel() is False  # it had ended


def test_a_stream_cancelled_from_another_thread(echo: tuple[Echo, str]) -> None:
    """What the watch's silence guard does: the reader is blocked in the socket; cancel() wakes it."""
    server_side, address = echo
    ch = Channel(address)
    call = _stream(ch)(b"forever:")
    it = iter(call)
    assert next(it) == b"first"
    threading.Timer(0.2, call.cancel).start()
    with pytest.raises(RpcError) as e:
        next(it)
    assert e.value.code() == StatusCode.CANCELLED
    assert server_side.cancelled.wait(5)  # the server saw it end
    assert _unary(ch)(b"echo:redialled", timeout=5) == b"redialled"


def test_a_stream_cancelled_by_its_reader_leaves_the_connection(echo: tuple[Echo, str]) -> None:
    server_side, address = echo
    ch = Channel(address)
    call = _stream(ch)(b"forever:")
    assert next(iter(call)) == b"first"
    conn = ch._conn
    assert call.cancel() is True
    assert server_side.cancelled.wait(5)
    assert _unary(ch)(b"echo:same", timeout=5) == b"same"
    assert ch._conn is conn  # RST_STREAM, not a new connection


def test_no_daemon_is_unavailable() -> None:
    with pytest.raises(RpcError) as e:
        _unary(Channel("127.0.0.1:1"))(b"echo:x", timeout=5)
    assert e.value.code() == StatusCode.UNAVAILABLE and "127.0.0.1:1" in e.value.details()
    f = _unary(Channel("127.0.0.1:1")).future(b"echo:x", timeout=5)  # raised where the answer is awaited
    with pytest.raises(RpcError):
        f.result()
    with pytest.raises(RpcError) as e:
        _unary(Channel("no-port-here"))(b"", timeout=5)
    assert e.value.code() == StatusCode.UNAVAILABLE


def test_a_restarted_server_is_found_again() -> None:
    e = Echo()
    server, port = _server("127.0.0.1:0", e)
    ch = Channel(f"127.0.0.1:{port}")
    call = _stream(ch)(b"forever:")
    assert next(iter(call)) == b"first"
    server.stop(0.1)  # GOAWAY, then the open stream is cut
    with pytest.raises(RpcError) as err:
        next(iter(call))
    assert err.value.code() in (StatusCode.UNAVAILABLE, StatusCode.CANCELLED)
    with pytest.raises(RpcError) as err:
        _unary(ch)(b"echo:x", timeout=5)
    assert err.value.code() == StatusCode.UNAVAILABLE
    server, _ = _server(f"127.0.0.1:{port}", e)
    try:
        assert _unary(ch)(b"echo:back", timeout=5) == b"back"
    finally:
        server.stop(None)


def test_unix_socket() -> None:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "peloton.sock")
        server, _ = _server(f"unix:{path}", Echo())
        try:
            assert _unary(Channel(f"unix:{path}"))(b"echo:local", timeout=5) == b"local"
        finally:
            server.stop(None)


def test_status_codes_are_grpcs() -> None:
    assert {c.name: c.value[0] for c in grpc.StatusCode} == {c.name: c.value for c in StatusCode}


# --- TLS -------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from peloton.security import certs

    d = tmp_path_factory.mktemp("pki")
    certs.init(d / "ours", [], client="alice")
    certs.init(d / "theirs", [], client="mallory")  # another CA
    return d


def _tls_server(pki: Path, mutual: bool) -> tuple[grpc.Server, int]:
    ours = pki / "ours"
    creds = grpc.ssl_server_credentials([((ours / "server-key.pem").read_bytes(), (ours / "server.pem").read_bytes())],
                                        root_certificates=(ours / "ca.pem").read_bytes() if mutual else None,
                                        require_client_auth=mutual)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    handlers = {"Unary": grpc.unary_unary_rpc_method_handler(Echo().unary, request_deserializer=_raw,
                                                             response_serializer=_raw)}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("test.Echo", handlers),))
    port = server.add_secure_port("0.0.0.0:0", creds)  # 127.0.0.2 too: a loopback address not in the certificate
    server.start()
    return server, port


def test_tls_with_the_daemons_ca(pki: Path) -> None:
    server, port = _tls_server(pki, mutual=False)
    try:
        for host in ("127.0.0.1", "localhost"):
            ch = Channel(f"{host}:{port}", tls=Tls(ca=str(pki / "ours" / "ca.pem")))
            assert _unary(ch)(b"echo:secret", timeout=5) == b"secret"
        for ca, host, why in ((pki / "theirs" / "ca.pem", "127.0.0.1", "unable to get local issuer"),
                              (pki / "ours" / "ca.pem", "127.0.0.2", "IP address mismatch")):
            with pytest.raises(RpcError) as e:
                _unary(Channel(f"{host}:{port}", tls=Tls(ca=str(ca))))(b"echo:x", timeout=5)
            assert e.value.code() == StatusCode.UNAVAILABLE and why in e.value.details()
        with pytest.raises(RpcError) as e:  # plain HTTP/2 to a TLS port
            _unary(Channel(f"127.0.0.1:{port}"))(b"echo:x", timeout=5)
        assert e.value.code() == StatusCode.UNAVAILABLE and "does the daemon use TLS" in e.value.details()
    finally:
        server.stop(None)


def test_mutual_tls_needs_a_client_certificate_of_the_ca(pki: Path) -> None:
    server, port = _tls_server(pki, mutual=True)
    ca = str(pki / "ours" / "ca.pem")
    try:
        ours = Tls(ca, str(pki / "ours" / "client.pem"), str(pki / "ours" / "client-key.pem"))
        assert _unary(Channel(f"127.0.0.1:{port}", tls=ours))(b"echo:in", timeout=5) == b"in"
        theirs = Tls(ca, str(pki / "theirs" / "client.pem"), str(pki / "theirs" / "client-key.pem"))
        for tls in (Tls(ca), theirs):
            with pytest.raises(RpcError) as e:
                _unary(Channel(f"127.0.0.1:{port}", tls=tls))(b"echo:x", timeout=5)
            assert e.value.code() == StatusCode.UNAVAILABLE
        with pytest.raises(RpcError) as e:
            _unary(Channel(f"127.0.0.1:{port}", tls=Tls(ca, str(pki / "missing.pem"), str(pki / "missing.pem"))))(
                b"echo:x", timeout=5)
        assert "cannot load the TLS files (--tls-ca" in e.value.details()
    finally:
        server.stop(None)


def _closed_port() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"  # nobody listens there once the socket is closed


def test_of_several_addresses_the_client_uses_the_first_that_serves(echo: tuple[Echo, str]) -> None:
    """A leader and standbys: `--address a,b` dials the first that accepts a connection."""
    from peloton.cli.client import Client

    _, serving = echo
    closed = _closed_port()
    c = Client(f"{closed}, {serving}")
    assert _unary(c.channel)(b"echo:hi", timeout=5) == b"hi" and c.address == serving
    c = Client(f"{serving},{closed}")
    assert _unary(c.channel)(b"echo:hi", timeout=5) == b"hi" and c.address == serving
    c = Client(f"{closed},unix:/nonexistent/peloton.sock")
    with pytest.raises(RpcError) as e:
        _unary(c.channel)(b"echo:hi", timeout=5)
    assert e.value.code() == StatusCode.UNAVAILABLE and closed in e.value.details()  # the first one's error


def test_a_channel_dials_the_other_addresses_when_its_daemon_goes(echo: tuple[Echo, str]) -> None:
    """The leader dies and a standby on another address takes over: the next call reaches it."""
    _, first = echo
    e2 = Echo()
    server, port = _server("127.0.0.1:0", e2)
    try:
        second = f"127.0.0.1:{port}"
        ch = Channel(first, others=[second])
        assert _unary(ch)(b"echo:a", timeout=5) == b"a" and ch.address == first
        ch.close()  # as when the daemon went: the next call dials again
        ch.addresses[0] = _closed_port()
        ch.address = ch.addresses[0]
        assert _unary(ch)(b"echo:b", timeout=5) == b"b" and ch.address == second
    finally:
        server.stop(None)


def test_a_standby_sends_calls_to_the_leader_it_names(echo: tuple[Echo, str]) -> None:
    """A standby answers every call UNAVAILABLE with the leader's address (peloton-leader): unary and streaming
    calls go there, once, and the channel stays there, when the leader is one of the addresses configured
    (test_redirect.py: when it is not)."""
    from peloton.leadership.owner import Owner
    from peloton.leadership.standby import StandbyServer

    _, leader = echo
    owner = Owner("node-a", 4242, leader, time.time())
    standby = StandbyServer("127.0.0.1:0", lambda: owner)
    try:
        ch = Channel(standby.listen, others=[leader])
        assert _unary(ch)(b"echo:hi", timeout=5) == b"hi"
        assert ch.address == leader
        ch = Channel(standby.listen, others=[leader])
        assert [m for m in _stream(ch)(b"count:3", timeout=5)] == [b"0", b"1", b"2"]
        # a standby that knows no leader yet: UNAVAILABLE, with its retry hint, and the channel stays
        owner = None  # type: ignore[assignment]
        ch = Channel(standby.listen)
        with pytest.raises(RpcError) as e:
            _unary(ch)(b"echo:hi", timeout=5)
        assert e.value.code() == StatusCode.UNAVAILABLE and "no leader is known yet" in e.value.details()
        assert ch.address == standby.listen
        # one naming itself (it took over but still answers as a standby): not followed in a loop
        owner = Owner("node-b", 1, standby.listen, time.time())
        with pytest.raises(RpcError) as e:
            _unary(ch)(b"echo:hi", timeout=5)
        assert "the leader is " + standby.listen in e.value.details()
    finally:
        standby.stop()
