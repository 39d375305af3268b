"""A model-aware job spec: `model`, `placement.strategy: model-aware`, `instances: auto`; errors name their field."""

from __future__ import annotations

from dataclasses import replace

import pytest

from peloton.api.convert import spec_from_proto, spec_to_proto
from peloton.api.specfile import parse_spec
from peloton.domain.spec import (
    ModelRef,
    spec_from_dict,
    spec_to_dict,
    validate,
    validate_submitted,
    with_workers,
)
from peloton.errors import InvalidArgument

SPEC = """
name: bert
instances: 8
model: {name: bert, local_bsz: 12}
placement: {strategy: model-aware}
task: {command: python train.py, resources: {cpu: 2, gpu: 1, ports: 1}}
"""
ROLES = """
name: tf
roles:
  - {name: ps, instances: 2, task: {command: ps, resources: {cpu: 4}}}
  - {name: worker, instances: auto, task: {command: w, resources: {cpu: 1, gpu: 1}}}
model: {name: resnet, global_bsz: 256, min_instances: 2, max_instances: 16}
placement: {strategy: model-aware}
"""


def spec(text: str = SPEC):  # type: ignore[no-untyped-def]
    return spec_from_proto(parse_spec(text))


def refused(s, field: str) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidArgument) as e:
        validate(s)
    assert e.value.field == field, e.value.message
    return e.value.message


def test_a_model_aware_spec_reads_and_round_trips() -> None:
    s = validate(spec())
    assert s.model == ModelRef(name="bert", local_bsz=12)
    assert spec_from_proto(spec_to_proto(s)).model == s.model
    decided = replace(s, model=replace(s.model, goal_json='{"x": 1}'))
    assert spec_from_dict(spec_to_dict(decided)) == decided  # the store keeps the daemon's decision


def test_instances_auto_for_a_job_and_for_its_gpu_role() -> None:
    s = spec(SPEC.replace("instances: 8", "instances: auto"))
    assert s.model is not None and s.model.auto_instances and s.instances == 0
    validate_submitted(s)
    assert with_workers(s, 6).instances == 6
    r = spec(ROLES)
    assert r.model is not None and r.model.auto_instances and r.model.min_instances == 2
    validate_submitted(r)
    chosen = with_workers(r, 5)
    assert [x.instances for x in chosen.roles] == [2, 5] and chosen.instances == 7
    with pytest.raises(InvalidArgument) as e:
        parse_spec(SPEC.replace("instances: 8", "instances: auto").replace("model: {name: bert, local_bsz: 12}\n", "")
                   .replace("placement: {strategy: model-aware}\n", ""))
    assert e.value.field == "instances" and "needs a model" in e.value.message


def test_model_and_strategy_go_together() -> None:
    s = spec()
    assert "required with placement.strategy model-aware" in refused(replace(s, model=None), "model.name")
    refused(replace(s, strategy="pack"), "placement.strategy")


def test_bad_model_fields_are_named() -> None:
    s = spec()
    m = s.model
    assert m is not None
    refused(replace(s, model=replace(m, name="a b")), "model.name")
    refused(replace(s, model=replace(m, global_bsz=64)), "model.global_bsz")
    refused(replace(s, model=replace(m, objective="speed")), "model.objective")
    refused(replace(s, model=replace(m, min_instances=8, max_instances=4)), "model.min_instances")
    refused(replace(s, model=replace(m, local_bsz=-1)), "model.local_bsz")


def test_workers_are_one_gpu_each_and_the_job_one_gang() -> None:
    s = spec()
    two = replace(s, resources=replace(s.resources, gpu=2))
    assert "one worker on each GPU" in refused(two, "task.resources.gpu")
    refused(replace(s, resources=replace(s.resources, gpu=0)), "task.resources.gpu")
    refused(replace(s, min_available=2), "gang.min_available")
    r = with_workers(spec(ROLES), 4)
    ps = replace(r.roles[0], resources=replace(r.roles[0].resources, gpu=1))
    refused(replace(r, roles=(ps, r.roles[1])), "roles")


def test_an_auto_jobs_json_goes_back_to_job_create() -> None:
    """`job get -o json` writes the count chosen and the effective min_available beside `auto_instances`."""
    s = spec(SPEC.replace("instances: 8", "instances: auto"))
    chosen = replace(with_workers(s, 6), min_available=6)
    again = spec_from_proto(spec_to_proto(chosen))
    assert again.model is not None and again.model.auto_instances
    validate_submitted(again)


def test_min_efficiency_reads_round_trips_and_is_checked() -> None:
    """`model.min_efficiency` (instances: auto only): unset is None (the daemon's 0.5), 0 is kept as 0."""
    auto = SPEC.replace("instances: 8", "instances: auto")
    assert spec(auto).model.min_efficiency is None
    for text, want in (("0", 0.0), ("0.7", 0.7), ("1", 1.0)):
        s = spec(auto.replace("local_bsz: 12}", f"local_bsz: 12, min_efficiency: {text}}}"))
        assert s.model is not None and s.model.min_efficiency == want
        validate_submitted(s)
        chosen = with_workers(s, 4)
        assert spec_from_proto(spec_to_proto(chosen)).model == chosen.model  # the API keeps 0 apart from unset
        assert spec_from_dict(spec_to_dict(chosen)) == chosen  # and so does the store
    s = with_workers(spec(auto), 4)
    m = s.model
    assert m is not None
    for bad in (-0.1, 1.5, float("nan")):
        refused(replace(s, model=replace(m, min_efficiency=bad)), "model.min_efficiency")
    fixed = spec()
    assert fixed.model is not None
    assert "only with instances: auto" in refused(replace(fixed, model=replace(fixed.model, min_efficiency=0.5)),
                                                  "model.min_efficiency")
    with pytest.raises(InvalidArgument) as e:
        parse_spec(auto.replace("local_bsz: 12}", "local_bsz: 12, min_efficiency: lots}"))
    assert e.value.field == "model.min_efficiency"
