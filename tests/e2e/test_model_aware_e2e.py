"""Model-aware jobs end to end on the sim backend (everything above the backend is the production scheduler): a
stored model fitted on the public bert measurements, `job plan`, a job placed where the cost model rates the plan
best (still whole), `instances: auto`, and `job get`'s "why this plan". The store is incidental: SQLite only."""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from peloton.modelaware.cost import Reference
from peloton.modelaware.document import ModelDocument, document_to_dict
from peloton.modelaware.fit import fit
from peloton.modelaware.profile import ProfileRow, read_profile, select
from tests.e2e.harness import PELOTON, Daemon, serving, wait_until
from tests.public_data import require

pytestmark = pytest.mark.e2e

DATA = require() / "adaptdl" / "traces"
T4 = "4:cpu=48,mem=192Gi,gpu=4:gpu_model=t4,nic_gbps=50"  # the testbed of the measurements: 4 of its 16 hosts
SPEC = """
name: bert-ft
instances: {instances}
model: {{name: bert, local_bsz: 8{bounds}}}
placement: {{strategy: model-aware}}
task:
  command: python train.py
  env: {{PELOTON_SIM_DURATION: 1h}}
  resources: {{cpu: 4, mem: 8Gi, gpu: 1}}
"""


@dataclass
class SimDaemon(Daemon):
    def server_args(self) -> list[str]:
        return ["--backend", "sim", "--sim-seed", "1", "--sim-host-group", T4]


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[SimDaemon]:
    with serving(SimDaemon(tmp_path / "data", f"sqlite:///{tmp_path}/peloton.db")) as d:
        yield d


def bert_model(tmp_path: Path) -> Path:
    rows = read_profile((DATA / "bert" / "placements.csv").read_text())
    train = select(rows, {(1,), (4,), (1, 1), (1, 1, 1, 1), (4, 4), (4, 4, 4, 4)})
    params = fit(train, Reference("t4", 50, "pcie")).params
    path = tmp_path / "bert.json"
    path.write_text(json.dumps(document_to_dict(ModelDocument(name="bert", params=params))))
    return path


def test_a_model_aware_job_is_placed_where_the_cost_model_rates_it_best(sim: SimDaemon, tmp_path: Path) -> None:
    # without the stored model, the job is refused naming the field, and nothing is created
    spec = tmp_path / "job.yaml"
    spec.write_text(SPEC.format(instances=8, bounds=""))
    r = sim.cli("job", "create", "-f", str(spec), check=False)
    assert r.returncode == 2 and "model.name: no stored model 'bert'" in r.stderr, r.stderr
    assert json.loads(sim.cli("job", "list", "-o", "json").stdout)["jobs"] == []

    sim.cli("model", "create", "bert", "-f", str(bert_model(tmp_path)))
    plans = json.loads(sim.cli("job", "plan", "-f", str(spec), "-o", "json").stdout)
    assert plans["on_free_hosts"] is True and plans["instances"] == 8
    best = plans["plans"][0]
    # bert's two-host placements are its slowest (the measurements): the plan spreads over four hosts
    assert best["gpus_per_host"] == [2, 2, 2, 2] and len(set(best["hosts"])) == 4
    assert [p["samples_per_s"] for p in plans["plans"]] == sorted((p["samples_per_s"] for p in plans["plans"]),
                                                                  reverse=True)
    assert "GPUS/HOST" in sim.cli("job", "plan", "-f", str(spec)).stdout

    job = sim.cli("job", "create", "-f", str(spec)).stdout.strip()
    got = sim.wait_state(job, "RUNNING")
    tasks = sim.tasks(job)
    assert sorted(Counter(t["host"] for t in tasks).values()) == [2, 2, 2, 2]  # whole, on the plan's hosts
    plan = got["status"]["gangs"][0]["plan"]
    assert plan["gpus_per_host"] == [2, 2, 2, 2] and plan["step_time"] == pytest.approx(best["step_time"])
    assert [a["gpus_per_host"] for a in plan["alternatives"]] and not plan.get("measured_members")
    view = sim.cli("job", "get", job).stdout
    assert "plan: GPUs per host 2,2,2,2, local batch 8" in view and "runner-ups:" in view
    assert "measured: not reported yet" in view  # simulated members measure nothing

    # instances: auto chooses the count on what is free now (the rest of the cluster: 8 GPUs on 4 hosts)
    auto = tmp_path / "auto.yaml"
    auto.write_text(SPEC.format(instances="auto", bounds=", min_instances: 2, max_instances: 8")
                    .replace("bert-ft", "bert-auto"))
    chosen = json.loads(sim.cli("job", "plan", "-f", str(auto), "-o", "json").stdout)["instances"]
    assert 2 <= chosen <= 8
    job2 = sim.cli("job", "create", "-f", str(auto)).stdout.strip()
    got2 = sim.wait_state(job2, "RUNNING")
    assert got2["spec"]["instances"] == chosen and got2["spec"]["model"]["auto_instances"] is True


@dataclass
class LocalDaemon(Daemon):
    def server_args(self) -> list[str]:
        return ["--local-host-group", "2:cpu=2,mem=2Gi,gpu=2:gpu_model=t4,nic_gbps=50",
                "--local-port-base", str(self.port_base)]


def test_members_report_their_speed_and_the_model_is_refitted_from_it(tmp_path: Path) -> None:
    """On the local backend (real processes): the members write their step time to $PELOTON_METRICS_FILE, `job get`
    shows it beside the prediction, and `model refit` records it in the stored model and fits again."""
    rows = read_profile((DATA / "bert" / "placements.csv").read_text())
    train = select(rows, {(1,), (4,), (1, 1), (1, 1, 1, 1), (4, 4), (4, 4, 4, 4)})
    params = fit(train, Reference("t4", 50, "pcie")).params
    model = tmp_path / "bert.json"
    model.write_text(json.dumps(document_to_dict(ModelDocument(name="bert", params=params, profile=tuple(train)))))
    spec = tmp_path / "job.yaml"
    spec.write_text("""
name: reports
instances: 2
model: {name: bert, local_bsz: 8}
placement: {strategy: model-aware}
task:
  command: 'echo "step_time=0.9" >> "$PELOTON_METRICS_FILE"; echo "step_time=1.25 local_bsz=8" >> "$PELOTON_METRICS_FILE"; sleep 120'
  resources: {cpu: 0.5, mem: 64Mi, gpu: 1}
""")
    with serving(LocalDaemon(tmp_path / "data", f"sqlite:///{tmp_path}/peloton.db")) as d:
        d.cli("model", "create", "bert", "-f", str(model))
        job = d.cli("job", "create", "-f", str(spec)).stdout.strip()
        d.wait_state(job, "RUNNING")

        def measured() -> dict[str, object] | None:
            plan = d.job(job)["status"]["gangs"][0]["plan"]
            return plan if plan.get("measured_members") == 2 else None

        plan = wait_until(measured, timeout=30)
        assert plan["measured_step_time"] == pytest.approx(1.25)  # the last line counts
        assert plan["measured_samples_per_s"] == pytest.approx(2 * 8 / 1.25)
        view = d.cli("job", "get", job).stdout
        assert "measured 1.250 s/step, 12.8 samples/s (2 members reporting; prediction off by" in view

        out = d.cli("model", "refit", "bert", "--from-job", job).stdout
        assert f"{job}: GPUs per host {','.join(map(str, plan['gpus_per_host']))}, local batch 8: measured 1.250" in out
        assert "refitted model bert on 31 rows (30 of its profile, 1 measured)" in out and "version 2" in out
        stored = json.loads(d.cli("model", "get", "bert", "-o", "json").stdout)
        assert stored["version"] == 2
        assert [(m["job_id"], m["step_time"]) for m in stored["document"]["measured"]] == [(job, 1.25)]
        d.cli("job", "stop", job)


A100 = "2:cpu=96,mem=1Ti,gpu=8:gpu_model=a100,nic_gbps=100,gpu_link=nvlink"
MEASURED_SPEC = """
name: {name}
instances: 2
model: {{name: bert, local_bsz: 8}}
placement: {{strategy: model-aware, constraints: [{{attribute: gpu_model, value: {gpu}}}]}}
task:
  command: python train.py
  env: {{PELOTON_SIM_METRICS: "step_time={step} local_bsz=8"}}
  resources: {{cpu: 4, mem: 8Gi, gpu: 1}}
"""


def test_refit_fits_only_what_ran_on_hardware_like_the_models_reference(tmp_path: Path) -> None:
    """A model fitted on T4s, on a cluster of T4 and A100 hosts: a gang measured on the A100s (another GPU, NIC and
    link) is recorded in the model with the hardware it ran on but not fitted to, and `refit` says why; the gang
    measured on T4s is fitted to. The refitted parameters are those of the profile and the T4 measurement alone."""

    @dataclass
    class Mixed(Daemon):
        def server_args(self) -> list[str]:
            return ["--backend", "sim", "--sim-seed", "1", "--sim-host-group", T4, "--sim-host-group", A100]

    rows = read_profile((DATA / "bert" / "placements.csv").read_text())
    train = select(rows, {(1,), (4,), (1, 1), (1, 1, 1, 1), (4, 4), (4, 4, 4, 4)})
    reference = Reference("t4", 50, "pcie")
    model = tmp_path / "bert.json"
    model.write_text(json.dumps(document_to_dict(ModelDocument(name="bert", params=fit(train, reference).params,
                                                               profile=tuple(train)))))
    with serving(Mixed(tmp_path / "data", f"sqlite:///{tmp_path}/peloton.db")) as d:
        d.cli("model", "create", "bert", "-f", str(model))
        jobs = {}
        for gpu, step in (("t4", 1.25), ("a100", 0.2)):
            spec = tmp_path / f"{gpu}.yaml"
            spec.write_text(MEASURED_SPEC.format(name=f"on-{gpu}", gpu=gpu, step=step))
            jobs[gpu] = d.cli("job", "create", "-f", str(spec)).stdout.strip()
        plans = {}
        for gpu, job in jobs.items():
            d.wait_state(job, "RUNNING")

            def measured(job: str = job) -> dict[str, object] | None:
                plan = d.job(job)["status"]["gangs"][0]["plan"]
                return plan if plan.get("measured_members") == 2 else None

            plans[gpu] = wait_until(measured, timeout=30, what=f"the {gpu} gang's measurement")
        # each plan keeps where its workers went, and those hosts' hardware as the plan search saw it
        for gpu, job in jobs.items():
            assert sorted(plans[gpu]["hosts"]) == sorted({t["host"] for t in d.tasks(job)}), plans[gpu]
        assert set(plans["a100"]["hosts"]) <= {"sim-00004", "sim-00005"}  # the A100 hosts
        assert plans["a100"]["hardware"] == [{"gpu_model": "a100", "nic_gbps": 100, "gpu_link": "nvlink"}]
        assert {h["gpu_model"] for h in plans["t4"]["hardware"]} == {"t4"}

        out = d.cli("model", "refit", "bert", "--from-job", jobs["t4"], "--from-job", jobs["a100"]).stdout
        t4_line, a100_line = (next(x for x in out.splitlines() if x.startswith(jobs[g])) for g in ("t4", "a100"))
        assert "measured 1.250 s/step" in t4_line and "left out" not in t4_line, out
        assert "measured 0.200 s/step" in a100_line, out
        # on one host the NIC is not read (and the A100 gang has its two GPUs on one host: NVLink is best)
        assert plans["a100"]["gpus_per_host"] == [2], plans
        assert ("  left out of the fit (recorded in the model): it ran on a100, 100 Gb/s, nvlink, unlike the model's "
                "reference: gpu_model a100, not t4; gpu_link nvlink, not pcie") in out.splitlines(), out
        assert "refitted model bert on 31 rows (30 of its profile, 1 measured" in out, out
        assert "1 measurement made on hardware unlike the model's reference (t4, 50 Gb/s, pcie) left out" in out, out

        stored = json.loads(d.cli("model", "get", "bert", "-o", "json").stdout)["document"]
        by_job = {m["job_id"]: m for m in stored["measured"]}
        assert set(by_job) == set(jobs.values())  # both recorded: nothing is lost
        assert by_job[jobs["a100"]]["hardware"] == [{"gpu_model": "a100", "nic_gbps": 100, "gpu_link": "nvlink"}]
        assert by_job[jobs["t4"]]["hardware"] == [{"gpu_model": "t4", "nic_gbps": 50, "gpu_link": "pcie"}]
        # the fit is the profile's and the T4 gang's alone: the A100 measurement moved nothing
        t4_row = ProfileRow(tuple(plans["t4"]["gpus_per_host"]), 8, 1.25)
        expected = fit([*train, t4_row], reference, fit(train, reference).params).params
        params = {k: v for k, v in stored["params"].items() if k != "reference"}
        assert params == pytest.approx({k: v for k, v in expected.as_dict().items() if k != "reference"})
        assert stored["fit"]["rows"] == 31

        # refitted again (the stored measurements only): the A100 one is still left out, by its recorded hardware
        r = d.cli("model", "refit", "bert", "--from-job", jobs["t4"], "-o", "json")
        assert "refitted model bert on 31 rows (30 of its profile, 1 measured" in r.stderr, r.stderr
        assert "1 measurement made on hardware unlike the model's reference (t4, 50 Gb/s, pcie) left out" in r.stderr
        record = json.loads(r.stdout)
        assert record["refitted"] is True and record["left_out"] == 1 and record["version"] == 3
        assert [(x["job_id"], x["recorded"], x["fitted"], x["left_out"]) for x in record["measurements"]] == [
            (jobs["t4"], True, True, "")]
        for job in jobs.values():
            d.cli("job", "stop", job)


def test_instances_auto_asks_for_no_more_gpus_than_the_pool_is_entitled_to(sim: SimDaemon, tmp_path: Path) -> None:
    sim.cli("model", "create", "bert", "-f", str(bert_model(tmp_path)))
    sim.cli("pool", "create", "/small", "--limit", "cpu=64,mem=256Gi,gpu=3")
    auto = tmp_path / "auto.yaml"
    auto.write_text(SPEC.format(instances="auto", bounds=", max_instances: 16").replace("name: bert-ft",
                                                                                         "name: small\nrespool: /small"))
    plans = json.loads(sim.cli("job", "plan", "-f", str(auto), "-o", "json").stdout)
    assert plans["plans"] and all(sum(p["gpus_per_host"]) <= 3 for p in plans["plans"])
    assert plans["instances"] <= 3
    # in the root pool the same spec may use more: the bound is the pool's
    root = tmp_path / "root.yaml"
    root.write_text(auto.read_text().replace("respool: /small\n", ""))
    assert json.loads(sim.cli("job", "plan", "-f", str(root), "-o", "json").stdout)["instances"] > 3
    job = sim.cli("job", "create", "-f", str(auto)).stdout.strip()
    assert sim.wait_state(job, "RUNNING")["spec"]["instances"] <= 3


def test_the_operators_gpu_table_is_what_placement_rates_gpus_by(tmp_path: Path) -> None:
    """--gpu-table replaces the built-in estimate: with T4s rated far above A100s, the plan takes the T4s."""
    table = tmp_path / "gpus.json"
    table.write_text(json.dumps({"t4": {"relative": 20}}))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"t4": {"relative": -1}}))
    r = subprocess.run([*PELOTON, "server", "--backend", "sim", "--gpu-table", str(bad), "--data-dir",
                        str(tmp_path / "x"), "--db", f"sqlite:///{tmp_path}/x.db"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and "--gpu-table.t4.relative: expected a positive number" in r.stderr, r.stderr

    @dataclass
    class Mixed(Daemon):
        def server_args(self) -> list[str]:
            return ["--backend", "sim", "--sim-host-group", T4, "--sim-host-group",
                    "1:cpu=96,mem=1Ti,gpu=8:gpu_model=a100,nic_gbps=100,gpu_link=nvlink", "--gpu-table", str(table)]

    spec = tmp_path / "job.yaml"
    spec.write_text(SPEC.format(instances=4, bounds=""))
    with serving(Mixed(tmp_path / "data", f"sqlite:///{tmp_path}/peloton.db")) as d:
        d.cli("model", "create", "bert", "-f", str(bert_model(tmp_path)))
        best = json.loads(d.cli("job", "plan", "-f", str(spec), "-o", "json").stdout)["plans"][0]
        assert best["gpus_per_host"] == [4] and best["hosts"][0] != "sim-00004"  # a T4 host, not the A100 one
        job = d.cli("job", "create", "-f", str(spec)).stdout.strip()
        d.wait_state(job, "RUNNING")
        hosts = {t["host"] for t in d.tasks(job)}
        assert len(hosts) == 1 and "sim-00004" not in hosts
