"""Fuzzing the spec readers: whatever comes in, the only exception is InvalidArgument naming a field, and whatever
is accepted round-trips (domain -> protobuf -> domain gives the same JobSpec)."""

from __future__ import annotations

import dataclasses
import datetime
import math
from typing import Any

import yaml
from hypothesis import HealthCheck, assume, event, example, given, settings
from hypothesis import strategies as st

from peloton.api import convert, specfile
from peloton.api.specfile import parse_spec
from peloton.api.v1 import job_pb2
from peloton.domain import limits as L
from peloton.domain.spec import JobSpec, spec_from_dict, spec_to_dict, validate
from peloton.errors import InvalidArgument

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def semantic(s: JobSpec) -> JobSpec:
    """min_available 0 means "all instances": the API shows the gang size it means (spec_to_proto)."""
    return dataclasses.replace(s, min_available=s.gang_size)


def check_accepted_round_trips(spec: JobSpec) -> None:
    back = convert.spec_from_proto(convert.spec_to_proto(spec))
    assert semantic(back) == semantic(spec)
    assert validate(back) == back
    assert spec_from_dict(spec_to_dict(spec)) == spec  # the store's form too


def convert_and_validate(p: job_pb2.JobSpec) -> JobSpec | None:
    """The daemon's path: spec_from_proto then validate. None when refused (with a field named)."""
    try:
        spec = validate(convert.spec_from_proto(p))
    except InvalidArgument as e:
        assert e.field, e.message
        assert e.message.startswith(e.field + ": "), e.message[:200]
        assert len(e.message) < 400 and "\n" not in e.message
        event(f"refused: {e.field.split('[')[0].split('.task.env')[0][:24]}")
        return None
    event("accepted")
    check_accepted_round_trips(spec)
    return spec


def parse_only_invalid_argument(text: str) -> job_pb2.JobSpec | None:
    try:
        return parse_spec(text, source="f.yaml")
    except InvalidArgument as e:
        assert e.field, e.message
        assert e.message.startswith("f.yaml: "), e.message[:200]
        assert "\n" not in e.message
        return None


# --- strategies ---------------------------------------------------------------------------------------------------
def mostly(plausible: st.SearchStrategy[Any], wild: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """`plausible` about five times in six, so that enough specs get past the first refusal."""
    return st.sampled_from(range(6)).flatmap(lambda i: wild if i == 5 else plausible)


# protobuf strings hold any Unicode but lone surrogates; NUL and control characters included on purpose
any_text = st.text(st.characters(exclude_categories=["Cs"]), max_size=30)
wild_text = st.one_of(
    any_text,
    st.sampled_from(["", " ", "\x00", "a\x00", "FOO\n", "/a\n", "/", "/a", "pack", "spread", "eq", "in", "exists",
                     "restart_gang", "fail_job", "512Mi", "1e400Gi", "9" * 400, "0.0000001Ki", "nan", "inf"]),
    st.builds(lambda c, n: c * n, st.sampled_from(["x", "é", "\U0001f600", "\x00"]),
              st.sampled_from([63, 64, 65, 128, 129, 200, 201, 256, 257, 512, 513, 1024, 1025, 65536, 65537])),
)
names = mostly(st.from_regex(r"[a-z][a-z0-9-]{0,20}", fullmatch=True), wild_text)
env_names = mostly(st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,12}", fullmatch=True), wild_text)
pool_paths = mostly(st.sampled_from(["", "/", "/a", "/a/b-c", "/team.x/sub_1"]), wild_text)
any_float = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=True),
    st.sampled_from([0.0, -0.0, 5e-324, 1e-300, 0.0005, 0.001, 1.0, 4096.0, 4096.5, 1e308]),
)


cpus = mostly(st.floats(0.001, 64), any_float)
int32 = st.integers(-(2**31), 2**31 - 1)
quantities = mostly(
    st.sampled_from(["", "0", "1Ki", "512Mi", "16Gi", "64Ti", "1024Ti", "1.5", " 2Gi "]),
    st.one_of(
        st.sampled_from(["0.5Ki", "65Ti", "1025Ti", "-1Gi", "1e3", "1Gi\n", "0x10"]),
        st.builds(lambda n, u: f"{n}{u}", st.integers(0, 10**30), st.sampled_from(["", "Ki", "Mi", "Gi", "Ti", "Zi"])),
        wild_text,
    ),
)
int64 = st.integers(-(2**63), 2**63 - 1)
durations = mostly(
    st.tuples(st.integers(0, 10**5), st.integers(0, 999_999_999)),
    st.tuples(int64, int32),
) | st.one_of(
    st.tuples(st.sampled_from([0, 1, -1, L.PROTO_DURATION_MAX_SECONDS, L.PROTO_DURATION_MAX_SECONDS + 1]),
              st.sampled_from([0, 1, -1, 999_999_999, 10**9, -(10**9)])),
)


@st.composite
def job_spec_messages(draw: st.DrawFn) -> job_pb2.JobSpec:
    p = job_pb2.JobSpec(name=draw(names), owner=draw(names), respool=draw(pool_paths),
                        instances=draw(mostly(st.integers(1, 8), int32)))
    p.task.command = draw(mostly(st.just("true"), wild_text))
    for k, v in draw(st.dictionaries(env_names, wild_text, max_size=4)).items():
        p.task.env[k] = v
    r = p.task.resources
    r.cpu = draw(cpus)
    r.mem, r.disk = draw(quantities), draw(quantities)
    r.gpu, r.ports = draw(mostly(st.integers(0, 4), int32)), draw(mostly(st.integers(0, 4), int32))
    if draw(st.booleans()):
        p.task.container.image = draw(wild_text)
    if draw(st.booleans()):
        p.gang.min_available = draw(mostly(st.integers(0, 8), int32))
        p.gang.on_member_failure = draw(mostly(st.sampled_from(["", "restart_gang", "fail_job"]), wild_text))
    if draw(st.booleans()):
        p.gang.launch_timeout.seconds, p.gang.launch_timeout.nanos = draw(durations)
    if draw(st.booleans()):
        p.sla.priority, p.sla.preemptible = draw(int32), draw(st.booleans())
    if draw(st.booleans()):
        p.sla.max_runtime.seconds, p.sla.max_runtime.nanos = draw(durations)
    if draw(st.booleans()):
        p.retry.max_attempts = draw(mostly(st.integers(0, 5), int32))
    if draw(st.booleans()):
        p.placement.strategy = draw(mostly(st.sampled_from(["", "pack", "spread"]), wild_text))
    ops = mostly(st.sampled_from(["", "eq", "ne", "exists", "in"]), wild_text)
    for attribute, op, value in draw(st.lists(st.tuples(names, ops, names), max_size=3)):
        p.placement.constraints.add(attribute=attribute, op=op, value=value)
    return p


@FUZZ
@given(p=job_spec_messages())
@example(p=job_pb2.JobSpec(name="x", instances=1, task=job_pb2.TaskSpec(
    command="true", resources=job_pb2.Resources(cpu=5e-324))))
def test_any_job_spec_message_is_accepted_and_round_trips_or_refused_naming_a_field(p: job_pb2.JobSpec) -> None:
    convert_and_validate(p)


valid_specs = st.builds(
    lambda name, n, cmd, env, cpu, mem, gpu, ports, lt, mr, prio, att, strat, owner, pool, ma, cons: (
        _message(name, n, cmd, env, cpu, mem, gpu, ports, lt, mr, prio, att, strat, owner, pool, ma, cons)),
    st.text(st.characters(exclude_categories=["Cs", "Cc"]), min_size=1, max_size=L.MAX_JOB_NAME_CHARS).filter(str.strip),
    st.integers(1, 64),
    st.text(st.characters(exclude_categories=["Cs", "Cc"]), min_size=1, max_size=200).filter(str.strip),
    st.dictionaries(st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,20}", fullmatch=True),
                    st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=50),
                    max_size=5),
    st.floats(L.MIN_CPU, L.MAX_TASK_CPU),
    st.one_of(st.just(0.0), st.floats(L.MIN_MEM_MIB, L.MAX_TASK_MEM_MIB)),
    st.integers(0, L.MAX_TASK_GPU), st.integers(0, L.MAX_TASK_PORTS),
    st.tuples(st.integers(0, int(L.MAX_LAUNCH_TIMEOUT_S) - 1), st.integers(1, 999_999_999)),
    st.tuples(st.integers(0, int(L.MAX_RUNTIME_S) - 1), st.integers(0, 999_999_999)),
    st.integers(L.INT32_MIN, L.INT32_MAX), st.integers(0, L.MAX_ATTEMPTS),
    st.sampled_from(["", "pack", "spread"]),
    st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=L.MAX_OWNER_CHARS),
    st.sampled_from(["", "/", "/a", "/a/b-c", "/team.x/sub_1", "/" + "p" * L.MAX_POOL_SEGMENT_CHARS]),
    st.data(),
    st.lists(st.tuples(st.from_regex(r"[a-z][a-z0-9-]{0,10}", fullmatch=True),
                       st.sampled_from(["eq", "ne", "exists", "in", ""]),
                       st.from_regex(r"[a-z0-9,]{1,10}", fullmatch=True)), max_size=L.MAX_CONSTRAINTS),
)


def _message(name: str, n: int, cmd: str, env: dict[str, str], cpu: float, mem: float, gpu: int, ports: int,
             lt: tuple[int, int], mr: tuple[int, int], prio: int, att: int, strat: str, owner: str, pool: str,
             ma: st.DataObject, cons: list[tuple[str, str, str]]) -> job_pb2.JobSpec:
    p = job_pb2.JobSpec(name=name, owner=owner, respool=pool, instances=n)
    p.task.command = cmd
    p.task.env.update(env)
    p.task.resources.CopyFrom(convert.resources_to_proto(convert.Resources(cpu=cpu, mem=mem, gpu=gpu, ports=ports)))
    p.gang.min_available = ma.draw(st.integers(0, n))
    p.gang.launch_timeout.seconds, p.gang.launch_timeout.nanos = lt
    p.sla.max_runtime.seconds, p.sla.max_runtime.nanos = mr
    p.sla.priority = prio
    p.retry.max_attempts = att
    p.placement.strategy = strat
    for a, op, v in cons:
        p.placement.constraints.add(attribute=a, op=op, value=v)
    return p


@FUZZ
@given(p=valid_specs)
def test_valid_job_spec_messages_are_accepted_and_round_trip(p: job_pb2.JobSpec) -> None:
    assert convert_and_validate(p) is not None


# --- the YAML reader ----------------------------------------------------------------------------------------------
FIELD_NAMES = ["name", "owner", "respool", "instances", "gang", "sla", "task", "placement", "retry", "min_available",
               "on_member_failure", "launch_timeout", "priority", "preemptible", "max_runtime", "command", "env",
               "resources", "container", "image", "cpu", "mem", "disk", "gpu", "ports", "strategy", "constraints",
               "attribute", "op", "value", "max_attempts", "minAvailable", "launchTimeout"]
YAML_TOKENS = FIELD_NAMES + [":", ": ", "\n", "\n  ", "\n    ", "- ", "[", "]", "{", "}", ",", "&a ", "*a", "!!binary ",
                             "!!timestamp ", "!!set ", "!!python/object ", "? ", "|", ">", "'", '"', "\\u0000",
                             "\\ud800", "\t", "#", "---", "...", "0x" + "f" * 40, "1e400", ".nan", ".inf", "-.inf",
                             "2001-13-01", "2001-01-01", "null", "~", "true", "300s", "16Gi", "-1", "9" * 30, "%", "@",
                             "\x00", "\ufeff", "\U0001f600"]


@FUZZ
@given(text=st.text(max_size=200))
def test_parse_spec_on_any_text_raises_only_invalid_argument(text: str) -> None:
    parse_only_invalid_argument(text)


@FUZZ
@given(tokens=st.lists(st.sampled_from(YAML_TOKENS) | st.text(max_size=5), max_size=40))
@example(tokens=["[" * 3000])
@example(tokens=["a: 2001-13-01"])
@example(tokens=["a: &a [*a, *a]\ntask: {env: {A: *a}}"])
@example(tokens=["gang: {launch_timeout: 0x" + "f" * 5000 + "}"])
def test_parse_spec_on_yaml_ish_text_raises_only_invalid_argument(tokens: list[str]) -> None:
    p = parse_only_invalid_argument("".join(tokens))
    if p is not None:
        convert_and_validate(p)


scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(-(2**70), 2**70), any_float, wild_text,
    st.dates(), st.datetimes(), st.binary(max_size=5),
)
keys = st.one_of(st.sampled_from(FIELD_NAMES), any_text, st.integers(-3, 3), st.booleans(), st.none())
docs = st.recursive(scalars, lambda kids: st.lists(kids, max_size=4) | st.dictionaries(keys, kids, max_size=5),
                    max_leaves=25)


def spec_shaped() -> st.SearchStrategy[dict[str, Any]]:
    """The real structure with wild leaves, so that most documents reach the conversion and the validator."""
    leaf = docs

    def section(*fields: str) -> st.SearchStrategy[Any]:
        return st.one_of(st.fixed_dictionaries({}, optional={f: leaf for f in fields}), leaf)

    small = st.integers(0, 4)
    resources = st.fixed_dictionaries({"cpu": mostly(st.floats(0.001, 64), st.one_of(any_float, leaf))}, optional={
        "mem": mostly(quantities, st.one_of(any_float, st.integers(), leaf)), "disk": mostly(quantities, leaf),
        "gpu": mostly(small, leaf), "ports": mostly(small, leaf)})
    env_values = mostly(st.one_of(any_text, st.integers(), st.floats(), st.booleans(), st.none()), leaf)
    task = st.fixed_dictionaries({"command": mostly(st.just("true"), st.one_of(wild_text, leaf)),
                                  "resources": resources}, optional={
        "env": st.dictionaries(mostly(env_names, keys), env_values, max_size=4), "container": section("image")})
    return st.fixed_dictionaries({"name": mostly(st.just("x"), st.one_of(names, leaf)),
                                  "instances": mostly(st.integers(1, 8), leaf), "task": task}, optional={
        "owner": mostly(names, leaf), "respool": mostly(pool_paths, leaf),
        "gang": st.fixed_dictionaries({}, optional={"min_available": mostly(small, leaf),
                                                    "on_member_failure": mostly(st.just("fail_job"), leaf),
                                                    "launch_timeout": mostly(st.floats(0.001, 1e5),
                                                                             st.one_of(any_float, st.integers(),
                                                                                       leaf))}),
        "sla": section("priority", "preemptible", "max_runtime"),
        "placement": st.fixed_dictionaries({}, optional={"strategy": leaf, "constraints": st.lists(
            st.fixed_dictionaries({}, optional={"attribute": leaf, "op": leaf, "value": leaf}), max_size=3)}),
        "retry": section("max_attempts"),
    }) | st.fixed_dictionaries({"bogus": leaf})


def dump(doc: Any) -> str:
    try:
        return yaml.safe_dump(doc, allow_unicode=True)
    except (yaml.YAMLError, UnicodeEncodeError):
        assume(False)
        raise


@FUZZ
@given(doc=st.one_of(docs, st.dictionaries(keys, docs, max_size=8)))
def test_parse_spec_on_any_yaml_document_raises_only_invalid_argument(doc: Any) -> None:
    p = parse_only_invalid_argument(dump(doc))
    if p is not None:
        convert_and_validate(p)


@FUZZ
@given(doc=spec_shaped())
@example(doc={"task": {"env": {"A": [1, 2]}}})
@example(doc={"task": {"resources": {"cpu": 5e-324, "mem": math.inf}}, "name": "x", "instances": 1})
@example(doc={"gang": {"launch_timeout": 10**30}, "sla": {"max_runtime": -math.inf}})
@example(doc={"name": datetime.date(2001, 1, 1), "task": {"env": {1: None, "B": True}}})
def test_parse_spec_on_spec_shaped_documents_raises_only_invalid_argument(doc: dict[str, Any]) -> None:
    p = parse_only_invalid_argument(dump(doc))
    if p is not None:
        convert_and_validate(p)


_REFUSED = object()


def _read(text: str, loader: Any) -> Any:
    try:
        return yaml.load(text, Loader=loader)  # noqa: S506 - SafeLoaders
    except Exception:  # noqa: BLE001 - any refusal, compared below
        return _REFUSED


@FUZZ
@given(tokens=st.lists(st.sampled_from(YAML_TOKENS) | st.text(max_size=5), max_size=40))
@example(tokens=["name: on\ninstances: 0x10\nd: 2024-01-01\nn: ~\nm: <<"])
@example(tokens=["a: 'x'\r\nb: \"\\u00e9\"\u2028c"])
def test_libyaml_reads_every_text_as_the_pure_loader_does(tokens: list[str]) -> None:
    """parse_spec reads with libyaml and falls back to the pure loader when libyaml refuses; what libyaml accepts
    must be what the pure loader gives (plain scalars kept as text, the same nulls), or the fast path changes specs.
    Two differences are known, both where libyaml follows the YAML spec and the pure reader does not: a tab between
    the words of a plain scalar (`a\tb`, which the pure reader refuses) and a second byte-order mark at the start
    (the pure reader keeps it in the first key or value)."""
    if specfile._FastTextLoader is None:  # PyYAML without libyaml: parse_spec reads with the pure loader only
        assume(False)
    text = "".join(tokens)
    fast = _read(text, specfile._FastTextLoader)
    if fast is _REFUSED:
        return
    pure = _read(text, specfile._TextLoader)
    if pure is _REFUSED:
        assert "\t" in text or "\ufeff" in text, text
    elif not text.startswith("\ufeff\ufeff"):
        assert pure == fast


def test_a_text_libyaml_refuses_is_worded_by_the_pure_loader() -> None:
    """Positions in characters, not libyaml's bytes: the é before the NUL is one character."""
    try:
        parse_spec("name: é\n\x00", source="f.yaml")
    except InvalidArgument as e:
        assert e.message == ("f.yaml: not valid YAML: character #x0000 at position 9: special characters are not "
                             "allowed"), e.message
    else:
        raise AssertionError("accepted a NUL")
