"""The sans-IO Mesos protocol core, checked against the recordings of a real master (tests/mesos/transcripts/)."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from peloton.domain.resources import Resources
from peloton.domain.states import TaskState
from peloton.hostmgr.mesos import calls
from peloton.hostmgr.mesos.calls import CALL_TYPES, CallError, FrameworkConfig
from peloton.hostmgr.mesos.protocol import (
    CALL_503_BACKOFF,
    CALL_LANES,
    Error,
    Failure,
    Heartbeat,
    MesosTaskStatus,
    Offers,
    Rescind,
    SchedulerProtocol,
    Subscribed,
    Unknown,
    Update,
    UpdateOperationStatus,
    call_lane,
    exit_code,
    failure_exit_code,
    is_terminal,
    master_base,
    mesos_state_to_task_state,
    offers_to_host_offer,
    parse_offer,
    redirect_base,
    validate_call,
)
from peloton.retry import Backoff
from tests.mesos.transcript_dir import load_transcript, transcript_files

JSON = dict[str, Any]
load = load_transcript


def all_exchanges() -> Iterator[tuple[str, JSON]]:
    for path in transcript_files():  # fails the test when there are none
        with open(path) as f:
            for ex in json.load(f)["exchanges"]:
                yield path.name, ex


def accepted_calls(type_: str) -> list[tuple[str, JSON]]:
    """(label, body) of every recorded call of this type that the master accepted (2xx)."""
    out = []
    for name, ex in all_exchanges():
        body = ex["request"].get("body")
        if isinstance(body, dict) and body.get("type") == type_ and 200 <= ex["response"].get("status", 0) < 300:
            out.append((f"{name}:{ex['label']}", body))
    return out


def recorded_events() -> list[tuple[str, JSON]]:
    out = []
    for name, ex in all_exchanges():
        stream = ex["response"].get("stream") or {}
        for r in stream.get("records", []):
            if "event" in r:
                out.append((name, r["event"]))
    return out


def fid_of(body: JSON) -> str:
    return str(body["framework_id"]["value"])


def proto_for(fid: str | None = "fw-1", **kw: Any) -> SchedulerProtocol:
    return SchedulerProtocol(FrameworkConfig(name="peloton", user="svc", **kw), framework_id=fid)


# --- SUBSCRIBE ----------------------------------------------------------------------------------------------------


def _config_from(info: JSON, suppressed: list[str]) -> FrameworkConfig:
    return FrameworkConfig(
        name=info["name"], user=info["user"], roles=tuple(info.get("roles", [info.get("role", "*")])),
        principal=info.get("principal"), failover_timeout_s=info["failover_timeout"],
        checkpoint=info.get("checkpoint", False), capabilities=tuple(c["type"] for c in info.get("capabilities", [])),
        suppressed_roles=tuple(suppressed),
    )


def test_subscribe_call_equals_every_recorded_successful_subscribe() -> None:
    checked = with_id = 0
    for name, ex in all_exchanges():
        body = ex["request"].get("body")
        if not isinstance(body, dict) or body.get("type") != "SUBSCRIBE" or ex["response"].get("status") != 200:
            continue
        first = ex["response"]["stream"]["records"][0].get("event", {})
        if first.get("type") != "SUBSCRIBED":
            continue
        info = body["subscribe"]["framework_info"]
        if info.get("failover_timeout", -1) < 0 or "role" in info or "checkpoint" not in info:
            continue
        p = SchedulerProtocol(_config_from(info, body["subscribe"].get("suppressed_roles", [])),
                              framework_id=info.get("id", {}).get("value"))
        assert p.subscribe_call() == body, f"{name}:{ex['label']}"
        checked += 1
        with_id += "framework_id" in body
    assert checked >= 20 and with_id >= 2


def test_subscribe_with_and_without_framework_id() -> None:
    p = proto_for(None, roles=("gpu",), principal="svc", hostname="sched-1", webui_url="http://s:8080/")
    body = p.subscribe_call()
    assert "framework_id" not in body and "id" not in body["subscribe"]["framework_info"]
    info = body["subscribe"]["framework_info"]
    assert info["failover_timeout"] == 604800.0 and info["checkpoint"] is True
    assert info["roles"] == ["gpu"] and "role" not in info
    assert [c["type"] for c in info["capabilities"]] == ["GPU_RESOURCES", "MULTI_ROLE", "PARTITION_AWARE",
                                                         "TASK_KILLING_STATE"]
    assert info["principal"] == "svc" and info["hostname"] == "sched-1" and info["webui_url"] == "http://s:8080/"
    p.framework_id = "fw-9"  # e.g. loaded from the store
    body = p.subscribe_call()
    assert body["framework_id"] == {"value": "fw-9"} == body["subscribe"]["framework_info"]["id"]
    assert json.loads(json.dumps(body)) == body


def test_framework_config_rules() -> None:
    single = FrameworkConfig(name="n", user="u", roles=("gpu",), capabilities=("GPU_RESOURCES",))
    info = single.framework_info()
    assert info["role"] == "gpu" and "roles" not in info  # roles needs MULTI_ROLE
    with pytest.raises(CallError):
        FrameworkConfig(name="n", user="u", roles=("a", "b"), capabilities=("GPU_RESOURCES",))
    with pytest.raises(CallError):
        FrameworkConfig(name="n", user="u", roles=("a", "a"))
    with pytest.raises(CallError):
        FrameworkConfig(name="", user="u")
    with pytest.raises(CallError):
        FrameworkConfig(name="n", user="u", failover_timeout_s=1e300)
    cfg = FrameworkConfig(name="n", user="u", roles=("*", "ml"), suppressed_roles=("*",))
    assert calls.subscribe(cfg, None)["subscribe"]["suppressed_roles"] == ["*"]


# --- call builders vs the recorded bodies -------------------------------------------------------------------------


def _rebuild_task(t: JSON) -> JSON:
    scalars = {r["name"]: r["scalar"]["value"] for r in t["resources"] if r["type"] == "SCALAR"}
    role = t["resources"][0]["allocation_info"]["role"]
    resources = calls.task_resources(scalars["cpus"], scalars["mem"], scalars.get("disk", 0), scalars.get("gpus", 0),
                                     role=role)
    return calls.task_info(t["task_id"]["value"], t["agent_id"]["value"], resources, t["command"]["value"],
                           name=t["name"])


def _rebuildable(t: JSON) -> bool:
    return all("allocation_info" in r for r in t["resources"]) and all(
        float(r["scalar"]["value"]).is_integer() for r in t["resources"] if r["name"] == "gpus")


def test_accept_launch_equals_recorded_bodies() -> None:
    checked = 0
    for label, body in accepted_calls("ACCEPT"):
        acc = body["accept"]
        ops = acc["operations"]
        if not all(op["type"] == "LAUNCH" and "id" not in op for op in ops):
            continue
        if not all(_rebuildable(t) for op in ops for t in op["launch"]["task_infos"]):
            continue
        rebuilt = calls.accept(fid_of(body), [o["value"] for o in acc["offer_ids"]],
                               [calls.launch([_rebuild_task(t) for t in op["launch"]["task_infos"]]) for op in ops],
                               acc.get("filters", {}).get("refuse_seconds"))
        assert rebuilt == body, label
        checked += 1
    assert checked >= 15


@pytest.mark.parametrize("type_", ["DECLINE", "KILL", "ACKNOWLEDGE", "RECONCILE", "REVIVE", "SUPPRESS", "TEARDOWN",
                                   "SHUTDOWN"])
def test_simple_calls_equal_recorded_bodies(type_: str) -> None:
    checked = 0
    for label, body in accepted_calls(type_):
        p = SchedulerProtocol(FrameworkConfig(name="n", user="root"), framework_id=fid_of(body))
        payload: Any = body.get(type_.lower())
        if type_ == "DECLINE":
            rebuilt = p.decline([o["value"] for o in payload["offer_ids"]],
                                payload.get("filters", {}).get("refuse_seconds"))
        elif type_ == "KILL":
            rebuilt = p.kill(payload["task_id"]["value"], payload.get("agent_id", {}).get("value"))
        elif type_ == "ACKNOWLEDGE":
            rebuilt = p.acknowledge(payload["agent_id"]["value"], payload["task_id"]["value"], payload["uuid"])
        elif type_ == "RECONCILE":
            tasks = payload.get("tasks", [])
            rebuilt = p.reconcile([(t["task_id"]["value"], t.get("agent_id", {}).get("value")) for t in tasks])
            if not tasks:  # implicit: recorded as {} or {"tasks": []}; both mean the same to the master
                assert rebuilt == {**body, "reconcile": {"tasks": []}}, label
                checked += 1
                continue
        elif type_ in ("REVIVE", "SUPPRESS"):
            build = p.revive if type_ == "REVIVE" else p.suppress
            rebuilt = build(payload["roles"] if payload else None)
        elif type_ == "TEARDOWN":
            rebuilt = p.teardown()
        else:
            rebuilt = p.shutdown(payload["executor_id"]["value"], payload["agent_id"]["value"])
        assert rebuilt == body, label
        validate_call(rebuilt)
        checked += 1
    assert checked >= 1


def test_acknowledge_refuses_what_the_master_refuses() -> None:
    p = proto_for()
    for _, ex in all_exchanges():
        body = ex["request"].get("body")
        if isinstance(body, dict) and body.get("type") == "ACKNOWLEDGE" and ex["response"]["status"] == 400:
            a = body["acknowledge"]
            with pytest.raises(CallError):
                p.acknowledge(a["agent_id"]["value"], a["task_id"]["value"], a["uuid"])
    with pytest.raises(CallError):
        p.acknowledge("a", "t", "not base64!")


def test_task_info_shapes() -> None:
    res = calls.task_resources(2.5, 4096, 1024, 2, ports=[31000, 31001, 31005], role="gpu")
    assert [r["name"] for r in res] == ["cpus", "mem", "disk", "gpus", "ports"]
    assert all(r["allocation_info"] == {"role": "gpu"} and r["role"] == "*" for r in res)
    assert res[3]["scalar"] == {"value": 2}
    assert res[4]["ranges"] == {"range": [{"begin": 31000, "end": 31001}, {"begin": 31005, "end": 31005}]}
    assert "allocation_info" not in calls.task_resources(1, 32)[0]  # not MULTI_ROLE
    with pytest.raises(CallError):
        calls.task_resources(1, 32, gpus=0.5)  # the master would answer TASK_ERROR
    t = calls.task_info("g.a0.m1", "S1", res, "python train.py", env={"RANK": "1", "WORLD_SIZE": "2"},
                        image="nvcr.io/nvidia/pytorch:24.01-py3", labels={"gang": "g"}, kill_grace_s=30, data=b"\x00\xff")
    assert t["task_id"] == {"value": "g.a0.m1"} and t["agent_id"] == {"value": "S1"} and t["name"] == "g.a0.m1"
    assert t["command"] == {"shell": True, "value": "python train.py", "environment": {"variables": [
        {"name": "RANK", "value": "1"}, {"name": "WORLD_SIZE", "value": "2"}]}}
    assert t["container"] == {"type": "MESOS", "mesos": {"image": {"type": "DOCKER", "docker": {
        "name": "nvcr.io/nvidia/pytorch:24.01-py3"}, "cached": True}}}
    assert t["kill_policy"] == {"grace_period": {"nanoseconds": 30_000_000_000}}
    assert base64.b64decode(t["data"]) == b"\x00\xff"
    assert t["labels"] == {"labels": [{"key": "gang", "value": "g"}]}
    for bad in ("a/b", "..", "x" * 256):
        with pytest.raises(CallError):
            calls.task_info(bad, "S1", res, "true")
    op = calls.launch([t])
    assert op == {"type": "LAUNCH", "launch": {"task_infos": [t]}} and "id" not in op


def test_calls_need_a_framework_id_and_valid_input() -> None:
    p = proto_for(None)
    with pytest.raises(CallError, match="framework id"):
        p.revive()
    p = proto_for()
    with pytest.raises(CallError):
        p.accept([], [])
    with pytest.raises(CallError):
        p.accept(["o1", "o1"], [])
    with pytest.raises(CallError):
        p.revive("gpu")  # a string is not a list of roles
    assert p.revive(["gpu"])["revive"] == {"roles": ["gpu"]}  # "roles", never "role"
    assert "revive" not in p.revive() and "suppress" not in p.suppress([])
    assert p.decline(["o1"])["decline"] == {"offer_ids": [{"value": "o1"}]}
    assert p.decline(["o1"], 1e12)["decline"]["filters"] == {"refuse_seconds": 31536000.0}
    k = p.kill("t1", "S1", grace_period_s=5)["kill"]
    assert k == {"task_id": {"value": "t1"}, "agent_id": {"value": "S1"},
                 "kill_policy": {"grace_period": {"nanoseconds": 5_000_000_000}}}
    assert p.reconcile([("t1", "S1"), ("t2", None)])["reconcile"] == {"tasks": [
        {"task_id": {"value": "t1"}, "agent_id": {"value": "S1"}}, {"task_id": {"value": "t2"}}]}
    assert p.reconcile()["reconcile"] == {"tasks": []}
    assert p.teardown() == {"type": "TEARDOWN", "framework_id": {"value": "fw-1"}}


def test_validate_call_refuses_dangerous_or_invalid_calls() -> None:
    for bad in ({"type": "UNKNOWN", "framework_id": {"value": "f"}}, {"type": "FOO", "framework_id": {"value": "f"}},
                {"framework_id": {"value": "f"}}, {"type": "DECLINE", "framework_id": {"value": "f"}},
                {"type": "REVIVE", "framework_id": "f"}, {"type": "REVIVE"}):
        with pytest.raises(CallError):
            validate_call(bad)
    assert validate_call({"type": "REVIVE", "framework_id": {"value": "f"}}) == "REVIVE"


# --- events -------------------------------------------------------------------------------------------------------

EXPECTED = {"SUBSCRIBED": Subscribed, "HEARTBEAT": Heartbeat, "OFFERS": Offers, "RESCIND": Rescind, "UPDATE": Update,
            "FAILURE": Failure, "ERROR": Error, "UPDATE_OPERATION_STATUS": UpdateOperationStatus}


def test_every_recorded_event_parses_to_its_type() -> None:
    p = proto_for(None)
    seen: set[str] = set()
    for name, raw in recorded_events():
        (ev,) = p.on_event(raw, now=1.0)
        assert isinstance(ev, EXPECTED[raw["type"]]), (name, raw["type"], ev)
        seen.add(raw["type"])
        if isinstance(ev, Offers):
            assert len(ev.offers) == len(raw["offers"]["offers"])
        if isinstance(ev, Update):
            s = raw["update"]["status"]
            assert ev.status.task_id == s["task_id"]["value"] and ev.status.state == s["state"]
            assert ev.status.uuid == s.get("uuid") and ev.status.reason == s.get("reason")
            assert ev.status.source == s.get("source") and ev.status.agent_id == s.get("agent_id", {}).get("value")
            ack = p.acknowledge_update(ev.status) if p.framework_id else None
            if s.get("uuid"):
                assert ev.status.needs_ack
                if p.framework_id:
                    assert ack is not None and ack["acknowledge"]["uuid"] == s["uuid"]
            else:
                assert not ev.status.needs_ack and ack is None
            if s.get("source") == "SOURCE_MASTER":  # master-generated: never a uuid (never ACKed)
                assert "uuid" not in s and ev.status.reason
            mesos_state_to_task_state(ev.status.state)  # every recorded state maps
        if isinstance(ev, Subscribed):
            assert ev.heartbeat_interval_s == 15.0 and ev.master_info.port == 5050
            assert p.framework_id == ev.framework_id and p.subscribed
    assert seen == set(EXPECTED)


def test_update_with_and_without_uuid() -> None:
    d = load("04-launch-ack.json")
    events = [r["event"] for ex in d["exchanges"] for r in (ex["response"].get("stream") or {}).get("records", [])
              if "event" in r and r["event"]["type"] == "UPDATE"]
    p = proto_for()
    (ev,) = p.on_event(events[0], 2.0)
    assert isinstance(ev, Update) and ev.status.uuid and ev.status.executor_id == ev.status.task_id
    ack = p.acknowledge_update(ev.status)
    assert ack == {"type": "ACKNOWLEDGE", "framework_id": {"value": "fw-1"}, "acknowledge": {
        "agent_id": {"value": ev.status.agent_id}, "task_id": {"value": ev.status.task_id}, "uuid": ev.status.uuid}}
    d = load("05-accept-two-agents.json")
    dropped = next(r["event"] for ex in d["exchanges"] for r in (ex["response"].get("stream") or {}).get("records", [])
                   if r.get("event", {}).get("type") == "UPDATE")
    (ev,) = p.on_event(dropped, 3.0)
    assert isinstance(ev, Update)
    assert ev.status.state == "TASK_DROPPED" and ev.status.reason == "REASON_INVALID_OFFERS" and ev.status.uuid is None
    assert p.acknowledge_update(ev.status) is None
    assert "Aggregated offers must belong to one single agent" in ev.status.message


def test_offers_with_gpus_ports_attributes() -> None:
    d = load("01-subscribe.json")
    raw = next(r["event"] for r in d["exchanges"][0]["response"]["stream"]["records"]
               if r.get("event", {}).get("type") == "OFFERS")
    (ev,) = proto_for().on_event(raw, 1.0)
    assert isinstance(ev, Offers) and len(ev.offers) == 3
    by_agent = {o.attributes["agent"]: o for o in ev.offers}
    gpu = by_agent["agent3"]
    assert gpu.gpus == 4 and gpu.cpus == 8 and gpu.mem == 16384 and gpu.disk == 100000
    assert gpu.ports == ((31000, 32000),) and gpu.attributes == {"rack": "r1", "agent": "agent3"}
    assert gpu.role == "*" and gpu.agent_port == 5053 and gpu.hostname == "127.0.0.1"
    assert gpu.agent_address == "127.0.0.1" and gpu.framework_id and len(gpu.resources) == 5
    assert by_agent["agent1"].gpus == 0
    one = offers_to_host_offer("agent3:5053", [gpu])
    assert one.free == Resources(cpu=8, mem=16384, disk=100000, gpu=4, ports=1000)
    assert one.ports[0] == 31000 and len(one.ports) == 1000  # 1001 offered, capped
    assert len(offers_to_host_offer("agent3:5053", [gpu], max_ports=10).ports) == 10
    ho = offers_to_host_offer("agent3:5053", [gpu])
    assert ho.hostname == "agent3:5053" and ho.address == "127.0.0.1" and ho.gpu_ids == (0, 1, 2, 3)
    assert ho.free.gpu == len(ho.gpu_ids) and ho.free.ports == len(ho.ports) and ho.has_gpus
    assert ho.labels == {"rack": "r1", "agent": "agent3"}
    with pytest.raises(ValueError):
        offers_to_host_offer("x", list(ev.offers))  # several agents


def test_offer_roles_and_split_offers_and_attribute_kinds() -> None:
    ml = [o for _, e in recorded_events() if e["type"] == "OFFERS" for o in e["offers"]["offers"]
          if o["allocation_info"]["role"] == "ml"]
    assert ml and parse_offer(ml[0]).role == "ml"
    raw = {"id": {"value": "O1"}, "agent_id": {"value": "S1"}, "hostname": "h",
           "resources": [{"name": "cpus", "type": "SCALAR", "scalar": {"value": 1.1}},
                         {"name": "cpus", "type": "SCALAR", "scalar": {"value": 2.2}, "role": "gpu"},
                         {"name": "ports", "type": "RANGES", "ranges": {"range": [{"begin": 5, "end": 6}]}},
                         {"name": "ports", "type": "RANGES", "ranges": {"range": [{"begin": 1, "end": 2}]}}],
           "attributes": [{"name": "n", "type": "SCALAR", "scalar": {"value": 3.0}},
                          {"name": "f", "type": "SCALAR", "scalar": {"value": 2.5}},
                          {"name": "r", "type": "RANGES", "ranges": {"range": [{"begin": 1, "end": 3}]}},
                          {"name": "s", "type": "SET", "set": {"item": ["a", "b"]}},
                          {"name": "t", "type": "TEXT", "text": {"value": "a100"}}],
           "domain": {"fault_domain": {"region": {"name": "r1"}, "zone": {"name": "z1"}}},
           "executor_ids": [{"value": "e1"}], "unavailability": {"start": {"nanoseconds": 1}}}
    o = parse_offer(raw)
    assert o.cpus == 1.1 and o.ports == ((1, 2), (5, 6)) and o.role == "*"  # (2.2 cpus reserved for role gpu)
    assert o.attributes == {"n": "3", "f": "2.5", "r": "[1-3]", "s": "a,b", "t": "a100"}
    assert o.domain == {"region": "r1", "zone": "z1"} and o.executor_ids == ("e1",) and o.has_unavailability
    a, b = parse_offer({**raw, "id": {"value": "O2"}}), o
    assert offers_to_host_offer("h", [a, b]).free.cpu == 2.2


def test_only_unreserved_resources_count_for_launches() -> None:
    """Members are launched on unreserved resources (`"role": "*"`): a resource reserved for a role (statically by
    the operator, or dynamically; old format or refined), revocable or shared is not counted, else a gang would be
    placed onto resources its launch cannot claim and the master would answer TASK_ERROR."""
    def scalar(name: str, v: float, **extra: Any) -> dict[str, Any]:
        return {"name": name, "type": "SCALAR", "scalar": {"value": v}, **extra}

    raw = {"id": {"value": "O1"}, "agent_id": {"value": "S1"}, "hostname": "h", "allocation_info": {"role": "ml"},
           "resources": [scalar("cpus", 4, role="*"), scalar("gpus", 2),
                         scalar("cpus", 8, role="ml", reservation={"principal": "ops"}),
                         scalar("gpus", 4, reservations=[{"type": "STATIC", "role": "ml"}]),
                         scalar("mem", 1024, reservations=[]),
                         scalar("cpus", 16, revocable={}),
                         scalar("disk", 100, shared={}),
                         {"name": "ports", "type": "RANGES", "ranges": {"range": [{"begin": 9, "end": 9}]},
                          "reservations": [{"type": "DYNAMIC", "role": "ml"}]}]}
    o = parse_offer(raw)
    assert (o.cpus, o.gpus, o.mem, o.disk, o.ports) == (4, 2, 1024, 0, ())
    assert len(o.resources) == 8 and o.role == "ml"  # (what was offered, all of it, kept as it came)


def test_subscribed_error_failure_rescind_and_unknown() -> None:
    p = proto_for(None)
    p.on_stream_open("stream-1", now=0.0)
    (ev,) = p.on_event({"type": "SUBSCRIBED", "subscribed": {"framework_id": {"value": "F"},
                                                           "heartbeat_interval_seconds": 15.0}}, 0.1)
    assert isinstance(ev, Subscribed) and p.framework_id == "F" and p.subscribed and p.stream_id == "stream-1"
    assert p.request_headers(subscribe=False)["Mesos-Stream-Id"] == "stream-1"
    assert "Mesos-Stream-Id" not in p.request_headers(subscribe=True)
    (ev,) = p.on_event({"type": "RESCIND", "rescind": {"offer_id": {"value": "O7"}}}, 0.2)
    assert ev == Rescind("O7")
    (ev,) = p.on_event({"type": "FAILURE", "failure": {"agent_id": {"value": "S1"}}}, 0.3)
    assert isinstance(ev, Failure) and ev.agent_removed and ev.status is None
    (ev,) = p.on_event({"type": "FAILURE", "failure": {"agent_id": {"value": "S1"}, "executor_id": {"value": "e"},
                                                       "status": 256}}, 0.3)
    assert isinstance(ev, Failure) and not ev.agent_removed and failure_exit_code(ev) == 1
    (ev,) = p.on_event({"type": "MESSAGE", "message": {"agent_id": {"value": "S1"}, "data": "aGk="}}, 0.4)
    assert ev.data == "aGk="  # type: ignore[union-attr]
    for raw in ({"type": "INVERSE_OFFERS", "inverse_offers": {"inverse_offers": []}},
                {"type": "SOMETHING_NEW", "x": 1}, {"type": "UPDATE"}, {"type": "UPDATE", "update": {"status": {}}},
                {"type": "SUBSCRIBED", "subscribed": {}}, {"type": "RESCIND"}, [1, 2], None, "x"):
        (ev,) = p.on_event(raw, 0.5)
        assert not isinstance(ev, (Update, Subscribed, Rescind))
    (ev,) = p.on_event({"type": "SOMETHING_NEW"}, 0.5)
    assert isinstance(ev, Unknown) and ev.type == "SOMETHING_NEW"
    (ev,) = p.on_record(b"\xff\xfe not json", 0.6)
    assert isinstance(ev, Unknown)
    (ev,) = p.on_event({"type": "ERROR", "error": {"message": "Framework failed over"}}, 1.0)
    assert isinstance(ev, Error) and ev.failed_over and ev.fatal and not p.subscribed and p.halted
    dis = p.on_disconnected("ERROR")
    assert not dis.will_retry and p.stream_id is None
    p.resume()
    assert p.halted is None and p.framework_id == "F"
    (ev,) = p.on_event({"type": "ERROR", "error": {"message": "Framework has been removed"}}, 1.0)
    assert isinstance(ev, Error) and ev.framework_removed
    p.resume(forget_framework_id=True)
    assert p.framework_id is None and "framework_id" not in p.subscribe_call()
    (ev,) = p.on_event({"type": "ERROR", "error": {"message": "'FrameworkInfo.roles' must not be set"}}, 1.0)
    assert isinstance(ev, Error) and not ev.fatal and p.halted is None


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.sampled_from(
        ["type", "update", "status", "offers", "subscribed", "framework_id", "value", "task_id", "state", "rescind",
         "offer_id", "error", "message", "failure", "agent_id", "id", "resources", "uuid", "timestamp"]), c, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(EXPECTED) + ["MESSAGE", "INVERSE_OFFERS", "X"]), json_values)
def test_on_event_never_raises(kind: str, body: Any) -> None:
    p = proto_for()
    evs = p.on_event({"type": kind, kind.lower(): body}, 1.0)
    assert len(evs) == 1


def test_operation_status_uuid() -> None:
    (ev,) = proto_for().on_event({"type": "UPDATE_OPERATION_STATUS", "update_operation_status": {"status": {
        "operation_id": {"value": "op"}, "state": "OPERATION_FINISHED", "uuid": {"value": "AAA="},
        "agent_id": {"value": "S1"}}}}, 1.0)
    assert isinstance(ev, UpdateOperationStatus) and ev.uuid == "AAA=" and ev.operation_id == "op"


# --- heartbeat, states, helpers -----------------------------------------------------------------------------------


def test_heartbeat_overdue_with_a_passed_in_clock() -> None:
    p = proto_for()
    assert not p.heartbeat_overdue(1e9)  # no stream yet
    p.on_stream_open("s", now=100.0)
    p.on_event({"type": "SUBSCRIBED", "subscribed": {"framework_id": {"value": "F"},
                                                   "heartbeat_interval_seconds": 2.0}}, 100.0)
    assert p.read_timeout_s == 10.0
    assert not p.heartbeat_overdue(109.9)
    assert p.heartbeat_overdue(110.1)
    p.on_event({"type": "HEARTBEAT"}, 110.0)
    assert not p.heartbeat_overdue(119.0) and p.heartbeat_overdue(120.5)
    p.on_disconnected("x")
    assert not p.heartbeat_overdue(1e9)


MAPPING = {
    "TASK_STAGING": (TaskState.STARTING, False), "TASK_STARTING": (TaskState.STARTING, False),
    "TASK_RUNNING": (TaskState.RUNNING, False), "TASK_KILLING": (TaskState.KILLING, False),
    "TASK_FINISHED": (TaskState.SUCCEEDED, True), "TASK_FAILED": (TaskState.FAILED, True),
    "TASK_ERROR": (TaskState.FAILED, True), "TASK_KILLED": (TaskState.KILLED, True),
    "TASK_LOST": (TaskState.LOST, True), "TASK_DROPPED": (TaskState.LOST, True), "TASK_GONE": (TaskState.LOST, True),
    "TASK_GONE_BY_OPERATOR": (TaskState.LOST, True), "TASK_UNREACHABLE": (TaskState.LOST, False),
    "TASK_UNKNOWN": (TaskState.LOST, False),
}


@pytest.mark.parametrize("state", sorted(MAPPING))
def test_state_mapping_and_terminality(state: str) -> None:
    ours, terminal = MAPPING[state]
    assert mesos_state_to_task_state(state) == ours
    assert is_terminal(state) is terminal


def test_unknown_state() -> None:
    with pytest.raises(ValueError):
        mesos_state_to_task_state("TASK_NEW_THING")
    assert not is_terminal("TASK_NEW_THING")


def test_exit_codes() -> None:
    def st_(state: str, msg: str) -> MesosTaskStatus:
        return MesosTaskStatus(task_id="t", state=state, message=msg)

    assert exit_code(st_("TASK_FINISHED", "Command exited with status 0")) == 0
    assert exit_code(st_("TASK_FAILED", "Command exited with status 3")) == 3
    assert exit_code(st_("TASK_KILLED", "Command terminated with signal Terminated")) is None
    assert failure_exit_code(Failure("S", "e", 0)) == 0 and failure_exit_code(Failure("S", "e", 9)) == -9


def test_master_addresses_and_redirects() -> None:
    assert master_base("m1:5050") == "http://m1:5050"
    assert master_base("http://m1:5050/api/v1/scheduler") == "http://m1:5050"
    assert master_base("https://m1:5050/") == "https://m1:5050"
    assert redirect_base("http://m1:5050", "//m2:5050/api/v1/scheduler") == "http://m2:5050"
    assert redirect_base("https://m1:5050", "//m2:5050/api/v1/scheduler") == "https://m2:5050"
    assert redirect_base("http://m1:5050", "masterhost2:5050") == "http://masterhost2:5050"
    assert redirect_base("http://m1:5050", "http://m3:1/x") == "http://m3:1"
    with pytest.raises(ValueError):
        redirect_base("http://m1:5050", "")


def test_backoff() -> None:
    b = Backoff(1.0, 15.0)  # the client's re-subscribe policy at its defaults
    assert b.delay(0, 0.0) == 0.5 and b.delay(0, 0.999) < 1.0
    assert b.delay(3, 1.0) == 8.0
    assert b.delay(50, 1.0) == 15.0 and b.delay(50, 0.0) == 7.5
    assert CALL_503_BACKOFF.delay(0, 1.0) == 0.1 and CALL_503_BACKOFF.delay(10, 1.0) == 2.0


def test_calls_whose_order_matters_share_a_lane() -> None:
    """REVIVE undoes SUPPRESS and the filters of DECLINE and ACCEPT, a KILL must follow the ACCEPT of its task:
    one lane, so they reach the master in the order made. Acknowledgements keep their own order; reconciliation
    needs none. Every call type has a lane (unknown ones the ordered "offers")."""
    offers = {"ACCEPT", "DECLINE", "REVIVE", "SUPPRESS", "UPDATE_FRAMEWORK", "KILL", "ACCEPT_INVERSE_OFFERS",
              "DECLINE_INVERSE_OFFERS", "TEARDOWN", "SHUTDOWN", "REQUEST"}
    assert {t for t in CALL_TYPES - {"SUBSCRIBE"} if call_lane(t) == "offers"} == offers
    assert call_lane("ACKNOWLEDGE") == call_lane("ACKNOWLEDGE_OPERATION_STATUS") == "acks"
    assert call_lane("RECONCILE") == "queries" and call_lane("NOT_A_CALL") == "offers"
    assert set(CALL_LANES) <= CALL_TYPES
