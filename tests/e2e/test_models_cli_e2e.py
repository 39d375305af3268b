"""`peloton model create|get|list|delete` through the real CLI against the real daemon (sim backend; the store's
side runs on both stores in tests/store/test_models.py and tests/api/test_models_api.py, so SQLite here)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e.harness import PELOTON, Daemon, serving

pytestmark = pytest.mark.e2e

BERT_YAML = """\
kind: peloton.model/v1
description:
  parameters: 110000000
  flops_per_sample: 2.5e11      # YAML 1.1 would read this as text: the CLI reads it as a number
  sync: allreduce-ring
  local_bsz: 12
"""
RESNET = {"kind": "peloton.model/v1", "name": "ignored",
          "description": {"parameter_bytes": 102_000_000, "flops_per_sample": 1.2e10, "sync": "ps", "ps_count": 2},
          "params": {"alpha_c": 0.01, "beta_c": 0.002, "alpha_r": 0.05, "beta_r": 1e-9, "alpha_n": 0.1,
                     "beta_n": 2e-9, "gamma": 1.5, "reference": {"gpu_model": "t4", "nic_gbps": 50}},
          "fit": {"rows": 30, "median_error": 0.012, "p90_error": 0.03, "source": "resnet.csv"}}


@dataclass
class SimDaemon(Daemon):
    def server_args(self) -> list[str]:
        return ["--backend", "sim", "--sim-hosts", "1"]


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[SimDaemon]:
    with serving(SimDaemon(tmp_path / "data", f"sqlite:///{tmp_path}/peloton.db")) as d:
        yield d


def test_create_get_list_delete(sim: SimDaemon, tmp_path: Path) -> None:
    (tmp_path / "bert.yaml").write_text(BERT_YAML)
    (tmp_path / "resnet.json").write_text(json.dumps(RESNET))
    r = sim.cli("model", "create", "bert", "-f", str(tmp_path / "bert.yaml"))
    assert r.stdout == "bert\n" and r.stderr == "created model bert (version 1)\n"
    r = subprocess.run([*PELOTON, "--address", sim.address, "model", "create", "resnet50", "-f", "-"],
                       input=json.dumps(RESNET), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout == "resnet50\n", r.stderr

    got = json.loads(sim.cli("model", "get", "bert", "-o", "json").stdout)
    assert set(got) == {"name", "owner", "version", "created_at", "updated_at", "document"}
    assert (got["name"], got["owner"], got["version"]) == ("bert", "anonymous", 1)  # (authentication off)
    assert got["created_at"].endswith("Z") and got["updated_at"] == got["created_at"]
    assert got["document"] == {"kind": "peloton.model/v1", "name": "bert", "description": {
        "parameters": 110000000, "flops_per_sample": 2.5e11, "sync": "allreduce-ring", "local_bsz": 12}}
    table = sim.cli("model", "get", "resnet50").stdout
    assert table.startswith("model:     resnet50\nowner:     anonymous\nversion:   1\n")
    assert "describes: 102MB of gradients, ps (2 servers); fitted on 30 rows (median error 1.2%)\n" in table
    assert json.loads(table.split("document:\n", 1)[1])["name"] == "resnet50"  # the model's, not the file's

    # the document `get -o json` prints is one `create -f` takes back
    (tmp_path / "again.json").write_text(json.dumps(got["document"]))
    r = sim.cli("model", "create", "bert", "-f", str(tmp_path / "again.json"), "--replace")
    assert r.stderr == "replaced model bert (version 2)\n"

    listed = json.loads(sim.cli("model", "list", "-o", "json").stdout)["models"]
    assert [(m["name"], m["version"]) for m in listed] == [("bert", 2), ("resnet50", 1)]
    assert listed[0]["document"]["description"]["local_bsz"] == 12
    lines = sim.cli("model", "list").stdout.splitlines()
    assert lines[0].split() == ["NAME", "OWNER", "VERSION", "UPDATED", "DESCRIBES"]
    assert lines[1].startswith("bert ") and "110M parameters, allreduce-ring; not fitted" in lines[1]
    assert lines[2].startswith("resnet50 ") and "fitted on 30 rows" in lines[2]

    r = sim.cli("model", "delete", "bert")
    assert r.stderr == "deleted model bert\n"
    assert [m["name"] for m in json.loads(sim.cli("model", "list", "-o", "json").stdout)["models"]] == ["resnet50"]


def test_errors(sim: SimDaemon, tmp_path: Path) -> None:
    (tmp_path / "bert.yaml").write_text(BERT_YAML)
    sim.cli("model", "create", "bert", "-f", str(tmp_path / "bert.yaml"))

    def fails(*args: str) -> tuple[int, str]:
        r = sim.cli(*args, check=False)
        return r.returncode, r.stderr

    assert fails("model", "create", "bert", "-f", str(tmp_path / "bert.yaml")) == (
        1, "peloton: error: name: model 'bert' already exists (replace it with --replace)\n")
    assert fails("model", "get", "gpt") == (1, "peloton: error: name: no model 'gpt'\n")
    assert fails("model", "delete", "gpt") == (1, "peloton: error: name: no model 'gpt'\n")
    code, err = fails("model", "create", "x", "-f", str(tmp_path / "missing.json"))
    assert code == 2 and err.startswith("peloton: error: -f: cannot read ") and "No such file" in err
    (tmp_path / "bad.json").write_text('{"kind": "peloton.model/v1", ')
    code, err = fails("model", "create", "x", "-f", str(tmp_path / "bad.json"))
    assert code == 2 and err.startswith(f"peloton: error: -f: {tmp_path / 'bad.json'}: not valid JSON: ")
    (tmp_path / "bad.yaml").write_text("kind: [unclosed\n")
    code, err = fails("model", "create", "x", "-f", str(tmp_path / "bad.yaml"))
    assert code == 2 and "not valid JSON or YAML at line 2" in err, err
    (tmp_path / "field.yaml").write_text(BERT_YAML.replace("allreduce-ring", "gossip"))
    code, err = fails("model", "create", "x", "-f", str(tmp_path / "field.yaml"))
    assert code == 2 and err.startswith("peloton: error: model.description.sync: must be one of "), err
    code, err = fails("model", "create", "no/slash", "-f", str(tmp_path / "bert.yaml"))
    assert code == 2 and err.startswith("peloton: error: name: expected 1 to 128 letters"), err
    assert [m["name"] for m in json.loads(sim.cli("model", "list", "-o", "json").stdout)["models"]] == ["bert"]
    code, err = fails("model", "delete", "bert", "-o", "json", "-q")  # -o is every command's; -q is job list's
    assert code == 2 and "unknown flag -q" in err
    assert json.loads(sim.cli("model", "rm", "bert", "-o", "json").stdout) == {"name": "bert", "deleted": True}
