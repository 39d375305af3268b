"""End to end on the sim backend: the real daemon (SQLite and PostgreSQL) with 200 simulated hosts, driven through
the real CLI. No process runs: members last as long as PELOTON_SIM_DURATION says."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.harness import Daemon, wait_until

pytestmark = pytest.mark.e2e


@dataclass
class SimDaemon(Daemon):
    sim_hosts: int = 200

    def server_args(self) -> list[str]:
        return ["--backend", "sim", "--sim-hosts", str(self.sim_hosts), "--sim-host-resources",
                "cpu=16,mem=64Gi,gpu=8", "--sim-racks", "10", "--sim-seed", "1"]

    def host_table(self) -> dict[str, dict[str, Any]]:
        return {h["hostname"]: h for h in json.loads(self.cli("host", "list", "-o", "json").stdout)["hosts"]}


@pytest.fixture
def sim(db_url: str, tmp_path: Path) -> Iterator[SimDaemon]:
    d = SimDaemon(tmp_path / "data", db_url)
    try:
        d.start()
        yield d
    finally:
        d.stop()


def test_an_eight_member_gang_runs_for_its_duration_and_succeeds(sim: SimDaemon, tmp_path: Path) -> None:
    job = sim.create("""
name: sim-gang
instances: 8
task:
  command: train.py
  env: {PELOTON_SIM_DURATION: 1s}
  resources: {cpu: 4, mem: 8Gi, gpu: 4, ports: 1}
""", tmp_path)
    r = sim.cli("job", "wait", job, "--timeout", "60", check=False, timeout=90)
    assert r.returncode == 0, (r.stderr, sim.job(job), sim.log()[-3000:])
    tasks = sim.tasks(job)
    assert [t["state"] for t in tasks] == ["SUCCEEDED"] * 8
    assert all(t["host"].startswith("sim-") and t["exit_code"] == 0 for t in tasks)
    hosts = {t["host"] for t in tasks}
    assert len(hosts) >= 4  # 8 GPUs a host, 4 a member: at most two members share one
    log = sim.cli("task", "logs", job, "0").stdout.splitlines()
    assert "RUNNING on sim-" in log[0] and "runs 1s" in log[0] and log[1].endswith("SUCCEEDED: exit code 0")
    assert all(h["state"] == "UP" and h["labels"]["rack"].startswith("r") for h in sim.host_table().values())
    assert len(sim.host_table()) == 200


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # the restart rule, not the store's: one store
def test_a_gang_on_a_failed_host_is_restarted_and_succeeds(sim: SimDaemon, tmp_path: Path) -> None:
    # attempt 1 must still run when its host is failed: long enough for a loaded machine to get there
    job = sim.create("""
name: sim-recovery
instances: 4
gang: {on_member_failure: restart_gang}
retry: {max_attempts: 3}
task:
  command: train.py
  env: {PELOTON_SIM_DURATION: 12s}
  resources: {cpu: 8, mem: 8Gi, gpu: 8}
""", tmp_path)
    j = sim.wait_state(job, "RUNNING", timeout=60)
    victim = j["tasks"][0]["host"]
    r = sim.cli("sim", "fail-host", victim)
    assert r.stderr.strip() == f"failed host {victim}: 1 task(s) lost"
    hosts = sim.host_table()
    assert hosts[victim]["state"] == "DOWN" and hosts[victim]["task_ids"] == []
    (row,) = [line.split() for line in sim.cli("host", "list").stdout.splitlines() if line.startswith(victim)]
    assert row[2] == "DOWN"

    r = sim.cli("job", "wait", job, "--timeout", "90", check=False, timeout=120)
    assert r.returncode == 0, (r.stderr, sim.job(job), sim.log()[-3000:])
    j = sim.job(job)
    assert j["status"]["gangs"][0]["attempt"] == 2
    assert {t["attempt"] for t in j["tasks"]} == {2} and {t["state"] for t in j["tasks"]} == {"SUCCEEDED"}
    assert victim not in {t["host"] for t in j["tasks"]}
    history = json.loads(sim.cli("task", "get", job, "0", "-o", "json").stdout)["events"]
    lost = [e for e in history if e["state"] == "LOST"]
    assert lost and lost[0]["attempt"] == 1 and lost[0]["host"] == victim
    assert sim.host_table()[victim]["state"] == "DOWN"  # no recovery was asked for


def test_failure_injection_commands(sim: SimDaemon) -> None:
    # 5 s, not 1: on a loaded machine the next CLI call can take longer than a second to start, and the host
    # must still be down when it looks
    r = sim.cli("sim", "fail-host", "sim-00199", "--recover-after", "5s")
    assert r.stderr.strip() == "failed host sim-00199: 0 task(s) lost; it recovers in 5s"
    assert sim.host_table()["sim-00199"]["state"] == "DOWN"
    wait_until(lambda: sim.host_table()["sim-00199"]["state"] == "UP", 30, 0.3, "sim-00199 to recover")
    assert sim.cli("sim", "recover-host", "sim-00199").stderr.strip() == "host sim-00199 was not down"
    sim.cli("sim", "fail-host", "sim-00198")
    assert sim.cli("sim", "recover-host", "sim-00198").stderr.strip() == "recovered host sim-00198"
    r = sim.cli("sim", "fail-host", "sim-99999", check=False)
    assert (r.returncode, r.stderr.strip()) == (1, "peloton: error: no sim host 'sim-99999'")
    r = sim.cli("sim", "fail-host", "sim-00001", "--recover-after", "soon", check=False)
    assert r.returncode == 2 and r.stderr.startswith("peloton: error: --recover-after: ")


def test_sim_commands_against_another_backend_say_so(tmp_path: Path) -> None:
    d = Daemon(tmp_path / "data", f"sqlite:///{tmp_path}/peloton.db", hosts=1)
    try:
        d.start()
        r = d.cli("sim", "fail-host", "local-0", check=False)
        assert (r.returncode, r.stderr.strip()) == (1, "peloton: error: the daemon does not run the sim backend")
    finally:
        d.stop()
