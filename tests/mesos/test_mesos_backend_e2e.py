"""End to end with the Mesos backend: the real daemon (`peloton server --backend mesos`) as a subprocess, driven
through the real CLI, against the in-process FakeMaster, with faults injected.

For every fault the invariants are the same: when the dust settles every member of the gang's current attempt
is RUNNING on the master and in the store (or none is), no task of an older attempt still runs on the master,
every task id was launched at most once (nothing duplicated), and the gang then finishes: SUCCEEDED.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.dbutil import drop_postgres_db, fresh_postgres_url, require_postgres
from tests.e2e.harness import Daemon, pid_alive, wait_until
from tests.mesos.conftest import default_agents
from tests.mesos.fake_master import TERMINAL_STATES, FakeAgent, FakeMaster

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

Factory = Callable[..., FakeMaster]

GANG = """
name: mesos-gang
instances: 4
task:
  command: sleep 1000
  resources: {cpu: 4, mem: 64Mi, ports: 1}
"""


CPU_AGENT = {"cpus": 8, "mem": 16384, "disk": 100000, "gpus": 0, "ports": [(31000, 32000)]}


def cpu_agents(n: int, ids: bool = False) -> list[FakeAgent]:
    """n agents of 8 cpu without GPUs, all on 127.0.0.1 (so the backend names them hostname:port). With `ids`,
    fixed agent ids: two masters of one cluster know the same agents under the same ids."""
    return [FakeAgent(f"agent-S{i}" if ids else None, "127.0.0.1", dict(CPU_AGENT),
                      {"rack": f"r{i}", "agent": f"agent{i + 1}"}, port=5051 + i)
            for i in range(n)]


# --------------------------------------------------------------------------------------------------------------
# The daemon, started with --backend mesos
# --------------------------------------------------------------------------------------------------------------


@dataclass
class MesosDaemon(Daemon):
    masters: str = ""

    def server_args(self) -> list[str]:
        return ["--backend", "mesos", "--mesos-master", self.masters]

    def close(self) -> None:
        """Stop for good, whatever state it is in (used by the fixture, also after a failure)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.stop()
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@pytest.fixture
def daemons() -> Iterator[list[MesosDaemon]]:
    made: list[MesosDaemon] = []
    yield made
    for d in made:
        d.close()


@pytest.fixture
def start_daemon(daemons: list[MesosDaemon], tmp_path: Path) -> Callable[..., MesosDaemon]:
    def start(masters: str, db_url: str | None = None, data_dir: Path | None = None) -> MesosDaemon:
        data = data_dir or tmp_path / "data"
        d = MesosDaemon(data, db_url or f"sqlite:///{tmp_path}/peloton.db", masters=masters)
        daemons.append(d)
        d.start()
        return d

    return start


@pytest.fixture
def pg_url() -> Iterator[str]:
    require_postgres()
    url = fresh_postgres_url()
    try:
        yield url
    finally:
        drop_postgres_db(url)


# --------------------------------------------------------------------------------------------------------------
# Inspection and invariants
# --------------------------------------------------------------------------------------------------------------


def attempt_of(task_id: str) -> int:
    return int(task_id.rsplit("-", 1)[1])


def master_tasks(fake: FakeMaster, job: str) -> dict[str, dict[str, Any]]:
    return {tid: t for tid, t in fake.tasks().items() if tid.startswith(job + "-")}


def accepted_infos(fake: FakeMaster) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(ACCEPT body, task_info) for every task launched."""
    out = []
    for c in fake.calls_of("ACCEPT"):
        acc = c["body"]["accept"]
        for op in acc.get("operations", []):
            for ti in op.get("launch", {}).get("task_infos", []):
                out.append((acc, ti))
    return out


def launched(fake: FakeMaster, job: str) -> list[str]:
    return [ti["task_id"]["value"] for _, ti in accepted_infos(fake) if ti["task_id"]["value"].startswith(job + "-")]


def launched_and_known(fake: FakeMaster, job: str, n: int) -> bool:
    """`n` tasks of `job` launched, and the master has processed their ACCEPTs (it records a call before it
    handles it, so a task can be in `launched` a moment before it is in `fake.tasks()`)."""
    ids = launched(fake, job)
    return len(ids) == n and set(ids) <= set(fake.tasks())


def store_tasks(d: MesosDaemon, job: str) -> list[dict[str, Any]]:
    return d.tasks(job)


def whole_and_running(fake: FakeMaster, d: MesosDaemon, job: str, *, min_attempt: int = 1,
                      ignore_unreachable: bool = False) -> list[dict[str, Any]] | None:
    """The store's tasks when the gang's current attempt runs whole on the master and in the store, and nothing
    else of the job is live on the master; else None."""
    tasks = store_tasks(d, job)
    ids = {t["task_id"] for t in tasks}
    if not tasks or any(t["state"] != "RUNNING" for t in tasks) or min(t["attempt"] for t in tasks) < min_attempt:
        return None
    on_master = master_tasks(fake, job)
    live = {tid for tid, t in on_master.items() if t["state"] not in TERMINAL_STATES
            and not (ignore_unreachable and t["unreachable"])}
    if live != ids or any(on_master[tid]["state"] != "TASK_RUNNING" for tid in ids):
        return None
    return tasks


def wait_whole(fake: FakeMaster, d: MesosDaemon, job: str, timeout: float = 30, **kw: Any) -> list[dict[str, Any]]:
    try:
        tasks: list[dict[str, Any]] = wait_until(lambda: whole_and_running(fake, d, job, **kw), timeout, 0.2,
                                                 f"gang of {job} running whole")
    except AssertionError as e:
        raise AssertionError(f"{e}\nstore: {json.dumps(d.job(job), indent=1)[:3000]}\nmaster: "
                             f"{master_tasks(fake, job)}\nlog:\n{d.log()[-4000:]}") from None
    assert_invariants(fake, d, job, tasks, ignore_unreachable=kw.get("ignore_unreachable", False))
    return tasks


def assert_invariants(fake: FakeMaster, d: MesosDaemon, job: str, tasks: list[dict[str, Any]] | None = None,
                      ignore_unreachable: bool = False) -> None:
    tasks = tasks if tasks is not None else store_tasks(d, job)
    attempts = {t["attempt"] for t in tasks}
    assert len(attempts) == 1, f"members of different attempts in one gang: {tasks}"
    current = attempts.pop()
    ids = launched(fake, job)
    assert len(ids) == len(set(ids)), f"a task id was launched twice: {sorted(ids)}"
    for tid, t in master_tasks(fake, job).items():
        if attempt_of(tid) < current and t["state"] not in TERMINAL_STATES:
            assert ignore_unreachable and t["unreachable"], f"old attempt still live on the master: {tid} {t}"
        assert attempt_of(tid) <= current, f"the master runs a task of a future attempt: {tid}"
    live = {tid for tid, t in master_tasks(fake, job).items() if t["state"] not in TERMINAL_STATES
            and attempt_of(tid) == current}
    assert live in (set(), {t["task_id"] for t in tasks}), f"partial gang on the master: {live} vs {tasks}"


def finish_and_succeed(fake: FakeMaster, d: MesosDaemon, job: str, tasks: list[dict[str, Any]]) -> dict[str, Any]:
    for t in tasks:
        fake.finish_task(t["task_id"])
    j = d.wait_state(job, "SUCCEEDED", "FAILED", "KILLED", timeout=30)
    assert j["status"]["state"] == "SUCCEEDED", (j, d.log()[-3000:])
    return j


def fid_of(fake: FakeMaster) -> str:
    """The framework id, once the daemon knows it too: the master's side of the subscription is not enough (a
    test that cut the stream then could cut it before SUBSCRIBED reached the daemon, which would then subscribe
    anew as another framework). The daemon's ticker reconciles on a subscription only once it has handled
    SUBSCRIBED (the framework id saved first): a RECONCILE on the current stream says so."""

    def known() -> str | None:
        for fid in fake.subscribed_frameworks:
            sid = fake.stream_id(fid)
            if any(c["headers"].get("Mesos-Stream-Id") == sid for c in fake.calls_of("RECONCILE")):
                return fid
        return None

    fid: str = wait_until(known, 20, 0.05, "framework subscribed (and the daemon knowing it)")
    return fid


def agent_of(fake: FakeMaster, task_id: str) -> str:
    return str(fake.tasks()[task_id]["agent_id"])


def kills(fake: FakeMaster) -> list[dict[str, Any]]:
    return [c["body"]["kill"] for c in fake.calls_of("KILL")]


def killed_ids(fake: FakeMaster) -> set[str]:
    return {k["task_id"]["value"] for k in kills(fake)}


# --------------------------------------------------------------------------------------------------------------
# 1. happy path
# --------------------------------------------------------------------------------------------------------------


def _check_happy(fake: FakeMaster, d: MesosDaemon, tmp_path: Path) -> None:
    fid = fid_of(fake)
    job = d.create(GANG, tmp_path)
    tasks = wait_whole(fake, d, job)
    accepts = [c["body"] for c in fake.calls_of("ACCEPT")]
    # one ACCEPT per agent, each holding every member placed there, offers of that agent only
    assert len(accepts) == 2, accepts
    agents = [{ti["agent_id"]["value"] for op in a["accept"]["operations"] for ti in op["launch"]["task_infos"]}
              for a in accepts]
    assert all(len(a) == 1 for a in agents) and len(set().union(*agents)) == 2, agents
    for a in accepts:
        assert a["framework_id"] == {"value": fid}
        assert a["accept"]["filters"]["refuse_seconds"] >= 0
        assert {op["type"] for op in a["accept"]["operations"]} == {"LAUNCH"}
    infos = accepted_infos(fake)
    assert sorted(ti["task_id"]["value"] for _, ti in infos) == sorted(t["task_id"] for t in tasks)
    offered_ports = [(31000, 32000)]
    master_port = set()
    for _, ti in infos:
        env = {v["name"]: v["value"] for v in ti["command"]["environment"]["variables"]}
        for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "PELOTON_HOSTS"):
            assert k in env, (k, env)
        assert env["WORLD_SIZE"] == "4"
        master_port.add((env["MASTER_ADDR"], env["MASTER_PORT"]))
        assert ti["command"]["shell"] is True and "sleep 1000" in ti["command"]["value"]
        labels = {x["key"]: x["value"] for x in ti["labels"]["labels"]}
        assert labels == {"peloton_job": job, "peloton_attempt": "1"}
        res = {r["name"]: r for r in ti["resources"]}
        assert res["cpus"]["scalar"]["value"] == 4 and res["mem"]["scalar"]["value"] == 64
        for r in ti["resources"]:
            assert r["allocation_info"] == {"role": "*"}, r
        ranges = res["ports"]["ranges"]["range"]
        ports = [p for rg in ranges for p in range(rg["begin"], rg["end"] + 1)]
        assert len(ports) == 1 and any(b <= ports[0] <= e for b, e in offered_ports), ranges
    assert sorted(int(e["RANK"]) for e in
                  ({v["name"]: v["value"] for v in ti["command"]["environment"]["variables"]} for _, ti in infos)) \
        == [0, 1, 2, 3]
    assert len(master_port) == 1, master_port
    # store ports are the ones launched
    for t in tasks:
        assert t["host"].startswith("127.0.0.1:"), t
    finish_and_succeed(fake, d, job, tasks)
    # every ACK names an update that carried a uuid, and every one matched the head of the update queue
    wait_until(lambda: len([a for a in fake.acks if a["task_id"].startswith(job)]) >= 12, 10, 0.1, "12 acks")
    acks = [a for a in fake.acks if a["task_id"].startswith(job)]
    assert len(acks) == 12 and all(a["matched"] for a in acks), acks
    assert all(a["framework_id"] == fid for a in acks)
    uuids = {ev["update"]["status"]["uuid"] for f, ev in fake.events
             if ev["type"] == "UPDATE" and "uuid" in ev["update"]["status"]}
    assert {a["uuid"] for a in acks} <= uuids
    assert not master_tasks(fake, job)  # terminal updates acknowledged: the master forgot them


def test_happy_path_one_accept_per_agent_env_ports_acks(fake_master_factory: Factory,
                                                        start_daemon: Callable[..., MesosDaemon],
                                                        tmp_path: Path) -> None:
    fake = fake_master_factory(default_agents())
    d = start_daemon(fake.url)
    _check_happy(fake, d, tmp_path)


def test_happy_path_on_postgresql(fake_master_factory: Factory, start_daemon: Callable[..., MesosDaemon],
                                  pg_url: str, tmp_path: Path) -> None:
    fake = fake_master_factory(default_agents())
    d = start_daemon(fake.url, db_url=pg_url)
    _check_happy(fake, d, tmp_path)


# --------------------------------------------------------------------------------------------------------------
# 2. framework id persisted across a daemon restart; the running gang adopted
# --------------------------------------------------------------------------------------------------------------


def _restart_adopts(fake: FakeMaster, start_daemon: Callable[..., MesosDaemon], db_url: str | None,
                    tmp_path: Path) -> None:
    d = start_daemon(fake.url, db_url=db_url)
    fid = fid_of(fake)
    job = d.create(GANG, tmp_path)
    before = wait_whole(fake, d, job)
    d.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
    assert d.proc.wait(20) == 0  # type: ignore[union-attr]
    wait_until(lambda: not fake.subscribed_frameworks, 10, 0.05, "stream closed")
    n_sub = len(fake.calls_of("SUBSCRIBE"))
    d2 = start_daemon(fake.url, db_url=db_url)
    wait_until(lambda: fake.subscribed_frameworks == [fid], 20, 0.05, "re-subscribed")
    subs = fake.calls_of("SUBSCRIBE")
    assert len(subs) > n_sub
    body = subs[-1]["body"]
    assert body["framework_id"] == {"value": fid}
    assert body["subscribe"]["framework_info"]["id"] == {"value": fid}
    assert subs[0]["body"].get("framework_id") is None  # the first daemon registered anew
    after = wait_whole(fake, d2, job)
    assert [(t["task_id"], t["attempt"]) for t in after] == [(t["task_id"], t["attempt"]) for t in before]
    assert not (killed_ids(fake) & {t["task_id"] for t in after}), "an adopted member was killed"
    assert d2.job(job)["status"]["gangs"][0]["attempt"] == 1
    finish_and_succeed(fake, d2, job, after)


def test_framework_id_persisted_and_gang_adopted_after_restart(fake_master_factory: Factory,
                                                               start_daemon: Callable[..., MesosDaemon],
                                                               tmp_path: Path) -> None:
    _restart_adopts(fake_master_factory(cpu_agents(2)), start_daemon, None, tmp_path)


def test_framework_id_persisted_on_postgresql(fake_master_factory: Factory, start_daemon: Callable[..., MesosDaemon],
                                              pg_url: str, tmp_path: Path) -> None:
    _restart_adopts(fake_master_factory(cpu_agents(2)), start_daemon, pg_url, tmp_path)


# --------------------------------------------------------------------------------------------------------------
# 3. offers rescinded before the ACCEPT
# --------------------------------------------------------------------------------------------------------------


def test_offer_rescinded_before_accept_is_never_used(fake_master_factory: Factory,
                                                     start_daemon: Callable[..., MesosDaemon], tmp_path: Path) -> None:
    fake = fake_master_factory(cpu_agents(3))
    d = start_daemon(fake.url)
    fid = fid_of(fake)
    wait_until(lambda: len({o["agent_id"] for o in fake.offers(fid)}) == 3, 10, 0.05, "offers on 3 agents")
    victim = fake.agents[0].agent_id
    assert victim is not None
    rescinded = set(fake.rescind_offer(victim))
    assert rescinded
    job = d.create(GANG, tmp_path)
    tasks = wait_whole(fake, d, job)
    used = {o["value"] for c in fake.calls_of("ACCEPT") for o in c["body"]["accept"]["offer_ids"]}
    assert not used & rescinded, "an ACCEPT used a rescinded offer"
    assert {c["status"] for c in fake.calls_of("ACCEPT")} == {202}
    assert all(t["attempt"] == 1 for t in tasks)
    finish_and_succeed(fake, d, job, tasks)


# --------------------------------------------------------------------------------------------------------------
# 4. offer rescinded while the ACCEPT is on the wire
# --------------------------------------------------------------------------------------------------------------


def test_rescind_during_accept_drops_members_and_restarts_the_gang(fake_master_factory: Factory,
                                                                   start_daemon: Callable[..., MesosDaemon],
                                                                   tmp_path: Path) -> None:
    fake = fake_master_factory(cpu_agents(2))
    d = start_daemon(fake.url)
    fid_of(fake)
    victim = fake.agents[1].agent_id
    assert victim is not None
    fake.rescind_next_accept(victim)
    job = d.create(GANG, tmp_path)
    tasks = wait_whole(fake, d, job, min_attempt=2)
    assert all(t["attempt"] == 2 for t in tasks)
    dropped = [ev["update"]["status"] for _, ev in fake.events if ev["type"] == "UPDATE"
               and ev["update"]["status"]["state"] == "TASK_DROPPED"]
    dropped_ids = {s["task_id"]["value"] for s in dropped}
    assert len(dropped_ids) == 2 and all(attempt_of(t) == 1 for t in dropped_ids), dropped
    # the survivors on the other agent were killed, by agent id
    first = [ti for _, ti in accepted_infos(fake) if attempt_of(ti["task_id"]["value"]) == 1]
    survivors = {ti["task_id"]["value"]: ti["agent_id"]["value"] for ti in first
                 if ti["task_id"]["value"] not in dropped_ids}
    assert len(survivors) == 2
    for tid, aid in survivors.items():
        ks = [k for k in kills(fake) if k["task_id"]["value"] == tid]
        assert ks and all(k.get("agent_id") == {"value": aid} for k in ks), (tid, ks)
    j = d.job(job)
    assert j["status"]["gangs"][0]["attempt"] == 2
    finish_and_succeed(fake, d, job, tasks)


# --------------------------------------------------------------------------------------------------------------
# 5. launch failures reported by the master
# --------------------------------------------------------------------------------------------------------------


def test_launch_dropped_restarts_as_attempt_2(fake_master_factory: Factory, start_daemon: Callable[..., MesosDaemon],
                                              tmp_path: Path) -> None:
    fake = fake_master_factory(cpu_agents(2))
    d = start_daemon(fake.url)
    fid_of(fake)
    fake.fail_launch(fake.agents[0].agent_id, "TASK_DROPPED")  # type: ignore[arg-type]
    job = d.create(GANG, tmp_path)
    tasks = wait_whole(fake, d, job, min_attempt=2)
    assert {t["attempt"] for t in tasks} == {2}
    first = {ti["task_id"]["value"] for _, ti in accepted_infos(fake) if attempt_of(ti["task_id"]["value"]) == 1}
    assert len(first) == 4
    finish_and_succeed(fake, d, job, tasks)


def test_launch_task_error_fails_the_job_without_retry(fake_master_factory: Factory,
                                                       start_daemon: Callable[..., MesosDaemon],
                                                       tmp_path: Path) -> None:
    fake = fake_master_factory(cpu_agents(2))
    d = start_daemon(fake.url)
    fid_of(fake)
    bad = fake.agents[0].agent_id
    assert bad is not None
    fake.fail_launch(bad, "TASK_ERROR", message="Task uses invalid resources: injected")
    job = d.create(GANG, tmp_path)
    j = d.wait_state(job, "FAILED", "SUCCEEDED", "KILLED", timeout=30)
    assert j["status"]["state"] == "FAILED", j
    assert "not be retried" in j["status"]["reason"], j["status"]["reason"]
    infos = accepted_infos(fake)
    assert {attempt_of(ti["task_id"]["value"]) for _, ti in infos} == {1}, "a permanent failure was retried"
    healthy = {ti["task_id"]["value"] for _, ti in infos if ti["agent_id"]["value"] != bad}
    assert len(healthy) == 2
    assert healthy <= killed_ids(fake)
    # nothing of the job lives on the master; every member is terminal in the store
    wait_until(lambda: not any(t["state"] not in TERMINAL_STATES for t in master_tasks(fake, job).values()), 10, 0.1,
               "job's tasks gone from the master")
    tasks = store_tasks(d, job)
    assert all(t["state"] in ("FAILED", "KILLED") for t in tasks), tasks
    assert_invariants(fake, d, job, tasks)


# --------------------------------------------------------------------------------------------------------------
# 6. agent loss mid-run, and the agent coming back
# --------------------------------------------------------------------------------------------------------------


def test_agent_loss_restarts_the_gang_elsewhere_and_kills_returning_tasks(
        fake_master_factory: Factory, start_daemon: Callable[..., MesosDaemon], tmp_path: Path) -> None:
    fake = fake_master_factory(cpu_agents(3))
    d = start_daemon(fake.url)
    fid_of(fake)
    job = d.create(GANG, tmp_path)
    first = wait_whole(fake, d, job)
    victim = agent_of(fake, first[0]["task_id"])
    on_victim = {t["task_id"] for t in first if agent_of(fake, t["task_id"]) == victim}
    others = {t["task_id"] for t in first} - on_victim
    assert len(on_victim) == 2 and len(others) == 2
    fake.lose_agent(victim)
    second = wait_whole(fake, d, job, min_attempt=2, ignore_unreachable=True)
    assert {t["attempt"] for t in second} == {2}
    assert not {agent_of(fake, t["task_id"]) for t in second} & {victim}
    assert others <= killed_ids(fake)
    states = {ev["update"]["status"]["task_id"]["value"]: ev["update"]["status"]["state"]
              for _, ev in fake.events if ev["type"] == "UPDATE"}
    assert all(states[t] in ("TASK_UNREACHABLE", "TASK_LOST") for t in on_victim), states
    # the old members on the lost agent still run there; when it comes back they must be killed
    assert all(fake.tasks()[t]["state"] == "TASK_RUNNING" for t in on_victim)
    fake.restore_agent(victim)
    wait_until(lambda: all(fake.tasks().get(t, {"state": "TASK_KILLED"})["state"] in TERMINAL_STATES
                           for t in on_victim), 20, 0.1, "returning old members killed")
    assert on_victim <= killed_ids(fake)
    tasks = wait_whole(fake, d, job, min_attempt=2)
    assert [t["task_id"] for t in tasks] == [t["task_id"] for t in second]
    finish_and_succeed(fake, d, job, tasks)


# --------------------------------------------------------------------------------------------------------------
# 7. a member fails while the gang runs
# --------------------------------------------------------------------------------------------------------------


def test_member_failure_kills_the_rest_and_restarts(fake_master_factory: Factory,
                                                    start_daemon: Callable[..., MesosDaemon], tmp_path: Path) -> None:
    fake = fake_master_factory(cpu_agents(2))
    d = start_daemon(fake.url)
    fid_of(fake)
    job = d.create(GANG, tmp_path)
    first = wait_whole(fake, d, job)
    fake.fail_task(first[2]["task_id"], message="Command exited with status 3")
    second = wait_whole(fake, d, job, min_attempt=2)
    assert {t["attempt"] for t in second} == {2}
    assert {t["task_id"] for t in first} - {first[2]["task_id"]} <= killed_ids(fake)
    failed = d.cli("task", "get", job, str(first[2]["instance"]), "-o", "json")
    events = json.loads(failed.stdout)["events"]
    assert any(e["state"] == "FAILED" and e.get("exit_code") == 3 and e["attempt"] == 1 for e in events), events
    finish_and_succeed(fake, d, job, second)


# --------------------------------------------------------------------------------------------------------------
# 8. / 9. the event stream breaks or goes silent
# --------------------------------------------------------------------------------------------------------------


def test_cut_stream_resubscribes_same_framework_and_reconciles(fake_master_factory: Factory,
                                                               start_daemon: Callable[..., MesosDaemon],
                                                               tmp_path: Path) -> None:
    fake = fake_master_factory(cpu_agents(2))
    d = start_daemon(fake.url)
    fid = fid_of(fake)
    job = d.create(GANG, tmp_path)
    before = wait_whole(fake, d, job)
    n_sub, n_rec = len(fake.calls_of("SUBSCRIBE")), len(fake.calls_of("RECONCILE"))
    fake.cut_stream()
    wait_until(lambda: len(fake.calls_of("SUBSCRIBE")) > n_sub and fake.subscribed_frameworks == [fid], 15, 0.05,
               "re-subscribed")
    assert fake.calls_of("SUBSCRIBE")[-1]["body"]["framework_id"] == {"value": fid}
    recs = wait_until(lambda: fake.calls_of("RECONCILE")[n_rec:] if any(
        c["body"]["reconcile"].get("tasks") for c in fake.calls_of("RECONCILE")[n_rec:]) else None, 15, 0.05,
        "explicit reconciliation")
    explicit = {e["task_id"]["value"] for c in recs for e in c["body"]["reconcile"].get("tasks", [])}
    assert {t["task_id"] for t in before} <= explicit
    wait_until(lambda: any(not c["body"]["reconcile"].get("tasks") for c in fake.calls_of("RECONCILE")[n_rec:]),
               15, 0.05, "implicit reconciliation")
    after = wait_whole(fake, d, job)
    assert [t["task_id"] for t in after] == [t["task_id"] for t in before]
    assert not killed_ids(fake), "a healthy member was killed after the stream was cut"
    finish_and_succeed(fake, d, job, after)


def test_silent_master_watchdog_resubscribes(fake_master_factory: Factory, start_daemon: Callable[..., MesosDaemon],
                                             tmp_path: Path) -> None:
    fake = fake_master_factory(cpu_agents(2))
    d = start_daemon(fake.url)
    fid = fid_of(fake)
    job = d.create(GANG, tmp_path)
    before = wait_whole(fake, d, job)
    n_sub = len(fake.calls_of("SUBSCRIBE"))
    t0 = time.monotonic()
    fake.go_silent()
    wait_until(lambda: len(fake.calls_of("SUBSCRIBE")) > n_sub, 10, 0.05, "watchdog re-subscribe")
    took = fake.calls_of("SUBSCRIBE")[-1]["time"] - t0
    # 5 missed heartbeats of 0.5 s, plus reconnect backoff (at most 0.5 s) and slack
    assert took >= 2.0, took  # not before the heartbeats were missed (the wait above bounds the rest)
    assert fake.calls_of("SUBSCRIBE")[-1]["body"]["framework_id"] == {"value": fid}
    wait_until(lambda: fake.subscribed_frameworks == [fid], 10, 0.05, "subscribed again")
    after = wait_whole(fake, d, job)
    assert [t["task_id"] for t in after] == [t["task_id"] for t in before]
    finish_and_succeed(fake, d, job, after)


# --------------------------------------------------------------------------------------------------------------
# 10. master failover: the old leader answers 307 to the new one
# --------------------------------------------------------------------------------------------------------------


def test_master_failover_follows_307_to_the_leader(fake_master_factory: Factory,
                                                   start_daemon: Callable[..., MesosDaemon], tmp_path: Path) -> None:
    a = fake_master_factory(cpu_agents(2, ids=True))
    b = fake_master_factory(cpu_agents(2, ids=True))  # the same cluster seen by the new leader
    d = start_daemon(f"{a.url},{b.url}")
    fid = fid_of(a)
    assert not b.calls
    a.set_leader(False, leader_url=b.url)
    wait_until(lambda: b.subscribed_frameworks == [fid], 20, 0.05, "subscribed to the new leader")
    redirected = [c for c in a.calls_of("SUBSCRIBE") if c.get("status") == 307]
    assert redirected, [(c["type"], c.get("status")) for c in a.calls]
    assert b.calls_of("SUBSCRIBE")[-1]["body"]["framework_id"] == {"value": fid}
    n_a = len(a.calls)
    job = d.create(GANG, tmp_path)
    tasks = wait_whole(b, d, job)
    assert len(b.calls_of("ACCEPT")) == 2
    assert not [c for c in a.calls[n_a:] if c["type"] not in ("SUBSCRIBE",) and c.get("status") != 307]
    finish_and_succeed(b, d, job, tasks)


def test_master_failover_mid_run_keeps_the_gang_while_agents_reregister(
        fake_master_factory: Factory, start_daemon: Callable[..., MesosDaemon], tmp_path: Path) -> None:
    """The master process dies and a new one takes over while the gang runs. It knows no task until the agents
    re-register (mesos-api.md §10.7): the daemon's reconciliation gets no reply meanwhile, and must neither take
    that silence for a loss nor kill anything; once the agents are back the same attempt runs on and finishes."""
    fake = fake_master_factory(cpu_agents(2), agent_reregister_delay=3.0)
    d = start_daemon(fake.url)
    fid = fid_of(fake)
    job = d.create(GANG, tmp_path)
    before = wait_whole(fake, d, job)
    n_kills = len(kills(fake))
    fake.crash()
    fake.restart()
    wait_until(lambda: fake.subscribed_frameworks == [fid], 20, 0.05, "subscribed to the new master")
    wait_until(lambda: all(a.state == "ACTIVE" for a in fake.agents), 10, 0.05, "agents re-registered")
    after = wait_whole(fake, d, job)
    assert [t["task_id"] for t in after] == [t["task_id"] for t in before]
    assert len(kills(fake)) == n_kills, kills(fake)[n_kills:]
    finish_and_succeed(fake, d, job, after)


def test_daemon_started_against_a_follower_finds_the_leader(fake_master_factory: Factory,
                                                            start_daemon: Callable[..., MesosDaemon],
                                                            tmp_path: Path) -> None:
    b = fake_master_factory(cpu_agents(2, ids=True))
    a = fake_master_factory(cpu_agents(2, ids=True), leader=False, leader_url=b.url)
    d = start_daemon(f"{a.url},{b.url}")
    fid_of(b)
    assert [c["status"] for c in a.calls_of("SUBSCRIBE")] == [307]
    job = d.create(GANG, tmp_path)
    tasks = wait_whole(b, d, job)
    finish_and_succeed(b, d, job, tasks)


# --------------------------------------------------------------------------------------------------------------
# 11. kill -9 of the daemon in the middle of a launch
# --------------------------------------------------------------------------------------------------------------


def test_kill9_mid_launch_never_leaves_a_partial_gang(fake_master_factory: Factory,
                                                      start_daemon: Callable[..., MesosDaemon],
                                                      tmp_path: Path) -> None:
    fake = fake_master_factory(cpu_agents(2))
    d = start_daemon(fake.url)
    fid = fid_of(fake)
    job = d.create(GANG, tmp_path)
    wait_until(lambda: len(fake.calls_of("ACCEPT")) >= 1, 20, 0.01, "first ACCEPT")
    d.kill9()
    assert d.proc is not None and not pid_alive(d.proc.pid)
    d2 = start_daemon(fake.url)
    wait_until(lambda: fake.subscribed_frameworks == [fid], 20, 0.05, "re-subscribed")
    tasks = wait_whole(fake, d2, job, timeout=40)
    attempt = tasks[0]["attempt"]
    first = {ti["task_id"]["value"] for _, ti in accepted_infos(fake) if attempt_of(ti["task_id"]["value"]) == 1}
    if attempt == 1:  # adopted whole: nothing of it was killed
        assert len(first) == 4 and not killed_ids(fake) & first
    else:  # torn down: every first-attempt member that reached the master was killed or is gone
        for tid in first:
            st = fake.tasks().get(tid)
            assert st is None or st["state"] in TERMINAL_STATES, (tid, st)
    finish_and_succeed(fake, d2, job, tasks)


# --------------------------------------------------------------------------------------------------------------
# An agent that comes back under a new agent id on the same host:port (agent restarted with a fresh work dir)
# --------------------------------------------------------------------------------------------------------------


def test_agent_reregistered_under_new_id_is_used(fake_master_factory: Factory,
                                                 start_daemon: Callable[..., MesosDaemon], tmp_path: Path) -> None:
    fake = fake_master_factory(cpu_agents(2))
    d = start_daemon(fake.url)
    fid = fid_of(fake)
    old = fake.agents[0]
    wait_until(lambda: len({o["agent_id"] for o in fake.offers(fid)}) == 2, 10, 0.05, "offers on 2 agents")
    fake.lose_agent(old.agent_id)  # type: ignore[arg-type]
    wait_until(lambda: any(ev["type"] == "FAILURE" for _, ev in fake.events), 10, 0.05, "agent removed")
    new = fake.add_agent(FakeAgent(None, old.hostname, dict(CPU_AGENT), dict(old.attributes), port=old.port))
    assert new.agent_id != old.agent_id
    wait_until(lambda: any(o["agent_id"] == new.agent_id for o in fake.offers(fid)), 10, 0.05, "offer of new agent")
    job = d.create(GANG, tmp_path)
    j = d.wait_state(job, "RUNNING", "FAILED", timeout=20)
    assert j["status"]["state"] == "RUNNING", j["status"]["reason"]
    tasks = wait_whole(fake, d, job)
    assert {agent_of(fake, t["task_id"]) for t in tasks} == {new.agent_id, fake.agents[1].agent_id}
    finish_and_succeed(fake, d, job, tasks)


# --------------------------------------------------------------------------------------------------------------
# agent loss mid-launch: members accepted but not yet running when their agent goes away
# --------------------------------------------------------------------------------------------------------------


def test_agent_loss_mid_launch_restarts_the_gang_whole(fake_master_factory: Factory,
                                                       start_daemon: Callable[..., MesosDaemon],
                                                       tmp_path: Path) -> None:
    fake = fake_master_factory(cpu_agents(3), launch_delay=3.0)  # members sit in STAGING for 3 s
    d = start_daemon(fake.url)
    fid_of(fake)
    job = d.create(GANG, tmp_path)
    wait_until(lambda: launched_and_known(fake, job, 4), 20, 0.05, "the gang's ACCEPTs")
    first = launched(fake, job)
    victim = agent_of(fake, first[0])
    on_victim = {t for t in first if agent_of(fake, t) == victim}
    fake.lose_agent(victim)
    second = wait_whole(fake, d, job, timeout=40, min_attempt=2, ignore_unreachable=True)
    assert {t["attempt"] for t in second} == {2}
    assert victim not in {agent_of(fake, t["task_id"]) for t in second}
    assert set(first) - on_victim <= killed_ids(fake)  # the members that were still launching elsewhere
    finish_and_succeed(fake, d, job, second)


def test_host_list_shows_agents_with_attributes_and_held_offers(fake_master_factory: Factory,
                                                                start_daemon: Callable[..., MesosDaemon],
                                                                tmp_path: Path) -> None:
    fake = fake_master_factory(cpu_agents(2))
    d = start_daemon(fake.url)
    fid_of(fake)
    job = d.create(GANG.replace("instances: 4", "instances: 2"), tmp_path)
    wait_whole(fake, d, job)

    def hosts() -> list[dict[str, Any]] | None:
        hs = json.loads(d.cli("host", "list", "-o", "json").stdout).get("hosts", [])
        return hs if len(hs) == 2 and any(h["task_ids"] for h in hs) else None

    hs = wait_until(hosts, 20, 0.2, "two agents in host list")
    assert {h["hostname"] for h in hs} == {"127.0.0.1:5051", "127.0.0.1:5052"}
    assert {h["labels"]["rack"] for h in hs} == {"r0", "r1"}
    assert all(float(h["capacity"]["cpu"]) == 8 for h in hs)
    busy = [h for h in hs if h["task_ids"]]
    assert sum(float(h["allocated"]["cpu"]) for h in busy) == 8  # 2 members x 4 cpu
    assert all(isinstance(h["offer_held"], bool) for h in hs)


def test_gang_not_running_within_launch_timeout_is_torn_down_and_requeued(
        fake_master_factory: Factory, start_daemon: Callable[..., MesosDaemon], tmp_path: Path) -> None:
    fake = fake_master_factory(cpu_agents(2), launch_delay=600.0)  # the first attempt never leaves STAGING
    d = start_daemon(fake.url)
    fid_of(fake)
    job = d.create(GANG + "gang: {launch_timeout: 2s}\n", tmp_path)
    wait_until(lambda: launched_and_known(fake, job, 4), 20, 0.05, "the first attempt's ACCEPTs")
    first = launched(fake, job)
    fake.launch_delay = 0.01  # the next attempt starts normally
    second = wait_whole(fake, d, job, timeout=40, min_attempt=2)
    assert {t["attempt"] for t in second} == {2}
    assert set(first) <= killed_ids(fake)  # every member of the slow attempt was killed
    history = d.cli("task", "get", job, "0", "-o", "json").stdout
    assert "launch timeout" in history, history  # the new attempt says why it was started
    finish_and_succeed(fake, d, job, second)


# --------------------------------------------------------------------------------------------------------------
# offers given back while nothing waits: SUPPRESS when idle, REVIVE when a gang comes
# --------------------------------------------------------------------------------------------------------------


def _suppressed_then_revived_for_a_job(fake: FakeMaster, d: MesosDaemon, tmp_path: Path) -> None:
    """Nothing queued: the daemon declines what it holds (with a long filter: other frameworks get it) and
    SUPPRESSes offers (within MesosOptions.idle_suppress_s, 30 s), though its placement engine reads the hosts
    every poll. A job then makes it REVIVE, and its gang starts."""
    fid = fid_of(fake)
    since = len(fake.calls)  # the placement engine runs (`d` serves): what the daemon does from now on

    def suppressed() -> bool:  # on the master: a SUPPRESS since, and no REVIVE after it
        last = [c["type"] for c in fake.calls[since:] if c["type"] in ("SUPPRESS", "REVIVE")]
        return bool(last) and last[-1] == "SUPPRESS"

    wait_until(suppressed, 60, 0.2, f"SUPPRESS from an idle daemon; log:\n{d.log()[-3000:]}")
    declined = [c["body"]["decline"] for c in fake.calls[since:] if c["type"] == "DECLINE"]
    assert declined and all(x["filters"]["refuse_seconds"] >= 60 for x in declined), declined
    wait_until(lambda: not fake.offers(fid), 10, 0.1, "no offer held while idle")
    suppressed_at = len(fake.calls)
    job = d.create(GANG, tmp_path)
    tasks = wait_whole(fake, d, job)
    assert any(c["type"] == "REVIVE" for c in fake.calls[suppressed_at:]), "the gang ran without a REVIVE?"
    finish_and_succeed(fake, d, job, tasks)


def test_an_idle_daemon_suppresses_offers_and_a_new_job_revives_them(
        fake_master_factory: Factory, start_daemon: Callable[..., MesosDaemon], tmp_path: Path) -> None:
    fake = fake_master_factory(default_agents())
    d = start_daemon(fake.url)
    _suppressed_then_revived_for_a_job(fake, d, tmp_path)


def test_split_roles_an_idle_host_manager_suppresses_and_revives_for_a_job(
        fake_master_factory: Factory, daemons: list[MesosDaemon], pg_url: str, tmp_path: Path) -> None:
    """The same with the host manager in a process of its own: that resmgr holds no gang reaches it over the
    internal gRPC (DequeueGangs' answer to the placement engine, then its SyncHosts)."""
    fake = fake_master_factory(default_agents())
    hostmgr = MesosDaemon(tmp_path / "hostmgr", pg_url, masters=fake.url, extra_args=("--role", "hostmgr"))
    daemons.append(hostmgr)
    hostmgr.start()
    rest = MesosDaemon(tmp_path / "rest", pg_url, masters=fake.url, extra_args=(
        "--role", "jobmgr,resmgr,placement", "--hostmgr", f"unix:{tmp_path / 'hostmgr' / 'internal.sock'}",
        "--internal-secret-file", str(tmp_path / "hostmgr" / "internal.secret")))
    daemons.append(rest)
    rest.start()
    _suppressed_then_revived_for_a_job(fake, rest, tmp_path)


def test_a_gang_queued_while_the_daemon_resubscribes_gets_the_offers_its_idle_declines_filtered(
        fake_master_factory: Factory, start_daemon: Callable[..., MesosDaemon], tmp_path: Path) -> None:
    """The master keeps a framework's filters across a re-subscription, and a SUBSCRIBE lifts a suppression but
    not them: the agents declined while idle (a 120 s filter, unscaled here) stay away from a gang queued meanwhile
    unless the daemon REVIVEs once subscribed again (it does, with a gang waiting: mesos-api.md, after every
    SUBSCRIBED)."""
    fake = fake_master_factory(default_agents(), client_time_scale=1.0)
    d = start_daemon(fake.url)
    fid = fid_of(fake)
    since = len(fake.calls)
    wait_until(lambda: any(c["type"] == "SUPPRESS" for c in fake.calls[since:]), 60, 0.2,
               f"SUPPRESS from an idle daemon; log:\n{d.log()[-3000:]}")
    wait_until(lambda: not fake.offers(fid), 10, 0.1, "no offer held while idle")
    subscribes = len(fake.calls_of("SUBSCRIBE"))
    fake.set_unavailable()  # the stream breaks, and the master answers 503 for a while
    fake.cut_stream(fid)
    job = d.create(GANG, tmp_path)
    wait_until(lambda: len(fake.calls_of("SUBSCRIBE")) > subscribes, 30, 0.1, "a SUBSCRIBE refused")
    fake.set_unavailable(False)
    tasks = wait_whole(fake, d, job)  # within 30 s: only a REVIVE lifts the 120 s filter
    finish_and_succeed(fake, d, job, tasks)
