"""Spec files (YAML in the JSON form of peloton.v1.JobSpec) and protobuf <-> domain conversions."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from peloton.api import convert
from peloton.api.specfile import parse_spec
from peloton.api.v1 import job_pb2
from peloton.domain.allocation import Entitlement, PoolUsage
from peloton.domain.launch import GangLaunch, LaunchOutcome, LaunchResult, LaunchSpec, TaskStatus
from peloton.domain.model import ResourcePool
from peloton.domain.placement import (
    GangPlacement,
    GangRequest,
    HostOffer,
    MemberAssignment,
    MemberRequest,
    PlacementFailure,
)
from peloton.domain.resources import Resources, format_mib, parse_mib
from peloton.domain.spec import Constraint, JobSpec, validate
from peloton.domain.states import TaskState
from peloton.errors import InvalidArgument

GOOD = """
name: train-resnet
owner: alice
respool: /research
instances: 4
gang:
  min_available: 2
  on_member_failure: fail_job
  launch_timeout: 90s
sla:
  priority: 7
  preemptible: true
  max_runtime: 3600s
task:
  command: python train.py --epochs 3
  env:
    EPOCHS: "3"
    MODE: fast
  resources:
    cpu: 2.5
    mem: 16Gi
    disk: 512Mi
    gpu: 1
    ports: 2
  container:
    image: pytorch:2.3
placement:
  strategy: spread
  constraints:
    - attribute: zone
      op: in
      value: a,b
    - attribute: gpu-model
      op: exists
retry:
  max_attempts: 5
"""


def test_parse_a_good_spec() -> None:
    p = parse_spec(GOOD)
    assert isinstance(p, job_pb2.JobSpec)
    assert (p.name, p.owner, p.respool, p.instances) == ("train-resnet", "alice", "/research", 4)
    assert p.gang.min_available == 2 and p.gang.on_member_failure == "fail_job"
    assert p.gang.launch_timeout.seconds == 90
    assert p.sla.priority == 7 and p.sla.preemptible and p.sla.max_runtime.seconds == 3600
    assert p.task.command.startswith("python train.py")
    assert dict(p.task.env) == {"EPOCHS": "3", "MODE": "fast"}
    r = p.task.resources
    assert (r.cpu, r.mem, r.disk, r.gpu, r.ports) == (2.5, "16Gi", "512Mi", 1, 2)
    assert p.task.container.image == "pytorch:2.3"
    assert p.placement.strategy == "spread"
    assert [(c.attribute, c.op, c.value) for c in p.placement.constraints] == [("zone", "in", "a,b"),
                                                                             ("gpu-model", "exists", "")]
    assert p.retry.max_attempts == 5


def test_the_example_spec_parses_and_validates() -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "hello-gang.yaml"
    spec = validate(convert.spec_from_proto(parse_spec(example.read_text())))
    assert spec.name == "hello-gang" and spec.instances == 4 and spec.launch_timeout_s == 60.0


def test_spec_from_proto_of_a_good_spec() -> None:
    s = validate(convert.spec_from_proto(parse_spec(GOOD)))
    assert s.resources == Resources(cpu=2.5, mem=16384, disk=512, gpu=1, ports=2)
    assert s.min_available == 2 and s.gang_size == 2
    assert s.launch_timeout_s == 90.0 and s.max_runtime_s == 3600.0
    assert s.max_attempts == 5 and s.priority == 7 and s.preemptible
    assert s.constraints == (Constraint("zone", "in", "a,b"), Constraint("gpu-model", "exists", ""))
    assert s.container_image == "pytorch:2.3"


def test_defaults_of_a_minimal_spec() -> None:
    s = convert.spec_from_proto(parse_spec("name: x\ninstances: 1\ntask: {command: 'true', resources: {cpu: 1}}\n"))
    assert s.respool == "/" and s.on_member_failure == "restart_gang" and s.strategy == "pack"
    assert s.launch_timeout_s == 300.0 and s.max_attempts == 3 and s.max_runtime_s == 0.0
    assert s.min_available == 0 and s.gang_size == 1
    assert s.resources == Resources(cpu=1)
    validate(s)


@pytest.mark.parametrize("yaml_mem,mib", [("1024", 1024.0), ("1.5", 1.5), ("0", 0.0), ("16Gi", 16384.0),
                                          ("'2048'", 2048.0)])
def test_mem_as_a_number_is_mib(yaml_mem: str, mib: float) -> None:
    p = parse_spec(f"task:\n  resources:\n    mem: {yaml_mem}\n    disk: {yaml_mem}\n", partial=True)
    assert isinstance(p.task.resources.mem, str)
    assert convert.spec_from_proto(p).resources.mem == mib
    assert convert.spec_from_proto(p).resources.disk == mib


@pytest.mark.parametrize("value,seconds", [
    ("300", 300.0), ("1.5", 1.5), ("'45s'", 45.0), ("2m", 120.0), ("1h30m", 5400.0), ("90s", 90.0), ("2d", 172800.0),
    ("500ms", 0.5), ("1.5h", 5400.0), ("1d12h", 129600.0), ("0.000000001s", 1e-9), ("!!int 7", 7.0),
    ("5 minutes", None), ("1h30", None), ("5M", None), ("true", None), ("[1]", None), ("0.0000000001s", None),
])
def test_durations_read_the_units_people_write(value: str, seconds: float | None) -> None:
    text = f"gang:\n  launch_timeout: {value}\nsla:\n  max_runtime: {value}\n"
    if seconds is None:
        with pytest.raises(InvalidArgument) as ei:
            parse_spec(text, source="s.yaml", partial=True)
        assert ei.value.message.startswith("s.yaml: gang.launch_timeout: "), ei.value.message
        assert "Duration" not in ei.value.message  # not the protobuf library's words
        return
    p = parse_spec(text, partial=True)
    assert p.gang.launch_timeout.ToNanoseconds() == round(seconds * 1e9)
    s = convert.spec_from_proto(p)
    assert s.launch_timeout_s == seconds and s.max_runtime_s == seconds


def test_a_negative_duration_reaches_the_validator_which_names_it() -> None:
    p = parse_spec("name: x\ninstances: 1\ntask: {command: 'true', resources: {cpu: 1}}\n"
                   "sla: {preemption_grace: -5s}\n")
    with pytest.raises(InvalidArgument, match="^sla.preemption_grace: must not be negative"):
        validate(convert.spec_from_proto(p))


@pytest.mark.parametrize("text,message", [
    ('instances: "four"', "instances: expected a whole number, got 'four'"),
    ("instances: 1.5", "instances: expected a whole number, got '1.5'"),
    ("instances: [1]", "instances: expected a whole number, got a list"),
    ("instances: 99999999999", "instances: out of range: at most 2147483647"),
    ("instances: " + "9" * 5000, "instances: expected a whole number, got '999"),
    ("sla: {priority: high}", "sla.priority: expected a whole number, got 'high'"),
    ("sla: {preemptible: maybe}", "sla.preemptible: expected true or false, got 'maybe'"),
    ("sla: {preemptible: [true]}", "sla.preemptible: expected true or false, got a list"),
    ("task: {resources: {cpu: lots}}", "task.resources.cpu: expected a number, got 'lots'"),
    ("task: {resources: {cpu: .nan}}", "task.resources.cpu: expected a number, got '.nan'"),
    ("task: {resources: {gpu: 1.5}}", "task.resources.gpu: expected a whole number, got '1.5'"),
    ("task: {resources: {mem: [1]}}", "task.resources.mem: expected text, got a list"),
    ("task: {command: [a, b]}", "task.command: expected text, got a list"),
    ("task: {command: !!int 5}", "task.command: expected text, got 5"),
    ("name: !!binary aGk=", "name: expected text, got binary data"),
    ("task: {env: [a, b]}", "task.env: expected a mapping of NAME: value, got a list"),
    ("task: {env_files: {TOKEN: [a]}}", "task.env_files.TOKEN: expected text, got a list"),
    ("task: 5", "task: expected a mapping of fields (name: value), got '5'"),
    ("placement: {constraints: {a: b}}", "placement.constraints: expected a list, got a mapping"),
    ("placement: {constraints: [a]}", "placement.constraints[0]: expected a mapping of fields (name: value), got 'a'"),
    ("placement: {constraints: [~]}", "placement.constraints[0]: expected a value, got nothing (null)"),
    ("retry: {max_attempts: x}", "retry.max_attempts: expected a whole number, got 'x'"),
    ("gang: {launch_timeout: 5 minutes}", "gang.launch_timeout: expected a duration like 90s, 5m, 1h30m or 2d, got "
                                          "'5 minutes'"),
    ("gang: {min_available: 1, minAvailable: 2}", "gang.min_available: given twice (as min_available and "
                                                  "minAvailable)"),
])
def test_a_wrong_type_is_said_in_plain_words_naming_the_field(text: str, message: str) -> None:
    with pytest.raises(InvalidArgument) as ei:
        parse_spec(text, source="s.yaml", partial=True)
    assert ei.value.message.startswith(f"s.yaml: {message}"), ei.value.message
    assert ei.value.field == message.split(":")[0]
    for words in ("invalid literal", "Couldn't parse", "bytes-like", "Failed to parse", "not iterable"):
        assert words not in ei.value.message


@pytest.mark.parametrize("text,message", [
    ("name: x\n", "instances: required (how many members, 1 to 100000); also missing: task.command, "
                   "task.resources.cpu"),
    ("name:\ninstances: 2\ntask: {command: 'true', resources: {cpu: 1}}\n", "name: required (the job's name)"),
    ("name: x\ninstances: 2\ntask: {resources: {cpu: 1}}\n", "task.command: required (what each member runs"),
    ("name: x\ninstances: 2\ntask: {command: 'true'}\n", "task.resources.cpu: required (cores per member"),
    ("instances: ~\n", "name: required (the job's name); also missing: instances, task.command"),
])
def test_a_missing_required_field_says_required(text: str, message: str) -> None:
    with pytest.raises(InvalidArgument) as ei:
        parse_spec(text, source="s.yaml")
    assert ei.value.message.startswith(f"s.yaml: {message}"), ei.value.message
    assert ei.value.field == message.split(":")[0]


def test_validation_says_required_for_an_empty_name_or_command_and_blank_for_spaces() -> None:
    base = convert.spec_from_proto(parse_spec("name: x\ninstances: 1\ntask: {command: 'true', resources: {cpu: 1}}\n"))
    for spec, message in ((dataclasses.replace(base, name=""), "name: required"),
                          (dataclasses.replace(base, name="  "), "name: must not be blank"),
                          (dataclasses.replace(base, command=""), "task.command: required"),
                          (dataclasses.replace(base, command=" "), "task.command: must not be blank")):
        with pytest.raises(InvalidArgument) as ei:
            validate(spec)
        assert ei.value.message.startswith(message), ei.value.message


@pytest.mark.parametrize("value", ["on", "off", "yes", "no", "true", "null-ish", "2024-01-01", "0x10", "1e3", "~x"])
def test_plain_scalars_are_text_as_written_so_a_job_may_be_named_on(value: str) -> None:
    p = parse_spec(f"name: {value}\ninstances: 1\ntask:\n  command: 'true'\n  resources: {{cpu: 1}}\n"
                   f"  env: {{V: {value}}}\n")
    assert p.name == value and p.task.env["V"] == value


@pytest.mark.parametrize("value,expected", [("true", True), ("yes", True), ("On", True), ("false", False),
                                            ("no", False), ("OFF", False), ("'true'", True)])
def test_booleans_read_yaml_spellings(value: str, expected: bool) -> None:
    p = parse_spec(f"sla: {{preemptible: {value}}}\n", partial=True)
    assert p.sla.HasField("preemptible") and p.sla.preemptible is expected


def test_protobuf_json_names_are_accepted() -> None:
    p = parse_spec("gang: {minAvailable: 2, launchTimeout: 5m, onMemberFailure: fail_job}\n", partial=True)
    assert (p.gang.min_available, p.gang.launch_timeout.seconds, p.gang.on_member_failure) == (2, 300, "fail_job")


def test_env_values_become_strings() -> None:
    p = parse_spec("task:\n  env:\n    EPOCHS: 3\n    RATE: 0.5\n", partial=True)
    assert dict(p.task.env) == {"EPOCHS": "3", "RATE": "0.5"}


def test_env_booleans_keep_their_yaml_spelling() -> None:
    p = parse_spec("task:\n  env:\n    DEBUG: true\n    QUIET: false\n    EMPTY:\n", partial=True)
    assert dict(p.task.env) == {"DEBUG": "true", "QUIET": "false", "EMPTY": ""}


@pytest.mark.parametrize("text,path", [
    ("name: x\ncolour: red\n", "colour"),
    ("task:\n  colour: red\n", "task.colour"),
    ("task:\n  resources:\n    cpux: 1\n", "task.resources.cpux"),
    ("gang:\n  min_avail: 1\n", "gang.min_avail"),
    ("sla:\n  prio: 1\n", "sla.prio"),
    ("placement:\n  constraints:\n    - attribute: zone\n      colour: x\n", "placement.constraints[0].colour"),
    ("retry:\n  attempts: 2\n", "retry.attempts"),
])
def test_unknown_fields_give_one_line_naming_the_field_path(text: str, path: str) -> None:
    with pytest.raises(InvalidArgument) as ei:
        parse_spec(text, source="job.yaml")
    msg = ei.value.message
    assert "\n" not in msg
    assert msg.startswith(f"job.yaml: {path}: unknown field"), msg
    assert "known here:" in msg



def test_unknown_field_hint_uses_spec_file_names() -> None:
    with pytest.raises(InvalidArgument) as ei:
        parse_spec("gang:\n  min_avail: 1\n")
    assert "min_available" in ei.value.message and "launch_timeout" in ei.value.message


@pytest.mark.parametrize("text,needle", [
    ("name: [x\n", "not valid YAML at line"),
    ("a: b: c\n", "not valid YAML"),
    ("name: x\n\tinstances: 2\n", "not valid YAML"),
    ("- a\n- b\n", "expected a mapping at the top level"),
    ("", "expected a mapping at the top level"),
    ("just text\n", "expected a mapping at the top level"),
    ("instances: abc\n", "instances"),
    ("task:\n  resources:\n    cpu: lots\n", "cpu"),
    ("task:\n  resources:\n    gpu: 1.5\n", "gpu"),
    ("gang:\n  launch_timeout: soon\n", "launch_timeout"),
])
def test_bad_input_gives_one_line(text: str, needle: str) -> None:
    with pytest.raises(InvalidArgument) as ei:
        parse_spec(text, source="s.yaml")
    msg = ei.value.message
    assert "\n" not in msg and msg.startswith("s.yaml: ")
    assert needle in msg, msg


# --- round trips --------------------------------------------------------------------------------------------
def _semantic(s: JobSpec) -> JobSpec:
    """What a spec means: min_available 0 is "all instances"; durations to the microsecond."""
    return dataclasses.replace(s, min_available=s.gang_size, launch_timeout_s=round(s.launch_timeout_s, 6),
                               max_runtime_s=round(s.max_runtime_s, 6))


def test_parse_convert_round_trip_of_the_good_spec() -> None:
    s = convert.spec_from_proto(parse_spec(GOOD))
    p = convert.spec_to_proto(s)
    assert _semantic(convert.spec_from_proto(p)) == _semantic(s)
    # and the proto survives its JSON form (what `peloton job get -o json` prints and `create` reads back)
    from google.protobuf import json_format
    again = parse_spec(json_format.MessageToJson(p, preserving_proto_field_name=True))
    assert again == p


names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), min_size=1, max_size=20)
idents = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,10}", fullmatch=True)
specs = st.builds(
    JobSpec,
    name=names, instances=st.integers(1, 1000), command=names,
    resources=st.builds(Resources, cpu=st.floats(0.01, 512), mem=st.integers(0, 10**7).map(float),
                        disk=st.integers(0, 10**4).map(lambda n: n / 4), gpu=st.integers(0, 16),
                        ports=st.integers(0, 64)),
    owner=names, respool=st.sampled_from(["/", "/a", "/a/b-c"]),
    env=st.dictionaries(idents, names, max_size=3), container_image=st.sampled_from(["", "img:1"]),
    min_available=st.integers(0, 1), on_member_failure=st.sampled_from(["restart_gang", "fail_job"]),
    launch_timeout_s=st.floats(0.001, 10**6), priority=st.integers(-100, 100), preemptible=st.booleans(),
    max_runtime_s=st.one_of(st.just(0.0), st.floats(0.001, 10**6)), max_attempts=st.integers(1, 10),
    strategy=st.sampled_from(["pack", "spread"]),
    constraints=st.lists(st.builds(Constraint, idents, st.sampled_from(["eq", "ne", "exists", "in"]), names),
                         max_size=3).map(tuple),
)


@settings(max_examples=60, deadline=None)
@given(spec=specs)
def test_spec_proto_round_trip(spec: JobSpec) -> None:
    back = convert.spec_from_proto(convert.spec_to_proto(spec))
    sem_a, sem_b = _semantic(spec), _semantic(back)
    assert dataclasses.replace(sem_b, launch_timeout_s=0, max_runtime_s=0) == \
        dataclasses.replace(sem_a, launch_timeout_s=0, max_runtime_s=0)
    assert math.isclose(back.launch_timeout_s, spec.launch_timeout_s, rel_tol=1e-9, abs_tol=1e-6)
    assert math.isclose(back.max_runtime_s, spec.max_runtime_s, rel_tol=1e-9, abs_tol=1e-6)


@settings(max_examples=200, deadline=None)
@given(mib=st.integers(0, 10**9).map(float) | st.integers(0, 7999).map(lambda n: n / 8))  # below 1000: within 6 digits
def test_quantities_round_trip_through_their_text(mib: float) -> None:
    assert parse_mib(format_mib(mib), "mem") == mib



@pytest.mark.parametrize("text", ["1.1Ti", "0.01Ki", "1000000.5", "1000.125", "3.14159265Gi"])
def test_non_integral_quantities_round_trip_through_their_text(text: str) -> None:
    mib = parse_mib(text, "task.resources.disk")
    assert parse_mib(format_mib(mib), "task.resources.disk") == mib


def test_resources_proto_round_trip_and_field_names_in_errors() -> None:
    r = Resources(cpu=1.5, mem=3072, disk=100, gpu=2, ports=3)
    assert convert.resources_from_proto(convert.resources_to_proto(r), "x") == r
    with pytest.raises(InvalidArgument) as ei:
        convert.resources_from_proto(job_pb2.Resources(cpu=1, mem="12Zi"), "task.resources")
    assert ei.value.field == "task.resources.mem"


def test_pool_round_trip() -> None:
    p = ResourcePool("/team", reservation=Resources(cpu=2, mem=1024), limit=Resources(gpu=4), share=2.0,
                     submitters=("alice",), allow_root=True, reservation_type="static")
    usage = PoolUsage(Resources(cpu=1), Resources(gpu=2), Entitlement(cpu=3.5, mem=100.25, gpu=1.5), 4)
    shown = convert.pool_to_proto(p, usage)
    assert convert.pool_from_proto(shown) == p  # the output-only fields are not read back
    assert (shown.allocated.cpu, shown.demand.gpu, shown.queued_gangs) == (1, 2, 4)
    assert (shown.entitlement.cpu, shown.entitlement.mem_mib, shown.entitlement.gpu) == (3.5, 100.25, 1.5)
    nolimit = ResourcePool("/x")
    assert convert.pool_from_proto(convert.pool_to_proto(nolimit)).limit is None


# --- internal messages --------------------------------------------------------------------------------------
ints = st.integers(0, 2**31 - 1)
small = st.integers(0, 1000)
res = st.builds(Resources, cpu=st.floats(0, 1e6), mem=st.floats(0, 1e9), disk=st.floats(0, 1e9),
                gpu=st.integers(0, 64), ports=st.integers(0, 64))
cons = st.builds(Constraint, names, st.sampled_from(["eq", "ne", "exists", "in"]), names)
int_tuples = st.lists(st.integers(0, 65535), max_size=6).map(tuple)

gang_requests = st.builds(
    GangRequest, gang_id=names, job_id=names, attempt=ints,
    members=st.lists(st.builds(MemberRequest, small, names, res), max_size=4).map(tuple),
    priority=st.integers(-(2**31), 2**31 - 1), respool=names, strategy=names,
    constraints=st.lists(cons, max_size=3).map(tuple), enqueued_at=st.floats(0, 2e9),
)
assignments = st.builds(MemberAssignment, small, names, names, names, res, int_tuples, int_tuples)
placements = st.builds(GangPlacement, names, names, ints, st.lists(assignments, max_size=4).map(tuple))
failures = st.builds(PlacementFailure, names, names, ints, names, st.dictionaries(names, ints, max_size=3))
offers = st.builds(HostOffer, names, names, res, int_tuples, int_tuples, st.dictionaries(names, names, max_size=3),
                   res, st.booleans())
launches = st.builds(LaunchSpec, names, names, small, ints, names, names, st.dictionaries(names, names, max_size=3),
                     res, int_tuples, int_tuples, st.dictionaries(names, names, max_size=2))
statuses = st.builds(TaskStatus, names, st.sampled_from(list(TaskState)), st.floats(0, 2e9), names,
                     st.one_of(st.none(), st.integers(-(2**31), 2**31 - 1)), names, names, st.just(""), st.booleans())


@settings(max_examples=60, deadline=None)
@given(g=gang_requests, p=placements, f=failures, o=offers, ls=launches, s=statuses)
def test_internal_conversions_round_trip(g: GangRequest, p: GangPlacement, f: PlacementFailure, o: HostOffer,
                                         ls: LaunchSpec, s: TaskStatus) -> None:
    assert convert.gang_request_from_proto(convert.gang_request_to_proto(g)) == g
    assert convert.placement_from_proto(convert.placement_to_proto(p)) == p
    assert convert.failure_from_proto(convert.failure_to_proto(f)) == f
    assert convert.offer_from_proto(convert.offer_to_proto(o)) == o
    assert convert.launch_from_proto(convert.launch_to_proto(ls)) == ls
    assert convert.status_from_proto(convert.status_to_proto(s, seq=7)) == s
    assert convert.status_to_proto(s, seq=7).seq == 7
    gl = GangLaunch(p.gang_id, p.attempt, (ls,))
    assert convert.gang_launch_from_proto(convert.gang_launch_to_proto(gl)) == gl
    for outcome in LaunchOutcome:
        r = LaunchResult(g.gang_id, g.attempt, outcome, ls.task_id, s.message, bool(g.attempt % 2))
        assert convert.launch_result_from_proto(convert.launch_result_to_proto(r)) == r


def test_status_exit_code_zero_is_kept_and_none_stays_none() -> None:
    zero = TaskStatus("j-0-1", TaskState.SUCCEEDED, 1.0, exit_code=0)
    assert convert.status_from_proto(convert.status_to_proto(zero)).exit_code == 0
    none = TaskStatus("j-0-1", TaskState.KILLED, 1.0)
    assert convert.status_from_proto(convert.status_to_proto(none)).exit_code is None


def test_status_ack_token_does_not_travel() -> None:
    s = TaskStatus("j-0-1", TaskState.RUNNING, 1.0, ack="agent/uuid")
    assert convert.status_from_proto(convert.status_to_proto(s)).ack == ""
