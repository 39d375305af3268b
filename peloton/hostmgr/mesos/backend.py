"""The `mesos` cluster backend: a framework on a Mesos master, behind the same Backend interface as `local`.

A shell around the sans-IO protocol core (protocol.py: events in, call bodies out) and the streaming HTTP shell
(client.py). It keeps the offer pool per agent (offers.py), launches a gang with one ACCEPT per agent (every
member's id was committed by jobmgr first), turns status updates into TaskStatus (acknowledged only after jobmgr
persisted them), re-sends kills until a terminal update arrives, reconciles after every SUBSCRIBED, and
suppresses offers while the resource manager holds no gang (`demand`).
"""

from __future__ import annotations

import collections
import json
import logging
import random
import threading
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from prometheus_client import Counter, Gauge

from peloton.domain import task_identity
from peloton.domain.launch import GangLaunch, HostInfo, LaunchOutcome, LaunchResult, LaunchSpec, RunningTask, TaskStatus
from peloton.domain.placement import HostOffer
from peloton.domain.resources import Resources
from peloton.domain.states import TaskState
from peloton.errors import FailedPrecondition, InvalidArgument
from peloton.hostmgr.backend import HostsCallback, LaunchError, StatusCallback, StatusesCallback
from peloton.hostmgr.mesos import calls, files
from peloton.hostmgr.mesos.calls import CallError, FrameworkConfig
from peloton.hostmgr.mesos.events import (
    Disconnected,
    Error,
    Event,
    Failure,
    InverseOffers,
    Offers,
    Rescind,
    RescindInverseOffer,
    Subscribed,
    Update,
)
from peloton.hostmgr.mesos.files import AgentFiles
from peloton.hostmgr.mesos.offers import AgentView, covers
from peloton.hostmgr.mesos.protocol import SchedulerProtocol, exit_code, is_terminal, mesos_state_to_task_state
from peloton.loop import SYSTEM_CLOCK, Clock, Loop
from peloton.modelaware import metrics
from peloton.retry import Backoff
from peloton.security import run_as

log = logging.getLogger(__name__)

TICK_S = 0.5  # offers held too long are declined, reconciliation advanced, this often
# an ended task (terminal, or unknown to the master) is kept this long: a late kill or reconcile of it is answered
# from it. Then it is forgotten, so that a daemon running for months holds and scans its live tasks, not every task
# it ever ran; its agent is remembered (at most MAX_ENDED_AGENTS, the oldest go first) for `task logs`.
ENDED_KEEP_S = 600.0
MAX_ENDED_AGENTS = 100_000
# explicit reconciliation of the tasks not yet answered is sent again after 2 s, doubling up to 60 s, with jitter
RECONCILE_BACKOFF = Backoff(2.0, 60.0)

CONNECTED = Gauge("peloton_mesos_connected", "1 while subscribed to the Mesos master")
EVENTS = Counter("peloton_mesos_events_total", "Events from the Mesos master (and the stream's ends), by type",
                 ["type"])


class Transport(Protocol):
    """The streaming HTTP shell as the backend needs it (client.MesosClient in the daemon)."""

    protocol: SchedulerProtocol

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def resume(self, forget_framework_id: bool = False) -> None: ...

    def call(self, body: dict[str, Any]) -> Any:
        """Send one non-SUBSCRIBE call; raise on a non-2xx answer or a transport error."""


TransportFactory = Callable[[FrameworkConfig, "str | None", Callable[[Any], None]], Transport]


@dataclass
class MesosOptions:
    framework_name: str = "peloton"
    user: str = "nobody"  # the framework's user: tasks naming no task.user run as it
    role: str = "*"
    principal: str = ""
    failover_timeout_s: float = 7 * 24 * 3600.0
    offer_hold_s: float = 120.0  # decline offers held this long
    idle_suppress_s: float = 30.0  # decline everything and SUPPRESS after this long without demand
    # the filter of offers declined while idle: other frameworks get them meanwhile. Any REVIVE clears it, so it
    # delays nothing of ours; it keeps the agents' resources away from us should the SUPPRESS not take
    idle_refuse_s: float = 120.0
    kill_retry_s: float = 5.0
    reconcile_wait_s: float = 10.0  # how long reconcile() waits for answers
    implicit_reconcile_s: float = 900.0
    refuse_seconds: float = 1.0

    def framework_config(self) -> FrameworkConfig:
        return FrameworkConfig(
            name=self.framework_name, user=self.user, roles=(self.role,), principal=self.principal or None,
            failover_timeout_s=self.failover_timeout_s,
        )


@dataclass(slots=True)
class _Task:
    task_id: str
    agent_id: str
    resources: Resources = Resources()
    state: str = "TASK_STAGING"
    updated_at: float = 0.0
    kill_sent_at: float | None = None
    kill_grace: float | None = None  # the kill's grace (a preemption's); sent again with every retry
    # its ACCEPT is not answered yet: it is asked about only after (a RECONCILE on the queries lane could overtake
    # the ACCEPT on the offers lane, and the master answers TASK_GONE for a task it has not seen launched yet)
    accept_pending: bool = False


@dataclass(slots=True)
class _Reconciliation:
    started: float
    pending: set[str] = field(default_factory=set)
    next_send: float = 0.0
    attempt: int = 0  # explicit reconciliations sent so far: the next waits RECONCILE_BACKOFF's delay


def _live(state: str) -> bool:
    return not is_terminal(state) and state != "TASK_UNKNOWN"


def _live_by_agent(tasks: Iterable[_Task]) -> dict[str, list[_Task]]:
    """The live tasks of each agent id, in one pass (in the order given)."""
    out: dict[str, list[_Task]] = {}
    for t in tasks:
        if _live(t.state):
            out.setdefault(t.agent_id, []).append(t)
    return out


class MesosBackend:
    def __init__(
        self,
        opts: MesosOptions,
        transport_factory: TransportFactory,
        load_framework_id: Callable[[], str | None],
        save_framework_id: Callable[[str | None], None],
        clock: Callable[[], float] = time.time,
        agent_files: AgentFiles | None = None,
        loop_clock: Clock = SYSTEM_CLOCK,
        rand: Callable[[], float] = random.random,
    ) -> None:
        """`agent_files`: how task logs are read from the agents' sandboxes (files.py); `loop_clock`: what the
        ticker loop waits on (and health judges it by); `rand`: the draws of the reconciliation back-off's
        jitter."""
        self.opts = opts
        self._rand = rand
        self._files = agent_files or AgentFiles()
        self.clock = clock
        self._save_fid = save_framework_id
        self._saved_fid = load_framework_id()
        self._unsaved_fid: str | None = None  # the id whose save failed last (logged once)
        self._transport = transport_factory(opts.framework_config(), self._saved_fid, self._on_event)
        self.protocol = self._transport.protocol
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._on_status: StatusCallback | None = None
        self._on_hosts_changed: HostsCallback | None = None
        self._agents: dict[str, AgentView] = {}  # agent id -> view (never removed, its hostname never changes)
        self._per_hostname: collections.Counter[str] = collections.Counter()  # hostname -> its agents in _agents
        self._maintenance: dict[str, float] = {}  # agent id -> its maintenance window's start (Unix seconds)
        self._inverse: dict[str, str] = {}  # outstanding (unanswered) inverse offer id -> agent id
        self._tasks: dict[str, _Task] = {}  # live tasks, and ended ones for ENDED_KEEP_S
        self._ended: dict[str, str] = {}  # forgotten task id -> its agent id, oldest first (MAX_ENDED_AGENTS)
        self._answers: dict[str, tuple[float, TaskStatus]] = {}  # task id -> (arrival, latest status)
        self.suppressed = False  # what this backend believes of the master (see `_set_up`)
        # the subscription the ticker acts on: set once SUBSCRIBED has been handled here (its resets done), cleared
        # when the stream ends. The protocol core knows of a subscription earlier (before the framework id is
        # saved): a pass acting in between would send a SUPPRESS that the SUBSCRIBED handling then "resets"
        # (`suppressed` False while the master suppresses us: no REVIVE, no offer ever again)
        self._set_up = False
        self._last_demand = clock()  # a daemon that just started is not idle yet: its first sync may bring demand
        self._reconciliation: _Reconciliation | None = None
        self._last_implicit = 0.0
        # offer and reconciliation timers, as a loop: the daemon's health watches it with its own (hostmgr's)
        self.loops = [Loop("mesos-ticker", self._tick_pass, TICK_S, loop_clock)]
        # the ticker's next pass revives (unless idle by then): demand came while suppressed, or a subscription
        # began (the master may keep the filters of our idle declines across it: a REVIVE clears them)
        self._revive_wanted = False
        self._subscriptions = 0  # SUBSCRIBED handled so far: a SUPPRESS decided on an older one is suspect
        # offers were declined with the idle filter since the last REVIVE: demand revives even if not suppressed
        # (a SUPPRESS that failed), else the filter would keep those agents from a new gang for idle_refuse_s
        self._idle_filtered = False

    @property
    def framework_id(self) -> str | None:
        return self.protocol.framework_id

    @property
    def subscribed(self) -> bool:
        return self.protocol.subscribed

    def subscribe_call(self) -> dict[str, Any]:
        return self.protocol.subscribe_call()

    def _send(self, build: Callable[[], dict[str, Any]]) -> bool:
        """Build a call with the protocol core and send it; False (logged) when there is no framework id yet or the
        call failed. Every caller has a retry path (kills, reconciliation and revive are re-sent by `tick`)."""
        if not self.framework_id:
            return False
        try:
            body = build()
            self._transport.call(body)
            return True
        except Exception as e:  # noqa: BLE001 - a failed call is retried by the loop that needs it
            log.warning("mesos call failed: %s", e)
            return False

    # --- Backend interface ----------------------------------------------------------------------------------
    def start(self, on_status: StatusCallback, on_hosts_changed: HostsCallback | None = None,
              on_statuses: StatusesCallback | None = None) -> None:
        del on_statuses  # updates arrive one at a time from the master
        self._on_status = on_status
        self._on_hosts_changed = on_hosts_changed
        self._transport.start()
        for lp in self.loops:
            lp.start()

    def maintenance(self) -> dict[str, float]:
        with self._lock:
            return {self._host_name(self._agents[aid]): start for aid, start in self._maintenance.items()
                    if aid in self._agents}

    def lead_again(self) -> None:
        """Another daemon subscribed as this framework while it led (the master failed this one's subscription
        over, and it halted): subscribe again with the framework id, which fails that one over in turn."""
        log.warning("leading again: subscribing as framework %s", self.framework_id)
        self._transport.resume()

    def stop(self) -> None:
        for lp in self.loops:
            lp.signal_stop()
        self._transport.stop()
        for lp in self.loops:
            lp.join(5)

    def _host_name(self, a: AgentView) -> str:
        """Hostname when it names one agent; hostname:port when several agents share it (one machine)."""
        return a.hostname if self._per_hostname[a.hostname] <= 1 else f"{a.hostname}:{a.agent_port}"

    def _agent_by_name(self, name: str) -> AgentView | None:
        """An agent that re-registered under a new id shares its name with the stale view: prefer the live one."""
        fallback = None
        for a in self._agents.values():
            if self._host_name(a) == name:
                if a.offers and a.reachable:
                    return a
                fallback = fallback or a
        return fallback

    def _hosts_changed(self, agents: Sequence[AgentView]) -> None:
        """Tell the host manager (called with no lock held)."""
        if self._on_hosts_changed is not None and agents:
            with self._lock:
                names = [self._host_name(a) for a in agents]
            self._on_hosts_changed(names)

    def demand(self) -> None:
        """In-memory only: the host manager calls it under its lock, at each sync while the resource manager
        holds gangs. Demand while suppressed is noted; the ticker sends the REVIVE (within TICK_S)."""
        now = self.clock()
        with self._lock:
            self._last_demand = now
            self._revive_wanted = self._revive_wanted or ((self.suppressed or self._idle_filtered) and self._set_up)

    def offers(self, hostnames: Collection[str] | None = None, *, with_ids: bool = False) -> list[HostOffer]:
        """In-memory only: the host manager calls it under its lock. Not demand: the placement engine syncs every
        poll, idle or not (`demand` is)."""
        with self._lock:
            out = []
            for a in self._agents.values():
                name = self._host_name(a)
                if hostnames is not None and name not in hostnames:
                    continue
                ho = a.host_offer(name) if a.reachable else None
                if ho is not None:
                    out.append(replace(ho, labels={**ho.labels, "host": a.hostname}))
        return out

    def hosts(self) -> list[HostInfo]:
        with self._lock:
            out = []
            live = _live_by_agent(self._tasks.values())  # one pass: O(agents + tasks)
            for a in self._agents.values():
                mine = live.get(a.agent_id, [])
                alloc = Resources()
                for t in mine:
                    alloc = alloc + t.resources
                out.append(HostInfo(
                    hostname=self._host_name(a), address=a.hostname, capacity=a.capacity, allocated=alloc,
                    labels=dict(a.attributes), state="LOST" if a.lost or not a.reachable else "UP",
                    task_ids=tuple(sorted(t.task_id for t in mine)), holds_offer=bool(a.offers),
                ))
            return out

    def launch(self, gangs: Sequence[GangLaunch]) -> list[LaunchResult]:
        """Each gang whole: refused when the offers no longer cover it (nothing sent), failed when an ACCEPT was
        rejected after others of the gang went out (those members are killed)."""
        results = []
        for g in gangs:
            try:
                self._launch_gang(g.tasks)
                results.append(LaunchResult(g.gang_id, g.attempt, LaunchOutcome.OK))
            except _Refused as e:
                results.append(LaunchResult(g.gang_id, g.attempt, LaunchOutcome.REFUSED, e.task_id, e.message))
            except LaunchError as e:
                results.append(LaunchResult(g.gang_id, g.attempt, LaunchOutcome.FAILED, e.task_id, e.message,
                                            e.permanent))
        return results

    def _launch_gang(self, tasks: Sequence[LaunchSpec]) -> None:
        """One ACCEPT per agent, with every member placed there. Nothing is sent unless the pooled offers of every
        agent cover its members (else _Refused). A rejected call leaves that agent's members in an unknown state:
        every member already sent is killed and LaunchError raised. Rejections the master reports later
        (TASK_DROPPED/ERROR) arrive as status updates and fail the gang there."""
        for t in tasks:
            refusal = _user_refusal(t)
            if refusal:
                raise LaunchError(t.task_id, refusal, permanent=True)
        bodies: list[tuple[AgentView, list[LaunchSpec], dict[str, Any]]] = []
        used: list[AgentView] = []
        with self._lock:
            if not self.subscribed:
                raise _Refused(tasks[0].task_id, "not subscribed to a Mesos master")
            if self.framework_id != self._saved_fid:  # a restart would register anew, orphaning what runs under it
                raise _Refused(tasks[0].task_id, f"the framework id {self.framework_id} is not saved yet (store down)")
            by_agent: dict[str, list[LaunchSpec]] = {}
            for t in tasks:
                a = self._agent_by_name(t.hostname)
                if a is None:
                    raise _Refused(t.task_id, f"agent {t.hostname} is not known (no offers)")
                by_agent.setdefault(a.agent_id, []).append(t)
            for agent_id, members in by_agent.items():
                a = self._agents[agent_id]
                demand = Resources()
                ports: list[int] = []
                for m in members:
                    demand = demand + m.resources
                    ports += m.ports
                why = covers(a, demand, ports)
                if why:
                    raise _Refused(members[0].task_id, why)
            now = self.clock()
            # every TaskInfo first: one that cannot be built fails the launch before any agent's offers leave the
            # pool (taken out and never sent, they would never be declined either)
            described: dict[str, list[dict[str, Any]]] = {}
            for agent_id, members in by_agent.items():
                a = self._agents[agent_id]
                role = next(iter(a.offers.values())).role
                try:
                    described[agent_id] = [self._task_info(a, role, m) for m in members]
                except CallError as e:
                    raise LaunchError(members[0].task_id, str(e), permanent=True) from None
            for agent_id, members in by_agent.items():
                a = self._agents[agent_id]
                offer_ids = list(a.offers)
                infos = described[agent_id]
                a.clear()  # used: the remainder comes back from the master
                used.append(a)
                for m in members:
                    self._tasks[m.task_id] = _Task(m.task_id, a.agent_id, m.resources, "TASK_STAGING", now,
                                                   accept_pending=True)
                bodies.append((a, members, self.protocol.accept(offer_ids, [calls.launch(infos)],
                                                                self.opts.refuse_seconds)))
        self._hosts_changed(used)
        sent: list[LaunchSpec] = []
        for i, (a, members, accept) in enumerate(bodies):
            ok = self._send(lambda: accept)  # noqa: B023 - called at once, in this iteration
            with self._lock:  # answered (or failed): the master has it, or never will; it may be asked about
                for m in members if ok else [m for _, rest, _ in bodies[i:] for m in rest]:
                    answered = self._tasks.get(m.task_id)
                    if answered is not None:
                        answered.accept_pending = False
            if not ok:
                self.kill([m.task_id for m in sent + members])
                self._unsend(bodies[i:], [m for _, rest, _ in bodies[i + 1:] for m in rest])
                raise LaunchError(members[0].task_id, f"ACCEPT on agent {a.hostname} failed")
            sent += members

    def _unsend(self, bodies: Sequence[tuple[AgentView, list[LaunchSpec], dict[str, Any]]],
                never_sent: Sequence[LaunchSpec]) -> None:
        """A gang's launch stopped at a failed ACCEPT: the offers taken from the pool for it and not used (the
        failed call's, and those of the agents not reached) are declined, else the master keeps them ours until
        rescinded (never, without --offer_timeout), and the members never sent are dropped from the book, else
        they count as running on their agents until the next SUBSCRIBED. (A DECLINE of an offer the failed call
        did use is ignored by the master.)"""
        offer_ids = [oid["value"] for _, _, body in bodies for oid in body["accept"]["offer_ids"]]
        with self._lock:
            for m in never_sent:
                t = self._tasks.get(m.task_id)
                if t is not None and t.state == "TASK_STAGING" and t.kill_sent_at is None:
                    del self._tasks[m.task_id]
        self._send(lambda: self.protocol.decline(offer_ids, self.opts.refuse_seconds))

    def _task_info(self, a: AgentView, role: str, m: LaunchSpec) -> dict[str, Any]:
        env = dict(m.env)
        command = m.command
        if "hostfile" in m.files:
            # Mesos has no way to drop a file in the sandbox: the command writes it before it starts
            env["PELOTON_HOSTFILE_CONTENT"] = m.files["hostfile"]
            command = ('printf "%s" "$PELOTON_HOSTFILE_CONTENT" > "$MESOS_SANDBOX/hostfile" && '
                       'export PELOTON_HOSTFILE="$MESOS_SANDBOX/hostfile" && ' + command)
        # where the member reports its speed (modelaware/metrics.py); the agent sets MESOS_SANDBOX
        command = f'export PELOTON_METRICS_FILE="$MESOS_SANDBOX/{metrics.FILE_NAME}" && ' + command
        r = m.resources
        return calls.task_info(
            m.task_id, a.agent_id,
            calls.task_resources(r.cpu, r.mem, r.disk, r.gpu, m.ports, role=role),
            calls.command_info(command, dict(sorted(env.items())), user=m.user or self.opts.user),
            name=f"{m.job_id}-{m.instance}",
            image=m.container_image or None,
            labels={"peloton_job": m.job_id, "peloton_attempt": str(m.attempt)},
        )

    def kill(self, task_ids: Sequence[str], grace_s: float | None = None) -> None:
        now = self.clock()
        sends = []
        with self._lock:
            for tid in task_ids:
                t = self._tasks.get(tid)
                if t is None and tid in self._ended:
                    continue  # it ended (and was forgotten): nothing to kill
                if t is None:
                    t = self._tasks[tid] = _Task(tid, "", state="TASK_UNKNOWN", updated_at=now)
                if is_terminal(t.state):
                    continue
                t.kill_sent_at = now
                t.kill_grace = grace_s
                sends.append(t)
        for t in sends:
            # the executor sends SIGTERM, then SIGKILL after the grace (a KillPolicy); absent: the task's own
            self._send(lambda: self.protocol.kill(t.task_id, t.agent_id or None, grace_s))  # noqa: B023

    def reconcile(self, task_ids: Sequence[str]) -> dict[str, TaskStatus]:
        """Ask the master about each task and wait (bounded) for its answers. Tasks without an answer are left
        out: the caller keeps what it knew."""
        if not task_ids:
            return {}
        start = self.clock()
        deadline = time.monotonic() + self.opts.reconcile_wait_s
        with self._cond:
            for tid in task_ids:  # remember them: every SUBSCRIBED reconciles them again until answered
                if tid not in self._tasks:
                    self._tasks[tid] = _Task(tid, self._ended.pop(tid, ""), state="TASK_STAGING", updated_at=start)
            if self._reconciliation is not None:
                self._reconciliation.pending.update(tid for tid in task_ids if tid not in self._answers)
            while not self.subscribed and time.monotonic() < deadline:  # just started: the stream is coming up
                self._cond.wait(0.2)
            # a member whose ACCEPT is on its way is not asked about yet (see _Task.accept_pending): left out of the
            # answer (its caller keeps what it knew), and asked by the ticker once the ACCEPT is answered
            held = [tid for tid in task_ids if self._accept_pending(tid)]
            if held:
                if self._reconciliation is None:
                    self._reconciliation = _Reconciliation(started=start, next_send=start)
                self._reconciliation.pending.update(held)
            asked = [tid for tid in task_ids if tid not in held]
            entries = [self._reconcile_entry(tid) for tid in asked]
        if entries:
            self._send(lambda: self.protocol.reconcile(entries))
        with self._cond:
            while time.monotonic() < deadline:
                if all(tid in self._answers and self._answers[tid][0] >= start for tid in asked):
                    break
                self._cond.wait(min(0.5, max(0.0, deadline - time.monotonic())))
            return {tid: self._answers[tid][1] for tid in asked
                    if tid in self._answers and self._answers[tid][0] >= start}

    def _accept_pending(self, tid: str) -> bool:
        t = self._tasks.get(tid)
        return t is not None and t.accept_pending

    def _forget_locked(self, ended: list[_Task]) -> None:
        for t in ended:
            del self._tasks[t.task_id]
            self._answers.pop(t.task_id, None)
            if t.agent_id:
                self._ended[t.task_id] = t.agent_id
        while len(self._ended) > MAX_ENDED_AGENTS:
            del self._ended[next(iter(self._ended))]

    def _reconcile_entry(self, tid: str) -> tuple[str, str | None]:
        t = self._tasks.get(tid)
        return tid, (t.agent_id or None) if t is not None else None

    def running(self) -> list[RunningTask]:
        with self._lock:
            out = []
            for t in self._tasks.values():
                if _live(t.state):
                    a = self._agents.get(t.agent_id)
                    out.append(RunningTask(t.task_id, self._host_name(a) if a else "", t.resources))
            return out

    def acknowledge(self, acks: Sequence[str]) -> None:
        for token in acks:
            agent_id, task_id, uuid = json.loads(token)
            self._send(lambda: self.protocol.acknowledge(agent_id, task_id, uuid))  # noqa: B023 - called at once

    def remove_sandboxes(self, job_ids: Collection[str]) -> int:
        return 0  # the agents collect their sandboxes themselves (--gc_delay)

    def read_log(self, task_id: str, stream: str, offset: int, max_bytes: int) -> tuple[bytes, int]:
        """From the task's sandbox on its agent, over the agent's files API (files.py)."""
        if stream not in ("stdout", "stderr", "metrics"):
            raise InvalidArgument(f"stream must be stdout or stderr, got {stream!r}", field="stream")
        with self._lock:
            t = self._tasks.get(task_id)
            agent_id = t.agent_id if t is not None else self._ended.get(task_id)
            a = self._agents.get(agent_id) if agent_id else None
            fid = self.framework_id
        if a is None or not fid or not a.agent_port:
            raise FailedPrecondition(
                f"the agent of task {task_id} is not known to this daemon (it ended before the daemon's last start, "
                "or its agent is gone): use the Mesos UI or the agent's /files API")
        path = files.sandbox_path(fid, task_id, metrics.FILE_NAME if stream == "metrics" else stream)
        if stream == "metrics":
            max_bytes = min(max_bytes, metrics.READ_BYTES)
            offset = -max_bytes
        return files.read_log(self._files.reader(a.address or a.hostname, a.agent_port), path, offset, max_bytes)

    # --- events from the master -------------------------------------------------------------------------------
    def _on_event(self, ev: Any) -> None:
        """Typed events from the client; a raw event dict (tests, replays) goes through the protocol core first."""
        now = self.clock()
        if isinstance(ev, dict) and ev.get("type") == "DISCONNECTED":
            events: list[Event] = [self.protocol.on_disconnected("stream ended")]
        elif isinstance(ev, dict):
            events = self.protocol.on_event(ev, now)
        else:
            events = [ev]
        for e in events:
            self._handle(e, now)

    def _handle(self, ev: Event, now: float) -> None:
        EVENTS.labels(type(ev).__name__.lower()).inc()
        if isinstance(ev, Subscribed):
            self._on_subscribed(ev.framework_id, now)
        elif isinstance(ev, Offers):
            with self._lock:
                live = _live_by_agent(self._tasks.values())  # one pass for the event's offers, not one per offer
                for o in ev.offers:
                    self._add_offer(o, now, live.get(o.agent_id, ()))
                    self._note_window_locked(o.agent_id, o.unavailable_at)
                changed = [self._agents[o.agent_id] for o in ev.offers]
            self._hosts_changed(changed)
        elif isinstance(ev, InverseOffers):
            self._on_inverse_offers(ev)
        elif isinstance(ev, RescindInverseOffer):
            with self._lock:
                aid = self._inverse.pop(ev.inverse_offer_id, None)
                lifted = aid is not None and aid not in self._inverse.values() and \
                    self._maintenance.pop(aid, None) is not None
                agent = self._agents.get(aid or "")
            if lifted and agent is not None:
                log.warning("maintenance on agent %s lifted (inverse offer rescinded)", self._host_name(agent))
                self._hosts_changed([agent])
        elif isinstance(ev, Rescind):
            with self._lock:
                changed = [a for a in self._agents.values() if ev.offer_id in a.offers]
                for a in changed:
                    a.drop(ev.offer_id)
            self._hosts_changed(changed)
        elif isinstance(ev, Update):
            self._on_update(ev.status, now)
        elif isinstance(ev, Failure):
            if ev.agent_removed:  # the agent was removed: its offers are dead
                with self._lock:
                    gone = self._agents.get(ev.agent_id or "")
                    if gone is not None:
                        gone.clear()
                        gone.reachable = False
                        gone.lost = True  # removed from the cluster (until it offers again)
                self._hosts_changed([gone] if gone is not None else [])
        elif isinstance(ev, Error):
            log.error("mesos master: %s", ev.message)
            if ev.framework_removed:
                # the framework id is dead for good (torn down or failover timeout expired): register anew
                log.error("framework %s was removed by the master; registering as a new framework",
                          self.framework_id)
                self._persist_fid(None)  # (the store may be down: registering anew must not wait for it)
                self._transport.resume(forget_framework_id=True)
            elif ev.failed_over:
                log.error("another scheduler subscribed as framework %s: this daemon stops acting for it",
                          self.framework_id)
            self._disconnected()
        elif isinstance(ev, Disconnected):
            self._disconnected()

    def _note_window_locked(self, agent_id: str, start: float | None) -> None:
        """An offer says whether maintenance is scheduled on its agent (`unavailability`): so it is, or no longer."""
        if start is not None:
            if self._maintenance.get(agent_id) != start:
                log.warning("maintenance scheduled on agent %s from %s: draining it", agent_id,
                            time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(start)))
            self._maintenance[agent_id] = start
        elif self._maintenance.pop(agent_id, None) is not None:
            log.warning("maintenance on agent %s lifted", agent_id)
            for iid in [i for i, a in self._inverse.items() if a == agent_id]:
                del self._inverse[iid]

    def _on_inverse_offers(self, ev: InverseOffers) -> None:
        """The master asks us to leave agents for maintenance: they are drained (no new gangs; the job manager
        preempts what is still there when the window starts). An inverse offer is accepted once none of our tasks is
        left on its agent: at once, or by the ticker (`_vacated_locked`). Until then it is left unanswered, not
        declined: the master rescinds only an outstanding inverse offer when the window is lifted or moved
        (RESCIND_INVERSE_OFFER), and forgets an answered one, so that a declined one would leave us draining an
        agent whose window is gone when nothing else tells us (suppressed, or holding no offer of it)."""
        changed: list[AgentView] = []
        with self._lock:
            for io in ev.offers:
                self._inverse[io.id] = io.agent_id
                self._note_window_locked(io.agent_id, io.start)
                if io.agent_id in self._agents:
                    changed.append(self._agents[io.agent_id])
            accept = self._vacated_locked()
        if accept:
            self._send(lambda: self.protocol.answer_inverse_offers(accept, vacated=True))
        self._hosts_changed(changed)

    def _vacated_locked(self) -> list[str]:
        """The outstanding inverse offers of agents none of our tasks is left on, answered from now (the master
        forgets an answered one, and so do we: it sends a new one while we still hold resources there)."""
        busy = {t.agent_id for t in self._tasks.values() if _live(t.state)}
        done = [iid for iid, aid in self._inverse.items() if aid not in busy]
        for iid in done:
            del self._inverse[iid]
        return done

    def _disconnected(self) -> None:
        CONNECTED.set(0)
        with self._lock:
            self._set_up = False
            self._inverse.clear()  # the master drops them without RESCIND_INVERSE_OFFER; a new subscription gets new ones
            changed = list(self._agents.values())
            for a in changed:
                a.clear()
        self._hosts_changed(changed)

    def _on_subscribed(self, fid: str, now: float) -> None:
        CONNECTED.set(1)
        if fid != self._saved_fid:
            # before anything else: a restart must come back as this framework. If the store does not answer, the
            # subscription is set up all the same (kills, reconciliation, offers need the ticker) and the ticker
            # saves the id once it can; launches wait for that (`_launch_gang`)
            self._persist_fid(fid)
        with self._lock:
            self.suppressed = False  # a SUBSCRIBE lifts the suppression on the master; the ticker acts from now
            self._set_up = True
            self._subscriptions += 1
            # with demand, REVIVE at once (mesos-api.md "After every SUBSCRIBED"): the master may keep the filters
            # of our idle declines (`idle_refuse_s`) across a re-subscription, and only a REVIVE clears them
            self._revive_wanted = True
            cleared = list(self._agents.values())
            for a in cleared:
                a.clear()  # the master discarded them without RESCIND
            live = {tid for tid, t in self._tasks.items() if _live(t.state)}
            self._reconciliation = _Reconciliation(started=now, pending=live, next_send=now)
            self._cond.notify_all()
        self._hosts_changed(cleared)
        log.info("subscribed to mesos as framework %s; reconciling %d tasks", fid, len(live))

    def _persist_fid(self, fid: str | None) -> bool:
        """Save the framework id (None: the id is dead); False, logged, when the store does not answer."""
        try:
            self._save_fid(fid)
        except Exception as e:  # noqa: BLE001 - the store is down: the ticker tries again
            if self._unsaved_fid != fid:  # once, not at every tick
                log.error("mesos: the framework id %s could not be saved yet: %s", fid, e)
            self._unsaved_fid = fid
            return False
        self._saved_fid = fid
        self._unsaved_fid = None
        return True

    def _add_offer(self, o: Any, now: float, live: Iterable[_Task]) -> None:
        """`live`: our live tasks on the offer's agent."""
        a = self._agents.get(o.agent_id)
        if a is None:
            a = self._agents[o.agent_id] = AgentView(o.agent_id, o.hostname, o.agent_port, dict(o.attributes),
                                                     address=o.agent_address)
            self._per_hostname[a.hostname] += 1
        a.attributes = dict(o.attributes)
        a.reachable = True
        a.lost = False
        a.add(o, now)
        free, _ = a.free()
        mine = Resources()
        for t in live:
            mine = mine + t.resources
        seen = free + mine
        c = a.capacity
        a.capacity = Resources(max(c.cpu, seen.cpu), max(c.mem, seen.mem), max(c.disk, seen.disk),
                               max(c.gpu, seen.gpu), max(c.ports, seen.ports))
        a.has_gpus = a.has_gpus or o.gpus > 0

    def _on_update(self, s: Any, now: float) -> None:
        tid, state, agent_id = s.task_id, s.state, s.agent_id or ""
        reason = s.reason or ""
        with self._cond:
            t = self._tasks.get(tid)
            if t is None:
                t = self._tasks[tid] = _Task(tid, agent_id)
            t.agent_id = agent_id or t.agent_id
            t.state = state
            t.updated_at = now
            if is_terminal(state) or state == "TASK_UNKNOWN":
                t.kill_sent_at = None  # ended, or the master never knew it: nothing left to kill
            a = self._agents.get(t.agent_id)
            host = self._host_name(a) if a else ""
            try:
                ours = mesos_state_to_task_state(state)
            except ValueError:
                ours = TaskState.LOST
            st = TaskStatus(
                task_id=tid, state=ours, time=now, hostname=host, exit_code=exit_code(s),
                reason=f"{state}{': ' + reason if reason else ''}", message=s.message or "",
                ack=json.dumps([s.agent_id, tid, s.uuid]) if s.needs_ack and s.agent_id else "",
                permanent=state == "TASK_ERROR",
            )
            self._answers[tid] = (now, st)
            if self._reconciliation is not None:
                self._reconciliation.pending.discard(tid)
            self._cond.notify_all()
        if self._on_status is not None:
            self._on_status(st)

    # --- periodic duties ------------------------------------------------------------------------------------
    def _tick_pass(self) -> bool:
        """The `mesos-ticker` loop's pass, every TICK_S (a failure is logged and tried again at the next)."""
        self.tick()
        return False

    def tick(self) -> None:
        fid = self.framework_id
        if self._set_up and fid and fid != self._saved_fid:
            self._persist_fid(fid)  # SUBSCRIBED came while the store did not answer
        now = self.clock()
        decline: list[str] = []
        declined: list[AgentView] = []
        kills: list[_Task] = []
        reconcile: list[tuple[str, str | None]] | None = None
        implicit = False
        suppress = False
        with self._lock:
            if not self.subscribed or not self._set_up:  # not before SUBSCRIBED is handled (see `_set_up`)
                return
            idle = now - self._last_demand > self.opts.idle_suppress_s
            revive, self._revive_wanted = self._revive_wanted and not idle, False
            subscription = self._subscriptions
            for a in self._agents.values():
                for oid in list(a.offers):
                    if idle or now - a.received[oid] > self.opts.offer_hold_s:
                        decline.append(oid)
                        a.drop(oid)
                        declined.append(a)
            self._idle_filtered = self._idle_filtered or (idle and bool(decline))
            # (offers while we believe we are suppressed: the master does not suppress us, whatever we sent last)
            if idle and (not self.suppressed or decline):
                suppress = True
                self.suppressed = True
            gone: list[_Task] = []
            for t in self._tasks.values():
                if t.kill_sent_at is not None and now - t.kill_sent_at >= self.opts.kill_retry_s:
                    t.kill_sent_at = now
                    kills.append(t)
                elif not _live(t.state) and now - t.updated_at >= ENDED_KEEP_S:
                    gone.append(t)
            self._forget_locked(gone)
            r = self._reconciliation
            if r is not None:
                if not r.pending:
                    self._reconciliation = None
                    implicit = True  # finish with an implicit round: it reveals tasks we do not know
                elif now >= r.next_send:
                    # not yet the members whose ACCEPT is on its way (see _Task.accept_pending)
                    asked = sorted(tid for tid in r.pending if not self._accept_pending(tid))
                    if asked:
                        reconcile = [self._reconcile_entry(tid) for tid in asked]
                        r.next_send = now + RECONCILE_BACKOFF.delay(r.attempt, self._rand())
                        r.attempt += 1
            if now - self._last_implicit >= self.opts.implicit_reconcile_s:
                implicit = True
            if implicit:
                self._last_implicit = now
            vacated = self._vacated_locked() if self._inverse else []
        if revive:
            revived = self._send(lambda: self.protocol.revive([self.opts.role]))
            with self._lock:
                if revived:
                    self.suppressed = self._idle_filtered = False
                else:  # the next pass tries again (the demand may have been the last for a while)
                    self._revive_wanted = True
        if decline:
            self._hosts_changed(list({id(a): a for a in declined}.values()))
            self._send(lambda: self.protocol.decline(decline, self.opts.idle_refuse_s if idle
                                                     else self.opts.refuse_seconds))
        if suppress:
            sent = self._send(lambda: self.protocol.suppress([self.opts.role]))
            with self._lock:
                if self._subscriptions != subscription:
                    # a new subscription began while it was on its way: it may have been sent on that one (whose
                    # handling reset `suppressed`). Believe the master suppresses us: the next demand REVIVEs (one
                    # too many at worst), where believing otherwise would never revive
                    self.suppressed = True
                elif not sent:
                    self.suppressed = False  # not suppressed: the next idle pass sends it again
        for t in kills:  # with the first kill's grace: a retry without it would cut the grace short
            self._send(lambda: self.protocol.kill(t.task_id, t.agent_id or None, t.kill_grace))  # noqa: B023
        if reconcile is not None:
            self._send(lambda: self.protocol.reconcile(reconcile))
        if implicit:
            self._send(lambda: self.protocol.reconcile([]))
        if vacated:
            self._send(lambda: self.protocol.answer_inverse_offers(vacated, vacated=True))


class _Refused(LaunchError):
    """Nothing of the gang was sent: the launch is refused, not failed."""


def make_mesos_backend(settings: Any, sessions: Any, may_subscribe: Callable[[], bool] = lambda: True,
                       loop_clock: Clock = SYSTEM_CLOCK) -> MesosBackend:
    """Wire the backend for the daemon: framework id kept in the store's meta table, secret read from a file;
    `may_subscribe`: whether this process leads (a replaced leader must not subscribe as the framework)."""
    from peloton.hostmgr.mesos.client import MesosClient
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
    if settings.user == "root":
        log.warning("--mesos-user root: tasks of jobs that name no user run as root on the agents, whatever their "
                    "pool allows (docs/security.md)")
    opts = MesosOptions(
        framework_name=settings.framework_name, user=settings.user, role=settings.role,
        principal=settings.principal, failover_timeout_s=settings.failover_timeout_s,
    )

    def transport(config: FrameworkConfig, fid: str | None, on_event: Callable[[Any], None]) -> Transport:
        return MesosClient(settings.masters, config, on_event, framework_id=fid, may_subscribe=may_subscribe,
                           principal=settings.principal or None, secret=secret or None)

    # the agents are asked as the masters are: same scheme, same principal (agents with HTTP authentication)
    auth = None
    if settings.principal:
        import base64

        auth = "Basic " + base64.b64encode(f"{settings.principal}:{secret}".encode()).decode("ascii")
    scheme = "https" if settings.masters and settings.masters[0].startswith("https://") else "http"
    return MesosBackend(opts, transport, load, save, agent_files=AgentFiles(scheme, auth), loop_clock=loop_clock)


def _user_refusal(m: LaunchSpec) -> str:
    """Why a member cannot run as its user on an agent: an allocated uid has no name an agent could switch to
    (submit refuses such jobs on Mesos; one created on another backend's daemon may reach here), and a system
    account nobody vetted (a job created before task identities) is refused by name (run_as.SYSTEM_ACCOUNTS)."""
    uid = task_identity.dynamic_uid(m.user)
    if uid is not None:
        return (f"task.user: uid {uid} has no name on the Mesos agents: map the job's owner to a Unix user in the "
                "principals file")
    if m.legacy_user and m.user and run_as.system_account(m.user, None):
        return (f"task.user: {m.user} is a system account, and this job was created before task identities, so no "
                "admin vetted it")
    return ""
