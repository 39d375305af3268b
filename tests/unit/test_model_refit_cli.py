"""`peloton model refit` (peloton/cli/model.py) against a stand-in for the daemon: which measurements it records
and fits, and what it says of the others. The daemon end to end: tests/e2e/test_model_aware_e2e.py."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from peloton.api.v1 import job_pb2, model_pb2
from peloton.cli.model import cmd_model_refit
from peloton.errors import FailedPrecondition
from peloton.modelaware.cost import CostParams, Reference, predict, uniform_hosts
from peloton.modelaware.document import Measurement, ModelDocument, document_to_dict, parse_document
from peloton.modelaware.fit import fit
from peloton.modelaware.profile import ProfileRow

T4 = Reference("t4", 50, "pcie")
TRUE = CostParams(0.05, 0.004, 0.03, 0.08, 0.2, 0.06, 1.8, T4, alpha_h=0.01, kappa=0.1)
PROFILE = tuple(ProfileRow(pl, b, predict(TRUE, uniform_hosts(pl, T4), b).step_time)
                for pl in ((1,), (4,), (1, 1), (2, 2)) for b in (8, 32))


@dataclass
class Daemon:
    """GetModel, GetJob and CreateModel of one model and its jobs."""

    document: dict[str, Any]
    jobs: dict[str, job_pb2.Job] = field(default_factory=dict)
    version: int = 1
    written: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.models = self
        self.GetModel = lambda r: model_pb2.GetModelResponse(model=model_pb2.Model(
            name=r.name, version=self.version, document_json=json.dumps(self.document)))
        self.GetJob = lambda r: job_pb2.GetJobResponse(job=self.jobs[r.job_id])
        self.CreateModel = self._create

    def _create(self, r: model_pb2.CreateModelRequest) -> model_pb2.CreateModelResponse:
        assert r.replace and r.if_version == self.version
        self.document = json.loads(r.document_json)
        self.written.append(self.document)
        self.version += 1
        return model_pb2.CreateModelResponse(model=model_pb2.Model(name=r.name, version=self.version))

    def call(self, fn: Callable[[Any], Any], request: Any) -> Any:
        return fn(request)


def client(d: Daemon) -> Any:
    return argparse.Namespace(models=d, jobs=argparse.Namespace(GetJob=d.GetJob), call=d.call)


def measured_job(job_id: str, gpus_per_host: list[int], step: float, hardware: list[tuple[str, float, str]]
                 ) -> job_pb2.Job:
    plan = job_pb2.PlanInfo(gpus_per_host=gpus_per_host, step_time=0.5, local_bsz=8, measured_step_time=step,
                            measured_members=sum(gpus_per_host))
    for model, nic, link in hardware:
        plan.hardware.add(gpu_model=model, nic_gbps=nic, gpu_link=link)
    job = job_pb2.Job(id=job_id, spec=job_pb2.JobSpec(model=job_pb2.ModelSpec(name="m")))
    job.status.gangs.add(index=0, plan=plan)
    return job


def refit(d: Daemon, *jobs: str, output: str = "table") -> None:
    cmd_model_refit(client(d), argparse.Namespace(name="m", jobs=list(jobs), output=output))


def model(**kw: Any) -> dict[str, Any]:
    return document_to_dict(ModelDocument(name="m", params=fit(list(PROFILE), T4).params, profile=PROFILE, **kw))


def test_a_gang_on_unlike_hardware_is_recorded_not_fitted_and_an_older_measurement_is_assumed_the_reference(
        capsys: pytest.CaptureFixture[str]) -> None:
    older = Measurement("old", (1, 1), 8, 0.6, 0.5)  # an older document's: no hardware, assumed the reference
    d = Daemon(model(measured=(older,)),
               {"t4": measured_job("t4", [2], 0.45, [("t4", 50, "pcie")]),
                "a100": measured_job("a100", [1, 1], 0.05, [("a100", 100, "pcie")])})
    refit(d, "t4", "a100")
    out = capsys.readouterr().out
    assert ("  left out of the fit (recorded in the model): it ran on a100, 100 Gb/s, pcie, unlike the model's "
            "reference: gpu_model a100, not t4; nic_gbps 100, not 50") in out.splitlines(), out
    assert f"refitted model m on {len(PROFILE) + 2} rows ({len(PROFILE)} of its profile, 2 measured)" in out, out
    # the whole sentence: it ended "kept in its measured", which read as cut short
    assert ("1 measurement made on hardware unlike the model's reference (t4, 50 Gb/s, pcie) left out of the fit, "
            "kept in the model's measured list") in out.splitlines(), out
    doc = parse_document(d.document)
    assert [(x.job_id, x.hardware) for x in doc.measured] == [
        ("old", ()), ("t4", (T4,)), ("a100", (Reference("a100", 100, "pcie"),))]
    base = fit(list(PROFILE), T4).params
    assert doc.params == fit([*PROFILE, ProfileRow((1, 1), 8, 0.6), ProfileRow((2,), 8, 0.45)], T4, base).params


def test_only_unlike_measurements_record_them_and_leave_the_model_as_it_was(
        capsys: pytest.CaptureFixture[str]) -> None:
    d = Daemon(model(), {"a100": measured_job("a100", [2], 0.05, [("a100", 100, "nvlink")])})
    params = d.document["params"]
    refit(d, "a100", output="json")
    cap = capsys.readouterr()
    assert ("recorded the measurements in model m (version 2); not refitted: none of its measurements was made on "
            "hardware like its reference (t4, 50 Gb/s, pcie)") in cap.err, cap.err
    assert d.document["params"] == params and len(d.document["measured"]) == 1
    record = json.loads(cap.out)
    assert record["refitted"] is False and record["left_out"] == 1
    assert record["measurements"][0]["fitted"] is False
    assert record["measurements"][0]["left_out"] == "gpu_model a100, not t4; gpu_link nvlink, not pcie"
    assert record["measurements"][0]["hardware"] == [{"gpu_model": "a100", "nic_gbps": 100, "gpu_link": "nvlink"}]


def test_a_gang_whose_plan_kept_no_hardware_is_neither_recorded_nor_fitted(capsys: pytest.CaptureFixture[str]) -> None:
    """Placed by an older daemon: recorded without its hardware, it would read as made on the reference later."""
    d = Daemon(model(), {"t4": measured_job("t4", [2], 0.45, [("t4", 50, "pcie")]),
                         "older": measured_job("older", [2], 0.05, [])})
    refit(d, "t4", "older")
    out = capsys.readouterr().out
    assert "  not recorded, not fitted: the hardware its gang ran on is not known (placed by an older daemon" in out
    assert [m["job_id"] for m in d.document["measured"]] == ["t4"]
    assert f"refitted model m on {len(PROFILE) + 1} rows" in out
    alone = Daemon(model(), {"older": measured_job("older", [2], 0.05, [])})
    with pytest.raises(FailedPrecondition) as e:
        refit(alone, "older")
    assert "the hardware the measured gangs ran on is not known" in e.value.message and not alone.written


def test_a_parameter_server_model_records_its_measurements_and_says_why_it_is_not_refitted(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The fit has no form for parameter servers yet (a profile row does not say where the servers ran): refit of a
    `ps` model failed with "a parameter-server plan needs at least one server and one worker" (field `servers`), a
    message about plans, and recorded nothing."""
    from peloton.modelaware.document import Description

    d = Daemon(model(description=Description(sync="ps", ps_count=2)),
               {"t4": measured_job("t4", [2, 2], 0.45, [("t4", 50, "pcie")])})
    params = d.document["params"]
    refit(d, "t4")
    out = capsys.readouterr().out
    assert ("recorded the measurements in model m (version 2); not refitted: the fit has no form for parameter "
            "servers yet (description.sync ps)") in out, out
    assert d.document["params"] == params and [m["job_id"] for m in d.document["measured"]] == ["t4"]
