"""End to end, a job with roles: the real daemon (SQLite and PostgreSQL) driven through the real CLI. On the local
backend its members run as processes and write down what they were given; a member's failure restarts every role.
On the sim backend, a mixed gang (CPU-only parameter servers, one-GPU workers) that fills two GPU hosts exactly is
placed whole."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e.harness import Daemon, pid_alive, serving, wait_until

pytestmark = pytest.mark.e2e


def _env(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


def test_members_learn_their_roles_and_a_failure_restarts_every_role(daemon: Daemon, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    # every member writes its environment and hostfile; on the first run worker 1 fails once the server has started
    record = (f"env > {out}/env-$PELOTON_ATTEMPT-$PELOTON_INSTANCE; cat $PELOTON_HOSTFILE > "
              f"{out}/hosts-$PELOTON_ATTEMPT-$PELOTON_INSTANCE; echo $$ > {out}/pid-$PELOTON_ATTEMPT-$PELOTON_INSTANCE")
    job = daemon.create(f"""
name: tf-roles
retry: {{max_attempts: 2}}
roles:
  - name: ps
    instances: 1
    task:
      command: '{record}; if [ "$PELOTON_ATTEMPT" = 1 ]; then sleep 300; fi'
      resources: {{cpu: 1, mem: 64Mi, ports: 1}}
      env: {{ROLE_ENV: ps}}
  - name: worker
    instances: 2
    task:
      command: >-
        {record}; if [ "$PELOTON_ATTEMPT" = 1 ]; then
        if [ "$PELOTON_ROLE_RANK" = 1 ]; then while [ ! -e {out}/pid-1-0 ]; do sleep 0.1; done; exit 7; fi;
        sleep 300; fi
      resources: {{cpu: 0.5, mem: 64Mi, gpu: 1, ports: 1}}
""", tmp_path)
    r = daemon.cli("job", "wait", job, "--timeout", "90", check=False, timeout=120)
    assert r.returncode == 0, (r.stderr, daemon.job(job), daemon.log()[-3000:])
    tasks = daemon.tasks(job)
    assert [(t["role"], t["role_rank"], t["attempt"], t["state"]) for t in tasks] == [
        ("ps", 0, 2, "SUCCEEDED"), ("worker", 0, 2, "SUCCEEDED"), ("worker", 1, 2, "SUCCEEDED")]
    # the server of the first run was killed with its gang, not left running
    assert not pid_alive(int((out / "pid-1-0").read_text()))
    env = {i: _env(out / f"env-2-{i}") for i in range(3)}
    endpoint = [f"{t['address']}:{t['ports'][0]}" for t in tasks]
    cluster = {"ps": endpoint[:1], "worker": endpoint[1:]}
    for i, (role, rank) in enumerate([("ps", 0), ("worker", 0), ("worker", 1)]):
        e = env[i]
        assert (e["PELOTON_ROLE"], e["PELOTON_ROLE_RANK"], e["RANK"], e["WORLD_SIZE"]) == (role, str(rank), str(i),
                                                                                          "3")
        assert json.loads(e["TF_CONFIG"]) == {"cluster": cluster, "task": {"type": role, "index": rank}}
        assert e["PELOTON_ROLE_HOSTS_WORKER"] == ",".join(endpoint[1:]) and e["PELOTON_ROLES"] == "ps,worker"
        assert (out / f"hosts-2-{i}").read_text() == "127.0.0.1 slots=2\n"  # the workers
    assert env[0]["ROLE_ENV"] == "ps" and "ROLE_ENV" not in env[1]
    assert env[0]["CUDA_VISIBLE_DEVICES"] == "" and env[1]["CUDA_VISIBLE_DEVICES"] != ""
    # the CLI shows the roles
    listed = daemon.cli("task", "list", job).stdout.splitlines()
    assert listed[0].split()[:2] == ["INSTANCE", "ROLE"] and listed[3].split()[:2] == ["2", "worker/1"]
    shown = daemon.cli("job", "get", job).stdout
    assert "Instances: 3 in 2 roles" in shown and "Roles:" in shown
    # a bad spec with roles: refused naming the field, nothing created
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nroles:\n  - {name: ps, instances: 1, task: {command: x, resources: {cpu: 1}}}\n"
                   "  - {name: ps, instances: 1, task: {command: x, resources: {cpu: 1}}}\n")
    r = daemon.cli("job", "create", "-f", str(bad), check=False)
    assert r.returncode == 2 and "roles[1].name: ps is also the name of roles[0]" in r.stderr, r.stderr
    assert [j["id"] for j in json.loads(daemon.cli("job", "list", "-o", "json").stdout)["jobs"]] == [job]


@dataclass
class TwoGpuHosts(Daemon):
    def server_args(self) -> list[str]:
        return ["--backend", "sim", "--sim-hosts", "2", "--sim-host-resources", "cpu=8,mem=64Gi,gpu=4",
                "--sim-seed", "1"]


@pytest.fixture
def sim(db_url: str, tmp_path: Path) -> Iterator[Daemon]:
    with serving(TwoGpuHosts(tmp_path / "data", db_url)) as d:
        yield d


def test_a_mixed_gang_fills_two_gpu_hosts_whole_on_the_sim_backend(sim: Daemon, tmp_path: Path) -> None:
    job = sim.create("""
name: mixed
roles:
  - name: ps
    instances: 2
    task: {command: ps.py, resources: {cpu: 4, mem: 8Gi, ports: 1}, env: {PELOTON_SIM_DURATION: 300s}}
  - name: worker
    instances: 8
    task: {command: worker.py, resources: {cpu: 1, mem: 4Gi, gpu: 1, ports: 1}, env: {PELOTON_SIM_DURATION: 300s}}
""", tmp_path)
    j = sim.wait_state(job, "RUNNING")
    assert [g["state"] for g in j["status"]["gangs"]] == ["RUNNING"]
    tasks = wait_until(lambda: [t for t in sim.tasks(job) if t["state"] == "RUNNING"], 30, what="members running")
    assert len(tasks) == 10
    per_host: dict[str, list[str]] = {}
    for t in tasks:
        per_host.setdefault(t["host"], []).append(t["role"])
        assert len(t["gpus"]) == (1 if t["role"] == "worker" else 0), t
    assert sorted(sorted(v) for v in per_host.values()) == [["ps"] + ["worker"] * 4] * 2
    sim.cli("job", "stop", job)
    sim.wait_state(job, "KILLED")
