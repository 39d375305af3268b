"""The CLI's transport against a broken or hostile HTTP/2 server: a fake on a real socket sends the bad frames, and
records what the client sends back. Each case ends the call with the code RFC 9113 / RFC 7541 call for (a connection
error: GOAWAY with its error code, the call INTERNAL; a stream error: RST_STREAM), a message that says what was
wrong, in bounded memory and time; and the `peloton` command, run against the same fake, says it in one line and
exits 1, without a traceback."""

from __future__ import annotations

import socket
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest

from peloton.cli import hpack
from peloton.cli.transport import (
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    HEADERS,
    PADDED,
    PING,
    PRIORITY_FLAG,
    PUSH_PROMISE,
    RST_STREAM,
    SETTINGS,
    WINDOW_UPDATE,
    Channel,
    RpcError,
    StatusCode,
)
from tests.e2e.harness import PELOTON

PROTOCOL_ERROR, FLOW_CONTROL_ERROR, FRAME_SIZE_ERROR, REFUSED_STREAM = 1, 3, 6, 7
COMPRESSION_ERROR, ENHANCE_YOUR_CALM = 9, 11
CAP = 64 * 1024 * 1024  # the most a fake sends of an endless sequence: the client must stop it well before


def frame(kind: int, flags: int, sid: int, payload: bytes = b"", length: int | None = None) -> bytes:
    n = len(payload) if length is None else length
    return n.to_bytes(3, "big") + bytes((kind, flags)) + sid.to_bytes(4, "big") + payload


def settings(*pairs: tuple[int, int]) -> bytes:
    return frame(SETTINGS, 0, 0, b"".join(struct.pack(">HI", k, v) for k, v in pairs))


RESPONSE = hpack.encode([(":status", "200"), ("content-type", "application/grpc")])
OK_HEADERS = frame(HEADERS, END_HEADERS, 1, RESPONSE)


def message(body: bytes) -> bytes:
    return struct.pack(">BI", 0, len(body)) + body


@dataclass
class Fake:
    """A listening socket whose one connection gets `script` (bytes, or an iterator of chunks sent until the client
    closes), then EOF if `close`; what the client sent is kept in `received`."""

    script: bytes | Callable[[], Iterator[bytes]]
    close: bool = False
    received: bytearray = field(default_factory=bytearray)
    sent: int = 0
    done: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen()
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        reader = threading.Thread(target=self._read, args=(conn,), daemon=True)
        reader.start()
        try:
            chunks = [self.script] if isinstance(self.script, bytes) else self.script()
            for chunk in chunks:
                conn.sendall(chunk)
                self.sent += len(chunk)
                if self.sent > CAP:
                    break
            if self.close:
                conn.shutdown(socket.SHUT_WR)
        except OSError:  # the client closed: what an endless script waits for
            pass
        reader.join(30)
        conn.close()
        self.done.set()

    def _read(self, conn: socket.socket) -> None:
        conn.settimeout(30)
        try:
            while chunk := conn.recv(65536):
                self.received += chunk
        except OSError:
            pass

    def frames(self) -> list[tuple[int, int, int, bytes]]:
        """What the client sent, after its preface, as (type, flags, stream, payload)."""
        assert self.done.wait(30)
        data = bytes(self.received[24:])
        out = []
        while len(data) >= 9:
            n = int.from_bytes(data[:3], "big")
            out.append((data[3], data[4], int.from_bytes(data[5:9], "big") & 0x7FFFFFFF, data[9:9 + n]))
            data = data[9 + n:]
        return out

    def goaway_code(self) -> int | None:
        codes = [struct.unpack(">II", p[:8])[1] for kind, _, _, p in self.frames() if kind == GOAWAY]
        return codes[0] if codes else None

    def rst_code(self, sid: int) -> int | None:
        codes = [struct.unpack(">I", p)[0] for kind, _, s, p in self.frames() if kind == RST_STREAM and s == sid]
        return codes[0] if codes else None

    def stop(self) -> None:
        self.listener.close()


def endless(first: bytes, each: bytes) -> Callable[[], Iterator[bytes]]:
    def gen() -> Iterator[bytes]:
        yield first
        batch = each * max(1, 65536 // len(each))
        while True:
            yield batch
    return gen


HPACK_BOMB = (  # one 4,000-byte entry added to the table, then named again and again: 2 bytes each time
    b"\x40" + hpack._encode_integer(1, 7, 0) + b"x" + hpack._encode_integer(4000, 7, 0) + b"v" * 4000
    + b"\xbe" * 40)

# (case, what the server sends after its own SETTINGS frame, the call's code, words of its message, the
# connection error code the client sends in GOAWAY)
CONNECTION_ERRORS: list[tuple[str, bytes | Callable[[], Iterator[bytes]], StatusCode, str, int]] = [
    ("initial window over 2^31-1", settings((4, 2**31)), StatusCode.INTERNAL,
     "SETTINGS_INITIAL_WINDOW_SIZE 2147483648, over the maximum 2147483647", FLOW_CONTROL_ERROR),
    ("max frame size under 2^14", settings((5, 16383)), StatusCode.INTERNAL,
     "SETTINGS_MAX_FRAME_SIZE 16383, outside 16384..16777215", PROTOCOL_ERROR),
    ("max frame size over 2^24-1", settings((5, 2**24)), StatusCode.INTERNAL,
     "SETTINGS_MAX_FRAME_SIZE 16777216, outside", PROTOCOL_ERROR),
    ("enable push 2", settings((2, 2)), StatusCode.INTERNAL, "SETTINGS_ENABLE_PUSH 2 from a server", PROTOCOL_ERROR),
    ("enable push 1 from a server", settings((2, 1)), StatusCode.INTERNAL, "SETTINGS_ENABLE_PUSH 1", PROTOCOL_ERROR),
    ("settings not a multiple of 6", frame(SETTINGS, 0, 0, b"\x00\x04\x00\x00\x10"), StatusCode.INTERNAL,
     "SETTINGS frame of 5 bytes, not a multiple of 6", FRAME_SIZE_ERROR),
    ("settings on a stream", frame(SETTINGS, 0, 1), StatusCode.INTERNAL, "SETTINGS frame on stream 1",
     PROTOCOL_ERROR),
    ("settings ack with a payload", frame(SETTINGS, 1, 0, b"\x00" * 6), StatusCode.INTERNAL,
     "SETTINGS acknowledgement of 6 bytes", FRAME_SIZE_ERROR),
    ("DATA padding as long as the frame", OK_HEADERS + frame(DATA, PADDED, 1, b"\x05abcd"), StatusCode.INTERNAL,
     "DATA frame with 5 bytes of padding in a payload of 5", PROTOCOL_ERROR),
    ("DATA padding longer than the frame", OK_HEADERS + frame(DATA, PADDED, 1, b"\xffab"), StatusCode.INTERNAL,
     "DATA frame with 255 bytes of padding", PROTOCOL_ERROR),
    ("DATA padded without a pad length", OK_HEADERS + frame(DATA, PADDED, 1), StatusCode.INTERNAL,
     "padded DATA frame of 0 bytes", FRAME_SIZE_ERROR),
    ("HEADERS padding longer than the block", frame(HEADERS, END_HEADERS | PADDED, 1, b"\x10" + RESPONSE[:8]),
     StatusCode.INTERNAL, "HEADERS frame with 16 bytes of padding in a payload of 9", PROTOCOL_ERROR),
    ("HEADERS padding eats the priority", frame(HEADERS, END_HEADERS | PADDED | PRIORITY_FLAG, 1, b"\x02" + b"\0" * 6),
     StatusCode.INTERNAL, "HEADERS frame with 2 bytes of padding", PROTOCOL_ERROR),
    ("HEADERS too short for its priority", frame(HEADERS, END_HEADERS | PRIORITY_FLAG, 1, b"\0\0"),
     StatusCode.INTERNAL, "HEADERS frame of 2 bytes, too short", FRAME_SIZE_ERROR),
    ("a frame over the max frame size", OK_HEADERS + frame(DATA, 0, 1, b"x" * 16385), StatusCode.INTERNAL,
     "a DATA frame of 16385 bytes, over the 16384 this client accepts", FRAME_SIZE_ERROR),
    ("a 16 MiB frame announced, its payload never sent", frame(DATA, 0, 1, length=2**24 - 1), StatusCode.INTERNAL,
     "a DATA frame of 16777215 bytes", FRAME_SIZE_ERROR),
    ("endless CONTINUATION", endless(frame(HEADERS, 0, 1, RESPONSE), frame(CONTINUATION, 0, 1, b"\x00" * 16384)),
     StatusCode.INTERNAL, "a header block over the 65536 bytes this client accepts", ENHANCE_YOUR_CALM),
    ("endless empty CONTINUATION", endless(frame(HEADERS, 0, 1, RESPONSE), frame(CONTINUATION, 0, 1)),
     StatusCode.INTERNAL, "a header block in over 64 frames", ENHANCE_YOUR_CALM),
    ("a header block interrupted", frame(HEADERS, 0, 1, RESPONSE) + frame(PING, 0, 0, b"\0" * 8),
     StatusCode.INTERNAL, "a PING frame in the middle of the header block of stream 1", PROTOCOL_ERROR),
    ("CONTINUATION without HEADERS", frame(CONTINUATION, END_HEADERS, 1, RESPONSE), StatusCode.INTERNAL,
     "CONTINUATION frame on stream 1 without a header block", PROTOCOL_ERROR),
    ("HPACK table size over the allowed", frame(HEADERS, END_HEADERS, 1, hpack._encode_integer(2**30, 5, 0x20)),
     StatusCode.INTERNAL, "table size 1073741824 over the 4096 allowed", COMPRESSION_ERROR),
    ("HPACK table size update after a field", frame(HEADERS, END_HEADERS, 1, b"\x88\x20"), StatusCode.INTERNAL,
     "table size update after a header field", COMPRESSION_ERROR),
    ("HPACK bomb: a header list too large", frame(HEADERS, END_HEADERS, 1, HPACK_BOMB), StatusCode.INTERNAL,
     "a header list over the 65536 bytes this client accepts", ENHANCE_YOUR_CALM),
    ("HPACK index out of range", frame(HEADERS, END_HEADERS, 1, b"\xff\x00"), StatusCode.INTERNAL,
     "header index 127 out of range", COMPRESSION_ERROR),
    ("connection window overflow", frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 2**31 - 1)), StatusCode.INTERNAL,
     "WINDOW_UPDATE of 2147483647 takes the connection's window over 2147483647", FLOW_CONTROL_ERROR),
    ("connection window update of 0", frame(WINDOW_UPDATE, 0, 0, b"\0" * 4), StatusCode.INTERNAL,
     "WINDOW_UPDATE of 0 for the connection", PROTOCOL_ERROR),
    ("window update of 3 bytes", frame(WINDOW_UPDATE, 0, 0, b"\0\0\1"), StatusCode.INTERNAL,
     "WINDOW_UPDATE frame of 3 bytes, not 4", FRAME_SIZE_ERROR),
    # the request's 8 bytes leave stream 1 a window of 65527: raised to 2^31-1 - 10, then 20 more by SETTINGS
    ("initial window change overflows an open stream",
     frame(WINDOW_UPDATE, 0, 1, struct.pack(">I", 2**31 - 1 - 10 - 65527)) + settings((4, 65535 + 20)),
     StatusCode.INTERNAL, "SETTINGS_INITIAL_WINDOW_SIZE 65555 takes the window of stream 1 over", FLOW_CONTROL_ERROR),
    ("GOAWAY of 4 bytes", frame(GOAWAY, 0, 0, b"\0" * 4), StatusCode.INTERNAL, "GOAWAY frame of 4 bytes, under 8",
     FRAME_SIZE_ERROR),
    ("GOAWAY on a stream", frame(GOAWAY, 0, 1, b"\0" * 8), StatusCode.INTERNAL, "GOAWAY frame on stream 1, not 0",
     PROTOCOL_ERROR),
    ("RST_STREAM of 2 bytes", frame(RST_STREAM, 0, 1, b"\0\0"), StatusCode.INTERNAL,
     "RST_STREAM frame of 2 bytes, not 4", FRAME_SIZE_ERROR),
    ("RST_STREAM on stream 0", frame(RST_STREAM, 0, 0, b"\0" * 4), StatusCode.INTERNAL,
     "RST_STREAM frame on stream 0", PROTOCOL_ERROR),
    ("RST_STREAM for a stream never opened", frame(RST_STREAM, 0, 7, b"\0" * 4), StatusCode.INTERNAL,
     "RST_STREAM for stream 7, which was never opened", PROTOCOL_ERROR),
    ("PING of 7 bytes", frame(PING, 0, 0, b"\0" * 7), StatusCode.INTERNAL, "PING frame of 7 bytes, not 8",
     FRAME_SIZE_ERROR),
    ("PING on a stream", frame(PING, 0, 1, b"\0" * 8), StatusCode.INTERNAL, "PING frame on stream 1, not 0",
     PROTOCOL_ERROR),
    ("PUSH_PROMISE", frame(PUSH_PROMISE, END_HEADERS, 1, b"\0\0\0\2" + RESPONSE), StatusCode.INTERNAL,
     "PUSH_PROMISE, which this client disabled", PROTOCOL_ERROR),
    ("DATA on stream 0", frame(DATA, 0, 0, b"x"), StatusCode.INTERNAL, "DATA frame on stream 0", PROTOCOL_ERROR),
    ("HEADERS for a server stream", frame(HEADERS, END_HEADERS, 2, RESPONSE), StatusCode.INTERNAL,
     "HEADERS frame for stream 2, which was never opened", PROTOCOL_ERROR),
]


def _unary(address: str, timeout: float = 10) -> bytes:
    ch = Channel(address)
    try:
        return bytes(ch.unary_unary("/peloton.v1.JobService/GetJob", bytes, bytes)(b"req", timeout=timeout))
    finally:
        ch.close()  # the fake sees EOF, and stops reading what the client sent


def _with_preface(script: bytes | Callable[[], Iterator[bytes]]) -> bytes | Callable[[], Iterator[bytes]]:
    if isinstance(script, bytes):
        return settings() + script

    def gen() -> Iterator[bytes]:
        yield settings()
        yield from script()
    return gen


@pytest.mark.parametrize(("script", "code", "words", "goaway"), [c[1:] for c in CONNECTION_ERRORS],
                         ids=[c[0] for c in CONNECTION_ERRORS])
def test_a_connection_error_closes_with_goaway_and_says_why(
        script: bytes | Callable[[], Iterator[bytes]], code: StatusCode, words: str, goaway: int) -> None:
    fake = Fake(_with_preface(script))
    try:
        with pytest.raises(RpcError) as e:
            _unary(fake.address)
        assert e.value.code() == code, e.value.details()
        assert words in e.value.details() and f"the daemon at {fake.address} broke HTTP/2" in e.value.details()
        assert "\n" not in e.value.details()
        assert fake.goaway_code() == goaway
        assert fake.sent < CAP  # an endless sequence was cut short by the client
    finally:
        fake.stop()


@pytest.mark.parametrize(("script", "words"), [
    (frame(PING, 0, 0, b"\0" * 8), "it began with a PING frame, not SETTINGS"),
    (frame(SETTINGS, 1, 0), "it began with a SETTINGS frame, not SETTINGS"),  # an ACK is not the preface
])
def test_the_server_must_begin_with_settings(script: bytes, words: str) -> None:
    fake = Fake(script)
    try:
        with pytest.raises(RpcError) as e:
            _unary(fake.address)
        assert e.value.code() == StatusCode.INTERNAL and words in e.value.details()
        assert fake.goaway_code() == PROTOCOL_ERROR
    finally:
        fake.stop()


@pytest.mark.parametrize(("script", "code", "words", "rst"), [
    (frame(WINDOW_UPDATE, 0, 1, struct.pack(">I", 2**31 - 1)), StatusCode.INTERNAL,
     "WINDOW_UPDATE of 2147483647 takes the stream's window over", FLOW_CONTROL_ERROR),
    (frame(WINDOW_UPDATE, 0, 1, b"\0" * 4), StatusCode.INTERNAL, "a WINDOW_UPDATE of 0", PROTOCOL_ERROR),
    (frame(DATA, 0, 1, message(b"x")), StatusCode.INTERNAL, "DATA before the response's headers", PROTOCOL_ERROR),
    (frame(RST_STREAM, 0, 1, struct.pack(">I", REFUSED_STREAM)), StatusCode.UNAVAILABLE,
     "stream reset by the daemon (HTTP/2 REFUSED_STREAM)", None),
    (frame(RST_STREAM, 0, 1, struct.pack(">I", 0xDEAD)), StatusCode.INTERNAL,
     "stream reset by the daemon (HTTP/2 error 0xdead)", None),
], ids=["stream window overflow", "stream window update of 0", "DATA before HEADERS", "RST_STREAM refused",
        "RST_STREAM unknown code"])
def test_a_stream_error_ends_that_call_only(script: bytes, code: StatusCode, words: str, rst: int | None) -> None:
    fake = Fake(settings() + script + frame(PING, 0, 0, b"still up"), close=True)
    try:
        with pytest.raises(RpcError) as e:
            _unary(fake.address)
        assert e.value.code() == code and words in e.value.details()
        assert fake.rst_code(1) == rst
        assert fake.goaway_code() is None
    finally:
        fake.stop()


def test_a_truncated_frame_then_eof() -> None:
    fake = Fake(settings() + OK_HEADERS + frame(DATA, 0, 1, b"0123456789", length=100), close=True)
    try:
        with pytest.raises(RpcError) as e:
            _unary(fake.address)
        assert e.value.code() == StatusCode.UNAVAILABLE
        assert e.value.details() == f"connection to {fake.address} closed in the middle of a frame"
    finally:
        fake.stop()


def test_goaway_in_the_middle_of_a_stream() -> None:
    """The streams the server saw (id <= last) may still finish; when it then closes, the call says how it ended:
    a graceful GOAWAY as a daemon going away (retried by the commands that follow), another code with its name and
    debug data."""
    for code, debug, words in ((0, b"", "closed the connection (shutting down?)"),
                               (ENHANCE_YOUR_CALM, b"too_many_pings\n", "with GOAWAY ENHANCE_YOUR_CALM: too_many_pings?")):
        fake = Fake(settings() + OK_HEADERS + frame(DATA, 0, 1, message(b"one"))
                    + frame(GOAWAY, 0, 0, struct.pack(">II", 1, code) + debug) + frame(DATA, 0, 1, message(b"two")),
                    close=True)
        try:
            call = Channel(fake.address).unary_stream("/peloton.v1.JobService/WatchJobs", bytes, bytes)(b"", timeout=10)
            it = iter(call)
            assert next(it) == b"one" and next(it) == b"two"
            with pytest.raises(RpcError) as e:
                next(it)
            assert e.value.code() == StatusCode.UNAVAILABLE and words in e.value.details()
        finally:
            fake.stop()
    # a stream the server never saw (id > last): failed at once, as safe to send again
    fake = Fake(settings() + frame(GOAWAY, 0, 0, struct.pack(">II", 0, 0)))
    try:
        with pytest.raises(RpcError) as e:
            _unary(fake.address)
        assert e.value.code() == StatusCode.UNAVAILABLE and "is going away" in e.value.details()
    finally:
        fake.stop()


@pytest.mark.parametrize(("block", "code", "words"), [
    (hpack.encode([(":status", "\xb2")]), StatusCode.UNKNOWN, "the daemon answered HTTP \xb2, not gRPC"),
    (hpack.encode([(":status", "200"), ("grpc-status", "\xb9")]), StatusCode.UNKNOWN,
     "the daemon's answer has no grpc-status"),
])
def test_statuses_that_are_not_numbers(block: bytes, code: StatusCode, words: str) -> None:
    """Latin-1 digits such as '²' are digits to str.isdigit, not to int()."""
    fake = Fake(settings() + frame(HEADERS, END_HEADERS | END_STREAM, 1, block), close=True)
    try:
        with pytest.raises(RpcError) as e:
            _unary(fake.address)
        assert e.value.code() == code and e.value.details() == words
    finally:
        fake.stop()


def test_a_flood_of_frames_does_not_outlast_the_deadline() -> None:
    """Frames that keep coming (PINGs, each one the client may handle) do not hold a call past its deadline: the
    deadline is checked before each frame, not only when the socket runs dry."""
    fake = Fake(settings() + frame(PING, 0, 0, b"\0" * 8) * 10000)
    ch = Channel(fake.address)
    try:
        future = ch.unary_unary("/peloton.v1.JobService/GetJob", bytes, bytes).future(b"req", timeout=10)
        conn, stream = future.call.conn, future.call.stream
        assert conn is not None
        while len(conn.inbuf) < 1000:  # frames read from the socket and not handled yet
            conn.pump(stream, None)
        buffered = len(conn.inbuf)
        conn.pump(stream, time.monotonic() - 1)  # its deadline has passed
        assert stream.error is not None and stream.error.code() == StatusCode.DEADLINE_EXCEEDED
        assert len(conn.inbuf) == buffered  # not one more frame handled
    finally:
        ch.close()
        fake.stop()


def test_responses_nobody_reads_are_bounded() -> None:
    """A server streaming on a call the client does not read now (a future started with another) cannot make it
    keep more than one message's limit: that call ends RESOURCE_EXHAUSTED."""
    chunk = message(b"x" * 16000)
    fake = Fake(endless(settings() + OK_HEADERS, frame(DATA, 0, 1, chunk)))
    try:
        call = Channel(fake.address).unary_stream("/peloton.v1.JobService/WatchJobs", bytes, bytes)(b"", timeout=10)
        conn = call.call.conn
        assert conn is not None
        stream = call.call.stream
        while not stream.done:  # what another call's wait does: frames read, this stream's not consumed
            conn.pump(stream, None)
        assert stream.error is not None and stream.error.code() == StatusCode.RESOURCE_EXHAUSTED
        assert "not yet read" in stream.error.details()
        assert stream.queued <= 4 * 1024 * 1024 + 16000
        conn.close()
    finally:
        fake.stop()


CLI_CASES = [c for c in CONNECTION_ERRORS if c[0] in (
    "initial window over 2^31-1", "max frame size under 2^14", "enable push 2", "DATA padding as long as the frame",
    "HEADERS padding longer than the block", "a frame over the max frame size", "endless CONTINUATION",
    "HPACK bomb: a header list too large", "connection window overflow", "RST_STREAM of 2 bytes")]


@pytest.mark.parametrize(("script", "words"), [(c[1], c[3]) for c in CLI_CASES], ids=[c[0] for c in CLI_CASES])
def test_the_command_says_it_in_one_line(script: bytes | Callable[[], Iterator[bytes]], words: str) -> None:
    fake = Fake(_with_preface(script))
    try:
        r = subprocess.run([*PELOTON, "--address", fake.address, "job", "get", "j1"], capture_output=True,
                           text=True, timeout=60, env={"PATH": "/usr/bin:/bin", "PELOTON_CONFIG": "/nonexistent"})
        assert r.returncode == 1, r.stderr
        assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
        assert r.stderr.startswith(f"peloton: error: the daemon at {fake.address} broke HTTP/2: "), r.stderr
        assert words in r.stderr
    finally:
        fake.stop()


def test_truncated_then_eof_through_the_command() -> None:
    fake = Fake(settings() + frame(HEADERS, END_HEADERS, 1, RESPONSE, length=1000), close=True)
    try:
        r = subprocess.run([*PELOTON, "--address", fake.address, "job", "get", "j1"], capture_output=True,
                           text=True, timeout=60, env={"PATH": "/usr/bin:/bin", "PELOTON_CONFIG": "/nonexistent"})
        assert r.returncode == 1 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
        assert "closed in the middle of a frame" in r.stderr
    finally:
        fake.stop()
