"""A test double of the Apache Mesos master's v1 scheduler HTTP API (``POST /api/v1/scheduler``).

Stdlib only, independent of ``peloton``. It speaks the wire protocol as recorded from a real master
(``tests/mesos/transcripts/``): exact status codes, reasons, header sets and orders, plain-text error
bodies, chunked RecordIO event streams (one record per chunk, or split by ``chunk_size``), and the event
shapes of SUBSCRIBED / HEARTBEAT / OFFERS / RESCIND / UPDATE / FAILURE / ERROR / UPDATE_OPERATION_STATUS.

Deliberate differences from the real master (also listed in test_fake_master_conformance.py):

* ``type: UNKNOWN`` with a known framework id answers ``501`` instead of aborting the master process.
* Protobuf streams (``Accept: application/x-protobuf``) only encode SUBSCRIBED, HEARTBEAT and ERROR;
  other events are not written on a protobuf stream.
* Resources are freed as soon as a task is terminal on the "agent"; the real master frees them when it
  learns of the terminal state (which can lag behind while an earlier update is unacknowledged).
* Refuse filters, and the default 5 s filter, are scaled by ``client_time_scale`` so tests can run fast.
* Only LAUNCH and LAUNCH_GROUP operations are applied; other offer operations are ignored.
* Timing: allocation happens every ``allocation_interval`` and right after SUBSCRIBE / REVIVE.

Maintenance (not in the recordings) follows Mesos' source (``Master::updateUnavailability``, the hierarchical
allocator's ``generateInverseOffers`` and ``updateInverseOffer``): a window set or lifted on an agent
(``schedule_maintenance`` / ``cancel_maintenance``, per agent rather than per machine) rescinds the agent's offers and
outstanding inverse offers; each allocation sends an inverse offer for an agent in a window to each framework with
resources offered or allocated there that has none outstanding for it and no unexpired refusal; an answer
(ACCEPT/DECLINE_INVERSE_OFFERS) ends it and sets that refusal (``refuse_seconds``, default 5 s).
"""

from __future__ import annotations

import base64
import contextlib
import email.utils
import functools
import http.client
import json
import queue
import re
import select
import socket
import socketserver
import struct
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import urlsplit

SCHEDULER_PATH = "/api/v1/scheduler"
SCALAR_NAMES = ("cpus", "mem", "disk", "gpus")
TERMINAL_STATES = frozenset(
    {"TASK_FINISHED", "TASK_FAILED", "TASK_KILLED", "TASK_ERROR", "TASK_LOST", "TASK_DROPPED", "TASK_GONE",
     "TASK_GONE_BY_OPERATOR"}
)
CALL_TYPES = (
    "UNKNOWN", "SUBSCRIBE", "TEARDOWN", "ACCEPT", "DECLINE", "ACCEPT_INVERSE_OFFERS", "DECLINE_INVERSE_OFFERS",
    "REVIVE", "KILL", "SHUTDOWN", "ACKNOWLEDGE", "ACKNOWLEDGE_OPERATION_STATUS", "RECONCILE",
    "RECONCILE_OPERATIONS", "MESSAGE", "REQUEST", "SUPPRESS", "UPDATE_FRAMEWORK",
)
# Calls whose body object is required by scheduler::call::validate.
REQUIRED_BODY = {
    "ACCEPT": "accept", "DECLINE": "decline", "ACCEPT_INVERSE_OFFERS": "accept_inverse_offers",
    "DECLINE_INVERSE_OFFERS": "decline_inverse_offers", "KILL": "kill", "SHUTDOWN": "shutdown",
    "ACKNOWLEDGE": "acknowledge", "ACKNOWLEDGE_OPERATION_STATUS": "acknowledge_operation_status",
    "RECONCILE": "reconcile", "RECONCILE_OPERATIONS": "reconcile_operations", "MESSAGE": "message",
    "REQUEST": "request", "UPDATE_FRAMEWORK": "update_framework",
}
# Required (proto2) fields checked by the JSON -> protobuf conversion.
REQUIRED_FIELDS: dict[str, list[tuple[str | None, tuple[str, ...]]]] = {
    "subscribe": [("framework_info", ("user", "name"))],
    "update_framework": [("framework_info", ("user", "name"))],
    "kill": [(None, ("task_id",))],
    "acknowledge": [(None, ("agent_id", "task_id", "uuid"))],
    "shutdown": [(None, ("executor_id", "agent_id"))],
    "message": [(None, ("agent_id", "executor_id", "data"))],
}
REASONS = {
    200: "OK", 202: "Accepted", 307: "Temporary Redirect", 400: "Bad Request", 401: "Unauthorized",
    403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed", 406: "Not Acceptable", 409: "Conflict",
    415: "Unsupported Media Type", 501: "Not Implemented", 503: "Service Unavailable",
}
MASTER_CAPABILITIES = [{"type": "AGENT_UPDATE"}, {"type": "AGENT_DRAINING"}, {"type": "QUOTA_V2"}]
EVENT_TYPE_NUMBERS = {"SUBSCRIBED": 1, "OFFERS": 2, "RESCIND": 3, "UPDATE": 4, "MESSAGE": 5, "FAILURE": 6,
                      "ERROR": 7, "HEARTBEAT": 8, "INVERSE_OFFERS": 9, "RESCIND_INVERSE_OFFER": 10,
                      "UPDATE_OPERATION_STATUS": 11}
MASTER_CAP_NUMBERS = {"AGENT_UPDATE": 1, "AGENT_DRAINING": 2, "QUOTA_V2": 3}


# --------------------------------------------------------------------------------------------------------------
# Resources (scalars as floats rounded to 3 decimals, ports as sorted inclusive ranges)
# --------------------------------------------------------------------------------------------------------------

Res = dict[str, Any]


def _r3(x: float) -> float:
    return round(float(x) + 0.0, 3)


def _ranges_norm(rs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for b, e in sorted((int(b), int(e)) for b, e in rs):
        if out and b <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([b, e])
    return [(b, e) for b, e in out]


def _ranges_sub(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out = list(a)
    for sb, se in b:
        nxt = []
        for rb, re_ in out:
            if se < rb or sb > re_:
                nxt.append((rb, re_))
                continue
            if rb < sb:
                nxt.append((rb, sb - 1))
            if se < re_:
                nxt.append((se + 1, re_))
        out = nxt
    return _ranges_norm(out)


def _ranges_contains(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> bool:
    return not _ranges_sub(_ranges_norm(b), _ranges_norm(a))


def res_empty(r: Res) -> bool:
    return all(r.get(n, 0) <= 0 for n in SCALAR_NAMES) and not r.get("ports")


def res_add(a: Res, b: Res) -> Res:
    out: Res = {n: _r3(a.get(n, 0) + b.get(n, 0)) for n in SCALAR_NAMES}
    out["ports"] = _ranges_norm(list(a.get("ports", [])) + list(b.get("ports", [])))
    return out


def res_sub(a: Res, b: Res) -> Res:
    out: Res = {n: max(0.0, _r3(a.get(n, 0) - b.get(n, 0))) for n in SCALAR_NAMES}
    out["ports"] = _ranges_sub(list(a.get("ports", [])), list(b.get("ports", [])))
    return out


def res_contains(a: Res, b: Res) -> bool:
    if any(_r3(b.get(n, 0)) > _r3(a.get(n, 0)) for n in SCALAR_NAMES):
        return False
    return _ranges_contains(list(a.get("ports", [])), list(b.get("ports", [])))


def _fmt_num(x: float) -> str:
    s = f"{float(x):.3f}".rstrip("0").rstrip(".")
    return s or "0"


def _fmt_ranges(rs: list[tuple[int, int]]) -> str:
    return "[" + ", ".join(f"{b}-{e}" for b, e in rs) + "]"


def res_to_json(r: Res, role: str) -> list[dict[str, Any]]:
    """Offer resources in the recorded order: ports, cpus, mem, disk, gpus; zero values omitted."""
    out: list[dict[str, Any]] = []
    if r.get("ports"):
        out.append({"name": "ports", "type": "RANGES",
                    "ranges": {"range": [{"begin": b, "end": e} for b, e in r["ports"]]},
                    "role": "*", "allocation_info": {"role": role}})
    for n in SCALAR_NAMES:
        if r.get(n, 0) > 0:
            out.append({"name": n, "type": "SCALAR", "scalar": {"value": float(_r3(r[n]))}, "role": "*",
                        "allocation_info": {"role": role}})
    return out


def res_to_text(r: Res, role: str, order: list[str] | None = None) -> str:
    names = order if order is not None else ["ports", *SCALAR_NAMES]
    parts = []
    for n in names:
        if n == "ports":
            if r.get("ports"):
                parts.append(f"ports(allocated: {role}):{_fmt_ranges(r['ports'])}")
        elif r.get(n, 0) > 0:
            parts.append(f"{n}(allocated: {role}):{_fmt_num(r[n])}")
    return "; ".join(parts)


def res_from_json(items: Any) -> tuple[Res, list[Any], str | None]:
    """Returns (resources, names in given order, validation error)."""
    r: Res = {n: 0.0 for n in SCALAR_NAMES}
    r["ports"] = []
    order: list[Any] = []  # (names as the client sent them: a missing one is None)
    err = None
    for it in items or []:
        if not isinstance(it, dict):
            continue
        name = it.get("name")
        if name not in order:
            order.append(name)
        if it.get("type") == "RANGES" or name == "ports":
            rng = (it.get("ranges") or {}).get("range") or []
            r["ports"] = _ranges_norm(list(r["ports"]) + [(x.get("begin", 0), x.get("end", 0)) for x in rng])
        else:
            v = float((it.get("scalar") or {}).get("value", 0))
            if name == "gpus" and (v != int(v) or v < 0):
                err = "Invalid 'gpus' resource: The 'gpus' resource must be an unsigned integer"
            if name in SCALAR_NAMES:
                r[name] = _r3(r[name] + v)
    return r, order, err


def _parse_ports(p: Any) -> list[tuple[int, int]]:
    if isinstance(p, str):
        return [(int(a), int(b)) for a, b in re.findall(r"(\d+)-(\d+)", p)]
    return [(int(a), int(b)) for a, b in (p or [])]


# --------------------------------------------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------------------------------------------


@dataclass
class FakeAgent:
    """An agent of the fake cluster. ``agent_id`` None = assigned by the master (``<master id>-S<n>``)."""

    agent_id: str | None = None
    hostname: str = "127.0.0.1"
    resources: dict[str, Any] = field(
        default_factory=lambda: {"cpus": 8, "mem": 16384, "disk": 100000, "gpus": 0, "ports": [(31000, 32000)]})
    attributes: dict[str, Any] = field(default_factory=dict)
    port: int = 5051
    ip: str = "127.0.0.1"
    # runtime state (owned by the master)
    total: Res = field(default_factory=dict, repr=False)
    used: Res = field(default_factory=dict, repr=False)
    state: str = "ACTIVE"  # ACTIVE | DISCONNECTED | UNREACHABLE | RECOVERED (after a master restart, until re-registered)
    unreachable_time: int | None = None
    executors: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict, repr=False)
    unavailability: tuple[int, int] | None = None  # a maintenance window: (start, duration) in nanoseconds
    inverse_offers: dict[str, str] = field(default_factory=dict, repr=False)  # inverse offer id -> framework id


@dataclass
class _Offer:
    offer_id: str
    framework_id: str
    agent_id: str
    role: str
    resources: Res
    created: float


@dataclass
class _Filter:
    agent_id: str
    role: str
    resources: Res
    expires: float


@dataclass
class _Task:
    task_id: str
    framework_id: str
    agent_id: str
    executor_id: str
    resources: Res
    info: dict[str, Any]
    container_id: str
    executor_pid: int
    group_executor: str | None = None
    agent_state: str = "TASK_STAGING"  # the truth on the agent
    state: str = "TASK_STAGING"  # what the master last told the framework
    pending: list[dict[str, Any]] = field(default_factory=list)  # reliable updates; [0] is in flight
    delivered_head: bool = False
    next_retry: float = 0.0
    retry_backoff: float = 0.0
    unreachable: bool = False
    pending_kill: bool = False
    finish_at: float | None = None
    data: dict[str, Any] = field(default_factory=dict)


class _Subscription:
    def __init__(self, framework_id: str, encoding: str, sock: socket.socket) -> None:
        self.stream_id = str(uuid.uuid4())
        self.framework_id = framework_id
        self.encoding = encoding
        self.sock = sock
        self.q: queue.Queue[Any] = queue.Queue()
        self.closed = False
        self.silent = False
        self.next_heartbeat = 0.0


@dataclass
class _Framework:
    framework_id: str
    info: dict[str, Any]
    sub: _Subscription | None = None
    suppressed: set[str] = field(default_factory=set)
    filters: list[_Filter] = field(default_factory=list)
    inverse_filters: dict[str | None, float] = field(default_factory=dict)  # agent id -> when its refusal expires
    disconnected_at: float | None = None
    subscribed_at: float = 0.0

    @property
    def caps(self) -> set[str | None]:
        return {c.get("type") for c in self.info.get("capabilities") or [] if isinstance(c, dict)}

    @property
    def roles(self) -> list[str]:
        if "MULTI_ROLE" in self.caps:
            return list(self.info.get("roles") or [])
        return [self.info.get("role") or "*"]

    @property
    def partition_aware(self) -> bool:
        return "PARTITION_AWARE" in self.caps

    @property
    def checkpoint(self) -> bool:
        return bool(self.info.get("checkpoint"))

    @property
    def connected(self) -> bool:
        return self.sub is not None and not self.sub.closed


class _HTTPError(Exception):
    def __init__(self, status: int, body: str = "", headers: list[tuple[str, str]] | None = None) -> None:
        super().__init__(f"{status} {body}")
        self.status = status
        self.body = body
        self.headers = headers or []


def _b64uuid() -> str:
    return base64.b64encode(uuid.uuid4().bytes).decode()


def _valid_uuid_b64(s: Any) -> bool:
    try:
        raw = base64.b64decode(s, validate=True)
    except Exception:
        return False
    if len(raw) != 16:
        return False
    return 1 <= (raw[6] >> 4) <= 5


# --------------------------------------------------------------------------------------------------------------
# Protobuf (only what the recorded protobuf stream needs)
# --------------------------------------------------------------------------------------------------------------


def _pb_varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _pb_key(num: int, wt: int) -> bytes:
    return _pb_varint((num << 3) | wt)


def _pb_bytes(num: int, data: bytes) -> bytes:
    return _pb_key(num, 2) + _pb_varint(len(data)) + data


def _pb_str(num: int, s: str) -> bytes:
    return _pb_bytes(num, s.encode())


def _pb_vi(num: int, v: int) -> bytes:
    return _pb_key(num, 0) + _pb_varint(v)


def _pb_event(ev: dict[str, Any]) -> bytes | None:
    t = ev["type"]
    out = _pb_vi(1, EVENT_TYPE_NUMBERS[t])
    if t == "HEARTBEAT":
        return out
    if t == "ERROR":
        return out + _pb_bytes(8, _pb_str(1, ev["error"]["message"]))
    if t == "SUBSCRIBED":
        s = ev["subscribed"]
        mi = s["master_info"]
        addr = mi["address"]
        m = (_pb_str(1, mi["id"]) + _pb_vi(2, mi["ip"]) + _pb_vi(3, mi["port"]) + _pb_str(4, mi["pid"])
             + _pb_str(5, mi["hostname"]) + _pb_str(6, mi["version"])
             + _pb_bytes(7, _pb_str(1, addr["hostname"]) + _pb_str(2, addr["ip"]) + _pb_vi(3, addr["port"])))
        for c in mi.get("capabilities", []):
            m += _pb_bytes(9, _pb_vi(1, MASTER_CAP_NUMBERS[c["type"]]))
        body = (_pb_bytes(1, _pb_str(1, s["framework_id"]["value"]))
                + _pb_key(2, 1) + struct.pack("<d", s["heartbeat_interval_seconds"]) + _pb_bytes(3, m))
        return out + _pb_bytes(2, body)
    return None


# --------------------------------------------------------------------------------------------------------------
# HTTP plumbing
# --------------------------------------------------------------------------------------------------------------


class _Server(socketserver.ThreadingMixIn, socketserver.TCPServer):
    daemon_threads = True
    allow_reuse_address = True
    master: FakeMaster

    def handle_error(self, request: Any, client_address: Any) -> None:  # quiet: clients drop streams on purpose
        pass


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - silence stderr logging
        pass

    def _any(self) -> None:
        self.server.master._handle(self)

    do_POST = do_GET = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _any

    def read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            data = bytearray()
            while True:
                line = self.rfile.readline()
                n = int(line.split(b";")[0].strip() or b"0", 16)
                if n == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return bytes(data)
                data += self.rfile.read(n)
                self.rfile.readline()
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def send_raw(self, status: int, headers: list[tuple[str, str]], body: bytes = b"") -> None:
        lines = [f"HTTP/1.1 {status} {REASONS.get(status, 'Unknown')}", f"Date: {email.utils.formatdate(usegmt=True)}"]
        lines += [f"{k}: {v}" for k, v in headers]
        self.wfile.write(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        self.wfile.flush()


def _text_response(status: int, text: str, extra: list[tuple[str, str]] | None = None) -> tuple:
    body = text.encode()
    headers = list(extra or [])
    if status >= 400 or body:
        headers += [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body)))]
    else:
        headers += [("Content-Length", "0")]
    return status, headers, body


# --------------------------------------------------------------------------------------------------------------
# The master
# --------------------------------------------------------------------------------------------------------------


class FakeMaster:
    """Fake Mesos master. Use as a context manager or call start()/stop()."""

    def __init__(
        self,
        agents: list[FakeAgent] | None = None,
        *,
        heartbeat_interval: float = 15.0,
        allocation_interval: float = 1.0,
        offer_timeout: float | None = None,
        update_retry_interval: float = 10.0,
        update_retry_max: float = 600.0,
        launch_delay: float = 0.01,
        kill_delay: float = 0.01,
        executor_exit_delay: float = 0.05,
        default_refuse_seconds: float = 5.0,
        client_time_scale: float = 1.0,
        filter_gpu_resources: bool = True,
        agent_removal_timeout: float = 75.0,
        agent_reregister_delay: float = 0.0,
        chunk_size: int | None = None,
        credentials: dict[str, str] | None = None,
        leader: bool = True,
        leader_url: str | None = None,
        unavailable: bool = False,
        task_runtime: Callable[[dict[str, Any]], float | None] | None = None,
        offers_enabled: bool = True,
        master_id: str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        version: str = "1.12.0",
        tick: float = 0.005,
    ) -> None:
        self.heartbeat_interval = heartbeat_interval
        self.allocation_interval = allocation_interval
        self.offer_timeout = offer_timeout
        self.update_retry_interval = update_retry_interval
        self.update_retry_max = update_retry_max
        self.launch_delay = launch_delay
        self.kill_delay = kill_delay
        self.executor_exit_delay = executor_exit_delay
        self.default_refuse_seconds = default_refuse_seconds
        self.client_time_scale = client_time_scale
        self.filter_gpu_resources = filter_gpu_resources
        self.agent_removal_timeout = agent_removal_timeout
        self.agent_reregister_delay = agent_reregister_delay
        self.chunk_size = chunk_size
        self.credentials = credentials
        self.leader = leader
        self.leader_url = leader_url
        self.unavailable = unavailable
        self.task_runtime = task_runtime
        self.offers_enabled = offers_enabled
        self.host = host
        self.version = version
        self.tick = tick
        self._port = port
        self._lock = threading.RLock()
        self._master_id = master_id or str(uuid.uuid4())
        self._fw_seq = 0
        self._offer_seq = 0
        self._agent_seq = 0
        self._agents: list[FakeAgent] = []
        self._frameworks: dict[str, _Framework] = {}
        self._removed: set[str] = set()
        # keyed by ids as calls name them, which a malformed call may leave out (None): looked up as they come
        self._offers: dict[str | None, _Offer] = {}
        self._tasks: dict[tuple[str, str | None], _Task] = {}
        self._timers: list[tuple[float, Callable[[], None]]] = []
        self._next_alloc = 0.0
        self._rescind_next_accept: set[str] = set()
        self._fail_launch: dict[str | None, dict[str, Any]] = {}
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._clock: threading.Thread | None = None
        self._stop = threading.Event()
        self._crashed = False
        # inspection
        self.calls: list[dict[str, Any]] = []
        self.acks: list[dict[str, Any]] = []
        self.events: list[tuple[str, dict[str, Any]]] = []  # (framework_id, event) as written
        self.framework_id: str | None = None
        for a in agents if agents is not None else [FakeAgent()]:
            self.add_agent(a)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> FakeMaster:
        self._listen()
        self._clock = threading.Thread(target=self._clock_loop, name="fake-mesos-clock", daemon=True)
        self._clock.start()
        return self

    def _listen(self) -> None:
        srv = _Server((self.host, self._port), _Handler)
        srv.master = self
        self._server = srv
        self._port = srv.server_address[1]
        self._thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="fake-mesos-http", daemon=True)
        self._thread.start()

    def _unlisten(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            for fw in self._frameworks.values():
                if fw.sub is not None:
                    self._abort_sub(fw.sub)
        self._unlisten()

    def __enter__(self) -> FakeMaster:
        return self.start()

    def __exit__(self, *_exc: Any) -> None:
        self.stop()

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self._port}"

    @property
    def master_id(self) -> str:
        return self._master_id

    # ------------------------------------------------------------------ inspection
    @property
    def agents(self) -> list[FakeAgent]:
        return list(self._agents)

    @property
    def subscribed_frameworks(self) -> list[str]:
        with self._lock:
            return [f.framework_id for f in self._frameworks.values() if f.connected]

    def stream_id(self, framework_id: str) -> str | None:
        """The Mesos-Stream-Id of the framework's current subscription (None when it has none)."""
        with self._lock:
            fw = self._frameworks.get(framework_id)
            return fw.sub.stream_id if fw is not None and fw.connected and fw.sub is not None else None

    def tasks(self) -> dict[str, dict[str, Any]]:
        """task id -> {state (agent truth), reported_state, agent_id, framework_id, executor_id, pending}."""
        with self._lock:
            return {t.task_id: {"state": t.agent_state, "reported_state": t.state, "agent_id": t.agent_id,
                                "framework_id": t.framework_id, "executor_id": t.executor_id,
                                "pending": [p["state"] for p in t.pending], "unreachable": t.unreachable}
                    for t in self._tasks.values()}

    def offers(self, framework_id: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            return [{"offer_id": o.offer_id, "agent_id": o.agent_id, "framework_id": o.framework_id,
                     "role": o.role, "resources": dict(o.resources)}
                    for o in self._offers.values() if framework_id in (None, o.framework_id)]

    def calls_of(self, call_type: str) -> list[dict[str, Any]]:
        return [c for c in self.calls if c.get("type") == call_type]

    # ------------------------------------------------------------------ cluster setup / faults
    def add_agent(self, agent: FakeAgent) -> FakeAgent:
        with self._lock:
            if agent.agent_id is None:
                agent.agent_id = f"{self._master_id}-S{self._agent_seq}"
                self._agent_seq += 1
            r = dict(agent.resources)
            agent.total = {n: _r3(r.get(n, 0) or 0) for n in SCALAR_NAMES}
            agent.total["ports"] = _ranges_norm(_parse_ports(r.get("ports", [])))
            agent.used = {n: 0.0 for n in SCALAR_NAMES}
            agent.used["ports"] = []
            self._agents.append(agent)
            return agent

    def _agent(self, agent_id: str | None) -> FakeAgent | None:
        for a in self._agents:
            if a.agent_id == agent_id:
                return a
        return None

    def rescind_offer(self, offer_or_agent_id: str) -> list[str]:
        """Rescind one offer, or every outstanding offer on an agent. Returns the rescinded offer ids."""
        with self._lock:
            ids = [o.offer_id for o in self._offers.values()
                   if offer_or_agent_id in (o.offer_id, o.agent_id)]
            for oid in ids:
                self._rescind(oid)
            return ids

    def schedule_maintenance(self, agent_id: str, start_s: float, duration_s: float = 3600.0) -> None:
        """A maintenance window on the agent (what an operator's POST /maintenance/schedule does), as
        Master::updateUnavailability does it: the agent's outstanding offers are rescinded (RESCIND) and its
        outstanding inverse offers too (RESCIND_INVERSE_OFFER), every framework's inverse offer filter for it is
        cleared, and an allocation runs at once: its offers carry `unavailability` from then on, and each framework
        with resources offered or allocated on it (tasks, executors, offers) gets an INVERSE_OFFERS event for it
        (the agent's whole resources: `resources` empty), the others nothing (the allocator's
        generateInverseOffers). See `inverse_offers()` for the ids."""
        with self._lock:
            a = self._agent(agent_id)
            assert a is not None, agent_id
            a.unavailability = (int(start_s * 1e9), int(duration_s * 1e9))
            self._unavailability_changed(a)

    def cancel_maintenance(self, agent_id: str) -> None:
        """The window is removed from the schedule, again as Master::updateUnavailability: offers and outstanding
        inverse offers on the agent rescinded, and offers without `unavailability` from then on."""
        with self._lock:
            a = self._agent(agent_id)
            assert a is not None, agent_id
            a.unavailability = None
            self._unavailability_changed(a)

    def inverse_offers(self, framework_id: str | None = None) -> list[dict[str, Any]]:
        """The outstanding (sent, not yet answered nor rescinded) inverse offers: {inverse_offer_id, agent_id,
        framework_id}."""
        with self._lock:
            return [{"inverse_offer_id": iid, "agent_id": a.agent_id, "framework_id": fid}
                    for a in self._agents for iid, fid in a.inverse_offers.items()
                    if framework_id in (None, fid)]

    def _unavailability_changed(self, a: FakeAgent) -> None:
        for o in [o for o in self._offers.values() if o.agent_id == a.agent_id]:
            self._rescind(o.offer_id)
        self._rescind_inverse_offers(a)
        for fw in self._frameworks.values():
            fw.inverse_filters.pop(a.agent_id, None)  # (so that each framework reassesses the new window)
        self._allocate()

    def _rescind_inverse_offers(self, a: FakeAgent) -> None:
        for iid, fid in list(a.inverse_offers.items()):
            fw = self._frameworks.get(fid)
            if fw is not None and fw.connected:
                self._send(fw, {"type": "RESCIND_INVERSE_OFFER",
                                "rescind_inverse_offer": {"inverse_offer_id": {"value": iid}}})
        a.inverse_offers.clear()

    def _drop_inverse_offers(self, framework_id: str) -> None:
        """A framework's inverse offers end with its subscription, without RESCIND_INVERSE_OFFER (as its offers)."""
        for a in self._agents:
            for iid in [i for i, f in a.inverse_offers.items() if f == framework_id]:
                del a.inverse_offers[iid]

    @staticmethod
    def _unavailability_json(a: FakeAgent) -> dict[str, Any]:
        assert a.unavailability is not None
        start, duration = a.unavailability
        return {"start": {"nanoseconds": start}, "duration": {"nanoseconds": duration}}

    def rescind_next_accept(self, agent_id: str) -> None:
        """The next ACCEPT using an offer of this agent finds it rescinded (race): RESCIND, then the tasks
        get TASK_DROPPED (TASK_LOST without PARTITION_AWARE), REASON_INVALID_OFFERS."""
        with self._lock:
            self._rescind_next_accept.add(agent_id)

    def fail_launch(self, agent_id: str, state: str = "TASK_DROPPED", *, reason: str | None = None,
                    message: str | None = None) -> None:
        """The next launch on this agent fails: TASK_ERROR (master, REASON_TASK_INVALID, no uuid),
        TASK_DROPPED (master, REASON_AGENT_DISCONNECTED, no uuid; TASK_LOST without PARTITION_AWARE) or
        TASK_FAILED (agent, REASON_CONTAINER_LAUNCH_FAILED, with uuid)."""
        with self._lock:
            self._fail_launch[agent_id] = {"state": state, "reason": reason, "message": message}

    def finish_task(self, task_id: str, state: str = "TASK_FINISHED", message: str | None = None,
                    reason: str | None = None) -> None:
        """Make a running task end (executor-sourced, reliable update with uuid)."""
        with self._lock:
            t = self._find_task(task_id)
            if t is None or t.agent_state in TERMINAL_STATES:
                raise KeyError(task_id)
            if message is None:
                message = {"TASK_FINISHED": "Command exited with status 0",
                           "TASK_FAILED": "Command exited with status 1",
                           "TASK_KILLED": "Command terminated with signal Terminated"}.get(state)
            self._task_terminal(t, state, message, reason)

    def fail_task(self, task_id: str, state: str = "TASK_FAILED", message: str | None = None,
                  reason: str | None = None) -> None:
        self.finish_task(task_id, state=state, message=message, reason=reason)

    def lose_agent(self, agent_id: str, removal_delay: float | None = None) -> None:
        """Agent process dies: offers rescinded and non-checkpointing tasks LOST at once
        (REASON_AGENT_DISCONNECTED); after ``removal_delay`` (default agent_removal_timeout) the checkpointing
        frameworks get TASK_UNREACHABLE (PA) / TASK_LOST, REASON_AGENT_REMOVED, and every framework FAILURE."""
        with self._lock:
            a = self._agent(agent_id)
            assert a is not None, agent_id
            a.state = "DISCONNECTED"
            for o in [o for o in self._offers.values() if o.agent_id == agent_id]:
                self._rescind(o.offer_id)
            self._rescind_inverse_offers(a)
            for t in [t for t in self._tasks.values() if t.agent_id == agent_id]:
                fw = self._frameworks.get(t.framework_id)
                if fw is not None and not fw.checkpoint and t.agent_state not in TERMINAL_STATES:
                    self._kill_on_agent(t, silent=True)
                    self._master_update(t, "TASK_LOST", "REASON_AGENT_DISCONNECTED",
                                        f"Agent {a.hostname} disconnected", remove=True)
            delay = self.agent_removal_timeout if removal_delay is None else removal_delay
            self._after(delay, lambda: self._remove_agent(agent_id))

    def _remove_agent(self, agent_id: str) -> None:
        a = self._agent(agent_id)
        if a is None or a.state != "DISCONNECTED":
            return
        a.state = "UNREACHABLE"
        now_ns = time.time_ns()
        a.unreachable_time = now_ns
        for t in [t for t in self._tasks.values() if t.agent_id == agent_id]:
            fw = self._frameworks.get(t.framework_id)
            if t.agent_state in TERMINAL_STATES and not t.pending:
                continue
            state = "TASK_UNREACHABLE" if fw is None or fw.partition_aware else "TASK_LOST"
            t.unreachable = True
            t.pending_kill = False  # the agent's Slave object goes, and with it the kills it was to be sent
            self._master_update(t, state, "REASON_AGENT_REMOVED", "health check timed out",
                                extra={"unreachable_time": {"nanoseconds": now_ns}})
        for fw in self._frameworks.values():
            if fw.connected:
                self._send(fw, {"type": "FAILURE", "failure": {"agent_id": {"value": agent_id}}})

    def restore_agent(self, agent_id: str) -> None:
        """The lost agent comes back (re-registers under the same id)."""
        with self._lock:
            a = self._agent(agent_id)
            assert a is not None
            was_unreachable = a.state == "UNREACHABLE"
            a.state = "ACTIVE"
            a.unreachable_time = None
            for t in [t for t in self._tasks.values() if t.agent_id == agent_id]:
                if t.agent_state in TERMINAL_STATES:
                    continue
                if was_unreachable and t.unreachable:
                    t.unreachable = False
                    self._master_update(t, t.agent_state, "REASON_AGENT_REREGISTERED",
                                        "Unreachable agent re-reregistered", container=True)
                if t.pending_kill:
                    t.pending_kill = False
                    self._kill(t)
                if t.pending:
                    t.next_retry = 0.0  # resend the in-flight update soon
            self._next_alloc = 0.0

    def cut_stream(self, framework_id: str | None = None) -> None:
        """Close the subscription connection abruptly (no terminating chunk)."""
        with self._lock:
            for fw in self._select(framework_id):
                if fw.sub is not None:
                    self._abort_sub(fw.sub)
                    self._disconnected(fw)

    def go_silent(self, framework_id: str | None = None, silent: bool = True) -> None:
        """Stop writing anything (heartbeats included) on the stream(s), keeping the connection open."""
        with self._lock:
            for fw in self._select(framework_id):
                if fw.sub is not None:
                    fw.sub.silent = silent

    def set_leader(self, leader: bool, leader_url: str | None = None) -> None:
        """Non-leader: every call gets 307 to ``leader_url`` (503 "No leader elected" without one); open streams
        are aborted, as a master that loses leadership exits."""
        with self._lock:
            self.leader = leader
            if leader_url is not None:
                self.leader_url = leader_url
            if not leader:
                self._drop_all_streams()

    def set_unavailable(self, unavailable: bool = True) -> None:
        """503 "Master has not finished recovery" for every call while set."""
        self.unavailable = unavailable

    def crash(self) -> None:
        """Master process dies: streams aborted, listener closed (connection refused)."""
        with self._lock:
            self._crashed = True
            self._drop_all_streams()
        self._unlisten()

    def restart(self, master_id: str | None = None) -> None:
        """New master (new id) on the same port. It knows no offers, and the agents are recovered from the registry:
        their tasks are unknown (no reconciliation reply, a KILL of them is a reconciliation that gets none either)
        until they re-register ``agent_reregister_delay`` later. Frameworks must re-subscribe (403 until); unlike
        the real master, which learns of a framework only from its SUBSCRIBE or an agent re-registering with its
        tasks, the double knows every framework that has tasks at once."""
        with self._lock:
            self._master_id = master_id or str(uuid.uuid4())
            self._offer_seq = 0
            self._offers.clear()
            for a in self._agents:
                a.inverse_offers.clear()  # (the windows themselves are in the registry: they stay)
            self._removed.clear()
            old = self._frameworks
            self._frameworks = {}
            recovered = {t.framework_id for t in self._tasks.values()}
            for fid in recovered:
                if fid in old:
                    self._frameworks[fid] = _Framework(fid, old[fid].info)
            # the agents come back from the registry as recovered: their tasks are unknown until they re-register
            for a in self._agents:
                if a.state == "ACTIVE":
                    a.state = "RECOVERED"
                    self._after(self.agent_reregister_delay, functools.partial(self._reregister, a))
            for t in self._tasks.values():
                t.next_retry = time.monotonic() + self.agent_reregister_delay
            self._crashed = False
        self._listen()

    def _reregister(self, a: FakeAgent) -> None:
        if a.state == "RECOVERED":
            a.state = "ACTIVE"
            self._next_alloc = 0.0

    def _drop_all_streams(self) -> None:
        for fw in self._frameworks.values():
            if fw.sub is not None:
                self._abort_sub(fw.sub)
                fw.sub = None
                fw.disconnected_at = time.monotonic()
        for oid in list(self._offers):
            self._offers.pop(oid, None)
        for a in self._agents:
            a.inverse_offers.clear()

    def _select(self, framework_id: str | None) -> list[_Framework]:
        if framework_id is None:
            return [f for f in self._frameworks.values() if f.sub is not None]
        fw = self._frameworks.get(framework_id)
        return [fw] if fw else []

    # ------------------------------------------------------------------ timers / clock
    def _after(self, delay: float, fn: Callable[[], None]) -> None:
        self._timers.append((time.monotonic() + max(0.0, delay), fn))

    def _clock_loop(self) -> None:
        while not self._stop.is_set():
            time.sleep(self.tick)
            with self._lock:
                if self._crashed:
                    continue
                try:
                    self._on_tick()
                except Exception:  # pragma: no cover - keep the clock alive, surface in tests via state
                    import traceback

                    traceback.print_exc()

    def _on_tick(self) -> None:
        now = time.monotonic()
        due = [t for t in self._timers if t[0] <= now]
        if due:
            self._timers = [t for t in self._timers if t[0] > now]
            for _, fn in sorted(due, key=lambda x: x[0]):
                fn()
        for fw in list(self._frameworks.values()):
            sub = fw.sub
            if sub is not None and not sub.closed and now >= sub.next_heartbeat:
                sub.next_heartbeat = now + self.heartbeat_interval
                self._send(fw, {"type": "HEARTBEAT"})
            if fw.sub is None and fw.disconnected_at is not None:
                timeout = float(fw.info.get("failover_timeout") or 0) * self.client_time_scale
                if now - fw.disconnected_at >= max(0.0, timeout):
                    self._remove_framework(fw)
        for t in list(self._tasks.values()):
            if t.finish_at is not None and now >= t.finish_at and t.agent_state not in TERMINAL_STATES:
                t.finish_at = None
                self._task_terminal(t, "TASK_FINISHED", "Command exited with status 0", None)
            if t.pending and now >= t.next_retry:
                a = self._agent(t.agent_id)
                if a is not None and a.state == "ACTIVE":
                    self._deliver_head(t, retry=t.delivered_head)
        if self.offer_timeout is not None:
            for o in list(self._offers.values()):
                if now - o.created >= self.offer_timeout:
                    self._rescind(o.offer_id)
        if now >= self._next_alloc:
            self._next_alloc = now + self.allocation_interval
            self._allocate()

    # ------------------------------------------------------------------ event writing
    def _send(self, fw: _Framework, event: dict[str, Any]) -> None:
        sub = fw.sub
        if sub is None or sub.closed:
            return
        self._write_event(sub, event)

    def _write_event(self, sub: _Subscription, event: dict[str, Any]) -> None:
        self.events.append((sub.framework_id, event))
        if sub.silent:
            return
        if sub.encoding == "protobuf":
            payload = _pb_event(event)
            if payload is None:
                return
        else:
            payload = json.dumps(event, separators=(",", ":")).encode()
        sub.q.put(str(len(payload)).encode() + b"\n" + payload)

    def _close_sub(self, sub: _Subscription) -> None:
        """Clean end of stream (terminating chunk)."""
        if not sub.closed:
            sub.closed = True
            sub.q.put("close")

    def _abort_sub(self, sub: _Subscription) -> None:
        if not sub.closed:
            sub.closed = True
            sub.q.put("abort")
            with contextlib.suppress(OSError):
                sub.sock.shutdown(socket.SHUT_RDWR)

    def _stream_loop(self, h: _Handler, sub: _Subscription) -> None:
        content_type = "application/x-protobuf" if sub.encoding == "protobuf" else "application/json"
        h.send_raw(200, [("Transfer-Encoding", "chunked"), ("Mesos-Stream-Id", sub.stream_id),
                         ("Content-Type", content_type)])
        sock = h.connection
        while True:
            try:
                item = sub.q.get(timeout=0.02)
            except queue.Empty:
                item = None
            if item is None:
                try:
                    r, _, _ = select.select([sock], [], [], 0)
                    if r and not sock.recv(1024, socket.MSG_PEEK):
                        raise OSError("client closed")
                except (OSError, ValueError):
                    self._client_closed(sub)
                    return
                continue
            if item == "abort":
                return
            try:
                if item == "close":
                    h.wfile.write(b"0\r\n\r\n")
                    h.wfile.flush()
                    return
                step = self.chunk_size or len(item)
                out = bytearray()
                for i in range(0, len(item), step):
                    piece = item[i:i + step]
                    out += f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
                h.wfile.write(bytes(out))
                h.wfile.flush()
            except (OSError, ValueError):
                self._client_closed(sub)
                return

    def _client_closed(self, sub: _Subscription) -> None:
        with self._lock:
            fw = self._frameworks.get(sub.framework_id)
            sub.closed = True
            if fw is not None and fw.sub is sub:
                self._disconnected(fw)

    def _disconnected(self, fw: _Framework) -> None:
        fw.sub = None
        fw.disconnected_at = time.monotonic()
        for o in [o for o in self._offers.values() if o.framework_id == fw.framework_id]:
            self._offers.pop(o.offer_id, None)
        self._drop_inverse_offers(fw.framework_id)

    # ------------------------------------------------------------------ HTTP entry
    def _handle(self, h: _Handler) -> None:
        body = h.read_body()
        headers = {k.lower(): v for k, v in h.headers.items()}
        record: dict[str, Any] = {"method": h.command, "path": h.path, "headers": dict(h.headers.items()),
                                  "raw": body, "type": None, "body": None, "time": time.monotonic()}
        try:
            parsed = json.loads(body)
            record["body"] = parsed
            if isinstance(parsed, dict):
                record["type"] = parsed.get("type")
        except Exception:
            pass
        self.calls.append(record)
        try:
            result = self._process(h, headers, body)
        except _HTTPError as e:
            result = _text_response(e.status, e.body, e.headers)
        if result is None:  # a stream was served
            h.close_connection = True
            record["status"] = 200
            return
        status, hdrs, payload = result
        record["status"] = status
        h.send_raw(status, hdrs, payload)

    def _process(self, h: _Handler, headers: dict[str, str], raw: bytes) -> tuple | None:
        if urlsplit(h.path).path != SCHEDULER_PATH:
            return _text_response(404, "")
        if self.credentials is not None:
            ok = False
            auth = headers.get("authorization", "")
            if auth.startswith("Basic "):
                try:
                    p, _, s = base64.b64decode(auth[6:]).decode().partition(":")
                    ok = self.credentials.get(p) == s
                    h.principal = p  # type: ignore[attr-defined]
                except Exception:
                    ok = False
            if not ok:
                return 401, [("WWW-Authenticate", 'Basic realm="mesos-master-scheduler"'), ("Content-Length", "0")], b""
        if not self.leader:
            if not self.leader_url:
                return _text_response(503, "No leader elected")
            loc = self.leader_url
            if "://" in loc:
                loc = loc.split("://", 1)[1]
            loc = "//" + loc.rstrip("/").lstrip("/")
            if not loc.endswith(SCHEDULER_PATH):
                loc += SCHEDULER_PATH
            return 307, [("Location", loc), ("Content-Length", "0")], b""
        if self.unavailable:
            return _text_response(503, "Master has not finished recovery")
        if h.command != "POST":
            return _text_response(405, f"405 Method Not Allowed. Expecting one of {{ 'POST' }}, but received "
                                       f"'{h.command}'.", [("Allow", "POST")])
        ctype = headers.get("content-type")
        if ctype is None:
            return _text_response(400, "Expecting 'Content-Type' to be present")
        if ctype not in ("application/json", "application/x-protobuf"):
            return _text_response(415, "Expecting 'Content-Type' of application/json or application/x-protobuf")
        if ctype == "application/x-protobuf":
            return _text_response(415, "This fake master only accepts application/json request bodies")
        try:
            call = json.loads(raw.decode("utf-8"))
        except Exception:
            return _text_response(400, "Failed to parse body into JSON: syntax error at line 1 near: ")
        err = self._convert_errors(call)
        if err:
            return _text_response(400, "Failed to convert JSON into Call protobuf: " + err)
        err = self._validate(call)
        if err:
            return _text_response(400, "Failed to validate scheduler::Call: " + err)
        ctype_type = call["type"]
        principal = getattr(h, "principal", None)
        if ctype_type == "SUBSCRIBE":
            enc = self._negotiate(headers.get("accept"))
            if enc is None:
                return _text_response(406, "Expecting 'Accept' to allow 'application/x-protobuf' or 'application/json'")
            if "mesos-stream-id" in headers:
                return _text_response(400, "Subscribe calls should not include the 'Mesos-Stream-Id' header")
            info = call["subscribe"]["framework_info"]
            if principal is not None and info.get("principal") not in (None, principal):
                return _text_response(400, f"Authenticated principal '{principal}' does not match principal "
                                           f"'{info.get('principal')}' set in `FrameworkInfo`")
            sub = self._subscribe(call, enc, h.connection)
            self._stream_loop(h, sub)
            return None
        fid = call["framework_id"]["value"]
        with self._lock:
            fw = self._frameworks.get(fid)
            if fw is None:
                return _text_response(400, "Framework cannot be found")
            if ctype_type == "UNKNOWN":
                # Deviation: the real master aborts (CHECK failure) here.
                return _text_response(501, "Received an unexpected 'UNKNOWN' call")
            if not fw.connected:
                return _text_response(403, "Framework is not subscribed")
            sid = headers.get("mesos-stream-id")
            if sid is None:
                return _text_response(400, "All non-subscribe calls should include the 'Mesos-Stream-Id' header")
            assert fw.sub is not None
            if sid != fw.sub.stream_id:
                return _text_response(400, f"The stream ID '{sid}' included in this request didn't match the stream "
                                           f"ID currently associated with framework ID {fid}")
            return self._dispatch(fw, call)

    @staticmethod
    def _negotiate(accept: str | None) -> str | None:
        if accept is None:
            return "json"
        types = [p.split(";")[0].strip().lower() for p in accept.split(",")]
        if any(t in ("application/json", "*/*", "application/*") for t in types):
            return "json"
        if "application/x-protobuf" in types:
            return "protobuf"
        return None

    @staticmethod
    def _convert_errors(call: Any) -> str | None:
        if not isinstance(call, dict):
            return "Expecting a JSON object"
        for key in ("framework_id",):
            if key in call and isinstance(call[key], str):
                return f"Not expecting a JSON string for field '{key}'"
        if call.get("type") not in CALL_TYPES:
            call.pop("type", None)  # unknown enum names are dropped by the converter
        missing = []
        for body_key, reqs in REQUIRED_FIELDS.items():
            sub = call.get(body_key)
            if not isinstance(sub, dict):
                continue
            for nested, names in reqs:
                obj = sub.get(nested) if nested else sub
                if not isinstance(obj, dict):
                    continue
                prefix = f"{body_key}.{nested}." if nested else f"{body_key}."
                missing += [prefix + n for n in names if n not in obj]
        if missing:
            return "Missing required fields: " + ", ".join(missing)
        return None

    @staticmethod
    def _validate(call: dict[str, Any]) -> str | None:
        t = call.get("type")
        if t is None:
            return "Expecting 'type' to be present"
        if t == "SUBSCRIBE":
            if not isinstance(call.get("subscribe"), dict):
                return "Expecting 'subscribe' to be present"
            info_id = (call["subscribe"].get("framework_info") or {}).get("id")
            if (info_id is not None or "framework_id" in call) and info_id != call.get("framework_id"):
                return "'framework_id' differs from 'subscribe.framework_info.id'"
            return None
        if not isinstance(call.get("framework_id"), dict) or "value" not in call["framework_id"]:
            return "Expecting 'framework_id' to be present"
        key = REQUIRED_BODY.get(t)
        if key and not isinstance(call.get(key), dict):
            return f"Expecting '{key}' to be present"
        if t == "ACKNOWLEDGE" and not _valid_uuid_b64(call["acknowledge"].get("uuid")):
            return "Not a valid UUID"
        if t == "UPDATE_FRAMEWORK":
            info = call["update_framework"].get("framework_info") or {}
            if info.get("id") != call["framework_id"]:
                return "'framework_id' differs from 'update_framework.framework_info.id'"
        return None

    # ------------------------------------------------------------------ SUBSCRIBE
    def _subscribe_error(self, info: dict[str, Any], fid: str | None) -> str | None:
        caps = {c.get("type") for c in info.get("capabilities") or [] if isinstance(c, dict)}
        if fid is not None and fid in self._removed:
            return "Framework has been removed"
        if "MULTI_ROLE" not in caps and info.get("roles"):
            return "'FrameworkInfo.roles' must not be set when the framework is not MULTI_ROLE capable"
        if "MULTI_ROLE" in caps and "role" in info:
            return "'FrameworkInfo.role' must not be set when the framework is MULTI_ROLE capable"
        ft = info.get("failover_timeout")
        if isinstance(ft, int | float) and abs(ft) * 1e9 > 2**63 - 1:
            return f"The framework failover_timeout ({ft:g}) is invalid"
        if fid is not None and fid in self._frameworks:
            old = self._frameworks[fid].info
            if old.get("principal") != info.get("principal") and "principal" in old:
                return "Changing framework's principal is not allowed."
        return None

    def _subscribe(self, call: dict[str, Any], enc: str, sock: socket.socket) -> _Subscription:
        info = dict(call["subscribe"]["framework_info"])
        fid = (call.get("framework_id") or {}).get("value")
        with self._lock:
            err = self._subscribe_error(info, fid)
            if err is not None:
                sub = _Subscription(fid or "", enc, sock)
                self._write_event(sub, {"type": "ERROR", "error": {"message": err}})
                self._close_sub(sub)
                return sub
            if fid is None:
                fid = f"{self._master_id}-{self._fw_seq:04d}"
                self._fw_seq += 1
            info["id"] = {"value": fid}
            fw = self._frameworks.get(fid)
            if fw is None:
                fw = _Framework(fid, info)
                self._frameworks[fid] = fw
            else:
                old_info = fw.info
                # user and checkpoint changes are silently ignored
                info["user"] = old_info.get("user", info.get("user"))
                if "checkpoint" in old_info:
                    info["checkpoint"] = old_info["checkpoint"]
                fw.info = info
                if fw.sub is not None:
                    old = fw.sub
                    self._write_event(old, {"type": "ERROR", "error": {"message": "Framework failed over"}})
                    self._close_sub(old)
                for o in [o for o in self._offers.values() if o.framework_id == fid]:
                    self._offers.pop(o.offer_id, None)
                self._drop_inverse_offers(fid)
            fw.suppressed = set(call["subscribe"].get("suppressed_roles") or [])
            fw.disconnected_at = None
            fw.subscribed_at = time.monotonic()
            sub = _Subscription(fid, enc, sock)
            fw.sub = sub
            self.framework_id = fid
            self._write_event(sub, {"type": "SUBSCRIBED", "subscribed": {
                "framework_id": {"value": fid},
                "heartbeat_interval_seconds": float(self.heartbeat_interval),
                "master_info": self._master_info()}})
            sub.next_heartbeat = time.monotonic() + self.heartbeat_interval
            self._write_event(sub, {"type": "HEARTBEAT"})
            self._allocate()
            return sub

    def _master_info(self) -> dict[str, Any]:
        ip = socket.inet_aton(self.host) if re.fullmatch(r"[\d.]+", self.host) else b"\x7f\x00\x00\x01"
        return {"id": self._master_id, "ip": struct.unpack("<I", ip)[0], "port": self._port,
                "pid": f"master@{self.host}:{self._port}", "hostname": self.host, "version": self.version,
                "address": {"hostname": self.host, "ip": self.host, "port": self._port},
                "capabilities": [dict(c) for c in MASTER_CAPABILITIES]}

    def _remove_framework(self, fw: _Framework, *, close: bool = True) -> None:
        """TEARDOWN / failover timeout: kill every task silently, drop offers, close the stream (no event)."""
        fid = fw.framework_id
        for t in [t for t in self._tasks.values() if t.framework_id == fid]:
            self._kill_on_agent(t, silent=True)
            self._tasks.pop((fid, t.task_id), None)
        for o in [o for o in self._offers.values() if o.framework_id == fid]:
            self._offers.pop(o.offer_id, None)
        self._drop_inverse_offers(fid)
        if fw.sub is not None and close:
            self._close_sub(fw.sub)
        fw.sub = None
        self._frameworks.pop(fid, None)
        self._removed.add(fid)

    # ------------------------------------------------------------------ allocation
    def _agent_available(self, a: FakeAgent) -> Res:
        avail = res_sub(a.total, a.used)
        for o in self._offers.values():
            if o.agent_id == a.agent_id:
                avail = res_sub(avail, o.resources)
        return avail

    def _allocate(self) -> None:
        if self._crashed:
            return
        if self.offers_enabled:
            self._allocate_offers()
        self._generate_inverse_offers()

    def _generate_inverse_offers(self) -> None:
        """The allocator's generateInverseOffers, after each allocation: for an agent with a maintenance window, an
        inverse offer to each connected framework with resources offered or allocated there (tasks not terminal,
        executors, offers), unless it has one outstanding for the agent or refused one for it (its
        ACCEPT/DECLINE_INVERSE_OFFERS filter) that has not expired: so an answered inverse offer comes again once
        its filter expires, while the framework still has something there."""
        now = time.monotonic()
        for a in self._agents:
            if a.state != "ACTIVE" or a.unavailability is None:
                continue
            there = {o.framework_id for o in self._offers.values() if o.agent_id == a.agent_id}
            there |= {t.framework_id for t in self._tasks.values()
                      if t.agent_id == a.agent_id and t.agent_state not in TERMINAL_STATES}
            there |= {fid for fid, _ in a.executors}
            outstanding = set(a.inverse_offers.values())
            for fid in sorted(there - outstanding):
                fw = self._frameworks.get(fid)
                if fw is None or not fw.connected or fw.inverse_filters.get(a.agent_id, 0.0) > now:
                    continue
                fw.inverse_filters.pop(a.agent_id, None)
                iid = f"{self._master_id}-I{self._offer_seq}"
                self._offer_seq += 1
                a.inverse_offers[iid] = fid
                self._send(fw, {"type": "INVERSE_OFFERS", "inverse_offers": {"inverse_offers": [{
                    "id": {"value": iid}, "framework_id": {"value": fid},
                    "agent_id": {"value": a.agent_id},
                    "url": {"scheme": "http", "address": {"hostname": a.hostname, "ip": a.ip, "port": a.port},
                            "path": "/slave(1)"},
                    "unavailability": self._unavailability_json(a), "resources": []}]}})

    def _allocate_offers(self) -> None:
        now = time.monotonic()
        fws = [f for f in self._frameworks.values() if f.connected]
        if not fws:
            return
        for f in fws:
            f.filters = [x for x in f.filters if x.expires > now]

        def share(f: _Framework) -> float:
            used = sum(t.resources.get("cpus", 0) for t in self._tasks.values()
                       if t.framework_id == f.framework_id and t.agent_state not in TERMINAL_STATES)
            used += sum(o.resources.get("cpus", 0) for o in self._offers.values()
                        if o.framework_id == f.framework_id)
            return used

        new: dict[str, list[_Offer]] = {}
        for a in self._agents:
            if a.state != "ACTIVE":
                continue
            avail = self._agent_available(a)
            if res_empty(avail):
                continue
            for f in sorted(fws, key=lambda f: (share(f), f.subscribed_at)):
                if a.total.get("gpus", 0) > 0 and self.filter_gpu_resources and "GPU_RESOURCES" not in f.caps:
                    continue
                role = next((r for r in f.roles if r not in f.suppressed), None)
                if role is None:
                    continue
                if any(x.agent_id == a.agent_id and x.role == role and res_contains(x.resources, avail)
                       for x in f.filters):
                    continue
                oid = f"{self._master_id}-O{self._offer_seq}"
                self._offer_seq += 1
                o = _Offer(oid, f.framework_id, a.agent_id, role, avail, now)  # type: ignore[arg-type]
                self._offers[oid] = o
                new.setdefault(f.framework_id, []).append(o)
                break
        for fid, offers in new.items():
            fw = self._frameworks[fid]
            self._send(fw, {"type": "OFFERS", "offers": {"offers": [self._offer_json(o) for o in offers]}})

    def _offer_json(self, o: _Offer) -> dict[str, Any]:
        a = self._agent(o.agent_id)
        assert a is not None
        attrs = []
        for k, v in a.attributes.items():
            if isinstance(v, int | float):
                attrs.append({"name": k, "type": "SCALAR", "scalar": {"value": float(v)}})
            else:
                attrs.append({"name": k, "type": "TEXT", "text": {"value": str(v)}})
        d: dict[str, Any] = {
            "id": {"value": o.offer_id}, "framework_id": {"value": o.framework_id},
            "agent_id": {"value": o.agent_id}, "hostname": a.hostname,
            "url": {"scheme": "http", "address": {"hostname": a.hostname, "ip": a.ip, "port": a.port},
                    "path": "/slave(1)"},
            "resources": res_to_json(o.resources, o.role),
        }
        if attrs:
            d["attributes"] = attrs
        execs = sorted(e for f, e in a.executors if f == o.framework_id)
        if execs:
            d["executor_ids"] = [{"value": e} for e in execs]
        if a.unavailability is not None:
            d["unavailability"] = self._unavailability_json(a)
        d["allocation_info"] = {"role": o.role}
        return d

    def _rescind(self, offer_id: str | None) -> None:
        o = self._offers.pop(offer_id, None)
        if o is None:
            return
        fw = self._frameworks.get(o.framework_id)
        if fw is not None:
            self._send(fw, {"type": "RESCIND", "rescind": {"offer_id": {"value": offer_id}}})

    def _refuse_seconds(self, filters: Any) -> float:
        rs = (filters or {}).get("refuse_seconds") if isinstance(filters, dict) else None
        if rs is None or rs < 0:
            rs = self.default_refuse_seconds
        return min(float(rs), 31536000.0) * self.client_time_scale

    # ------------------------------------------------------------------ calls
    def _dispatch(self, fw: _Framework, call: dict[str, Any]) -> tuple:
        t = call["type"]
        handler = getattr(self, "_call_" + t.lower(), None)
        if handler is not None:
            res = handler(fw, call)
            if res is not None:
                return res
        return _text_response(200 if t == "UPDATE_FRAMEWORK" else 202, "")

    def _call_teardown(self, fw: _Framework, call: dict[str, Any]) -> None:
        self._remove_framework(fw)

    def _call_decline(self, fw: _Framework, call: dict[str, Any]) -> None:
        body = call["decline"]
        secs = self._refuse_seconds(body.get("filters"))
        for oid in body.get("offer_ids") or []:
            o = self._offers.get((oid or {}).get("value"))
            if o is None or o.framework_id != fw.framework_id:
                continue
            self._offers.pop(o.offer_id)
            if secs > 0:
                fw.filters.append(_Filter(o.agent_id, o.role, o.resources, time.monotonic() + secs))

    def _call_accept_inverse_offers(self, fw: _Framework, call: dict[str, Any]) -> None:
        self._answer_inverse_offers(fw, call["accept_inverse_offers"])

    def _call_decline_inverse_offers(self, fw: _Framework, call: dict[str, Any]) -> None:
        self._answer_inverse_offers(fw, call["decline_inverse_offers"])

    def _answer_inverse_offers(self, fw: _Framework, body: dict[str, Any]) -> None:
        """An answered inverse offer is over (the master keeps the answer for the operator's /maintenance/status);
        the framework gets no other for that agent for `refuse_seconds` (default 5 s; 0: none), then again while it
        still has resources there. An unknown or another framework's id: ignored (202)."""
        secs = self._refuse_seconds(body.get("filters"))
        for iid in [str((i or {}).get("value")) for i in body.get("inverse_offer_ids") or []]:
            for a in self._agents:
                if a.inverse_offers.get(iid) == fw.framework_id:
                    del a.inverse_offers[iid]
                    if secs > 0:
                        fw.inverse_filters[a.agent_id] = time.monotonic() + secs

    def _call_revive(self, fw: _Framework, call: dict[str, Any]) -> None:
        roles = (call.get("revive") or {}).get("roles") or fw.roles
        fw.suppressed -= set(roles)
        fw.filters = [x for x in fw.filters if x.role not in roles]
        self._allocate()

    def _call_suppress(self, fw: _Framework, call: dict[str, Any]) -> None:
        roles = (call.get("suppress") or {}).get("roles") or fw.roles
        fw.suppressed |= set(roles)

    def _call_update_framework(self, fw: _Framework, call: dict[str, Any]) -> tuple | None:
        info = dict(call["update_framework"]["framework_info"])
        for key in ("user", "principal", "checkpoint"):
            if fw.info.get(key) != info.get(key) and (key in fw.info or key in info):
                return _text_response(400, f"FrameworkInfo update is not valid: Updating 'FrameworkInfo.{key}' is "
                                           f"unsupported; attempted to update from '{fw.info.get(key)}' to "
                                           f"'{info.get(key)}'")
        old_roles = set(fw.roles)
        fw.info = info
        removed = old_roles - set(fw.roles)
        for o in [o for o in self._offers.values() if o.framework_id == fw.framework_id and o.role in removed]:
            self._rescind(o.offer_id)
        fw.suppressed = set(call["update_framework"].get("suppressed_roles") or [])
        return None

    def _call_acknowledge(self, fw: _Framework, call: dict[str, Any]) -> None:
        body = call["acknowledge"]
        tid = (body.get("task_id") or {}).get("value")
        u = body.get("uuid")
        t = self._tasks.get((fw.framework_id, tid))
        self.acks.append({"framework_id": fw.framework_id, "task_id": tid, "uuid": u,
                          "agent_id": (body.get("agent_id") or {}).get("value"),
                          "matched": bool(t and t.pending and t.pending[0].get("uuid") == u)})
        if t is None or not t.pending or t.pending[0].get("uuid") != u:
            return
        head = t.pending.pop(0)
        t.delivered_head = False
        if head["state"] in TERMINAL_STATES and not t.pending:
            self._tasks.pop((fw.framework_id, tid), None)
            return
        if t.pending:
            t.retry_backoff = 0.0
            self._deliver_head(t, retry=False)

    def _call_reconcile(self, fw: _Framework, call: dict[str, Any]) -> None:
        entries = (call.get("reconcile") or {}).get("tasks") or []
        if not entries:  # implicit: the framework's known tasks (an unreachable or recovered agent's are not)
            for t in [t for t in self._tasks.values() if t.framework_id == fw.framework_id]:
                if self._known_task(fw, t.task_id) is t:
                    self._reconcile_known(fw, t)
            return
        for e in entries:
            tid = (e.get("task_id") or {}).get("value")
            aid = (e.get("agent_id") or {}).get("value")
            self._reconcile_one(fw, tid, aid)

    def _known_task(self, fw: _Framework, tid: str | None) -> _Task | None:
        """A task the master knows (`framework->getTask`): not one of an agent marked unreachable, whose tasks
        `Master::removeTask(task, unreachable)` moved out of the framework's tasks until the agent re-registers."""
        t = self._tasks.get((fw.framework_id, tid))
        if t is None or t.unreachable:
            return None
        a = self._agent(t.agent_id)
        return None if a is not None and a.state == "RECOVERED" else t

    def _reconcile_known(self, fw: _Framework, t: _Task) -> None:
        st = self._status_base(t.task_id, t.state, "Reconciliation: Latest task state", "REASON_RECONCILIATION",
                               t.agent_id)
        if t.state != "TASK_STAGING":
            st["container_status"] = self._container_status(t)
        self._send(fw, {"type": "UPDATE", "update": {"status": st}})

    def _reconcile_one(self, fw: _Framework, tid: str | None, aid: str | None) -> None:
        """Explicit reconciliation of one entry, the cases of `Master::reconcile` (src/master/master.cpp)."""
        t = self._known_task(fw, tid)
        if t is not None:
            self._reconcile_known(fw, t)
            return
        a = self._agent(aid) if aid else None
        pa = fw.partition_aware
        extra: dict[str, Any] = {}
        if (a is not None and a.state == "RECOVERED") or (
                aid is None and any(x.state == "RECOVERED" for x in self._agents)):
            return  # (2): not re-registered yet after a master failover: no reply, the framework retries
        if a is not None and a.state in ("ACTIVE", "DISCONNECTED"):  # registered, connected or not: (3)
            state, msg = ("TASK_GONE" if pa else "TASK_LOST"), "Reconciliation: Task is unknown to the agent"
        elif a is not None and a.state == "UNREACHABLE":
            state, msg = ("TASK_UNREACHABLE" if pa else "TASK_LOST"), "Reconciliation: Task is unreachable"
            extra["unreachable_time"] = {"nanoseconds": a.unreachable_time}
        else:
            state, msg = ("TASK_UNKNOWN" if pa else "TASK_LOST"), "Reconciliation: Task is unknown"
        st = self._status_base(tid or "", state, msg, "REASON_RECONCILIATION", aid)
        st.update(extra)
        self._send(fw, {"type": "UPDATE", "update": {"status": st}})

    def _call_kill(self, fw: _Framework, call: dict[str, Any]) -> None:
        body = call["kill"]
        tid = body["task_id"].get("value")
        aid = (body.get("agent_id") or {}).get("value")
        t = self._known_task(fw, tid)
        if t is None:  # unknown, or on an agent marked unreachable: a reconciliation, and nothing remembered
            self._reconcile_one(fw, tid, aid)
            return
        if aid is not None and aid != t.agent_id:
            return  # silently dropped, as recorded
        if t.agent_state in TERMINAL_STATES:
            return
        a = self._agent(t.agent_id)
        if a is None or a.state != "ACTIVE":
            t.pending_kill = True
            return
        self._kill(t)

    def _kill(self, t: _Task) -> None:
        group = [x for x in self._tasks.values()
                 if t.group_executor and x.group_executor == t.group_executor and x.agent_id == t.agent_id
                 and x.framework_id == t.framework_id] or [t]
        for x in group:
            if x.agent_state in TERMINAL_STATES or x.data.get("killing"):
                continue
            x.data["killing"] = True
            fw = self._frameworks.get(x.framework_id)
            if fw is not None and "TASK_KILLING_STATE" in fw.caps:
                self._reliable(x, "TASK_KILLING", None, None)

            def done(x: _Task = x) -> None:
                if x.agent_state not in TERMINAL_STATES:
                    self._task_terminal(x, "TASK_KILLED", "Command terminated with signal Terminated", None)

            self._after(self.kill_delay, done)

    def _call_reconcile_operations(self, fw: _Framework, call: dict[str, Any]) -> None:
        for op in (call.get("reconcile_operations") or {}).get("operations") or []:
            st: dict[str, Any] = {"operation_id": op.get("operation_id"), "state": "OPERATION_UNKNOWN",
                                  "message": "Reconciliation: Operation is unknown"}
            if op.get("agent_id"):
                st["agent_id"] = op["agent_id"]
            if op.get("resource_provider_id"):
                st["resource_provider_id"] = op["resource_provider_id"]
            self._send(fw, {"type": "UPDATE_OPERATION_STATUS", "update_operation_status": {"status": st}})

    def _call_accept(self, fw: _Framework, call: dict[str, Any]) -> None:
        body = call["accept"]
        ops = body.get("operations") or []
        oids = [(x or {}).get("value") for x in body.get("offer_ids") or []]
        err = None
        offers: list[_Offer] = []
        for oid in oids:
            o = self._offers.get(oid)
            if o is not None and o.agent_id in self._rescind_next_accept:
                self._rescind_next_accept.discard(o.agent_id)
                self._rescind(oid)
                o = None
            if o is None or o.framework_id != fw.framework_id:
                err = err or f"Offer {oid} is no longer valid"
                continue
            offers.append(o)
        if err is None and not oids:
            err = "No offers specified"
        if err is None:
            for o in offers[1:]:
                if o.agent_id != offers[0].agent_id:
                    err = (f"Aggregated offers must belong to one single agent. Offer {o.offer_id} uses agent "
                           f"{o.agent_id} and agent {offers[0].agent_id}")
                    break
        if err is None and len(set(oids)) != len(oids):
            err = "Duplicate offers"
        for o in offers:
            self._offers.pop(o.offer_id, None)
        if err is not None:
            state = "TASK_DROPPED" if fw.partition_aware else "TASK_LOST"
            for op in ops:
                for ti in self._op_tasks(op):
                    st = self._status_base(ti.get("task_id", {}).get("value", ""), state,
                                           "Task launched with invalid offers: " + err, "REASON_INVALID_OFFERS",
                                           (ti.get("agent_id") or {}).get("value"))
                    self._send(fw, {"type": "UPDATE", "update": {"status": st}})
            return
        agent = self._agent(offers[0].agent_id)
        assert agent is not None
        role = offers[0].role
        remaining: Res = {n: 0.0 for n in SCALAR_NAMES}
        remaining["ports"] = []
        for o in offers:
            remaining = res_add(remaining, o.resources)
        for op in ops:
            if op.get("type") == "LAUNCH":
                for ti in (op.get("launch") or {}).get("task_infos") or []:
                    if "id" in op:
                        self._task_error(fw, ti, "The `id` field cannot be set on LAUNCH operations",
                                         "REASON_TASK_INVALID")
                        continue
                    remaining = self._launch(fw, agent, role, [ti], None, remaining)
            elif op.get("type") == "LAUNCH_GROUP":
                lg = op.get("launch_group") or {}
                tis = (lg.get("task_group") or {}).get("tasks") or []
                if "id" in op:
                    for ti in tis:
                        self._task_error(fw, ti, "The `id` field cannot be set on LAUNCH_GROUP operations",
                                         "REASON_TASK_GROUP_INVALID")
                    continue
                remaining = self._launch(fw, agent, role, tis, lg.get("executor") or {}, remaining)
        if not res_empty(remaining):
            secs = self._refuse_seconds(body.get("filters"))
            if secs > 0:
                fw.filters.append(_Filter(agent.agent_id, role, remaining, time.monotonic() + secs))  # type: ignore[arg-type]

    @staticmethod
    def _op_tasks(op: dict[str, Any]) -> list[dict[str, Any]]:
        if op.get("type") == "LAUNCH":
            return list((op.get("launch") or {}).get("task_infos") or [])
        if op.get("type") == "LAUNCH_GROUP":
            return list(((op.get("launch_group") or {}).get("task_group") or {}).get("tasks") or [])
        return []

    def _task_error(self, fw: _Framework, ti: dict[str, Any], msg: str, reason: str) -> None:
        st = self._status_base((ti.get("task_id") or {}).get("value", ""), "TASK_ERROR", msg, reason,
                               (ti.get("agent_id") or {}).get("value"))
        self._send(fw, {"type": "UPDATE", "update": {"status": st}})

    def _validate_task(self, fw: _Framework, agent: FakeAgent, ti: dict[str, Any]) -> str | None:
        tid = (ti.get("task_id") or {}).get("value")
        if not tid or "/" in tid or "\\" in tid or tid in (".", ".."):
            return "Task ID is invalid"
        if (fw.framework_id, tid) in self._tasks:
            return f"Task has duplicate ID: {tid}"
        aid = (ti.get("agent_id") or {}).get("value")
        if aid != agent.agent_id:
            return f"Task uses invalid agent {aid} while agent {agent.agent_id} is expected"
        _, _, rerr = res_from_json(ti.get("resources"))
        if rerr:
            return "Task uses invalid resources: " + rerr
        if ("command" in ti) == ("executor" in ti) and "command" not in ti and not ti.get("_group"):
            return "Task should have at least one (but not both) of CommandInfo or ExecutorInfo present"
        return None

    def _launch(self, fw: _Framework, agent: FakeAgent, role: str, tis: list[dict[str, Any]],
                executor: dict[str, Any] | None, remaining: Res) -> Res:
        group = executor is not None
        state_pa = fw.partition_aware
        # injected launch failure
        inj = self._fail_launch.pop(agent.agent_id, None)
        errors: list[str | None] = []
        for ti in tis:
            errors.append(self._validate_task(fw, agent, dict(ti, _group=group)))
        if executor is not None:
            bad = next((i for i, e in enumerate(errors) if e), None)
            if bad is not None:
                bad_id = (tis[bad].get("task_id") or {}).get("value")
                for ti in tis:
                    self._task_error(fw, ti, f"Task '{bad_id}' is invalid: {errors[bad]}", "REASON_TASK_GROUP_INVALID")
                return remaining
            need: Res = {n: 0.0 for n in SCALAR_NAMES}
            need["ports"] = []
            eid = (executor.get("executor_id") or {}).get("value", "")
            orders: list[str] = []
            if (fw.framework_id, eid) not in agent.executors:
                er, eo, _ = res_from_json(executor.get("resources"))
                need = res_add(need, er)
                orders += [n for n in eo if n not in orders]
            for ti in tis:
                r, o, _ = res_from_json(ti.get("resources"))
                need = res_add(need, r)
                orders += [n for n in o if n not in orders]
            if not res_contains(remaining, need):
                msg = (f"Total resources {res_to_text(need, role, orders)} required by task group and its executor "
                       f"is more than available {res_to_text(remaining, role)}")
                for ti in tis:
                    self._task_error(fw, ti, msg, "REASON_TASK_GROUP_INVALID")
                return remaining
            if inj is not None:
                for ti in tis:
                    self._injected_failure(fw, agent, ti, inj, state_pa)
                return remaining
            remaining = res_sub(remaining, need)
            agent.used = res_add(agent.used, need)
            er, _, _ = res_from_json(executor.get("resources"))
            ex = agent.executors.setdefault((fw.framework_id, eid), {"resources": er, "tasks": set()})
            for ti in tis:
                r, _, _ = res_from_json(ti.get("resources"))
                ex["tasks"].add(ti["task_id"]["value"])
                self._start_task(fw, agent, ti, r, eid, eid)
            return remaining
        for ti, e in zip(tis, errors, strict=True):
            if e:
                self._task_error(fw, ti, e, "REASON_TASK_INVALID")
                continue
            r, order, _ = res_from_json(ti.get("resources"))
            if not res_contains(remaining, r):
                msg = (f"Total resources {res_to_text(r, role, order)} required by task and its executor is more "
                       f"than available {res_to_text(remaining, role)}")
                self._task_error(fw, ti, msg, "REASON_TASK_INVALID")
                continue
            if inj is not None:
                self._injected_failure(fw, agent, ti, inj, state_pa)
                continue
            remaining = res_sub(remaining, r)
            agent.used = res_add(agent.used, r)
            tid = ti["task_id"]["value"]
            self._start_task(fw, agent, ti, r, tid, None)
        return remaining

    def _injected_failure(self, fw: _Framework, agent: FakeAgent, ti: dict[str, Any], inj: dict[str, Any],
                          pa: bool) -> None:
        state = inj["state"]
        tid = ti["task_id"]["value"]
        if state == "TASK_ERROR":
            self._task_error(fw, ti, inj["message"] or "Task uses invalid resources: injected by FakeMaster",
                             inj["reason"] or "REASON_TASK_INVALID")
        elif state in ("TASK_DROPPED", "TASK_LOST"):
            st = self._status_base(tid, "TASK_DROPPED" if pa else "TASK_LOST",
                                   inj["message"] or f"Agent {agent.hostname} disconnected",
                                   inj["reason"] or "REASON_AGENT_DISCONNECTED", agent.agent_id)
            self._send(fw, {"type": "UPDATE", "update": {"status": st}})
        else:  # agent-side failure, reliable
            t = self._start_task(fw, agent, ti, {n: 0.0 for n in SCALAR_NAMES} | {"ports": []}, tid, None,
                                 run=False)
            self._task_terminal(t, state, inj["message"] or "Failed to launch container: injected by FakeMaster",
                                inj["reason"] or "REASON_CONTAINER_LAUNCH_FAILED", source="SOURCE_AGENT")

    def _start_task(self, fw: _Framework, agent: FakeAgent, ti: dict[str, Any], r: Res, eid: str,
                    group: str | None, run: bool = True) -> _Task:
        tid = ti["task_id"]["value"]
        t = _Task(tid, fw.framework_id, agent.agent_id, eid, r, ti, str(uuid.uuid4()),  # type: ignore[arg-type]
                  1000 + (hash(tid) % 60000), group_executor=group)
        self._tasks[(fw.framework_id, tid)] = t
        if not run:
            return t

        def starting() -> None:
            if t.agent_state != "TASK_STAGING":
                return
            self._reliable(t, "TASK_STARTING", None, None)
            self._reliable(t, "TASK_RUNNING", None, None)
            if self.task_runtime is not None:
                rt = self.task_runtime(ti)
                if rt is not None:
                    t.finish_at = time.monotonic() + rt

        self._after(self.launch_delay, starting)
        return t

    # ------------------------------------------------------------------ status updates
    def _status_base(self, tid: str, state: str, message: str | None, reason: str | None,
                     agent_id: str | None) -> dict[str, Any]:
        st: dict[str, Any] = {"task_id": {"value": tid}, "state": state}
        if message is not None:
            st["message"] = message
        st["source"] = "SOURCE_MASTER"
        if reason is not None:
            st["reason"] = reason
        if agent_id is not None:
            st["agent_id"] = {"value": agent_id}
        st["timestamp"] = time.time()
        return st

    def _container_status(self, t: _Task) -> dict[str, Any]:
        a = self._agent(t.agent_id)
        ip = a.ip if a else "127.0.0.1"
        return {"container_id": {"value": t.container_id},
                "network_infos": [{"ip_addresses": [{"protocol": "IPv4", "ip_address": ip}]}],
                "executor_pid": t.executor_pid}

    def _master_update(self, t: _Task, state: str, reason: str, message: str, *, remove: bool = False,
                       container: bool = False, extra: dict[str, Any] | None = None) -> None:
        st = self._status_base(t.task_id, state, message, reason, t.agent_id)
        if extra:
            st.update(extra)
        if container:
            st["container_status"] = self._container_status(t)
        t.state = state
        fw = self._frameworks.get(t.framework_id)
        if fw is not None:
            self._send(fw, {"type": "UPDATE", "update": {"status": st}})
        if remove:
            self._tasks.pop((t.framework_id, t.task_id), None)

    def _reliable(self, t: _Task, state: str, message: str | None, reason: str | None,
                  source: str = "SOURCE_EXECUTOR") -> None:
        st: dict[str, Any] = {"task_id": {"value": t.task_id}, "state": state}
        if message is not None:
            st["message"] = message
        st["source"] = source
        if reason is not None:
            st["reason"] = reason
        st["agent_id"] = {"value": t.agent_id}
        st["executor_id"] = {"value": t.executor_id}
        st["timestamp"] = time.time()
        st["uuid"] = _b64uuid()
        st["container_status"] = self._container_status(t)
        t.agent_state = state
        t.pending.append(st)
        if len(t.pending) == 1:
            t.retry_backoff = 0.0
            self._deliver_head(t, retry=False)

    def _deliver_head(self, t: _Task, retry: bool) -> None:
        if not t.pending:
            return
        head = t.pending[0]
        if retry:
            t.retry_backoff = min(max(t.retry_backoff * 2, self.update_retry_interval), self.update_retry_max)
        else:
            t.retry_backoff = self.update_retry_interval
        t.next_retry = time.monotonic() + t.retry_backoff
        t.delivered_head = True
        if not t.unreachable:
            t.state = head["state"]
        fw = self._frameworks.get(t.framework_id)
        if fw is not None:
            self._send(fw, {"type": "UPDATE", "update": {"status": head}})

    def _task_terminal(self, t: _Task, state: str, message: str | None, reason: str | None,
                       source: str = "SOURCE_EXECUTOR") -> None:
        a = self._agent(t.agent_id)
        self._reliable(t, state, message, reason, source)
        if a is not None:
            a.used = res_sub(a.used, t.resources)
            self._maybe_executor_exit(a, t)

    def _kill_on_agent(self, t: _Task, silent: bool) -> None:
        """Task dies on the agent without any update reaching the scheduler."""
        if t.agent_state in TERMINAL_STATES:
            return
        t.agent_state = "TASK_KILLED"
        t.pending.clear()
        a = self._agent(t.agent_id)
        if a is not None:
            a.used = res_sub(a.used, t.resources)
            self._maybe_executor_exit(a, t, notify=not silent)

    def _maybe_executor_exit(self, a: FakeAgent, t: _Task, notify: bool = True) -> None:
        if not t.group_executor:
            return
        key = (t.framework_id, t.group_executor)
        ex = a.executors.get(key)
        if ex is None:
            return
        members = [self._tasks.get((t.framework_id, x)) for x in ex["tasks"]]
        if any(m is not None and m.agent_state not in TERMINAL_STATES for m in members):
            return
        del a.executors[key]
        a.used = res_sub(a.used, ex["resources"])
        if not notify:
            return
        ok = all(m is None or m.agent_state == "TASK_FINISHED" for m in members)

        def failure() -> None:
            fw = self._frameworks.get(t.framework_id)
            if fw is not None:
                self._send(fw, {"type": "FAILURE", "failure": {
                    "agent_id": {"value": a.agent_id}, "executor_id": {"value": t.group_executor},
                    "status": 0 if ok else 9}})

        self._after(self.executor_exit_delay, failure)

    def _find_task(self, task_id: str) -> _Task | None:
        for t in self._tasks.values():
            if t.task_id == task_id:
                return t
        return None


# --------------------------------------------------------------------------------------------------------------
# Tiny client for tests (http.client, RecordIO parsed as bytes)
# --------------------------------------------------------------------------------------------------------------


class Subscription:
    """An open SUBSCRIBE stream. Iterate for events (dicts; protobuf payloads as bytes).

    A daemon thread reads the chunked body (http.client de-chunks it) and splits RecordIO records as bytes;
    ``next_event(timeout)`` raises TimeoutError without breaking the stream; iteration stops at end of stream
    (``eof_clean`` tells a terminating chunk from a broken connection)."""

    def __init__(self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse) -> None:
        self.conn = conn
        self.resp = resp
        self.status = resp.status
        self.reason = resp.reason
        self.headers = resp.getheaders()
        self.stream_id = resp.getheader("Mesos-Stream-Id")
        self.content_type = resp.getheader("Content-Type")
        self.body = b"" if resp.status == 200 else resp.read()
        self.eof = False
        self.eof_clean = False
        self._q: queue.Queue[Any] = queue.Queue()
        self._done = resp.status != 200
        if not self._done:
            if conn.sock is not None:
                conn.sock.settimeout(None)
            threading.Thread(target=self._reader, daemon=True, name="mesos-sub-reader").start()

    def _reader(self) -> None:
        buf = bytearray()
        clean = False
        try:
            while True:
                data = self.resp.read1(65536)
                if not data:
                    clean = True
                    break
                buf += data
                while (nl := buf.find(b"\n")) >= 0:
                    n = int(buf[:nl])
                    if len(buf) < nl + 1 + n:
                        break
                    self._q.put(bytes(buf[nl + 1:nl + 1 + n]))
                    del buf[:nl + 1 + n]
        except Exception:
            clean = False
        self._q.put(("eof", clean))

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        return self.next_event()

    def next_event(self, timeout: float | None = None) -> Any:
        if self._done:
            raise StopIteration
        try:
            item = self._q.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError("no event within timeout") from None
        if isinstance(item, tuple):
            self._done = True
            self.eof = True
            self.eof_clean = item[1]
            raise StopIteration
        return json.loads(item) if self.content_type == "application/json" else item

    def wait_for(self, pred: Callable[[dict[str, Any]], bool], timeout: float = 5.0) -> dict[str, Any]:
        """Read events until ``pred(event)``; raises TimeoutError (or StopIteration on EOF)."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no matching event")
            try:
                ev = self.next_event(timeout=left)
            except TimeoutError:
                raise
            except OSError as e:
                raise TimeoutError(str(e)) from e
            if pred(ev):
                return ev

    def close(self) -> None:
        with contextlib.suppress(Exception):
            if self.conn.sock is not None:
                self.conn.sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(Exception):
            self.conn.close()


def _hostport(master_url: str) -> tuple[str, int]:
    u = urlsplit(master_url if "//" in master_url else "http://" + master_url)
    return u.hostname or "127.0.0.1", u.port or 5050


def subscribe(master_url: str, framework_info: dict[str, Any] | None = None, *, call: dict[str, Any] | None = None,
              headers: dict[str, str] | None = None, timeout: float | None = 10.0,
              suppressed_roles: list[str] | None = None, default_headers: bool = True) -> Subscription:
    """POST a SUBSCRIBE; returns a Subscription (check .status; iterate for events)."""
    if call is None:
        assert framework_info is not None
        call = {"type": "SUBSCRIBE", "subscribe": {"framework_info": framework_info}}
        if framework_info.get("id"):
            call["framework_id"] = framework_info["id"]
        if suppressed_roles is not None:
            call["subscribe"]["suppressed_roles"] = suppressed_roles
    host, port = _hostport(master_url)
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    h = {"Content-Type": "application/json", "Accept": "application/json"} if default_headers else {}
    h.update(headers or {})
    conn.request("POST", SCHEDULER_PATH, body=json.dumps(call).encode(), headers=h)
    return Subscription(conn, conn.getresponse())


@dataclass
class CallResult:
    status: int
    reason: str
    headers: list[tuple[str, str]]
    body: str

    def header(self, name: str) -> str | None:
        for k, v in self.headers:
            if k.lower() == name.lower():
                return v
        return None


def send_call(master_url: str, body: Any = None, *, stream_id: str | None = None, method: str = "POST",
              headers: dict[str, str] | None = None, raw: bytes | None = None, timeout: float = 10.0,
              default_headers: bool = True) -> CallResult:
    """One non-streaming request on a fresh connection."""
    host, port = _hostport(master_url)
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    h: dict[str, str] = {"Content-Type": "application/json", "Accept": "application/json"} if default_headers else {}
    if stream_id is not None:
        h["Mesos-Stream-Id"] = stream_id
    h.update(headers or {})
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    try:
        conn.request(method, SCHEDULER_PATH, body=data, headers=h)
        resp = conn.getresponse()
        return CallResult(resp.status, resp.reason, resp.getheaders(), resp.read().decode())
    finally:
        conn.close()


def framework_info(name: str = "test-fw", *, roles: list[str] | None = None, caps: list[str] | None = None,
                   failover_timeout: float = 300.0, checkpoint: bool = True, **extra: Any) -> dict[str, Any]:
    caps = caps if caps is not None else ["GPU_RESOURCES", "MULTI_ROLE", "PARTITION_AWARE", "TASK_KILLING_STATE"]
    info: dict[str, Any] = {"user": "root", "name": name, "roles": roles or ["*"], "failover_timeout": failover_timeout,
                            "checkpoint": checkpoint, "capabilities": [{"type": c} for c in caps]}
    info.update(extra)
    return info
