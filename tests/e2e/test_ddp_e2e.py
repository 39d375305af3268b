"""End to end: a real PyTorch DDP job (examples/ddp/train.py: CPU, gloo) run by the real daemon on the local
backend's simulated hosts, in two plans: both members on one host, and one member on each of two hosts.

- As a plain gang (pack, then spread): the job trains in step (the same weights on every member at the end), every
  member reports its speed in $PELOTON_METRICS_FILE, and the measured samples/s are printed beside what
  `peloton model predict` says for the same placement from the MLP's description (`train.py --describe`).
- As a model-aware job naming that stored model, each plan chosen by the placement engine among the hosts its
  constraints allow: `job get` shows the plan, its prediction and what the members measured, and `model refit`
  records each measurement in the stored model beside its prediction.

Nothing here asserts a timing (tests never time anything): the figures are printed, and checked only to be there
and positive. torch is an optional dependency (the `ddp` extra); CI installs it (.ci/run), and without it these tests
skip. The store is not under test here: SQLite only, which keeps the file (four real training jobs on 2 cores) at
about half a minute.
"""

from __future__ import annotations

import importlib.util
import json
import random
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from peloton.modelaware import metrics
from tests.e2e.harness import PELOTON, Daemon, serving, wait_until

TRAIN = Path(__file__).resolve().parents[2] / "examples" / "ddp" / "train.py"
LOCAL_BSZ = 32
STEPS = 100
REPORT_EVERY = 25
MLP = f"--width 512 --local-bsz {LOCAL_BSZ}"  # 301,066 parameters

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                       reason="torch is not installed (the `ddp` extra; docs/development.md, Optional: torch; .ci/run installs it)"),
    pytest.mark.parametrize("db_url", ["sqlite"], indirect=True),
]


@dataclass
class DdpDaemon(Daemon):
    """local-0 with 2 (simulated) GPUs, local-1 and local-2 with one each; the members train on the CPU whatever
    CUDA_VISIBLE_DEVICES says. The hosts' ports lie below the kernel's ephemeral range (32768-60999 on Linux; the
    harness's random bases reach into it): rank 0 listens on its first port (MASTER_PORT), and on a busy machine an
    outgoing connection of any process may hold a port of that range as its source (gloo's TCPStore: EADDRINUSE)."""

    def server_args(self) -> list[str]:
        return ["--local-host-group", "1:cpu=4,mem=4Gi,gpu=2", "--local-host-group", "2:cpu=4,mem=4Gi,gpu=1",
                "--local-port-base", str(self.port_base)]


@pytest.fixture
def daemon(db_url: str, tmp_path: Path) -> Iterator[Daemon]:
    with serving(DdpDaemon(tmp_path / "data", db_url, port_base=random.randrange(20000, 29001, 1000))) as d:
        yield d


@pytest.fixture(scope="module")
def mlp_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The model document of the MLP the jobs train, as the README makes it."""
    path = tmp_path_factory.mktemp("model") / "mlp.json"
    r = subprocess.run([sys.executable, str(TRAIN), *MLP.split(), "--describe"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    path.write_text(r.stdout)
    assert json.loads(r.stdout)["description"]["parameters"] == 301066
    return path


def _fields(line: str) -> dict[str, str]:
    return dict(w.split("=", 1) for w in line.split()[1:] if "=" in w)


def _reports(daemon: Daemon, tasks: list[dict[str, Any]]) -> list[metrics.Report]:
    """Each member's metrics file, read as the daemon reads it (the last valid line counts)."""
    out = []
    for t in tasks:
        path = daemon.data_dir / "local" / "sandboxes" / t["task_id"] / "work" / metrics.FILE_NAME
        rep = metrics.parse(path.read_bytes())
        assert rep is not None and rep.samples_per_s > 0 and rep.step_time > 0, path.read_text()
        assert rep.local_bsz == LOCAL_BSZ, path.read_text()
        out.append(rep)
    return out


def _fail(daemon: Daemon, job: str, why: str) -> None:
    tasks = daemon.tasks(job)
    out = {t["instance"]: daemon.cli("task", "logs", job, str(t["instance"]), check=False).stdout[-2000:]
           for t in tasks}
    err = {t["instance"]: daemon.cli("task", "logs", job, str(t["instance"]), "--stderr", check=False).stdout[-3000:]
           for t in tasks}
    pytest.fail(f"{why}\njob: {daemon.job(job)}\nstdout: {out}\nstderr: {err}")


def _predict(model: Path, placement: str) -> float:
    r = subprocess.run([*PELOTON, "model", "predict", str(model), "--placement", placement, "--local-bsz",
                        str(LOCAL_BSZ), "-o", "json"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return float(json.loads(r.stdout)[0]["samples_per_s"])


def _finite_run(daemon: Daemon, tmp_path: Path, strategy: str) -> dict[str, Any]:
    """The job as a plain 2-member gang, one GPU each, to the end; what its members printed and reported."""
    job = daemon.create(f"""
name: ddp-{strategy}
instances: 2
placement: {{strategy: {strategy}}}
retry: {{max_attempts: 1}}
task:
  command: {sys.executable} {TRAIN} {MLP} --steps {STEPS} --warmup 5 --report-every {REPORT_EVERY}
  resources: {{cpu: 1, mem: 512Mi, gpu: 1, ports: 1}}
""", tmp_path)
    r = daemon.cli("job", "wait", job, "--timeout", "120", check=False, timeout=150)
    if r.returncode != 0:
        _fail(daemon, job, f"ddp-{strategy} did not succeed: {r.stderr}")
    tasks = daemon.tasks(job)
    assert {t["state"] for t in tasks} == {"SUCCEEDED"}
    logs = {t["instance"]: daemon.cli("task", "logs", job, str(t["instance"])).stdout for t in tasks}
    members = {}
    for inst, log in logs.items():
        line = next((x for x in log.splitlines() if x.startswith("ddp-member ")), None)
        assert line is not None, (inst, log)
        members[inst] = _fields(line)
    summary = next((x for x in logs[0].splitlines() if x.startswith("ddp-summary ")), None)
    assert summary is not None, logs[0]
    for t in tasks:  # a line every --report-every steps, the last at the end
        path = daemon.data_dir / "local" / "sandboxes" / t["task_id"] / "work" / metrics.FILE_NAME
        assert len(path.read_text().splitlines()) == STEPS // REPORT_EVERY, path.read_text()
    return {"tasks": tasks, "members": members, "summary": _fields(summary), "reports": _reports(daemon, tasks)}


def test_ddp_job_in_two_plans_reports_its_speed(daemon: Daemon, tmp_path: Path, mlp_model: Path) -> None:
    plans = {"2": _finite_run(daemon, tmp_path, "pack"), "1,1": _finite_run(daemon, tmp_path, "spread")}
    assert len({t["host"] for t in plans["2"]["tasks"]}) == 1
    assert len({t["host"] for t in plans["1,1"]["tasks"]}) == 2

    print("\nplain gangs: PLACEMENT  PREDICTED SAMPLES/S (prior, T4)  MEASURED (members' reports; rank 0's summary)")
    for placement, run in plans.items():
        members = run["members"]
        # DDP kept the members in step: a world of 2, distinct ranks, the same weights at the end everywhere
        assert {m["world"] for m in members.values()} == {"2"}
        assert sorted(m["rank"] for m in members.values()) == ["0", "1"]
        assert len({m["checksum"] for m in members.values()}) == 1, members
        assert int(run["summary"]["params"]) == 301066
        summary_rate = float(run["summary"]["samples_per_s"])
        # the gang's figure as job get makes it from the members' reports (modelaware/metrics.py)
        measured = metrics.combine(run["reports"], gpus=2, local_bsz=LOCAL_BSZ)
        assert measured is not None and measured.members == 2 and measured.samples_per_s > 0 and summary_rate > 0
        print(f"             {placement:<10} {_predict(mlp_model, placement):>31.1f}  "
              f"{measured.samples_per_s:.1f} ({summary_rate:.1f})")


def _model_aware_run(daemon: Daemon, tmp_path: Path, hosts: str) -> dict[str, Any]:
    """The job as a model-aware gang on `hosts`, training until stopped: its plan in `job get` once both members
    have reported."""
    job = daemon.create(f"""
name: ddp-model-aware
instances: 2
model: {{name: ddp-mlp, local_bsz: {LOCAL_BSZ}}}
placement:
  strategy: model-aware
  constraints: [{{attribute: host, op: in, value: "{hosts}"}}]
retry: {{max_attempts: 1}}
task:
  command: {sys.executable} {TRAIN} {MLP} --steps 0 --warmup 5 --report-every {REPORT_EVERY}
  resources: {{cpu: 1, mem: 512Mi, gpu: 1, ports: 1}}
""", tmp_path)
    daemon.wait_state(job, "RUNNING")

    def measured() -> dict[str, Any] | None:
        j = daemon.job(job)
        if j["status"]["state"] != "RUNNING":
            _fail(daemon, job, "the job ended while training until stopped")
        plan: dict[str, Any] = j["status"]["gangs"][0]["plan"]
        return plan if plan.get("measured_members") == 2 else None

    plan: dict[str, Any] = wait_until(measured, timeout=60, interval=0.3, what="both members' reports in job get")
    view = daemon.cli("job", "get", job).stdout
    tasks = daemon.tasks(job)
    # recorded with the stored model, against the prediction (too few rows to fit the model on: only recorded)
    refit = daemon.cli("model", "refit", "ddp-mlp", "--from-job", job).stdout
    assert f"{job}: GPUs per host {','.join(map(str, plan['gpus_per_host']))}, local batch {LOCAL_BSZ}: measured" in refit
    assert "recorded the measurements in model ddp-mlp" in refit, refit
    daemon.cli("job", "stop", job)
    daemon.wait_state(job, "KILLED")
    _reports(daemon, tasks)  # what job get read is in each member's file
    return {"plan": plan, "view": view, "tasks": tasks, "job": job}


def test_model_aware_ddp_job_shows_measured_beside_predicted(daemon: Daemon, tmp_path: Path,
                                                              mlp_model: Path) -> None:
    daemon.cli("model", "create", "ddp-mlp", "-f", str(mlp_model))
    runs = {"2": _model_aware_run(daemon, tmp_path, "local-0"),  # the 2-GPU host only
            "1,1": _model_aware_run(daemon, tmp_path, "local-1,local-2")}  # the two 1-GPU hosts
    print("\nmodel-aware (job get): PLAN  PREDICTED SAMPLES/S (prior, T4)  MEASURED SAMPLES/S")
    for placement, run in runs.items():
        plan = run["plan"]
        assert ",".join(map(str, plan["gpus_per_host"])) == placement, plan
        assert len({t["host"] for t in run["tasks"]}) == len(plan["gpus_per_host"])
        assert plan["samples_per_s"] == pytest.approx(_predict(mlp_model, placement))
        assert plan["measured_members"] == 2 and plan["measured_samples_per_s"] > 0 and plan["measured_step_time"] > 0
        assert "2 members reporting; prediction off by" in run["view"], run["view"]
        print(f"                       {placement:<5} {plan['samples_per_s']:>31.1f}  "
              f"{plan['measured_samples_per_s']:.1f}")
    # both measurements are kept in the stored model, each beside what was predicted for its plan
    stored = json.loads(daemon.cli("model", "get", "ddp-mlp", "-o", "json").stdout)
    got = {m["job_id"]: m for m in stored["document"]["measured"]}
    assert set(got) == {run["job"] for run in runs.values()}
    for placement, run in runs.items():
        m = got[run["job"]]
        assert ",".join(map(str, m["placement"])) == placement and m["local_bsz"] == LOCAL_BSZ
        assert m["step_time"] > 0 and m["predicted_step_time"] == pytest.approx(run["plan"]["step_time"])
