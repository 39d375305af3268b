"""The daemon: store, host manager (local, sim or Mesos backend), resource manager, placement engine and job
manager, all four in one process by default (`--role` runs a subset). The components call each other through the
typed clients of api/clients.py: straight to the component inside one process (resmgr/inprocess.py,
hostmgr/inprocess.py), over gRPC between processes (api/grpc_clients.py), so splitting them changes wiring, not
contracts."""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from concurrent import futures
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import disable_created_metrics, start_http_server
from sqlalchemy.engine import Engine

from peloton.api.audit import AuditLog, AuditServicer
from peloton.api.closing import RefuseWhileClosing
from peloton.api.cluster import ClusterFacts, ClusterServicer, ClusterSummary, ConsoleLogins, Stage
from peloton.api.edge import PUBLIC_PORT_OPTIONS, GatePublicReads
from peloton.api.grpc_clients import ConnectedStub, GrpcHostManager, GrpcResourceManager
from peloton.api.model_service import ModelBook, ModelServicer
from peloton.api.status import RejectUndecodableRequests
from peloton.api.v1 import (
    audit_pb2,
    audit_pb2_grpc,
    cluster_pb2,
    cluster_pb2_grpc,
    host_pb2,
    host_pb2_grpc,
    internal_pb2_grpc,
    job_pb2,
    job_pb2_grpc,
    model_pb2,
    model_pb2_grpc,
    respool_pb2,
    respool_pb2_grpc,
    task_pb2,
    task_pb2_grpc,
)
from peloton.config import split_hostport
from peloton.domain.gpumap import Waiting
from peloton.errors import FailedPrecondition, InvalidArgument, Unavailable
from peloton.files import (
    create_private,
    make_dirs,
    owner_only_umask,
    tasks_run_as_others,
    warn_untraversable,
)
from peloton.hostmgr import listing
from peloton.hostmgr.backend import Backend
from peloton.hostmgr.inprocess import InProcessHostManager
from peloton.hostmgr.local.backend import (
    LocalBackend,
    make_local_hosts,
)
from peloton.hostmgr.manager import HostManager
from peloton.hostmgr.service import HostManagerServicer, HostServicer
from peloton.hostmgr.sim.backend import SimBackend, SimSettings, make_sim_backend
from peloton.jobmgr.manager import RETENTION_BATCH, JobManager
from peloton.jobmgr.service import MAX_WATCHERS, JobServicer, TaskServicer
from peloton.leadership.failover import FailoverStub, split_addresses
from peloton.leadership.guard import LEADER, StoreGuard
from peloton.leadership.hold import Hold
from peloton.leadership.owner import Owner
from peloton.leadership.standby import RequireLeader
from peloton.loop import SYSTEM_CLOCK, Clock, Loop, count_thread_deaths, progress
from peloton.observability import census, gang_metrics
from peloton.observability.health import judge
from peloton.placement.engine import PlacementEngine
from peloton.resmgr.inprocess import InProcessResourceManager
from peloton.resmgr.manager import ResourceManager
from peloton.resmgr.service import ResourceManagerServicer, ResourcePoolServicer
from peloton.retry import Backoff
from peloton.retry.sleeping import retry_call
from peloton.security import identity, run_as, startup
from peloton.security.auth import Authenticator, Authorize
from peloton.security.component_auth import METADATA_KEY, RequireSecret, load_secret
from peloton.security.console_login import OneTimeLogins
from peloton.security.identity import Principals
from peloton.security.ratelimit import RateLimiter
from peloton.settings import RATE_BURST_S, ServerConfig, local_only
from peloton.store import db, repo

if TYPE_CHECKING:
    from peloton.console.server import Console

AUDIT_RETENTION_BATCH = 1000  # audit records the retention loop deletes in one transaction
log = logging.getLogger("peloton.server")

HEALTH_SERVICE = "peloton"
LONG_POLL_MS = 1000  # how long the launcher, task-events and placement loops wait for input in one pass
# Messages between components: a SyncHosts or ClusterCapacity answer for tens of thousands of hosts, or the launch
# of a 4096-member gang, may pass 4 MiB. Only the components (owner-only socket or loopback, the shared secret)
# reach the internal services.
MESSAGE_LIMITS = [("grpc.max_receive_message_length", 64 * 1024 * 1024),
                  ("grpc.max_send_message_length", 64 * 1024 * 1024)]
# Internal channels reconnect within a second of their peer's return (gRPC's default back-off grows to 2 minutes):
# a restarted or taken-over resmgr/hostmgr is called again at once.
RECONNECT = [("grpc.initial_reconnect_backoff_ms", 100), ("grpc.min_reconnect_backoff_ms", 100),
             ("grpc.max_reconnect_backoff_ms", 1000),
             # a peer that is paused (SIGSTOP, a stall) or cut off answers no HTTP/2 ping: its connection is closed
             # within ~4 s and the calls on it end UNAVAILABLE, so the caller moves on to its standby
             ("grpc.keepalive_time_ms", 2000), ("grpc.keepalive_timeout_ms", 2000), ("grpc.http2.ping_timeout_ms", 2000),
             ("grpc.keepalive_permit_without_calls", 1), ("grpc.http2.max_pings_without_data", 0)]
# ... which the internal server must allow (by default it ends a connection that pings more than every 5 minutes)
KEEPALIVE_ALLOWED = [("grpc.http2.min_ping_interval_without_data_ms", 1000), ("grpc.keepalive_permit_without_calls", 1),
                     ("grpc.http2.max_ping_strikes", 0)]


MAX_SOCKET_PATH = 107  # sun_path, less its terminating NUL
class Daemon:
    def __init__(self, cfg: ServerConfig, clock: Clock = SYSTEM_CLOCK) -> None:
        """`clock`: what the loops wait on and health judges them by (a test's moves by hand)."""
        self.cfg = cfg
        self.clock = clock
        self.loops: list[Loop] = []
        self._stopped = threading.Event()
        self._closing = threading.Event()  # set first by stop(): new public calls are refused from then on
        self._stopping = threading.Lock()  # held by the one stop() that does the work (two signals: one stop)
        # the data dir and the roles' locks (leadership/hold.py)
        self.hold = Hold(cfg, self._stopped, lambda: startup.tls_credentials(cfg) if cfg.tls_cert else None,
                         self._fenced)
        self.guard: StoreGuard | None = None
        self.jobmgr: JobManager | None = None
        self.resmgr: ResourceManager | None = None
        self.hostmgr: HostManager | None = None
        self.placement: PlacementEngine | None = None
        self.engine: Engine | None = None
        self.audit: AuditLog | None = None
        self.internal_server: grpc.Server | None = None
        self.channels: list[grpc.Channel] = []
        self.console: Console | None = None  # the web console (--ui-listen)
        self.console_socket: Path | None = None  # the API for the console only (its secret), owner-only
        self.console_logins = OneTimeLogins(cfg.ui_login_ttl_s)  # `peloton cluster ui-login`

    def start(self) -> str:
        """Each step needs the ones before it. Nothing that acts (the backend, the loops) starts before the locks
        and the ports are this daemon's: a refused start leaves the cluster untouched."""
        self.cfg.check()
        self._refuse_without_secret()
        self._serve_metrics()
        self._bind_console()
        self._take_hold()
        self._open_store()
        self._start_audit()
        self._authenticate()
        self._make_public_server()
        self._add_hostmgr()
        self._add_resmgr()
        self._serve_internal_if_split()
        self._bind_public_ports()
        if self.hostmgr is not None:  # only once the ports are ours: a refused start leaves the backend untouched
            self.hostmgr.start()
        self._connect_components()
        self._add_jobmgr()
        self._add_cluster_service()
        self._start_serving()
        self._start_loops()
        self._declare_serving()
        if self.console is not None:
            assert self.console_socket is not None and self.authenticator.console_secret is not None
            self.console.start(f"unix:{self.console_socket}", self.authenticator.console_secret,
                               authenticated=self.authenticator.enabled)
            log.info("web console on %s%s", self.console.url,
                     " (HTTPS, client certificates of --tls-client-ca log in)" if self.console.tls and
                     self.cfg.tls_client_ca else " (HTTPS)" if self.console.tls else "")
        return self.address

    def _refuse_without_secret(self) -> None:
        """A job manager or placement process without the resmgr and hostmgr calls them with the components'
        secret: refused now, before it takes any lock or port."""
        roles = self.cfg.roles
        if roles & {"jobmgr", "placement"} and not roles >= {"resmgr", "hostmgr"}:
            load_secret(self.cfg.secret_file(), create=False)

    def _take_hold(self) -> None:
        """The data dir, and the store lock of each role (a standby waits for them here)."""
        cfg, roles = self.cfg, self.cfg.roles
        for role in roles:  # until it acts (a standby never does)
            LEADER.labels(role).set(0)
        # owner-only (traversable as root, for the tasks of other users) before anything makes it with the umask's mode
        make_dirs(cfg.data_dir, traversable=tasks_run_as_others())
        self.url = cfg.db_url or db.default_sqlite_url(cfg.data_dir)
        self.postgres = db.sqlite_path(self.url) is None
        if ("jobmgr" in roles or self.postgres) and not cfg.lockless_placement:
            # before migrating: a refused daemon, or a standby of a newer release, must not change the schema
            # under the daemon that acts on the store
            self.hold.take_store_lock(self.url)
        else:  # a --role process on SQLite (or with no store), or a placement engine beside others (no lock): one
            # per data dir, no standby but on that machine
            self.hold.lock_data_dir()

    def _open_store(self) -> None:
        """Migrated, fenced (every commit checks that no other process took over), with the root pool."""
        cfg, roles = self.cfg, self.cfg.roles
        if roles & {"jobmgr", "resmgr"} or cfg.backend == "mesos" or (self.postgres and "hostmgr" in roles):
            db.upgrade(self.url)  # (a SQLite file is created owner-only first: db.own_sqlite_file)
            self.hold.record()
            self.engine = db.make_engine(self.url, self.hold.session, cfg.store_durability)
            self.sessions = db.make_sessions(self.engine)
            self.read_sessions = db.make_read_sessions(self.engine)
            self.hold.fence_commits(self.sessions, self.postgres)
            with db.transaction(self.sessions) as s:
                repo.ensure_root_pool(s, time.time())

    def _start_audit(self) -> None:
        if self.engine is not None:  # the audit log lives in the store
            self.audit = AuditLog(self.sessions)
            self.audit.start()

    def _authenticate(self) -> None:
        """Who may call (the principals file, client certificates), how often, and as whom their tasks run."""
        cfg = self.cfg
        path = self.principals = cfg.principals_path()
        self._insecure: list[str] = []  # logged once the ports are ours, and shown by `peloton cluster info`
        if path is None and startup.root_runs_tasks(cfg):
            path = self.principals = startup.lock_to_root(cfg, self._insecure)
        limiter = (RateLimiter(cfg.rate_limit, max(10.0, cfg.rate_limit * RATE_BURST_S)) if cfg.rate_limit > 0
                   else None)
        self.authenticator = Authenticator(Principals(path) if path is not None else None,
                                           mutual_tls=cfg.tls_client_ca is not None, limiter=limiter)
        self.identities = startup.identity_policy(cfg, self.authenticator.enabled)
        if self.authenticator.enabled:
            log.info("authentication on: %s", ", ".join(
                w for w, on in ((f"tokens of {path}", path is not None),
                                ("client certificates of --tls-client-ca", cfg.tls_client_ca is not None)) if on))

    def _make_public_server(self) -> None:
        """The public gRPC server, its interceptors and health (NOT_SERVING until the loops run)."""
        cfg = self.cfg
        self.server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=cfg.workers + MAX_WATCHERS, thread_name_prefix="grpc"),
            options=[("grpc.so_reuseport", 0), *PUBLIC_PORT_OPTIONS],
            maximum_concurrent_rpcs=cfg.workers + MAX_WATCHERS,
            # the callers' requests are read only once they are known (Authorize), or at most PUBLIC_READS at once
            # for health and reflection (edge.py); peloton's own requests carry only fields this release knows
            interceptors=[RefuseWhileClosing(self._closing), GatePublicReads(identity.PUBLIC_SERVICES),
                          Authorize(self.authenticator, self.audit),
                          RejectUndecodableRequests(refuse_unknown=("/peloton.v1.",))],
        )
        self._judging = False  # health is judged from the loops once they run (until then: NOT_SERVING, as set)
        self._health_mu = threading.Lock()
        self._stuck: dict[str, str] = {}  # the loops found stuck last time, and why
        self._judged: dict[str, int] = {}  # each health service's status as last judged (set again only on change)
        self.health = _JudgedHealth(self._update_health)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self.services: list[tuple[Any, str]] = []
        if self.audit is not None:
            audit_pb2_grpc.add_AuditServiceServicer_to_server(AuditServicer(self.audit, self.read_sessions),
                                                             self.server)
            self.services.append((audit_pb2.DESCRIPTOR, "AuditService"))

    def _add_hostmgr(self) -> None:
        self.hostmgr_servicer: HostManagerServicer | None = None
        self.host_servicer: HostServicer | None = None
        if "hostmgr" not in self.cfg.roles:
            return

        def save_drains(drains: dict[str, float]) -> None:
            with db.transaction(self.sessions) as s:
                repo.set_drains(s, drains)

        # drains are kept in the store when this process has one; a host manager alone on the local or sim
        # backend has none and keeps them in memory (docs/running.md, "Host maintenance")
        stored = self.engine is not None
        lock = self.hold.store_lock
        self.hostmgr = HostManager(self._make_backend(), save_drains=save_drains if stored else None,
                                   may_act=lock.fresh if lock is not None else lambda: True)
        self._load_drains()
        self.hostmgr_servicer = HostManagerServicer(self.hostmgr)
        # the queue's GPU asks and reservations, for the hosts map: from the resource manager of this process
        self.host_servicer = HostServicer(
            self.hostmgr, lambda: self.resmgr.waiting() if self.resmgr is not None else Waiting())
        host_pb2_grpc.add_HostServiceServicer_to_server(self.host_servicer, self.server)
        self.services += [(host_pb2.DESCRIPTOR, "HostService")]
        self.services += self._add_sim_service()

    def _add_resmgr(self) -> None:
        self.resmgr_servicer: ResourceManagerServicer | None = None
        if "resmgr" not in self.cfg.roles:
            return

        def load_pools():  # type: ignore[no-untyped-def]
            with db.transaction(self.sessions) as s:
                return repo.list_pools(s)

        cfg = self.cfg
        self.resmgr = ResourceManager(load_pools, preemption_settle_s=cfg.preemption_settle_s,
                                      preemption=cfg.preemption, placement_order=cfg.placement_order,
                                      queue_order=cfg.queue_order_value(), placement_engines=cfg.placement_engines,
                                      engine_lease_s=cfg.placement_engine_lease_s)
        self.resmgr_servicer = ResourceManagerServicer(self.resmgr)
        respool_pb2_grpc.add_ResourcePoolServiceServicer_to_server(
            ResourcePoolServicer(self.resmgr, self.sessions), self.server)
        self.services += [(respool_pb2.DESCRIPTOR, "ResourcePoolService")]

    def _serve_internal_if_split(self) -> None:
        if self.cfg.serves_internal():
            self.internal_server = self._serve_internal(self.hostmgr_servicer, self.resmgr_servicer)

    def _bind_public_ports(self) -> None:
        """--listen (a standby that took over serves the port it answered on meanwhile) and the Unix socket."""
        cfg = self.cfg
        host, port = split_hostport(self.hold.standby_listen or cfg.listen, "--listen")
        try:
            bound = (self.server.add_secure_port(f"{host}:{port}", startup.tls_credentials(self.cfg)) if cfg.tls_cert
                     else self.server.add_insecure_port(f"{host}:{port}"))
        except RuntimeError:
            bound = 0
        if bound == 0:
            raise FailedPrecondition(f"--listen: cannot listen on {cfg.listen} (address in use, or not ours)",
                                     field="--listen")
        self.address = f"{'127.0.0.1' if host in ('0.0.0.0', '', '[::]', '::') else host}:{bound}"
        self.unix_socket = self._serve_unix_socket()
        self.console_socket = self._serve_console_socket()
        for flag, addr in (("--listen", cfg.listen), ("--internal-listen", cfg.internal_listen),
                           ("--ui-listen", cfg.ui_listen if self.console is not None else "")):
            if addr and not local_only(addr) and not (flag != "--internal-listen" and cfg.authenticated):  # --insecure
                self._insecure.append(f"INSECURE (--insecure): {flag} {addr} is reachable from other machines "
                                      "without TLS or authentication; anyone who reaches it can run commands as "
                                      "this daemon's user (docs/security.md)")
        for warning in self._insecure:
            log.warning("%s", warning)
        self.hold.serving_at(f"{host}:{bound}")

    def _connect_components(self) -> None:
        """The components call each other through typed clients (api/clients.py): over gRPC to another process, and
        straight to the component inside this one (no message built, the same values and errors)."""
        cfg = self.cfg
        self.resmgr_client: Any = (
            InProcessResourceManager(self.resmgr) if self.resmgr is not None and "resmgr" in cfg.roles else
            self._stub(internal_pb2_grpc.ResourceManagerInternalStub, cfg.resmgr_address, "resmgr",
                       GrpcResourceManager))
        self.hostmgr_client: Any = (
            InProcessHostManager(self.hostmgr) if self.hostmgr is not None and "hostmgr" in cfg.roles else
            self._stub(internal_pb2_grpc.HostManagerInternalStub, cfg.hostmgr_address, "hostmgr", GrpcHostManager))

    def _add_jobmgr(self) -> None:
        """The job manager and its public services, and the stored models beside the jobs that will name them."""
        cfg = self.cfg
        self.jobmgr = None
        if "jobmgr" not in cfg.roles:
            return
        self.jobmgr = JobManager(self.sessions, self.read_sessions, self.resmgr_client, self.hostmgr_client,
                                 writers=cfg.writers(), gpu_table=cfg.gpu_table_rows())
        max_waiting = cfg.max_waiting_jobs if self.authenticator.enabled else 0
        # the backend is known where the host manager runs: a job manager without it warns of nothing
        servicer = JobServicer(self.jobmgr, max_waiting_jobs=max_waiting,
                               backend=cfg.backend if self.hostmgr is not None else "",
                               identities=self.identities, principals=self.authenticator.principals)
        job_pb2_grpc.add_JobServiceServicer_to_server(servicer, self.server)
        task_pb2_grpc.add_TaskServiceServicer_to_server(TaskServicer(self.jobmgr), self.server)
        self.services += [(job_pb2.DESCRIPTOR, "JobService"), (task_pb2.DESCRIPTOR, "TaskService")]
        model_pb2_grpc.add_ModelServiceServicer_to_server(
            ModelServicer(ModelBook(self.sessions, self.read_sessions)), self.server)
        self.services += [(model_pb2.DESCRIPTOR, "ModelService")]

    def _add_cluster_service(self) -> None:
        """`peloton cluster info`: what this daemon is and how it is set up, handed over once."""
        cfg, roles = self.cfg, self.cfg.roles
        self.started_at = time.time()
        cluster_pb2_grpc.add_ClusterServiceServicer_to_server(ClusterServicer(ClusterFacts(
            roles=sorted(roles),
            store=db.describe(self.url) if self.engine is not None else "",
            backend=cfg.backend if self.hostmgr is not None else "", started_at=self.started_at,
            addresses=[self.address] + ([f"unix:{self.unix_socket}"] if self.unix_socket else []),
            tls=cfg.tls_cert is not None, mutual_tls=cfg.tls_client_ca is not None, tokens=self.principals is not None,
            insecure=bool(self._insecure), warnings=tuple(self._insecure),
            task_identities={run_as.Mode.LOCAL: "per principal", run_as.Mode.MESOS: "mapped users",
                             run_as.Mode.OFF: "none"}[self.identities.mode],
            uid_range=(f"{cfg.task_uid_range[0]}-{cfg.task_uid_range[1]}"
                       if self.identities.mode is run_as.Mode.LOCAL else ""), owner=self.authenticator.owner),
            hosts=lambda: len(self.hostmgr.backend.hosts()) if self.hostmgr is not None else 0,
            leadership=lambda: self.hold.report(self.read_sessions if self.engine is not None else None),
            console=self._console_logins(), summary=self._cluster_summary), self.server)
        self.services += [(cluster_pb2.DESCRIPTOR, "ClusterService")]

    def _console_logins(self) -> ConsoleLogins | None:
        """`peloton cluster ui-login`'s one-time links, where this process serves a console."""
        if self.console is None:
            return None
        logins = self.console_logins

        def make() -> tuple[str, str, int]:
            login = logins.make(time.time())
            return login.login_id, login.secret, logins.ttl_s

        return ConsoleLogins(url=self.console.url, authenticated=self.authenticator.enabled, make=make,
                             spend=lambda login_id, secret: logins.spend(login_id, secret, time.time()))

    def _cluster_summary(self) -> ClusterSummary:
        """GetClusterSummary: the hosts' sums (host manager), the queue's length (resource manager), gangs by state
        (the store, where the job manager runs) and the stage latencies this process observed."""
        sources: list[str] = []
        hosts = listing.Summary()
        if self.host_servicer is not None:
            hosts = self.host_servicer.summary()
            sources.append("hosts")
        queued = 0
        if self.resmgr is not None:
            queued = self.resmgr.queue(limit=0)[1]
            sources.append("queue")
        gangs: dict[str, int] = {}
        if self.jobmgr is not None:
            with db.transaction(self.read_sessions) as s:
                gangs = repo.count_gangs_by_state(s)
            sources.append("gangs")
        return ClusterSummary(
            tuple(sources), hosts.hosts, hosts.host_states, hosts.capacity, hosts.allocated, hosts.gpus, hosts.racks,
            queued, gangs, tuple(Stage(n, c, m, q) for n, c, m, q in gang_metrics.stage_latencies()))

    def _start_serving(self) -> None:
        """Reflection of every service added, then the public server (health NOT_SERVING until the loops run)."""
        names = [d.services_by_name[n].full_name for d, n in self.services]
        reflection.enable_server_reflection([*names, health.SERVICE_NAME, reflection.SERVICE_NAME], self.server)
        self.health.set(HEALTH_SERVICE, health_pb2.HealthCheckResponse.NOT_SERVING)
        self.health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        self.server.start()

    def _start_loops(self) -> None:
        """Recovery first, then every loop: the job manager's, the store guard, placement, health."""
        cfg = self.cfg
        self.loops = []
        if self.jobmgr is not None:
            self.jobmgr.start()
            # recovery before any loop runs: adopt whole gangs, tear down partial ones, re-queue the rest
            self._recover(self.jobmgr)
            # the loops long-poll their input (placements, status events): they wake when there is work
            jm = self.jobmgr
            self.loops += [Loop(f"launcher-{i}", lambda: jm.launcher.launch_once(LONG_POLL_MS), 0.05, self.clock)
                           for i in range(cfg.launchers)]
            self.loops += [
                Loop("task-events", lambda: jm.events_once(LONG_POLL_MS), 0.05, self.clock),
                Loop("reconciler", jm.reconcile_once, 5.0, self.clock),
            ]
            kept = [t for t in (cfg.job_retention_s, cfg.audit_retention_s) if t > 0]
            if kept:  # checked often enough for the shortest retention, at least every 10 minutes
                self.loops.append(Loop("retention", lambda: self._retention_once(jm),
                                       max(1.0, min(600.0, min(kept) / 4)), self.clock))
        self.guard = self.hold.watch(self.read_sessions if self.engine is not None else None,
                                     self._stop_acting, self._regained,
                                     lambda: None if self._update_health() else None)
        if self.guard is not None:
            self.loops.append(Loop("store", self.guard.run_once, 1.0, self.clock))
        if "placement" in cfg.roles:
            engine = self.placement = PlacementEngine(self.resmgr_client, self.hostmgr_client, poll_ms=LONG_POLL_MS,
                                                    order=cfg.placement_order)
            # a replaced leader places nothing (its plans would be refused at claim time anyway)
            self.loops.append(Loop("placement", lambda: self._leads() and engine.run_once(), 0.05, self.clock))
        self.loops.append(Loop("health", self._update_health, 5.0, self.clock))
        for lp in self.loops:
            lp.start()

    def _declare_serving(self) -> None:
        """Health SERVING, peloton_leader 1, the census attached, and the address written for the CLI."""
        cfg = self.cfg
        self.health.set(HEALTH_SERVICE, health_pb2.HealthCheckResponse.SERVING)
        self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        self._judging = True
        for role in cfg.roles:
            LEADER.labels(role).set(1)
        if self.jobmgr is not None:
            read = self.read_sessions

            def count() -> dict[str, dict[str, int]]:
                with db.transaction(read) as s:
                    return repo.count_by_state(s)

            census.STORE.attach(count)
        if self.hostmgr is not None:
            census.CLUSTER.attach(self.hostmgr.census, cfg.metrics_host_limit)
        with os.fdopen(create_private(cfg.data_dir / "daemon.addr", os.O_WRONLY | os.O_TRUNC), "w") as f:
            f.write(self.address + "\n")

    def _serve_metrics(self) -> None:
        """First of all: a port in use refuses the start, and a standby exports its metrics (peloton_leader 0)."""
        cfg = self.cfg
        if cfg.metrics_listen:
            mhost, mport = split_hostport(cfg.metrics_listen, "--metrics-listen")
            try:
                tls: dict[str, Any] = {}
                if cfg.metrics_tls:
                    assert cfg.tls_cert is not None and cfg.tls_key is not None
                    tls = {"certfile": str(cfg.tls_cert), "keyfile": str(cfg.tls_key)}
                    if cfg.tls_client_ca is not None:
                        tls |= {"client_cafile": str(cfg.tls_client_ca), "client_auth_required": True}
                # no `_created` series beside every counter and histogram (peloton_jobs_created_created): they
                # double the scrape for a timestamp nobody graphs
                disable_created_metrics()
                self.metrics_server, _ = start_http_server(mport, addr=mhost, **tls)
            except OSError as e:
                raise FailedPrecondition(f"--metrics-listen: cannot listen on {cfg.metrics_listen}: {e.strerror}",
                                         field="--metrics-listen") from None

    def _bind_console(self) -> None:
        """The web console's port, taken now (a port in use refuses the start); it serves once the API does, over
        HTTPS with the API's own certificate when the API has TLS. It calls the public API as its users, over a
        socket of its own (docs/ui.md): where this process serves no jobs there is none."""
        cfg = self.cfg
        if not cfg.ui_listen:
            return
        if "jobmgr" not in cfg.roles:
            log.info("no web console (--ui-listen): this process runs no job manager")
            return
        from peloton.console.server import Console  # (http.server: ~30 ms of imports, only for a daemon with a console)

        tls = None
        if cfg.tls_cert is not None:
            assert cfg.tls_key is not None
            tls = (cfg.tls_cert, cfg.tls_key, cfg.tls_client_ca)
        self.console = Console(cfg.ui_listen, tls)

    def _make_backend(self) -> Backend:
        cfg = self.cfg
        if cfg.backend == "sim":
            return make_sim_backend(cfg.sim or SimSettings())
        if cfg.backend == "mesos":
            from peloton.hostmgr.mesos.backend import make_mesos_backend

            assert cfg.mesos is not None
            return make_mesos_backend(cfg.mesos, self.sessions, may_subscribe=self._leads, loop_clock=self.clock)
        hosts = make_local_hosts(cfg.local_hosts, cfg.local_host_resources, port_base=cfg.local_port_base,
                                 data_dir=cfg.data_dir, labels=cfg.local_host_labels, groups=cfg.local_host_groups)
        if cfg.default_task_user == "root" and tasks_run_as_others():
            log.warning("--default-task-user root: tasks of jobs that name no user run as root, whatever their pool "
                        "allows (docs/security.md)")
        warn_untraversable(cfg.data_dir)
        return LocalBackend(cfg.data_dir / "local", hosts, env_allow=cfg.task_env_allow,
                            default_user=cfg.default_task_user, log_max_bytes=cfg.task_log_max_bytes,
                            log_keep=cfg.task_log_keep, sandbox_retention_s=cfg.sandbox_retention_s,
                            sandbox_max_count=cfg.sandbox_max_count, sandbox_max_bytes=cfg.sandbox_max_bytes,
                            loop_clock=self.clock, task_cgroups=cfg.task_cgroups, warm_wrappers=cfg.warm_wrappers)

    def _add_sim_service(self) -> list[tuple[Any, str]]:
        """SimService (failure injection) when the host manager runs the sim backend; nothing otherwise, so other
        daemons answer UNIMPLEMENTED."""
        assert self.hostmgr is not None
        backend = self.hostmgr.backend
        if not isinstance(backend, SimBackend):
            return []
        from peloton.api.v1 import sim_pb2, sim_pb2_grpc
        from peloton.hostmgr.sim.service import SimServicer

        sim_pb2_grpc.add_SimServiceServicer_to_server(SimServicer(backend), self.server)
        return [(sim_pb2.DESCRIPTOR, "SimService")]

    def _serve_unix_socket(self) -> Path | None:
        """The public API on a Unix socket only the daemon's user can open (the CLI's default when it exists)."""
        cfg = self.cfg
        path = cfg.unix_socket_path()
        if path is None:
            return None
        if len(str(path)) > MAX_SOCKET_PATH:
            if cfg.unix_socket is None:  # the default: skip it rather than refuse to start
                log.warning("not serving the API on %s: the path is longer than a Unix socket's %d bytes (give "
                            "--unix-socket a shorter one)", path, MAX_SOCKET_PATH)
                return None
            raise InvalidArgument(f"--unix-socket: {path} is longer than a Unix socket's {MAX_SOCKET_PATH} bytes",
                                  field="--unix-socket")
        if path.is_socket():
            path.unlink()  # left by a daemon that died (the data-dir lock is ours now)
        try:
            with owner_only_umask():  # gRPC makes the socket with the umask's mode
                bound = self.server.add_insecure_port(f"unix:{path}")
        except RuntimeError:
            bound = 0
        if bound == 0:
            raise FailedPrecondition(f"--unix-socket: cannot listen on {path}", field="--unix-socket")
        os.chmod(path, 0o600)
        return path

    def _serve_console_socket(self) -> Path | None:
        """The public API on a Unix socket for the web console alone: owner-only like the daemon's own, and a call
        there is the owner's unless it carries the console's secret, made now and held only in this process's
        memory (auth.py): with it, the console says for whom it calls, and the API decides what they may do. It
        reaches the API whatever its TLS (the console's callers were authenticated by the console's own HTTPS)."""
        if self.console is None:
            return None
        path = self.cfg.data_dir / "console.sock"
        if len(str(path)) > MAX_SOCKET_PATH:  # a deep data dir: a private directory of its own instead
            path = Path(tempfile.mkdtemp(prefix="peloton-console-")) / "api.sock"
        path.unlink(missing_ok=True)  # left by a daemon that died (the data-dir lock is ours now)
        try:
            with owner_only_umask():
                bound = self.server.add_insecure_port(f"unix:{path}")
        except RuntimeError:
            bound = 0
        if bound == 0:
            raise FailedPrecondition(f"--ui-listen: cannot serve the console's API socket {path}", field="--ui-listen")
        os.chmod(path, 0o600)
        self.authenticator.console_secret = secrets.token_hex(32)
        return path

    def _channel(self, address: str) -> grpc.Channel:
        """To another process's internal services (the calls present the shared secret: `_stub`)."""
        ch = grpc.insecure_channel(address, options=[*MESSAGE_LIMITS, *RECONNECT])
        self.channels.append(ch)
        return ch

    def _stub(self, stub: Callable[[grpc.Channel], Any], addresses: str, role: str,
              client: Callable[[Any], Any]) -> Any:
        """The typed client of the `role` process's internal services, at one address or at several (its leader
        and standbys, leadership/failover.py); None when this process calls no other (a resmgr or hostmgr process
        alone)."""
        listed = split_addresses(addresses)
        if not listed or not self.cfg.roles & {"jobmgr", "placement"}:
            return None
        secret = [(METADATA_KEY, load_secret(self.cfg.secret_file(), create=False))]  # with every call
        stubs = [ConnectedStub(stub(ch), ch, secret) for ch in (self._channel(a) for a in listed)]
        return client(stubs[0] if len(stubs) == 1 else FailoverStub(stubs, listed, role))

    def _serve_internal(self, hostmgr: HostManagerServicer | None,
                        resmgr: ResourceManagerServicer | None) -> grpc.Server:
        """The internal services of the components this process runs, for the other processes of a split
        deployment: on their own listener, only to callers with the shared secret (never on the public port)."""
        cfg = self.cfg
        secret = load_secret(cfg.secret_file(), create=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=16, thread_name_prefix="grpc-internal"),
                             options=[("grpc.so_reuseport", 0), *MESSAGE_LIMITS, *KEEPALIVE_ALLOWED],
                             interceptors=[RequireSecret(secret), RequireLeader(self._leads, self._leader),
                                           RejectUndecodableRequests(refuse_non_finite=("/peloton.v1.",))])
        if hostmgr is not None:
            internal_pb2_grpc.add_HostManagerInternalServicer_to_server(hostmgr, server)
        if resmgr is not None:
            internal_pb2_grpc.add_ResourceManagerInternalServicer_to_server(resmgr, server)
        address = cfg.internal_address()
        if address.startswith("unix:"):
            Path(address[5:]).unlink(missing_ok=True)  # left by a daemon that died (the data-dir lock is ours)
        try:
            with owner_only_umask():  # a unix: socket gets the umask's mode
                bound = server.add_insecure_port(address)
        except RuntimeError:
            bound = 0
        if bound == 0:
            raise FailedPrecondition(f"--internal-listen: cannot listen on {address} (address in use, or not ours)",
                                     field="--internal-listen")
        if address.startswith("unix:"):
            os.chmod(address[5:], 0o600)
        server.start()
        log.info("internal services for the other components on %s (shared secret %s)", address, cfg.secret_file())
        return server

    def _recover(self, jm: JobManager, timeout_s: float = 120.0) -> None:
        """Recovery needs the host manager and resmgr; in a split deployment they may still be starting."""
        retry_call(jm.recover, backoff=Backoff(0.25, 2.0), budget_s=timeout_s,
                   retry_if=lambda e: isinstance(e, Unavailable),
                   on_retry=lambda e, _: log.info("recovery waits for resmgr/hostmgr to come up"))

    def _fenced(self, why: str) -> None:
        """A commit found a newer epoch: another daemon leads. Stop acting now; the store guard finds the lock
        gone and stands by."""
        if self.jobmgr is not None:
            self.jobmgr.stop_acting(why)

    def _leads(self) -> bool:
        """This process acts for its roles (leadership/hold.py)."""
        return self.hold.leads()

    def _leader(self) -> Owner | None:
        return self.hold.leader()

    def _stop_acting(self, why: str, leader: str) -> None:
        """The locks were lost, or another process holds them: the job manager refuses changes; the internal
        services and the placement loop stop on `_leads()`."""
        if self.jobmgr is not None:
            self.jobmgr.stop_acting(why, leader)

    def _load_drains(self) -> None:
        """The host manager's drains as the store has them (none kept without a store: in memory only)."""
        if self.hostmgr is not None and self.engine is not None:
            with db.transaction(self.sessions) as s:
                self.hostmgr.load_drains(repo.get_drains(s))

    def _regained(self) -> None:
        """The roles' locks are ours again: what happened meanwhile is read back exactly as after a restart."""
        self.hold.regained(self.sessions if self.engine is not None else None, store=self.jobmgr is not None)
        if self.hostmgr is not None:
            self._load_drains()  # another daemon may have drained or undrained hosts meanwhile
            self.hostmgr.backend.lead_again()
        if self.resmgr is not None:
            self.resmgr.refresh_pools()  # another daemon may have changed them while this one did not lead
            self.resmgr.reset()
        if self.placement is not None:  # resmgr refuses the old id if another engine asked meanwhile
            self.placement.id = uuid.uuid4().hex
        jm = self.jobmgr
        if jm is None:
            return
        jm.launcher.id = uuid.uuid4().hex  # (the same for the job manager's placements)
        jm.act_again()
        try:
            jm.recover()
        except Exception:
            jm.stop_acting("this daemon is recovering after losing its hold on the store; retry later")
            raise

    def _update_health(self) -> bool:
        """NOT_SERVING while any loop is stuck (health.py: its thread gone, a due pass not begun, a pass without
        progress past its patience, each judged by the loop's own period), the store does not answer, or this
        daemon does not hold the store lock: operators see it in health. Each role this process runs has a
        service of its own too (`peloton.jobmgr`, ...), NOT_SERVING while one of its own loops is stuck. Judged
        every 5 s (the health loop, which pushes changes to watchers), by the store loop when the store comes or
        goes, and at every Check (so a check never reads a stale answer, even with the health loop stuck)."""
        if not self._judging:
            return False
        with self._health_mu:
            v = judge([lp.state() for lp in self.all_loops()], self.cfg.roles, self.clock.now(),
                      store_ok=self.guard is None or self.guard.healthy, leads=self.guard is None or self.guard.acting)
            for name, why in v.stuck.items():
                if self._stuck.get(name) is None:
                    log.error("loop %s is stuck: %s; health NOT_SERVING until it moves again", name, why)
            for name in self._stuck.keys() - v.stuck.keys():
                log.warning("loop %s moves again", name)
            self._stuck = v.stuck
            for role in self.cfg.roles:
                LEADER.labels(role).set(1 if self.guard is None or self.guard.acting else 0)
            serving, not_serving = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
            judged = {HEALTH_SERVICE: v.serving, "": v.serving, **{f"{HEALTH_SERVICE}.{role}": ok
                                                                     for role, ok in sorted(v.roles.items())}}
            for service, ok in judged.items():
                status = serving if ok else not_serving
                if self._judged.get(service) != status:  # (each set is sent to every Watch stream)
                    self.health.set(service, status)
                    self._judged[service] = status
        return False

    def all_loops(self) -> list[Loop]:
        """The daemon's loops and its backend's (the local backend's sandbox sweep and log rotation, the Mesos
        backend's ticker; the sim backend has none)."""
        backend = self.hostmgr.backend if self.hostmgr is not None else None
        return [*self.loops, *getattr(backend, "loops", ())]

    def _retention_once(self, jm: JobManager) -> bool:
        """Jobs that ended longer ago than --job-retention (and their sandboxes), audit records older than
        --audit-retention: deleted in batches, each job in a short commit of its own. True while there is more."""
        now, more = time.time(), False
        if self.cfg.job_retention_s > 0:
            more = jm.purge_finished(now - self.cfg.job_retention_s) >= RETENTION_BATCH
        if self.cfg.audit_retention_s > 0:
            with db.transaction(self.sessions) as s:
                more = repo.delete_audit_before(s, now - self.cfg.audit_retention_s, AUDIT_RETENTION_BATCH) \
                    >= AUDIT_RETENTION_BATCH or more
            progress()
        return more

    def stop(self) -> None:
        """Stop serving, in order: refuse new calls, let each loop finish its pass (at most 3 s), end the calls in
        flight (2 s), release the store lock. Running tasks keep running: the next start adopts them. Once: a
        call while another stops the daemon waits for that one to finish (two stops at once closed the same files
        twice)."""
        if not self._stopping.acquire(blocking=False):
            self._stopped.wait()
            return
        try:
            self._stop_serving()
        finally:
            self._stopped.set()  # (also after a failure: the main thread and a second stop must not wait forever)

    def _stop_serving(self) -> None:
        self._closing.set()
        if self.console is not None:
            self.console.stop()
        census.STORE.attach(None)
        census.CLUSTER.attach(None)
        self.health.enter_graceful_shutdown()
        if self.jobmgr is not None:
            self.jobmgr.hub.close()  # open watches end now instead of holding the shutdown for its grace period
        # every loop is told at once, then awaited (each may be in a long poll of up to a second): the shutdown
        # takes the slowest loop's time, not the sum of them all
        for lp in self.loops:
            lp.signal_stop()
        if self.resmgr is not None:
            self.resmgr.close()  # the placement and launcher loops' long polls answer now
        if self.hostmgr is not None:
            self.hostmgr.close()  # and the task-events loop's
        deadline = time.monotonic() + 3
        for lp in self.loops:
            lp.join(deadline - time.monotonic())
        self.server.stop(grace=2).wait(5)
        if self.console_socket is not None:
            self.console_socket.unlink(missing_ok=True)
            if self.console_socket.parent.name.startswith("peloton-console-"):  # its own private directory
                with contextlib.suppress(OSError):
                    self.console_socket.parent.rmdir()
        if self.internal_server is not None:
            self.internal_server.stop(grace=1).wait(5)
        if getattr(self, "metrics_server", None) is not None:
            self.metrics_server.shutdown()
            self.metrics_server.server_close()
        if self.jobmgr is not None:
            self.jobmgr.stop()
        if self.audit is not None:
            self.audit.stop()
        for ch in self.channels:
            ch.close()
        if self.hostmgr is not None:
            self.hostmgr.stop()
        self.hold.release_store_lock()
        if self.engine is not None:
            self.engine.dispose()
        self.hold.release_data_dir()  # last: free for a standby on this machine or a restart

    def stop_on_signals(self) -> None:
        """SIGTERM and SIGINT stop the daemon gracefully (installed before it says it serves: a signal right after
        that must not kill it abruptly)."""
        def on_signal(signum: int, frame: object) -> None:
            if self._closing.is_set():
                log.info("signal %d: already shutting down", signum)
                return
            log.info("signal %d: shutting down (tasks keep running and are adopted on restart)", signum)
            threading.Thread(target=self.stop, daemon=True).start()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)

    def serve_forever(self) -> None:
        self.stop_on_signals()
        # a wait with a timeout, again and again: a signal delivered to another thread (gRPC's, the loops') only
        # sets a flag that the main thread reads between waits; one endless wait would never see SIGTERM
        while not self._stopped.wait(0.5):
            pass


class _JudgedHealth(health.HealthServicer):
    """The standard health service, judged afresh at every Check (`judge`: cheap, no I/O)."""

    def __init__(self, judge_now: Callable[[], object]) -> None:
        super().__init__()
        self._judge_now = judge_now

    def Check(self, request: health_pb2.HealthCheckRequest, context: grpc.ServicerContext) -> Any:  # noqa: N802
        self._judge_now()
        return super().Check(request, context)


GIL_SWITCH_INTERVAL_S = 0.0005


def run_server(cfg: ServerConfig) -> None:
    # The threads that do I/O (the writer's store round trips, RPCs) give up the interpreter lock at each call and
    # then wait for a busy thread to hand it back: up to the switch interval (5 ms by default) every time, which
    # made a group commit of a few round trips take ~20 ms. A shorter interval bounds that wait (measured:
    # docs/performance.md).
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    count_thread_deaths()
    d = Daemon(cfg)
    address = d.start()
    d.stop_on_signals()
    if d.console is not None:
        print(f"peloton: web console on {d.console.url}", flush=True)
    also = f" and unix:{d.unix_socket}" if d.unix_socket else ""
    print(f"peloton: serving on {address}{also} (pid {os.getpid()}, data {cfg.data_dir})", flush=True)
    d.serve_forever()
    exit_now()


def exit_now() -> None:
    """The daemon has stopped (everything a stop does is done: the calls ended, the journal and the store closed, the
    locks released): the process ends with status 0 without the interpreter's teardown, whose last garbage collection
    of the whole heap and module teardown took 150-250 ms of every SIGTERM on 2 loaded cores, and 0.1 s more of
    CPU (docs/performance.md, "Starting and stopping the daemon"). What is buffered is written first: the log's
    handlers, stdout and stderr."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe: nothing more can be said
            stream.flush()
    os._exit(0)
