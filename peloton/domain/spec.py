"""The job spec as plain data, and its validation. Conversion from protobuf lives in peloton/api/convert.py."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from peloton.domain.resources import Resources
from peloton.errors import InvalidArgument

ON_MEMBER_FAILURE = ("restart_gang", "fail_job")
STRATEGIES = ("pack", "spread")
CONSTRAINT_OPS = ("eq", "ne", "exists", "in")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_POOL_PATH = re.compile(r"^/([A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*)?$")

DEFAULT_LAUNCH_TIMEOUT_S = 300.0
DEFAULT_MAX_ATTEMPTS = 3


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
class JobSpec:
    name: str
    instances: int
    command: str
    resources: Resources
    owner: str = ""
    respool: str = "/"
    env: dict[str, str] = field(default_factory=dict)
    container_image: str = ""
    min_available: int = 0  # 0 means "all instances"
    on_member_failure: str = "restart_gang"
    launch_timeout_s: float = DEFAULT_LAUNCH_TIMEOUT_S
    priority: int = 0
    preemptible: bool = False
    max_runtime_s: float = 0.0
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    strategy: str = "pack"
    constraints: tuple[Constraint, ...] = ()

    @property
    def gang_size(self) -> int:
        return self.min_available or self.instances


def validate_pool_path(path: str, field_name: str) -> None:
    if not _POOL_PATH.match(path) or any(part in (".", "..") for part in path.split("/")):
        raise InvalidArgument(
            f"{field_name}: {path!r} is not a pool path like / or /team/sub", field=field_name
        )


def validate(spec: JobSpec) -> JobSpec:
    """Check every field; raise InvalidArgument naming the first field at fault."""

    def bad(f: str, why: str) -> InvalidArgument:
        return InvalidArgument(f"{f}: {why}", field=f)

    if not spec.name.strip():
        raise bad("name", "must not be empty")
    if len(spec.name) > 200:
        raise bad("name", "longer than 200 characters")
    if spec.instances < 1:
        raise bad("instances", f"must be at least 1, got {spec.instances}")
    if spec.instances > 100_000:
        raise bad("instances", f"at most 100000, got {spec.instances}")
    if not spec.command.strip():
        raise bad("task.command", "must not be empty")
    r = spec.resources
    for dim, v in (("cpu", r.cpu), ("mem", r.mem), ("disk", r.disk)):
        if not math.isfinite(v):
            raise bad(f"task.resources.{dim}", f"must be a finite number, got {v}")
    for dim, v in (("cpu", r.cpu), ("mem", r.mem), ("disk", r.disk), ("gpu", r.gpu), ("ports", r.ports)):
        if v < 0:
            raise bad(f"task.resources.{dim}", f"must not be negative, got {v}")
    if r.cpu <= 0:
        raise bad("task.resources.cpu", "must be greater than 0")
    if r.ports > 64:
        raise bad("task.resources.ports", f"at most 64 ports per task, got {r.ports}")
    for k in spec.env:
        if not _ENV_NAME.match(k):
            raise bad(f"task.env.{k}", "not a valid environment variable name")
    validate_pool_path(spec.respool, "respool")
    if spec.min_available < 0:
        raise bad("gang.min_available", f"must not be negative, got {spec.min_available}")
    if spec.min_available > spec.instances:
        raise bad(
            "gang.min_available",
            f"{spec.min_available} is more than instances ({spec.instances})",
        )
    if spec.on_member_failure not in ON_MEMBER_FAILURE:
        raise bad("gang.on_member_failure", f"must be one of {', '.join(ON_MEMBER_FAILURE)}")
    if not math.isfinite(spec.launch_timeout_s) or not math.isfinite(spec.max_runtime_s):
        raise bad("gang.launch_timeout" if not math.isfinite(spec.launch_timeout_s) else "sla.max_runtime",
                  "must be finite")
    if spec.launch_timeout_s <= 0:
        raise bad("gang.launch_timeout", "must be greater than 0")
    if spec.max_runtime_s < 0:
        raise bad("sla.max_runtime", "must not be negative")
    if spec.max_attempts < 1:
        raise bad("retry.max_attempts", f"must be at least 1, got {spec.max_attempts}")
    if spec.strategy not in STRATEGIES:
        raise bad("placement.strategy", f"must be one of {', '.join(STRATEGIES)}, got {spec.strategy!r}")
    for i, c in enumerate(spec.constraints):
        if not c.attribute:
            raise bad(f"placement.constraints[{i}].attribute", "must not be empty")
        if c.op not in CONSTRAINT_OPS:
            raise bad(f"placement.constraints[{i}].op", f"must be one of {', '.join(CONSTRAINT_OPS)}")
        if c.op != "exists" and not c.value:
            raise bad(f"placement.constraints[{i}].value", "must not be empty")
    return spec


def gang_partition(spec: JobSpec) -> list[list[int]]:
    """Instances grouped into gangs: the first `gang_size` instances form gang 0 (all-or-none);
    in an elastic job each remaining instance is a gang of one, scheduled as it fits."""
    size = spec.gang_size
    gangs = [list(range(size))]
    gangs.extend([i] for i in range(size, spec.instances))
    return gangs


def spec_to_dict(spec: JobSpec) -> dict[str, object]:
    """Plain-JSON form used by the store (not the API's JSON form)."""
    r = spec.resources
    return {
        "name": spec.name,
        "instances": spec.instances,
        "command": spec.command,
        "resources": {"cpu": r.cpu, "mem": r.mem, "disk": r.disk, "gpu": r.gpu, "ports": r.ports},
        "owner": spec.owner,
        "respool": spec.respool,
        "env": dict(spec.env),
        "container_image": spec.container_image,
        "min_available": spec.min_available,
        "on_member_failure": spec.on_member_failure,
        "launch_timeout_s": spec.launch_timeout_s,
        "priority": spec.priority,
        "preemptible": spec.preemptible,
        "max_runtime_s": spec.max_runtime_s,
        "max_attempts": spec.max_attempts,
        "strategy": spec.strategy,
        "constraints": [{"attribute": c.attribute, "op": c.op, "value": c.value} for c in spec.constraints],
    }


def spec_from_dict(d: dict) -> JobSpec:  # type: ignore[type-arg]
    r = d["resources"]
    return JobSpec(
        name=d["name"],
        instances=int(d["instances"]),
        command=d["command"],
        resources=Resources(float(r["cpu"]), float(r["mem"]), float(r["disk"]), int(r["gpu"]), int(r["ports"])),
        owner=d.get("owner", ""),
        respool=d.get("respool", "/"),
        env=dict(d.get("env", {})),
        container_image=d.get("container_image", ""),
        min_available=int(d.get("min_available", 0)),
        on_member_failure=d.get("on_member_failure", "restart_gang"),
        launch_timeout_s=float(d.get("launch_timeout_s", DEFAULT_LAUNCH_TIMEOUT_S)),
        priority=int(d.get("priority", 0)),
        preemptible=bool(d.get("preemptible", False)),
        max_runtime_s=float(d.get("max_runtime_s", 0.0)),
        max_attempts=int(d.get("max_attempts", DEFAULT_MAX_ATTEMPTS)),
        strategy=d.get("strategy", "pack"),
        constraints=tuple(Constraint(c["attribute"], c["op"], c["value"]) for c in d.get("constraints", [])),
    )
