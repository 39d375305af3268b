"""Heterogeneous simulated clusters, end to end: the real daemon started with host groups (`--sim-host-group`,
`--local-host-group`), seen through the real CLI (`host list`, `host get`), and placed on by label. The store plays
no part in the hosts' labels: SQLite only."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.harness import Daemon, serving

pytestmark = pytest.mark.e2e

T4 = "8:cpu=48,mem=192Gi,gpu=4:gpu_model=t4,nic_gbps=50"
A100 = "4:cpu=96,mem=1Ti,gpu=8:gpu_model=a100,nic_gbps=400,gpu_link=nvlink"


@dataclass
class GroupsDaemon(Daemon):
    groups: tuple[str, ...] = ()
    backend: str = "sim"

    def server_args(self) -> list[str]:
        flag = "--sim-host-group" if self.backend == "sim" else "--local-host-group"
        args = [a for g in self.groups for a in (flag, g)]
        if self.backend == "sim":
            return ["--backend", "sim", "--sim-seed", "1", *args]
        return [*args, "--local-port-base", str(self.port_base)]

    def host_table(self) -> dict[str, dict[str, Any]]:
        return {h["hostname"]: h for h in json.loads(self.cli("host", "list", "-o", "json").stdout)["hosts"]}


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[GroupsDaemon]:
    with serving(GroupsDaemon(tmp_path / "data", f"sqlite:///{tmp_path}/peloton.db", groups=(T4, A100))) as d:
        yield d


def test_a_sim_cluster_of_two_host_groups_shows_both_kinds(sim: GroupsDaemon, tmp_path: Path) -> None:
    hosts = sim.host_table()
    assert sorted(hosts) == [f"sim-{i:05d}" for i in range(12)]
    t4 = [hosts[f"sim-{i:05d}"] for i in range(8)]
    a100 = [hosts[f"sim-{i:05d}"] for i in range(8, 12)]
    for h in t4:
        assert (h["capacity"]["cpu"], h["capacity"]["mem"], h["capacity"]["gpu"]) == (48, "192Gi", 4)
        assert {k: h["labels"][k] for k in ("gpu_model", "nic_gbps")} == {"gpu_model": "t4", "nic_gbps": "50"}
        assert "gpu_link" not in h["labels"] and h["labels"]["rack"].startswith("r")
        assert h["hardware"] == {"gpu_model": "t4", "nic_gbps": 50.0, "gpu_link": "pcie",
                                 "defaulted": ["gpu_link"], "invalid": []}
    for h in a100:
        assert (h["capacity"]["cpu"], h["capacity"]["mem"], h["capacity"]["gpu"]) == (96, "1024Gi", 8)
        assert h["hardware"] == {"gpu_model": "a100", "nic_gbps": 400.0, "gpu_link": "nvlink", "defaulted": [],
                                 "invalid": []}
    table = sim.cli("host", "list").stdout.splitlines()
    assert "HARDWARE" in table[0]
    assert sum("t4 pcie 50G" in line for line in table) == 8
    assert sum("a100 nvlink 400G" in line for line in table) == 4
    detail = sim.cli("host", "get", "sim-00000").stdout
    assert "gpu model:  t4\n" in detail and "gpu link:   pcie (default)\n" in detail
    assert "nic:        50 Gbit/s\n" in detail and "capacity:   cpu=48,mem=192Gi,disk=0Mi,gpu=4\n" in detail
    assert json.loads(sim.cli("host", "get", "sim-00011", "-o", "json").stdout)["hardware"]["gpu_link"] == "nvlink"
    r = sim.cli("host", "get", "sim-99999", check=False)
    assert r.returncode == 1 and r.stderr.startswith("peloton: error: hostname: no host sim-99999 (hosts: sim-00000")

    # the labels are what constraints match: a gang asking for A100s lands on the A100 hosts only
    job = sim.create("""
name: on-a100
instances: 4
task:
  command: train.py
  env: {PELOTON_SIM_DURATION: 1s}
  resources: {cpu: 8, mem: 16Gi, gpu: 8}
placement:
  constraints: [{attribute: gpu_model, op: eq, value: a100}]
""", tmp_path)
    assert sim.cli("job", "wait", job, "--timeout", "60", check=False, timeout=90).returncode == 0, sim.job(job)
    assert sorted(t["host"] for t in sim.tasks(job)) == [f"sim-{i:05d}" for i in range(8, 12)]


def test_local_simulated_host_groups(tmp_path: Path) -> None:
    groups = ("2:cpu=2,mem=1Gi,gpu=2:gpu_model=t4,nic_gbps=50", "1:cpu=4,mem=2Gi")
    with serving(GroupsDaemon(tmp_path / "data", f"sqlite:///{tmp_path}/peloton.db", groups=groups,
                              backend="local")) as d:
        hosts = d.host_table()
        assert sorted(hosts) == ["local-0", "local-1", "local-2"]
        for name in ("local-0", "local-1"):
            assert hosts[name]["capacity"]["gpu"] == 2 and hosts[name]["labels"]["gpu_model"] == "t4"
            assert hosts[name]["hardware"] == {"gpu_model": "t4", "nic_gbps": 50.0, "gpu_link": "pcie",
                                               "defaulted": ["gpu_link"], "invalid": []}
        cpu_only = hosts["local-2"]
        assert (cpu_only["capacity"]["cpu"], cpu_only["capacity"]["gpu"]) == (4, 0)
        assert cpu_only["hardware"] == {"gpu_model": "", "nic_gbps": 25.0, "gpu_link": "", "defaulted": ["nic_gbps"],
                                        "invalid": []}
        assert "gpu model:  - (no GPUs)" in d.cli("host", "get", "local-2").stdout
