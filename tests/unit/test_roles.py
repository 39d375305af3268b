"""Roles in a gang: a spec file with roles read, converted and validated (each error naming its field), the domain
helpers every caller uses for a member's task, the members' role variables (TF_CONFIG exact), the hostfile rule, the
gang request and launch of a mixed gang, a mixed gang placed whole, and what the API and the CLI show."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
import yaml

from peloton.api import convert
from peloton.api.specfile import parse_spec
from peloton.cli import render
from peloton.domain import limits as L
from peloton.domain.model import Task
from peloton.domain.placement import GangPlacement, GangRequest, HostOffer, MemberAssignment, MemberRequest
from peloton.domain.resources import Resources
from peloton.domain.spec import IMPLICIT_ROLE, JobSpec, Role, ignored_settings, spec_from_dict, spec_to_dict, validate
from peloton.errors import InvalidArgument
from peloton.jobmgr import gang_policy as policy
from peloton.jobmgr.launcher import Launcher
from peloton.jobmgr.manager import gang_request
from peloton.jobmgr.training_env import hostfile, hostfile_members, training_env
from peloton.placement.placer import can_ever_fit, place

TF_PS = """
name: tf-ps
roles:
  - name: ps
    instances: 2
    task: {command: "python train.py --ps", resources: {cpu: 4, mem: 8Gi, ports: 1}}
  - name: worker
    instances: 3
    task: {command: "python train.py", resources: {cpu: 2, gpu: 1, ports: 1}, env: {X: "1"}}
"""

PS = Role("ps", 2, "python train.py --ps", Resources(cpu=4, mem=8192, ports=1))
WORKER = Role("worker", 3, "python train.py", Resources(cpu=2, gpu=1, ports=1), env={"X": "1"})
SPEC = JobSpec(name="tf-ps", instances=5, command="", resources=Resources(), roles=(PS, WORKER))


def read(text: str) -> JobSpec:
    """What `job create -f` and CreateJob do with a spec file."""
    return validate(convert.spec_from_proto(parse_spec(text, "spec.yaml")))


def refused(text: str, field: str) -> str:
    with pytest.raises(InvalidArgument) as ei:
        read(text)
    err = ei.value
    assert err.field == field, err.message
    assert err.message.startswith((f"{field}: ", f"spec.yaml: {field}: ")), err.message
    return err.message


# --- the spec file, conversion, validation ------------------------------------------------------------------------
def test_a_spec_with_roles_reads_as_its_roles_in_order() -> None:
    s = read(TF_PS)
    assert s == SPEC
    assert s.instances == 5 and s.gang_size == 5 and s.command == "" and s.resources == Resources()
    assert [s.role_at(i) for i in range(5)] == [(PS, 0), (PS, 1), (WORKER, 0), (WORKER, 1), (WORKER, 2)]
    assert s.gang_total() == Resources(cpu=14, mem=16384, gpu=3, ports=5)


def test_a_single_task_spec_has_no_roles_and_one_implicit_role_for_callers() -> None:
    s = read("name: a\ninstances: 3\ntask: {command: x, resources: {cpu: 1, gpu: 1}}\n")
    assert s.roles == ()
    (r,) = s.all_roles()
    assert (r.name, r.instances, r.command, r.resources) == (IMPLICIT_ROLE, 3, "x", s.resources)
    assert s.role_at(2) == (r, 2)
    assert s.member_resources(1) is s.resources and s.member_command(1) == "x" and s.member_env(1) is s.env
    with pytest.raises(IndexError):
        s.role_at(3)


def test_members_of_a_role_share_one_resources_object() -> None:
    """The placer's fast path for equal members compares resources by identity first."""
    assert SPEC.member_resources(2) is SPEC.member_resources(4) is WORKER.resources
    assert SPEC.member_command(1) == PS.command and SPEC.member_env(3) == {"X": "1"} and SPEC.member_env(0) == {}


ROLE2 = "  - name: b\n    instances: 1\n    task: {command: y, resources: {cpu: 1}}\n"


def roles_spec(first: str = "task: {command: x, resources: {cpu: 1}}", *, top: str = "", more: str = ROLE2) -> str:
    return f"name: j\n{top}roles:\n  - name: a\n    instances: 2\n    {first}\n{more}"


@pytest.mark.parametrize("text,field,words", [
    (roles_spec(top="task: {command: x, resources: {cpu: 1}}\n"), "roles",
     "give either roles or instances and task, not both"),
    (roles_spec(top="instances: 4\n"), "instances", "the roles' together (3), got 4"),
    ("name: j\nroles: []\n", "instances", "required"),
    (roles_spec("task: {command: x, cpu: 1}"), "roles[0].task.cpu", "unknown field"),
    (roles_spec("task: {command: x}"), "roles[0].task.resources.cpu", "required"),
    (roles_spec(more="  - {instances: 1, task: {command: y, resources: {cpu: 1}}}\n"), "roles[1].name", "required"),
    (roles_spec(more=ROLE2.replace("name: b", "name: a")), "roles[1].name", "also the name of roles[0]"),
    (roles_spec(more=ROLE2.replace("name: b", "name: Worker")), "roles[1].name", "is not a role name"),
    (roles_spec(more=ROLE2.replace("name: b", "name: 1ps")), "roles[1].name", "is not a role name"),
    (roles_spec(more=ROLE2.replace("name: b", "name: ps_1")), "roles[1].name", "is not a role name"),
    (roles_spec(more=ROLE2.replace("name: b", f"name: {'a' * 64}")), "roles[1].name", "longer than 63"),
    (roles_spec(more=ROLE2.replace("instances: 1", "instances: 0")), "roles[1].instances", "at least 1"),
    (roles_spec(more=ROLE2.replace("command: y", "command: ' '")), "roles[1].task.command", "blank"),
    (roles_spec(more=ROLE2.replace("cpu: 1", "cpu: 0")), "roles[1].task.resources.cpu", "at least 0.001"),
    (roles_spec(more=ROLE2.replace("cpu: 1", "cpu: 1, gpu: 257")), "roles[1].task.resources.gpu", "at most 256"),
    (roles_spec(more=ROLE2.replace("cpu: 1}", "cpu: 1}, env: {1X: v}")), "roles[1].task.env.1X",
     "not a valid environment variable name"),
    (roles_spec(more=ROLE2.replace("cpu: 1}", "cpu: 1}, env: {X: [1]}")), "roles[1].task.env.X",
     "must be a string, number or boolean"),
    (roles_spec(more=ROLE2.replace("cpu: 1}", "cpu: 1}, env_files: {K: rel}")), "roles[1].task.env_files.K",
     "not an absolute path"),
    (roles_spec(more=ROLE2.replace("cpu: 1}", "cpu: 1}, user: bob")), "roles[1].task.user",
     "every role must run as the same user"),
    (roles_spec("task: {command: x, resources: {cpu: 1}, user: 9x}",
                more=ROLE2.replace("cpu: 1}", "cpu: 1}, user: 9x")), "roles[0].task.user", "is not a user name"),
    (roles_spec(top="gang: {min_available: 2}\n"), "gang.min_available", "one gang of all their members (3)"),
    (roles_spec(more=ROLE2.replace("instances: 1", f"instances: {L.MAX_GANG_SIZE - 1}")), "roles",
     f"more than {L.MAX_GANG_SIZE}, the most one gang may have"),
    ("name: j\nroles:\n" + "".join(f"  - {{name: r{i}, instances: 1, task: {{command: x, resources: {{cpu: 1}}}}}}\n"
                                   for i in range(L.MAX_ROLES + 1)), "roles", f"at most {L.MAX_ROLES} roles"),
])
def test_each_error_names_its_field(text: str, field: str, words: str) -> None:
    assert words in refused(text, field)


def test_a_gang_size_of_every_member_or_the_sum_as_instances_is_accepted() -> None:
    """What `job get -o json` writes back: `instances` and `gang.min_available` as the roles' sum."""
    assert read(roles_spec(top="instances: 3\ngang: {min_available: 3}\n")).instances == 3
    assert read(roles_spec(more=ROLE2.replace("instances: 1", f"instances: {L.MAX_GANG_SIZE - 2}"))).gang_size == \
        L.MAX_GANG_SIZE


def test_the_roles_together_stay_under_the_spec_size_limit() -> None:
    """Each role within one task's limits, and all of them within MAX_ROLES_TASK_BYTES: the largest valid spec
    still serializes under MAX_SPEC_BYTES (16 roles at one task's limits each would be 4 MiB)."""
    big_env = {f"V{i:03d}": "v" * (60 * 1024) for i in range(3)}
    role = Role("r", 1, "c" * L.MAX_COMMAND_BYTES, Resources(cpu=1), env=big_env)
    roles = tuple(dataclasses.replace(role, name=f"r{i}") for i in range(2))
    fits = dataclasses.replace(SPEC, instances=2, roles=roles)
    validate(fits)
    too_big = dataclasses.replace(SPEC, instances=3, roles=(*roles, dataclasses.replace(role, name="r2")))
    with pytest.raises(InvalidArgument) as ei:
        validate(too_big)
    assert ei.value.field == "roles" and f"more than {L.MAX_ROLES_TASK_BYTES}" in ei.value.message
    widest = tuple(Role(f"r{i}", 1, "c" * 30_000, Resources(cpu=1), container_image="\U0001f600" * 1024,
                        env_files={f"F{j}": "/" + "\U0001f600" * 1023 for j in range(L.MAX_ENV_FILES)})
                   for i in range(L.MAX_ROLES))
    with pytest.raises(InvalidArgument, match="^roles: "):
        validate(dataclasses.replace(SPEC, instances=L.MAX_ROLES, roles=widest))
    assert L.MAX_ROLES_TASK_BYTES + 400 * 1024 < L.MAX_SPEC_BYTES  # the rest of a spec (constraints) is < 400 KiB


def test_a_domain_spec_with_roles_and_a_top_level_task_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="^roles: give either roles or instances and task, not both"):
        validate(dataclasses.replace(SPEC, command="x"))
    with pytest.raises(InvalidArgument, match="^roles: give either"):
        validate(dataclasses.replace(SPEC, resources=Resources(cpu=1)))


def test_convert_round_trip_and_the_json_form_reads_back_as_the_same_spec() -> None:
    s = dataclasses.replace(SPEC, user="ml", owner="alice",
                            roles=(dataclasses.replace(PS, container_image="tf:2", env_files={"K": "/k"}), WORKER))
    p = convert.spec_to_proto(s)
    assert not p.HasField("task") and p.instances == 5 and [r.task.user for r in p.roles] == ["ml", "ml"]
    back = validate(convert.spec_from_proto(p))
    assert back == dataclasses.replace(s, min_available=5)  # written as the effective gang size
    # `job get -o json` -> a spec file -> the same spec (docs/cli.md: `job create -f` takes it back)
    text = yaml.safe_dump(render.to_dict(p))
    assert validate(convert.spec_from_proto(parse_spec(text))) == back


def test_the_store_form_keeps_roles_and_reads_a_single_task_spec_as_before() -> None:
    d = spec_to_dict(SPEC)
    assert spec_from_dict(json.loads(json.dumps(d))) == SPEC
    single = JobSpec(name="a", instances=2, command="x", resources=Resources(cpu=1))
    assert "roles" not in spec_to_dict(single)  # stored as before roles existed
    assert spec_from_dict(spec_to_dict(single)) == single


def test_an_image_is_warned_about_per_role() -> None:
    s = dataclasses.replace(SPEC, roles=(PS, dataclasses.replace(WORKER, container_image="tf:2")))
    assert ignored_settings(s, "local") == [
        "roles[1].task.container.image: ignored by the local backend, which runs each task as a process on its host, "
        "in no container (only the mesos backend runs a task in an image)"]
    assert ignored_settings(s, "mesos") == []


# --- the members' environment ------------------------------------------------------------------------------------
def member(instance: int, address: str, ports: tuple[int, ...] = (), host: str = "") -> MemberAssignment:
    return MemberAssignment(instance, f"j-{instance}-1", host or address, address, SPEC.member_resources(instance),
                            ports=ports)


MEMBERS = [member(4, "10.0.0.3", (7002,)), member(0, "10.0.0.1", (5000, 5001)), member(2, "10.0.0.2", (7000,)),
           member(1, "10.0.0.1", (5002,)), member(3, "10.0.0.2", (7001,))]


def test_every_member_learns_its_role_its_rank_in_it_and_every_roles_endpoints() -> None:
    env = training_env("j", 1, MEMBERS, SPEC.roles)
    cluster = {"ps": ["10.0.0.1:5000", "10.0.0.1:5002"],
               "worker": ["10.0.0.2:7000", "10.0.0.2:7001", "10.0.0.3:7002"]}
    for i, (role, rank, size) in enumerate([("ps", 0, 2), ("ps", 1, 2), ("worker", 0, 3), ("worker", 1, 3),
                                            ("worker", 2, 3)]):
        e = env[i]
        assert (e["PELOTON_ROLE"], e["PELOTON_ROLE_RANK"], e["PELOTON_ROLE_SIZE"]) == (role, str(rank), str(size))
        assert e["PELOTON_ROLES"] == "ps,worker"
        assert e["PELOTON_ROLE_HOSTS_PS"] == "10.0.0.1:5000,10.0.0.1:5002"
        assert e["PELOTON_ROLE_HOSTS_WORKER"] == "10.0.0.2:7000,10.0.0.2:7001,10.0.0.3:7002"
        assert json.loads(e["TF_CONFIG"]) == {"cluster": cluster, "task": {"type": role, "index": rank}}
        # the gang-wide variables stay global
        assert (e["RANK"], e["WORLD_SIZE"], e["MASTER_ADDR"], e["MASTER_PORT"]) == (str(i), "5", "10.0.0.1", "5000")
    assert env[3]["TF_CONFIG"] == ('{"cluster":{"ps":["10.0.0.1:5000","10.0.0.1:5002"],"worker":["10.0.0.2:7000",'
                                   '"10.0.0.2:7001","10.0.0.3:7002"]},"task":{"type":"worker","index":1}}')


def test_a_role_without_ports_is_addressed_by_its_address_and_dashes_become_underscores() -> None:
    roles = (Role("param-server", 1, "x", Resources(cpu=1)), Role("w", 1, "x", Resources(cpu=1, ports=1)))
    env = training_env("j", 1, [member(0, "10.0.0.1"), member(1, "10.0.0.2", (9000,))], roles)
    assert env[1]["PELOTON_ROLE_HOSTS_PARAM_SERVER"] == "10.0.0.1"
    assert json.loads(env[1]["TF_CONFIG"])["cluster"] == {"param-server": ["10.0.0.1"], "w": ["10.0.0.2:9000"]}


def test_a_single_task_job_gets_no_role_variables() -> None:
    env = training_env("j", 1, MEMBERS)
    assert not any(k.startswith("PELOTON_ROLE") or k == "TF_CONFIG" for e in env.values() for k in e)


def test_the_hostfile_lists_the_workers_else_the_gpu_roles_else_everyone() -> None:
    assert hostfile(hostfile_members(MEMBERS, SPEC.roles)) == "10.0.0.2 slots=2\n10.0.0.3 slots=1\n"
    renamed = (PS, dataclasses.replace(WORKER, name="trainer"))
    assert [m.instance for m in hostfile_members(MEMBERS, renamed)] == [2, 3, 4]  # the GPU role
    cpu_only = (PS, dataclasses.replace(WORKER, name="trainer", resources=Resources(cpu=2)))
    assert [m.instance for m in hostfile_members(MEMBERS, cpu_only)] == [0, 1, 2, 3, 4]
    assert [m.instance for m in hostfile_members(MEMBERS, ())] == [0, 1, 2, 3, 4]


# --- gang request, launch ----------------------------------------------------------------------------------------
def test_the_gang_asks_for_each_members_role_resources_and_launches_its_role_task() -> None:
    spec = dataclasses.replace(SPEC, roles=(dataclasses.replace(PS, env_files={"TOKEN": "/etc/token"},
                                                                container_image="tf:ps"), WORKER))
    job, gangs, tasks = policy.new_job_records("j", spec, 1.0)
    assert len(gangs) == 1 and gangs[0].instances == [0, 1, 2, 3, 4]
    jv = policy.new_job_view(job, gangs, tasks)
    req = gang_request(jv, 0)
    assert [m.resources for m in req.members] == [PS.resources] * 2 + [WORKER.resources] * 3
    assert req.total == spec.gang_total()
    p = GangPlacement("j/0", "j", 1, tuple(dataclasses.replace(m, task_id=f"j-{m.instance}-1") for m in MEMBERS))
    launched = {t.instance: t for t in Launcher._gang_launch(p, spec).tasks}
    ps, worker = launched[1], launched[3]
    assert ps.command.endswith("\npython train.py --ps") and "TOKEN=" in ps.command
    assert worker.command == "python train.py" and worker.env["X"] == "1" and "X" not in ps.env
    assert (ps.container_image, worker.container_image) == ("tf:ps", "")
    assert (ps.resources, worker.resources) == (PS.resources, WORKER.resources)
    assert ps.env["PELOTON_ROLE"] == "ps" and worker.env["PELOTON_ROLE_RANK"] == "1"
    assert ps.files["hostfile"] == worker.files["hostfile"] == "10.0.0.2 slots=2\n10.0.0.3 slots=1\n"


# --- placement of a mixed gang -----------------------------------------------------------------------------------
def gpu_host(name: str, cpu: float = 8, gpus: int = 4) -> HostOffer:
    free = Resources(cpu, 64 * 1024, 0, gpus, 10)
    return HostOffer(name, f"addr-{name}", free, capacity=free, has_gpus=gpus > 0)


def mixed_gang(spec: JobSpec) -> GangRequest:
    return GangRequest("j/0", "j", 1, tuple(MemberRequest(i, f"t{i}", spec.member_resources(i))
                                            for i in range(spec.instances)))


def test_a_mixed_gang_is_placed_whole_gpu_members_first_on_a_cluster_of_gpu_hosts() -> None:
    """2 parameter servers of 4 cores and 8 one-GPU workers of 1 core fill two 8-core, 4-GPU hosts exactly. Tried
    in instance order the servers would take one host's cores and leave its GPUs unusable; GPU members first,
    every member fits."""
    spec = dataclasses.replace(SPEC, instances=10, roles=(
        Role("ps", 2, "x", Resources(cpu=4)), Role("worker", 8, "x", Resources(cpu=1, gpu=1))))
    hosts = [gpu_host("a"), gpu_host("b")]
    assert can_ever_fit(mixed_gang(spec), hosts) is None
    (p,), failures = place([mixed_gang(spec)], hosts)
    assert failures == []
    assert [m.instance for m in p.members] == list(range(10))  # in the gang's order, whatever order they were tried
    assert [m.resources for m in p.members] == [spec.member_resources(i) for i in range(10)]
    on = {h: [m.instance for m in p.members if m.hostname == h] for h in ("a", "b")}
    assert sorted(len(v) for v in on.values()) == [5, 5]  # 4 workers and one server a host


def test_cpu_only_roles_keep_to_hosts_without_gpus() -> None:
    spec = dataclasses.replace(SPEC, instances=6, roles=(
        Role("ps", 2, "x", Resources(cpu=2)), Role("worker", 4, "x", Resources(cpu=1, gpu=1))))
    (p,), _ = place([mixed_gang(spec)], [gpu_host("g", gpus=4), gpu_host("c", gpus=0)])
    assert {m.instance: m.hostname for m in p.members} == {0: "c", 1: "c", 2: "g", 3: "g", 4: "g", 5: "g"}


def test_a_mixed_gang_that_cannot_fit_names_the_member_and_takes_nothing() -> None:
    spec = dataclasses.replace(SPEC, instances=3, roles=(
        Role("ps", 1, "x", Resources(cpu=1)), Role("worker", 2, "x", Resources(cpu=1, gpu=1))))
    hosts = [gpu_host("a", gpus=1)]
    placed, (f,) = place([mixed_gang(spec)], hosts)
    assert placed == [] and "instance 2 needs cpu=1,mem=0Mi,gpu=1" in f.reason, f.reason
    assert can_ever_fit(mixed_gang(spec), hosts) is not None


# --- what the API and the CLI show -------------------------------------------------------------------------------
def test_a_task_carries_its_role_and_rank_and_task_list_shows_them() -> None:
    tasks = [convert.task_to_proto(Task("j", i, 0), spec=SPEC) for i in range(5)]
    assert [(t.role, t.role_rank) for t in tasks] == [("ps", 0), ("ps", 1), ("worker", 0), ("worker", 1),
                                                      ("worker", 2)]
    single = convert.task_to_proto(Task("j", 1, 0), spec=JobSpec("a", 2, "x", Resources(cpu=1)))
    assert (single.role, single.role_rank) == ("", 0)
    assert [render.role_cell(t) for t in tasks[1:3]] == ["ps/1", "worker/0"]


def test_job_get_lists_the_roles() -> None:
    from peloton.domain.model import Job
    from peloton.domain.states import JobState

    job = convert.job_to_proto(Job("j", SPEC, JobState.PENDING, "RUNNING", "", 1.0, 1.0), [], {})
    tasks = [convert.task_to_proto(Task("j", i, 0), spec=SPEC) for i in range(5)]
    text = render.job_view(job, tasks)
    assert "Instances: 5 in 2 roles" in text
    rows = [line.split() for line in text.splitlines()]
    assert ["ps", "2", "0-1", "cpu=4,mem=8Gi,ports=1", "python", "train.py", "--ps"] in rows
    assert ["worker", "3", "2-4", "cpu=2,mem=0Mi,gpu=1,ports=1", "python", "train.py"] in rows
    assert any(r[:2] == ["4", "worker/2"] for r in rows), text
    shown: dict[str, Any] = render.job_json(job, tasks)
    assert [r["name"] for r in shown["spec"]["roles"]] == ["ps", "worker"] and shown["spec"]["task"] is None
    assert shown["tasks"][4]["role"] == "worker" and shown["tasks"][4]["role_rank"] == 2
