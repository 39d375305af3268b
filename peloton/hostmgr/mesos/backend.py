"""The `mesos` cluster backend: a framework on a Mesos master, behind the same Backend interface as `local`.

Shell around plain-data pieces (offers.py, the protocol core): it keeps the offer pool per agent, launches a
gang with one ACCEPT per agent (all members' ids were committed by jobmgr first), turns status updates into
TaskStatus (acknowledged only after jobmgr persisted them), re-sends kills until a terminal update arrives,
reconciles after every SUBSCRIBED, and suppresses offers while nothing is pending.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from peloton.domain.placement import HostOffer
from peloton.domain.resources import Resources
from peloton.domain.states import TaskState
from peloton.errors import FailedPrecondition
from peloton.hostmgr.backend import HostInfo, LaunchError, LaunchSpec, StatusCallback, TaskStatus
from peloton.hostmgr.mesos.offers import AgentView, ParsedOffer, covers, flatten_ports, parse_offer, task_resources

log = logging.getLogger(__name__)

# Mesos task state -> ours. UNREACHABLE is not terminal in Mesos, but a gang member that cannot be reached is
# a failed member: the gang is torn down (and the member killed if it comes back).
STATE_MAP = {
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
    "TASK_UNREACHABLE": TaskState.LOST,
    "TASK_GONE": TaskState.LOST,
    "TASK_GONE_BY_OPERATOR": TaskState.LOST,
    "TASK_UNKNOWN": TaskState.LOST,
}
MESOS_TERMINAL = {"TASK_FINISHED", "TASK_FAILED", "TASK_ERROR", "TASK_KILLED", "TASK_LOST", "TASK_DROPPED",
                  "TASK_GONE", "TASK_GONE_BY_OPERATOR"}
_EXIT = re.compile(r"exited with status (\d+)")


class Transport(Protocol):
    """The streaming HTTP shell as the backend needs it."""

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def call(self, body: dict[str, Any]) -> None:
        """Send one non-SUBSCRIBE call; raise on a non-2xx answer or a transport error."""


@dataclass
class MesosOptions:
    framework_name: str = "peloton"
    user: str = "root"
    role: str = "*"
    principal: str = ""
    failover_timeout_s: float = 7 * 24 * 3600.0
    offer_hold_s: float = 120.0  # decline offers held this long without demand
    idle_suppress_s: float = 30.0  # SUPPRESS after this long without demand
    kill_retry_s: float = 5.0
    reconcile_wait_s: float = 10.0  # how long reconcile() waits for answers
    implicit_reconcile_s: float = 900.0
    refuse_seconds: float = 1.0


@dataclass(slots=True)
class _Task:
    task_id: str
    agent_id: str
    resources: Resources = Resources()
    state: str = "TASK_STAGING"
    updated_at: float = 0.0
    kill_sent_at: float | None = None


@dataclass(slots=True)
class _Reconciliation:
    started: float
    pending: set[str] = field(default_factory=set)
    next_send: float = 0.0
    backoff: float = 2.0


class MesosBackend:
    def __init__(
        self,
        opts: MesosOptions,
        transport_factory: Callable[[Callable[[], dict[str, Any]], Callable[[dict[str, Any]], None]], Transport],
        load_framework_id: Callable[[], str | None],
        save_framework_id: Callable[[str | None], None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.opts = opts
        self.clock = clock
        self._load_fid = load_framework_id
        self._save_fid = save_framework_id
        self.framework_id: str | None = load_framework_id()
        self._transport = transport_factory(self.subscribe_call, self._on_event)
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._on_status: StatusCallback | None = None
        self._agents: dict[str, AgentView] = {}  # agent id -> view
        self._tasks: dict[str, _Task] = {}
        self._answers: dict[str, tuple[float, TaskStatus]] = {}  # task id -> (arrival, latest status)
        self.subscribed = False
        self.suppressed = False
        self._last_demand = 0.0
        self._reconciliation: _Reconciliation | None = None
        self._last_implicit = 0.0
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    # --- framework identity ---------------------------------------------------------------------------------
    def subscribe_call(self) -> dict[str, Any]:
        o = self.opts
        info: dict[str, Any] = {
            "user": o.user,
            "name": o.framework_name,
            "roles": [o.role],
            "failover_timeout": o.failover_timeout_s,
            "checkpoint": True,
            "capabilities": [{"type": t} for t in
                             ("MULTI_ROLE", "GPU_RESOURCES", "PARTITION_AWARE", "TASK_KILLING_STATE")],
        }
        if o.principal:
            info["principal"] = o.principal
        body: dict[str, Any] = {"type": "SUBSCRIBE", "subscribe": {"framework_info": info}}
        if self.framework_id:
            info["id"] = {"value": self.framework_id}
            body["framework_id"] = {"value": self.framework_id}
        return body

    def _call(self, type_: str, payload: dict[str, Any] | None = None) -> bool:
        if not self.framework_id:
            return False
        body: dict[str, Any] = {"type": type_, "framework_id": {"value": self.framework_id}}
        if payload is not None:
            body[type_.lower()] = payload
        try:
            self._transport.call(body)
            return True
        except Exception as e:  # noqa: BLE001 - a failed call is retried by the loop that needs it
            log.warning("mesos %s failed: %s", type_, e)
            return False

    # --- Backend interface ----------------------------------------------------------------------------------
    def start(self, on_status: StatusCallback) -> None:
        self._on_status = on_status
        self._transport.start()
        self._ticker = threading.Thread(target=self._tick_loop, name="mesos-ticker", daemon=True)
        self._ticker.start()

    def stop(self) -> None:
        self._stop.set()
        self._transport.stop()
        if self._ticker is not None:
            self._ticker.join(5)

    def _host_name(self, a: AgentView) -> str:
        """Hostname when it names one agent; hostname:port when several agents share it (one machine)."""
        same = [x for x in self._agents.values() if x.hostname == a.hostname]
        return a.hostname if len(same) <= 1 else f"{a.hostname}:{a.agent_port}"

    def _agent_by_name(self, name: str) -> AgentView | None:
        """An agent that re-registered under a new id shares its name with the stale view: prefer the live one."""
        fallback = None
        for a in self._agents.values():
            if self._host_name(a) == name:
                if a.offers and a.reachable:
                    return a
                fallback = fallback or a
        return fallback

    def offers(self) -> list[HostOffer]:
        now = self.clock()
        with self._lock:
            self._last_demand = now
            revive = self.suppressed and self.subscribed
            out = []
            for a in self._agents.values():
                if not a.offers or not a.reachable:
                    continue
                free, ports = a.free()
                out.append(HostOffer(
                    hostname=self._host_name(a), address=a.hostname, free=free, gpu_ids=tuple(range(free.gpu)),
                    ports=tuple(ports), labels={**a.attributes, "host": a.hostname}, capacity=a.capacity,
                    has_gpus=a.has_gpus,
                ))
        if revive and self._call("REVIVE", {"roles": [self.opts.role]}):
            with self._lock:
                self.suppressed = False
        return out

    def hosts(self) -> list[HostInfo]:
        with self._lock:
            out = []
            for a in self._agents.values():
                mine = [t for t in self._tasks.values() if t.agent_id == a.agent_id and t.state not in MESOS_TERMINAL]
                alloc = Resources()
                for t in mine:
                    alloc = alloc + t.resources
                out.append(HostInfo(
                    hostname=self._host_name(a), address=a.hostname, capacity=a.capacity, allocated=alloc,
                    labels=dict(a.attributes), state="UP" if a.reachable else "UNREACHABLE",
                    task_ids=tuple(sorted(t.task_id for t in mine)),
                ))
            return out

    def launch(self, tasks: Sequence[LaunchSpec]) -> None:
        """One ACCEPT per agent, with every member placed there. A rejected call leaves that agent's members in
        an unknown state: every member already sent is killed and LaunchError raised. Rejections the master
        reports later (TASK_DROPPED/ERROR) arrive as status updates and fail the gang there."""
        calls: list[tuple[AgentView, list[LaunchSpec], dict[str, Any]]] = []
        with self._lock:
            if not self.subscribed:
                raise LaunchError(tasks[0].task_id, "not subscribed to a Mesos master")
            by_agent: dict[str, list[LaunchSpec]] = {}
            for t in tasks:
                a = self._agent_by_name(t.hostname)
                if a is None:
                    raise LaunchError(t.task_id, f"agent {t.hostname} is not known (no offers)")
                by_agent.setdefault(a.agent_id, []).append(t)
            for agent_id, members in by_agent.items():
                a = self._agents[agent_id]
                demand = Resources()
                ports: list[int] = []
                for m in members:
                    demand = demand + m.resources
                    ports += m.ports
                why = covers(a, Resources(demand.cpu, demand.mem, demand.disk, demand.gpu, 0), ports)
                if why:
                    raise LaunchError(members[0].task_id, why)
            now = self.clock()
            for agent_id, members in by_agent.items():
                a = self._agents[agent_id]
                role = next(iter(a.offers.values())).role
                offer_ids = [{"value": oid} for oid in a.offers]
                a.offers = {}  # used: the remainder comes back from the master
                infos = [self._task_info(a, role, m) for m in members]
                for m in members:
                    self._tasks[m.task_id] = _Task(m.task_id, a.agent_id, m.resources, "TASK_STAGING", now)
                calls.append((a, members, {
                    "offer_ids": offer_ids,
                    "operations": [{"type": "LAUNCH", "launch": {"task_infos": infos}}],
                    "filters": {"refuse_seconds": self.opts.refuse_seconds},
                }))
        sent: list[LaunchSpec] = []
        for a, members, accept in calls:
            if not self._call("ACCEPT", accept):
                self.kill([m.task_id for m in sent + members])
                raise LaunchError(members[0].task_id, f"ACCEPT on agent {a.hostname} failed")
            sent += members

    def _task_info(self, a: AgentView, role: str, m: LaunchSpec) -> dict[str, Any]:
        env = dict(m.env)
        command = m.command
        if "hostfile" in m.files:
            # Mesos has no way to drop a file in the sandbox: the command writes it before it starts
            env["PELOTON_HOSTFILE_CONTENT"] = m.files["hostfile"]
            command = ('printf "%s" "$PELOTON_HOSTFILE_CONTENT" > "$MESOS_SANDBOX/hostfile" && '
                       'export PELOTON_HOSTFILE="$MESOS_SANDBOX/hostfile" && ' + command)
        info: dict[str, Any] = {
            "name": f"{m.job_id}-{m.instance}",
            "task_id": {"value": m.task_id},
            "agent_id": {"value": a.agent_id},
            "resources": task_resources(role, m.resources, m.ports),
            "command": {
                "shell": True,
                "value": command,
                "environment": {"variables": [{"name": k, "value": v} for k, v in sorted(env.items())]},
            },
            "labels": {"labels": [{"key": "peloton_job", "value": m.job_id},
                                  {"key": "peloton_attempt", "value": str(m.attempt)}]},
        }
        if m.container_image:
            info["container"] = {"type": "MESOS",
                                 "mesos": {"image": {"type": "DOCKER", "docker": {"name": m.container_image}}}}
        return info

    def kill(self, task_ids: Sequence[str]) -> None:
        now = self.clock()
        sends = []
        with self._lock:
            for tid in task_ids:
                t = self._tasks.get(tid)
                if t is None:
                    t = self._tasks[tid] = _Task(tid, "", state="TASK_UNKNOWN", updated_at=now)
                if t.state in MESOS_TERMINAL:
                    continue
                t.kill_sent_at = now
                sends.append(t)
        for t in sends:
            self._send_kill(t)

    def _send_kill(self, t: _Task) -> None:
        payload: dict[str, Any] = {"task_id": {"value": t.task_id}}
        if t.agent_id:
            payload["agent_id"] = {"value": t.agent_id}
        self._call("KILL", payload)

    def reconcile(self, task_ids: Sequence[str]) -> dict[str, TaskStatus]:
        """Ask the master about each task and wait (bounded) for its answers. Tasks without an answer are left
        out: the caller keeps what it knew."""
        if not task_ids:
            return {}
        start = self.clock()
        with self._lock:
            payload = {"tasks": [self._reconcile_entry(tid) for tid in task_ids]}
        deadline = time.monotonic() + self.opts.reconcile_wait_s
        self._call("RECONCILE", payload)
        with self._cond:
            while time.monotonic() < deadline:
                if all(tid in self._answers and self._answers[tid][0] >= start for tid in task_ids):
                    break
                self._cond.wait(min(0.5, max(0.0, deadline - time.monotonic())))
            return {tid: self._answers[tid][1] for tid in task_ids
                    if tid in self._answers and self._answers[tid][0] >= start}

    def _reconcile_entry(self, tid: str) -> dict[str, Any]:
        e: dict[str, Any] = {"task_id": {"value": tid}}
        t = self._tasks.get(tid)
        if t is not None and t.agent_id:
            e["agent_id"] = {"value": t.agent_id}
        return e

    def running_task_ids(self) -> set[str]:
        with self._lock:
            return {t.task_id for t in self._tasks.values() if t.state not in MESOS_TERMINAL
                    and t.state != "TASK_UNKNOWN"}

    def acknowledge(self, acks: Sequence[str]) -> None:
        for token in acks:
            agent_id, task_id, uuid = json.loads(token)
            self._call("ACKNOWLEDGE", {"agent_id": {"value": agent_id}, "task_id": {"value": task_id},
                                       "uuid": uuid})

    def read_log(self, task_id: str, stream: str, tail_bytes: int) -> bytes:
        with self._lock:
            t = self._tasks.get(task_id)
            a = self._agents.get(t.agent_id) if t else None
        where = f" on agent {a.hostname}:{a.agent_port}" if a else ""
        raise FailedPrecondition(
            f"logs of Mesos tasks stay in the agent sandbox{where}: use the Mesos UI or the agent's /files API "
            f"(task {task_id}, file {stream or 'stdout'})"
        )

    # --- events from the master -------------------------------------------------------------------------------
    def _on_event(self, ev: dict[str, Any]) -> None:
        kind = ev.get("type")
        now = self.clock()
        if kind == "SUBSCRIBED":
            self._on_subscribed(ev["subscribed"], now)
        elif kind == "OFFERS":
            with self._lock:
                for raw in ev.get("offers", {}).get("offers", []):
                    self._add_offer(parse_offer(raw, now))
        elif kind == "RESCIND":
            oid = ev.get("rescind", {}).get("offer_id", {}).get("value")
            with self._lock:
                for a in self._agents.values():
                    a.offers.pop(oid, None)
        elif kind == "UPDATE":
            self._on_update(ev["update"]["status"], now)
        elif kind == "FAILURE":
            f = ev.get("failure", {})
            if "executor_id" not in f:  # the agent was removed: its offers are dead
                aid = f.get("agent_id", {}).get("value")
                with self._lock:
                    gone = self._agents.get(aid)
                    if gone is not None:
                        gone.offers = {}
                        gone.reachable = False
        elif kind == "ERROR":
            msg = ev.get("error", {}).get("message", "")
            log.error("mesos master: %s", msg)
            if "removed" in msg.lower():
                # the framework id is dead for good (torn down or failover timeout expired): register anew
                log.error("framework %s was removed by the master; registering as a new framework", self.framework_id)
                self.framework_id = None
                self._save_fid(None)
            self._disconnected()
        elif kind == "DISCONNECTED":
            self._disconnected()

    def _disconnected(self) -> None:
        with self._lock:
            self.subscribed = False
            for a in self._agents.values():
                a.offers = {}

    def _on_subscribed(self, sub: dict[str, Any], now: float) -> None:
        fid = sub["framework_id"]["value"]
        if fid != self.framework_id:
            self._save_fid(fid)  # before anything else: a restart must come back as this framework
            self.framework_id = fid
        with self._lock:
            self.subscribed = True
            self.suppressed = False
            for a in self._agents.values():
                a.offers = {}  # the master discarded them without RESCIND
            live = {tid for tid, t in self._tasks.items() if t.state not in MESOS_TERMINAL}
            self._reconciliation = _Reconciliation(started=now, pending=live, next_send=now)
        log.info("subscribed to mesos as framework %s; reconciling %d tasks", fid, len(live))

    def _add_offer(self, o: ParsedOffer) -> None:
        a = self._agents.get(o.agent_id)
        if a is None:
            a = self._agents[o.agent_id] = AgentView(o.agent_id, o.hostname, o.agent_port, dict(o.attributes))
        a.attributes = dict(o.attributes)
        a.reachable = True
        a.offers[o.offer_id] = o
        free, _ = a.free()
        mine = Resources()
        for t in self._tasks.values():
            if t.agent_id == a.agent_id and t.state not in MESOS_TERMINAL:
                mine = mine + t.resources
        seen = Resources(free.cpu + mine.cpu, free.mem + mine.mem, free.disk + mine.disk, free.gpu + mine.gpu,
                         len(flatten_ports(r for x in a.offers.values() for r in x.ports)) + mine.ports)
        c = a.capacity
        a.capacity = Resources(max(c.cpu, seen.cpu), max(c.mem, seen.mem), max(c.disk, seen.disk),
                               max(c.gpu, seen.gpu), max(c.ports, seen.ports))
        a.has_gpus = a.has_gpus or o.gpus > 0

    def _on_update(self, s: dict[str, Any], now: float) -> None:
        tid = s["task_id"]["value"]
        state = s.get("state", "TASK_UNKNOWN")
        agent_id = s.get("agent_id", {}).get("value", "")
        uuid = s.get("uuid")
        reason = s.get("reason", "")
        message = s.get("message", "")
        with self._cond:
            t = self._tasks.get(tid)
            if t is None:
                t = self._tasks[tid] = _Task(tid, agent_id)
            t.agent_id = agent_id or t.agent_id
            t.state = state
            t.updated_at = now
            if state in MESOS_TERMINAL or state == "TASK_UNKNOWN":
                t.kill_sent_at = None  # ended, or the master never knew it: nothing left to kill
            a = self._agents.get(t.agent_id)
            host = self._host_name(a) if a else ""
            exit_code = None
            if state == "TASK_FINISHED":
                exit_code = 0
            elif state == "TASK_FAILED" and (m := _EXIT.search(message)):
                exit_code = int(m.group(1))
            st = TaskStatus(
                task_id=tid, state=STATE_MAP.get(state, TaskState.LOST), time=now, hostname=host,
                exit_code=exit_code, reason=f"{state}{': ' + reason if reason else ''}", message=message,
                ack=json.dumps([agent_id, tid, uuid]) if uuid else "", permanent=state == "TASK_ERROR",
            )
            self._answers[tid] = (now, st)
            if self._reconciliation is not None:
                self._reconciliation.pending.discard(tid)
            self._cond.notify_all()
        if self._on_status is not None:
            self._on_status(st)

    # --- periodic duties ------------------------------------------------------------------------------------
    def _tick_loop(self) -> None:
        while not self._stop.wait(0.5):
            try:
                self.tick()
            except Exception:
                log.exception("mesos backend tick failed")

    def tick(self) -> None:
        now = self.clock()
        decline: list[str] = []
        kills: list[_Task] = []
        reconcile: list[dict[str, Any]] | None = None
        implicit = False
        suppress = False
        with self._lock:
            if not self.subscribed:
                return
            idle = now - self._last_demand > self.opts.idle_suppress_s
            for a in self._agents.values():
                for oid, o in list(a.offers.items()):
                    if idle or now - o.received_at > self.opts.offer_hold_s:
                        decline.append(oid)
                        del a.offers[oid]
            if idle and not self.suppressed:
                suppress = True
                self.suppressed = True
            for t in self._tasks.values():
                if t.kill_sent_at is not None and now - t.kill_sent_at >= self.opts.kill_retry_s:
                    t.kill_sent_at = now
                    kills.append(t)
            r = self._reconciliation
            if r is not None:
                if not r.pending:
                    self._reconciliation = None
                    implicit = True  # finish with an implicit round: it reveals tasks we do not know
                elif now >= r.next_send:
                    reconcile = [self._reconcile_entry(tid) for tid in sorted(r.pending)]
                    r.next_send = now + r.backoff
                    r.backoff = min(r.backoff * 2, 60.0)
            if now - self._last_implicit >= self.opts.implicit_reconcile_s:
                implicit = True
            if implicit:
                self._last_implicit = now
        if decline:
            self._call("DECLINE", {"offer_ids": [{"value": o} for o in decline],
                                   "filters": {"refuse_seconds": 5.0 if suppress else self.opts.refuse_seconds}})
        if suppress:
            self._call("SUPPRESS", {"roles": [self.opts.role]})
        for t in kills:
            self._send_kill(t)
        if reconcile is not None:
            self._call("RECONCILE", {"tasks": reconcile})
        if implicit:
            self._call("RECONCILE", {"tasks": []})


def make_mesos_backend(settings: Any, sessions: Any) -> MesosBackend:
    """Wire the backend for the daemon: framework id kept in the store's meta table, secret read from a file."""
    from peloton.hostmgr.mesos.transport import MesosTransport
    from peloton.store import repo
    from peloton.store.db import transaction

    key = "mesos.framework_id"

    def load() -> str | None:
        with transaction(sessions) as s:
            return repo.get_meta(s, key) or None

    def save(fid: str | None) -> None:
        with transaction(sessions) as s:
            repo.set_meta(s, key, fid or "")

    secret = ""
    if settings.secret_file:
        with open(settings.secret_file) as f:
            secret = f.read().strip()
    opts = MesosOptions(
        framework_name=settings.framework_name, user=settings.user, role=settings.role,
        principal=settings.principal, failover_timeout_s=settings.failover_timeout_s,
    )

    def transport(subscribe: Callable[[], dict[str, Any]], on_event: Callable[[dict[str, Any]], None]) -> Transport:
        return MesosTransport(settings.masters, subscribe, on_event, principal=settings.principal, secret=secret)

    return MesosBackend(opts, transport, load, save)
