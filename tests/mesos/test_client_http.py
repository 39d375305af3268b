"""MesosClient (the HTTP shell) against tiny in-test HTTP masters on 127.0.0.1 streaming chunked RecordIO."""

from __future__ import annotations

import json
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from peloton.hostmgr.mesos.calls import CallError, FrameworkConfig, subscribe
from peloton.hostmgr.mesos.client import MesosCallFailed, MesosClient, MesosHTTPError, NotSubscribedError
from peloton.hostmgr.mesos.events import (
    Disconnected,
    Error,
    Event,
    Heartbeat,
    Offers,
    Subscribed,
    SubscribeRefused,
    Update,
)
from peloton.hostmgr.mesos.recordio import encode
from tests.mesos.transcript_dir import load_transcript

pytestmark = pytest.mark.timeout(30)

JSON = dict[str, Any]


def offers_01() -> JSON:
    """The first OFFERS event the real master sent (recording 01-subscribe)."""
    records = load_transcript("01-subscribe.json")["exchanges"][0]["response"]["stream"]["records"]
    return next(r["event"] for r in records if r.get("event", {}).get("type") == "OFFERS")


def subscribed(fid: str = "fw-1", hb: float = 15.0) -> JSON:
    return {"type": "SUBSCRIBED", "subscribed": {"framework_id": {"value": fid}, "heartbeat_interval_seconds": hb,
                                                 "master_info": {"id": "m", "ip": 16777343, "port": 5050,
                                                                 "address": {"hostname": "m", "ip": "127.0.0.1",
                                                                             "port": 5050}}}}


HEARTBEAT = {"type": "HEARTBEAT"}


class Stream:
    """A SUBSCRIBE answered 200: send `events`, then `then`: "hold" (heartbeats every hb s, plus pushed events),
    "close" (end the body), or "silent" (send nothing, keep the connection open)."""

    def __init__(self, events: list[JSON], then: str = "hold", hb: float = 0.0, stream_id: str = "stream-1") -> None:
        self.events, self.then, self.hb, self.stream_id = events, then, hb, stream_id


class FakeMaster:
    def __init__(self) -> None:
        self.subscribe_plan: list[Any] = []  # Stream | (status, text) | ("redirect", location); last one repeats
        self.call_statuses: list[tuple[int, str]] = []  # popped per call; default 202
        self.hold: dict[str, threading.Event] = {}  # call type -> answered only once set
        self.requests: list[tuple[JSON, dict[str, str], tuple[str, int]]] = []  # as they arrive
        self.applied: list[str] = []  # call types as answered: the order the master applied them in
        self.push: queue.Queue[JSON] = queue.Queue()
        self.stopped = threading.Event()
        self.lock = threading.Lock()
        master = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                n = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(n))
                with master.lock:
                    master.requests.append((body, dict(self.headers.items()), self.client_address))
                if body.get("type") == "SUBSCRIBE":
                    master.subscribe(self)
                else:
                    gate = master.hold.get(str(body.get("type")))
                    if gate is not None:
                        gate.wait(10)
                    with master.lock:
                        master.applied.append(str(body.get("type")))
                    master.answer_call(self)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    # --- request handling ---------------------------------------------------------------------------------------
    def _next_plan(self) -> Any:
        with self.lock:
            return self.subscribe_plan.pop(0) if len(self.subscribe_plan) > 1 else self.subscribe_plan[0]

    @staticmethod
    def _plain(h: BaseHTTPRequestHandler, status: int, text: str, extra: dict[str, str] | None = None) -> None:
        data = text.encode()
        h.send_response(status)
        for k, v in (extra or {}).items():
            h.send_header(k, v)
        if data:
            h.send_header("Content-Type", "text/plain; charset=utf-8")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    def answer_call(self, h: BaseHTTPRequestHandler) -> None:
        with self.lock:
            status, text = self.call_statuses.pop(0) if self.call_statuses else (202, "")
        self._plain(h, status, text)

    def subscribe(self, h: BaseHTTPRequestHandler) -> None:
        plan = self._next_plan()
        if isinstance(plan, tuple) and plan[0] == "redirect":
            self._plain(h, 307, "", {"Location": plan[1]})
            return
        if isinstance(plan, tuple):
            self._plain(h, plan[0], plan[1])
            h.close_connection = True
            return
        assert isinstance(plan, Stream)
        h.close_connection = True
        h.send_response(200)
        h.send_header("Transfer-Encoding", "chunked")
        h.send_header("Mesos-Stream-Id", plan.stream_id)
        h.send_header("Content-Type", "application/json")
        h.end_headers()
        try:
            for ev in plan.events:
                self._write(h, ev)
            if plan.then == "close":
                h.wfile.write(b"0\r\n\r\n")
                h.wfile.flush()
                return
            last = time.monotonic()
            while not self.stopped.is_set():
                try:
                    ev = self.push.get(timeout=0.02)
                    self._write(h, ev)
                except queue.Empty:
                    if plan.then == "hold" and plan.hb and time.monotonic() - last > plan.hb:
                        self._write(h, HEARTBEAT)
                        last = time.monotonic()
                # a closed client connection: stop
                h.connection.settimeout(0.0)
                try:
                    if h.connection.recv(1, socket.MSG_PEEK) == b"":
                        return
                except (BlockingIOError, InterruptedError):
                    pass
                finally:
                    h.connection.settimeout(None)
        except OSError:
            return

    @staticmethod
    def _write(h: BaseHTTPRequestHandler, ev: JSON) -> None:
        """One record, split into 7-byte HTTP chunks (chunk and record boundaries unrelated)."""
        data = encode(json.dumps(ev, separators=(",", ":"), ensure_ascii=False).encode())
        for i in range(0, len(data), 7):
            piece = data[i : i + 7]
            h.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
        h.wfile.flush()

    # --- test helpers -------------------------------------------------------------------------------------------
    def bodies(self, type_: str) -> list[tuple[JSON, dict[str, str], tuple[str, int]]]:
        with self.lock:
            return [r for r in self.requests if r[0].get("type") == type_]

    def stop(self) -> None:
        self.stopped.set()
        self.server.shutdown()
        self.server.server_close()


class Recorder:
    def __init__(self) -> None:
        self.events: list[Event] = []
        self.cond = threading.Condition()

    def __call__(self, ev: Event) -> None:
        with self.cond:
            self.events.append(ev)
            self.cond.notify_all()

    def wait(self, pred: Callable[[list[Event]], bool], timeout: float = 5.0) -> list[Event]:
        with self.cond:
            assert self.cond.wait_for(lambda: pred(self.events), timeout), f"timed out; events: {self.events}"
            return list(self.events)

    def count(self, kind: type) -> int:
        with self.cond:
            return sum(isinstance(e, kind) for e in self.events)


CONFIG = FrameworkConfig(name="peloton-test", user="svc", roles=("*",))


@pytest.fixture
def masters() -> Iterator[Callable[[], FakeMaster]]:
    made: list[FakeMaster] = []

    def make() -> FakeMaster:
        m = FakeMaster()
        made.append(m)
        return m

    yield make
    for m in made:
        m.stop()


@pytest.fixture
def clients() -> Iterator[Callable[..., tuple[MesosClient, Recorder]]]:
    made: list[MesosClient] = []

    def make(urls: list[str], **kw: Any) -> tuple[MesosClient, Recorder]:
        rec = Recorder()
        opts: dict[str, Any] = {"backoff_min_s": 0.01, "backoff_max_s": 0.05, "request_timeout_s": 5.0,
                                "connect_timeout_s": 2.0}
        opts.update(kw)
        c = MesosClient(urls, CONFIG, rec, **opts)
        made.append(c)
        c.start()
        return c, rec

    yield make
    for c in made:
        c.stop()


def n_of(kind: type, n: int = 1) -> Callable[[list[Event]], bool]:
    return lambda evs: sum(isinstance(e, kind) for e in evs) >= n


# --- tests ----------------------------------------------------------------------------------------------------------


def test_subscribe_stream_id_and_calls(masters: Callable[[], FakeMaster], clients: Any) -> None:
    m = masters()
    update = {"type": "UPDATE", "update": {"status": {"task_id": {"value": "t1"}, "state": "TASK_FAILED",
                                                      "message": "ünïcødé ☃ exited with status 3",
                                                      "agent_id": {"value": "S1"}, "uuid": "zIaD0u+PR5aIi30SKZmmxw=="}}}
    m.subscribe_plan = [Stream([subscribed(), HEARTBEAT, offers_01(), update], hb=0.05)]
    c, rec = clients([m.url])
    evs = rec.wait(n_of(Update))
    assert [type(e) for e in evs[:4]] == [Subscribed, Heartbeat, Offers, Update]
    offers = next(e for e in evs if isinstance(e, Offers))
    assert len(offers.offers) == 3 and c.subscribed and c.protocol.stream_id == "stream-1"
    upd = next(e for e in evs if isinstance(e, Update))
    assert upd.status.message.startswith("ünïcødé ☃")

    (sub_body, sub_headers, _), = m.bodies("SUBSCRIBE")
    assert sub_headers["Content-Type"] == "application/json" and sub_headers["Accept"] == "application/json"
    assert "Mesos-Stream-Id" not in sub_headers and "Authorization" not in sub_headers
    assert sub_body == subscribe(CONFIG, None)

    ack = c.protocol.acknowledge_update(upd.status)
    assert ack is not None
    assert c.call(ack) == (202, "")
    assert c.call(c.protocol.decline([offers.offers[0].id], 1)) == (202, "")
    calls = [r for r in m.requests if r[0]["type"] != "SUBSCRIBE"]
    assert [b["type"] for b, _, _ in calls] == ["ACKNOWLEDGE", "DECLINE"]
    for body, headers, _ in calls:
        assert headers["Mesos-Stream-Id"] == "stream-1" and headers["Content-Type"] == "application/json"
        assert body["framework_id"] == {"value": "fw-1"}
    assert calls[0][2] != calls[1][2]  # two lanes (acks, offers): a connection each

    m.call_statuses = [(400, "Framework cannot be found")]
    with pytest.raises(MesosHTTPError) as err:
        c.call(c.protocol.revive())
    assert err.value.status == 400 and "Framework cannot be found" in err.value.text

    m.call_statuses = [(503, "Master has not finished recovery"), (503, "again"), (202, "")]
    before = len(m.requests)
    assert c.call(c.protocol.suppress())[0] == 202
    assert len(m.requests) - before == 3
    offer_lane = {addr for b, _, addr in m.requests if b["type"] in ("DECLINE", "REVIVE", "SUPPRESS")}
    assert len(offer_lane) == 1  # one keep-alive connection per lane

    with pytest.raises(CallError):
        c.call({"type": "UNKNOWN", "framework_id": {"value": "fw-1"}})  # would crash a real master
    with pytest.raises(CallError):
        c.call(c.protocol.subscribe_call())


def _in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """Run fn in a thread of its own; its result or exception lands in the list."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(fn())
        except Exception as e:  # noqa: BLE001 - the test looks at it
            out.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def _until(pred: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 5
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def _queued(c: MesosClient, lane: str, n: int) -> Callable[[], bool]:
    """n calls made and waiting on `lane` (behind the one on the wire)."""
    lanes = getattr(c, "_lanes", {})
    return lambda: lane in lanes and lanes[lane].calls.qsize() == n


def test_a_slow_call_holds_up_only_the_calls_that_must_follow_it(masters: Callable[[], FakeMaster],
                                                                 clients: Any) -> None:
    """No lock is held while a call is on the wire: an ACCEPT the master is slow to answer does not stop other
    threads' RECONCILE and ACKNOWLEDGE (other lanes), while the DECLINE, REVIVE and SUPPRESS made after it, from
    other threads, wait for it and reach the master in the order they were made. With a pool of concurrent
    connections the master applied them before the ACCEPT, and the REVIVE before the DECLINE's filter."""
    m = masters()
    m.subscribe_plan = [Stream([subscribed()])]
    c, rec = clients([m.url])
    rec.wait(n_of(Subscribed))
    m.hold["ACCEPT"] = threading.Event()
    slow, slow_out = _in_thread(lambda: c.call(c.protocol.accept(["o1"], [], 5.0)))
    _until(lambda: bool(m.bodies("ACCEPT")), "the ACCEPT on the wire")
    waiting = []
    for body in (c.protocol.decline(["o2"], 30.0), c.protocol.revive(), c.protocol.suppress()):
        waiting.append(_in_thread(lambda body=body: c.call(body)))  # type: ignore[misc]
        _until(_queued(c, "offers", len(waiting)), f"{body['type']} queued")
    # other lanes go on meanwhile
    assert c.call(c.protocol.reconcile([])) == (202, "")
    assert c.call(c.protocol.acknowledge("S1", "t1", "zIaD0u+PR5aIi30SKZmmxw==")) == (202, "")
    assert not slow_out and not any(out for _, out in waiting)
    assert m.applied == ["RECONCILE", "ACKNOWLEDGE"]
    m.hold["ACCEPT"].set()
    for t, _ in [(slow, slow_out), *waiting]:
        t.join(5)
    assert slow_out == [(202, "")] and [out for _, out in waiting] == [[(202, "")]] * 3
    assert m.applied[2:] == ["ACCEPT", "DECLINE", "REVIVE", "SUPPRESS"]  # the order they were made in


def test_suppress_then_revive_from_two_threads_reach_the_master_in_that_order(
        masters: Callable[[], FakeMaster], clients: Any) -> None:
    """The trap of shared/mesos-api.md §3: a REVIVE made after a SUPPRESS but applied before it leaves the
    framework suppressed (no offer again). The REVIVE waits for the SUPPRESS's answer, however slow."""
    m = masters()
    m.subscribe_plan = [Stream([subscribed()])]
    c, rec = clients([m.url])
    rec.wait(n_of(Subscribed))
    m.hold["SUPPRESS"] = threading.Event()
    t1, out1 = _in_thread(lambda: c.call(c.protocol.suppress()))
    _until(lambda: bool(m.bodies("SUPPRESS")), "the SUPPRESS on the wire")
    t2, out2 = _in_thread(lambda: c.call(c.protocol.revive()))
    _until(lambda: _queued(c, "offers", 1)() or bool(m.bodies("REVIVE")), "the REVIVE made")
    assert not m.bodies("REVIVE")  # not sent while the SUPPRESS is unanswered
    m.hold["SUPPRESS"].set()
    t1.join(5)
    t2.join(5)
    assert out1 == out2 == [(202, "")]
    assert m.applied == ["SUPPRESS", "REVIVE"]


def test_a_call_waiting_when_its_subscription_ends_is_not_sent_on_the_next(masters: Callable[[], FakeMaster],
                                                                            clients: Any) -> None:
    """A call is sent on the subscription it was made on or not at all: a SUPPRESS queued behind a slow ACCEPT
    while the stream was replaced would suppress the new subscription, which the backend believes unsuppressed
    (a SUBSCRIBE lifts suppression), and no offer would come again."""
    m = masters()
    m.subscribe_plan = [Stream([subscribed()], stream_id="stream-1"), Stream([subscribed()], stream_id="stream-2")]
    c, rec = clients([m.url])
    rec.wait(n_of(Subscribed))
    m.hold["ACCEPT"] = threading.Event()
    t1, out1 = _in_thread(lambda: c.call(c.protocol.accept(["o1"], [])))
    _until(lambda: bool(m.bodies("ACCEPT")), "the ACCEPT on the wire")
    t2, out2 = _in_thread(lambda: c.call(c.protocol.suppress()))
    _until(_queued(c, "offers", 1), "the SUPPRESS queued")
    m.push.put({"type": "ERROR", "error": {"message": "a transient error"}})  # the stream ends: re-subscribe
    rec.wait(n_of(Subscribed, 2))
    _until(lambda: c.protocol.stream_id == "stream-2", "the new stream")
    m.hold["ACCEPT"].set()
    t1.join(5)
    t2.join(5)
    assert out1 == [(202, "")]
    assert isinstance(out2[0], NotSubscribedError) and "ended before it was sent" in str(out2[0])
    assert not m.bodies("SUPPRESS")
    assert c.call(c.protocol.suppress()) == (202, "")  # made on the new one: sent
    assert m.bodies("SUPPRESS")[0][1]["Mesos-Stream-Id"] == "stream-2"


def test_stop_fails_the_calls_not_answered_and_does_not_wait_for_them(masters: Callable[[], FakeMaster],
                                                                        clients: Any) -> None:
    m = masters()
    m.subscribe_plan = [Stream([subscribed()])]
    c, rec = clients([m.url])
    rec.wait(n_of(Subscribed))
    m.hold["ACCEPT"] = threading.Event()  # never set: the master never answers
    t1, out1 = _in_thread(lambda: c.call(c.protocol.accept(["o1"], [])))
    _until(lambda: bool(m.bodies("ACCEPT")), "the ACCEPT on the wire")
    t2, out2 = _in_thread(lambda: c.call(c.protocol.kill("t1", "S1")))
    _until(_queued(c, "offers", 1), "the KILL queued")
    c.stop(timeout_s=5)
    t1.join(5)
    t2.join(5)
    assert isinstance(out1[0], MesosCallFailed)  # on the wire: outcome unknown
    assert isinstance(out2[0], MesosCallFailed) and "stopped" in str(out2[0])
    assert not m.bodies("KILL")
    assert not [t for t in threading.enumerate() if t.name.startswith("mesos-call-")]
    with pytest.raises((MesosCallFailed, NotSubscribedError)):  # stopped (and the stream closed)
        c.call(c.protocol.revive())
    m.hold["ACCEPT"].set()


def test_call_before_subscribing(clients: Any) -> None:
    c, _ = clients(["http://127.0.0.1:9"])  # nothing listens there
    with pytest.raises(NotSubscribedError):
        c.call({"type": "REVIVE", "framework_id": {"value": "f"}})


def test_redirect_with_protocol_relative_location(masters: Callable[[], FakeMaster], clients: Any) -> None:
    follower, leader = masters(), masters()
    follower.subscribe_plan = [("redirect", f"//127.0.0.1:{leader.port}/api/v1/scheduler")]
    leader.subscribe_plan = [Stream([subscribed()])]
    c, rec = clients([follower.url])
    rec.wait(n_of(Subscribed))
    assert c.leader == leader.url
    assert c.call(c.protocol.revive()) == (202, "")
    assert leader.bodies("REVIVE") and not follower.bodies("REVIVE")


def test_503_then_success_and_dead_masters_in_turn(masters: Callable[[], FakeMaster], clients: Any) -> None:
    m = masters()
    m.subscribe_plan = [(503, "Master has not finished recovery"), Stream([subscribed()])]
    dead = "http://127.0.0.1:9"
    c, rec = clients([dead, m.url])
    evs = rec.wait(n_of(Subscribed))
    refused = [e for e in evs if isinstance(e, SubscribeRefused)]
    assert any(e.status == 0 and e.master == dead for e in refused)
    assert any(e.status == 503 and "recovery" in e.text for e in refused)
    assert c.leader == m.url


def test_basic_auth_on_every_request(masters: Callable[[], FakeMaster], clients: Any) -> None:
    m = masters()
    m.subscribe_plan = [Stream([subscribed()])]
    c, rec = clients([m.url], principal="p", secret="s")
    rec.wait(n_of(Subscribed))
    c.call(c.protocol.revive(["*"]))
    assert {h.get("Authorization") for _, h, _ in m.requests} == {"Basic cDpz"}


def test_resubscribe_after_the_master_closes_the_stream(masters: Callable[[], FakeMaster], clients: Any) -> None:
    m = masters()
    m.subscribe_plan = [Stream([subscribed("fw-7"), HEARTBEAT], then="close"),
                        Stream([subscribed("fw-7")], stream_id="stream-2")]
    c, rec = clients([m.url])
    evs = rec.wait(n_of(Subscribed, 2))
    kinds = [type(e) for e in evs]
    assert kinds.index(Disconnected) > kinds.index(Subscribed)
    dis = next(e for e in evs if isinstance(e, Disconnected))
    assert dis.will_retry and "EOF" in dis.reason
    first, second = m.bodies("SUBSCRIBE")[:2]
    assert "framework_id" not in first[0]
    assert second[0]["framework_id"] == {"value": "fw-7"} == second[0]["subscribe"]["framework_info"]["id"]
    assert c.protocol.stream_id == "stream-2"


def test_silence_triggers_the_watchdog(masters: Callable[[], FakeMaster], clients: Any) -> None:
    m = masters()
    m.subscribe_plan = [Stream([subscribed(hb=0.2)], then="silent"), Stream([subscribed(hb=0.2)], hb=0.05)]
    t0 = time.monotonic()
    c, rec = clients([m.url], heartbeat_miss_factor=2.0)
    evs = rec.wait(n_of(Subscribed, 2))
    dis = next(e for e in evs if isinstance(e, Disconnected))
    assert "no event" in dis.reason or "no complete event" in dis.reason
    assert time.monotonic() - t0 > 0.35  # after the missed heartbeats (2 x 0.2 s), not before
    time.sleep(0.6)  # heartbeats keep the second stream alive
    assert rec.count(Disconnected) == 1 and c.subscribed


def test_a_process_that_does_not_lead_never_subscribes_until_it_leads_again(
        masters: Callable[[], FakeMaster], clients: Any) -> None:
    """A replaced leader whose stream ended (its network came back) must not SUBSCRIBE: that would fail the new
    leader's subscription over. It subscribes again once it leads and is resumed."""
    m = masters()
    m.subscribe_plan = [Stream([subscribed("fw-3", hb=0.3)], then="silent"), Stream([subscribed("fw-3")])]
    leads = threading.Event()
    leads.set()
    c, rec = clients([m.url], may_subscribe=leads.is_set, heartbeat_miss_factor=2.0)
    rec.wait(n_of(Subscribed))
    leads.clear()  # replaced while the stream was up; then the stream goes silent and is given up (0.6 s)
    rec.wait(n_of(Disconnected))
    time.sleep(0.5)  # many backoff periods
    assert len(m.bodies("SUBSCRIBE")) == 1 and not c.subscribed
    leads.set()
    c.resume()
    rec.wait(n_of(Subscribed, 2))
    assert m.bodies("SUBSCRIBE")[1][0]["framework_id"] == {"value": "fw-3"}


def test_fatal_error_stops_resubscribing_until_resume(masters: Callable[[], FakeMaster], clients: Any) -> None:
    m = masters()
    m.subscribe_plan = [Stream([subscribed(), {"type": "ERROR", "error": {"message": "Framework failed over"}}]),
                        Stream([subscribed()])]
    c, rec = clients([m.url])
    evs = rec.wait(n_of(Disconnected))
    assert any(isinstance(e, Error) and e.failed_over for e in evs)
    assert not next(e for e in evs if isinstance(e, Disconnected)).will_retry
    time.sleep(0.3)
    assert len(m.bodies("SUBSCRIBE")) == 1 and not c.subscribed
    c.resume()
    rec.wait(n_of(Subscribed, 2))
    assert len(m.bodies("SUBSCRIBE")) == 2


def test_pushed_events_and_stop(masters: Callable[[], FakeMaster], clients: Any) -> None:
    m = masters()
    m.subscribe_plan = [Stream([subscribed(hb=3600)])]  # no event comes to end a read that stop would wait for
    c, rec = clients([m.url])
    rec.wait(n_of(Subscribed))
    m.push.put({"type": "RESCIND", "rescind": {"offer_id": {"value": "O1"}}})
    m.push.put({"type": "SOMETHING_NEW"})
    rec.wait(lambda evs: len(evs) >= 3)
    stopping = threading.Thread(target=c.stop)
    stopping.start()
    stopping.join(30)
    assert not stopping.is_alive(), "stop waited for the stream's next event"
    assert c._thread is not None and not c._thread.is_alive()
    assert not any(isinstance(e, Disconnected) and e.will_retry for e in rec.events)


def test_a_failing_handler_does_not_kill_the_stream(masters: Callable[[], FakeMaster]) -> None:
    """... and each failure is counted (an event lost: its alert must hear of it, not only the log)."""
    from prometheus_client import REGISTRY

    def errors() -> float:
        return REGISTRY.get_sample_value("peloton_loop_errors_total", {"loop": "mesos-subscription"}) or 0.0

    before = errors()
    m = masters()
    m.subscribe_plan = [Stream([subscribed(), HEARTBEAT, HEARTBEAT])]
    seen: list[Event] = []

    def handler(ev: Event) -> None:
        seen.append(ev)
        raise RuntimeError("boom")

    c = MesosClient([m.url], CONFIG, handler, backoff_min_s=0.01)
    c.start()
    try:
        deadline = time.monotonic() + 5
        while len(seen) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert [type(e) for e in seen[:3]] == [Subscribed, Heartbeat, Heartbeat]
        assert len(m.bodies("SUBSCRIBE")) == 1
        assert errors() - before >= 3
    finally:
        c.stop()


def test_an_unexpected_error_reading_the_stream_ends_it_as_any_end_does(
        masters: Callable[[], FakeMaster], clients: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """An error that is not the stream's own (a bug in decoding it, a library's surprise) was reported as a refused
    SUBSCRIBE only: the backend never heard that the stream had ended, and kept its offers of the dead stream and
    said it was connected (`peloton_mesos_connected` 1), until a new subscription came, if one did. It ends the
    stream as any end does (Disconnected), is logged whole and counted, and the client subscribes again."""
    from prometheus_client import REGISTRY

    from peloton.hostmgr.mesos import client as client_mod

    def errors() -> float:
        return REGISTRY.get_sample_value("peloton_loop_errors_total", {"loop": "mesos-subscription"}) or 0.0

    armed = threading.Event()

    class Surprising(client_mod.RecordIODecoder):
        def feed(self, data: bytes) -> list[bytes]:
            if armed.is_set():
                armed.clear()
                raise RuntimeError("surprise")
            return super().feed(data)

    monkeypatch.setattr(client_mod, "RecordIODecoder", Surprising)
    m = masters()
    m.subscribe_plan = [Stream([subscribed()], hb=0.05), Stream([subscribed()], hb=0.05, stream_id="stream-2")]
    before = errors()
    c, rec = clients([m.url])
    rec.wait(n_of(Subscribed))
    armed.set()  # the next bytes of the stream (a heartbeat)
    evs = rec.wait(n_of(Subscribed, 2))
    kinds = [type(e) for e in evs]
    first, second = (i for i, k in enumerate(kinds) if k is Subscribed)
    dis = [e for e in evs[first:second] if isinstance(e, Disconnected)]
    assert len(dis) == 1 and dis[0].will_retry and "surprise" in dis[0].reason, kinds
    assert not any(isinstance(e, SubscribeRefused) for e in evs)
    assert c.protocol.stream_id == "stream-2" and c.subscribed
    assert errors() - before == 1
