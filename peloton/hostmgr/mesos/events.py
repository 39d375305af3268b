"""Typed Mesos v1 scheduler events, parsed from the stream's JSON records. Pure: no I/O, no clock.

Parsing is lenient (missing optional keys get defaults, unknown keys are ignored): the master adds fields
over time, and a malformed event must never take the subscription down. `parse_event` never raises.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

JSON = dict[str, Any]

__all__ = [
    "JSON",
    "Disconnected",
    "Error",
    "Event",
    "Failure",
    "Heartbeat",
    "InverseOffer",
    "InverseOffers",
    "MasterInfo",
    "Message",
    "MesosTaskStatus",
    "Offer",
    "Offers",
    "Rescind",
    "RescindInverseOffer",
    "SubscribeRefused",
    "Subscribed",
    "Unknown",
    "Update",
    "UpdateOperationStatus",
    "attribute_value",
    "parse_event",
    "parse_offer",
    "parse_task_status",
]

MAX_GPUS_PER_AGENT = 1024  # an offer claiming more is malformed (gpu ids are listed, one per GPU)
MAX_SCALAR = 1e15  # cpus, mem (MB), disk (MB): a larger (or negative, or non-finite) quantity is malformed

FRAMEWORK_FAILED_OVER = "Framework failed over"
FRAMEWORK_REMOVED = "Framework has been removed"


def _id(obj: Any) -> str:
    """`{"value": "x"}` -> "x"; anything else -> ""."""
    if isinstance(obj, Mapping):
        v = obj.get("value", "")
        return v if isinstance(v, str) else str(v)
    return ""


def _opt_id(obj: Any) -> str | None:
    return _id(obj) or None


def _dict(obj: Any) -> Mapping[str, Any]:
    return obj if isinstance(obj, Mapping) else {}


def _list(obj: Any) -> list[Any]:
    return obj if isinstance(obj, list) else []


# --- data -------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MasterInfo:
    id: str = ""
    hostname: str = ""
    ip: str = ""  # from `address.ip` (the packed uint32 `ip` is deprecated)
    port: int = 0
    version: str = ""


@dataclass(frozen=True, slots=True)
class Offer:
    """One offer: resources of ONE agent allocated to ONE role. Quantities in Mesos units (mem/disk in MB)."""

    id: str
    agent_id: str
    hostname: str
    framework_id: str = ""
    role: str = "*"  # allocation_info.role (MULTI_ROLE); "*" for the default role
    cpus: float = 0.0
    mem: float = 0.0
    disk: float = 0.0
    gpus: float = 0.0  # whole numbers in practice; launches must use whole GPUs
    ports: tuple[tuple[int, int], ...] = ()  # inclusive ranges, sorted
    attributes: dict[str, str] = field(default_factory=dict)
    agent_address: str = ""  # url.address.ip (or hostname) of the agent
    agent_port: int = 0  # url.address.port of the agent (several agents may share one hostname)
    executor_ids: tuple[str, ...] = ()  # our executors already running on the agent
    domain: dict[str, str] = field(default_factory=dict)  # {"region": .., "zone": ..} when the agent has one
    has_unavailability: bool = False  # maintenance is scheduled on the agent
    unavailable_at: float | None = None  # ... starting then (Unix seconds)
    resources: tuple[JSON, ...] = ()  # the raw Resource objects as offered, reserved ones too (the quantities above: not)


@dataclass(frozen=True, slots=True)
class MesosTaskStatus:
    """`TaskStatus` as the master sends it. `uuid` is the base64 string verbatim (None: do not acknowledge)."""

    task_id: str
    state: str
    agent_id: str | None = None
    executor_id: str | None = None
    source: str | None = None  # SOURCE_MASTER | SOURCE_AGENT | SOURCE_EXECUTOR
    reason: str | None = None  # REASON_* (absent on executor updates)
    message: str = ""
    uuid: str | None = None
    timestamp: float | None = None
    healthy: bool | None = None
    data: str | None = None  # base64
    unreachable_time_ns: int | None = None
    raw: JSON = field(default_factory=dict, compare=False, repr=False)

    @property
    def needs_ack(self) -> bool:
        """Only updates that carry a uuid are acknowledged; master-generated ones (no uuid) never are."""
        return bool(self.uuid)


# --- events -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Subscribed:
    framework_id: str
    heartbeat_interval_s: float
    master_info: MasterInfo


@dataclass(frozen=True, slots=True)
class Offers:
    offers: tuple[Offer, ...]


@dataclass(frozen=True, slots=True)
class Rescind:
    offer_id: str


@dataclass(frozen=True, slots=True)
class Update:
    status: MesosTaskStatus


@dataclass(frozen=True, slots=True)
class Failure:
    """Without executor_id: the agent was removed (drop its offers). With it: an executor exited; `status` is
    the raw waitpid status (apply os.WEXITSTATUS), absent for agent removal."""

    agent_id: str | None
    executor_id: str | None
    status: int | None

    @property
    def agent_removed(self) -> bool:
        return self.executor_id is None


@dataclass(frozen=True, slots=True)
class Message:
    agent_id: str | None
    executor_id: str | None
    data: str  # base64


@dataclass(frozen=True, slots=True)
class Error:
    """The master ends the subscription. `failed_over`: another instance subscribed with our id (a fence: stop
    acting); `framework_removed`: the id is dead for good (torn down or failover timeout expired)."""

    message: str

    @property
    def failed_over(self) -> bool:
        return self.message.strip() == FRAMEWORK_FAILED_OVER

    @property
    def framework_removed(self) -> bool:
        return self.message.strip() == FRAMEWORK_REMOVED

    @property
    def fatal(self) -> bool:
        """Re-subscribing as-is cannot help: wait for the owner (backend) to decide."""
        return self.failed_over or self.framework_removed


@dataclass(frozen=True, slots=True)
class Heartbeat:
    pass


@dataclass(frozen=True, slots=True)
class InverseOffer:
    """The master asks the framework to leave an agent for a maintenance window starting at `start` (Unix
    seconds)."""

    id: str
    agent_id: str
    start: float
    duration: float = 0.0


@dataclass(frozen=True, slots=True)
class InverseOffers:
    """Maintenance windows (agents DRAINING in the master's maintenance schedule)."""

    offers: tuple[InverseOffer, ...] = ()
    raw: JSON = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RescindInverseOffer:
    inverse_offer_id: str


@dataclass(frozen=True, slots=True)
class UpdateOperationStatus:
    """Only for offer operations sent with an `id` (we send none). `uuid` (inner base64) when it needs an ACK."""

    operation_id: str | None
    state: str
    agent_id: str | None
    uuid: str | None
    raw: JSON


@dataclass(frozen=True, slots=True)
class Unknown:
    """An event type we do not know (new ones appear over time) or a record we could not parse."""

    type: str
    raw: Any
    error: str = ""


# Produced by the HTTP shell, never by the master:
@dataclass(frozen=True, slots=True)
class Disconnected:
    """The subscription ended (EOF, ERROR, silence, read error). Offers are dead; calls get 403 until the next
    Subscribed. `will_retry` is False when the shell stopped re-subscribing (fatal ERROR, or stop())."""

    reason: str
    will_retry: bool = True


@dataclass(frozen=True, slots=True)
class SubscribeRefused:
    """A SUBSCRIBE attempt got an HTTP error (4xx/5xx) or could not connect; the shell retries with backoff."""

    master: str
    status: int  # 0: no HTTP answer (connection failed)
    text: str


Event = (
    Subscribed
    | Offers
    | Rescind
    | Update
    | Failure
    | Message
    | Error
    | Heartbeat
    | InverseOffers
    | RescindInverseOffer
    | UpdateOperationStatus
    | Unknown
    | Disconnected
    | SubscribeRefused
)


# --- parsing ----------------------------------------------------------------------------------------------------


def attribute_value(a: Mapping[str, Any]) -> str:
    """An agent attribute as text: TEXT -> value; SCALAR -> "3" / "2.5"; RANGES -> "[1-3],[5-5]"; SET -> "a,b"."""
    t = a.get("type")
    if t == "TEXT":
        return str(_dict(a.get("text")).get("value", ""))
    if t == "SCALAR":
        v = float(_dict(a.get("scalar")).get("value", 0.0))
        return str(int(v)) if v.is_integer() else repr(v)
    if t == "RANGES":
        return ",".join(f"[{int(r['begin'])}-{int(r['end'])}]" for r in _list(_dict(a.get("ranges")).get("range")))
    if t == "SET":
        return ",".join(str(x) for x in _list(_dict(a.get("set")).get("item")))
    return ""


def _quantity(value: Any, name: str) -> float:
    """A scalar resource as the master sends it; ValueError (the offer is dropped) unless it is a finite number
    between 0 and MAX_SCALAR (gpus: MAX_GPUS_PER_AGENT), so nothing odd reaches placement."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name}: not a number: {value!r}")
    v = float(value)
    limit = MAX_GPUS_PER_AGENT if name == "gpus" else MAX_SCALAR
    if not math.isfinite(v) or v < 0 or v > limit:
        raise ValueError(f"{name}: {v} is not a quantity between 0 and {limit:g}")
    return v


def _port_range(r: Any) -> tuple[int, int]:
    b, e = _dict(r).get("begin"), _dict(r).get("end")
    if not (isinstance(b, int) and isinstance(e, int)) or isinstance(b, bool) or isinstance(e, bool) \
            or not 1 <= b <= e <= 65535:
        raise ValueError(f"ports: {b!r}-{e!r} is not a range of ports 1-65535")
    return b, e


def parse_offer(o: Mapping[str, Any]) -> Offer:
    """One Offer JSON object -> Offer. Raises KeyError/ValueError/TypeError when id or agent_id is missing, or a
    quantity or port range is not one (parse_event then drops this offer and keeps the others)."""
    offer_id = _id(o["id"])
    agent_id = _id(o["agent_id"])
    if not offer_id or not agent_id:
        raise ValueError("offer without id or agent_id")
    role = str(_dict(o.get("allocation_info")).get("role", "") or "")
    scalars: dict[str, float] = {}
    ports: list[tuple[int, int]] = []
    raw_resources: list[JSON] = []
    for r in _list(o.get("resources")):
        if not isinstance(r, Mapping):
            continue
        raw_resources.append(dict(r))
        if not _unreserved(r):
            continue  # members launch on unreserved resources only (calls.task_resources): these are not ours to use
        name = str(r.get("name", ""))
        kind = r.get("type")
        if kind == "SCALAR":
            # the total is checked too: several entries of one resource (one per role, or a hostile master's)
            # must not add up past the bound each one is held to
            scalars[name] = _quantity(scalars.get(name, 0.0) + _quantity(_dict(r.get("scalar")).get("value", 0.0),
                                                                          name), name)
        elif kind == "RANGES" and name == "ports":
            ports += [_port_range(x) for x in _list(_dict(r.get("ranges")).get("range"))]
        if not role:
            role = str(_dict(r.get("allocation_info")).get("role", "") or "")
    url = _dict(o.get("url"))
    address = _dict(url.get("address"))
    fault = _dict(_dict(o.get("domain")).get("fault_domain"))
    domain = {k: str(_dict(fault.get(k)).get("name", "")) for k in ("region", "zone") if k in fault}
    attributes: dict[str, str] = {}
    for a in _list(o.get("attributes")):
        if isinstance(a, Mapping) and "name" in a:
            attributes[str(a["name"])] = attribute_value(a)
    hostname = str(o.get("hostname") or address.get("hostname") or "")
    return Offer(
        id=offer_id,
        agent_id=agent_id,
        hostname=hostname,
        framework_id=_id(o.get("framework_id")),
        role=role or "*",
        # Scalars are fixed-point with 3 decimals on the master: round away float noise from summing.
        cpus=round(scalars.get("cpus", 0.0), 3),
        mem=round(scalars.get("mem", 0.0), 3),
        disk=round(scalars.get("disk", 0.0), 3),
        gpus=round(scalars.get("gpus", 0.0), 3),
        ports=tuple(sorted(ports)),
        attributes=attributes,
        agent_address=str(address.get("ip") or address.get("hostname") or hostname),
        agent_port=int(address.get("port", 0) or 0),
        executor_ids=tuple(_id(e) for e in _list(o.get("executor_ids")) if _id(e)),
        domain=domain,
        has_unavailability="unavailability" in o,
        unavailable_at=_window_start(o.get("unavailability")),
        resources=tuple(raw_resources),
    )


def _unreserved(r: Mapping[str, Any]) -> bool:
    """An offered resource a task may claim as unreserved (`"role": "*"`, as calls.task_resources does): not
    reserved for a role (old format `role` other than "*" or a `reservation`; refined format a non-empty
    `reservations`), not revocable, not shared. Counting a reserved one would plan members onto resources their
    launch cannot claim (the master answers TASK_ERROR, and the gang fails)."""
    if str(r.get("role", "*") or "*") != "*" or r.get("reservation") or _list(r.get("reservations")):
        return False
    return "revocable" not in r and "shared" not in r


def _window_start(u: Any) -> float | None:
    """A maintenance window's start (Unix seconds) from `unavailability: {start: {nanoseconds}}`; None if none."""
    ns = _dict(_dict(u).get("start")).get("nanoseconds")
    if isinstance(ns, bool) or not isinstance(ns, (int, float, str)):
        return None
    try:
        return int(ns) / 1e9
    except ValueError:
        return None


def parse_task_status(s: Mapping[str, Any]) -> MesosTaskStatus:
    task_id = _id(s["task_id"])
    if not task_id:
        raise ValueError("status without task_id")
    uuid = s.get("uuid")
    ts = s.get("timestamp")
    healthy = s.get("healthy")
    unreachable = _dict(s.get("unreachable_time")).get("nanoseconds")
    return MesosTaskStatus(
        task_id=task_id,
        state=str(s.get("state", "")),
        agent_id=_opt_id(s.get("agent_id")),
        executor_id=_opt_id(s.get("executor_id")),
        source=str(s["source"]) if "source" in s else None,
        reason=str(s["reason"]) if "reason" in s else None,
        message=str(s.get("message", "")),
        uuid=uuid if isinstance(uuid, str) and uuid else None,
        timestamp=float(ts) if isinstance(ts, (int, float)) else None,
        healthy=healthy if isinstance(healthy, bool) else None,
        data=str(s["data"]) if "data" in s else None,
        unreachable_time_ns=int(unreachable) if isinstance(unreachable, (int, float, str)) else None,
        raw=dict(s),
    )


def _parse_master_info(m: Mapping[str, Any]) -> MasterInfo:
    address = _dict(m.get("address"))
    return MasterInfo(
        id=str(m.get("id", "")),
        hostname=str(address.get("hostname") or m.get("hostname") or ""),
        ip=str(address.get("ip", "")),
        port=int(address.get("port") or m.get("port") or 0),
        version=str(m.get("version", "")),
    )


def parse_event(event: Any) -> Event:
    """One decoded stream record -> a typed event. Never raises: anything odd becomes Unknown."""
    if not isinstance(event, Mapping):
        return Unknown(type="", raw=event, error="event is not a JSON object")
    kind = str(event.get("type", ""))
    try:
        if kind == "SUBSCRIBED":
            sub = _dict(event["subscribed"])
            fid = _id(sub["framework_id"])
            if not fid:
                raise ValueError("SUBSCRIBED without framework_id")
            return Subscribed(
                framework_id=fid,
                heartbeat_interval_s=float(sub.get("heartbeat_interval_seconds", 15.0)),
                master_info=_parse_master_info(_dict(sub.get("master_info"))),
            )
        if kind == "HEARTBEAT":
            return Heartbeat()
        if kind == "OFFERS":
            # The key is doubled: event["offers"]["offers"]. One bad offer does not hide the others.
            offers = []
            for raw in _list(_dict(event.get("offers")).get("offers")):
                try:
                    offers.append(parse_offer(raw))
                except (KeyError, ValueError, TypeError):
                    continue
            return Offers(tuple(offers))
        if kind == "RESCIND":
            return Rescind(offer_id=_id(_dict(event["rescind"])["offer_id"]))
        if kind == "UPDATE":
            return Update(status=parse_task_status(_dict(_dict(event["update"])["status"])))
        if kind == "FAILURE":
            f = _dict(event.get("failure"))
            st = f.get("status")
            return Failure(
                agent_id=_opt_id(f.get("agent_id")),
                executor_id=_opt_id(f.get("executor_id")),
                status=int(st) if isinstance(st, (int, float)) else None,
            )
        if kind == "MESSAGE":
            m = _dict(event.get("message"))
            return Message(agent_id=_opt_id(m.get("agent_id")), executor_id=_opt_id(m.get("executor_id")),
                           data=str(m.get("data", "")))
        if kind == "ERROR":
            # Nested under "error" (the upstream docs' top-level "message" is wrong); accept both.
            msg = _dict(event.get("error")).get("message", event.get("message", ""))
            return Error(message=str(msg))
        if kind == "INVERSE_OFFERS":
            items = []
            for io in _list(_dict(event.get("inverse_offers")).get("inverse_offers")):
                io = _dict(io)
                start = _window_start(io.get("unavailability"))
                if _id(io.get("id")) and _id(io.get("agent_id")) and start is not None:
                    dur = _dict(_dict(io.get("unavailability")).get("duration")).get("nanoseconds")
                    items.append(InverseOffer(_id(io.get("id")), _id(io.get("agent_id")), start,
                                              int(dur) / 1e9 if isinstance(dur, (int, float)) else 0.0))
            return InverseOffers(offers=tuple(items), raw=dict(event))
        if kind == "RESCIND_INVERSE_OFFER":
            return RescindInverseOffer(_id(_dict(event.get("rescind_inverse_offer")).get("inverse_offer_id")))
        if kind == "UPDATE_OPERATION_STATUS":
            st = _dict(_dict(event.get("update_operation_status")).get("status"))
            uuid = _dict(st.get("uuid")).get("value")  # OperationStatus.uuid is a UUID message: {"value": b64}
            return UpdateOperationStatus(
                operation_id=_opt_id(st.get("operation_id")),
                state=str(st.get("state", "")),
                agent_id=_opt_id(st.get("agent_id")),
                uuid=str(uuid) if uuid else None,
                raw=dict(event),
            )
    except (KeyError, ValueError, TypeError) as e:
        return Unknown(type=kind, raw=event, error=f"malformed {kind or 'event'}: {e!r}")
    return Unknown(type=kind, raw=event)
