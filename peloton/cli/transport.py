"""The CLI's gRPC transport: unary and server-streaming calls over HTTP/2 on a plain socket, standard library only.

Why not grpcio: `import grpc` alone costs ~60 ms (its core and `asyncio`), more than half of what a CLI command may
take in all (`peloton job get` answers in under 100 ms). The daemon is a real grpcio server; this speaks the same
wire protocol (gRPC over HTTP/2, https://github.com/grpc/grpc/blob/master/doc/PROTOCOL-HTTP2.md) as its client
would, for the calls a CLI makes: one connection, calls multiplexed on it as streams, no compression, no retries
(the commands that ride out a restart do that themselves, see reconnect.py). The interface is grpcio's, as far as
the commands use it: `channel.unary_unary(path, serializer, deserializer)(request, timeout=...)`, `.future(...)`,
`channel.unary_stream(...)(...)` iterated and `.cancel()`ed, errors raised as `RpcError` with `code()`,
`details()` and `trailing_metadata()`.

One thread drives a channel (a call's frames are read when some call waits for them); `cancel()` may come from
another thread, which then breaks the connection to wake the reader. The next call dials again."""

from __future__ import annotations

import enum
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence

from peloton.cli import hpack

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up time)
if TYPE_CHECKING:
    import ssl
    from typing import Any, NoReturn

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
FRAME_NAMES = ("DATA", "HEADERS", "PRIORITY", "RST_STREAM", "SETTINGS", "PUSH_PROMISE", "PING", "GOAWAY",
               "WINDOW_UPDATE", "CONTINUATION")
END_STREAM = ACK = 0x1
END_HEADERS, PADDED, PRIORITY_FLAG = 0x4, 0x8, 0x20
SETTINGS_HEADER_TABLE_SIZE, SETTINGS_ENABLE_PUSH, SETTINGS_INITIAL_WINDOW_SIZE = 1, 2, 4
SETTINGS_MAX_FRAME_SIZE, SETTINGS_MAX_HEADER_LIST_SIZE = 5, 6
# HTTP/2 error codes (RFC 9113 section 7), named in what the CLI says
ERROR_NAMES = ("NO_ERROR", "PROTOCOL_ERROR", "INTERNAL_ERROR", "FLOW_CONTROL_ERROR", "SETTINGS_TIMEOUT",
               "STREAM_CLOSED", "FRAME_SIZE_ERROR", "REFUSED_STREAM", "CANCEL", "COMPRESSION_ERROR", "CONNECT_ERROR",
               "ENHANCE_YOUR_CALM", "INADEQUATE_SECURITY", "HTTP_1_1_REQUIRED")
NO_ERROR, PROTOCOL_ERROR, FLOW_CONTROL_ERROR, FRAME_SIZE_ERROR = 0, 1, 3, 6
CANCEL, COMPRESSION_ERROR, ENHANCE_YOUR_CALM = 8, 9, 11
MAX_WINDOW = 2**31 - 1
REFILL = 2**30  # give the peer more window once this much of it is used (a long watch stream goes on for days)
MAX_RECEIVE_BYTES = 4 * 1024 * 1024  # one response message, as grpcio's client allows by default
# What this client accepts, whatever the server sends: frames of the default size (SETTINGS_MAX_FRAME_SIZE is not
# raised), and header blocks (compressed, across CONTINUATION frames) and header lists (decoded, RFC 9113 6.5.2's
# measure) of 64 KiB: a daemon's headers and trailers are a few hundred bytes, its longest error message a few KiB.
MAX_FRAME = 16384
MAX_HEADER_LIST = 65536
MAX_HEADER_FRAMES = 64  # HEADERS and its CONTINUATIONs: empty ones cannot go on for ever either
USER_AGENT = "peloton-cli"
_HEAD = struct.Struct(">BBI")  # a frame header after its 24-bit length: type, flags, stream id


class StatusCode(enum.IntEnum):
    """gRPC's status codes, with grpcio's names."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


# HTTP/2 errors of a stream (RST_STREAM) and HTTP statuses of a non-gRPC answer, as gRPC maps them.
_RST_CODES = {7: StatusCode.UNAVAILABLE, 8: StatusCode.CANCELLED, 11: StatusCode.RESOURCE_EXHAUSTED,
              12: StatusCode.PERMISSION_DENIED}
_HTTP_CODES = {400: StatusCode.INTERNAL, 401: StatusCode.UNAUTHENTICATED, 403: StatusCode.PERMISSION_DENIED,
               404: StatusCode.UNIMPLEMENTED, 429: StatusCode.UNAVAILABLE, 502: StatusCode.UNAVAILABLE,
               503: StatusCode.UNAVAILABLE, 504: StatusCode.UNAVAILABLE}


class RpcError(Exception):
    """A call that did not end with OK."""

    def __init__(self, code: StatusCode, details: str, trailing: tuple[tuple[str, str], ...] = ()) -> None:
        super().__init__(f"{code.name}: {details}")
        self._code, self._details, self._trailing = code, details, trailing
        self.path = ""  # the method called (/peloton.v1.HostService/ListHosts): which service did not answer

    def code(self) -> StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._trailing


class _ConnectionLost(Exception):
    pass


def _percent_decode(s: str) -> str:
    """grpc-message is percent-encoded UTF-8."""
    if "%" not in s:
        return s
    raw = s.encode("latin-1")
    out = bytearray()
    i = 0
    while i < len(raw):
        if raw[i] == 0x25 and _is_hex(raw[i + 1:i + 3]):
            out.append(int(raw[i + 1:i + 3], 16))
            i += 3
        else:
            out.append(raw[i])
            i += 1
    return out.decode("utf-8", "replace")


def _is_hex(b: bytes) -> bool:
    return len(b) == 2 and all(c in b"0123456789abcdefABCDEF" for c in b)


def _timeout_header(seconds: float) -> str:
    ms = max(1, int(seconds * 1000))
    return f"{ms}m" if ms < 100_000_000 else f"{min(int(seconds), 99_999_999)}S"


class Tls:
    """TLS for a channel: the CA that signed the daemon's certificate (None: the system's), and a client
    certificate and key for mutual TLS."""

    def __init__(self, ca: str | None = None, cert: str | None = None, key: str | None = None) -> None:
        self.ca, self.cert, self.key = ca, cert, key

    def context(self) -> ssl.SSLContext:
        import ssl  # only when TLS is used (~7 ms)

        try:
            ctx = ssl.create_default_context(cafile=self.ca)
            if self.cert:
                ctx.load_cert_chain(self.cert, self.key)
        except (OSError, ssl.SSLError) as e:
            files = ", ".join(f"{flag} {path}" for flag, path in (("--tls-ca", self.ca), ("--client-cert", self.cert),
                                                                 ("--client-key", self.key)) if path)
            raise RpcError(StatusCode.UNAVAILABLE, f"cannot load the TLS files ({files}): {e}") from None
        ctx.set_alpn_protocols(["h2"])
        return ctx


class _Stream:
    __slots__ = ("id", "headers", "messages", "queued", "buf", "done", "error", "send_window", "received",
                 "cancelled")

    def __init__(self, stream_id: int, send_window: int) -> None:
        self.id = stream_id
        self.headers: list[tuple[str, str]] | None = None
        self.messages: deque[bytes] = deque()
        self.queued = 0  # bytes in `messages`, not yet read by the caller
        self.buf = bytearray()
        self.done = False
        self.error: RpcError | None = None
        self.send_window = send_window
        self.received = 0
        self.cancelled = False


def _error_name(code: int) -> str:
    return ERROR_NAMES[code] if code < len(ERROR_NAMES) else f"error {code:#x}"


def _frame_name(kind: int) -> str:
    return FRAME_NAMES[kind] if kind < len(FRAME_NAMES) else f"frame type {kind:#x}"


class Connection:
    """One HTTP/2 connection to the daemon and the streams open on it.

    What the server sends is checked as RFC 9113 says a client must: a frame that breaks the protocol is a
    connection error (GOAWAY with its code, the connection closed, every open call failed INTERNAL with one line that
    says what was wrong), one that breaks a stream a stream error (RST_STREAM, that call failed). Memory is bounded
    whatever the server sends: a frame over MAX_FRAME is refused from its header, before its payload is read; a header
    block over MAX_HEADER_LIST (compressed, or decoded by HPACK) ends the connection; a message over
    MAX_RECEIVE_BYTES, or more than that unread on one stream, ends the call. Time is bounded by the call's deadline,
    checked before every frame."""

    def __init__(self, address: str, timeout: float | None, tls: Tls | None = None) -> None:
        self.address = address
        self.scheme = "https" if tls is not None else "http"
        self.authority, self.sock = _dial(address, timeout, tls)
        self.answered = False  # any frame came from the daemon (a plain client at a TLS port gets none)
        self.sock.settimeout(None)
        self.streams: dict[int, _Stream] = {}
        self.next_id = 1
        self.decoder = hpack.Decoder(max_list_size=MAX_HEADER_LIST)
        self.send_window = 65535  # the connection's, for what we send
        self.peer_initial_window = 65535
        self.peer_max_frame = 16384
        self.received = 0  # of the connection's receive window, since we last refilled it
        self.inbuf = bytearray()
        self.closed: str | None = None  # why no more frames can be read or sent
        self.settings_seen = False  # the server's preface (a SETTINGS frame) came
        # a header block awaiting CONTINUATION: (stream, its HEADERS frame's flags, the block so far, frames)
        self.header_block: tuple[int, int, bytearray, int] | None = None
        self.goaway: tuple[int, str] | None = None  # the peer takes no new streams: (error code, debug data)
        self.reader: threading.Thread | None = None  # the thread blocked reading, if any
        self._send_lock = threading.Lock()
        self._send(PREFACE
                   + _frame(SETTINGS, 0, 0, struct.pack(">HIHIHIHI", SETTINGS_ENABLE_PUSH, 0,
                                                        SETTINGS_INITIAL_WINDOW_SIZE, MAX_WINDOW,
                                                        SETTINGS_HEADER_TABLE_SIZE, hpack.DEFAULT_TABLE_SIZE,
                                                        SETTINGS_MAX_HEADER_LIST_SIZE, MAX_HEADER_LIST))
                   + _frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", MAX_WINDOW - 65535)))

    @property
    def usable(self) -> bool:
        return self.closed is None and self.goaway is None and self.next_id < 2**31 - 1

    # --- sending ------------------------------------------------------------------------------------------------
    def _send(self, data: bytes) -> None:
        try:
            with self._send_lock:
                self.sock.sendall(data)
        except OSError as e:
            self._lose(self._lost(e))
            raise _ConnectionLost from None

    def _lost(self, e: OSError) -> str:
        hint = (" (does the daemon want a client certificate? see --client-cert)"
                if not self.answered and self.scheme == "https" else "")
        return f"connection to {self.address} lost: {e.strerror or e}{hint}"

    def start(self, path: str, message: bytes, deadline: float | None, metadata: list[tuple[str, str]]) -> _Stream:
        """Open a stream: the request's headers and its one message."""
        stream = _Stream(self.next_id, self.peer_initial_window)
        self.next_id += 2
        self.streams[stream.id] = stream
        headers = [(":method", "POST"), (":scheme", self.scheme), (":path", path), (":authority", self.authority),
                   ("content-type", "application/grpc"), ("te", "trailers"), ("user-agent", USER_AGENT)]
        if deadline is not None:
            headers.append(("grpc-timeout", _timeout_header(deadline - time.monotonic())))
        headers += metadata
        block = hpack.encode(headers)
        out = bytearray()
        for i in range(0, max(len(block), 1), self.peer_max_frame):
            kind = HEADERS if i == 0 else CONTINUATION
            last = i + self.peer_max_frame >= len(block)
            out += _frame(kind, END_HEADERS if last else 0, stream.id, block[i:i + self.peer_max_frame])
        payload = memoryview(struct.pack(">BI", 0, len(message)) + message)
        while True:  # as much of the message as the peer's windows take, the rest once it gives more
            while payload:
                n = min(len(payload), self.send_window, stream.send_window, self.peer_max_frame)
                if n <= 0:
                    break
                self.send_window -= n
                stream.send_window -= n
                out += _frame(DATA, END_STREAM if n == len(payload) else 0, stream.id, bytes(payload[:n]))
                payload = payload[n:]
            if out:
                self._send(bytes(out))
                out.clear()
            if not payload:
                return stream
            self.pump(stream, deadline)  # a WINDOW_UPDATE, or the stream ends (refused, say)
            if stream.done:
                return stream

    def reset(self, stream: _Stream, code: int = CANCEL) -> None:
        """Cancel a stream this thread no longer reads (RST_STREAM)."""
        if stream.done or self.closed is not None:
            stream.done = True
            return
        stream.done = True
        stream.error = RpcError(StatusCode.CANCELLED, "Locally cancelled")
        self.streams.pop(stream.id, None)
        try:
            self._send(_frame(RST_STREAM, 0, stream.id, struct.pack(">I", code)))
        except _ConnectionLost:
            pass

    # --- receiving ----------------------------------------------------------------------------------------------
    def pump(self, stream: _Stream, deadline: float | None) -> None:
        """Read and handle one frame (for whichever stream it is). DEADLINE_EXCEEDED (and the stream reset) when
        `deadline` passes first."""
        try:
            kind, flags, sid, payload = self._read_frame(deadline)
            self._handle(kind, flags, sid, payload)
        except TimeoutError:
            self.reset(stream)
            stream.error = RpcError(StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
        except _ConnectionLost:  # every open stream has its error
            pass

    def _read_frame(self, deadline: float | None) -> tuple[int, int, int, bytes]:
        while True:
            if deadline is not None and time.monotonic() >= deadline:  # also when frames keep coming (a flood)
                raise TimeoutError
            if len(self.inbuf) >= 9:
                length = int.from_bytes(self.inbuf[:3], "big")
                kind, flags, sid = _HEAD.unpack_from(self.inbuf, 3)
                if length > MAX_FRAME:  # refused from its header: its payload is never buffered
                    self._connection_error(FRAME_SIZE_ERROR, f"a {_frame_name(kind)} frame of {length} bytes, over "
                                                             f"the {MAX_FRAME} this client accepts")
                if len(self.inbuf) >= 9 + length:
                    payload = bytes(self.inbuf[9:9 + length])
                    del self.inbuf[:9 + length]
                    return kind, flags, sid & 0x7FFFFFFF, payload
            if self.closed is not None:
                raise _ConnectionLost
            if deadline is not None:
                self.sock.settimeout(max(deadline - time.monotonic(), 0.001))
            else:
                self.sock.settimeout(None)
            self.reader = threading.current_thread()
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                raise
            except OSError as e:
                self._lose(self._lost(e))
                raise _ConnectionLost from None
            finally:
                self.reader = None
            if not chunk:
                self._lose(self._closed_why())
                raise _ConnectionLost
            self.answered = True
            self.inbuf += chunk

    def _closed_why(self) -> str:
        """Why the connection ended, when the daemon closed it."""
        if self.goaway is not None:
            code, debug = self.goaway
            if code == NO_ERROR:
                return f"the daemon at {self.address} closed the connection (shutting down?)"
            return (f"the daemon at {self.address} closed the connection with GOAWAY {_error_name(code)}"
                    + (f": {debug}" if debug else ""))
        if not self.answered and self.scheme == "http":
            return f"connection to {self.address} closed before any answer (does the daemon use TLS? see --tls-ca)"
        if not self.answered:  # TLS 1.3: a refused client certificate may end as a plain close
            return (f"connection to {self.address} closed before any answer (does the daemon want a client "
                    "certificate? see --client-cert)")
        if self.inbuf:
            return f"connection to {self.address} closed in the middle of a frame"
        return f"connection to {self.address} closed"

    def _handle(self, kind: int, flags: int, sid: int, payload: bytes) -> None:
        if not self.settings_seen:  # the server's connection preface is a SETTINGS frame (RFC 9113 3.4)
            if kind != SETTINGS or flags & ACK:
                self._connection_error(PROTOCOL_ERROR, f"it began with a {_frame_name(kind)} frame, not SETTINGS")
            self.settings_seen = True
        if self.header_block is not None:  # nothing may come between a header block's frames (RFC 9113 6.10)
            if kind != CONTINUATION or sid != self.header_block[0]:
                self._connection_error(PROTOCOL_ERROR, f"a {_frame_name(kind)} frame in the middle of the header "
                                                       f"block of stream {self.header_block[0]}")
            self._header_fragment(flags, payload)
            return
        if kind == DATA:
            self._on_data(flags, sid, payload)
        elif kind == HEADERS:
            self._on_headers(flags, sid, payload)
        elif kind == CONTINUATION:
            self._connection_error(PROTOCOL_ERROR, f"a CONTINUATION frame on stream {sid} without a header block")
        elif kind == RST_STREAM:
            self._on_rst_stream(sid, payload)
        elif kind == SETTINGS:
            self._on_settings(flags, sid, payload)
        elif kind == PING:
            self._check_connection_frame(kind, sid, payload, 8)
            if not flags & ACK:
                self._send(_frame(PING, ACK, 0, payload))
        elif kind == GOAWAY:
            self._on_goaway(sid, payload)
        elif kind == WINDOW_UPDATE:
            self._on_window_update(sid, payload)
        elif kind == PUSH_PROMISE:
            self._connection_error(PROTOCOL_ERROR, "a PUSH_PROMISE, which this client disabled (ENABLE_PUSH 0)")
        elif kind == PRIORITY:
            if sid == 0:
                self._connection_error(PROTOCOL_ERROR, "a PRIORITY frame on stream 0")
            stream = self.streams.get(sid)
            if len(payload) != 5 and stream is not None:
                self._stream_error(stream, FRAME_SIZE_ERROR, f"a PRIORITY frame of {len(payload)} bytes, not 5")
        # unknown frame types are ignored, as HTTP/2 requires

    def _check_connection_frame(self, kind: int, sid: int, payload: bytes, size: int) -> None:
        if sid != 0:
            self._connection_error(PROTOCOL_ERROR, f"a {_frame_name(kind)} frame on stream {sid}, not 0")
        if len(payload) != size:
            self._connection_error(FRAME_SIZE_ERROR, f"a {_frame_name(kind)} frame of {len(payload)} bytes, not {size}")

    def _idle(self, sid: int) -> bool:
        """A stream this client never opened (the server opens none: ENABLE_PUSH 0): frames for it break the
        protocol, unlike late frames of a stream that ended (RFC 9113 5.1)."""
        return sid % 2 == 0 or sid >= self.next_id

    def _on_settings(self, flags: int, sid: int, payload: bytes) -> None:
        if sid != 0:
            self._connection_error(PROTOCOL_ERROR, f"a SETTINGS frame on stream {sid}, not 0")
        if flags & ACK:
            if payload:
                self._connection_error(FRAME_SIZE_ERROR, f"a SETTINGS acknowledgement of {len(payload)} bytes, not 0")
            return
        if len(payload) % 6:
            self._connection_error(FRAME_SIZE_ERROR, f"a SETTINGS frame of {len(payload)} bytes, not a multiple of 6")
        initial_window, max_frame = self.peer_initial_window, self.peer_max_frame
        for i in range(0, len(payload), 6):  # all checked before any applies
            key, value = struct.unpack_from(">HI", payload, i)
            if key == SETTINGS_ENABLE_PUSH and value != 0:  # a server never pushes (RFC 9113 6.5.2)
                self._connection_error(PROTOCOL_ERROR, f"SETTINGS_ENABLE_PUSH {value} from a server (must be 0)")
            elif key == SETTINGS_INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    self._connection_error(FLOW_CONTROL_ERROR,
                                           f"SETTINGS_INITIAL_WINDOW_SIZE {value}, over the maximum {MAX_WINDOW}")
                initial_window = value
            elif key == SETTINGS_MAX_FRAME_SIZE:
                if not 2**14 <= value <= 2**24 - 1:
                    self._connection_error(PROTOCOL_ERROR, f"SETTINGS_MAX_FRAME_SIZE {value}, outside "
                                                           f"{2**14}..{2**24 - 1}")
                max_frame = value
        delta = initial_window - self.peer_initial_window
        for s in self.streams.values():
            if s.send_window + delta > MAX_WINDOW:
                self._connection_error(FLOW_CONTROL_ERROR, f"SETTINGS_INITIAL_WINDOW_SIZE {initial_window} takes "
                                                           f"the window of stream {s.id} over {MAX_WINDOW}")
        for s in self.streams.values():
            s.send_window += delta
        self.peer_initial_window, self.peer_max_frame = initial_window, max_frame
        self._send(_frame(SETTINGS, ACK, 0, b""))

    def _on_window_update(self, sid: int, payload: bytes) -> None:
        if len(payload) != 4:
            self._connection_error(FRAME_SIZE_ERROR, f"a WINDOW_UPDATE frame of {len(payload)} bytes, not 4")
        increment = struct.unpack(">I", payload)[0] & 0x7FFFFFFF
        if sid == 0:
            if increment == 0:
                self._connection_error(PROTOCOL_ERROR, "a WINDOW_UPDATE of 0 for the connection")
            if self.send_window + increment > MAX_WINDOW:
                self._connection_error(FLOW_CONTROL_ERROR, f"a WINDOW_UPDATE of {increment} takes the connection's "
                                                           f"window over {MAX_WINDOW}")
            self.send_window += increment
            return
        stream = self.streams.get(sid)
        if stream is None:
            if self._idle(sid):
                self._connection_error(PROTOCOL_ERROR, f"a WINDOW_UPDATE for stream {sid}, which was never opened")
            return
        if increment == 0:
            self._stream_error(stream, PROTOCOL_ERROR, "a WINDOW_UPDATE of 0")
        elif stream.send_window + increment > MAX_WINDOW:
            self._stream_error(stream, FLOW_CONTROL_ERROR, f"a WINDOW_UPDATE of {increment} takes the stream's "
                                                           f"window over {MAX_WINDOW}")
        else:
            stream.send_window += increment

    def _on_rst_stream(self, sid: int, payload: bytes) -> None:
        if sid == 0:
            self._connection_error(PROTOCOL_ERROR, "a RST_STREAM frame on stream 0")
        if len(payload) != 4:
            self._connection_error(FRAME_SIZE_ERROR, f"a RST_STREAM frame of {len(payload)} bytes, not 4")
        if self._idle(sid):
            self._connection_error(PROTOCOL_ERROR, f"a RST_STREAM for stream {sid}, which was never opened")
        stream = self.streams.pop(sid, None)
        if stream is not None and not stream.done:
            code = struct.unpack(">I", payload)[0]
            stream.done = True
            stream.error = RpcError(_RST_CODES.get(code, StatusCode.INTERNAL),
                                    f"stream reset by the daemon (HTTP/2 {_error_name(code)})")

    def _on_goaway(self, sid: int, payload: bytes) -> None:
        if sid != 0:
            self._connection_error(PROTOCOL_ERROR, f"a GOAWAY frame on stream {sid}, not 0")
        if len(payload) < 8:
            self._connection_error(FRAME_SIZE_ERROR, f"a GOAWAY frame of {len(payload)} bytes, under 8")
        last, code = struct.unpack_from(">II", payload)
        last &= 0x7FFFFFFF
        debug = payload[8:208].decode("ascii", "replace")
        self.goaway = (code, "".join(c if c.isprintable() else "?" for c in debug))
        for s in list(self.streams.values()):
            if s.id > last:  # never seen by the daemon: safe to send again
                self._fail(s, StatusCode.UNAVAILABLE, f"the daemon at {self.address} is going away")

    def _on_data(self, flags: int, sid: int, payload: bytes) -> None:
        if sid == 0:
            self._connection_error(PROTOCOL_ERROR, "a DATA frame on stream 0")
        stream = self.streams.get(sid)
        if stream is None and self._idle(sid):
            self._connection_error(PROTOCOL_ERROR, f"a DATA frame for stream {sid}, which was never opened")
        size = len(payload)  # what flow control counts: the whole frame, padding included (RFC 9113 6.9.1)
        if flags & PADDED:  # checked even for a stream that ended: it is the connection's framing
            payload = self._unpad(DATA, payload, 0)
        self.received += size
        refill = b""
        if self.received >= REFILL:
            refill += _frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", self.received))
            self.received = 0
        if stream is not None:
            stream.received += size
            if stream.received >= REFILL and not flags & END_STREAM:
                refill += _frame(WINDOW_UPDATE, 0, sid, struct.pack(">I", stream.received))
                stream.received = 0
        if refill:
            self._send(refill)
        if stream is None or stream.done:
            return
        if stream.headers is None:
            return self._stream_error(stream, PROTOCOL_ERROR, "DATA before the response's headers")
        stream.buf += payload
        while len(stream.buf) >= 5:
            compressed, length = struct.unpack_from(">BI", stream.buf)
            if compressed:
                return self._fail(stream, StatusCode.INTERNAL, "the daemon sent a compressed message")
            if length > MAX_RECEIVE_BYTES:
                self.reset(stream)
                stream.error = RpcError(StatusCode.RESOURCE_EXHAUSTED,
                                        f"response of {length} bytes is over the {MAX_RECEIVE_BYTES} allowed")
                return None
            if len(stream.buf) < 5 + length:
                break
            stream.messages.append(bytes(stream.buf[5:5 + length]))
            stream.queued += length
            del stream.buf[:5 + length]
            if stream.queued > MAX_RECEIVE_BYTES:  # a call nobody reads now (a future) cannot grow without end
                self.reset(stream)
                stream.error = RpcError(StatusCode.RESOURCE_EXHAUSTED, f"the daemon sent over {MAX_RECEIVE_BYTES} "
                                                                       "bytes of responses not yet read")
                return None
        if flags & END_STREAM:
            self._fail(stream, StatusCode.INTERNAL, "the daemon ended the stream without a status")
        return None

    def _unpad(self, kind: int, payload: bytes, fixed: int) -> bytes:
        """A PADDED frame's payload without its pad length field and its padding (`fixed`: the bytes of fields
        that must follow the pad length, a HEADERS frame's priority)."""
        if len(payload) < 1 + fixed:
            self._connection_error(FRAME_SIZE_ERROR, f"a padded {_frame_name(kind)} frame of {len(payload)} bytes, "
                                                     "too short for its fields")
        pad = payload[0]
        if pad > len(payload) - 1 - fixed:  # RFC 9113 6.1, 6.2: as much padding as payload, or more
            self._connection_error(PROTOCOL_ERROR, f"a {_frame_name(kind)} frame with {pad} bytes of padding in a "
                                                   f"payload of {len(payload)}")
        return payload[1:len(payload) - pad]

    def _on_headers(self, flags: int, sid: int, payload: bytes) -> None:
        if sid == 0:
            self._connection_error(PROTOCOL_ERROR, "a HEADERS frame on stream 0")
        if self._idle(sid):
            self._connection_error(PROTOCOL_ERROR, f"a HEADERS frame for stream {sid}, which was never opened")
        fixed = 5 if flags & PRIORITY_FLAG else 0
        if flags & PADDED:
            payload = self._unpad(HEADERS, payload, fixed)
        elif len(payload) < fixed:
            self._connection_error(FRAME_SIZE_ERROR, f"a HEADERS frame of {len(payload)} bytes, too short for its "
                                                     "priority")
        self.header_block = (sid, flags, bytearray(), 0)
        self._header_fragment(flags, payload[fixed:])

    def _header_fragment(self, flags: int, fragment: bytes) -> None:
        """A header block's next fragment (its HEADERS frame's, then each CONTINUATION's); the whole block is
        decoded once the frame with END_HEADERS comes."""
        assert self.header_block is not None
        sid, first_flags, block, frames = self.header_block
        block += fragment
        frames += 1
        if len(block) > MAX_HEADER_LIST:
            self._connection_error(ENHANCE_YOUR_CALM, f"a header block over the {MAX_HEADER_LIST} bytes this client "
                                                      f"accepts (stream {sid}, {frames} frames)")
        if frames > MAX_HEADER_FRAMES:
            self._connection_error(ENHANCE_YOUR_CALM, f"a header block in over {MAX_HEADER_FRAMES} frames (stream "
                                                      f"{sid})")
        if not flags & END_HEADERS:
            self.header_block = (sid, first_flags, block, frames)
            return
        self.header_block = None
        try:
            headers = self.decoder.decode(bytes(block))  # always: the table is shared by every stream
        except hpack.HeaderListTooLarge as e:
            self._connection_error(ENHANCE_YOUR_CALM, str(e))
        except hpack.HpackError as e:
            self._connection_error(COMPRESSION_ERROR, f"a header block that does not decode: {e}")
        self._on_header_list(first_flags, sid, headers)

    def _on_header_list(self, flags: int, sid: int, headers: list[tuple[str, str]]) -> None:
        stream = self.streams.get(sid)
        if stream is None or stream.done:
            return
        if stream.headers is None:
            stream.headers = headers
            status = dict(headers).get(":status", "")
            if status != "200":
                code = _HTTP_CODES.get(int(status) if _is_number(status) else 0, StatusCode.UNKNOWN)
                return self._fail(stream, code, f"the daemon answered HTTP {status[:20] or '(none)'}, not gRPC")
            if not flags & END_STREAM:
                return None
        if not flags & END_STREAM:
            return self._fail(stream, StatusCode.INTERNAL, "the daemon sent headers twice")
        self._finish(stream, headers)
        return None

    def _finish(self, stream: _Stream, trailers: list[tuple[str, str]]) -> None:
        self.streams.pop(stream.id, None)
        stream.done = True
        status = ""
        message = ""
        metadata: list[tuple[str, str]] = []
        for k, v in trailers:
            if k == "grpc-status":
                status = v
            elif k == "grpc-message":
                message = _percent_decode(v)
            elif not k.startswith(":"):
                metadata.append((k, v))
        if not _is_number(status):
            stream.error = RpcError(StatusCode.UNKNOWN, "the daemon's answer has no grpc-status")
        elif int(status) != 0:
            try:
                code = StatusCode(int(status))
            except ValueError:
                code = StatusCode.UNKNOWN
            stream.error = RpcError(code, message, tuple(metadata))

    def _fail(self, stream: _Stream, code: StatusCode, details: str) -> None:
        if not stream.done:
            self.reset(stream)
            stream.error = RpcError(code, details)

    def _stream_error(self, stream: _Stream, code: int, what: str) -> None:
        """The server broke one stream (RFC 9113 5.4.2): RST_STREAM with the code; that call fails INTERNAL."""
        if not stream.done:
            self.reset(stream, code)
            stream.error = RpcError(StatusCode.INTERNAL, f"the daemon at {self.address} broke HTTP/2 on this call: "
                                                         f"{what} ({_error_name(code)})")

    def _connection_error(self, code: int, what: str) -> NoReturn:
        """The server broke the connection's protocol (RFC 9113 5.4.1): GOAWAY with the code, then close; every
        open call fails INTERNAL (not retried: the same server would do the same) with `what`."""
        if self.closed is None:
            try:
                with self._send_lock:
                    self.sock.settimeout(1.0)  # a server that reads nothing does not hold the CLI here
                    self.sock.sendall(_frame(GOAWAY, 0, 0, struct.pack(">II", 0, code)))  # it may open no stream
            except OSError:
                pass
        self._lose(f"the daemon at {self.address} broke HTTP/2: {what} ({_error_name(code)}); connection closed",
                   StatusCode.INTERNAL)
        raise _ConnectionLost

    def _lose(self, why: str, code: StatusCode = StatusCode.UNAVAILABLE) -> None:
        if self.closed is not None:
            return
        self.closed = why
        for s in self.streams.values():
            if not s.done:
                s.done = True
                s.error = (RpcError(StatusCode.CANCELLED, "Locally cancelled") if s.cancelled
                           else RpcError(code, why))
        self.streams.clear()
        try:
            self.sock.close()
        except OSError:
            pass

    def close(self) -> None:
        self._lose("closed")

    def interrupt(self) -> None:
        """From another thread: wake the reader by breaking the connection."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def _is_number(s: str) -> bool:
    return s.isascii() and s.isdigit()


def _frame(kind: int, flags: int, sid: int, payload: bytes) -> bytes:
    return len(payload).to_bytes(3, "big") + bytes((kind, flags)) + sid.to_bytes(4, "big") + payload


def _dial(address: str, timeout: float | None, tls: Tls | None = None) -> tuple[str, socket.socket]:
    """(authority, connected socket) for HOST:PORT, [V6]:PORT or unix:PATH; with `tls`, after the handshake (the
    daemon's certificate checked against the CA and the host name, HTTP/2 agreed by ALPN)."""
    authority, sock = _connect(address, timeout)
    if tls is None:
        return authority, sock
    import ssl

    host = authority.rpartition(":")[0].strip("[]") if not address.startswith("unix:") else "localhost"
    try:
        conn = tls.context().wrap_socket(sock, server_hostname=host)
    except ssl.SSLCertVerificationError as e:
        sock.close()
        raise RpcError(StatusCode.UNAVAILABLE, f"TLS with {address} failed: {e.verify_message} (is --tls-ca the "
                                               "CA that signed the daemon's certificate, for this host name?)") from None
    except (ssl.SSLError, OSError) as e:
        sock.close()
        raise RpcError(StatusCode.UNAVAILABLE, f"TLS with {address} failed: {getattr(e, 'reason', None) or e} "
                                               "(is the daemon serving TLS?)") from None
    if conn.selected_alpn_protocol() != "h2":
        conn.close()
        raise RpcError(StatusCode.UNAVAILABLE, f"TLS with {address}: the daemon did not agree to HTTP/2")
    return authority, conn


def _connect(address: str, timeout: float | None) -> tuple[str, socket.socket]:
    try:
        if address.startswith("unix:"):
            path = address[5:].removeprefix("//")
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(timeout)
            try:
                sock.connect(path)
            except OSError:
                sock.close()
                raise
            return "localhost", sock
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise RpcError(StatusCode.UNAVAILABLE, f"{address}: not HOST:PORT or unix:PATH")
        sock = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return address, sock
    except OSError as e:
        raise RpcError(StatusCode.UNAVAILABLE, f"failed to connect to {address}: {e.strerror or e}") from None


class RedirectRefused(RpcError):
    """A standby named a leader outside the configured cluster, and it was not followed (FAILED_PRECONDITION: not
    retried, as the same standby would say the same)."""

    def __init__(self, standby: str, leader: str, configured: Sequence[str]) -> None:
        super().__init__(StatusCode.FAILED_PRECONDITION,
                         f"the daemon at {standby} is a standby and names {leader} as the leader, which is not one of "
                         f"the addresses configured ({', '.join(configured)}): not followed, so that the call and its "
                         f"credentials go to no other address; to trust it, add it to them (--address "
                         f"{','.join([*configured, leader])}, or $PELOTON_ADDRESS, or the context's address)")
        self.standby, self.leader = standby, leader


def normal_address(address: str) -> str:
    """An address as compared to decide whether a standby's leader is in the configured cluster: the host name's
    case and `unix://` (for `unix:`) do not count, and nothing is resolved (a name and an address it resolves to are
    not the same: another name, or a changed DNS answer, must not bring an address in)."""
    a = address.strip()
    if a.startswith("unix:"):
        return "unix:" + a[5:].removeprefix("//")
    host, sep, port = a.rpartition(":")
    return f"{host.lower()}{sep}{port}" if sep else a.lower()


class Channel:
    """Calls to a daemon, on one connection dialled when first needed (and again after it broke). Given several
    addresses (a leader and its standbys), each dial tries the current one first, then the others in order: the
    leader may have died and a standby taken over.

    The addresses given are the cluster, as the user configured it. A standby's answer naming the leader sends the
    call there only when the leader is one of them, or when `confirm(standby, leader)` (the CLI asks a person at a
    terminal) says yes; else the call fails with RedirectRefused. So a standby, or whoever answers at its address,
    cannot send the call, its bearer token or the client certificate anywhere else. With TLS every address dialled,
    a followed one too, must present a certificate of the CA for its own host name before anything is sent: the
    handshake checks it before the client certificate goes, and the token goes in the first request after it."""

    def __init__(self, address: str, connect_timeout: float = 10.0, tls: Tls | None = None,
                 metadata: list[tuple[str, str]] | None = None, others: Sequence[str] = (),
                 confirm: Callable[[str, str], bool] | None = None) -> None:
        """`metadata`: sent with every call (a bearer token). `others`: further addresses of the same cluster;
        with them, each address gets at most CONNECT_EACH_S to accept a connection. `confirm`: asked whether to
        follow a standby to a leader outside them (None: never)."""
        self.address = address
        self.addresses = [address, *(a for a in others if a != address)]
        self.connect_timeout = min(connect_timeout, CONNECT_EACH_S) if others else connect_timeout
        self.tls = tls
        self.metadata = list(metadata or ())
        self.confirm = confirm
        self._conn: Connection | None = None

    def in_cluster(self, address: str) -> bool:
        return normal_address(address) in {normal_address(a) for a in self.addresses}

    def connection(self, deadline: float | None, others: bool = True) -> Connection:
        """The connection, dialled again if it broke: the current address first, then (`others`) the rest."""
        if self._conn is None or not self._conn.usable:
            order = [self.address, *(a for a in self.addresses if a != self.address and others)]
            first: RpcError | None = None
            for address in order:
                timeout = self.connect_timeout
                if deadline is not None:
                    timeout = max(0.001, min(timeout, deadline - time.monotonic()))
                try:
                    self._conn = Connection(address, timeout, self.tls)
                except RpcError as e:
                    first = first or e
                    continue
                except _ConnectionLost:
                    first = first or RpcError(StatusCode.UNAVAILABLE, f"{address}: the connection was lost")
                    continue
                self.address = address
                return self._conn
            assert first is not None
            raise first
        return self._conn

    def follow(self, leader: str) -> bool:
        """A standby named the leader: send this call and the next ones there, if it is in the cluster (or
        `confirm` let it in). False when it names this very address (it has not learnt of its own takeover yet):
        the caller retries as for any UNAVAILABLE. RedirectRefused when it may not be followed."""
        if not leader or normal_address(leader) == normal_address(self.address):
            return False
        if not self.in_cluster(leader):
            if self.confirm is None or not self.confirm(self.address, leader):
                raise RedirectRefused(self.address, leader, self.addresses)
            self.addresses.append(leader)  # for the rest of this command: asked once
        self.close()
        self.address = leader
        return True

    def unary_unary(self, path: str, request_serializer: Callable[[Any], bytes],
                    response_deserializer: Callable[[bytes], Any]) -> UnaryUnary:
        return UnaryUnary(self, path, request_serializer, response_deserializer)

    def unary_stream(self, path: str, request_serializer: Callable[[Any], bytes],
                     response_deserializer: Callable[[bytes], Any]) -> UnaryStream:
        return UnaryStream(self, path, request_serializer, response_deserializer)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class Call:
    """One call in flight: its stream, read when someone waits on it."""

    def __init__(self, channel: Channel, path: str, request: bytes, timeout: float | None,
                 metadata: list[tuple[str, str]] | None, deserialize: Callable[[bytes], Any]) -> None:
        self.deserialize = deserialize
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self._again = (channel, path, request, metadata)
        self._answered = False  # a message came: the call is not sent again elsewhere
        self._redirected = False
        self._start()

    def _start(self) -> None:
        channel, path, request, metadata = self._again
        self.conn: Connection | None = None
        try:
            # sent to a leader by a standby: that leader or nothing (the others would send it there again)
            self.conn = channel.connection(self.deadline, others=not self._redirected)
            self.stream = self.conn.start(path, request, self.deadline, [*channel.metadata, *(metadata or ())])
        except (RpcError, _ConnectionLost) as e:  # raised where the answer is waited for, as grpcio does
            self.stream = _Stream(0, 0)
            self.stream.done = True
            self.stream.error = e if isinstance(e, RpcError) else RpcError(
                StatusCode.UNAVAILABLE, (self.conn.closed if self.conn else None) or "connection lost")

    def next_message(self) -> bytes | None:
        """The next response message; None once the call ended OK; RpcError if it did not. A standby's answer
        (UNAVAILABLE naming the leader) sends the call, once, to the leader it names, if the channel may follow it
        there (Channel.follow)."""
        s = self.stream
        while not s.messages and not s.done:
            assert self.conn is not None
            self.conn.pump(s, self.deadline)
        if s.messages and s.error is None:
            self._answered = True
            message = s.messages.popleft()
            s.queued -= len(message)
            return message
        if s.error is not None:
            error = s.error
            if not self._answered and not self._redirected:
                try:
                    if self._again[0].follow(_leader_of(error)):
                        self._redirected = True
                        self._start()
                        return self.next_message()
                except RedirectRefused as refused:
                    error = refused
            error.path = error.path or self._again[1]
            raise error
        return None

    def cancel(self) -> bool:
        """End the call (from any thread). False when it had ended already."""
        s = self.stream
        if s.done:
            return False
        s.cancelled = True
        assert self.conn is not None
        if self.conn.reader is not None and self.conn.reader is not threading.current_thread():
            self.conn.interrupt()
        else:
            self.conn.reset(s)
        return True


CONNECT_EACH_S = 2.0  # of several addresses, how long each may take to accept a connection
LEADER_METADATA = "peloton-leader"  # leadership/standby.py


def _leader_of(e: RpcError) -> str:
    if e.code() != StatusCode.UNAVAILABLE:
        return ""
    return next((v for k, v in e.trailing_metadata() if k == LEADER_METADATA), "")


class _Method:
    """One method of a service on a channel: what starts a call of it."""

    def __init__(self, channel: Channel, path: str, serialize: Callable[[Any], bytes],
                 deserialize: Callable[[bytes], Any]) -> None:
        self.channel, self.path, self.serialize, self.deserialize = channel, path, serialize, deserialize

    def _start(self, request: Any, timeout: float | None, metadata: list[tuple[str, str]] | None) -> Call:
        return Call(self.channel, self.path, self.serialize(request), timeout, metadata, self.deserialize)


class UnaryUnary(_Method):
    def __call__(self, request: Any, timeout: float | None = None,
                 metadata: list[tuple[str, str]] | None = None) -> Any:
        return self.future(request, timeout, metadata).result()

    def future(self, request: Any, timeout: float | None = None,
               metadata: list[tuple[str, str]] | None = None) -> UnaryFuture:
        """Send the request now; `result()` waits for the answer (calls started together run together)."""
        return UnaryFuture(self._start(request, timeout, metadata))


class UnaryFuture:
    def __init__(self, call: Call) -> None:
        self.call = call

    def result(self) -> Any:
        first = self.call.next_message()
        if first is None:
            raise RpcError(StatusCode.INTERNAL, "the daemon sent no response")
        if self.call.next_message() is not None:
            raise RpcError(StatusCode.INTERNAL, "the daemon sent more than one response")
        return self.call.deserialize(first)

    def cancel(self) -> bool:
        return self.call.cancel()


class UnaryStream(_Method):
    def __call__(self, request: Any, timeout: float | None = None,
                 metadata: list[tuple[str, str]] | None = None) -> StreamCall:
        return StreamCall(self._start(request, timeout, metadata))


class StreamCall:
    """A server-streaming call: iterate for its responses; `cancel()` ends it."""

    def __init__(self, call: Call) -> None:
        self.call = call

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        raw = self.call.next_message()
        if raw is None:
            raise StopIteration
        return self.call.deserialize(raw)

    def cancel(self) -> bool:
        return self.call.cancel()
