"""MesosBackend driven directly: a recording fake Transport (no HTTP), events injected by the test (offers from
the recorded transcript 05-accept-two-agents), and a fake clock advanced by hand before each tick()."""

from __future__ import annotations

import copy
import dataclasses
import json
import random
import threading
from collections.abc import Callable
from typing import Any

import pytest

from peloton.domain.launch import GangLaunch, HostInfo, LaunchOutcome, LaunchResult, LaunchSpec, TaskStatus
from peloton.domain.placement import GangPlacement, MemberAssignment
from peloton.domain.resources import Resources
from peloton.domain.spec import JobSpec, Role
from peloton.domain.states import TaskState
from peloton.errors import FailedPrecondition
from peloton.hostmgr.backend import LaunchError
from peloton.hostmgr.mesos import backend
from peloton.hostmgr.mesos.backend import MesosBackend, MesosOptions, _live, _Task
from peloton.hostmgr.mesos.calls import FrameworkConfig
from peloton.hostmgr.mesos.protocol import SchedulerProtocol
from peloton.jobmgr.launcher import Launcher
from tests.mesos.transcript_dir import load_transcript

FID = "1ba6cc5a-71b1-4625-9952-fb54d2771b7b-0002"
UUID = "5oNVnS/NQTS2b7IZ8kaB+Q=="  # a valid v4 uuid, base64: must come back verbatim


def launch(b: MesosBackend, specs: list[LaunchSpec]) -> LaunchResult:
    """Launch one gang; a result other than OK is raised as LaunchError (with `.outcome`)."""
    (r,) = b.launch([GangLaunch(specs[0].job_id + "/0", specs[0].attempt, tuple(specs))])
    if r.outcome != LaunchOutcome.OK:
        err = LaunchError(r.task_id, r.message, permanent=r.permanent)
        err.outcome = r.outcome  # type: ignore[attr-defined]
        raise err
    return r


def _transcript_offers() -> list[list[dict[str, Any]]]:
    """The two OFFERS events of the first subscription: 3 agents (S1 with gpus), then remainders of S2 and S0."""
    data = load_transcript("05-accept-two-agents.json")  # fails the test when it is missing
    recs = data["exchanges"][0]["response"]["stream"]["records"]
    return [r["event"]["offers"]["offers"] for r in recs if r.get("event", {}).get("type") == "OFFERS"]


class FakeTransport:
    """Stands in for client.MesosClient: the same sans-IO protocol core, calls recorded instead of sent."""

    def __init__(self, config: FrameworkConfig, framework_id: str | None,
                 on_event: Callable[[Any], None]) -> None:
        self.protocol = SchedulerProtocol(config, framework_id)
        self.on_event = on_event
        self.calls: list[dict[str, Any]] = []
        self.fail: set[str] = set()  # call types answered with an error
        self.fail_nth: dict[str, int] = {}  # call type -> which (1-based) call of that type fails
        self.started = self.stopped = False
        self.resumed: list[bool] = []

    def subscribe(self) -> dict[str, Any]:
        return self.protocol.subscribe_call()

    def resume(self, forget_framework_id: bool = False) -> None:
        self.resumed.append(forget_framework_id)
        self.protocol.resume(forget_framework_id)

    def start(self) -> None:
        self.started = True

    def stop(self) -> None:
        self.stopped = True

    def call(self, body: dict[str, Any]) -> None:
        self.calls.append(body)
        t = body["type"]
        if t in self.fail or self.fail_nth.get(t) == len(self.of(t)):
            raise ConnectionError(f"{t} refused")

    def of(self, t: str) -> list[dict[str, Any]]:
        return [c for c in self.calls if c["type"] == t]


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class Harness:
    def __init__(self, fid: str | None = None, **opts: Any) -> None:
        self.clock = Clock()
        self.saved: list[str | None] = []
        self.statuses: list[TaskStatus] = []
        self.transport: FakeTransport | None = None

        def factory(config: FrameworkConfig, fid: str | None, ev: Callable[[Any], None]) -> FakeTransport:
            self.transport = FakeTransport(config, fid, ev)
            return self.transport

        o = MesosOptions(reconcile_wait_s=0.2, **opts)
        self.b = MesosBackend(o, factory, lambda: fid, self.saved.append, clock=self.clock, rand=lambda: 1.0)
        self.b._on_status = self.statuses.append  # start() without the ticker thread
        assert self.transport is not None
        self.t: FakeTransport = self.transport

    def event(self, ev: dict[str, Any]) -> None:
        self.t.on_event(ev)

    def subscribed(self, fid: str = FID) -> None:
        self.event({"type": "SUBSCRIBED", "subscribed": {"framework_id": {"value": fid},
                                                         "heartbeat_interval_seconds": 15.0}})

    def offers(self, offers: list[dict[str, Any]]) -> None:
        self.event({"type": "OFFERS", "offers": {"offers": offers}})

    def update(self, tid: str, state: str, agent: str = "", uuid: str | None = None, **kw: Any) -> TaskStatus:
        st: dict[str, Any] = {"task_id": {"value": tid}, "state": state, **kw}
        if agent:
            st["agent_id"] = {"value": agent}
        if uuid:
            st["uuid"] = uuid
        self.event({"type": "UPDATE", "update": {"status": st}})
        return self.statuses[-1]

    def tick(self, dt: float) -> None:
        self.clock.t += dt
        self.b.tick()

    def ready(self) -> list[dict[str, Any]]:
        """Subscribed, the transcript's first OFFERS in the pool, the initial reconciliation done."""
        self.subscribed()
        offs = _transcript_offers()
        self.offers(offs[0])
        self.b.demand()  # a gang waits
        self.tick(0.1)  # empty reconciliation -> implicit round; REVIVE (a new subscription, with demand)
        return offs[0]


def spec(tid: str, host: str, cpu: float = 4, ports: tuple[int, ...] = (31000,), instance: int = 0) -> LaunchSpec:
    return LaunchSpec(task_id=tid, job_id="job", instance=instance, attempt=1, hostname=host, command="sleep 9",
                      env={"RANK": str(instance), "WORLD_SIZE": "4"}, resources=Resources(cpu, 64, 0, 0, len(ports)),
                      ports=ports, files={"hostfile": "127.0.0.1 slots=4\n"})


S0, S1, S2 = (f"1ba6cc5a-71b1-4625-9952-fb54d2771b7b-S{i}" for i in range(3))
H0, H1, H2 = "127.0.0.1:5051", "127.0.0.1:5053", "127.0.0.1:5052"  # S0 on 5051, S1 (gpus) on 5053, S2 on 5052


# --- identity -------------------------------------------------------------------------------------------------


def test_subscribe_call_and_framework_id_saved_on_subscribed() -> None:
    h = Harness()
    body = h.b.subscribe_call()
    assert body["type"] == "SUBSCRIBE" and "framework_id" not in body
    info = body["subscribe"]["framework_info"]
    assert info["roles"] == ["*"] and info["checkpoint"] is True and "id" not in info
    assert {c["type"] for c in info["capabilities"]} >= {"MULTI_ROLE", "GPU_RESOURCES", "PARTITION_AWARE"}
    h.subscribed()
    assert h.saved == [FID] and h.b.framework_id == FID and h.b.subscribed
    body = h.b.subscribe_call()
    assert body["framework_id"] == {"value": FID} and body["subscribe"]["framework_info"]["id"] == {"value": FID}
    h.subscribed()  # the same id again: nothing new to save
    assert h.saved == [FID]


def test_loaded_framework_id_is_used_without_saving() -> None:
    h = Harness(fid=FID)
    assert h.b.subscribe_call()["framework_id"] == {"value": FID}
    h.subscribed()
    assert h.saved == []


def test_error_framework_removed_clears_the_framework_id() -> None:
    h = Harness(fid=FID)
    h.ready()
    h.event({"type": "ERROR", "error": {"message": "Framework has been removed"}})
    assert h.b.framework_id is None and h.saved == [None] and not h.b.subscribed
    assert "framework_id" not in h.b.subscribe_call()
    assert h.b.offers() == []  # the pool died with the subscription
    n = len(h.t.calls)
    h.b.kill(["x-0-1"])  # no framework id: nothing is sent
    assert len(h.t.calls) == n


def test_other_error_keeps_the_framework_id() -> None:
    h = Harness(fid=FID)
    h.ready()
    h.event({"type": "ERROR", "error": {"message": "Framework failed over"}})
    assert h.b.framework_id == FID and h.saved == [] and not h.b.subscribed


# --- offers ---------------------------------------------------------------------------------------------------


def test_offers_aggregated_per_agent_named_host_port_when_hostname_shared() -> None:
    h = Harness()
    h.subscribed()
    first, second = _transcript_offers()[:2]
    h.offers(first)
    got = {o.hostname: o for o in h.b.offers()}
    assert set(got) == {H0, H1, H2}  # three agents on 127.0.0.1: hostname:agent port
    for o in got.values():
        assert o.address == "127.0.0.1"
        assert o.free.cpu == 8 and o.free.mem == 16384 and o.free.disk == 100000
        assert o.ports[0] == 31000 and len(o.ports) == o.free.ports == 1000  # capped per offer
        assert o.labels["host"] == "127.0.0.1"
    assert got[H1].has_gpus and got[H1].free.gpu == 4 and got[H1].gpu_ids == (0, 1, 2, 3)
    assert not got[H0].has_gpus and got[H0].labels["rack"] == "r1" and got[H2].labels["agent"] == "agent2"
    # a second offer for the same agent pools with the first
    h.offers(second)
    got = {o.hostname: o for o in h.b.offers()}
    assert got[H0].free.cpu == 16 and got[H2].free.cpu == 16 and got[H1].free.cpu == 8


def test_single_agent_per_hostname_is_named_by_hostname() -> None:
    h = Harness()
    h.subscribed()
    first = _transcript_offers()[0]
    for i, o in enumerate(first):
        o["hostname"] = f"node{i}"
    h.offers(first)
    assert sorted(o.hostname for o in h.b.offers()) == ["node0", "node1", "node2"]


def test_rescind_removes_the_offer_from_the_pool() -> None:
    h = Harness()
    h.subscribed()
    first = _transcript_offers()[0]
    h.offers(first)
    h.event({"type": "RESCIND", "rescind": {"offer_id": first[0]["id"]}})  # S2's offer
    assert {o.hostname for o in h.b.offers()} == {H0, H1}


def test_failure_of_agent_empties_its_pool_and_marks_it_lost() -> None:
    h = Harness()
    h.ready()
    h.event({"type": "FAILURE", "failure": {"agent_id": {"value": S0}}})
    assert H0 not in {o.hostname for o in h.b.offers()}
    assert {x.hostname: x.state for x in h.b.hosts()}[H0] == "LOST"  # removed: `host list` says so
    # an executor exit is not an agent loss
    h.event({"type": "FAILURE", "failure": {"agent_id": {"value": S2}, "executor_id": {"value": "e"}, "status": 0}})
    assert H2 in {o.hostname for o in h.b.offers()}


TASK_STATES = ("TASK_STAGING", "TASK_STARTING", "TASK_RUNNING", "TASK_KILLING", "TASK_FINISHED", "TASK_FAILED",
               "TASK_KILLED", "TASK_LOST", "TASK_UNKNOWN")


def random_cluster(h: Harness, agents: int, tasks: int, rng: random.Random) -> None:
    """`agents` agents offered (some sharing a hostname, so named host:port; a tenth failed: LOST) and `tasks` tasks
    of any state, each on one of them, on no agent, or on one never offered."""
    template = _transcript_offers()[0][0]
    offers = []
    for i in range(agents):
        o = copy.deepcopy(template)
        o["id"]["value"], o["agent_id"]["value"] = f"O{i}", f"S{i}"
        o["hostname"] = f"node{rng.randrange(agents)}"
        o["url"]["address"]["port"] = 5051 + i
        offers.append(o)
    h.offers(offers)
    for i in rng.sample(range(agents), agents // 10):
        h.event({"type": "FAILURE", "failure": {"agent_id": {"value": f"S{i}"}}})
    for i in range(tasks):
        agent = rng.choice([f"S{rng.randrange(agents)}"] * 8 + ["", "S-never-offered"])
        h.b._tasks[f"t{i}"] = _Task(f"t{i}", agent, Resources(cpu=rng.random() * 4, mem=rng.randrange(1, 4096)),
                                    rng.choice(TASK_STATES))


def hosts_by_scanning(b: MesosBackend) -> list[HostInfo]:
    """hosts() as defined before its index: every task scanned for each agent, and every agent for its name."""
    out = []
    for a in b._agents.values():
        same = [x for x in b._agents.values() if x.hostname == a.hostname]
        name = a.hostname if len(same) <= 1 else f"{a.hostname}:{a.agent_port}"
        mine = [t for t in b._tasks.values() if t.agent_id == a.agent_id and _live(t.state)]
        alloc = Resources()
        for t in mine:
            alloc = alloc + t.resources
        out.append(HostInfo(
            hostname=name, address=a.hostname, capacity=a.capacity, allocated=alloc, labels=dict(a.attributes),
            state="LOST" if a.lost or not a.reachable else "UP", task_ids=tuple(sorted(t.task_id for t in mine)),
            holds_offer=bool(a.offers)))
    return out


@pytest.mark.parametrize("seed", range(5))
def test_hosts_are_what_scanning_every_task_for_each_agent_finds(seed: int) -> None:
    rng = random.Random(seed)
    h = Harness()
    h.subscribed()
    random_cluster(h, rng.randrange(10, 60), rng.randrange(100, 600), rng)
    got = h.b.hosts()
    assert got == hosts_by_scanning(h.b)
    assert any(":" in x.hostname for x in got) and any(x.task_ids for x in got)  # the cases that matter occur


# --- launch ---------------------------------------------------------------------------------------------------


def test_launch_one_accept_per_agent_with_task_infos() -> None:
    h = Harness()
    first = h.ready()
    offer_of = {o["agent_id"]["value"]: o["id"]["value"] for o in first}
    launch(h.b, [spec("job-0-1", H0, instance=0, ports=(31000,)), spec("job-1-1", H2, instance=1, ports=(31000,)),
                spec("job-2-1", H0, instance=2, ports=(31001,)), spec("job-3-1", H2, instance=3, ports=(31005,))])
    accepts = h.t.of("ACCEPT")
    assert len(accepts) == 2
    by_agent = {}
    for a in accepts:
        assert a["framework_id"] == {"value": FID}
        acc = a["accept"]
        (op,) = acc["operations"]
        assert op["type"] == "LAUNCH"
        infos = op["launch"]["task_infos"]
        (aid,) = {ti["agent_id"]["value"] for ti in infos}
        assert acc["offer_ids"] == [{"value": offer_of[aid]}]
        assert acc["filters"] == {"refuse_seconds": 1.0}
        by_agent[aid] = infos
    assert set(by_agent) == {S0, S2}
    assert [ti["task_id"]["value"] for ti in by_agent[S0]] == ["job-0-1", "job-2-1"]
    ti = by_agent[S2][1]
    assert ti["name"] == "job-3" and ti["task_id"] == {"value": "job-3-1"}
    res = {r["name"]: r for r in ti["resources"]}
    assert res["cpus"]["scalar"] == {"value": 4} and res["mem"]["scalar"] == {"value": 64}
    assert res["ports"]["ranges"] == {"range": [{"begin": 31005, "end": 31005}]}
    assert all(r["allocation_info"] == {"role": "*"} and r["role"] == "*" for r in ti["resources"])
    env = {v["name"]: v["value"] for v in ti["command"]["environment"]["variables"]}
    assert env["RANK"] == "3" and env["PELOTON_HOSTFILE_CONTENT"] == "127.0.0.1 slots=4\n"
    assert ti["command"]["shell"] is True and ti["command"]["value"].endswith("sleep 9")
    assert {x["key"]: x["value"] for x in ti["labels"]["labels"]} == {"peloton_job": "job", "peloton_attempt": "1"}
    # the offers were used: the remainder comes back from the master
    assert {o.hostname for o in h.b.offers()} == {H1}
    assert {t.task_id for t in h.b.running()} == {"job-0-1", "job-1-1", "job-2-1", "job-3-1"}
    hosts = {x.hostname: x for x in h.b.hosts()}
    assert hosts[H0].allocated.cpu == 8 and hosts[H0].task_ids == ("job-0-1", "job-2-1")


def test_each_member_of_a_job_with_roles_runs_its_roles_task() -> None:
    """The launcher's LaunchSpecs of a job with roles, launched through the backend: each TaskInfo carries its
    member's role: command, resources (GPUs for the workers only), environment; the hostfile lists the workers."""
    ps = Role("ps", 1, "python ps.py", Resources(cpu=2, mem=4096, ports=1), env={"PS_ONLY": "1"})
    worker = Role("worker", 2, "python worker.py", Resources(cpu=1, mem=1024, gpu=1, ports=1))
    job = JobSpec(name="tf", instances=3, command="", resources=Resources(), roles=(ps, worker))
    placed = GangPlacement("job/0", "job", 1, (
        MemberAssignment(0, "job-0-1", H0, "127.0.0.1", ps.resources, (), (31000,)),
        MemberAssignment(1, "job-1-1", H1, "127.0.0.1", worker.resources, (0,), (31001,)),
        MemberAssignment(2, "job-2-1", H1, "127.0.0.1", worker.resources, (1,), (31002,))))
    h = Harness()
    h.ready()
    launch(h.b, list(Launcher._gang_launch(placed, job).tasks))
    infos = {ti["task_id"]["value"]: ti for a in h.t.of("ACCEPT") for ti in a["accept"]["operations"][0]["launch"][
        "task_infos"]}
    assert {ti["agent_id"]["value"] for ti in infos.values()} == {S0, S1}
    res = {tid: {r["name"]: r.get("scalar", {}).get("value") for r in ti["resources"]} for tid, ti in infos.items()}
    assert res["job-0-1"] == {"cpus": 2, "mem": 4096, "ports": None}
    assert res["job-1-1"] == res["job-2-1"] == {"cpus": 1, "mem": 1024, "gpus": 1, "ports": None}
    env = {tid: {v["name"]: v["value"] for v in ti["command"]["environment"]["variables"]}
           for tid, ti in infos.items()}
    assert infos["job-0-1"]["command"]["value"].endswith("&& python ps.py")
    assert infos["job-2-1"]["command"]["value"].endswith("&& python worker.py")
    assert env["job-0-1"]["PS_ONLY"] == "1" and "PS_ONLY" not in env["job-1-1"]
    assert [(e["PELOTON_ROLE"], e["PELOTON_ROLE_RANK"]) for _, e in sorted(env.items())] == [
        ("ps", "0"), ("worker", "0"), ("worker", "1")]
    assert json.loads(env["job-2-1"]["TF_CONFIG"]) == {
        "cluster": {"ps": ["127.0.0.1:31000"], "worker": ["127.0.0.1:31001", "127.0.0.1:31002"]},
        "task": {"type": "worker", "index": 1}}
    assert env["job-0-1"]["PELOTON_HOSTFILE_CONTENT"] == "127.0.0.1 slots=2\n"  # the workers only


def test_a_task_runs_as_its_jobs_user_else_as_the_frameworks() -> None:
    h = Harness(user="svc-gang")
    h.ready()
    launch(h.b, [dataclasses.replace(spec("job-0-1", H0), user="alice"), spec("job-1-1", H2, instance=1)])
    users = {ti["task_id"]["value"]: ti["command"]["user"]
             for a in h.t.of("ACCEPT") for ti in a["accept"]["operations"][0]["launch"]["task_infos"]}
    assert users == {"job-0-1": "alice", "job-1-1": "svc-gang"}
    assert MesosOptions().user == "nobody"  # never root unless the operator says so (--mesos-user)


def test_an_allocated_uid_or_an_unvetted_system_account_fails_the_launch_for_good_sending_nothing() -> None:
    h = Harness(user="svc-gang")
    h.ready()
    with pytest.raises(LaunchError) as e:  # a uid has no name an agent could switch to
        launch(h.b, [dataclasses.replace(spec("job-0-1", H0), user="#70001")])
    assert e.value.permanent and "task.user: uid 70001 has no name on the Mesos agents" in e.value.message
    with pytest.raises(LaunchError) as e:  # a job created before identities, naming a service's account
        launch(h.b, [dataclasses.replace(spec("job-0-1", H0), user="postgres", legacy_user=True)])
    assert e.value.permanent and "task.user: postgres is a system account" in e.value.message
    assert not h.t.of("ACCEPT")
    launch(h.b, [dataclasses.replace(spec("job-0-1", H0), user="postgres")])  # vetted at submit: sent as it is
    assert [ti["command"]["user"] for a in h.t.of("ACCEPT")
            for ti in a["accept"]["operations"][0]["launch"]["task_infos"]] == ["postgres"]


def test_launch_fails_when_offers_were_rescinded() -> None:
    h = Harness()
    first = h.ready()
    h.event({"type": "RESCIND", "rescind": {"offer_id": first[1]["id"]}})  # S0's only offer
    with pytest.raises(LaunchError) as e:
        launch(h.b, [spec("job-0-1", H2), spec("job-1-1", H0, instance=1)])
    assert e.value.task_id == "job-1-1" and "no longer hold" in e.value.message
    assert e.value.outcome == LaunchOutcome.REFUSED  # type: ignore[attr-defined]  # nothing was sent
    assert not h.t.of("ACCEPT"), "nothing may be sent when one agent's offers are gone"


def test_launch_fails_on_unoffered_port_and_unknown_host() -> None:
    h = Harness()
    h.ready()
    with pytest.raises(LaunchError, match="ports"):
        launch(h.b, [spec("job-0-1", H0, ports=(40000,))])
    with pytest.raises(LaunchError, match="not known"):
        launch(h.b, [spec("job-0-1", "elsewhere:1")])
    assert not h.t.of("ACCEPT")


def test_a_member_that_cannot_be_described_sends_nothing_and_keeps_every_agents_offers() -> None:
    """A member whose TaskInfo cannot be built (CallError: here an id with a '/', which the master refuses) fails the
    launch for good before anything is sent. The agents handled before it must keep their offers in the pool and
    hold no member: offers taken out of the pool and never sent are never declined either, so the master keeps them
    ours until the stream ends (mesos-api.md §5.3: no --offer_timeout by default)."""
    h = Harness()
    h.ready()
    with pytest.raises(LaunchError) as e:
        launch(h.b, [spec("job-0-1", H0, instance=0), spec("job/1-1", H2, instance=1)])
    assert e.value.permanent
    assert not h.t.of("ACCEPT")
    assert {o.hostname for o in h.b.offers()} == {H0, H1, H2}
    assert not h.b.running()


def test_launch_not_subscribed() -> None:
    h = Harness()
    with pytest.raises(LaunchError, match="not subscribed"):
        launch(h.b, [spec("job-0-1", H0)])


def test_rejected_accept_kills_members_already_sent() -> None:
    h = Harness()
    h.ready()
    h.t.fail_nth["ACCEPT"] = 2
    with pytest.raises(LaunchError, match="ACCEPT on agent") as e:
        launch(h.b, [spec("job-0-1", H0), spec("job-1-1", H2, instance=1)])
    assert e.value.outcome == LaunchOutcome.FAILED  # type: ignore[attr-defined]  # one ACCEPT went out
    killed = {k["kill"]["task_id"]["value"]: k["kill"].get("agent_id") for k in h.t.of("KILL")}
    assert set(killed) == {"job-0-1", "job-1-1"}
    assert killed["job-0-1"] == {"value": S0} and killed["job-1-1"] == {"value": S2}


# --- status updates and acknowledgements -----------------------------------------------------------------------


def test_update_with_uuid_carries_an_ack_token_acknowledged_verbatim() -> None:
    h = Harness()
    h.ready()
    launch(h.b, [spec("job-0-1", H0)])
    st = h.update("job-0-1", "TASK_RUNNING", S0, UUID)
    assert st.state == TaskState.RUNNING and st.hostname == H0 and st.ack and not st.permanent
    assert not h.t.of("ACKNOWLEDGE"), "acknowledged before jobmgr persisted it"
    h.b.acknowledge([st.ack])
    (ack,) = h.t.of("ACKNOWLEDGE")
    assert ack == {"type": "ACKNOWLEDGE", "framework_id": {"value": FID},
                   "acknowledge": {"agent_id": {"value": S0}, "task_id": {"value": "job-0-1"}, "uuid": UUID}}


def test_update_without_uuid_needs_no_ack() -> None:
    h = Harness()
    h.ready()
    st = h.update("job-0-1", "TASK_DROPPED", S0, reason="REASON_INVALID_OFFERS", message="Offer is no longer valid")
    assert st.ack == "" and st.state == TaskState.LOST and st.reason == "TASK_DROPPED: REASON_INVALID_OFFERS"


def test_task_error_is_permanent_and_exit_code_parsed() -> None:
    h = Harness()
    h.ready()
    st = h.update("job-0-1", "TASK_ERROR", S0, reason="REASON_TASK_INVALID", message="Task uses invalid resources")
    assert st.state == TaskState.FAILED and st.permanent and st.ack == ""
    st = h.update("job-1-1", "TASK_FAILED", S0, UUID, message="Command exited with status 3")
    assert st.state == TaskState.FAILED and st.exit_code == 3 and not st.permanent
    st = h.update("job-2-1", "TASK_FINISHED", S0, UUID, message="Command exited with status 0")
    assert st.state == TaskState.SUCCEEDED and st.exit_code == 0
    st = h.update("job-3-1", "TASK_FAILED", S0, UUID, message="Failed to launch container")
    assert st.exit_code is None


@pytest.mark.parametrize(("mesos", "ours"), [("TASK_UNREACHABLE", TaskState.LOST), ("TASK_GONE", TaskState.LOST),
                                             ("TASK_KILLING", TaskState.KILLING), ("TASK_KILLED", TaskState.KILLED),
                                             ("TASK_STARTING", TaskState.STARTING)])
def test_state_mapping(mesos: str, ours: TaskState) -> None:
    h = Harness()
    h.ready()
    assert h.update("job-0-1", mesos, S0).state == ours


# --- kill -----------------------------------------------------------------------------------------------------


def test_kill_resent_every_kill_retry_until_terminal() -> None:
    h = Harness(kill_retry_s=5.0)
    h.ready()
    launch(h.b, [spec("job-0-1", H0)])
    h.update("job-0-1", "TASK_RUNNING", S0, UUID)
    h.b.kill(["job-0-1"])
    assert [k["kill"] for k in h.t.of("KILL")] == [{"task_id": {"value": "job-0-1"}, "agent_id": {"value": S0}}]
    h.tick(4.9)
    assert len(h.t.of("KILL")) == 1
    h.tick(0.1)
    assert len(h.t.of("KILL")) == 2
    h.tick(2)
    h.update("job-0-1", "TASK_KILLING", S0, UUID)  # not terminal: keep asking
    h.tick(3)
    assert len(h.t.of("KILL")) == 3
    h.update("job-0-1", "TASK_KILLED", S0, UUID)
    h.tick(30)
    assert len(h.t.of("KILL")) == 3
    h.b.kill(["job-0-1"])  # terminal already: nothing to send
    assert len(h.t.of("KILL")) == 3


def test_a_preemptions_kill_carries_its_grace_every_time_it_is_sent() -> None:
    h = Harness(kill_retry_s=5.0)
    h.ready()
    launch(h.b, [spec("job-0-1", H0)])
    h.update("job-0-1", "TASK_RUNNING", S0, UUID)
    h.b.kill(["job-0-1"], 30.0)
    h.tick(5)
    grace = {"grace_period": {"nanoseconds": 30_000_000_000}}
    assert [k["kill"].get("kill_policy") for k in h.t.of("KILL")] == [grace, grace]


def test_kill_of_unknown_task_has_no_agent_id() -> None:
    h = Harness()
    h.ready()
    h.b.kill(["job-9-1"])
    assert h.t.of("KILL")[-1]["kill"] == {"task_id": {"value": "job-9-1"}}
    assert "job-9-1" not in {t.task_id for t in h.b.running()}


def test_kill_stops_when_the_master_does_not_know_the_task() -> None:
    h = Harness(kill_retry_s=5.0)
    h.ready()
    h.b.kill(["job-9-1"])  # e.g. a member whose ACCEPT never reached the master (daemon died mid-launch)
    h.update("job-9-1", "TASK_UNKNOWN", message="Reconciliation: Task is unknown")  # the master's answer
    for _ in range(6):
        h.tick(5)
    assert len(h.t.of("KILL")) == 1, f"{len(h.t.of('KILL'))} KILLs for a task the master does not know"


def test_an_ended_task_is_forgotten_after_a_while_and_its_agent_kept_for_its_logs() -> None:
    """A daemon running for months holds and scans its live tasks, not every task it ever ran: an ended task is
    kept ENDED_KEEP_S (a late kill or reconcile is answered from it), then forgotten; its agent is remembered for
    `task logs`, and a kill of it sends nothing."""
    h = Harness(kill_retry_s=5.0)
    h.ready()
    launch(h.b, [spec("job-0-1", H0), spec("job-1-1", H2, instance=1)])
    h.update("job-0-1", "TASK_RUNNING", S0, UUID)
    h.update("job-1-1", "TASK_RUNNING", S2, UUID)
    h.update("job-0-1", "TASK_FINISHED", S0, UUID)
    h.b.kill(["job-1-1"])
    h.tick(backend.ENDED_KEEP_S - 1)
    assert "job-0-1" in h.b._tasks  # noqa: SLF001 - kept a while
    h.tick(2)
    assert set(h.b._tasks) == {"job-1-1"}  # noqa: SLF001 - the live one (a kill under way) stays
    assert h.b._ended == {"job-0-1": S0}  # noqa: SLF001
    kills = len(h.t.of("KILL"))
    h.b.kill(["job-0-1"])
    assert len(h.t.of("KILL")) == kills  # it ended: nothing sent
    # its logs are still read from its agent
    reads: list[tuple[str, int]] = []

    class Files:
        def reader(self, host: str, port: int) -> Callable[[str, int | None, int], tuple[bytes, int]]:
            reads.append((host, port))
            return lambda path, offset, length: (b"", 0)

    h.b._files = Files()  # type: ignore[assignment]  # noqa: SLF001
    h.b.read_log("job-0-1", "stdout", 0, 100)
    assert reads and reads[0][1] == 5051
    with pytest.raises(FailedPrecondition):
        h.b.read_log("job-7-1", "stdout", 0, 100)


def test_the_agents_of_forgotten_tasks_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backend, "MAX_ENDED_AGENTS", 2)
    h = Harness()
    h.ready()
    for i in range(4):
        h.update(f"job-{i}-1", "TASK_FINISHED", S0)
        h.tick(backend.ENDED_KEEP_S + 1)
    assert list(h.b._ended) == ["job-2-1", "job-3-1"]  # noqa: SLF001 - the oldest went first


# --- reconciliation -------------------------------------------------------------------------------------------


def test_reconciliation_after_subscribed_with_backoff_then_implicit() -> None:
    h = Harness()
    h.ready()
    launch(h.b, [spec("job-0-1", H0), spec("job-1-1", H2, instance=1)])
    h.update("job-0-1", "TASK_RUNNING", S0, UUID)
    h.update("job-1-1", "TASK_RUNNING", S2, UUID)
    h.event({"type": "DISCONNECTED"})
    assert not h.b.subscribed
    h.subscribed()
    n = len(h.t.of("RECONCILE"))
    h.tick(0.01)
    rec = h.t.of("RECONCILE")[n:]
    assert len(rec) == 1
    assert rec[0]["reconcile"] == {"tasks": [{"task_id": {"value": "job-0-1"}, "agent_id": {"value": S0}},
                                             {"task_id": {"value": "job-1-1"}, "agent_id": {"value": S2}}]}
    sent = [h.clock.t]
    for _ in range(40):  # 20 s in 0.5 s ticks: re-sent after 2, 4, 8 s (the top of the jitter: rand 1.0)
        h.tick(0.5)
        if len(h.t.of("RECONCILE")) > n + len(sent):
            sent.append(h.clock.t)
    gaps = [round(b - a, 1) for a, b in zip(sent, sent[1:], strict=False)]
    assert gaps[:3] == [2.0, 4.0, 8.0], gaps
    h.update("job-0-1", "TASK_RUNNING", S0, reason="REASON_RECONCILIATION")
    k = len(h.t.of("RECONCILE"))
    for _ in range(130):  # the next round asks only for what is still unanswered
        h.tick(0.5)
        if len(h.t.of("RECONCILE")) > k:
            break
    assert h.t.of("RECONCILE")[k]["reconcile"]["tasks"] == [{"task_id": {"value": "job-1-1"},
                                                             "agent_id": {"value": S2}}]
    h.update("job-1-1", "TASK_RUNNING", S2, reason="REASON_RECONCILIATION")
    m = len(h.t.of("RECONCILE"))
    h.tick(0.5)  # nothing pending: one implicit round, then quiet
    assert [c["reconcile"] for c in h.t.of("RECONCILE")[m:]] == [{"tasks": []}]
    h.tick(60)
    assert len(h.t.of("RECONCILE")) == m + 1


def test_no_ticks_while_disconnected() -> None:
    h = Harness()
    h.b.kill(["job-0-1"])
    h.tick(100)
    assert h.t.calls == []


def test_explicit_reconcile_waits_for_answers() -> None:
    h = Harness()
    h.ready()
    launch(h.b, [spec("job-0-1", H0)])
    h.update("job-0-1", "TASK_RUNNING", S0, UUID)
    h.clock.t += 1  # answers count only when they arrive after the question
    assert h.b.reconcile(["job-0-1"]) == {}  # no answer within reconcile_wait_s: left out
    h.clock.t += 1

    def answering(body: dict[str, Any]) -> None:  # the master answers the RECONCILE at once
        h.t.calls.append(body)
        if body["type"] == "RECONCILE":
            h.update("job-0-1", "TASK_RUNNING", S0, reason="REASON_RECONCILIATION")

    h.t.call = answering  # type: ignore[method-assign]
    got = h.b.reconcile(["job-0-1"])
    assert got["job-0-1"].state == TaskState.RUNNING
    assert h.t.of("RECONCILE")[-1]["reconcile"]["tasks"] == [{"task_id": {"value": "job-0-1"},
                                                              "agent_id": {"value": S0}}]


def test_no_reconciliation_of_a_member_whose_accept_is_still_on_its_way() -> None:
    """RECONCILE goes on the queries lane, ACCEPT on the offers lane: nothing orders two connections (mesos-api.md
    §3), and a gang's ACCEPTs go out one agent after the other. A RECONCILE that reaches the master before the
    ACCEPT of its task finds it unknown on a registered agent, and a real master answers TASK_GONE "Reconciliation:
    Task is unknown to the agent" (transcripts 09, 10): a member about to start reported lost, its gang failed for
    nothing. So a member whose ACCEPT is not answered yet is left out of every reconciliation (its caller keeps
    what it knew: LAUNCHING), and asked about once the ACCEPT is answered."""
    h = Harness()
    h.ready()
    gate = threading.Event()
    in_accept = threading.Event()
    record = h.t.call

    def slow_accept(body: dict[str, Any]) -> None:
        record(body)
        if body["type"] == "ACCEPT" and body["accept"]["operations"][0]["launch"]["task_infos"][0]["agent_id"] == {
                "value": S2}:
            in_accept.set()
            assert gate.wait(5)

    h.t.call = slow_accept  # type: ignore[method-assign]
    launcher = threading.Thread(target=launch, args=(h.b, [spec("job-0-1", H0, instance=0),
                                                           spec("job-1-1", H2, instance=1)]))
    launcher.start()
    try:
        assert in_accept.wait(5)
        asked = h.b.reconcile(["job-0-1", "job-1-1"])  # e.g. the job manager's periodic full reconciliation
        named = [e["task_id"]["value"] for c in h.t.of("RECONCILE") for e in c["reconcile"]["tasks"]]
        assert "job-1-1" not in named, "a member whose ACCEPT is on its way was reconciled"
        assert "job-1-1" not in asked
        h.tick(100)  # nor by the ticker's reconciliation of what was left unanswered
        named = [e["task_id"]["value"] for c in h.t.of("RECONCILE") for e in c["reconcile"]["tasks"]]
        assert "job-1-1" not in named
    finally:
        gate.set()
        launcher.join(5)
    h.tick(100)  # the ACCEPT answered: the member is asked about now
    named = [e["task_id"]["value"] for c in h.t.of("RECONCILE") for e in c["reconcile"]["tasks"]]
    assert "job-1-1" in named


# --- suppress / revive ----------------------------------------------------------------------------------------


def test_suppress_after_idle_and_revive_on_demand() -> None:
    h = Harness(idle_suppress_s=30.0)
    first = h.ready()
    assert len(h.t.of("REVIVE")) == 1  # subscribed with demand: revived (filters of earlier declines cleared)
    assert not h.t.of("SUPPRESS")
    h.tick(29)
    assert not h.t.of("SUPPRESS") and not h.t.of("DECLINE")
    h.tick(2)
    (decline,) = h.t.of("DECLINE")
    assert {o["value"] for o in decline["decline"]["offer_ids"]} == {o["id"]["value"] for o in first}
    # a long filter: other frameworks get the resources meanwhile; our REVIVE clears it when a gang comes
    assert decline["decline"]["filters"] == {"refuse_seconds": 120.0}
    assert len(h.t.of("SUPPRESS")) == 1 and h.t.of("SUPPRESS")[0]["suppress"] == {"roles": ["*"]}
    assert h.b.suppressed
    h.tick(100)
    assert len(h.t.of("SUPPRESS")) == 1  # once
    h.b.demand()  # noted (demand() runs under the host manager's lock: no call from it)
    assert len(h.t.of("REVIVE")) == 1 and h.b.suppressed
    h.tick(0.5)  # the ticker's next pass revives
    assert h.t.of("REVIVE")[-1]["revive"] == {"roles": ["*"]} and not h.b.suppressed
    h.offers(_transcript_offers()[1])
    h.b.demand()
    h.tick(0.5)
    assert len(h.b.offers()) == 2
    assert len(h.t.of("REVIVE")) == 2  # not suppressed any more: no third REVIVE


def test_reading_the_offers_is_not_demand() -> None:
    """The placement engine syncs hosts every poll, idle or not: were that demand, offers were never suppressed
    (the daemon held every offer, declined it after offer_hold_s and got it back a second later, starving the
    other frameworks of a shared cluster)."""
    h = Harness(idle_suppress_s=30.0)
    h.ready()
    for _ in range(70):
        h.b.offers()  # a sync, every poll
        h.tick(1.0)
    assert len(h.t.of("SUPPRESS")) == 1 and h.b.suppressed
    assert len(h.t.of("REVIVE")) == 1  # the subscription's only


def _suppressed_on_the_master(t: FakeTransport) -> bool:
    """What the master makes of the calls it got: suppressed after a SUPPRESS, until a REVIVE."""
    last = [c["type"] for c in t.calls if c["type"] in ("SUPPRESS", "REVIVE")]
    return bool(last) and last[-1] == "SUPPRESS"


def test_a_ticker_pass_landing_while_subscribed_is_handled_waits_for_it() -> None:
    """The ticker's pass may come while SUBSCRIBED is being handled: the protocol core already knows the
    subscription, the backend is still saving the framework id. A pass that acted then sent a SUPPRESS (nothing
    pending yet) that the SUBSCRIBED handling "reset" afterwards: the master suppressed us, the backend believed
    not, never revived, and no offer came again (the flaky Mesos e2e tests: a gang re-queued after its first
    attempt was not placed within a minute). The pass now does nothing until the subscription is set up."""
    h = Harness(idle_suppress_s=30.0)

    def save_while_the_ticker_passes(fid: str | None) -> None:
        h.saved.append(fid)
        assert h.b.subscribed  # the protocol core knows the subscription already
        h.tick(100)  # nothing demanded since the start: idle

    h.b._save_fid = save_while_the_ticker_passes
    h.subscribed()
    assert h.saved == [FID]
    h.b.demand()  # a job comes
    h.tick(0.5)
    assert not _suppressed_on_the_master(h.t)  # offers keep coming
    assert not h.t.of("SUPPRESS")  # that pass did nothing
    h.tick(31)  # idle: suppressed, the backend knowing it
    assert _suppressed_on_the_master(h.t) and h.b.suppressed
    h.b.demand()
    h.tick(0.5)
    assert not _suppressed_on_the_master(h.t) and not h.b.suppressed  # revived on demand


def test_a_suppress_that_lands_on_the_next_subscription_is_revived_on_demand() -> None:
    """The ticker decides to SUPPRESS on one subscription and sends it after releasing its lock; the stream may
    end and a new SUBSCRIBED be handled in between (it resets `suppressed`), and the SUPPRESS then goes out on the
    new subscription: the master suppresses us while the backend believed not, and the next gang never got a
    REVIVE. The backend now believes the master suppresses it, and revives when a gang comes."""
    h = Harness(idle_suppress_s=30.0)
    h.ready()
    sent = h.t.call

    def resubscribed_meanwhile(body: dict[str, Any]) -> None:
        if body["type"] == "SUPPRESS":
            h.b._disconnected()  # the stream ended...
            h.subscribed()  # ...and a new one began before the SUPPRESS went out: it goes on that one
            h.t.call = sent  # type: ignore[method-assign]
        sent(body)

    h.t.call = resubscribed_meanwhile  # type: ignore[method-assign]
    h.tick(31)
    assert _suppressed_on_the_master(h.t)
    assert h.b.suppressed
    h.b.demand()  # a gang comes
    h.tick(0.5)
    assert not _suppressed_on_the_master(h.t) and not h.b.suppressed


def test_a_failed_suppress_is_sent_again() -> None:
    h = Harness(idle_suppress_s=30.0)
    h.ready()
    h.t.fail.add("SUPPRESS")
    h.tick(31)
    assert len(h.t.of("SUPPRESS")) == 1 and not h.b.suppressed
    h.t.fail.clear()
    h.tick(0.5)
    assert len(h.t.of("SUPPRESS")) == 2 and h.b.suppressed


def test_demand_revives_the_filter_of_idle_declines_even_when_the_suppress_failed() -> None:
    """Idle declines carry a long filter (idle_refuse_s): when a gang comes, a REVIVE clears it, even if the
    backend is not suppressed (its SUPPRESS failed), else those agents were kept from the gang that long."""
    h = Harness(idle_suppress_s=30.0)
    h.ready()
    h.t.fail.add("SUPPRESS")
    h.tick(31)
    assert h.t.of("DECLINE") and not h.b.suppressed
    h.b.demand()  # a gang comes
    h.tick(0.5)
    assert len(h.t.of("REVIVE")) == 2  # the subscription's, and this one
    h.b.demand()
    h.tick(0.5)
    assert len(h.t.of("REVIVE")) == 2  # the filter is gone: no other


def test_offers_while_believed_suppressed_and_idle_are_declined_and_suppressed_again() -> None:
    """A SUPPRESS that did not take (a subscription lifted it, say): offers keep coming while the backend believes
    itself suppressed. Each is declined, and SUPPRESS is sent again."""
    h = Harness(idle_suppress_s=30.0)
    h.ready()
    h.tick(31)
    assert len(h.t.of("SUPPRESS")) == 1 and h.b.suppressed
    h.offers(_transcript_offers()[1])  # the master does not suppress us after all
    h.tick(0.5)
    assert len(h.t.of("DECLINE")) == 2 and h.b.offers() == []
    assert len(h.t.of("SUPPRESS")) == 2 and h.b.suppressed
    h.tick(0.5)
    assert len(h.t.of("SUPPRESS")) == 2  # no offer since: once


def test_a_subscription_with_demand_revives_and_one_without_suppresses() -> None:
    """The master may keep the filters of the idle declines across a re-subscription; only a REVIVE clears
    them. After each SUBSCRIBED: REVIVE when gangs wait, else SUPPRESS once idle (mesos-api.md)."""
    h = Harness(idle_suppress_s=30.0)
    h.ready()
    h.tick(31)
    assert h.b.suppressed and len(h.t.of("REVIVE")) == 1
    h.b._disconnected()
    h.subscribed()  # a master failover: not suppressed any more, the filters perhaps still there
    h.b.demand()  # a gang waits
    h.tick(0.5)
    assert len(h.t.of("REVIVE")) == 2 and not h.b.suppressed
    h.tick(31)  # idle again
    h.b._disconnected()
    h.subscribed()
    h.tick(0.5)
    assert len(h.t.of("REVIVE")) == 2  # nothing waits: no REVIVE...
    assert _suppressed_on_the_master(h.t) and h.b.suppressed  # ...SUPPRESS


def test_failed_revive_is_retried() -> None:
    h = Harness(idle_suppress_s=1.0)
    h.ready()
    h.tick(5)
    assert h.b.suppressed
    h.t.fail.add("REVIVE")
    h.b.demand()
    h.tick(0.5)
    assert h.b.suppressed
    h.t.fail.clear()
    h.tick(0.5)  # the next pass sends it again, though no demand came since
    assert not h.b.suppressed and not _suppressed_on_the_master(h.t)
    n = len(h.t.of("REVIVE"))
    h.b.demand()
    h.tick(0.5)
    assert len(h.t.of("REVIVE")) == n  # not suppressed: no other


def test_offers_held_too_long_are_declined() -> None:
    h = Harness(offer_hold_s=10.0, idle_suppress_s=1000.0)
    h.ready()
    h.tick(9)
    h.b.demand()
    assert not h.t.of("DECLINE")
    h.tick(2)
    assert len(h.t.of("DECLINE")[0]["decline"]["offer_ids"]) == 3 and not h.t.of("SUPPRESS")


# --- an agent that comes back under a new id on the same host:port --------------------------------------------


def test_launch_uses_the_new_agent_registered_on_a_stale_agents_host_port() -> None:
    h = Harness()
    first = h.ready()
    h.event({"type": "FAILURE", "failure": {"agent_id": {"value": S0}}})  # S0 removed
    fresh = json.loads(json.dumps(first[1]))  # the agent on 5051 re-registers with a new id
    assert fresh["agent_id"]["value"] == S0
    fresh["agent_id"]["value"] = S0 + "-new"
    fresh["id"]["value"] = "O-new"
    h.offers([fresh])
    assert H0 in {o.hostname for o in h.b.offers()}  # offered under the same name
    launch(h.b, [spec("job-0-1", H0)])  # raises LaunchError: resolved to the stale S0, which has no offers
    assert h.t.of("ACCEPT")[-1]["accept"]["offer_ids"] == [{"value": "O-new"}]
