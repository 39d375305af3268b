"""The sans-IO core of the Mesos v1 scheduler client: subscription state, event handling, call building, and
pure mappings to the project's domain types.

No sockets, threads or clock reads here: the shell (client.py) moves bytes and passes `now` in. Everything the
shell has to decide (what to send, when the stream is dead, where a redirect points, how long to back off)
is a function or method of this module so it can be tested without a network.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import urlsplit

from peloton.domain.placement import HostOffer
from peloton.domain.resources import Resources
from peloton.domain.states import TaskState
from peloton.hostmgr.mesos import calls
from peloton.hostmgr.mesos.calls import JSON, CallError, FrameworkConfig, validate_call
from peloton.hostmgr.mesos.events import (
    Disconnected,
    Error,
    Event,
    Failure,
    Heartbeat,
    InverseOffers,
    MasterInfo,
    MesosTaskStatus,
    Message,
    Offer,
    Offers,
    Rescind,
    RescindInverseOffer,
    Subscribed,
    SubscribeRefused,
    Unknown,
    Update,
    UpdateOperationStatus,
    parse_event,
    parse_offer,
    parse_task_status,
)
from peloton.retry import Backoff

__all__ = [
    "API_PATH",
    "CallError",
    "DEFAULT_HEARTBEAT_S",
    "Disconnected",
    "Error",
    "Event",
    "Failure",
    "FrameworkConfig",
    "Heartbeat",
    "InverseOffers",
    "MAX_PORTS_PER_OFFER",
    "MasterInfo",
    "Message",
    "MesosTaskStatus",
    "Offer",
    "Offers",
    "Rescind",
    "RescindInverseOffer",
    "SchedulerProtocol",
    "SubscribeRefused",
    "Subscribed",
    "CALL_503_BACKOFF",
    "CALL_LANES",
    "TERMINAL_STATES",
    "call_lane",
    "Unknown",
    "Update",
    "UpdateOperationStatus",
    "exit_code",
    "failure_exit_code",
    "is_terminal",
    "master_base",
    "mesos_state_to_task_state",
    "offers_to_host_offer",
    "parse_event",
    "parse_offer",
    "parse_task_status",
    "redirect_base",
    "validate_call",
]

API_PATH = "/api/v1/scheduler"
DEFAULT_HEARTBEAT_S = 15.0  # fixed on the master; the SUBSCRIBED event carries the real value
MAX_PORTS_PER_OFFER = 1000  # an agent offers [31000-32000] by default; more is never needed for a gang member


class SchedulerProtocol:
    """Subscription state of one framework, and the calls it sends.

    Not thread-safe by itself: the shell's stream thread mutates it through `on_event`/`on_stream_open`/
    `on_disconnected`; other threads only read `framework_id`/`stream_id` (plain attribute reads) and build calls.
    """

    def __init__(self, config: FrameworkConfig, framework_id: str | None = None,
                 heartbeat_miss_factor: float = 5.0) -> None:
        self.config = config
        self.framework_id: str | None = framework_id  # settable: load it from the store before subscribing
        self.stream_id: str | None = None
        self.subscribed = False
        self.heartbeat_interval_s = DEFAULT_HEARTBEAT_S
        self.heartbeat_miss_factor = heartbeat_miss_factor
        self.last_event_at: float | None = None
        self.master_info: MasterInfo | None = None
        # Set by a fatal ERROR ("Framework failed over": another instance took our id, a fence; "Framework has
        # been removed": the id is dead). While set, re-subscribing is pointless: the owner decides.
        self.halted: str | None = None

    # --- subscription -------------------------------------------------------------------------------------------
    def subscribe_call(self) -> JSON:
        return calls.subscribe(self.config, self.framework_id)

    def request_headers(self, subscribe: bool) -> dict[str, str]:
        """Headers of a request (Authorization is added by the shell). Content-Type must be exactly this value;
        a SUBSCRIBE must NOT carry Mesos-Stream-Id, every other call must."""
        h = {"Content-Type": "application/json", "Accept": "application/json"}
        if not subscribe:
            if not self.stream_id:
                raise CallError("no Mesos-Stream-Id: not subscribed")
            h["Mesos-Stream-Id"] = self.stream_id
        return h

    def on_stream_open(self, stream_id: str | None, now: float) -> None:
        """The SUBSCRIBE got 200: remember the stream id (header Mesos-Stream-Id) before any event arrives."""
        self.stream_id = stream_id
        self.subscribed = False
        self.last_event_at = now

    def on_disconnected(self, reason: str, will_retry: bool = True) -> Disconnected:
        self.subscribed = False
        self.stream_id = None
        return Disconnected(reason=reason, will_retry=will_retry and self.halted is None)

    def heartbeat_overdue(self, now: float) -> bool:
        """No event (heartbeats included) for more than miss_factor × interval: the connection is dead even if
        TCP says nothing (a partition leaves it half-open)."""
        if self.last_event_at is None or self.stream_id is None:
            return False
        return now - self.last_event_at > self.read_timeout_s

    @property
    def read_timeout_s(self) -> float:
        """The socket read timeout of the stream."""
        return self.heartbeat_interval_s * self.heartbeat_miss_factor

    def resume(self, forget_framework_id: bool = False) -> None:
        """Clear a halt (after the owner dealt with a fatal ERROR); optionally register anew."""
        self.halted = None
        if forget_framework_id:
            self.framework_id = None

    def on_record(self, record: bytes, now: float) -> list[Event]:
        """One RecordIO payload (UTF-8 JSON) -> typed events. Never raises."""
        try:
            obj = json.loads(record)
        except (ValueError, RecursionError) as e:  # not UTF-8 or JSON, a number too long, nested too deep
            self.last_event_at = now
            return [Unknown(type="", raw=record[:200], error=f"record is not JSON: {e}")]
        return self.on_event(obj, now)

    def on_event(self, event: Any, now: float) -> list[Event]:
        """A decoded stream record -> typed events, updating the subscription state. Never raises."""
        self.last_event_at = now
        ev = parse_event(event)
        if isinstance(ev, Subscribed):
            # The owner must persist ev.framework_id before doing anything else (mesos-api.md §10).
            self.framework_id = ev.framework_id
            self.heartbeat_interval_s = ev.heartbeat_interval_s if ev.heartbeat_interval_s > 0 else DEFAULT_HEARTBEAT_S
            self.master_info = ev.master_info
            self.subscribed = True
            self.halted = None
        elif isinstance(ev, Error):
            self.subscribed = False
            if ev.fatal:
                self.halted = ev.message
        return [ev]

    # --- calls (JSON bodies for MesosClient.call) ---------------------------------------------------------------
    def accept(self, offer_ids: Sequence[str], operations: Sequence[JSON], refuse_seconds: float | None = None) -> JSON:
        return calls.accept(self.framework_id, offer_ids, operations, refuse_seconds)

    def decline(self, offer_ids: Sequence[str], refuse_seconds: float | None = None) -> JSON:
        return calls.decline(self.framework_id, offer_ids, refuse_seconds)

    def kill(self, task_id: str, agent_id: str | None = None, grace_period_s: float | None = None) -> JSON:
        return calls.kill(self.framework_id, task_id, agent_id, grace_period_s)

    def answer_inverse_offers(self, ids: Sequence[str], *, vacated: bool, refuse_seconds: float | None = None) -> JSON:
        return calls.inverse_offers(self.framework_id, ids, accept=vacated, refuse_seconds=refuse_seconds)

    def acknowledge(self, agent_id: str, task_id: str, uuid: str) -> JSON:
        return calls.acknowledge(self.framework_id, agent_id, task_id, uuid)

    def acknowledge_update(self, status: MesosTaskStatus) -> JSON | None:
        """The ACKNOWLEDGE for an update, or None when it must not be acknowledged (no uuid: master-generated)."""
        if not status.uuid or not status.agent_id:
            return None
        return self.acknowledge(status.agent_id, status.task_id, status.uuid)

    def reconcile(self, tasks: Sequence[tuple[str, str | None]] = ()) -> JSON:
        return calls.reconcile(self.framework_id, tasks)

    def revive(self, roles: Sequence[str] | None = None) -> JSON:
        return calls.revive(self.framework_id, roles)

    def suppress(self, roles: Sequence[str] | None = None) -> JSON:
        return calls.suppress(self.framework_id, roles)

    def teardown(self) -> JSON:
        return calls.teardown(self.framework_id)

    def shutdown(self, executor_id: str, agent_id: str) -> JSON:
        return calls.shutdown(self.framework_id, executor_id, agent_id)


# --- pure helpers for the shell ---------------------------------------------------------------------------------


def master_base(master: str) -> str:
    """"m1:5050" / "http://m1:5050/" / "http://m1:5050/api/v1/scheduler" -> "http://m1:5050"."""
    text = master.strip()
    if "://" not in text:
        text = "http://" + text.lstrip("/")
    u = urlsplit(text)
    if not u.hostname:
        raise ValueError(f"not a master address: {master!r}")
    return f"{u.scheme}://{u.netloc}"


def redirect_base(current: str, location: str) -> str:
    """A 307 Location is protocol-relative (`//leader:5050/api/v1/scheduler`): prefix the current scheme."""
    loc = location.strip()
    if not loc:
        raise ValueError("307 without a Location")
    scheme = urlsplit(current).scheme or "http"
    if loc.startswith("//"):
        loc = f"{scheme}:{loc}"
    elif "://" not in loc:
        loc = f"{scheme}://{loc}"  # "host:port" as the upstream docs (wrongly) show it
    return master_base(loc)


# A call the master answered 503 (it is busy or electing) is tried again after this back-off (the shared policy,
# peloton.retry: pure, as this module is); re-subscribing uses the same policy between the client's bounds.
CALL_503_BACKOFF = Backoff(0.1, 2.0)

# Which lane a call goes on. Calls of one lane reach the master in the order they were made: the shell sends
# them one at a time, each after the previous one's answer (the master applies calls in the order it gets them,
# and across connections nothing orders them, shared/mesos-api.md §3). Lanes go concurrently, on connections of
# their own, so a slow call holds up only the calls that must follow it.
# - "offers": what the master offers us and runs for us. REVIVE lifts a SUPPRESS and clears the filters that
#   DECLINE and ACCEPT set: each must land after the ones made before it, or the framework stays suppressed or
#   filtered; a KILL made after the ACCEPT that launched its task must not overtake it (the master, not knowing
#   the task yet, would answer TASK_GONE and then start it).
# - "acks": the master applies only the acknowledgement of a task's oldest unacknowledged update; one overtaken
#   by a later one is ignored and that update sent again after a back-off.
# - "queries": reconciliation and the rest, which change nothing the other lanes depend on.
CALL_LANES: dict[str, str] = {
    "ACKNOWLEDGE": "acks", "ACKNOWLEDGE_OPERATION_STATUS": "acks",
    "RECONCILE": "queries", "RECONCILE_OPERATIONS": "queries", "MESSAGE": "queries",
}


def call_lane(call_type: str) -> str:
    """The lane of a call type (see CALL_LANES); anything else, order-sensitive or not known to be otherwise,
    goes on "offers"."""
    return CALL_LANES.get(call_type, "offers")


# --- task states ------------------------------------------------------------------------------------------------

# Terminal per protobuf::isTerminalState. TASK_LOST and TASK_GONE_BY_OPERATOR are terminal yet may come back
# RUNNING if the agent returns; TASK_UNREACHABLE and TASK_UNKNOWN are NOT terminal (the task may still run).
TERMINAL_STATES = frozenset({
    "TASK_FINISHED", "TASK_FAILED", "TASK_KILLED", "TASK_ERROR", "TASK_LOST", "TASK_DROPPED", "TASK_GONE",
    "TASK_GONE_BY_OPERATOR",
})

_STATE_MAP: dict[str, TaskState] = {
    "TASK_STAGING": TaskState.STARTING,
    "TASK_STARTING": TaskState.STARTING,
    "TASK_RUNNING": TaskState.RUNNING,
    "TASK_KILLING": TaskState.KILLING,
    "TASK_FINISHED": TaskState.SUCCEEDED,
    "TASK_FAILED": TaskState.FAILED,
    "TASK_ERROR": TaskState.FAILED,
    "TASK_KILLED": TaskState.KILLED,
    "TASK_LOST": TaskState.LOST,
    "TASK_DROPPED": TaskState.LOST,
    "TASK_GONE": TaskState.LOST,
    "TASK_GONE_BY_OPERATOR": TaskState.LOST,
    "TASK_UNREACHABLE": TaskState.LOST,
    "TASK_UNKNOWN": TaskState.LOST,
}


def mesos_state_to_task_state(state: str) -> TaskState:
    """Mesos TaskState name -> ours. UNREACHABLE/UNKNOWN map to LOST (a gang member we cannot reach is a failed
    member) although Mesos does not call them terminal: kill the task if it comes back. Raises ValueError on a
    name Mesos does not define."""
    try:
        return _STATE_MAP[state]
    except KeyError:
        raise ValueError(f"unknown Mesos task state {state!r}") from None


def is_terminal(state: str) -> bool:
    """Terminal in Mesos' sense (§7.1). Unknown names are not terminal."""
    return state in TERMINAL_STATES


def exit_code(status: MesosTaskStatus) -> int | None:
    """The task's exit code when the update says it: 0 for FINISHED, N from "Command exited with status N"."""
    if status.state == "TASK_FINISHED":
        return 0
    marker = "exited with status "
    i = status.message.find(marker)
    if i >= 0:
        digits = ""
        for ch in status.message[i + len(marker):]:
            if not ch.isdigit():
                break
            digits += ch
        if digits:
            return int(digits)
    return None


def failure_exit_code(failure: Failure) -> int | None:
    """FAILURE.status is a raw waitpid status: the exit code, or -signal when a signal ended the executor."""
    s = failure.status
    if s is None or s < 0:
        return None
    if s & 0x7F == 0:
        return (s >> 8) & 0xFF
    return -(s & 0x7F)


# --- offers -> domain -------------------------------------------------------------------------------------------


def _flatten(ranges: Iterable[tuple[int, int]], limit: int) -> list[int]:
    out: list[int] = []
    for begin, end in ranges:
        for p in range(begin, end + 1):
            if len(out) >= limit:
                return out
            out.append(p)
    return out


def offers_to_host_offer(hostname: str, offers: Sequence[Offer], max_ports: int = MAX_PORTS_PER_OFFER,
                         capacity: Resources | None = None, has_gpus: bool | None = None) -> HostOffer:
    """Several offers of ONE agent and ONE role (an agent's free resources may be split over offers) summed into
    one HostOffer. `hostname` is the caller's unique name for the agent: several agents can share a hostname
    (all three in the recorded cluster are 127.0.0.1). GPU ids are 0..n-1 placeholders: Mesos picks the
    physical GPUs. Labels are the agent attributes."""
    if not offers:
        raise ValueError("no offers")
    agents = {o.agent_id for o in offers}
    roles = {o.role for o in offers}
    if len(agents) != 1 or len(roles) != 1:
        raise ValueError(f"offers of one agent and one role only, got agents {agents} roles {roles}")
    cpu = round(sum(o.cpus for o in offers), 3)
    mem = round(sum(o.mem for o in offers), 3)
    disk = round(sum(o.disk for o in offers), 3)
    gpus = int(sum(o.gpus for o in offers))
    ports = _flatten(sorted(r for o in offers for r in o.ports), max_ports)
    free = Resources(cpu=cpu, mem=mem, disk=disk, gpu=gpus, ports=len(ports))
    labels: dict[str, str] = {}
    for o in offers:
        labels.update(o.attributes)
    first = offers[0]
    return HostOffer(
        hostname=hostname,
        address=first.agent_address or first.hostname,
        free=free,
        gpu_ids=tuple(range(gpus)),
        ports=tuple(ports),
        labels=labels,
        capacity=capacity if capacity is not None else free,
        has_gpus=has_gpus if has_gpus is not None else gpus > 0,
    )


