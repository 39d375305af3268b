"""Builders of Mesos v1 scheduler calls, offer operations and TaskInfos, as the JSON the master expects.

Pure (no I/O). JSON rules (mesos-api.md §1.2): snake_case proto field names, enums as their names, ids as
`{"value": ...}` objects, bytes as base64 strings, durations as `{"nanoseconds": int}`. Unknown keys are
silently ignored by the master, so every key here is spelled exactly as in the .proto files.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

JSON = dict[str, Any]

DEFAULT_CAPABILITIES: tuple[str, ...] = ("GPU_RESOURCES", "MULTI_ROLE", "PARTITION_AWARE", "TASK_KILLING_STATE")
SEVEN_DAYS_S = 7 * 24 * 3600.0
MAX_REFUSE_SECONDS = 31536000.0

# Call types a client may send. UNKNOWN is deliberately absent: with a known framework id it crashes the master.
CALL_TYPES = frozenset({
    "SUBSCRIBE", "TEARDOWN", "ACCEPT", "DECLINE", "ACCEPT_INVERSE_OFFERS", "DECLINE_INVERSE_OFFERS", "REVIVE",
    "KILL", "SHUTDOWN", "ACKNOWLEDGE", "ACKNOWLEDGE_OPERATION_STATUS", "RECONCILE", "RECONCILE_OPERATIONS",
    "MESSAGE", "REQUEST", "SUPPRESS", "UPDATE_FRAMEWORK",
})
# Calls whose body object is required (the master answers 400 "Expecting '<x>' to be present" without it).
_BODY_REQUIRED = CALL_TYPES - {"TEARDOWN", "REVIVE", "SUPPRESS", "RECONCILE_OPERATIONS"}


class CallError(ValueError):
    """A call that must not be sent (the master would reject it, or worse)."""


def _id(value: str) -> JSON:
    if not isinstance(value, str) or not value:
        raise CallError(f"an id must be a non-empty string, got {value!r}")
    return {"value": value}


def _ns(seconds: float) -> JSON:
    return {"nanoseconds": int(round(seconds * 1e9))}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


# --- framework --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FrameworkConfig:
    """FrameworkInfo fields we send. The HTTP secret is not here: it belongs to the shell (MesosClient)."""

    name: str
    user: str
    roles: tuple[str, ...] = ("*",)
    principal: str | None = None
    failover_timeout_s: float = SEVEN_DAYS_S  # the master's default 0 kills every task on a disconnect
    checkpoint: bool = True
    capabilities: tuple[str, ...] = DEFAULT_CAPABILITIES
    hostname: str | None = None
    webui_url: str | None = None
    labels: tuple[tuple[str, str], ...] = ()
    suppressed_roles: tuple[str, ...] = ()  # roles to start suppressed (subset of roles)

    def __post_init__(self) -> None:
        if not self.name or not self.user:
            raise CallError("FrameworkConfig needs a name and a user (both required over HTTP)")
        if not self.roles or len(set(self.roles)) != len(self.roles):
            raise CallError(f"FrameworkConfig.roles must be non-empty and unique, got {self.roles!r}")
        if not self.multi_role and len(self.roles) > 1:
            raise CallError("several roles need the MULTI_ROLE capability")
        if not set(self.suppressed_roles) <= set(self.roles):
            raise CallError("suppressed_roles must be a subset of roles")
        if not 0 <= self.failover_timeout_s < 1e12:
            raise CallError(f"failover_timeout_s out of range: {self.failover_timeout_s}")

    @property
    def multi_role(self) -> bool:
        return "MULTI_ROLE" in self.capabilities

    def framework_info(self, framework_id: str | None = None) -> JSON:
        info: JSON = {"user": self.user, "name": self.name}
        if framework_id:
            info["id"] = _id(framework_id)
        # `roles` needs MULTI_ROLE and excludes the deprecated `role` (ERROR on the stream otherwise).
        if self.multi_role:
            info["roles"] = list(self.roles)
        else:
            info["role"] = self.roles[0]
        info["failover_timeout"] = float(self.failover_timeout_s)
        info["checkpoint"] = self.checkpoint
        info["capabilities"] = [{"type": c} for c in self.capabilities]
        if self.principal:
            info["principal"] = self.principal
        if self.hostname:
            info["hostname"] = self.hostname
        if self.webui_url:
            info["webui_url"] = self.webui_url
        if self.labels:
            info["labels"] = {"labels": [{"key": k, "value": v} for k, v in self.labels]}
        return info


def subscribe(config: FrameworkConfig, framework_id: str | None) -> JSON:
    """SUBSCRIBE. With a known id it goes BOTH top-level and in framework_info.id (else 400)."""
    sub: JSON = {"framework_info": config.framework_info(framework_id)}
    if config.suppressed_roles:
        sub["suppressed_roles"] = list(config.suppressed_roles)
    body: JSON = {"type": "SUBSCRIBE"}
    if framework_id:
        body["framework_id"] = _id(framework_id)
    body["subscribe"] = sub
    return body


# --- resources --------------------------------------------------------------------------------------------------


def _res(name: str, kind: str, value: JSON, role: str | None, reservation_role: str) -> JSON:
    r: JSON = {"name": name, "type": kind, **value, "role": reservation_role}
    if role is not None:
        r["allocation_info"] = {"role": role}
    return r


def scalar_resource(name: str, value: float, role: str | None = None, reservation_role: str = "*") -> JSON:
    """A SCALAR resource. `role` is the allocation role (allocation_info.role: what a MULTI_ROLE framework puts
    on every resource it launches with, copied from the offer); `reservation_role` the old-format `role`
    ("*" = unreserved, as offered)."""
    if value < 0:
        raise CallError(f"negative {name}: {value}")
    # fixed-point with 3 decimals on the master
    v = round(float(value), 3)
    return _res(name, "SCALAR", {"scalar": {"value": int(v) if v.is_integer() else v}}, role, reservation_role)


def ports_to_ranges(ports: Iterable[int]) -> list[JSON]:
    """[31000, 31001, 31005] -> [{begin: 31000, end: 31001}, {begin: 31005, end: 31005}] (inclusive)."""
    out: list[JSON] = []
    for p in sorted(set(ports)):
        if out and out[-1]["end"] == p - 1:
            out[-1]["end"] = p
        else:
            out.append({"begin": p, "end": p})
    return out


def ports_resource(ports: Iterable[int], role: str | None = None, reservation_role: str = "*") -> JSON:
    return _res("ports", "RANGES", {"ranges": {"range": ports_to_ranges(ports)}}, role, reservation_role)


def task_resources(
    cpus: float,
    mem: float,
    disk: float = 0.0,
    gpus: float = 0,
    ports: Sequence[int] = (),
    role: str | None = None,
    reservation_role: str = "*",
) -> list[JSON]:
    """The resources of one TaskInfo (mem/disk in MB). GPUs must be whole: a fractional `gpus` makes the master
    answer TASK_ERROR, so it is refused here. Zero quantities are left out."""
    if gpus != int(gpus) or gpus < 0:
        raise CallError(f"gpus must be a whole number, got {gpus}")
    out = [scalar_resource("cpus", cpus, role, reservation_role), scalar_resource("mem", mem, role, reservation_role)]
    if disk > 0:
        out.append(scalar_resource("disk", disk, role, reservation_role))
    if gpus > 0:
        out.append(scalar_resource("gpus", int(gpus), role, reservation_role))
    if ports:
        out.append(ports_resource(ports, role, reservation_role))
    return out


# --- TaskInfo, executors, operations ----------------------------------------------------------------------------


def command_info(
    value: str,
    env: Mapping[str, str] | None = None,
    *,
    shell: bool = True,
    arguments: Sequence[str] = (),
    user: str | None = None,
    uris: Sequence[str] = (),
) -> JSON:
    """CommandInfo. `uris` are fetched into the sandbox (they belong here, not on the TaskInfo)."""
    cmd: JSON = {"shell": shell, "value": value}
    if not shell and arguments:
        cmd["arguments"] = list(arguments)
    if env:
        cmd["environment"] = {"variables": [{"name": k, "value": str(v)} for k, v in env.items()]}
    if uris:
        cmd["uris"] = [{"value": u, "extract": True, "executable": False, "cache": False} for u in uris]
    if user:
        cmd["user"] = user
    return cmd


def mesos_image_container(image: str, *, cached: bool = True) -> JSON:
    """A Docker image run by the MESOS containerizer (the only GPU-capable form)."""
    return {"type": "MESOS", "mesos": {"image": {"type": "DOCKER", "docker": {"name": image}, "cached": cached}}}


def task_info(
    task_id: str,
    agent_id: str,
    resources: Sequence[JSON],
    command: str | JSON,
    *,
    name: str | None = None,
    env: Mapping[str, str] | None = None,
    image: str | None = None,
    labels: Mapping[str, str] | None = None,
    kill_grace_s: float | None = None,
    max_completion_s: float | None = None,
    data: bytes | None = None,
) -> JSON:
    """TaskInfo for the command executor or a task group member. `command` is a shell string (with `env`) or
    a ready CommandInfo dict. `agent_id` must be the agent of the offers it is launched with."""
    if "/" in task_id or "\\" in task_id or task_id in (".", "..") or len(task_id) > 255:
        raise CallError(f"invalid task id {task_id!r}")
    t: JSON = {
        "name": name or task_id,
        "task_id": _id(task_id),
        "agent_id": _id(agent_id),
        "resources": list(resources),
        "command": command if isinstance(command, dict) else command_info(command, env),
    }
    if image:
        t["container"] = mesos_image_container(image)
    if labels:
        t["labels"] = {"labels": [{"key": k, "value": v} for k, v in labels.items()]}
    if kill_grace_s is not None:
        t["kill_policy"] = {"grace_period": _ns(kill_grace_s)}
    if max_completion_s is not None:
        t["max_completion_time"] = _ns(max_completion_s)
    if data is not None:
        t["data"] = b64(data)
    return t


def launch(task_infos: Sequence[JSON]) -> JSON:
    """Offer.Operation LAUNCH (no `id`: an id on LAUNCH makes every task TASK_ERROR)."""
    return {"type": "LAUNCH", "launch": {"task_infos": list(task_infos)}}


# --- calls ------------------------------------------------------------------------------------------------------


def _call(framework_id: str | None, type_: str, payload: JSON | None = None) -> JSON:
    if not framework_id:
        raise CallError(f"{type_} needs a framework id (not subscribed yet)")
    body: JSON = {"type": type_, "framework_id": _id(framework_id)}
    if payload is not None:
        body[type_.lower()] = payload
    return body


def _filters(refuse_seconds: float | None) -> JSON | None:
    if refuse_seconds is None:
        return None
    return {"refuse_seconds": min(float(refuse_seconds), MAX_REFUSE_SECONDS)}


def accept(framework_id: str | None, offer_ids: Sequence[str], operations: Sequence[JSON],
           refuse_seconds: float | None = None) -> JSON:
    """ACCEPT. Every offer must be of ONE agent and ONE role (else the whole call fails, after a 202)."""
    if not offer_ids:
        raise CallError("ACCEPT needs at least one offer id")
    if len(set(offer_ids)) != len(offer_ids):
        raise CallError("ACCEPT offer ids must be unique")
    payload: JSON = {"offer_ids": [_id(o) for o in offer_ids], "operations": list(operations)}
    if (f := _filters(refuse_seconds)) is not None:
        payload["filters"] = f
    return _call(framework_id, "ACCEPT", payload)


def decline(framework_id: str | None, offer_ids: Sequence[str], refuse_seconds: float | None = None) -> JSON:
    """DECLINE (master default filter: 5 s)."""
    if not offer_ids:
        raise CallError("DECLINE needs at least one offer id")
    payload: JSON = {"offer_ids": [_id(o) for o in offer_ids]}
    if (f := _filters(refuse_seconds)) is not None:
        payload["filters"] = f
    return _call(framework_id, "DECLINE", payload)


def inverse_offers(framework_id: str | None, inverse_offer_ids: Sequence[str], *, accept: bool,
                   refuse_seconds: float | None = None) -> JSON:
    """ACCEPT_INVERSE_OFFERS (the framework has left the agent: the maintenance may go ahead) or
    DECLINE_INVERSE_OFFERS (not yet; the master asks again after the filter)."""
    if not inverse_offer_ids:
        raise CallError("an inverse offer answer needs at least one inverse offer id")
    kind = "ACCEPT_INVERSE_OFFERS" if accept else "DECLINE_INVERSE_OFFERS"
    payload: JSON = {"inverse_offer_ids": [_id(o) for o in inverse_offer_ids]}
    if (f := _filters(refuse_seconds)) is not None:
        payload["filters"] = f
    return _call(framework_id, kind, payload)


def kill(framework_id: str | None, task_id: str, agent_id: str | None = None,
         grace_period_s: float | None = None) -> JSON:
    """KILL. Pass the agent id: a WRONG one makes the master drop the kill silently; none at all works."""
    payload: JSON = {"task_id": _id(task_id)}
    if agent_id:
        payload["agent_id"] = _id(agent_id)
    if grace_period_s is not None:
        payload["kill_policy"] = {"grace_period": _ns(grace_period_s)}
    return _call(framework_id, "KILL", payload)


def acknowledge(framework_id: str | None, agent_id: str, task_id: str, uuid: str) -> JSON:
    """ACKNOWLEDGE an update that carried a uuid (copied verbatim). The master wants 16 bytes forming a valid
    UUID (version nibble checked): anything else is 400 `Not a valid UUID`."""
    try:
        raw = base64.b64decode(uuid, validate=True)
    except (binascii.Error, ValueError, TypeError):
        raise CallError(f"uuid is not base64: {uuid!r}") from None
    if len(raw) != 16:
        raise CallError(f"uuid must be 16 bytes, got {len(raw)}")
    if not 1 <= raw[6] >> 4 <= 5:
        raise CallError(f"uuid {uuid!r} has no valid UUID version (the master answers 400 'Not a valid UUID')")
    return _call(framework_id, "ACKNOWLEDGE", {"agent_id": _id(agent_id), "task_id": _id(task_id), "uuid": uuid})


def reconcile(framework_id: str | None, tasks: Sequence[tuple[str, str | None]] = ()) -> JSON:
    """RECONCILE. An empty list is implicit reconciliation (every task the master knows)."""
    entries: list[JSON] = []
    for task_id, agent_id in tasks:
        e: JSON = {"task_id": _id(task_id)}
        if agent_id:
            e["agent_id"] = _id(agent_id)
        entries.append(e)
    return _call(framework_id, "RECONCILE", {"tasks": entries})


def _roles_payload(roles: Sequence[str] | None) -> JSON | None:
    # "roles" (a list), never "role": an unknown key is dropped and the call then applies to ALL roles.
    if roles is None:
        return None
    if isinstance(roles, str):
        raise CallError("roles must be a list of role names, not a string")
    return {"roles": list(roles)} if roles else None


def revive(framework_id: str | None, roles: Sequence[str] | None = None) -> JSON:
    """REVIVE (roles None or empty: all roles). Also clears every DECLINE/ACCEPT filter of those roles."""
    return _call(framework_id, "REVIVE", _roles_payload(roles))


def suppress(framework_id: str | None, roles: Sequence[str] | None = None) -> JSON:
    """SUPPRESS (roles None or empty: all roles)."""
    return _call(framework_id, "SUPPRESS", _roles_payload(roles))


def teardown(framework_id: str | None) -> JSON:
    """TEARDOWN: kills every task and removes the framework; the id can never be used again."""
    return _call(framework_id, "TEARDOWN")


def shutdown(framework_id: str | None, executor_id: str, agent_id: str) -> JSON:
    return _call(framework_id, "SHUTDOWN", {"executor_id": _id(executor_id), "agent_id": _id(agent_id)})


def message(framework_id: str | None, agent_id: str, executor_id: str, data: bytes) -> JSON:
    return _call(framework_id, "MESSAGE",
                 {"agent_id": _id(agent_id), "executor_id": _id(executor_id), "data": b64(data)})


def validate_call(body: Mapping[str, Any]) -> str:
    """Check a call before it goes on the wire; return its type. Refuses UNKNOWN (it crashes the master when
    the framework id is known), unknown types, a missing framework id, and a missing required body."""
    type_ = body.get("type")
    if type_ not in CALL_TYPES:
        raise CallError(f"refusing to send a call of type {type_!r}")
    if type_ != "SUBSCRIBE" and not (isinstance(body.get("framework_id"), Mapping) and body["framework_id"].get("value")):
        raise CallError(f"{type_} needs framework_id as {{'value': ...}}")
    if type_ in _BODY_REQUIRED and not isinstance(body.get(str(type_).lower()), Mapping):
        raise CallError(f"{type_} needs its {str(type_).lower()!r} object")
    return str(type_)
