"""Every limit of peloton/domain/limits.py, field by field: a value at the limit is accepted, one past it is
refused with InvalidArgument naming the field (message and `field`); NUL in every string; NaN, infinities,
denormals and huge values in every number; fullmatch patterns; protobuf Durations."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

from peloton.api import convert, request_checks
from peloton.api.v1 import job_pb2, respool_pb2
from peloton.domain import limits as L
from peloton.domain.model import ResourcePool
from peloton.domain.pools import validate_pool
from peloton.domain.resources import Resources, parse_mib
from peloton.domain.spec import Constraint, JobSpec, validate, validate_pool_path
from peloton.errors import InvalidArgument

DENORMAL = 5e-324
NAN, INF = math.nan, math.inf

GOOD = JobSpec(
    name="train",
    instances=4,
    command="python train.py",
    resources=Resources(cpu=2, mem=4096, disk=1024, gpu=1, ports=2),
    owner="alice",
    respool="/team/ml",
    env={"LR": "0.1"},
    container_image="pytorch:2.3",
    strategy="spread",
    constraints=(Constraint("rack", "eq", "r1"), Constraint("ssd", "exists")),
)
GOOD_POOL = ResourcePool("/team", reservation=Resources(cpu=1, mem=1024), limit=Resources(cpu=8, mem=8192, gpu=2),
                         share=1.0)


def path_of(chars: int, segment: int = L.MAX_POOL_SEGMENT_CHARS) -> str:
    """A valid pool path of exactly `chars` characters, segments at most `segment` long."""
    out = ""
    while len(out) < chars:
        room = chars - len(out) - 1
        out += "/" + "p" * min(segment, room) if room > 0 else "/"
    assert len(out) == chars
    return out


def res(**kw: Any) -> Resources:
    return dataclasses.replace(GOOD.resources, **kw)


def env_of_total(total: int) -> dict[str, str]:
    """task.env making command + env exactly `total` bytes (command + NUL, NAME=value + NUL each)."""
    left = total - (len(GOOD.command.encode()) + 1)
    env: dict[str, str] = {}
    i = 0
    while left > 0:
        name = f"V{i:04d}"
        size = min(L.MAX_ENV_VALUE_BYTES, left - len(name) - 2)
        assert size >= 0
        env[name] = "v" * size
        left -= len(name) + 2 + size
        i += 1
    assert left == 0
    return env


# (field, change accepted at the limit, change refused past it). `None`: no accepted counterpart.
SPEC_LIMITS: list[tuple[str, dict[str, Any] | None, dict[str, Any]]] = [
    ("name", {"name": "n" * L.MAX_JOB_NAME_CHARS}, {"name": "n" * (L.MAX_JOB_NAME_CHARS + 1)}),
    ("name", {"name": "\U0001f600" * L.MAX_JOB_NAME_CHARS}, {"name": "\U0001f600" * (L.MAX_JOB_NAME_CHARS + 1)}),
    ("name", None, {"name": ""}),
    ("name", None, {"name": " \t"}),
    ("owner", {"owner": "o" * L.MAX_OWNER_CHARS}, {"owner": "o" * (L.MAX_OWNER_CHARS + 1)}),
    ("owner", {"owner": ""}, {"owner": "é" * (L.MAX_OWNER_CHARS + 1)}),
    ("respool", {"respool": path_of(L.MAX_POOL_PATH_CHARS)}, {"respool": path_of(L.MAX_POOL_PATH_CHARS + 1)}),
    ("respool", {"respool": "/" + "s" * L.MAX_POOL_SEGMENT_CHARS},
     {"respool": "/" + "s" * (L.MAX_POOL_SEGMENT_CHARS + 1)}),
    ("respool", {"respool": "/"}, {"respool": ""}),
    ("respool", {"respool": "/a/b"}, {"respool": "/a\n"}),
    ("respool", {"respool": "/a.b-c_d"}, {"respool": "/a/"}),
    ("respool", None, {"respool": "/a/../b"}),
    ("respool", None, {"respool": "/é"}),
    ("instances", {"instances": L.MAX_INSTANCES, "min_available": 1},
     {"instances": L.MAX_INSTANCES + 1, "min_available": 1}),
    ("instances", {"instances": 1}, {"instances": 0}),
    ("instances", None, {"instances": -1}),
    ("instances", {"instances": L.MAX_GANG_SIZE}, {"instances": L.MAX_GANG_SIZE + 1}),
    ("gang.min_available", {"instances": L.MAX_INSTANCES, "min_available": L.MAX_GANG_SIZE},
     {"instances": L.MAX_INSTANCES, "min_available": L.MAX_GANG_SIZE + 1}),
    ("gang.min_available", {"min_available": 4}, {"min_available": 5}),
    ("gang.min_available", {"min_available": 0}, {"min_available": -1}),
    ("gang.on_member_failure", {"on_member_failure": "fail_job"}, {"on_member_failure": "fail_job\x00"}),
    ("gang.launch_timeout", {"launch_timeout_s": L.MAX_LAUNCH_TIMEOUT_S},
     {"launch_timeout_s": math.nextafter(L.MAX_LAUNCH_TIMEOUT_S, INF)}),
    ("gang.launch_timeout", {"launch_timeout_s": 1e-9}, {"launch_timeout_s": 0.0}),
    ("gang.launch_timeout", None, {"launch_timeout_s": -1.0}),
    ("gang.launch_timeout", None, {"launch_timeout_s": NAN}),
    ("gang.launch_timeout", None, {"launch_timeout_s": INF}),
    ("gang.launch_timeout", None, {"launch_timeout_s": 1e300}),
    ("sla.priority", {"priority": L.INT32_MAX}, {"priority": L.INT32_MAX + 1}),
    ("sla.priority", {"priority": L.INT32_MIN}, {"priority": L.INT32_MIN - 1}),
    ("sla.max_runtime", {"max_runtime_s": L.MAX_RUNTIME_S}, {"max_runtime_s": math.nextafter(L.MAX_RUNTIME_S, INF)}),
    ("sla.max_runtime", {"max_runtime_s": 0.0}, {"max_runtime_s": -1e-9}),
    ("sla.max_runtime", None, {"max_runtime_s": NAN}),
    ("sla.max_runtime", None, {"max_runtime_s": -INF}),
    ("retry.max_attempts", {"max_attempts": L.MAX_ATTEMPTS}, {"max_attempts": L.MAX_ATTEMPTS + 1}),
    ("retry.max_attempts", {"max_attempts": 1}, {"max_attempts": 0}),
    ("task.command", {"command": "c" * L.MAX_COMMAND_BYTES}, {"command": "c" * (L.MAX_COMMAND_BYTES + 1)}),
    # bytes, not characters: 3-byte euro signs
    ("task.command", {"command": "€" * (L.MAX_COMMAND_BYTES // 3)}, {"command": "€" * (L.MAX_COMMAND_BYTES // 3 + 1)}),
    ("task.command", None, {"command": "  "}),
    ("task.command", None, {"command": "echo a\x00b"}),
    ("task.env.N", {"env": {"N": "v" * L.MAX_ENV_VALUE_BYTES}}, {"env": {"N": "v" * (L.MAX_ENV_VALUE_BYTES + 1)}}),
    ("task.env.N", {"env": {"N": ""}}, {"env": {"N": "a\x00"}}),
    ("task.env." + "N" * 64 + "...", {"env": {"N" * L.MAX_ENV_NAME_CHARS: "v"}},  # long names cut in the path
     {"env": {"N" * (L.MAX_ENV_NAME_CHARS + 1): "v"}}),
    ("task.env.FOO\\n", {"env": {"FOO": "x"}}, {"env": {"FOO\n": "x"}}),
    ("task.env.1BAD", {"env": {"_1": "x"}}, {"env": {"1BAD": "x"}}),
    ("task.env.A\\x00", None, {"env": {"A\x00": "x"}}),
    ('task.env.""', None, {"env": {"": "x"}}),
    ("task.env.A-B", None, {"env": {"A-B": "x"}}),
    ("task.env", {"env": {f"V{i}": "" for i in range(L.MAX_ENV_ENTRIES)}},
     {"env": {f"V{i}": "" for i in range(L.MAX_ENV_ENTRIES + 1)}}),
    ("task.env", {"env": env_of_total(L.MAX_COMMAND_AND_ENV_BYTES)},
     {"env": env_of_total(L.MAX_COMMAND_AND_ENV_BYTES + 1)}),
    ("task.resources.cpu", {"resources": res(cpu=L.MAX_TASK_CPU)},
     {"resources": res(cpu=math.nextafter(L.MAX_TASK_CPU, INF))}),
    ("task.resources.cpu", {"resources": res(cpu=L.MIN_CPU)}, {"resources": res(cpu=math.nextafter(L.MIN_CPU, 0))}),
    ("task.resources.cpu", None, {"resources": res(cpu=DENORMAL)}),
    ("task.resources.cpu", None, {"resources": res(cpu=0.0)}),
    ("task.resources.cpu", None, {"resources": res(cpu=-1.0)}),
    ("task.resources.cpu", None, {"resources": res(cpu=NAN)}),
    ("task.resources.cpu", None, {"resources": res(cpu=INF)}),
    ("task.resources.cpu", None, {"resources": res(cpu=1e308)}),
    ("task.resources.mem", {"resources": res(mem=L.MAX_TASK_MEM_MIB)}, {"resources": res(mem=L.MAX_TASK_MEM_MIB + 1)}),
    ("task.resources.mem", {"resources": res(mem=L.MIN_MEM_MIB)},
     {"resources": res(mem=math.nextafter(L.MIN_MEM_MIB, 0))}),
    ("task.resources.mem", {"resources": res(mem=0.0)}, {"resources": res(mem=DENORMAL)}),
    ("task.resources.mem", None, {"resources": res(mem=-1.0)}),
    ("task.resources.mem", None, {"resources": res(mem=NAN)}),
    ("task.resources.mem", None, {"resources": res(mem=INF)}),
    ("task.resources.disk", {"resources": res(disk=L.MAX_TASK_DISK_MIB)},
     {"resources": res(disk=L.MAX_TASK_DISK_MIB + 1)}),
    ("task.resources.disk", {"resources": res(disk=L.MIN_MEM_MIB)}, {"resources": res(disk=DENORMAL)}),
    ("task.resources.disk", None, {"resources": res(disk=NAN)}),
    ("task.resources.disk", None, {"resources": res(disk=-INF)}),
    ("task.resources.gpu", {"resources": res(gpu=L.MAX_TASK_GPU)}, {"resources": res(gpu=L.MAX_TASK_GPU + 1)}),
    ("task.resources.gpu", {"resources": res(gpu=0)}, {"resources": res(gpu=-1)}),
    ("task.resources.ports", {"resources": res(ports=L.MAX_TASK_PORTS)},
     {"resources": res(ports=L.MAX_TASK_PORTS + 1)}),
    ("task.resources.ports", {"resources": res(ports=0)}, {"resources": res(ports=-1)}),
    ("task.container.image", {"container_image": "i" * L.MAX_CONTAINER_IMAGE_CHARS},
     {"container_image": "i" * (L.MAX_CONTAINER_IMAGE_CHARS + 1)}),
    ("task.container.image", {"container_image": ""}, {"container_image": "img\x00"}),
    ("placement.strategy", {"strategy": "pack"}, {"strategy": "pack\x00"}),
    ("placement.strategy", None, {"strategy": "x" * 100_000}),
    ("placement.constraints", {"constraints": (Constraint("a", "exists"),) * L.MAX_CONSTRAINTS},
     {"constraints": (Constraint("a", "exists"),) * (L.MAX_CONSTRAINTS + 1)}),
    ("placement.constraints[0].attribute", {"constraints": (Constraint("a" * L.MAX_CONSTRAINT_ATTRIBUTE_CHARS, "exists"),)},
     {"constraints": (Constraint("a" * (L.MAX_CONSTRAINT_ATTRIBUTE_CHARS + 1), "exists"),)}),
    ("placement.constraints[0].attribute", None, {"constraints": (Constraint("", "exists"),)}),
    ("placement.constraints[0].attribute", None, {"constraints": (Constraint("ra\x00ck", "exists"),)}),
    ("placement.constraints[0].value", {"constraints": (Constraint("a", "in", "v" * L.MAX_CONSTRAINT_VALUE_CHARS),)},
     {"constraints": (Constraint("a", "in", "v" * (L.MAX_CONSTRAINT_VALUE_CHARS + 1)),)}),
    ("placement.constraints[0].value", None, {"constraints": (Constraint("a", "eq", "v\x00"),)}),
    ("placement.constraints[0].value", None, {"constraints": (Constraint("a", "eq", ""),)}),
    ("placement.constraints[1].op", None, {"constraints": (Constraint("a", "exists"), Constraint("a", "eq\x00", "v"))}),
]


def _ids(table: list[Any]) -> list[str]:
    return [f"{row[0][:40]}-{i}" for i, row in enumerate(table)]


def assert_refused(fn: Any, field: str) -> InvalidArgument:
    with pytest.raises(InvalidArgument) as ei:
        fn()
    err = ei.value
    assert err.field == field, err.message[:200]
    assert err.message.startswith(field + ": "), err.message[:200]
    assert "\n" not in err.message and "\x00" not in err.message
    assert len(err.message) < 400, "messages echo at most a short excerpt of the input"
    return err


@pytest.mark.parametrize("field,ok,past", SPEC_LIMITS, ids=_ids(SPEC_LIMITS))
def test_spec_limit(field: str, ok: dict[str, Any] | None, past: dict[str, Any]) -> None:
    if ok is not None:
        spec = dataclasses.replace(GOOD, **ok)
        assert validate(spec) is spec
    assert_refused(lambda: validate(dataclasses.replace(GOOD, **past)), field)


STRING_FIELDS: list[tuple[str, Any]] = [
    ("name", lambda v: {"name": v}),
    ("owner", lambda v: {"owner": v}),
    ("respool", lambda v: {"respool": "/" + v}),
    ("task.command", lambda v: {"command": v}),
    ("task.env.E", lambda v: {"env": {"E": v}}),
    ("task.env.E\\x00", lambda v: {"env": {"E" + v: "x"}}),
    ("task.container.image", lambda v: {"container_image": v}),
    ("gang.on_member_failure", lambda v: {"on_member_failure": v}),
    ("placement.strategy", lambda v: {"strategy": v}),
    ("placement.constraints[0].attribute", lambda v: {"constraints": (Constraint(v, "exists"),)}),
    ("placement.constraints[0].op", lambda v: {"constraints": (Constraint("a", v, "x"),)}),
    ("placement.constraints[0].value", lambda v: {"constraints": (Constraint("a", "eq", v),)}),
]


@pytest.mark.parametrize("field,change", STRING_FIELDS, ids=[f for f, _ in STRING_FIELDS])
@pytest.mark.parametrize("where", ["alone", "start", "middle", "end"])
def test_nul_is_refused_in_every_string_field(field: str, change: Any, where: str) -> None:
    value = {"alone": "\x00", "start": "\x00x", "middle": "x\x00x", "end": "x\x00"}[where]
    if field == "task.env.E\\x00":  # the NUL is in the variable's name
        field = "task.env." + ("E" + value).encode("unicode_escape").decode()
    assert_refused(lambda: validate(dataclasses.replace(GOOD, **change(value))), field)


@pytest.mark.parametrize("field,change", STRING_FIELDS, ids=[f for f, _ in STRING_FIELDS])
def test_lone_surrogates_are_refused_in_every_string_field(field: str, change: Any) -> None:
    if field == "task.env.E\\x00":
        field = "task.env.E\\ud800"
    assert_refused(lambda: validate(dataclasses.replace(GOOD, **change("\ud800"))), field)


@pytest.mark.parametrize("value", ["FOO\n", "\nFOO", "FOO\r", "FO O", "FOO=1", "é"])
def test_env_names_fullmatch(value: str) -> None:
    err = assert_refused(lambda: validate(dataclasses.replace(GOOD, env={value: "x"})),
                         "task.env." + value.encode("unicode_escape").decode())
    assert "not a valid environment variable name" in err.message


@pytest.mark.parametrize("path", ["/a\n", "/a/b\n", "\n/a", "/a\x00", "/ a", "//", "/a//b", "a", "/.", "/..",
                                  "/a/./b", "/\u0430"])
def test_pool_paths_fullmatch(path: str) -> None:
    assert_refused(lambda: validate_pool_path(path, "pool.path"), "pool.path")


# --- resource pools -----------------------------------------------------------------------------------------------
def pool_res(which: str, **kw: Any) -> dict[str, Any]:
    base = GOOD_POOL.reservation if which == "reservation" else GOOD_POOL.limit
    assert base is not None
    return {which: dataclasses.replace(base, **kw)}


POOL_LIMITS: list[tuple[str, dict[str, Any] | None, dict[str, Any]]] = [
    ("pool.path", {"path": path_of(L.MAX_POOL_PATH_CHARS)}, {"path": path_of(L.MAX_POOL_PATH_CHARS + 1)}),
    ("pool.path", {"path": "/" + "s" * L.MAX_POOL_SEGMENT_CHARS}, {"path": "/" + "s" * (L.MAX_POOL_SEGMENT_CHARS + 1)}),
    ("pool.path", {"path": "/x"}, {"path": "/"}),
    ("pool.path", None, {"path": ""}),
    ("pool.path", None, {"path": "/a\n"}),
    ("pool.path", None, {"path": "/a\x00"}),
    ("pool.share", {"share": L.MAX_POOL_SHARE}, {"share": math.nextafter(L.MAX_POOL_SHARE, INF)}),
    ("pool.share", {"share": L.MIN_POOL_SHARE}, {"share": math.nextafter(L.MIN_POOL_SHARE, 0)}),
    ("pool.share", None, {"share": 0.0}),
    ("pool.share", None, {"share": DENORMAL}),
    ("pool.share", None, {"share": -1.0}),
    ("pool.share", None, {"share": NAN}),
    ("pool.share", None, {"share": INF}),
    ("pool.limit.cpu", {"limit": None}, {"limit": Resources(cpu=NAN)}),
]
for _which in ("reservation", "limit"):
    for _dim, _max, _gran in (("cpu", L.MAX_POOL_CPU, L.MIN_CPU), ("mem", L.MAX_POOL_MEM_MIB, L.MIN_MEM_MIB),
                              ("disk", L.MAX_POOL_DISK_MIB, L.MIN_MEM_MIB)):
        _f = f"pool.{_which}.{_dim}"
        POOL_LIMITS += [
            (_f, pool_res(_which, **{_dim: _max}), pool_res(_which, **{_dim: math.nextafter(_max, INF)})),
            (_f, pool_res(_which, **{_dim: _gran}), pool_res(_which, **{_dim: math.nextafter(_gran, 0)})),
            (_f, pool_res(_which, **{_dim: 0.0}), pool_res(_which, **{_dim: DENORMAL})),
            (_f, None, pool_res(_which, **{_dim: -1.0})),
            (_f, None, pool_res(_which, **{_dim: NAN})),
            (_f, None, pool_res(_which, **{_dim: INF})),
            (_f, None, pool_res(_which, **{_dim: -INF})),
            (_f, None, pool_res(_which, **{_dim: 1e308})),
        ]
    for _dim, _max in (("gpu", L.MAX_POOL_GPU), ("ports", L.MAX_POOL_PORTS)):
        _f = f"pool.{_which}.{_dim}"
        POOL_LIMITS += [
            (_f, pool_res(_which, **{_dim: _max}), pool_res(_which, **{_dim: _max + 1})),
            (_f, pool_res(_which, **{_dim: 0}), pool_res(_which, **{_dim: -1})),
        ]


@pytest.mark.parametrize("field,ok,past", POOL_LIMITS, ids=_ids(POOL_LIMITS))
def test_pool_limit(field: str, ok: dict[str, Any] | None, past: dict[str, Any]) -> None:
    if ok is not None:
        pool = dataclasses.replace(GOOD_POOL, **ok)
        assert validate_pool(pool) is pool
    assert_refused(lambda: validate_pool(dataclasses.replace(GOOD_POOL, **past)), field)


def test_pool_share_zero_in_a_request_means_the_default() -> None:
    pool = convert.pool_from_proto(respool_pb2.ResourcePool(path="/x", share=0.0))
    assert validate_pool(pool).share == 1.0


@pytest.mark.parametrize("field,value", [("share", NAN), ("share", INF), ("share", -0.5)])
def test_pool_share_from_a_request(field: str, value: float) -> None:
    assert_refused(lambda: validate_pool(convert.pool_from_proto(respool_pb2.ResourcePool(path="/x", share=value))),
                   "pool.share")


# --- quantities and numbers in messages -------------------------------------------------------------------------
@pytest.mark.parametrize("text", ["1e400Gi", "9" * 400, "9" * 400 + "Ti", "1" * 320 + ".5Gi", "inf", "nan", "-0",
                                  "1e3", "0x10", "1 Gi x", "1\n2", "1Gi\x00", "٣Gi"])
def test_parse_mib_refuses_non_finite_and_malformed_quantities(text: str) -> None:
    assert_refused(lambda: parse_mib(text, "task.resources.mem"), "task.resources.mem")


@pytest.mark.parametrize("value", [10**400, math.inf, -math.inf, math.nan, -1])
def test_parse_mib_refuses_huge_and_non_finite_numbers(value: float) -> None:
    assert_refused(lambda: parse_mib(value, "pool.limit.mem"), "pool.limit.mem")


@pytest.mark.parametrize("dim,value", [("cpu", "nan"), ("cpu", "inf"), ("cpu", "-inf"), ("mem", "9" * 400),
                                       ("disk", "1" * 500 + "Ti")])
def test_resources_from_proto_names_the_field(dim: str, value: str) -> None:
    r = job_pb2.Resources(cpu=float(value) if dim == "cpu" else 1.0)
    if dim != "cpu":
        setattr(r, dim, value)
    assert_refused(lambda: convert.resources_from_proto(r, "task.resources"), f"task.resources.{dim}")


def test_quantities_at_the_granularity_are_accepted_below_refused() -> None:
    assert validate(dataclasses.replace(GOOD, resources=res(mem=parse_mib("1Ki", "m")))).resources.mem == 1 / 1024
    assert_refused(lambda: validate(dataclasses.replace(GOOD, resources=res(mem=parse_mib("0.5Ki", "m")))),
                   "task.resources.mem")


def test_task_ceilings_in_quantity_syntax() -> None:
    assert parse_mib("64Ti", "m") == L.MAX_TASK_MEM_MIB and parse_mib("1024Ti", "m") == L.MAX_TASK_DISK_MIB
    assert parse_mib("1048576Ti", "m") == L.MAX_POOL_MEM_MIB == L.MAX_POOL_DISK_MIB


# --- durations ----------------------------------------------------------------------------------------------------
MAXS = L.PROTO_DURATION_MAX_SECONDS


def spec_with(field: str, seconds: int, nanos: int) -> job_pb2.JobSpec:
    p = convert.spec_to_proto(GOOD)
    d = p.gang.launch_timeout if field == "gang.launch_timeout" else p.sla.max_runtime
    d.seconds, d.nanos = seconds, nanos
    return p


DURATIONS_BAD = [
    (MAXS + 1, 0), (-MAXS - 1, 0), (2**63 - 1, 0), (-(2**63), 0),  # outside the protobuf range
    (0, 1_000_000_000), (0, -1_000_000_000), (1, 2**31 - 1), (0, -(2**31)),  # malformed nanos
    (1, -1), (-1, 1),  # mixed signs
    (MAXS, 999_999_999), (-1, 0), (0, -1),  # well-formed, outside the documented range
]


@pytest.mark.parametrize("field", ["gang.launch_timeout", "sla.max_runtime"])
@pytest.mark.parametrize("seconds,nanos", DURATIONS_BAD)
def test_bad_durations_are_refused_without_overflow(field: str, seconds: int, nanos: int) -> None:
    assert_refused(lambda: validate(convert.spec_from_proto(spec_with(field, seconds, nanos))), field)


@pytest.mark.parametrize("field,seconds,nanos,expect", [
    ("gang.launch_timeout", int(L.MAX_LAUNCH_TIMEOUT_S), 0, L.MAX_LAUNCH_TIMEOUT_S),
    ("gang.launch_timeout", 0, 1, 1e-9),  # not truncated to 0 (ToTimedelta would)
    ("gang.launch_timeout", 1, 1, 1.000000001),
    ("sla.max_runtime", int(L.MAX_RUNTIME_S), 0, L.MAX_RUNTIME_S),
    ("sla.max_runtime", 0, 0, 0.0),
    ("sla.max_runtime", 3599, 999_999_999, 3599.999999999),
])
def test_durations_at_the_limits_are_accepted_exactly(field: str, seconds: int, nanos: int, expect: float) -> None:
    spec = validate(convert.spec_from_proto(spec_with(field, seconds, nanos)))
    got = spec.launch_timeout_s if field == "gang.launch_timeout" else spec.max_runtime_s
    assert got == expect
    assert convert.spec_from_proto(convert.spec_to_proto(spec)) == spec


@pytest.mark.parametrize("field,seconds,nanos", [
    ("gang.launch_timeout", int(L.MAX_LAUNCH_TIMEOUT_S), 1),
    ("gang.launch_timeout", 0, 0),
    ("sla.max_runtime", int(L.MAX_RUNTIME_S), 1000),  # float seconds resolve ~4 ns at a year: +1 ns is the max
])
def test_durations_just_past_the_limits_are_refused(field: str, seconds: int, nanos: int) -> None:
    assert_refused(lambda: validate(convert.spec_from_proto(spec_with(field, seconds, nanos))), field)


def test_a_spec_stored_with_an_out_of_range_duration_still_converts() -> None:
    """Specs stored before the limits existed: GetJob and ListJobs must not fail on them."""
    p = convert.spec_to_proto(dataclasses.replace(GOOD, launch_timeout_s=1e300, max_runtime_s=INF))
    assert p.gang.launch_timeout.seconds == MAXS and p.sla.max_runtime.seconds == MAXS


# --- request fields -----------------------------------------------------------------------------------------------
REQUEST_LIMITS: list[tuple[str, Any, Any, Any]] = [
    ("job_id", request_checks.job_id, "j" * L.MAX_JOB_ID_CHARS, "j" * (L.MAX_JOB_ID_CHARS + 1)),
    ("job_id", request_checks.job_id, "0123456789ab", ""),
    ("job_id", request_checks.job_id, "a", "a\x00"),
    ("job_id", request_checks.job_id, "a", "\ud800"),
    ("instance", request_checks.instance, 0, -1),
    ("attempt", request_checks.attempt, 0, -1),
    ("path", request_checks.pool_path, "/", ""),
    ("path", request_checks.pool_path, path_of(L.MAX_POOL_PATH_CHARS), path_of(L.MAX_POOL_PATH_CHARS + 1)),
    ("path", request_checks.pool_path, "/a", "/a\n"),
    ("path", request_checks.pool_path, "/a", "/a\x00"),
]


@pytest.mark.parametrize("field,check,ok,past", REQUEST_LIMITS, ids=_ids(REQUEST_LIMITS))
def test_request_field_limit(field: str, check: Any, ok: Any, past: Any) -> None:
    assert check(ok) == ok
    assert_refused(lambda: check(past), field)


LIST_OK = {"states": [], "owner": "", "respool": "", "name_contains": "", "limit": 0}
LIST_LIMITS: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("limit", {"limit": L.MAX_LIST_LIMIT}, {"limit": L.MAX_LIST_LIMIT + 1}),
    ("limit", {"limit": 0}, {"limit": -1}),
    ("states", {"states": ["RUNNING"] * L.MAX_STATE_FILTERS}, {"states": ["RUNNING"] * (L.MAX_STATE_FILTERS + 1)}),
    ("states[1]", {"states": ["running", "Killed"]}, {"states": ["running", "SLEEPING"]}),
    ("states[0]", {"states": ["PENDING"]}, {"states": ["PENDING\x00"]}),
    ("states[0]", {"states": ["PENDING"]}, {"states": ["x" * 100_000]}),
    ("owner", {"owner": "o" * L.MAX_OWNER_CHARS}, {"owner": "o" * (L.MAX_OWNER_CHARS + 1)}),
    ("owner", {"owner": "alice"}, {"owner": "al\x00ice"}),
    ("respool", {"respool": path_of(L.MAX_POOL_PATH_CHARS)}, {"respool": path_of(L.MAX_POOL_PATH_CHARS + 1)}),
    ("respool", {"respool": "/a"}, {"respool": "/a\n"}),
    ("respool", {"respool": "/a"}, {"respool": "\x00"}),
    ("name_contains", {"name_contains": "n" * L.MAX_NAME_CONTAINS_CHARS},
     {"name_contains": "n" * (L.MAX_NAME_CONTAINS_CHARS + 1)}),
    ("name_contains", {"name_contains": "%_"}, {"name_contains": "x\x00"}),
    ("id_prefix", {"id_prefix": "0123456789ab"}, {"id_prefix": "0123456789abc"}),
    ("id_prefix", {"id_prefix": "cafe"}, {"id_prefix": "CAFE"}),
    ("id_prefix", {"id_prefix": "f"}, {"id_prefix": "f%"}),
]


@pytest.mark.parametrize("field,ok,past", LIST_LIMITS, ids=_ids(LIST_LIMITS))
def test_list_jobs_request_limit(field: str, ok: dict[str, Any], past: dict[str, Any]) -> None:
    request_checks.list_jobs(**{**LIST_OK, **ok})
    assert_refused(lambda: request_checks.list_jobs(**{**LIST_OK, **past}), field)


def test_spec_size_limit_at_the_edge() -> None:
    p = job_pb2.JobSpec(name="x")
    p.task.command = "c" * (L.MAX_SPEC_BYTES - 16)
    while p.ByteSize() != L.MAX_SPEC_BYTES:  # the length prefixes grow with the command
        p.task.command = "c" * (len(p.task.command) + L.MAX_SPEC_BYTES - p.ByteSize())
    assert p.ByteSize() == L.MAX_SPEC_BYTES
    request_checks.spec_size(p)
    p.task.command += "c"
    assert_refused(lambda: request_checks.spec_size(p), "spec")


def test_every_valid_spec_fits_the_size_limit() -> None:
    """The largest spec every other limit allows still serializes under MAX_SPEC_BYTES."""
    big = dataclasses.replace(
        GOOD,
        name="\U0001f600" * L.MAX_JOB_NAME_CHARS,
        owner="\U0001f600" * L.MAX_OWNER_CHARS,
        respool=path_of(L.MAX_POOL_PATH_CHARS),
        command="c" * L.MAX_COMMAND_BYTES,
        env=env_of_total(L.MAX_COMMAND_AND_ENV_BYTES - L.MAX_COMMAND_BYTES + len(GOOD.command)),
        container_image="\U0001f600" * L.MAX_CONTAINER_IMAGE_CHARS,
        constraints=tuple(Constraint("\U0001f600" * L.MAX_CONSTRAINT_ATTRIBUTE_CHARS, "in",
                                     "\U0001f600" * L.MAX_CONSTRAINT_VALUE_CHARS) for _ in range(L.MAX_CONSTRAINTS)),
    )
    validate(big)
    assert convert.spec_to_proto(big).ByteSize() < L.MAX_SPEC_BYTES


# --- the docs -----------------------------------------------------------------------------------------------------
def test_the_docs_list_every_limit() -> None:
    """docs/job-spec.md "Limits" states the numbers of limits.py: change one, change the other."""
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "job-spec.md").read_text()
    section = doc.split("\n## Limits\n", 1)[1].split("\n## ", 1)[0]
    KiB_ = 1024
    expected = [
        f"at most {L.MAX_JOB_NAME_CHARS} characters", f"at most {L.MAX_OWNER_CHARS} characters",
        f"at most {L.MAX_POOL_PATH_CHARS} characters, each name at most {L.MAX_POOL_SEGMENT_CHARS}",
        f"at most {L.MAX_JOB_ID_CHARS} characters", f"1 to {L.MAX_INSTANCES}", f"at most {L.MAX_GANG_SIZE}",
        f"at most 7 days ({L.MAX_LAUNCH_TIMEOUT_S:.0f}s)", f"365 days ({L.MAX_RUNTIME_S:.0f}s)",
        f"1 to {L.MAX_ATTEMPTS}", f"at most {L.MAX_COMMAND_BYTES} bytes ({L.MAX_COMMAND_BYTES // KiB_} KiB)",
        f"at most {L.MAX_ENV_ENTRIES} variables",
        f"at most {L.MAX_COMMAND_AND_ENV_BYTES} bytes ({L.MAX_COMMAND_AND_ENV_BYTES // KiB_} KiB)",
        f"at most {L.MAX_ENV_NAME_CHARS} characters; value at most {L.MAX_ENV_VALUE_BYTES} bytes",
        f"{L.MIN_CPU:g} to {L.MAX_TASK_CPU:g} cores", f"1Ki (1/1024 MiB) to {L.MAX_TASK_MEM_MIB / 1024**2:g}Ti",
        f"1Ki to {L.MAX_TASK_DISK_MIB / 1024**2:g}Ti", f"0 to {L.MAX_TASK_GPU}", f"0 to {L.MAX_TASK_PORTS}",
        f"at most {L.MAX_CONTAINER_IMAGE_CHARS} characters", f"at most {L.MAX_CONSTRAINTS}",
        f"at most {L.MAX_CONSTRAINT_ATTRIBUTE_CHARS} characters", f"at most {L.MAX_CONSTRAINT_VALUE_CHARS} characters",
        f"at most 1 MiB ({L.MAX_SPEC_BYTES} bytes)", f"at most 4 MiB ({L.MAX_REQUEST_BYTES} bytes)",
        f"0.001 to {L.MAX_POOL_CPU:.0f} cores",
        f"1Ki to {L.MAX_POOL_MEM_MIB / 1024**2:.0f}Ti", f"0 to {L.MAX_POOL_GPU}", f"0 to {L.MAX_POOL_PORTS}",
        f"{L.MIN_POOL_SHARE:g} to {L.MAX_POOL_SHARE:.0f}", f"0 (the default, {L.DEFAULT_LIST_LIMIT}) to {L.MAX_LIST_LIMIT}",
        f"at most {L.MAX_STATE_FILTERS}", f"±{L.PROTO_DURATION_MAX_SECONDS}", f"±{L.PROTO_DURATION_MAX_NANOS}",
        f"at most {L.MAX_NAME_CONTAINS_CHARS} characters", f"at most {L.MAX_ROLES} roles",
        f"at most {L.MAX_ROLE_NAME_CHARS} characters",
        f"at most {L.MAX_ROLES_TASK_BYTES} bytes ({L.MAX_ROLES_TASK_BYTES // KiB_} KiB)",
    ]
    missing = [e for e in expected if e not in section]
    assert not missing, missing
    assert L.MIN_POOL_SHARE == L.MIN_CPU == 0.001 and L.MIN_MEM_MIB == 1 / 1024  # "0.001" and "1Ki" in the text


def test_the_docs_state_the_limits_of_the_operators_files() -> None:
    """cli.md, security.md and model-aware.md state the limits of the files the daemon and the CLI read whole."""
    from pathlib import Path

    docs = Path(__file__).resolve().parents[2] / "docs"
    cli, security, model = ((docs / f).read_text() for f in ("cli.md", "security.md", "model-aware.md"))
    config = f"read up to {L.MAX_CONFIG_FILE_BYTES >> 20} MiB ({L.MAX_CONFIG_FILE_BYTES} bytes)"
    assert cli.count(config) == 2  # the client's config.toml, the server's --config
    gpus = f"{L.MAX_GPU_TABLE_BYTES >> 20} MiB ({L.MAX_GPU_TABLE_BYTES} bytes"
    assert gpus in cli and gpus in model and f"`--gpu-table` {L.MAX_GPU_TABLE_BYTES >> 20} MiB" in cli
    principals = f"{L.MAX_PRINCIPALS_FILE_BYTES >> 20} MiB ({L.MAX_PRINCIPALS_FILE_BYTES} bytes"
    assert principals in cli and principals in security
    assert f"the principals file {L.MAX_PRINCIPALS_FILE_BYTES >> 20} MiB" in cli


def test_status_messages_are_bounded_for_their_header() -> None:
    """gRPC drops a status message over its header limit: the caller would see RESOURCE_EXHAUSTED, not the error."""
    from peloton.api.status import MAX_MESSAGE_BYTES, bounded

    assert bounded("owner: too long") == "owner: too long"
    long = bounded("pool.path: children " + "é" * 10_000)
    assert long.startswith("pool.path: children ") and long.endswith("...")
    assert len(long.encode()) <= MAX_MESSAGE_BYTES + 3
