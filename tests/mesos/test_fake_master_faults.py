"""Each FakeMaster fault-injection knob, observed through the tiny stdlib client in fake_master.py."""

from __future__ import annotations

import base64
import http.client
import socket
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.mesos.fake_master import (
    FakeAgent,
    FakeMaster,
    Subscription,
    framework_info,
    send_call,
    subscribe,
)

Factory = Callable[..., FakeMaster]


def _sub(m: FakeMaster, **kw: Any) -> tuple[Subscription, str]:
    s = subscribe(m.url, framework_info(**kw))
    assert s.status == 200
    ev = s.next_event(timeout=5)
    assert ev["type"] == "SUBSCRIBED"
    return s, ev["subscribed"]["framework_id"]["value"]


def _offers(s: Subscription) -> list[dict[str, Any]]:
    return s.wait_for(lambda e: e["type"] == "OFFERS")["offers"]["offers"]


def _call(m: FakeMaster, s: Subscription, fid: str, typ: str, body: Any = None, **kw: Any) -> Any:
    c: dict[str, Any] = {"type": typ, "framework_id": {"value": fid}}
    if body is not None:
        c[typ.lower()] = body
    return send_call(m.url, c, stream_id=s.stream_id, **kw)


def _task(tid: str, agent_id: str, cpus: float = 1.0, mem: float = 128.0) -> dict[str, Any]:
    return {"name": tid, "task_id": {"value": tid}, "agent_id": {"value": agent_id},
            "resources": [{"name": "cpus", "type": "SCALAR", "scalar": {"value": cpus}},
                          {"name": "mem", "type": "SCALAR", "scalar": {"value": mem}}],
            "command": {"shell": True, "value": "sleep 1000"}}


def _launch(m: FakeMaster, s: Subscription, fid: str, offer: dict[str, Any], tid: str) -> None:
    r = _call(m, s, fid, "ACCEPT", {"offer_ids": [offer["id"]], "operations": [
        {"type": "LAUNCH", "launch": {"task_infos": [_task(tid, offer["agent_id"]["value"])]}}]})
    assert r.status == 202


def _update(s: Subscription, tid: str, state: str | None = None, timeout: float = 5.0) -> dict[str, Any]:
    ev = s.wait_for(lambda e: e["type"] == "UPDATE" and e["update"]["status"]["task_id"]["value"] == tid
                    and (state is None or e["update"]["status"]["state"] == state), timeout)
    return ev["update"]["status"]


def _ack(m: FakeMaster, s: Subscription, fid: str, st: dict[str, Any]) -> None:
    r = _call(m, s, fid, "ACKNOWLEDGE", {"agent_id": st["agent_id"], "task_id": st["task_id"], "uuid": st["uuid"]})
    assert r.status == 202


def _running(m: FakeMaster, s: Subscription, fid: str, offer: dict[str, Any], tid: str) -> dict[str, Any]:
    _launch(m, s, fid, offer, tid)
    _ack(m, s, fid, _update(s, tid, "TASK_STARTING"))
    st = _update(s, tid, "TASK_RUNNING")
    _ack(m, s, fid, st)
    return st


def test_stream_framing_chunks_and_gpu_filter(fake_master_factory: Factory) -> None:
    m = fake_master_factory(chunk_size=7)
    s = subscribe(m.url, framework_info(caps=["MULTI_ROLE"]))
    assert s.status == 200 and s.content_type == "application/json" and s.stream_id
    assert dict(s.headers)["Transfer-Encoding"] == "chunked"
    assert [next(s)["type"], next(s)["type"]] == ["SUBSCRIBED", "HEARTBEAT"]
    offers = _offers(s)
    gpu_agent = m.agents[2].agent_id
    assert gpu_agent not in {o["agent_id"]["value"] for o in offers} and len(offers) == 2
    s2, _ = _sub(m, name="gpu")
    assert {o["agent_id"]["value"] for o in _offers(s2)} == {gpu_agent}  # only what s holds not
    s.close()
    s2.close()


def test_launch_ack_retry_finish(fake_master: FakeMaster) -> None:
    m = fake_master
    s, fid = _sub(m)
    offer = _offers(s)[0]
    _launch(m, s, fid, offer, "t1")
    starting = _update(s, "t1", "TASK_STARTING")
    assert starting["source"] == "SOURCE_EXECUTOR" and "uuid" in starting and "reason" not in starting
    again = _update(s, "t1", "TASK_STARTING", timeout=2)  # not acked: resent with the same uuid
    assert again["uuid"] == starting["uuid"] and again["timestamp"] == starting["timestamp"]
    _ack(m, s, fid, again)
    running = _update(s, "t1", "TASK_RUNNING")
    _ack(m, s, fid, running)
    assert m.tasks()["t1"]["state"] == "TASK_RUNNING"
    m.finish_task("t1")
    fin = _update(s, "t1", "TASK_FINISHED")
    assert fin["message"] == "Command exited with status 0"
    _ack(m, s, fid, fin)
    assert [a["matched"] for a in m.acks] == [True, True, True]
    assert "t1" not in m.tasks()
    assert m.calls_of("ACCEPT") and m.framework_id == fid
    s.close()


def test_rescind_offer_by_id_and_agent(fake_master: FakeMaster) -> None:
    m = fake_master
    s, _ = _sub(m)
    offers = _offers(s)
    assert m.rescind_offer(offers[0]["id"]["value"]) == [offers[0]["id"]["value"]]
    ev = s.wait_for(lambda e: e["type"] == "RESCIND")
    assert ev["rescind"]["offer_id"] == offers[0]["id"]
    assert m.rescind_offer(offers[1]["agent_id"]["value"]) == [offers[1]["id"]["value"]]
    assert s.wait_for(lambda e: e["type"] == "RESCIND")["rescind"]["offer_id"] == offers[1]["id"]
    s.close()


@pytest.mark.parametrize("pa", [True, False])
def test_rescind_next_accept(fake_master: FakeMaster, pa: bool) -> None:
    m = fake_master
    caps = ["GPU_RESOURCES", "MULTI_ROLE", "TASK_KILLING_STATE"] + (["PARTITION_AWARE"] if pa else [])
    s, fid = _sub(m, caps=caps)
    offer = _offers(s)[0]
    m.rescind_next_accept(offer["agent_id"]["value"])
    _launch(m, s, fid, offer, "raced")
    assert s.wait_for(lambda e: e["type"] == "RESCIND")["rescind"]["offer_id"] == offer["id"]
    st = _update(s, "raced")
    assert st["state"] == ("TASK_DROPPED" if pa else "TASK_LOST")
    assert (st["source"], st["reason"], "uuid" in st) == ("SOURCE_MASTER", "REASON_INVALID_OFFERS", False)
    assert st["message"] == f"Task launched with invalid offers: Offer {offer['id']['value']} is no longer valid"
    s.close()


@pytest.mark.parametrize(("inject", "state", "source", "uuid"), [
    ("TASK_ERROR", "TASK_ERROR", "SOURCE_MASTER", False),
    ("TASK_DROPPED", "TASK_DROPPED", "SOURCE_MASTER", False),
    ("TASK_FAILED", "TASK_FAILED", "SOURCE_AGENT", True),
])
def test_fail_launch(fake_master: FakeMaster, inject: str, state: str, source: str, uuid: bool) -> None:
    m = fake_master
    s, fid = _sub(m)
    offer = _offers(s)[0]
    m.fail_launch(offer["agent_id"]["value"], inject)
    _launch(m, s, fid, offer, "doomed")
    st = _update(s, "doomed")
    assert (st["state"], st["source"], "uuid" in st) == (state, source, uuid)
    if uuid:
        _ack(m, s, fid, st)
    # only the next launch fails
    offer2 = s.wait_for(lambda e: e["type"] == "OFFERS" and any(
        o["agent_id"] == offer["agent_id"] for o in e["offers"]["offers"]), timeout=5)["offers"]["offers"]
    o2 = next(o for o in offer2 if o["agent_id"] == offer["agent_id"])
    _launch(m, s, fid, o2, "fine")
    assert _update(s, "fine")["state"] == "TASK_STARTING"
    s.close()


def test_fail_task_and_kill(fake_master: FakeMaster) -> None:
    m = fake_master
    s, fid = _sub(m)
    offers = _offers(s)
    _running(m, s, fid, offers[0], "f1")
    _running(m, s, fid, offers[1], "k1")
    m.fail_task("f1", message="boom")
    st = _update(s, "f1", "TASK_FAILED")
    assert st["message"] == "boom" and "uuid" in st
    _ack(m, s, fid, st)
    assert _call(m, s, fid, "KILL", {"task_id": {"value": "k1"}}).status == 202
    _ack(m, s, fid, _update(s, "k1", "TASK_KILLING"))
    killed = _update(s, "k1", "TASK_KILLED")
    assert killed["message"] == "Command terminated with signal Terminated"
    s.close()


def test_lose_and_restore_agent(fake_master_factory: Factory) -> None:
    m = fake_master_factory(agent_removal_timeout=0.3)
    s, fid = _sub(m)
    offer = _offers(s)[0]
    aid = offer["agent_id"]["value"]
    _running(m, s, fid, offer, "victim")
    m.lose_agent(aid)
    st = _update(s, "victim", "TASK_UNREACHABLE")
    assert (st["reason"], st["message"], "unreachable_time" in st, "uuid" in st) == (
        "REASON_AGENT_REMOVED", "health check timed out", True, False)
    fail = s.wait_for(lambda e: e["type"] == "FAILURE")
    assert fail["failure"] == {"agent_id": {"value": aid}}
    m.restore_agent(aid)
    back = _update(s, "victim", "TASK_RUNNING")
    assert (back["source"], back["reason"]) == ("SOURCE_MASTER", "REASON_AGENT_REREGISTERED")
    s.close()


def test_kill_on_unreachable_agent_is_a_reconciliation_and_is_not_remembered(fake_master_factory: Factory) -> None:
    """Once an agent is marked unreachable the master moves its tasks out of the framework's known tasks
    (`Master::removeTask(task, unreachable)`, into `unreachableTasks`). A KILL of such a task finds none and turns
    into a reconciliation (`Master::kill`: "because it is unknown; performing reconciliation"): TASK_UNREACHABLE
    "Reconciliation: Task is unreachable" with unreachable_time (TASK_UNKNOWN without agent_id), no uuid. Nothing is
    remembered: the agent's Slave object (and its `killedTasks`) is gone, so the task comes back RUNNING when the
    agent re-registers, and only a KILL sent after that ends it (mesos-api.md §8's reconcile table, §11: "KILL any
    member that comes back"). Explicit reconciliation answers the same; implicit reconciliation leaves it out
    (it walks `framework->tasks` only)."""
    m = fake_master_factory(agent_removal_timeout=0.3)
    s, fid = _sub(m)
    offers = _offers(s)
    aid = offers[0]["agent_id"]["value"]
    _running(m, s, fid, offers[0], "victim")
    _running(m, s, fid, offers[1], "bystander")
    m.lose_agent(aid)
    _update(s, "victim", "TASK_UNREACHABLE")
    s.wait_for(lambda e: e["type"] == "FAILURE")
    assert _call(m, s, fid, "KILL", {"task_id": {"value": "victim"}, "agent_id": {"value": aid}}).status == 202
    st = _update(s, "victim")
    assert (st["state"], st["source"], st["reason"], st["message"], "unreachable_time" in st, "uuid" in st) == (
        "TASK_UNREACHABLE", "SOURCE_MASTER", "REASON_RECONCILIATION", "Reconciliation: Task is unreachable", True,
        False)
    assert _call(m, s, fid, "KILL", {"task_id": {"value": "victim"}}).status == 202
    st = _update(s, "victim")
    assert (st["state"], st["message"]) == ("TASK_UNKNOWN", "Reconciliation: Task is unknown")
    assert _call(m, s, fid, "RECONCILE", {"tasks": [{"task_id": {"value": "victim"},
                                                     "agent_id": {"value": aid}}]}).status == 202
    st = _update(s, "victim")
    assert (st["state"], st["message"]) == ("TASK_UNREACHABLE", "Reconciliation: Task is unreachable")
    assert _call(m, s, fid, "RECONCILE", {"tasks": []}).status == 202
    _update(s, "bystander", "TASK_RUNNING")  # the implicit answers: the bystander's, not the victim's
    time.sleep(0.1)
    assert not [e for _, e in m.events[-5:] if e["type"] == "UPDATE"
                and e["update"]["status"]["task_id"]["value"] == "victim"
                and e["update"]["status"].get("reason") == "REASON_RECONCILIATION"
                and e["update"]["status"]["message"] == "Reconciliation: Latest task state"]
    m.restore_agent(aid)
    back = _update(s, "victim", "TASK_RUNNING")
    assert back["reason"] == "REASON_AGENT_REREGISTERED"
    time.sleep(0.2)
    assert m.tasks()["victim"]["state"] == "TASK_RUNNING", "the kills sent while it was unreachable were remembered"
    assert _call(m, s, fid, "KILL", {"task_id": {"value": "victim"}, "agent_id": {"value": aid}}).status == 202
    _update(s, "victim", "TASK_KILLING")
    s.close()


def test_disconnected_agent_remembers_kills_and_answers_unknown_tasks_gone(fake_master_factory: Factory) -> None:
    """An agent that has disconnected but is not yet marked unreachable is still registered: a KILL of its task
    is remembered (`slave->killedTasks`) and sent when it re-registers (`Master::reconcileKnownSlave`), and an
    explicit reconciliation of a task it does not hold is answered TASK_GONE "Reconciliation: Task is unknown to
    the agent" (case (3) of `Master::reconcile`; no reply is only for agents recovered after a master failover
    that have not re-registered yet)."""
    m = fake_master_factory(agent_removal_timeout=60)
    s, fid = _sub(m)
    offer = _offers(s)[0]
    aid = offer["agent_id"]["value"]
    _running(m, s, fid, offer, "held")
    m.lose_agent(aid)
    assert _call(m, s, fid, "RECONCILE", {"tasks": [{"task_id": {"value": "never"},
                                                     "agent_id": {"value": aid}}]}).status == 202
    st = _update(s, "never", timeout=2)
    assert (st["state"], st["reason"], st["message"]) == (
        "TASK_GONE", "REASON_RECONCILIATION", "Reconciliation: Task is unknown to the agent")
    assert _call(m, s, fid, "KILL", {"task_id": {"value": "held"}, "agent_id": {"value": aid}}).status == 202
    time.sleep(0.1)
    assert m.tasks()["held"]["state"] == "TASK_RUNNING"
    m.restore_agent(aid)
    _update(s, "held", "TASK_KILLING")
    s.close()


def test_lose_agent_non_checkpointing(fake_master: FakeMaster) -> None:
    m = fake_master
    s, fid = _sub(m, checkpoint=False, caps=["MULTI_ROLE"])
    offer = _offers(s)[0]
    _running(m, s, fid, offer, "fragile")
    m.lose_agent(offer["agent_id"]["value"], removal_delay=60)
    st = _update(s, "fragile", "TASK_LOST")
    assert (st["reason"], st["message"]) == ("REASON_AGENT_DISCONNECTED", "Agent 127.0.0.1 disconnected")
    s.close()


def test_cut_stream_then_resubscribe_keeps_tasks(fake_master: FakeMaster) -> None:
    m = fake_master
    s, fid = _sub(m)
    _running(m, s, fid, _offers(s)[0], "keep")
    m.cut_stream()
    with pytest.raises(StopIteration):
        while True:
            next(s)
    assert s.eof
    r = _call(m, s, fid, "REVIVE")
    assert (r.status, r.body) == (403, "Framework is not subscribed")
    s2, fid2 = _sub(m, id={"value": fid})
    assert fid2 == fid and m.subscribed_frameworks == [fid]
    assert _call(m, s2, fid, "RECONCILE", {"tasks": []}).status == 202
    st = _update(s2, "keep")
    assert (st["state"], st["reason"]) == ("TASK_RUNNING", "REASON_RECONCILIATION")
    s2.close()


def test_failover_timeout_removes_framework(fake_master: FakeMaster) -> None:
    m = fake_master  # client_time_scale 0.05: 2 s -> 0.1 s
    s, fid = _sub(m, failover_timeout=2.0)
    s.close()
    time.sleep(0.5)
    r = send_call(m.url, {"type": "REVIVE", "framework_id": {"value": fid}}, stream_id=s.stream_id)
    assert (r.status, r.body) == (400, "Framework cannot be found")
    again = subscribe(m.url, framework_info(id={"value": fid}))
    assert next(again) == {"type": "ERROR", "error": {"message": "Framework has been removed"}}
    again.close()


def test_go_silent_keeps_connection_open(fake_master_factory: Factory) -> None:
    m = fake_master_factory(heartbeat_interval=0.1)
    s, _ = _sub(m)
    s.wait_for(lambda e: e["type"] == "HEARTBEAT")
    m.go_silent()
    # drain what was already queued, then nothing for many heartbeat intervals
    with pytest.raises((TimeoutError, socket.timeout)):
        while True:
            s.next_event(timeout=0.6)
    assert not s.eof and m.subscribed_frameworks
    m.go_silent(silent=False)
    assert s.wait_for(lambda e: e["type"] == "HEARTBEAT", timeout=2)
    s.close()


def test_leader_redirect_and_503(fake_master: FakeMaster) -> None:
    m = fake_master
    s, _ = _sub(m)
    m.set_leader(False, leader_url="http://10.0.0.2:5050")
    with pytest.raises(StopIteration):
        while True:
            next(s)
    r = send_call(m.url, {"type": "SUBSCRIBE", "subscribe": {"framework_info": framework_info()}})
    assert (r.status, r.reason, r.header("Location")) == (307, "Temporary Redirect", "//10.0.0.2:5050/api/v1/scheduler")
    m.set_leader(False, leader_url="")
    assert send_call(m.url, {}).status == 503
    m.set_leader(True)
    m.set_unavailable()
    r = send_call(m.url, {})
    assert (r.status, r.body) == (503, "Master has not finished recovery")
    m.set_unavailable(False)
    assert send_call(m.url, {}).status == 400


def test_basic_auth(fake_master_factory: Factory) -> None:
    m = fake_master_factory(credentials={"svc": "s3cret"})
    r = send_call(m.url, {"type": "SUBSCRIBE", "subscribe": {"framework_info": framework_info()}})
    assert (r.status, r.header("WWW-Authenticate")) == (401, 'Basic realm="mesos-master-scheduler"')
    bad = {"Authorization": "Basic " + base64.b64encode(b"svc:nope").decode()}
    assert send_call(m.url, {}, headers=bad).status == 401
    good = {"Authorization": "Basic " + base64.b64encode(b"svc:s3cret").decode()}
    s = subscribe(m.url, framework_info(principal="svc"), headers=good)
    assert s.status == 200 and next(s)["type"] == "SUBSCRIBED"
    s.close()
    r = send_call(m.url, {"type": "SUBSCRIBE", "subscribe": {"framework_info": framework_info(principal="x")}},
                  headers=good)
    assert r.status == 400 and "does not match principal" in r.body


def test_crash_and_restart(fake_master: FakeMaster) -> None:
    m = fake_master
    s, fid = _sub(m)
    _running(m, s, fid, _offers(s)[0], "survivor")
    old_id = m.master_id
    m.crash()
    with pytest.raises(StopIteration):
        while True:
            next(s)
    with pytest.raises(OSError):
        send_call(m.url, {})
    m.restart()
    assert m.master_id != old_id
    r = _call(m, s, fid, "REVIVE")
    assert (r.status, r.body) == (403, "Framework is not subscribed")
    s2, fid2 = _sub(m, id={"value": fid})
    assert fid2 == fid
    offers = _offers(s2)
    assert all(o["id"]["value"].startswith(m.master_id) for o in offers)
    assert _call(m, s2, fid, "RECONCILE", {"tasks": [{"task_id": {"value": "survivor"}}]}).status == 202
    assert _update(s2, "survivor")["state"] == "TASK_RUNNING"
    s2.close()


def test_restarted_master_knows_no_task_until_its_agent_reregisters(fake_master_factory: Factory) -> None:
    """A new master recovers the agents from the registry but learns their tasks only when they re-register
    (mesos-api.md §10.7 and §11 "Master fails over mid-launch": "replies may be delayed until agents re-register").
    Until then an explicit reconciliation (with the agent id, or without one while any agent is still recovered)
    and a KILL (a reconciliation of an unknown task) get no reply at all: case (2) of `Master::reconcile`; implicit
    reconciliation leaves those tasks out. Once the agent re-registers the task is known again."""
    m = fake_master_factory(agent_reregister_delay=1.0)
    s, fid = _sub(m)
    offer = _offers(s)[0]
    aid = offer["agent_id"]["value"]
    _running(m, s, fid, offer, "survivor")
    m.crash()
    m.restart()
    s2, _ = _sub(m, id={"value": fid})
    for entry in ({"task_id": {"value": "survivor"}, "agent_id": {"value": aid}}, {"task_id": {"value": "survivor"}}):
        assert _call(m, s2, fid, "RECONCILE", {"tasks": [entry]}).status == 202
    assert _call(m, s2, fid, "RECONCILE", {"tasks": []}).status == 202
    assert _call(m, s2, fid, "KILL", {"task_id": {"value": "survivor"}, "agent_id": {"value": aid}}).status == 202
    with pytest.raises(TimeoutError):
        _update(s2, "survivor", timeout=0.5)
    time.sleep(0.7)  # the agent re-registers
    assert m.tasks()["survivor"]["state"] == "TASK_RUNNING", "a kill sent while it was recovering was remembered"
    assert _call(m, s2, fid, "RECONCILE", {"tasks": [{"task_id": {"value": "survivor"},
                                                      "agent_id": {"value": aid}}]}).status == 202
    st = _update(s2, "survivor")
    assert (st["state"], st["message"]) == ("TASK_RUNNING", "Reconciliation: Latest task state")
    s2.close()


def test_launch_group_failure_event(fake_master: FakeMaster) -> None:
    m = fake_master
    s, fid = _sub(m)
    offer = _offers(s)[0]
    aid = offer["agent_id"]["value"]
    ex = {"type": "DEFAULT", "executor_id": {"value": "ex1"}, "framework_id": {"value": fid},
          "resources": [{"name": "cpus", "type": "SCALAR", "scalar": {"value": 0.1}},
                        {"name": "mem", "type": "SCALAR", "scalar": {"value": 32}},
                        {"name": "disk", "type": "SCALAR", "scalar": {"value": 32}}]}
    tasks = [_task("g0", aid), _task("g1", aid)]
    for t in tasks:
        del t["command"]
    r = _call(m, s, fid, "ACCEPT", {"offer_ids": [offer["id"]], "operations": [
        {"type": "LAUNCH_GROUP", "launch_group": {"executor": ex, "task_group": {"tasks": tasks}}}]})
    assert r.status == 202
    for tid in ("g0", "g1"):
        st = _update(s, tid, "TASK_STARTING")
        assert st["executor_id"] == {"value": "ex1"}
        _ack(m, s, fid, st)
        _ack(m, s, fid, _update(s, tid, "TASK_RUNNING"))
    m.finish_task("g0")
    m.finish_task("g1")
    for tid in ("g0", "g1"):
        _ack(m, s, fid, _update(s, tid, "TASK_FINISHED"))
    fail = s.wait_for(lambda e: e["type"] == "FAILURE")["failure"]
    assert fail == {"agent_id": {"value": aid}, "executor_id": {"value": "ex1"}, "status": 0}
    s.close()


def test_raw_http_edges(fake_master: FakeMaster) -> None:
    m = fake_master
    conn = http.client.HTTPConnection("127.0.0.1", m.port, timeout=5)
    conn.request("GET", "/api/v1/scheduler")
    r = conn.getresponse()
    assert (r.status, r.getheader("Allow")) == (405, "POST")
    r.read()
    conn.close()
    r2 = send_call(m.url, raw=b'{"type": "DECLINE"', headers={})
    assert r2.body == "Failed to parse body into JSON: syntax error at line 1 near: "
    r3 = send_call(m.url, {"type": "SUBSCRIBE", "subscribe": {"framework_info": framework_info()}},
                   headers={"Accept": "text/plain"})
    assert r3.status == 406


def test_inverse_offers_go_to_frameworks_with_resources_there_and_come_again_after_an_answer(
        fake_master_factory: Factory) -> None:
    """As the allocator's generateInverseOffers: an agent's maintenance window is sent (INVERSE_OFFERS) to the
    frameworks with resources offered or allocated on it only, not to every framework; an answered one is over,
    and comes again, under a new id, once the answer's refuse filter expires; lifting the window rescinds the
    outstanding one (RESCIND_INVERSE_OFFER) and the agent's offers, which come back without `unavailability`."""
    agents = [FakeAgent(None, "127.0.0.1", {"cpus": 8, "mem": 16384, "disk": 1000, "ports": [(31000, 32000)]},
                        port=5051 + i) for i in range(2)]
    m = fake_master_factory(agents)
    x, y = (str(a.agent_id) for a in m.agents)
    sa, fa = _sub(m, name="a")
    offers = {o["agent_id"]["value"]: o for o in _offers(sa)}
    assert _call(m, sa, fa, "DECLINE", {"offer_ids": [offers[y]["id"]],
                                        "filters": {"refuse_seconds": 100000}}).status == 202
    _running(m, sa, fa, offers[x], "t1")
    sb = subscribe(m.url, framework_info("b"), suppressed_roles=["*"])  # no offers: nothing of b's anywhere
    assert sb.next_event(timeout=5)["type"] == "SUBSCRIBED"

    def inverse(s: Subscription) -> dict[str, Any]:
        return s.wait_for(lambda e: e["type"] == "INVERSE_OFFERS")["inverse_offers"]["inverse_offers"][0]

    m.schedule_maintenance(x, time.time() + 3600)
    m.schedule_maintenance(y, time.time() + 3600)  # a's offer of it declined: nothing of a's there either
    io = inverse(sa)
    assert io["agent_id"]["value"] == x and io["framework_id"]["value"] == fa and io["resources"] == []
    sb.wait_for(lambda e: e["type"] == "HEARTBEAT")  # (allocations ran meanwhile)
    sb.wait_for(lambda e: e["type"] == "HEARTBEAT")
    sent = [(fid, e["inverse_offers"]["inverse_offers"][0]["agent_id"]["value"]) for fid, e in m.events
            if e["type"] == "INVERSE_OFFERS"]
    assert sent == [(fa, x)], sent
    assert [i["inverse_offer_id"] for i in m.inverse_offers()] == [io["id"]["value"]]

    # declined (a's task is still there): over, and asked again once the filter expires
    assert _call(m, sa, fa, "DECLINE_INVERSE_OFFERS", {"inverse_offer_ids": [io["id"]],
                                                      "filters": {"refuse_seconds": 2}}).status == 202
    again = inverse(sa)
    assert again["agent_id"]["value"] == x and again["id"] != io["id"]
    # accepted: the same (a still holds resources there)
    assert _call(m, sa, fa, "ACCEPT_INVERSE_OFFERS", {"inverse_offer_ids": [again["id"]]}).status == 202
    third = inverse(sa)
    assert third["id"] not in (io["id"], again["id"])

    m.cancel_maintenance(x)
    rescinded = sa.wait_for(lambda e: e["type"] == "RESCIND_INVERSE_OFFER")
    assert rescinded["rescind_inverse_offer"]["inverse_offer_id"] == third["id"]
    back = sa.wait_for(lambda e: e["type"] == "OFFERS" and any(o["agent_id"]["value"] == x
                                                               for o in e["offers"]["offers"]))
    assert all("unavailability" not in o for o in back["offers"]["offers"])
    assert m.inverse_offers() == []
    sa.close()
    sb.close()
