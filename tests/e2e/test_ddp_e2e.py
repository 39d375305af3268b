"""End to end: a real PyTorch DDP job (examples/ddp/train.py: CPU, gloo) run by the real daemon on the local
backend's simulated hosts, in two plans: both members on one host, and one member on each of two hosts. Each member
reports its speed in $PELOTON_METRICS_FILE (what `job get` reads for a model-aware gang); the test checks that the
job trains in step (the same weights on every member), that every member reported, and prints the measured samples/s
beside what the cost model's prior predicts for the same placement. It asserts no timing: tests never time anything.

torch is an optional dependency (the `ddp` extra); CI installs it (.ci/run). The store is not under test here: SQLite
only, which keeps this test (two real training jobs on 2 cores) at about half a minute.
"""

from __future__ import annotations

import importlib.util
import random
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from peloton.modelaware import metrics
from peloton.modelaware.cost import HostUse, predict
from peloton.modelaware.document import parse_document
from tests.e2e.harness import Daemon, serving

TRAIN = Path(__file__).resolve().parents[2] / "examples" / "ddp" / "train.py"
LOCAL_BSZ = 32
STEPS = 100

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                       reason="torch is not installed (the `ddp` extra: pip install torch; .ci/run installs it)"),
    pytest.mark.parametrize("db_url", ["sqlite"], indirect=True),
]


@pytest.fixture
def daemon(db_url: str, tmp_path: Path) -> Iterator[Daemon]:
    """The daemon, its hosts' ports below the kernel's ephemeral range (32768-60999 on Linux; the harness's default
    bases reach into it): rank 0 listens on its first port (MASTER_PORT), and on a busy machine an outgoing
    connection of any process may hold a port of that range as its source (gloo's TCPStore: EADDRINUSE)."""
    with serving(Daemon(tmp_path / "data", db_url, port_base=random.randrange(20000, 30001, 2000))) as d:
        yield d


def _fields(line: str) -> dict[str, str]:
    return dict(w.split("=", 1) for w in line.split()[1:] if "=" in w)


def _run(daemon: Daemon, tmp_path: Path, name: str, strategy: str) -> dict[str, object]:
    """One run of the DDP job as a 2-member gang, one simulated GPU per member (it trains on the CPU whatever
    CUDA_VISIBLE_DEVICES says); what its members printed and reported."""
    job = daemon.create(f"""
name: {name}
instances: 2
placement: {{strategy: {strategy}}}
retry: {{max_attempts: 1}}
task:
  command: {sys.executable} {TRAIN} --steps {STEPS} --warmup 5 --local-bsz {LOCAL_BSZ} --width 512 --report-every 25
  resources: {{cpu: 1, mem: 512Mi, gpu: 1, ports: 1}}
""", tmp_path)
    r = daemon.cli("job", "wait", job, "--timeout", "120", check=False, timeout=150)
    tasks = daemon.tasks(job)
    logs = {t["instance"]: daemon.cli("task", "logs", job, str(t["instance"])).stdout for t in tasks}
    if r.returncode != 0:
        errs = {i: daemon.cli("task", "logs", job, str(i), "--stderr", check=False).stdout[-3000:] for i in logs}
        pytest.fail(f"{name} did not succeed: {r.stderr}\ntasks: {tasks}\nstdout: {logs}\nstderr: {errs}")
    assert {t["state"] for t in tasks} == {"SUCCEEDED"}
    members = {}
    for inst, log in logs.items():
        line = next((x for x in log.splitlines() if x.startswith("ddp-member ")), None)
        assert line is not None, (inst, log)
        members[inst] = _fields(line)
    summary = next((x for x in logs[0].splitlines() if x.startswith("ddp-summary ")), None)
    assert summary is not None, logs[0]
    # each member's own report, read as the daemon reads it (the last valid line counts)
    reports = []
    for t in tasks:
        path = daemon.data_dir / "local" / "sandboxes" / t["task_id"] / "work" / metrics.FILE_NAME
        lines = path.read_text().splitlines()
        assert len(lines) == STEPS // 25, lines  # every --report-every steps, the end among them
        rep = metrics.parse(path.read_bytes())
        assert rep is not None and rep.samples_per_s > 0 and rep.step_time > 0, lines
        assert rep.local_bsz == LOCAL_BSZ, lines
        reports.append(rep)
    return {"tasks": tasks, "members": members, "summary": _fields(summary), "reports": reports}


def test_ddp_job_in_two_plans_reports_its_speed(daemon: Daemon, tmp_path: Path) -> None:
    plans = {"one host": _run(daemon, tmp_path, "ddp-pack", "pack"),
             "two hosts": _run(daemon, tmp_path, "ddp-spread", "spread")}
    assert len({t["host"] for t in plans["one host"]["tasks"]}) == 1  # type: ignore[attr-defined]
    assert len({t["host"] for t in plans["two hosts"]["tasks"]}) == 2  # type: ignore[attr-defined]

    rows = []
    for plan, run in plans.items():
        members: dict[int, dict[str, str]] = run["members"]  # type: ignore[assignment]
        # DDP kept the members in step: a world of 2, distinct ranks, the same weights at the end everywhere
        assert {m["world"] for m in members.values()} == {"2"}
        assert sorted(m["rank"] for m in members.values()) == ["0", "1"]
        assert len({m["checksum"] for m in members.values()}) == 1, members
        summary: dict[str, str] = run["summary"]  # type: ignore[assignment]
        assert float(summary["samples_per_s"]) > 0
        # the gang's figure as job get makes it from the members' reports (modelaware/metrics.py)
        measured = metrics.combine(run["reports"], gpus=2, local_bsz=LOCAL_BSZ)  # type: ignore[arg-type]
        assert measured is not None and measured.members == 2 and measured.samples_per_s > 0
        # the prior of a description of this MLP (what `job get` shows as predicted before any profile)
        doc = parse_document({"kind": "peloton.model/v1", "name": "ddp-mlp", "description": {
            "parameters": int(summary["params"]), "flops_per_sample": float(summary["flops_per_sample"]),
            "sync": "allreduce-ring", "local_bsz": LOCAL_BSZ}})
        placement = [HostUse(2)] if plan == "one host" else [HostUse(1), HostUse(1)]
        predicted = predict(doc.cost_params(), placement, LOCAL_BSZ)
        rows.append((plan, predicted.gpus_per_host, predicted.samples_per_s, measured.samples_per_s,
                     float(summary["samples_per_s"])))
    print("\nplan       placement  predicted samples/s (prior, T4)  measured samples/s (reports; rank 0's summary)")
    for plan, gph, pred, meas, summ in rows:
        print(f"{plan:<10} {','.join(map(str, gph)):<10} {pred:>31.1f}  {meas:>10.1f} ({summ:.1f})")
