"""What the CLI prints, through the real CLI against a real daemon (SQLite and PostgreSQL): tables with quantities
rounded in the spec's units and disk shown; `-o json` as a faithful record (every field with the value the daemon
acts on, null for what is not set, times in RFC 3339, durations like `300s`; docs/cli.md#json-output), which
`job create` takes back as the same spec; `job get` of a big job summarised by state in instance ranges."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.harness import Daemon, wait_until

pytestmark = pytest.mark.e2e

RFC3339 = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
MEM = "24105.1328125Mi"  # a MemTotal as the local backend reads it: 23.5Gi


@pytest.fixture(scope="module")
def shared_daemon_settings() -> dict[str, Any]:
    return {"host_resources": f"cpu=4,mem={MEM},disk=100Gi,gpu=2"}


@pytest.fixture
def d(shared_daemon: Daemon) -> Daemon:
    """One daemon per store for the module (tests/e2e/conftest.py): each test finds it idle, looks at its own jobs
    only, and what it leaves unfinished is stopped after it."""
    return shared_daemon


def _json(d: Daemon, *args: str) -> Any:
    return json.loads(d.cli(*args, "-o", "json").stdout)


def _times(doc: Any, names: tuple[str, ...]) -> list[Any]:
    """Every value of a key in `names`, anywhere in the document."""
    if isinstance(doc, dict):
        return [v for k, v in doc.items() if k in names] + [x for v in doc.values() for x in _times(v, names)]
    if isinstance(doc, list):
        return [x for v in doc for x in _times(v, names)]
    return []


def test_tables_round_quantities_and_show_disk_while_json_has_them_exact(d: Daemon) -> None:
    hosts = d.cli("host", "list").stdout
    assert "cpu=4,mem=23.5Gi,disk=100Gi,gpu=2" in hosts and "cpu=0,mem=0Mi,disk=0Mi" in hosts, hosts
    assert "24105" not in hosts
    (h0, _) = _json(d, "host", "list")["hosts"]
    assert h0["capacity"] == {"cpu": 4.0, "mem": MEM, "disk": "100Gi", "gpu": 2, "ports": 1000}
    assert h0["allocated"]["disk"] == "0Mi" and h0["drain_deadline"] is None  # not "", not 0.0
    wait_until(lambda: _json(d, "pool", "get", "/")["entitlement"], what="the cluster's capacity known")
    pool = d.cli("pool", "get", "/").stdout
    assert re.search(r"^mem\s+0Mi\s+-\s+0Mi\s+0Mi\s+47.1Gi$", pool, re.M), pool  # 2 x 23.5Gi
    assert re.search(r"^disk\s+0Mi\s+-\s+0Mi\s+0Mi\s+200Gi$", pool, re.M), pool
    assert "mem=47.1Gi,disk=200Gi" in d.cli("pool", "list").stdout
    root = _json(d, "pool", "list")["pools"][0]
    assert root["limit"] is None and root["entitlement"]["mem_mib"] == 2 * 24105.1328125


def test_json_is_a_faithful_record_that_job_create_takes_back(d: Daemon, tmp_path: Path) -> None:
    job_id = d.create("name: rec\ninstances: 2\ngang: {min_available: 0}\n"
                      "task: {command: 'sleep 300', resources: {cpu: 0.5, mem: 64Mi}}\n", tmp_path)
    d.wait_state(job_id, "RUNNING")
    job = d.job(job_id)
    spec = job["spec"]
    # effective values: what the daemon acts on, every section there
    assert spec["gang"] == {"min_available": 2, "on_member_failure": "restart_gang", "launch_timeout": "300s"}
    assert spec["sla"] == {"priority": 0, "preemptible": True, "max_runtime": None, "preemption_grace": "30s"}
    assert spec["retry"] == {"max_attempts": 3} and spec["respool"] == "/" and spec["placement"]["strategy"] == "pack"
    assert spec["task"]["resources"] == {"cpu": 0.5, "mem": "64Mi", "disk": "0Mi", "gpu": 0, "ports": 0}
    assert spec["task"]["container"] == {"image": ""}
    st = job["status"]
    assert RFC3339.fullmatch(st["created_at"]) and st["completed_at"] is None
    assert st["created_at"] <= st["updated_at"]
    tasks = job["tasks"]
    assert [t["exit_code"] for t in tasks] == [None, None]  # running: no exit code yet
    assert all(RFC3339.fullmatch(t["started_at"]) and t["finished_at"] is None for t in tasks)
    assert d.tasks(job_id) == tasks  # task list: the same record
    events = _json(d, "task", "get", job_id, "0")["events"]
    assert events and all(RFC3339.fullmatch(e["time"]) for e in events)
    assert [e["time"] for e in events] == sorted(e["time"] for e in events)
    listed = _json(d, "job", "list")["jobs"]
    assert listed[0]["id"] == job_id and listed[0]["spec"] == spec
    info = _json(d, "cluster", "info")
    assert RFC3339.fullmatch(info["started_at"]) and RFC3339.fullmatch(info["leadership"]["leading_since"])
    assert isinstance(info["leadership"]["epoch"], int)  # not protobuf's "1"
    sqlite = d.db_url.startswith("sqlite")
    assert (info["leadership"]["epoch"] == 0) == sqlite  # nobody to fence on SQLite: no epoch, no lease shown
    leader_line = next(x for x in d.cli("cluster", "info").stdout.splitlines() if x.startswith("leader:"))
    assert ("epoch" in leader_line) == (not sqlite), leader_line
    # no float epoch seconds anywhere
    stamps = _times([job, events, info], ("created_at", "updated_at", "completed_at", "started_at", "finished_at",
                                           "time", "leading_since"))
    assert stamps and all(s is None or RFC3339.fullmatch(s) for s in stamps)

    # the spec it prints, submitted again, is the same spec (JSON is YAML)
    again = tmp_path / "again.json"
    again.write_text(json.dumps(spec))
    copy = d.cli("job", "create", "-f", str(again)).stdout.strip()
    assert d.job(copy)["spec"] == spec
    d.cli("job", "stop", copy)
    d.cli("job", "stop", job_id)
    done = d.wait_state(job_id, "KILLED")
    assert RFC3339.fullmatch(done["status"]["completed_at"])
    assert done["status"]["completed_at"] >= done["status"]["created_at"]
    assert all(RFC3339.fullmatch(t["finished_at"]) for t in done["tasks"])


def test_queue_json_has_the_wait_as_a_time(d: Daemon, tmp_path: Path) -> None:
    blocker = d.create("name: b\ninstances: 2\nplacement: {strategy: spread}\n"
                       "task: {command: 'sleep 300', resources: {cpu: 3, mem: 64Mi}}\n", tmp_path)
    d.wait_state(blocker, "RUNNING")
    waiter = d.create("name: w\ninstances: 1\ntask: {command: 'true', resources: {cpu: 2, mem: 64Mi}}\n", tmp_path)
    gangs = wait_until(lambda: _json(d, "queue")["gangs"], 30, 0.3, "the waiting gang queued")
    assert gangs[0]["job_id"] == waiter and RFC3339.fullmatch(gangs[0]["enqueued_at"])
    assert gangs[0]["resources"]["disk"] == "0Mi"
    d.cli("job", "stop", blocker)


def test_job_get_of_a_big_job_groups_tasks_by_state_in_ranges(d: Daemon, tmp_path: Path) -> None:
    """30 instances of 0.5 cpu, gang 0 of 10, on 8 cpus: 16 run, 14 wait. More than 20 tasks: grouped, and --all
    has a row per task; a job of 20 tasks or fewer keeps a row per task."""
    job_id = d.create("name: big\ninstances: 30\ngang: {min_available: 10}\n"
                      "task: {command: 'sleep 300', resources: {cpu: 0.5, mem: 64Mi}}\n", tmp_path)

    def settled() -> bool:
        states = [t["state"] for t in d.tasks(job_id)]
        return states.count("RUNNING") == 16 and states.count("PENDING") == 14

    wait_until(settled, 60, 0.5, "16 tasks running and 14 pending")
    view = d.cli("job", "get", job_id).stdout
    assert "Tasks:     30 (14 PENDING, 16 RUNNING); by state and outcome (--all: a row per task):" in view, view
    rows = view.split("\nINSTANCES ")[1].splitlines()[1:]
    by_state: dict[str, set[int]] = {}
    for row in rows:
        ranges, state, count, *_ = row.split()
        members = {i for part in ranges.split(",") for i in _expand(part)}
        assert len(members) == int(count)
        by_state.setdefault(state, set()).update(members)
    assert len(rows) < 30 and sorted(by_state) == ["PENDING", "RUNNING"]
    assert len(by_state["RUNNING"]) == 16 and by_state["RUNNING"] | by_state["PENDING"] == set(range(30))
    assert "  gang 0 (instances 0-9): RUNNING, attempt 1" in view
    assert len(view.splitlines()) < 20  # not 21 gangs and 30 tasks
    every = d.cli("job", "get", job_id, "--all").stdout
    task_rows = every.split("\nINSTANCE ")[1].splitlines()[1:]
    assert [int(r.split()[0]) for r in task_rows] == list(range(30))
    assert every.count("\n  gang ") == 21
    small = d.create("name: small\ninstances: 2\ntask: {command: 'true', resources: {cpu: 0.5, mem: 64Mi}}\n",
                     tmp_path)
    assert "\nTasks:\nINSTANCE " in d.cli("job", "get", small).stdout
    d.cli("job", "stop", job_id)


def _expand(part: str) -> range:
    lo, _, hi = part.partition("-")
    return range(int(lo), int(hi or lo) + 1)
