"""The streaming HTTP shell against the Mesos master test double: RecordIO, stream ids, 307, 503, auth, watchdog."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from peloton.hostmgr.mesos.transport import MesosCallError, MesosTransport, RecordIODecoder, encode_record
from tests.mesos.fake_master import FakeMaster


# --- RecordIO ----------------------------------------------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(
    payloads=st.lists(st.text(min_size=1, max_size=60).map(lambda s: json.dumps({"t": s}).encode()), max_size=12),
    cuts=st.lists(st.integers(min_value=0, max_value=2000), max_size=30),
)
def test_recordio_decodes_the_same_records_however_the_bytes_are_chunked(payloads: list[bytes],
                                                                          cuts: list[int]) -> None:
    stream = b"".join(encode_record(p) for p in payloads)
    points = sorted({c % (len(stream) + 1) for c in cuts})
    chunks = [stream[a:b] for a, b in zip([0, *points], [*points, len(stream)], strict=True)]
    dec = RecordIODecoder()
    out = [r for c in chunks for r in dec.feed(c)]
    assert out == payloads


def test_recordio_keeps_non_ascii_payloads_intact_and_rejects_a_bad_length() -> None:
    p = json.dumps({"message": "GPU ünïcödé ✓"}, ensure_ascii=False).encode()
    dec = RecordIODecoder()
    data = encode_record(p)
    assert dec.feed(data[:3]) == [] and dec.feed(data[3:]) == [p]
    with pytest.raises(ValueError, match="bad record length"):
        RecordIODecoder().feed(b"12x\n{}")


# --- the shell against the double ------------------------------------------------------------------------
def info() -> dict[str, Any]:
    return {"type": "SUBSCRIBE", "subscribe": {"framework_info": {
        "user": "root", "name": "t", "roles": ["*"], "failover_timeout": 60, "checkpoint": True,
        "capabilities": [{"type": t} for t in ("MULTI_ROLE", "GPU_RESOURCES", "PARTITION_AWARE")]}}}


class Recorder:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.cond = threading.Condition()

    def __call__(self, ev: dict[str, Any]) -> None:
        with self.cond:
            self.events.append(ev)
            self.cond.notify_all()

    def count(self, kind: str) -> int:
        with self.cond:
            return sum(1 for e in self.events if e.get("type") == kind)

    def wait(self, pred: Callable[[], bool], timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while not pred():
            assert time.monotonic() < deadline, [e.get("type") for e in self.events][-20:]
            time.sleep(0.02)


def framework_id(rec: Recorder) -> str:
    subs = [e for e in rec.events if e.get("type") == "SUBSCRIBED"]
    return str(subs[-1]["subscribed"]["framework_id"]["value"])


def test_subscribe_then_calls_carry_the_stream_id(fake_master_factory: Callable[..., FakeMaster]) -> None:
    m = fake_master_factory(chunk_size=7)  # records split across tiny chunks
    rec = Recorder()
    t = MesosTransport([m.url], info, rec)
    t.start()
    try:
        rec.wait(lambda: rec.count("SUBSCRIBED") == 1 and rec.count("OFFERS") >= 1)
        assert t.stream_id
        t.call({"type": "REVIVE", "framework_id": {"value": framework_id(rec)}})
        revive = m.calls_of("REVIVE")[-1]
        assert revive["status"] == 202
        assert revive["headers"].get("Mesos-Stream-Id") == t.stream_id
        assert revive["headers"].get("Content-Type") == "application/json"
        with pytest.raises(MesosCallError) as e:
            t.call({"type": "REVIVE", "framework_id": {"value": "not-ours"}})
        assert e.value.status == 400
    finally:
        t.stop()


def test_basic_auth_is_sent_on_every_request(fake_master_factory: Callable[..., FakeMaster]) -> None:
    m = fake_master_factory(credentials={"peloton": "s3cret"})
    bad = Recorder()
    t_bad = MesosTransport([m.url], info, bad, principal="peloton", secret="wrong", backoff_max_s=0.2)
    t_bad.start()
    time.sleep(0.5)
    t_bad.stop()
    assert bad.count("SUBSCRIBED") == 0
    rec = Recorder()
    t = MesosTransport([m.url], info, rec, principal="peloton", secret="s3cret")
    t.start()
    try:
        rec.wait(lambda: rec.count("SUBSCRIBED") == 1)
        t.call({"type": "SUPPRESS", "framework_id": {"value": framework_id(rec)}})
        assert m.calls_of("SUPPRESS")[-1]["status"] == 202
    finally:
        t.stop()


def test_follows_a_307_to_the_leader_and_retries_503(fake_master_factory: Callable[..., FakeMaster]) -> None:
    leader = fake_master_factory()
    follower = fake_master_factory()
    follower.set_leader(False, leader_url=leader.url)
    leader.set_unavailable(True)
    threading.Timer(0.6, leader.set_unavailable, args=(False,)).start()
    rec = Recorder()
    t = MesosTransport([follower.url], info, rec, backoff_min_s=0.1, backoff_max_s=0.3)
    t.start()
    try:
        rec.wait(lambda: rec.count("SUBSCRIBED") == 1)
        assert t.leader.endswith(str(leader.port))
        assert leader.subscribed_frameworks == [framework_id(rec)]
    finally:
        t.stop()


def test_a_cut_stream_or_silence_makes_it_subscribe_again(fake_master_factory: Callable[..., FakeMaster]) -> None:
    m = fake_master_factory(heartbeat_interval=0.2)
    rec = Recorder()
    calls: list[dict[str, Any]] = []

    def body() -> dict[str, Any]:
        b = info()
        if rec.count("SUBSCRIBED"):  # re-subscribe as the same framework
            fid = framework_id(rec)
            b["framework_id"] = {"value": fid}
            b["subscribe"]["framework_info"]["id"] = {"value": fid}
        calls.append(b)
        return b

    t = MesosTransport([m.url], body, rec, backoff_min_s=0.05, backoff_max_s=0.2)
    t.start()
    try:
        rec.wait(lambda: rec.count("SUBSCRIBED") == 1)
        fid = framework_id(rec)
        m.cut_stream()
        rec.wait(lambda: rec.count("SUBSCRIBED") == 2)
        assert rec.count("DISCONNECTED") >= 1
        m.go_silent()  # no heartbeats, connection open: the watchdog (5 heartbeats) must notice
        t0 = time.monotonic()
        rec.wait(lambda: rec.count("SUBSCRIBED") == 3, timeout=10)
        assert time.monotonic() - t0 < 5
        assert framework_id(rec) == fid
        assert calls[-1]["framework_id"] == {"value": fid}
    finally:
        t.stop()
