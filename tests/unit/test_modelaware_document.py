"""Model documents (peloton/modelaware/document.py) and the GPU table (gpus.py): parse, round trip, and errors that
name the field at fault."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from peloton.errors import InvalidArgument
from peloton.modelaware.cost import PS, CostParams, Reference, predict, prior, uniform_hosts
from peloton.modelaware.document import (
    KIND,
    Description,
    FitInfo,
    Measurement,
    ModelDocument,
    document_to_dict,
    parse_document,
)
from peloton.modelaware.gpus import BUILTIN, DEFAULT_TABLE, load_table

FULL: dict[str, Any] = {
    "kind": KIND, "name": "bert",
    "description": {"parameters": 110_000_000, "layers": [400_000_000, 40_000_000], "flops_per_sample": 2.5e11,
                    "sync": "allreduce-hierarchical", "local_bsz": 12, "dataset_samples": 88_000},
    "params": {"alpha_c": 0.2, "beta_c": 0.05, "alpha_r": 0.1, "beta_r": 0.09, "alpha_n": 0.9, "beta_n": 0.1,
               "gamma": 2.1, "reference": {"gpu_model": "t4", "nic_gbps": 50, "gpu_link": "pcie"}},
    "fit": {"rows": 30, "median_error": 0.01, "p90_error": 0.03, "source": "bert/placements.csv"},
    "measured": [{"job_id": "j1", "placement": [4, 4], "local_bsz": 12, "step_time": 2.5,
                  "predicted_step_time": 2.4, "gpu_model": "t4"}],
}


def test_a_full_document_parses_and_round_trips() -> None:
    doc = parse_document(FULL)
    assert doc.name == "bert"
    assert doc.description == Description(parameters=110_000_000, layers=(400_000_000, 40_000_000),
                                          flops_per_sample=2.5e11, sync="allreduce-hierarchical", local_bsz=12,
                                          dataset_samples=88_000)
    assert doc.description.gradient_bytes == 440_000_000  # the layers' sum, given no parameter_bytes
    assert doc.params == CostParams(0.2, 0.05, 0.1, 0.09, 0.9, 0.1, 2.1, Reference("t4", 50, "pcie"))
    assert doc.fit == FitInfo(30, 0.01, 0.03, "bert/placements.csv")
    assert doc.measured == (Measurement("j1", (4, 4), 12, 2.5, 2.4, "t4"),)
    again = parse_document(json.loads(json.dumps(document_to_dict(doc))))
    assert again == doc
    assert document_to_dict(again) == document_to_dict(doc)


def test_a_measurement_keeps_the_hardware_it_ran_on_and_older_ones_read_without_it() -> None:
    """`model refit` fits a model only to measurements made on hardware like its reference, so each keeps the
    distinct hardware of the hosts it ran on; one written before it did (FULL's) reads with none, as before."""
    assert parse_document(FULL).measured[0].hardware == ()
    doc = _with("measured.0.hardware", [{"gpu_model": "A100", "nic_gbps": 100, "gpu_link": "nvlink"},
                                        {"gpu_model": "t4", "nic_gbps": 50, "gpu_link": "pcie"}])
    m = parse_document(doc).measured[0]
    assert m.hardware == (Reference("a100", 100, "nvlink"), Reference("t4", 50, "pcie"))
    again = parse_document(json.loads(json.dumps(document_to_dict(parse_document(doc)))))
    assert again.measured == (m,)


def test_a_description_alone_gives_the_prior() -> None:
    doc = parse_document({"kind": KIND, "description": {"parameters": 1000, "flops_per_sample": 1e9, "sync": "ps",
                                                        "ps_count": 2}})
    assert doc.params is None and doc.description.gradient_bytes == 4000  # FP32 gradients
    assert doc.cost_params() == prior(4000, 1e9)
    p = doc.cost_params()
    assert p.beta_c == pytest.approx(1e9 / (0.5 * 8.1e12))  # half a T4's FP32 peak
    assert p.beta_n == pytest.approx(4000 / (25e9 / 8 * 0.7))  # 70% of a 25 Gb/s NIC
    assert document_to_dict(doc)["description"] == {"sync": PS, "parameters": 1000, "flops_per_sample": 1e9,
                                                    "ps_count": 2}
    chosen = parse_document({"description": {"parameters": 1, "flops_per_sample": 1, "sync": "ps",
                                             "ps_count": "choose"}})
    description = document_to_dict(chosen)["description"]
    assert chosen.description.ps_count is None and isinstance(description, dict) and description["ps_count"] == "choose"


def test_params_written_before_the_per_host_latency_still_read_and_predict_as_before() -> None:
    """A document (stored model, job's recorded goal) from before params.alpha_h: it reads as 0, the ring without
    a per-host term, so its predictions do not move; written again, it carries alpha_h."""
    old = parse_document(FULL)
    assert "alpha_h" not in FULL["params"] and old.params is not None and old.params.alpha_h == 0.0
    uses = uniform_hosts((1, 1, 1, 1), old.params.reference)
    pn = old.params
    assert predict(pn, uses, 8).sync_time == pytest.approx(pn.alpha_n + pn.beta_n * 2 * 3 / 4)
    assert document_to_dict(old)["params"]["alpha_h"] == 0.0  # type: ignore[index]
    new = parse_document(_with("params.alpha_h", 0.0055))
    assert new.params is not None and new.params.alpha_h == 0.0055
    assert parse_document(json.loads(json.dumps(document_to_dict(new)))) == new


def test_params_written_before_the_contention_term_still_read_and_predict_as_before() -> None:
    """A document from before params.kappa: it reads as 0, every GPU computing as if alone on its host, so its
    predictions do not move; written again, it carries kappa. The prior has none either (nothing in a model's
    description tells how its input pipeline shares a host)."""
    old = parse_document(FULL)
    assert "kappa" not in FULL["params"] and old.params is not None and old.params.kappa == 0.0
    pn = old.params
    uses = uniform_hosts((4,), pn.reference)
    assert predict(pn, uses, 8).compute_time == pytest.approx(pn.alpha_c + pn.beta_c * 8)
    assert document_to_dict(old)["params"]["kappa"] == 0.0  # type: ignore[index]
    new = parse_document(_with("params.kappa", 0.027))
    assert new.params is not None and new.params.kappa == 0.027
    assert predict(new.params, uses, 8).compute_time == pytest.approx((pn.alpha_c + pn.beta_c * 8) * 1.081)
    assert parse_document(json.loads(json.dumps(document_to_dict(new)))) == new
    assert prior(440e6, 2.5e11).kappa == 0.0


def test_the_priors_per_host_latency_is_nccls_network_step_once_per_ddp_bucket() -> None:
    """cost.prior's alpha_h: NCCL's ring step over the network beyond one over PCIe (9.6 - 5.7 us), or NVLink
    (9.6 - 3.4 us), for each 25 MiB bucket PyTorch DDP all-reduces."""
    assert prior(4000, 1e9).alpha_h == pytest.approx(3.9e-6)  # one bucket
    assert prior(440e6, 2.5e11).alpha_h == pytest.approx(17 * 3.9e-6)  # bert: 440 MB in 17 buckets
    nvlink = prior(440e6, 2.5e11, reference=Reference("a100", 100, "nvlink"))
    assert nvlink.alpha_h == pytest.approx(17 * 6.2e-6)


def test_the_smallest_document_is_params_alone() -> None:
    doc = parse_document({"params": {k: FULL["params"][k] for k in ("alpha_c", "beta_c", "alpha_r", "beta_r",
                                                                     "alpha_n", "beta_n", "gamma")}})
    assert doc.params is not None and doc.params.reference == Reference("t4", 25.0, "pcie")
    assert document_to_dict(doc) == {"kind": KIND, "description": {"sync": "allreduce-ring"},
                                     "params": doc.params.as_dict()}


def _with(path: str, value: object) -> dict[str, Any]:
    doc = copy.deepcopy(FULL)
    *parents, last = path.split(".")
    node: Any = doc
    for p in parents:
        node = node[int(p)] if isinstance(node, list) else node[p]
    if value is KeyError:
        del node[last]
    else:
        node[last] = value
    return doc


@pytest.mark.parametrize(("path", "value", "field", "words"), [
    ("kind", "peloton.model/v2", "model.kind", "expected 'peloton.model/v1'"),
    ("colour", "red", "model.colour", "unknown field"),
    ("name", 7, "model.name", "expected text"),
    ("name", "x" * 129, "model.name", "at most 128"),
    ("description", [], "model.description", "expected an object"),
    ("description.flops", 1, "model.description.flops", "unknown field"),
    ("description.parameters", -1, "model.description.parameters", "non-negative"),
    ("description.parameters", 1.5, "model.description.parameters", "whole number"),
    ("description.parameters", True, "model.description.parameters", "non-negative"),
    ("description.sync", "allreduce-tree", "model.description.sync", "must be one of"),
    ("description.ps_count", 2, "model.description.ps_count", "only with sync: ps"),
    ("description.layers", [1, 0], "model.description.layers[1]", "greater than 0"),
    ("description.layers", "big", "model.description.layers", "list"),
    ("description.global_bsz", 96, "model.description.global_bsz", "not both"),
    ("description.parameter_bytes", 7, "model.description.layers", "add up to 440000000 bytes"),
    ("params.gamma", KeyError, "model.params.gamma", "required"),
    ("params.gamma", 0.5, "model.params.gamma", "at least 1"),
    ("params.beta_n", "fast", "model.params.beta_n", "number"),
    ("params.beta_n", float("inf"), "model.params.beta_n", "number"),
    ("params.alpha_h", -0.001, "model.params.alpha_h", "non-negative"),
    ("params.alpha_h", None, "model.params.alpha_h", "number"),
    ("params.kappa", -0.01, "model.params.kappa", "non-negative"),
    ("params.kappa", "high", "model.params.kappa", "number"),
    ("params.delta", 1, "model.params.delta", "unknown field"),
    ("params.reference.gpu_link", "infiniband", "model.params.reference.gpu_link", "must be one of"),
    ("params.reference.nic_gbps", 0, "model.params.reference.nic_gbps", "greater than 0"),
    ("fit.rows", "thirty", "model.fit.rows", "whole number"),
    ("measured", {}, "model.measured", "list"),
    ("measured.0.placement", [], "model.measured[0].placement", "list of GPUs per host"),
    ("measured.0.placement", [4, 0], "model.measured[0].placement[1]", "greater than 0"),
    ("measured.0.step_time", KeyError, "model.measured[0].step_time", "non-negative"),
    ("measured.0.hardware", {"gpu_model": "t4"}, "model.measured[0].hardware", "list"),
    ("measured.0.hardware", [], "model.measured[0].hardware", "list"),
    ("measured.0.hardware", ["t4"], "model.measured[0].hardware[0]", "expected an object"),
    ("measured.0.hardware", [{"gpu_model": "t4", "nic_gbps": 50, "gpu_link": "pcie", "rack": "r1"}],
     "model.measured[0].hardware[0].rack", "unknown field"),
    ("measured.0.hardware", [{"gpu_model": "t4", "nic_gbps": 0, "gpu_link": "pcie"}],
     "model.measured[0].hardware[0].nic_gbps", "greater than 0"),
    ("measured.0.hardware", [{"gpu_model": "t4", "nic_gbps": 50}], "model.measured[0].hardware[0].gpu_link",
     "required"),
    ("measured.0.hardware", [{"gpu_model": "t4", "nic_gbps": 50, "gpu_link": "ib"}],
     "model.measured[0].hardware[0].gpu_link", "must be one of"),
])
def test_bad_documents_are_refused_naming_the_field(path: str, value: object, field: str, words: str) -> None:
    with pytest.raises(InvalidArgument) as e:
        parse_document(_with(path, value))
    assert e.value.field == field, e.value.message
    assert e.value.message.startswith(field + ": ") and words in e.value.message, e.value.message


def test_a_document_without_params_needs_a_description_to_predict_from() -> None:
    with pytest.raises(InvalidArgument) as e:
        parse_document({"kind": KIND, "description": {"parameters": 1000}})
    assert e.value.field == "model.params"
    with pytest.raises(InvalidArgument) as e:
        parse_document("bert")
    assert e.value.field == "model"
    with pytest.raises(InvalidArgument) as e:
        ModelDocument(description=Description(parameters=1000)).cost_params()
    assert e.value.field == "model.description.flops_per_sample"


def test_the_gpu_table_estimates_relative_throughput_and_takes_an_operators_rows() -> None:
    assert BUILTIN["t4"].relative == 1.0
    assert 2 < BUILTIN["v100"].relative < BUILTIN["a100"].relative < BUILTIN["h100"].relative
    assert DEFAULT_TABLE.get("RTX-9000") is BUILTIN["unknown"] and DEFAULT_TABLE.relative("sim-gpu") == 1.0
    t = load_table('{"v100": {"relative": 2.0}, "mi250": {"fp32_tflops": 8.1, "mem_gbps": 320}}')
    assert t.relative("v100") == 2.0 and t.relative("mi250") == 1.0 and t.relative("a100") == BUILTIN["a100"].relative
    for text, field in (('{"x": {"relative": 0}}', "gpu table.x.relative"), ('{"x": {"speed": 1}}', "gpu table.x.speed"),
                        ('{"x": {}}', "gpu table.x"), ("[]", "gpu table"), ("{", "gpu table")):
        with pytest.raises(InvalidArgument) as e:
            load_table(text)
        assert e.value.field == field, (text, e.value.message)
