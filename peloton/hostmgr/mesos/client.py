"""The thin streaming HTTP shell around SchedulerProtocol (stdlib http.client, one stream thread).

It subscribes to the leading master (following a 307's protocol-relative Location, retrying 503 and connection
errors on every master in turn with exponential backoff and jitter), reads the RecordIO event stream as bytes
with a socket read timeout of heartbeat × miss factor, and hands typed events to `on_event` from its thread.
Any end of the stream (EOF, ERROR event, silence, read error) is reported as a Disconnected event and followed
by a re-subscribe, except after a fatal ERROR ("Framework failed over" / "Framework has been removed"): then it
waits for `resume()`. Calls go on other keep-alive connections with the Mesos-Stream-Id header, one per lane
(protocol.call_lane): a caller hands its call to the lane's sender thread and waits for the answer with no lock
held; each lane sends its calls one at a time in the order they were made, so those whose order matters reach
the master in it, and the lanes go concurrently, so a slow call holds up only the calls that must follow it.
All decisions live in protocol.py; this module only moves bytes.
"""

from __future__ import annotations

import base64
import http.client
import json
import logging
import queue
import random
import socket
import ssl
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from peloton.hostmgr.mesos.calls import CallError, FrameworkConfig, validate_call
from peloton.hostmgr.mesos.events import Error, Event, Subscribed, SubscribeRefused
from peloton.hostmgr.mesos.protocol import (
    API_PATH,
    CALL_503_BACKOFF,
    SchedulerProtocol,
    call_lane,
    master_base,
    redirect_base,
)
from peloton.hostmgr.mesos.recordio import RecordIODecoder, RecordIOError
from peloton.loop import LOOP_ERRORS
from peloton.retry import Backoff

log = logging.getLogger(__name__)

__all__ = ["MesosCallFailed", "MesosClient", "MesosClientError", "MesosHTTPError", "NotSubscribedError"]

MAX_REDIRECTS = 3
_MAX_ERROR_BODY = 4096
_RECONNECT_ERRORS = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError)


class MesosClientError(Exception):
    """Base of the errors `MesosClient.call` raises."""


class NotSubscribedError(MesosClientError):
    """No subscription (no Mesos-Stream-Id): the master would answer 403. Queue the call and replay it after
    the next Subscribed."""


class MesosHTTPError(MesosClientError):
    """The master answered with an error status (4xx, 307, or 5xx after the retries). `text` is its body."""

    def __init__(self, status: int, text: str, call_type: str = "") -> None:
        super().__init__(f"{call_type or 'call'} -> HTTP {status}: {text.strip()[:500]}")
        self.status = status
        self.text = text
        self.call_type = call_type


class MesosCallFailed(MesosClientError):
    """No HTTP answer (connection refused, reset, timeout): the call may or may not have been applied."""


@dataclass(eq=False)
class _Call:
    """A call handed to a lane: sent only on the subscription it was made on (`stream_id`)."""

    call_type: str
    payload: bytes
    stream_id: str
    answer: Future[tuple[int, str]] = field(default_factory=Future)


class _Lane:
    """One lane's sender: its queue of calls, its thread, and the keep-alive connection only that thread uses."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()  # None: end the thread
        self.thread: threading.Thread | None = None
        self.conn: http.client.HTTPConnection | None = None
        self.conn_base = ""
        self.conn_used_at = 0.0

    def close_conn(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


class MesosClient:
    def __init__(
        self,
        masters: Sequence[str],
        config: FrameworkConfig,
        on_event: Callable[[Event], None],
        *,
        framework_id: str | None = None,
        may_subscribe: Callable[[], bool] = lambda: True,
        principal: str | None = None,
        secret: str | None = None,
        request_timeout_s: float = 30.0,
        connect_timeout_s: float = 10.0,
        heartbeat_miss_factor: float = 5.0,
        backoff_min_s: float = 1.0,
        backoff_max_s: float = 15.0,
        call_503_retries: int = 3,
        call_idle_reconnect_s: float = 5.0,
        ssl_context: ssl.SSLContext | None = None,
        sleep: Callable[[float], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        rand: Callable[[], float] = random.random,
    ) -> None:
        if not masters:
            raise ValueError("at least one Mesos master address is required")
        self.masters = [master_base(m) for m in masters]
        self.protocol = SchedulerProtocol(config, framework_id, heartbeat_miss_factor)
        self._on_event = on_event
        principal = principal if principal is not None else config.principal
        self._auth: str | None = None
        if principal:
            token = base64.b64encode(f"{principal}:{secret or ''}".encode()).decode("ascii")
            self._auth = f"Basic {token}"
        self.request_timeout_s = request_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.backoff_min_s = backoff_min_s
        self.backoff_max_s = backoff_max_s
        self._subscribe_backoff = Backoff(backoff_min_s, backoff_max_s)
        self.call_503_retries = call_503_retries
        self.call_idle_reconnect_s = call_idle_reconnect_s
        self._ssl = ssl_context
        self._clock = clock
        self._rand = rand
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._sleep = sleep if sleep is not None else self._stop.wait
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # guards _stream_conn, _lanes, _lanes_closed (memory only)
        self._stream_conn: http.client.HTTPConnection | None = None
        self._lanes: dict[str, _Lane] = {}  # lane name -> its sender, started by the first call on it
        self._lanes_closed = False  # stop() ended them: calls are refused until start()
        self._next_master = 0
        self.leader: str | None = None  # base URL of the master our stream is bound to
        # a SUBSCRIBE fails over whoever is subscribed as the framework: only a daemon that leads may send one (a
        # replaced leader whose stream ended, its network back, must not take the framework from the new one)
        self._may_subscribe = may_subscribe

    # --- lifecycle ----------------------------------------------------------------------------------------------
    @property
    def subscribed(self) -> bool:
        return self.protocol.subscribed

    def start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        with self._lock:
            self._lanes_closed = False
        self._thread = threading.Thread(target=self._run, name="mesos-subscription", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Close the stream and the call connections and end the threads; calls not yet answered fail with
        MesosCallFailed (one on the wire: its outcome unknown). Does NOT tear the framework down."""
        self._stop.set()
        self._wake.set()
        self._close_stream()
        with self._lock:
            self._lanes_closed = True
            lanes, self._lanes = list(self._lanes.values()), {}
            for lane in lanes:
                lane.calls.put(None)  # after every call queued so far (call() queues under this lock)
        for lane in lanes:
            conn = lane.conn
            if conn is not None and conn.sock is not None:
                try:
                    conn.sock.shutdown(socket.SHUT_RDWR)  # ends a call on the wire at once
                except OSError:
                    pass
        deadline = time.monotonic() + timeout_s
        for t in [self._thread, *(lane.thread for lane in lanes)]:
            if t is not None and t is not threading.current_thread():
                t.join(max(0.0, deadline - time.monotonic()))

    def resume(self, forget_framework_id: bool = False) -> None:
        """Re-subscribe after a fatal ERROR (the owner has cleared or kept the framework id)."""
        self.protocol.resume(forget_framework_id)
        self._wake.set()

    # --- events -------------------------------------------------------------------------------------------------
    def _emit(self, ev: Event) -> None:
        try:
            self._on_event(ev)
        except Exception:  # noqa: BLE001 - the stream goes on; the event is lost (counted: an operator must hear of it)
            LOOP_ERRORS.labels("mesos-subscription").inc()
            log.exception("mesos event handler failed on %s", type(ev).__name__)

    # --- connections --------------------------------------------------------------------------------------------
    def _connect(self, base: str, timeout: float) -> http.client.HTTPConnection:
        u = urlsplit(base)
        if u.scheme == "https":
            return http.client.HTTPSConnection(u.hostname or "", u.port or 5050, timeout=timeout, context=self._ssl)
        return http.client.HTTPConnection(u.hostname or "", u.port or 5050, timeout=timeout)

    def _headers(self, subscribe: bool) -> dict[str, str]:
        h = self.protocol.request_headers(subscribe)
        if self._auth:
            h["Authorization"] = self._auth
        return h

    def _close_stream(self) -> None:
        with self._lock:
            conn, self._stream_conn = self._stream_conn, None
        if conn is None:
            return
        sock = conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # unblocks a read1() in the stream thread
            except OSError:
                pass
        conn.close()

    # --- the subscription loop ----------------------------------------------------------------------------------
    def _run(self) -> None:
        attempt = 0
        gated = False
        while not self._stop.is_set():
            if self.protocol.halted is not None:
                self._wake.wait()
                self._wake.clear()
                continue
            if not self._may_subscribe():
                if not gated:
                    log.warning("mesos: not subscribing while this daemon does not lead")
                gated = True
                self._wake.wait(0.5)  # woken by resume() when it leads again
                self._wake.clear()
                continue
            gated = False
            base = self.leader or self.masters[self._next_master % len(self.masters)]
            try:
                got_subscribed = self._subscribe_once(base)
            except Exception as e:  # noqa: BLE001 - a bug must not end the loop
                LOOP_ERRORS.labels("mesos-subscription").inc()
                log.exception("mesos subscription loop error")
                if self.protocol.stream_id is not None:
                    # the stream was open: it ended, as any end of it does (the backend drops its offers of the
                    # stream and says it is not connected; a refused SUBSCRIBE alone left both as they were)
                    got_subscribed = self.protocol.subscribed
                    self._emit(self.protocol.on_disconnected(f"error: {e!r}", will_retry=not self._stop.is_set()))
                else:
                    self._emit(SubscribeRefused(base, 0, repr(e)))
                    got_subscribed = False
            finally:
                self._close_stream()
            if self._stop.is_set():
                return
            if got_subscribed:
                attempt = 0
            else:
                self.leader = None
                self._next_master = (self._next_master + 1) % len(self.masters)
            if self.protocol.halted is not None:
                continue
            delay = self._subscribe_backoff.delay(attempt, self._rand())
            attempt += 1
            log.info("mesos: re-subscribing in %.1fs", delay)
            self._sleep(delay)

    def _subscribe_once(self, base: str) -> bool:
        """One SUBSCRIBE (following redirects) and, on 200, the stream until it ends. True if SUBSCRIBED came."""
        for _ in range(MAX_REDIRECTS + 1):
            conn = self._connect(base, self.connect_timeout_s)
            with self._lock:
                if self._stop.is_set():
                    conn.close()
                    return False
                self._stream_conn = conn
            body = json.dumps(self.protocol.subscribe_call()).encode()
            try:
                conn.request("POST", API_PATH, body=body, headers=self._headers(subscribe=True))
                resp = conn.getresponse()
            except (OSError, http.client.HTTPException) as e:
                if not self._stop.is_set():
                    log.warning("mesos: SUBSCRIBE to %s failed: %r", base, e)
                    self._emit(SubscribeRefused(base, 0, repr(e)))
                return False
            if resp.status == 307:
                location = resp.getheader("Location", "")
                resp.read()
                self._close_stream()
                try:
                    base = redirect_base(base, location)
                except ValueError as e:
                    self._emit(SubscribeRefused(base, 307, str(e)))
                    return False
                log.info("mesos: redirected to the leading master %s", base)
                continue
            if resp.status != 200:
                text = _read_text(resp)
                log.warning("mesos: SUBSCRIBE to %s -> %d %s", base, resp.status, text.strip()[:300])
                self._emit(SubscribeRefused(base, resp.status, text))
                return False
            self.leader = base
            self.protocol.on_stream_open(resp.getheader("Mesos-Stream-Id"), self._clock())
            got, reason = self._read_stream(conn, resp)
            stopping = self._stop.is_set()
            log.log(logging.INFO if stopping else logging.WARNING, "mesos: stream from %s ended: %s", base, reason)
            self._emit(self.protocol.on_disconnected(reason, will_retry=not stopping))
            return got
        self._emit(SubscribeRefused(base, 307, "too many redirects"))
        return False

    def _read_stream(self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse) -> tuple[bool, str]:
        decoder = RecordIODecoder()
        got_subscribed = False
        self._set_read_timeout(conn)
        while not self._stop.is_set():
            try:
                data = resp.read1(65536)
            except TimeoutError:
                return got_subscribed, f"no event for {self.protocol.read_timeout_s:.1f}s (heartbeats missed)"
            except (OSError, http.client.HTTPException, ValueError) as e:
                return got_subscribed, f"read error: {e!r}"
            if not data:
                return got_subscribed, "EOF (the master closed the stream)"
            try:
                records = decoder.feed(data)
            except RecordIOError as e:
                return got_subscribed, str(e)
            for record in records:
                for ev in self.protocol.on_record(record, self._clock()):
                    if isinstance(ev, Subscribed):
                        got_subscribed = True
                        self._set_read_timeout(conn)
                    self._emit(ev)
                    if isinstance(ev, Error):
                        return got_subscribed, f"ERROR event: {ev.message}"
            if self.protocol.heartbeat_overdue(self._clock()):
                return got_subscribed, f"no complete event for {self.protocol.read_timeout_s:.1f}s"
        return got_subscribed, "stopped"

    def _set_read_timeout(self, conn: http.client.HTTPConnection) -> None:
        if conn.sock is not None:
            conn.sock.settimeout(self.protocol.read_timeout_s)

    # --- calls --------------------------------------------------------------------------------------------------
    def call(self, body: Mapping[str, Any]) -> tuple[int, str]:
        """Send one non-SUBSCRIBE call to the master our stream is bound to, on its lane (see the module
        docstring), and wait for the answer. Returns (status, body text) for 2xx (202 means queued, not applied:
        the outcome comes as events, possibly BEFORE this returns). The call is sent on the subscription it was
        made on or not at all: one whose stream ended while it waited is refused (NotSubscribedError), since what
        it meant (offers, a SUPPRESS) does not carry over to the next subscription. Raises CallError (invalid
        body, never sent), NotSubscribedError, MesosHTTPError (4xx with the master's text, 307, 5xx after
        retries) or MesosCallFailed (no answer: outcome unknown)."""
        call_type = validate_call(body)
        if call_type == "SUBSCRIBE":
            raise CallError("SUBSCRIBE is sent by the subscription thread only")
        stream_id = self.protocol.stream_id
        if self.leader is None or stream_id is None:
            raise NotSubscribedError(f"{call_type}: not subscribed to a Mesos master")
        c = _Call(call_type, json.dumps(body).encode(), stream_id)
        name = call_lane(call_type)
        with self._lock:  # memory only: the queue is unbounded
            if self._lanes_closed:
                raise MesosCallFailed(f"{call_type}: the Mesos client is stopped")
            lane = self._lanes.get(name)
            if lane is None:
                lane = self._lanes[name] = _Lane(name)
                lane.thread = threading.Thread(target=self._send_loop, args=(lane,), name=f"mesos-call-{name}",
                                               daemon=True)
                lane.thread.start()
            lane.calls.put(c)
        return c.answer.result()  # no lock held: the lane's thread sends it, then answers

    def _send_loop(self, lane: _Lane) -> None:
        """A lane's thread: its calls one at a time, in the order they were queued, until stop()."""
        try:
            while True:
                c = lane.calls.get()
                if c is None:
                    return
                if self._stop.is_set():
                    c.answer.set_exception(MesosCallFailed(f"{c.call_type}: the Mesos client is stopped"))
                    continue
                try:
                    c.answer.set_result(self._send(lane, c))
                except BaseException as e:  # noqa: BLE001 - the caller gets it, whatever it is
                    c.answer.set_exception(e)
        finally:
            lane.close_conn()

    def _send(self, lane: _Lane, c: _Call) -> tuple[int, str]:
        """One call, with its 503 retries (the retry sleeps end on stop())."""
        status, text = 0, ""
        for attempt in range(self.call_503_retries + 1):
            base = self.leader
            if base is None or self.protocol.stream_id is None:
                raise NotSubscribedError(f"{c.call_type}: not subscribed to a Mesos master")
            if self.protocol.stream_id != c.stream_id:
                raise NotSubscribedError(f"{c.call_type}: the subscription it was made on ended before it was sent")
            status, text = self._post(lane, base, c.payload, self._headers(subscribe=False), c.call_type)
            if status != 503 or attempt == self.call_503_retries or self._stop.is_set():
                break
            self._sleep(CALL_503_BACKOFF.delay(attempt, self._rand()))
        if 200 <= status < 300:
            return status, text
        raise MesosHTTPError(status, text, c.call_type)

    def _post(self, lane: _Lane, base: str, payload: bytes, headers: dict[str, str],
              call_type: str) -> tuple[int, str]:
        now = self._clock()
        if lane.conn is not None and (lane.conn_base != base or now - lane.conn_used_at > self.call_idle_reconnect_s):
            lane.close_conn()  # avoid racing the server closing an idle keep-alive connection
        for _ in range(2):
            reused = lane.conn is not None
            if lane.conn is None:
                lane.conn = self._connect(base, self.request_timeout_s)
                lane.conn_base = base
            conn = lane.conn
            try:
                conn.request("POST", API_PATH, body=payload, headers=headers)
                resp = conn.getresponse()
                text = _read_text(resp)
            except _RECONNECT_ERRORS as e:
                lane.close_conn()
                if reused and not self._stop.is_set():  # the server closed the kept-alive connection first
                    log.debug("mesos: call connection was closed (%r); reconnecting", e)
                    continue
                raise MesosCallFailed(f"{call_type} to {base}: {e!r}") from e
            except (OSError, http.client.HTTPException) as e:
                lane.close_conn()
                raise MesosCallFailed(f"{call_type} to {base}: {e!r}") from e
            lane.conn_used_at = self._clock()
            if resp.will_close:
                lane.close_conn()
            if resp.status == 307:
                text = f"not the leader any more (Location: {resp.getheader('Location', '')}) {text}".strip()
            return resp.status, text
        raise MesosCallFailed(f"{call_type} to {base}: connection closed twice")


def _read_text(resp: http.client.HTTPResponse) -> str:
    data = resp.read()
    return data[:_MAX_ERROR_BODY].decode("utf-8", errors="replace")
