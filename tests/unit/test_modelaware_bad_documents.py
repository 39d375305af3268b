"""Model documents that cannot predict: parameters that give no finite, positive step time, and numbers a JSON
document can hold that Python cannot turn into a float, are refused naming the field (each was a crash later:
`model predict`, `model plan`, the placement engine's plan search). Each test but the limits' own failed before."""

from __future__ import annotations

import json
import math

import pytest

from peloton.errors import InvalidArgument
from peloton.modelaware import plan
from peloton.modelaware.cost import predict, uniform_hosts
from peloton.modelaware.document import parse_document
from peloton.modelaware.gpus import load_table

PARAMS = {"alpha_c": 0.2, "beta_c": 0.05, "alpha_r": 0.1, "beta_r": 0.09, "alpha_n": 0.9, "beta_n": 0.1, "gamma": 2.0}


def _refused(doc: object, field: str) -> str:
    with pytest.raises(InvalidArgument) as e:
        parse_document(doc)
    assert e.value.field == field, e.value.message
    assert e.value.message.startswith(field + ": "), e.value.message
    return e.value.message


def test_params_without_any_compute_are_refused() -> None:
    # a step of zero seconds: predict's samples/s divided by it (ZeroDivisionError in `model predict|plan` and in
    # the placement engine's plan search)
    zero = {**PARAMS, "alpha_c": 0, "beta_c": 0, "alpha_r": 0, "beta_r": 0, "alpha_n": 0, "beta_n": 0}
    _refused({"params": zero}, "model.params.alpha_c")
    # a fixed compute too small for a float once scaled to a faster GPU (underflows to 0 s)
    _refused({"params": {**PARAMS, "alpha_c": 5e-324, "beta_c": 0}}, "model.params.alpha_c")


def test_params_too_large_to_predict_a_finite_step_are_refused() -> None:
    huge = {**PARAMS, **{n: 1e308 for n in ("alpha_c", "beta_c", "alpha_r", "beta_r", "alpha_n", "beta_n")}}
    _refused({"params": huge}, "model.params.alpha_c")
    _refused({"params": {**PARAMS, "kappa": 1e308}}, "model.params.kappa")


def test_every_accepted_document_predicts_finite_positive_plans() -> None:
    for doc in ({"params": {**PARAMS, "alpha_c": 1e-9, "beta_c": 0, "alpha_r": 0, "beta_r": 0, "alpha_n": 0,
                            "beta_n": 0}},
                {"params": {**PARAMS, **{n: 1e6 for n in ("alpha_c", "beta_c", "alpha_r", "beta_r", "alpha_n",
                                                           "beta_n", "alpha_h", "kappa")}}}):
        p = parse_document(doc).params
        assert p is not None
        for placement in ((1,), (4,), (2, 2), (1, 1, 1)):
            pred = predict(p, uniform_hosts(placement, p.reference), 8)
            assert math.isfinite(pred.samples_per_s) and pred.samples_per_s > 0, (doc, placement, pred)
        plans = plan.search(p, [plan.FreeHost("h0", 4), plan.FreeHost("h1", 4)], plan.PlanRequest(local_bsz=8))
        assert plans and all(math.isfinite(x.samples_per_s) for x in plans)


@pytest.mark.parametrize(("doc", "field"), [
    ({"description": {"parameters": 10 ** 400, "flops_per_sample": 1}}, "model.description.parameters"),
    ({"params": {**PARAMS, "alpha_c": 10 ** 400}}, "model.params.alpha_c"),
    ({"measured": [{"placement": [10 ** 400], "local_bsz": 8, "step_time": 1}], "params": PARAMS},
     "model.measured[0].placement[0]"),
])
def test_an_integer_too_large_for_a_float_is_refused_naming_the_field(doc: object, field: str) -> None:
    # JSON has no limit on integers: json.loads gives a Python int that math.isfinite cannot convert
    assert "expected" in _refused(json.loads(json.dumps(doc)), field)


def test_a_gpu_table_with_an_integer_too_large_for_a_float_is_refused() -> None:
    with pytest.raises(InvalidArgument) as e:
        load_table(json.dumps({"x1": {"relative": 10 ** 400}}))
    assert e.value.field == "gpu table.x1.relative", e.value.message
