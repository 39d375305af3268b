"""The thin streaming HTTP shell for the Mesos v1 scheduler API (stdlib http.client, one thread).

Subscribes to the leading master (following 307 with its protocol-relative Location, retrying 503), reads the
RecordIO event stream as bytes, watches for silence (no bytes for `heartbeat_misses` heartbeats), and
re-subscribes with exponential backoff and jitter on EOF, ERROR or a read error. Calls go on separate
connections with the Mesos-Stream-Id header and a timeout. Every decision about what to send lives in the
backend; this module only moves bytes.
"""

from __future__ import annotations

import base64
import http.client
import json
import logging
import random
import socket
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

log = logging.getLogger(__name__)

PATH = "/api/v1/scheduler"
DEFAULT_HEARTBEAT_S = 15.0


class MesosCallError(Exception):
    def __init__(self, status: int, text: str) -> None:
        super().__init__(f"HTTP {status}: {text.strip()[:300]}")
        self.status = status
        self.text = text


class RecordIODecoder:
    """`<decimal length>\\n<payload>` records from arbitrarily chunked bytes (bytes, never str)."""

    def __init__(self, max_record: int = 256 * 1024 * 1024) -> None:
        self._buf = bytearray()
        self._max = max_record

    def feed(self, data: bytes) -> list[bytes]:
        self._buf += data
        out: list[bytes] = []
        while True:
            nl = self._buf.find(b"\n")
            if nl < 0:
                if len(self._buf) > 20:
                    raise ValueError(f"RecordIO: no record length in {bytes(self._buf[:20])!r}")
                return out
            head = bytes(self._buf[:nl])
            if not head.isdigit():
                raise ValueError(f"RecordIO: bad record length {head[:20]!r}")
            n = int(head)
            if n > self._max:
                raise ValueError(f"RecordIO: record of {n} bytes is too large")
            if len(self._buf) < nl + 1 + n:
                return out
            out.append(bytes(self._buf[nl + 1 : nl + 1 + n]))
            del self._buf[: nl + 1 + n]


def encode_record(payload: bytes) -> bytes:
    return str(len(payload)).encode() + b"\n" + payload


class MesosTransport:
    def __init__(
        self,
        masters: list[str],
        subscribe_body: Callable[[], dict[str, Any]],
        on_event: Callable[[dict[str, Any]], None],
        *,
        principal: str = "",
        secret: str = "",
        call_timeout_s: float = 30.0,
        connect_timeout_s: float = 10.0,
        heartbeat_misses: float = 5.0,
        backoff_min_s: float = 0.5,
        backoff_max_s: float = 15.0,
    ) -> None:
        if not masters:
            raise ValueError("at least one Mesos master URL is required")
        self.masters = [m.rstrip("/") for m in masters]
        self._subscribe_body = subscribe_body
        self._on_event = on_event
        self._auth = (
            "Basic " + base64.b64encode(f"{principal}:{secret}".encode()).decode() if principal else None
        )
        self.call_timeout_s = call_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.heartbeat_misses = heartbeat_misses
        self.backoff_min_s = backoff_min_s
        self.backoff_max_s = backoff_max_s
        self.leader: str = self.masters[0]
        self.stream_id: str | None = None
        self._next_master = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._conn: http.client.HTTPConnection | None = None
        self._lock = threading.Lock()

    # --- lifecycle ------------------------------------------------------------------------------------------
    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="mesos-stream", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._close_stream()
        if self._thread is not None:
            self._thread.join(5)

    def _close_stream(self) -> None:
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            try:
                if conn.sock is not None:
                    conn.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()

    # --- HTTP plumbing --------------------------------------------------------------------------------------
    def _headers(self, stream: bool) -> dict[str, str]:
        h = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._auth:
            h["Authorization"] = self._auth
        if not stream and self.stream_id:
            h["Mesos-Stream-Id"] = self.stream_id
        return h

    def _connect(self, base: str, timeout: float) -> http.client.HTTPConnection:
        u = urlsplit(base)
        cls = http.client.HTTPSConnection if u.scheme == "https" else http.client.HTTPConnection
        return cls(u.hostname or "127.0.0.1", u.port or 5050, timeout=timeout)

    @staticmethod
    def _redirect_base(current: str, location: str) -> str:
        """A 307 Location is protocol-relative (`//host:port/api/v1/scheduler`): keep our scheme."""
        scheme = urlsplit(current).scheme or "http"
        loc = location if "://" in location else f"{scheme}:{location}" if location.startswith("//") else location
        u = urlsplit(loc)
        return f"{u.scheme or scheme}://{u.netloc}"

    # --- the subscription loop ------------------------------------------------------------------------------
    def _run(self) -> None:
        backoff = self.backoff_min_s
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self._subscribe_once()
            except Exception as e:  # noqa: BLE001 - any failure ends this subscription; we try again
                if not self._stop.is_set():
                    log.warning("mesos subscription to %s ended: %s", self.leader, e)
            finally:
                self._close_stream()
                self.stream_id = None
            if self._stop.is_set():
                return
            self._on_event({"type": "DISCONNECTED"})
            if time.monotonic() - started > 30:
                backoff = self.backoff_min_s  # it was a healthy subscription: reconnect fast
            delay = min(backoff, self.backoff_max_s) * random.uniform(0.5, 1.0)
            backoff = min(backoff * 2, self.backoff_max_s)
            self._stop.wait(delay)

    def _subscribe_once(self) -> None:
        base = self.leader
        for _ in range(5):  # follow at most a few redirects
            conn = self._connect(base, self.connect_timeout_s)
            with self._lock:
                self._conn = conn
            conn.request("POST", PATH, body=json.dumps(self._subscribe_body()).encode(), headers=self._headers(True))
            resp = conn.getresponse()
            if resp.status == 307:
                location = resp.getheader("Location", "")
                resp.read()
                base = self._redirect_base(base, location)
                log.info("mesos master redirects to the leader at %s", base)
                self.leader = base
                continue
            if resp.status != 200:
                text = resp.read().decode(errors="replace")
                if resp.status in (503,) or resp.status >= 500:
                    self._rotate()
                raise MesosCallError(resp.status, text)
            self.leader = base
            self.stream_id = resp.getheader("Mesos-Stream-Id")
            self._read_stream(conn, resp)
            return
        raise MesosCallError(307, "too many redirects")

    def _rotate(self) -> None:
        self._next_master = (self._next_master + 1) % len(self.masters)
        self.leader = self.masters[self._next_master]

    def _read_stream(self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse) -> None:
        decoder = RecordIODecoder()
        heartbeat = DEFAULT_HEARTBEAT_S
        if conn.sock is not None:
            conn.sock.settimeout(heartbeat * self.heartbeat_misses)
        while not self._stop.is_set():
            try:
                data = resp.read1(65536)
            except TimeoutError:
                raise ConnectionError(f"no heartbeat for {heartbeat * self.heartbeat_misses:.0f}s") from None
            if not data:
                raise ConnectionError("the master closed the event stream")
            for record in decoder.feed(data):
                event = json.loads(record)
                if event.get("type") == "SUBSCRIBED":
                    heartbeat = float(event["subscribed"].get("heartbeat_interval_seconds", DEFAULT_HEARTBEAT_S))
                    if conn.sock is not None:
                        conn.sock.settimeout(heartbeat * self.heartbeat_misses)
                self._on_event(event)
                if event.get("type") == "ERROR":
                    raise ConnectionError(f"master sent ERROR: {event.get('error', {}).get('message', '')}")

    # --- calls ----------------------------------------------------------------------------------------------
    def call(self, body: dict[str, Any]) -> None:
        """POST one call to the leader. 202/200 → done; 307 → follow once; 503 → retry briefly; else raise."""
        if not self.stream_id:
            raise MesosCallError(0, "not subscribed")
        payload = json.dumps(body).encode()
        base = self.leader
        for attempt in range(4):
            conn = self._connect(base, self.call_timeout_s)
            try:
                conn.request("POST", PATH, body=payload, headers=self._headers(False))
                resp = conn.getresponse()
                text = resp.read().decode(errors="replace")
            finally:
                conn.close()
            if resp.status in (200, 202):
                return
            if resp.status == 307:
                base = self._redirect_base(base, resp.getheader("Location", ""))
                continue
            if resp.status == 503 and attempt < 3:
                time.sleep(0.2 * (2**attempt))
                continue
            raise MesosCallError(resp.status, text)
        raise MesosCallError(307, "too many redirects")
