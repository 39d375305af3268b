"""Job spec validation, quantities, gang partition and the store's dict form."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from peloton.domain.resources import Resources, format_mib, parse_mib
from peloton.domain.spec import (
    Constraint,
    JobSpec,
    gang_partition,
    ignored_settings,
    spec_from_dict,
    spec_to_dict,
    validate,
)
from peloton.errors import InvalidArgument

GOOD = JobSpec(
    name="train",
    instances=4,
    command="python train.py",
    resources=Resources(cpu=2, mem=4096, disk=0, gpu=1, ports=2),
    respool="/team/ml",
    env={"LR": "0.1"},
    min_available=0,
    strategy="spread",
    constraints=(Constraint("rack", "eq", "r1"), Constraint("ssd", "exists")),
)


def test_accepts_a_good_spec() -> None:
    assert validate(GOOD) is GOOD
    assert validate(dataclasses.replace(GOOD, respool="/")) is not None
    assert validate(dataclasses.replace(GOOD, min_available=4, instances=4)).gang_size == 4


BAD: list[tuple[str, dict[str, Any]]] = [
    ("name", {"name": "  "}),
    ("name", {"name": "x" * 201}),
    ("instances", {"instances": 0}),
    ("instances", {"instances": -3}),
    ("instances", {"instances": 100_001}),
    ("task.command", {"command": ""}),
    ("task.resources.cpu", {"resources": Resources(cpu=0, mem=1)}),
    ("task.resources.cpu", {"resources": Resources(cpu=-1, mem=1)}),
    ("task.resources.mem", {"resources": Resources(cpu=1, mem=-1)}),
    ("task.resources.disk", {"resources": Resources(cpu=1, disk=-1)}),
    ("task.resources.gpu", {"resources": Resources(cpu=1, gpu=-1)}),
    ("task.resources.ports", {"resources": Resources(cpu=1, ports=-1)}),
    ("task.resources.ports", {"resources": Resources(cpu=1, ports=65)}),
    ("task.env.1BAD", {"env": {"1BAD": "x"}}),
    ("task.env_files.1BAD", {"env_files": {"1BAD": "/s"}}),
    ("task.env_files.KEY", {"env_files": {"KEY": "relative/path"}}),
    ("task.env_files.KEY", {"env_files": {"KEY": "/two\nlines"}}),
    ("task.env_files.LR", {"env_files": {"LR": "/s"}}),  # also in env
    ("task.env_files.KEY", {"env_files": {"KEY": "/" + "p" * 1024}}),
    ("task.env_files", {"env_files": {f"K{i}": "/s" for i in range(17)}}),
    ("respool", {"respool": "team"}),
    ("respool", {"respool": "/team/"}),
    ("gang.min_available", {"min_available": -1}),
    ("gang.min_available", {"min_available": 5}),
    ("gang.on_member_failure", {"on_member_failure": "shrug"}),
    ("gang.launch_timeout", {"launch_timeout_s": 0}),
    ("sla.max_runtime", {"max_runtime_s": -1}),
    ("retry.max_attempts", {"max_attempts": 0}),
    ("placement.strategy", {"strategy": "random"}),
    ("placement.constraints[0].attribute", {"constraints": (Constraint("", "eq", "x"),)}),
    ("placement.constraints[1].op", {"constraints": (Constraint("a", "eq", "x"), Constraint("b", "like", "y"))}),
    ("placement.constraints[0].value", {"constraints": (Constraint("rack", "eq", ""),)}),
]


@pytest.mark.parametrize("field,change", BAD, ids=[f"{f}-{i}" for i, (f, _) in enumerate(BAD)])
def test_rejects_bad_field_naming_it(field: str, change: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgument) as err:
        validate(dataclasses.replace(GOOD, **change))
    assert err.value.field == field
    assert str(err.value).startswith(field + ":")


def test_exists_constraint_needs_no_value() -> None:
    validate(dataclasses.replace(GOOD, constraints=(Constraint("gpu-model", "exists"),)))


@pytest.mark.parametrize(
    "value,mib",
    [
        ("512Mi", 512.0),
        ("16Gi", 16384.0),
        (1024, 1024.0),
        ("1Ti", 1024.0 * 1024),
        ("2048Ki", 2.0),
        ("1.5Gi", 1536.0),
        ("300", 300.0),
        (" 4Gi ", 4096.0),
        ("", 0.0),
        (0, 0.0),
        (2.5, 2.5),
    ],
)
def test_parse_mib(value: str | int | float, mib: float) -> None:
    assert parse_mib(value, "task.resources.mem") == mib


@pytest.mark.parametrize("value", ["-1Gi", "abc", "16GB", "1e3", -1, "Gi", True])
def test_parse_mib_rejects(value: Any) -> None:
    with pytest.raises(InvalidArgument) as err:
        parse_mib(value, "task.resources.mem")
    assert err.value.field == "task.resources.mem"


def test_format_mib() -> None:
    assert format_mib(16384) == "16Gi"
    assert format_mib(512) == "512Mi"
    assert format_mib(1536) == "1536Mi"


def test_gang_partition_rigid() -> None:
    spec = dataclasses.replace(GOOD, instances=4, min_available=0)
    assert gang_partition(spec) == [[0, 1, 2, 3]]


def test_gang_partition_elastic() -> None:
    spec = dataclasses.replace(GOOD, instances=5, min_available=2)
    assert gang_partition(spec) == [[0, 1], [2], [3], [4]]
    spec = dataclasses.replace(GOOD, instances=3, min_available=3)
    assert gang_partition(spec) == [[0, 1, 2]]


@settings(max_examples=200, deadline=None)
@given(instances=st.integers(1, 50), data=st.data())
def test_gang_partition_covers_each_instance_once(instances: int, data: st.DataObject) -> None:
    min_available = data.draw(st.integers(0, instances))
    gangs = gang_partition(dataclasses.replace(GOOD, instances=instances, min_available=min_available))
    assert sorted(i for g in gangs for i in g) == list(range(instances))
    assert len(gangs[0]) == (min_available or instances)
    assert all(len(g) == 1 for g in gangs[1:])


_text = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789 -_.", max_size=20)
_env_name = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,10}", fullmatch=True)
_floats = st.floats(min_value=0, max_value=1e6, allow_nan=False, allow_infinity=False)

specs = st.builds(
    JobSpec,
    name=_text,
    instances=st.integers(1, 100_000),
    command=_text,
    resources=st.builds(
        Resources, cpu=_floats, mem=_floats, disk=_floats, gpu=st.integers(0, 16), ports=st.integers(0, 64)
    ),
    owner=_text,
    respool=st.sampled_from(["/", "/a", "/a/b-c", "/team.x/sub_1"]),
    env=st.dictionaries(_env_name, _text, max_size=3),
    container_image=_text,
    min_available=st.integers(0, 100),
    on_member_failure=st.sampled_from(["restart_gang", "fail_job"]),
    launch_timeout_s=st.floats(min_value=0.001, max_value=1e5),
    priority=st.integers(-100, 100),
    preemptible=st.booleans(),
    max_runtime_s=_floats,
    max_attempts=st.integers(1, 10),
    strategy=st.sampled_from(["pack", "spread"]),
    constraints=st.lists(
        st.builds(Constraint, attribute=_env_name, op=st.sampled_from(["eq", "ne", "exists", "in"]), value=_text),
        max_size=3,
    ).map(tuple),
)


@settings(max_examples=200, deadline=None)
@given(spec=specs)
def test_spec_dict_round_trip(spec: JobSpec) -> None:
    d = spec_to_dict(spec)
    back = spec_from_dict(d)
    assert back == spec
    assert spec_to_dict(back) == d


@settings(max_examples=200, deadline=None)
@given(spec=specs)
def test_spec_dict_is_plain_json(spec: JobSpec) -> None:
    import json

    d = spec_to_dict(spec)
    assert spec_from_dict(json.loads(json.dumps(d))) == spec


def test_spec_from_dict_defaults() -> None:
    d = {
        "name": "n",
        "instances": 2,
        "command": "c",
        "resources": {"cpu": 1, "mem": 0, "disk": 0, "gpu": 0, "ports": 0},
    }
    spec = spec_from_dict(d)
    assert spec.respool == "/" and spec.max_attempts == 3 and spec.strategy == "pack" and spec.constraints == ()


@pytest.mark.parametrize("backend,image,warned", [
    ("local", "pytorch:2.3", True), ("sim", "pytorch:2.3", True), ("mesos", "pytorch:2.3", False),
    ("", "pytorch:2.3", False), ("local", "", False),
])
def test_settings_a_backend_accepts_but_ignores_are_named(backend: str, image: str, warned: bool) -> None:
    spec = dataclasses.replace(validate(GOOD), container_image=image)
    out = ignored_settings(spec, backend)
    assert bool(out) == warned
    if warned:
        assert out == [out[0]] and out[0].startswith(f"task.container.image: ignored by the {backend} backend")


@pytest.mark.parametrize("change,message", [
    ({"on_member_failure": "shrug"}, "gang.on_member_failure: must be one of restart_gang, fail_job, got 'shrug'"),
    ({"constraints": (Constraint("b", "like", "y"),)}, "placement.constraints[0].op: must be one of eq, ne, exists, "
                                                       "in, got 'like'"),
    ({"launch_timeout_s": 8 * 86400.0}, "gang.launch_timeout: at most 7d, got 8d"),
    ({"max_runtime_s": 366 * 86400.0 + 90}, "sla.max_runtime: at most 365d, got 366d1m30s"),
    ({"preemption_grace_s": 3600.5}, "sla.preemption_grace: at most 1h, got 3600.5s"),
    ({"launch_timeout_s": 0.0}, "gang.launch_timeout: must be greater than 0"),
])
def test_messages_say_what_was_given_in_the_units_of_a_spec_file(change: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidArgument) as ei:
        validate(dataclasses.replace(GOOD, **change))
    assert ei.value.message == message
