"""The job spec as plain data, and its validation. Conversion from protobuf lives in peloton/api/convert.py."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from typing import Any

from peloton.domain import checks, limits
from peloton.domain.durations import format_duration
from peloton.domain.resources import Resources

ON_MEMBER_FAILURE = ("restart_gang", "fail_job")
MODEL_AWARE = "model-aware"
STRATEGIES = ("pack", "spread", MODEL_AWARE)
OBJECTIVES = ("throughput", "efficiency")
_MODEL_NAME = re.compile(r"[A-Za-z0-9_.-]+")  # fullmatch: a stored model's name
CONSTRAINT_OPS = ("eq", "ne", "exists", "in")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # fullmatch: `$` would let "FOO\n" through
_USER = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*\$?")  # fullmatch: POSIX portable user names (and Samba's $)
_POOL_PATH = re.compile(r"/([A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*)?")  # fullmatch
_ROLE_NAME = re.compile(r"[a-z][a-z0-9-]*")  # fullmatch; also part of PELOTON_ROLE_HOSTS_<NAME>
# The role a single-task spec's members play, where a caller asks (JobSpec.all_roles); the API and the members'
# environment show no role for such a job.
IMPLICIT_ROLE = "task"

DEFAULT_LAUNCH_TIMEOUT_S = 300.0
DEFAULT_MAX_ATTEMPTS = 3
DEFAULT_PREEMPTION_GRACE_S = 30.0


@dataclass(frozen=True, slots=True)
class Constraint:
    attribute: str
    op: str = "eq"
    value: str = ""

    def matches(self, labels: dict[str, str]) -> bool:
        have = labels.get(self.attribute)
        if self.op == "exists":
            return have is not None
        if self.op == "eq":
            return have == self.value
        if self.op == "ne":
            return have != self.value
        if self.op == "in":
            return have is not None and have in [v.strip() for v in self.value.split(",")]
        return False

    def describe(self) -> str:
        return f"{self.attribute} {self.op} {self.value}".strip()


@dataclass(frozen=True, slots=True)
class Role:
    """Members of a job that run the same task (JobSpec.roles): parameter servers, workers. Instance numbers are
    given in role order: the first role's members come first."""

    name: str
    instances: int
    command: str
    resources: Resources
    env: dict[str, str] = field(default_factory=dict)
    env_files: dict[str, str] = field(default_factory=dict)
    container_image: str = ""


@dataclass(frozen=True, slots=True)
class ModelRef:
    """The training model whose cost model places a model-aware job (docs/model-aware.md)."""

    name: str  # a stored model
    local_bsz: float = 0.0  # per GPU; or
    global_bsz: float = 0.0  # over the gang; neither: the model description's
    objective: str = "throughput"
    auto_instances: bool = False  # `instances: auto`: the workers' count is chosen when the job is created
    min_instances: int = 1
    max_instances: int = 0  # 0: as many as fit
    min_efficiency: float | None = None  # auto only: the least scaling efficiency of a count; None: 0.5
    # Decided by the daemon when the job is created: the cost model and batch the placement engine uses
    # (peloton/modelaware/plan.py goal_to_dict, as JSON), so a later change of the stored model does not move a
    # running job; "" until then.
    goal_json: str = ""


@dataclass(frozen=True, slots=True)
class JobSpec:
    name: str
    instances: int
    command: str
    resources: Resources
    owner: str = ""
    respool: str = "/"
    env: dict[str, str] = field(default_factory=dict)
    env_files: dict[str, str] = field(default_factory=dict)  # NAME -> file the member reads NAME from at start
    container_image: str = ""
    user: str = ""  # the user the members run as; empty: the backend's default (never root unless the pool allows)
    min_available: int = 0  # 0 means "all instances"
    on_member_failure: str = "restart_gang"
    launch_timeout_s: float = DEFAULT_LAUNCH_TIMEOUT_S
    priority: int = 0
    preemptible: bool = True  # its gangs may be preempted whole; if not, admitted only within its pool's reservation
    max_runtime_s: float = 0.0
    preemption_grace_s: float = DEFAULT_PREEMPTION_GRACE_S  # SIGTERM to SIGKILL when a gang is preempted
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    strategy: str = "pack"
    constraints: tuple[Constraint, ...] = ()
    # Who the members run as, decided by the daemon when the job was created (run_as.py: "", a user name, or
    # "#<uid>"); None for a job created before identities (it runs as `user`, system accounts refused)
    run_as: str | None = None
    # Several roles, each with its own instances and task; empty for a single-task spec. With roles, `instances` is
    # their sum, the top-level command, resources, env, env_files and container_image are empty, and the job is one
    # gang. Callers ask for a member's task with the member_* helpers, which work for both forms.
    roles: tuple[Role, ...] = ()
    model: ModelRef | None = None  # placement.strategy model-aware

    @property
    def gang_size(self) -> int:
        return self.min_available or self.instances

    def all_roles(self) -> tuple[Role, ...]:
        """The roles; for a single-task spec one role named IMPLICIT_ROLE made of the top-level fields."""
        if self.roles:
            return self.roles
        return (Role(IMPLICIT_ROLE, self.instances, self.command, self.resources, self.env, self.env_files,
                     self.container_image),)

    def role_at(self, instance: int) -> tuple[Role, int]:
        """The role of member `instance` and its rank within the role (instances are numbered in role order)."""
        start = 0
        for r in self.all_roles():
            if instance < start + r.instances:
                return r, instance - start
            start += r.instances
        raise IndexError(f"instance {instance} of a job of {self.instances}")

    def role_of(self, instance: int) -> Role:
        return self.role_at(instance)[0]

    def member_resources(self, instance: int) -> Resources:
        """What member `instance` asks for (the same object for every member of a role: the placer's fast path
        for equal members compares by identity first)."""
        return self.role_of(instance).resources if self.roles else self.resources

    def member_command(self, instance: int) -> str:
        return self.role_of(instance).command if self.roles else self.command

    def member_env(self, instance: int) -> dict[str, str]:
        return self.role_of(instance).env if self.roles else self.env

    def member_env_files(self, instance: int) -> dict[str, str]:
        return self.role_of(instance).env_files if self.roles else self.env_files

    def member_container_image(self, instance: int) -> str:
        return self.role_of(instance).container_image if self.roles else self.container_image

    def gang_total(self) -> Resources:
        """Every member of the first gang (gang 0) together."""
        if not self.roles:
            return self.resources.scale(self.gang_size)
        total = Resources()
        for r in self.roles:
            total = total + r.resources.scale(r.instances)
        return total


def validate_pool_path(path: str, field_name: str) -> None:
    """`/` or `/a/b`: segments of letters, digits, `_`, `.`, `-` (not `.` or `..`), within the length limits."""
    if len(path) > limits.MAX_POOL_PATH_CHARS:
        raise checks.bad(field_name, f"longer than {limits.MAX_POOL_PATH_CHARS} characters ({len(path)})")
    if not _POOL_PATH.fullmatch(path) or any(part in (".", "..") for part in path.split("/")):
        raise checks.bad(field_name, f"{checks.show(path)} is not a pool path like / or /team/sub")
    for part in path.split("/"):
        if len(part) > limits.MAX_POOL_SEGMENT_CHARS:
            raise checks.bad(field_name, f"a name between slashes is longer than {limits.MAX_POOL_SEGMENT_CHARS} "
                                         f"characters ({len(part)})")


def validate(spec: JobSpec) -> JobSpec:
    """Check every field against peloton/domain/limits.py; raise InvalidArgument naming the first field at fault."""
    bad = checks.bad
    if not spec.name.strip():
        raise bad("name", "must not be blank" if spec.name else "required (the job's name)")
    checks.text(spec.name, "name", max_chars=limits.MAX_JOB_NAME_CHARS)
    checks.text(spec.owner, "owner", max_chars=limits.MAX_OWNER_CHARS)
    validate_pool_path(spec.respool, "respool")
    if spec.roles:
        _validate_roles(spec)
    else:
        checks.integer(spec.instances, "instances", minimum=1, maximum=limits.MAX_INSTANCES)
    checks.integer(spec.min_available, "gang.min_available", minimum=0, maximum=limits.INT32_MAX)
    if spec.roles and spec.min_available not in (0, spec.instances):
        raise bad("gang.min_available", f"a job with roles is one gang of all their members ({spec.instances}): "
                                        "give no min_available")
    if spec.min_available > spec.instances:
        raise bad("gang.min_available", f"{spec.min_available} is more than instances ({spec.instances})")
    if spec.roles and spec.gang_size > limits.MAX_GANG_SIZE:
        raise bad("roles", f"{spec.gang_size} members in all, more than {limits.MAX_GANG_SIZE}, the most one gang may "
                           "have")
    if spec.gang_size > limits.MAX_GANG_SIZE:
        f = "gang.min_available" if spec.min_available else "instances"
        raise bad(f, f"a gang of {spec.gang_size} members is more than {limits.MAX_GANG_SIZE}; a larger job must be "
                     f"elastic (gang.min_available at most {limits.MAX_GANG_SIZE})")
    if spec.on_member_failure not in ON_MEMBER_FAILURE:
        raise bad("gang.on_member_failure", f"must be one of {', '.join(ON_MEMBER_FAILURE)}, got "
                                            f"{checks.show(spec.on_member_failure)}")
    _duration(spec.launch_timeout_s, "gang.launch_timeout", limits.MAX_LAUNCH_TIMEOUT_S, positive=True)
    checks.integer(spec.priority, "sla.priority", minimum=limits.INT32_MIN, maximum=limits.INT32_MAX)
    _duration(spec.max_runtime_s, "sla.max_runtime", limits.MAX_RUNTIME_S)
    _duration(spec.preemption_grace_s, "sla.preemption_grace", limits.MAX_PREEMPTION_GRACE_S)
    checks.integer(spec.max_attempts, "retry.max_attempts", minimum=1, maximum=limits.MAX_ATTEMPTS)
    if not spec.roles:
        _validate_task(spec.command, spec.env, spec.env_files, spec.resources, spec.container_image, "task")
    _validate_user(spec.user, "roles[0].task.user" if spec.roles else "task.user")
    if spec.strategy not in STRATEGIES:
        raise bad("placement.strategy", f"must be one of {', '.join(STRATEGIES)}, got {checks.show(spec.strategy)}")
    validate_model_ref(spec)
    if len(spec.constraints) > limits.MAX_CONSTRAINTS:
        raise bad("placement.constraints", f"at most {limits.MAX_CONSTRAINTS}, got {len(spec.constraints)}")
    for i, c in enumerate(spec.constraints):
        f = f"placement.constraints[{i}]"
        if not c.attribute:
            raise bad(f"{f}.attribute", "must not be empty")
        checks.text(c.attribute, f"{f}.attribute", max_chars=limits.MAX_CONSTRAINT_ATTRIBUTE_CHARS)
        if c.op not in CONSTRAINT_OPS:
            raise bad(f"{f}.op", f"must be one of {', '.join(CONSTRAINT_OPS)}, got {checks.show(c.op)}")
        checks.text(c.value, f"{f}.value", max_chars=limits.MAX_CONSTRAINT_VALUE_CHARS)
        if c.op != "exists" and not c.value:
            raise bad(f"{f}.value", "must not be empty")
    return spec


def _duration(seconds: float, field_name: str, maximum: float, *, positive: bool = False) -> None:
    """Finite, not negative (more than 0 if `positive`), at most `maximum`; the bounds in the units of a spec file."""
    checks.number(seconds, field_name, minimum=0, maximum=math.inf, unit="s")
    if seconds > maximum:
        raise checks.bad(field_name, f"at most {format_duration(maximum)}, got {format_duration(seconds)}")
    if positive and seconds <= 0:
        raise checks.bad(field_name, "must be greater than 0")


def worker_roles(spec: JobSpec) -> list[int]:
    """Indexes (in all_roles()) of the roles whose members have GPUs: a model-aware job's workers."""
    return [i for i, r in enumerate(spec.all_roles()) if r.resources.gpu > 0]


def with_workers(spec: JobSpec, n: int) -> JobSpec:
    """`spec` with `n` workers: its instances, or (with roles) its GPU role's instances."""
    if not spec.roles:
        return replace(spec, instances=n)
    workers = worker_roles(spec)
    if len(workers) != 1:
        return spec  # validation says why
    roles = list(spec.roles)
    roles[workers[0]] = replace(roles[workers[0]], instances=n)
    return replace(spec, roles=tuple(roles), instances=sum(r.instances for r in roles))


def validate_submitted(spec: JobSpec) -> JobSpec:
    """A spec as a client sends it: with `instances: auto` its workers are still to be counted (when the job is
    created), so it is checked with the fewest it allows standing in."""
    if spec.model is not None and spec.model.auto_instances:
        # (a gang.min_available beside auto, as `job get -o json` writes one, is the count chosen before: moot)
        validate(replace(with_workers(spec, max(spec.model.min_instances, 1)), min_available=0))
        return spec
    return validate(spec)


def validate_model_ref(spec: JobSpec) -> None:
    """`model` and `placement.strategy: model-aware` go together; the workers are one role of one-GPU members;
    the job is one gang. (That the stored model exists, and the batch, are checked when the job is created.)"""
    bad = checks.bad
    m = spec.model
    if m is None:
        if spec.strategy == MODEL_AWARE:
            raise bad("model.name", "required with placement.strategy model-aware (the stored model whose cost "
                                    "model rates the plans)")
        return
    if spec.strategy != MODEL_AWARE:
        raise bad("placement.strategy", f"must be {MODEL_AWARE} when the spec names a model (got "
                                        f"{checks.show(spec.strategy)})")
    if not m.name:
        raise bad("model.name", "required (a stored model: peloton model list)")
    if len(m.name) > limits.MAX_MODEL_NAME_CHARS or not _MODEL_NAME.fullmatch(m.name):
        raise bad("model.name", f"{checks.show(m.name)} is not a model name (letters, digits, _ . -, at most "
                                f"{limits.MAX_MODEL_NAME_CHARS} characters)")
    for f, v in (("model.local_bsz", m.local_bsz), ("model.global_bsz", m.global_bsz)):
        checks.number(v, f, minimum=0, maximum=limits.MAX_BATCH)
    if m.local_bsz and m.global_bsz:
        raise bad("model.global_bsz", "give local_bsz or global_bsz, not both")
    if m.objective not in OBJECTIVES:
        raise bad("model.objective", f"must be one of {', '.join(OBJECTIVES)}, got {checks.show(m.objective)}")
    checks.integer(m.min_instances, "model.min_instances", minimum=1, maximum=limits.MAX_GANG_SIZE)
    checks.integer(m.max_instances, "model.max_instances", minimum=0, maximum=limits.MAX_GANG_SIZE)
    if m.max_instances and m.min_instances > m.max_instances:
        raise bad("model.min_instances", f"{m.min_instances} is more than model.max_instances ({m.max_instances})")
    if m.min_efficiency is not None:
        if not m.auto_instances:
            raise bad("model.min_efficiency", "only with instances: auto (it chooses among the counts)")
        checks.number(m.min_efficiency, "model.min_efficiency", minimum=0, maximum=1)
    workers = worker_roles(spec)
    where = "roles" if spec.roles else "task.resources.gpu"
    if len(workers) != 1:
        raise bad(where, "model-aware placement needs exactly one role of GPU workers, got "
                         f"{len(workers)}" if spec.roles else "model-aware placement needs GPU workers: must be 1")
    role = spec.all_roles()[workers[0]]
    if role.resources.gpu != 1:
        f = f"roles[{workers[0]}].task.resources.gpu" if spec.roles else "task.resources.gpu"
        raise bad(f, f"model-aware placement puts one worker on each GPU: must be 1, got {role.resources.gpu}")
    if spec.min_available and spec.min_available != spec.instances:
        raise bad("gang.min_available", "model-aware placement plans the whole job as one gang: leave it out")


def _validate_roles(spec: JobSpec) -> None:
    """The roles of `spec`, each task as a single task's, `instances` their sum; the top-level task absent."""
    bad = checks.bad
    if len(spec.roles) > limits.MAX_ROLES:
        raise bad("roles", f"at most {limits.MAX_ROLES} roles, got {len(spec.roles)}")
    if (spec.command or spec.env or spec.env_files or spec.container_image
            or spec.resources != Resources()):
        raise bad("roles", "give either roles or instances and task, not both")
    seen: dict[str, int] = {}
    total = size = 0
    for i, r in enumerate(spec.roles):
        f = f"roles[{i}]"
        if not r.name:
            raise bad(f"{f}.name", "required (the role's name, e.g. worker)")
        checks.text(r.name, f"{f}.name", max_chars=limits.MAX_ROLE_NAME_CHARS)
        if not _ROLE_NAME.fullmatch(r.name):
            raise bad(f"{f}.name", f"{checks.show(r.name)} is not a role name (lower-case letters, digits and -, "
                                   "starting with a letter)")
        if r.name in seen:
            raise bad(f"{f}.name", f"{r.name} is also the name of roles[{seen[r.name]}]")
        seen[r.name] = i
        checks.integer(r.instances, f"{f}.instances", minimum=1, maximum=limits.MAX_GANG_SIZE)
        total += r.instances
        size += _validate_task(r.command, r.env, r.env_files, r.resources, r.container_image, f"{f}.task")
    if size > limits.MAX_ROLES_TASK_BYTES:
        raise bad("roles", f"the roles' commands, environments and images together are {size} bytes, more than "
                           f"{limits.MAX_ROLES_TASK_BYTES}")
    if spec.instances != total:
        raise bad("instances", f"with roles, the job's instances are the roles' together ({total}), got "
                               f"{spec.instances}: give no instances")


def _validate_task(command: str, env: dict[str, str], env_files: dict[str, str], r: Resources,
                   container_image: str, at: str) -> int:
    """One task's fields, named under `at` (`task`, `roles[1].task`); returns their size in UTF-8 bytes."""
    bad = checks.bad
    if not command.strip():
        raise bad(f"{at}.command", "must not be blank" if command else "required (what each member runs)")
    total = checks.text(command, f"{at}.command", max_bytes=limits.MAX_COMMAND_BYTES) + 1
    if len(env) > limits.MAX_ENV_ENTRIES:
        raise bad(f"{at}.env", f"at most {limits.MAX_ENV_ENTRIES} variables, got {len(env)}")
    for k, v in env.items():
        f = f"{at}.env.{checks.key(k)}"
        if len(k) > limits.MAX_ENV_NAME_CHARS:
            raise bad(f, f"name longer than {limits.MAX_ENV_NAME_CHARS} characters ({len(k)})")
        if not _ENV_NAME.fullmatch(k):
            raise bad(f, "not a valid environment variable name ([A-Za-z_][A-Za-z0-9_]*)")
        total += len(k) + 2 + checks.text(v, f, max_bytes=limits.MAX_ENV_VALUE_BYTES)
    if total > limits.MAX_COMMAND_AND_ENV_BYTES:
        raise bad(f"{at}.env", f"the command and environment together are {total} bytes, more than "
                               f"{limits.MAX_COMMAND_AND_ENV_BYTES}")
    if len(env_files) > limits.MAX_ENV_FILES:
        raise bad(f"{at}.env_files", f"at most {limits.MAX_ENV_FILES} variables, got {len(env_files)}")
    for k, path in env_files.items():
        f = f"{at}.env_files.{checks.key(k)}"
        if len(k) > limits.MAX_ENV_NAME_CHARS or not _ENV_NAME.fullmatch(k):
            raise bad(f, "not a valid environment variable name ([A-Za-z_][A-Za-z0-9_]*)")
        if k in env:
            raise bad(f, f"{k} is also in {at}.env: give it one way")
        total += len(k) + checks.text(path, f, max_chars=limits.MAX_ENV_FILE_PATH_CHARS)
        if not path.startswith("/") or any(c in path for c in "\n\r"):
            raise bad(f, f"{checks.show(path)} is not an absolute path on one line")
    f = f"{at}.resources"
    checks.number(r.cpu, f"{f}.cpu", minimum=limits.MIN_CPU, maximum=limits.MAX_TASK_CPU, unit="cores")
    checks.number(r.mem, f"{f}.mem", minimum=0, maximum=limits.MAX_TASK_MEM_MIB,
                  granularity=limits.MIN_MEM_MIB, unit="MiB")
    checks.number(r.disk, f"{f}.disk", minimum=0, maximum=limits.MAX_TASK_DISK_MIB,
                  granularity=limits.MIN_MEM_MIB, unit="MiB")
    checks.integer(r.gpu, f"{f}.gpu", minimum=0, maximum=limits.MAX_TASK_GPU)
    checks.integer(r.ports, f"{f}.ports", minimum=0, maximum=limits.MAX_TASK_PORTS)
    return total + checks.text(container_image, f"{at}.container.image", max_chars=limits.MAX_CONTAINER_IMAGE_CHARS)


def _validate_user(user: str, field_name: str) -> None:
    if user:
        checks.text(user, field_name, max_chars=limits.MAX_USER_CHARS)
        if not _USER.fullmatch(user):
            raise checks.bad(field_name, f"{checks.show(user)} is not a user name (letters, digits, _ . -, not "
                                         "starting with a digit, . or -)")


# Backends that accept a setting without acting on it, and why (the Mesos backend acts on every spec field).
_NO_IMAGES = {
    "local": "ignored by the local backend, which runs each task as a process on its host, in no container (only "
             "the mesos backend runs a task in an image)",
    "sim": "ignored by the sim backend, which runs no processes",
}


def ignored_settings(spec: JobSpec, backend: str) -> list[str]:
    """What `backend` accepts in `spec` but does not act on, each "field: why", for CreateJob to warn about. An
    empty `backend` (a job manager whose process does not run the host manager: it does not know it) finds none."""
    out = []
    if spec.container_image and backend in _NO_IMAGES:
        out.append(f"task.container.image: {_NO_IMAGES[backend]}")
    for i, r in enumerate(spec.roles):
        if r.container_image and backend in _NO_IMAGES:
            out.append(f"roles[{i}].task.container.image: {_NO_IMAGES[backend]}")
    return out


def gang_partition(spec: JobSpec) -> list[list[int]]:
    """Instances grouped into gangs: the first `gang_size` instances form gang 0 (all-or-none);
    in an elastic job each remaining instance is a gang of one, scheduled as it fits."""
    size = spec.gang_size
    gangs = [list(range(size))]
    gangs.extend([i] for i in range(size, spec.instances))
    return gangs


# The store's spec form: 2 since sla.preemptible is acted on (and defaults to true). Specs stored before had
# `preemptible: false` whether or not the user said so, and it meant nothing then: they read as preemptible.
SPEC_FORM = 2


def spec_to_dict(spec: JobSpec) -> dict[str, object]:
    """Plain-JSON form used by the store (not the API's JSON form)."""
    return {
        "form": SPEC_FORM,
        "name": spec.name,
        "instances": spec.instances,
        "command": spec.command,
        "resources": _resources_to_dict(spec.resources),
        "owner": spec.owner,
        "respool": spec.respool,
        "env": dict(spec.env),
        "env_files": dict(spec.env_files),
        "container_image": spec.container_image,
        "user": spec.user,
        "min_available": spec.min_available,
        "on_member_failure": spec.on_member_failure,
        "launch_timeout_s": spec.launch_timeout_s,
        "priority": spec.priority,
        "preemptible": spec.preemptible,
        "max_runtime_s": spec.max_runtime_s,
        "preemption_grace_s": spec.preemption_grace_s,
        "max_attempts": spec.max_attempts,
        "strategy": spec.strategy,
        "constraints": [{"attribute": c.attribute, "op": c.op, "value": c.value} for c in spec.constraints],
        **({"run_as": spec.run_as} if spec.run_as is not None else {}),
        # only with roles: a single-task spec is stored as before roles existed
        **({"roles": [_role_to_dict(r) for r in spec.roles]} if spec.roles else {}),
        **({"model": _model_to_dict(spec.model)} if spec.model is not None else {}),
    }


def _model_to_dict(m: ModelRef) -> dict[str, object]:
    return {"name": m.name, "local_bsz": m.local_bsz, "global_bsz": m.global_bsz, "objective": m.objective,
            "auto_instances": m.auto_instances, "min_instances": m.min_instances, "max_instances": m.max_instances,
            "goal_json": m.goal_json, **({"min_efficiency": m.min_efficiency} if m.min_efficiency is not None else {})}


def _model_from_dict(d: dict[str, Any]) -> ModelRef:
    return ModelRef(name=d["name"], local_bsz=float(d.get("local_bsz", 0.0)),
                    global_bsz=float(d.get("global_bsz", 0.0)), objective=d.get("objective", "throughput"),
                    auto_instances=bool(d.get("auto_instances", False)), min_instances=int(d.get("min_instances", 1)),
                    max_instances=int(d.get("max_instances", 0)), goal_json=d.get("goal_json", ""),
                    min_efficiency=float(d["min_efficiency"]) if d.get("min_efficiency") is not None else None)


def _resources_to_dict(r: Resources) -> dict[str, object]:
    return {"cpu": r.cpu, "mem": r.mem, "disk": r.disk, "gpu": r.gpu, "ports": r.ports}


def _resources_from_dict(r: dict[str, Any]) -> Resources:
    return Resources(float(r["cpu"]), float(r["mem"]), float(r["disk"]), int(r["gpu"]), int(r["ports"]))


def _role_to_dict(r: Role) -> dict[str, object]:
    return {"name": r.name, "instances": r.instances, "command": r.command, "resources": _resources_to_dict(r.resources),
            "env": dict(r.env), "env_files": dict(r.env_files), "container_image": r.container_image}


def _role_from_dict(d: dict[str, Any]) -> Role:
    return Role(name=d["name"], instances=int(d["instances"]), command=d["command"],
                resources=_resources_from_dict(d["resources"]), env=dict(d.get("env", {})),
                env_files=dict(d.get("env_files", {})), container_image=d.get("container_image", ""))


def spec_from_dict(d: dict[str, Any]) -> JobSpec:
    return JobSpec(
        name=d["name"],
        instances=int(d["instances"]),
        command=d["command"],
        resources=_resources_from_dict(d["resources"]),
        owner=d.get("owner", ""),
        respool=d.get("respool", "/"),
        env=dict(d.get("env", {})),
        env_files=dict(d.get("env_files", {})),
        container_image=d.get("container_image", ""),
        user=d.get("user", ""),
        min_available=int(d.get("min_available", 0)),
        on_member_failure=d.get("on_member_failure", "restart_gang"),
        launch_timeout_s=float(d.get("launch_timeout_s", DEFAULT_LAUNCH_TIMEOUT_S)),
        priority=int(d.get("priority", 0)),
        preemptible=bool(d.get("preemptible", True)) if d.get("form", 1) >= 2 else True,
        max_runtime_s=float(d.get("max_runtime_s", 0.0)),
        preemption_grace_s=float(d.get("preemption_grace_s", DEFAULT_PREEMPTION_GRACE_S)),
        max_attempts=int(d.get("max_attempts", DEFAULT_MAX_ATTEMPTS)),
        strategy=d.get("strategy", "pack"),
        constraints=tuple(Constraint(c["attribute"], c["op"], c["value"]) for c in d.get("constraints", [])),
        run_as=str(d["run_as"]) if d.get("run_as") is not None else None,
        roles=tuple(_role_from_dict(r) for r in d.get("roles", ())),
        model=_model_from_dict(d["model"]) if d.get("model") else None,
    )
