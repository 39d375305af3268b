"""The metrics endpoint of a real daemon (SQLite and PostgreSQL, local backend): after a gang has run, the series a
dashboard and the alert rules read are there, named by the Prometheus conventions, without `_created` series."""

from __future__ import annotations

import socket
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e.harness import Daemon, serving, wait_until

pytestmark = pytest.mark.e2e


@dataclass
class MetricsDaemon(Daemon):
    metrics_port: int = 0

    def server_args(self) -> list[str]:
        return [*super().server_args(), "--metrics-listen", f"127.0.0.1:{self.metrics_port}"]


@pytest.fixture
def md(db_url: str, tmp_path: Path) -> Iterator[MetricsDaemon]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with serving(MetricsDaemon(tmp_path / "data", db_url, metrics_port=port)) as d:
        yield d


def test_the_metrics_endpoint_after_a_gang_ran(md: MetricsDaemon, tmp_path: Path) -> None:
    job = md.create("name: m\ninstances: 2\ntask: {command: 'true', resources: {cpu: 0.5, mem: 32Mi}}\n", tmp_path)
    md.wait_state(job, "SUCCEEDED")
    body = urllib.request.urlopen(f"http://127.0.0.1:{md.metrics_port}/metrics", timeout=10).read().decode()
    series = {line.split("{")[0].split(" ")[0] for line in body.splitlines() if line and not line.startswith("#")}
    assert not [s for s in series if s.endswith("_created")], "no _created series"
    for name in ("peloton_jobs_created_total", "peloton_gang_stage_seconds_bucket", "peloton_resmgr_queued_gangs",
                 "peloton_loop_heartbeat_timestamp_seconds", "peloton_jobmgr_gang_launches_total",
                 "peloton_placement_round_seconds_count", "peloton_hostmgr_task_status_total"):
        assert name in series, name
    stages = {line.split('stage="')[1].split('"')[0] for line in body.splitlines()
              if line.startswith("peloton_gang_stage_seconds_count{")}
    assert stages >= {"queued", "placing", "launched", "launching", "submitted_to_running"}
    # the conventions: counters end in _total; durations are in seconds (base units)
    types = dict(line.split()[2:4] for line in body.splitlines() if line.startswith("# TYPE peloton_"))
    assert all(name.endswith("_total") for name, kind in types.items() if kind == "counter"), types
    assert not [n for n in types if n.endswith(("_ms", "_milliseconds", "_minutes"))], types
    # read at scrape time: jobs, gangs and tasks by state from the store, the hosts and what they hold
    samples = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in body.splitlines()
               if line and not line.startswith("#")}
    assert samples['peloton_jobs{state="SUCCEEDED"}'] == 1
    assert samples['peloton_gangs{state="DONE"}'] == 1
    assert samples['peloton_tasks{state="SUCCEEDED"}'] == 2
    assert samples['peloton_hosts{state="up"}'] == md.hosts  # the harness's simulated local hosts
    assert samples['peloton_cluster_capacity{resource="cpu"}'] == 4 * md.hosts  # cpu=4 each
    assert samples['peloton_cluster_capacity{resource="gpu"}'] == 2 * md.hosts
    assert samples['peloton_cluster_allocated{resource="cpu"}'] == 0  # the gang has ended
    assert samples['peloton_cluster_capacity{resource="mem"}'] == 4 * 2**30 * md.hosts  # bytes: 4Gi each
    for h in range(md.hosts):  # each host, as `host list` shows it; memory in bytes
        assert samples[f'peloton_host_capacity{{host="local-{h}",resource="cpu"}}'] == 4
        assert samples[f'peloton_host_capacity{{host="local-{h}",resource="mem"}}'] == 4 * 2**30
        assert samples[f'peloton_host_capacity{{host="local-{h}",resource="gpu"}}'] == 2
        assert samples[f'peloton_host_allocated{{host="local-{h}",resource="cpu"}}'] == 0
    assert samples['peloton_leader{role="jobmgr"}'] == 1
    assert samples['peloton_store_transaction_seconds_count{kind="write"}'] > 0
    assert samples['peloton_store_transaction_seconds_count{kind="read"}'] > 0


def _samples(md: MetricsDaemon) -> dict[str, float]:
    body = urllib.request.urlopen(f"http://127.0.0.1:{md.metrics_port}/metrics", timeout=10).read().decode()
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in body.splitlines()
            if line and not line.startswith("#")}


def test_a_gang_waiting_for_hosts_counts_once_as_unplaced_and_hosts_show_what_they_hold(
        md: MetricsDaemon, tmp_path: Path) -> None:
    """A gang no host fits now (3 cpus left on each host, it needs 2 on one... after the blocker's 3 of 4 each) is
    tried every round; it counts once in peloton_placement_gangs_total, every time in _tries_total."""
    blocker = md.create("name: b\ninstances: 2\nplacement: {strategy: spread}\n"
                        "task: {command: 'sleep 600', resources: {cpu: 3, mem: 1Gi}}\n", tmp_path)
    md.wait_state(blocker, "RUNNING")
    waiter = md.create("name: w\ninstances: 1\ntask: {command: 'true', resources: {cpu: 2, mem: 64Mi}}\n", tmp_path)
    tried = 'peloton_placement_tries_total{result="unplaced"}'
    samples = wait_until(lambda: (s := _samples(md)).get(tried, 0) >= 3 and s, 30, 0.5, "3 tries of the waiting gang")
    assert samples['peloton_placement_gangs_total{result="unplaced"}'] == 1
    assert samples['peloton_placement_gangs_total{result="placed"}'] == 1  # the blocker
    for h in range(md.hosts):
        assert samples[f'peloton_host_allocated{{host="local-{h}",resource="cpu"}}'] == 3
        assert samples[f'peloton_host_allocated{{host="local-{h}",resource="mem"}}'] == 2**30
    assert samples['peloton_cluster_allocated{resource="cpu"}'] == 6
    md.cli("job", "stop", blocker)
    md.wait_state(waiter, "SUCCEEDED")
    samples = _samples(md)
    assert samples['peloton_placement_gangs_total{result="placed"}'] == 2
    assert samples['peloton_placement_gangs_total{result="unplaced"}'] == 1
