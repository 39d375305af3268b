"""The all-in-one daemon: store, host manager (local backend), resource manager, placement engine and job
manager in one process behind one gRPC server. The components still talk to each other over gRPC, through the
same server, so splitting them into processes later changes wiring, not contracts."""

from __future__ import annotations

import fcntl
import logging
import os
import signal
import threading
import time
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import start_http_server

from peloton.api.v1 import (
    host_pb2,
    host_pb2_grpc,
    internal_pb2,
    internal_pb2_grpc,
    job_pb2,
    job_pb2_grpc,
    respool_pb2,
    respool_pb2_grpc,
    task_pb2,
    task_pb2_grpc,
)
from peloton.config import split_hostport
from peloton.domain.resources import Resources
from peloton.errors import FailedPrecondition, InvalidArgument
from peloton.hostmgr.backend import Backend
from peloton.hostmgr.local.backend import LocalBackend, make_local_hosts
from peloton.hostmgr.manager import HostManager
from peloton.hostmgr.service import HostManagerServicer, HostServicer
from peloton.jobmgr.manager import JobManager
from peloton.jobmgr.service import JobServicer, TaskServicer
from peloton.loop import Loop
from peloton.placement.engine import PlacementEngine
from peloton.resmgr.manager import ResourceManager
from peloton.resmgr.service import ResourceManagerServicer, ResourcePoolServicer
from peloton.store import db, repo

log = logging.getLogger("peloton.server")

HEALTH_SERVICE = "peloton"
ROLES = frozenset({"jobmgr", "resmgr", "placement", "hostmgr"})


@dataclass
class ServerConfig:
    listen: str
    db_url: str | None
    data_dir: Path
    local_hosts: int | None = None
    local_host_resources: Resources | None = None
    local_port_base: int = 31000
    metrics_listen: str = ""
    workers: int = 32
    backend: str = "local"  # local | mesos
    mesos: MesosSettings | None = None
    # Which components this process runs; the others are reached over gRPC at the given addresses.
    roles: frozenset[str] = ROLES
    resmgr_address: str = ""
    hostmgr_address: str = ""

    def check(self) -> None:
        unknown = self.roles - ROLES
        if unknown or not self.roles:
            raise InvalidArgument(f"--role: unknown role(s) {sorted(unknown)}; known: {', '.join(sorted(ROLES))}",
                                  field="--role")
        needs_resmgr = self.roles & {"jobmgr", "placement"}
        if needs_resmgr and "resmgr" not in self.roles and not self.resmgr_address:
            raise InvalidArgument("--resmgr: the address of the resmgr process is required without --role resmgr",
                                  field="--resmgr")
        if needs_resmgr and "hostmgr" not in self.roles and not self.hostmgr_address:
            raise InvalidArgument("--hostmgr: the address of the hostmgr process is required without --role hostmgr",
                                  field="--hostmgr")


@dataclass
class MesosSettings:
    masters: list[str]
    role: str = "*"
    principal: str = ""
    secret_file: str = ""
    failover_timeout_s: float = 7 * 24 * 3600.0
    framework_name: str = "peloton"
    user: str = "root"


class Daemon:
    def __init__(self, cfg: ServerConfig) -> None:
        self.cfg = cfg
        self.loops: list[Loop] = []
        self._stopped = threading.Event()

    def _lock_data_dir(self) -> None:
        self.cfg.data_dir.mkdir(parents=True, exist_ok=True)
        self._lock_file = open(self.cfg.data_dir / "daemon.lock", "w")  # noqa: SIM115 - held for the lifetime
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise FailedPrecondition(
                f"another peloton daemon is running with data dir {self.cfg.data_dir}"
            ) from None

    def _make_backend(self) -> Backend:
        cfg = self.cfg
        if cfg.backend == "mesos":
            from peloton.hostmgr.mesos.backend import make_mesos_backend

            assert cfg.mesos is not None
            return make_mesos_backend(cfg.mesos, self.sessions)
        hosts = make_local_hosts(cfg.local_hosts, cfg.local_host_resources, port_base=cfg.local_port_base,
                                 data_dir=cfg.data_dir)
        return LocalBackend(cfg.data_dir / "local", hosts)

    def start(self) -> str:
        cfg = self.cfg
        cfg.check()
        roles = cfg.roles
        self._lock_data_dir()
        self.engine = None
        if roles & {"jobmgr", "resmgr"} or cfg.backend == "mesos":
            url = cfg.db_url or db.default_sqlite_url(cfg.data_dir)
            db.upgrade(url)
            self.engine = db.make_engine(url)
            self.sessions = db.make_sessions(self.engine)
            with db.transaction(self.sessions) as s:
                repo.ensure_root_pool(s, time.time())

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=cfg.workers, thread_name_prefix="grpc"))
        self.health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        services: list[tuple[Any, str]] = []
        self.hostmgr: HostManager | None = None
        if "hostmgr" in roles:
            self.hostmgr = HostManager(self._make_backend())
            self.hostmgr.start()
            internal_pb2_grpc.add_HostManagerInternalServicer_to_server(HostManagerServicer(self.hostmgr),
                                                                        self.server)
            host_pb2_grpc.add_HostServiceServicer_to_server(HostServicer(self.hostmgr), self.server)
            services += [(internal_pb2.DESCRIPTOR, "HostManagerInternal"), (host_pb2.DESCRIPTOR, "HostService")]
        if "resmgr" in roles:
            def load_pools():  # type: ignore[no-untyped-def]
                with db.transaction(self.sessions) as s:
                    return repo.list_pools(s)

            self.resmgr = ResourceManager(load_pools)
            internal_pb2_grpc.add_ResourceManagerInternalServicer_to_server(ResourceManagerServicer(self.resmgr),
                                                                            self.server)
            respool_pb2_grpc.add_ResourcePoolServiceServicer_to_server(
                ResourcePoolServicer(self.resmgr, self.sessions), self.server)
            services += [(internal_pb2.DESCRIPTOR, "ResourceManagerInternal"),
                         (respool_pb2.DESCRIPTOR, "ResourcePoolService")]
        host, port = split_hostport(cfg.listen, "--listen")
        bound = self.server.add_insecure_port(f"{host}:{port}")
        if bound == 0:
            raise FailedPrecondition(f"--listen: cannot bind {cfg.listen}")
        self.address = f"{'127.0.0.1' if host in ('0.0.0.0', '', '[::]', '::') else host}:{bound}"

        # the components talk gRPC even inside one process: splitting them changes addresses, not contracts
        self.channels = [grpc.insecure_channel(self.address)]
        resmgr_ch = self.channels[0] if "resmgr" in roles else self._channel(cfg.resmgr_address)
        hostmgr_ch = self.channels[0] if "hostmgr" in roles else self._channel(cfg.hostmgr_address)
        resmgr_stub = internal_pb2_grpc.ResourceManagerInternalStub(resmgr_ch)
        hostmgr_stub = internal_pb2_grpc.HostManagerInternalStub(hostmgr_ch)
        self.jobmgr: JobManager | None = None
        if "jobmgr" in roles:
            self.jobmgr = JobManager(self.sessions, resmgr_stub, hostmgr_stub)
            job_pb2_grpc.add_JobServiceServicer_to_server(JobServicer(self.jobmgr), self.server)
            task_pb2_grpc.add_TaskServiceServicer_to_server(TaskServicer(self.jobmgr), self.server)
            services += [(job_pb2.DESCRIPTOR, "JobService"), (task_pb2.DESCRIPTOR, "TaskService")]
        names = [d.services_by_name[n].full_name for d, n in services]
        reflection.enable_server_reflection([*names, health.SERVICE_NAME, reflection.SERVICE_NAME], self.server)
        self.health.set(HEALTH_SERVICE, health_pb2.HealthCheckResponse.NOT_SERVING)
        self.health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        self.server.start()

        self.loops = []
        if self.jobmgr is not None:
            # recovery before any loop runs: adopt whole gangs, tear down partial ones, re-queue the rest
            self._recover(self.jobmgr)
            self.loops += [
                Loop("launcher", self.jobmgr.launch_once, 0.05),
                Loop("task-events", self.jobmgr.events_once, 0.05),
                Loop("reconciler", self.jobmgr.reconcile_once, 5.0),
            ]
        if "placement" in roles:
            self.loops.append(Loop("placement", PlacementEngine(resmgr_stub, hostmgr_stub).run_once, 0.05))
        self.loops.append(Loop("health", self._update_health, 5.0))
        for lp in self.loops:
            lp.start()
        if cfg.metrics_listen:
            mhost, mport = split_hostport(cfg.metrics_listen, "--metrics-listen")
            start_http_server(mport, addr=mhost)
        self.health.set(HEALTH_SERVICE, health_pb2.HealthCheckResponse.SERVING)
        self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        (cfg.data_dir / "daemon.addr").write_text(self.address + "\n")
        return self.address

    def _channel(self, address: str) -> grpc.Channel:
        ch = grpc.insecure_channel(address)
        self.channels.append(ch)
        return ch

    def _recover(self, jm: JobManager, timeout_s: float = 120.0) -> None:
        """Recovery needs the host manager and resmgr; in a split deployment they may still be starting."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                jm.recover()
                return
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:  # type: ignore[attr-defined]
                    raise
                log.info("recovery waits for resmgr/hostmgr to come up")
                time.sleep(1.0)

    def _update_health(self) -> bool:
        """NOT_SERVING while any loop is dead or stuck (no heartbeat for a minute): operators see it in health."""
        now = time.time()
        ok = all(lp.healthy(now) for lp in self.loops if lp.name != "health")
        status = health_pb2.HealthCheckResponse.SERVING if ok else health_pb2.HealthCheckResponse.NOT_SERVING
        self.health.set(HEALTH_SERVICE, status)
        self.health.set("", status)
        return False

    def stop(self) -> None:
        """Stop serving. Running tasks keep running: the next start adopts them."""
        self.health.enter_graceful_shutdown()
        for lp in self.loops:
            lp.stop(timeout=3)
        self.server.stop(grace=2).wait(5)
        for ch in self.channels:
            ch.close()
        if self.hostmgr is not None:
            self.hostmgr.stop()
        if self.engine is not None:
            self.engine.dispose()
        self._stopped.set()

    def serve_forever(self) -> None:
        def on_signal(signum: int, frame: object) -> None:
            log.info("signal %d: shutting down (tasks keep running and are adopted on restart)", signum)
            threading.Thread(target=self.stop, daemon=True).start()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        self._stopped.wait()


def run_server(cfg: ServerConfig) -> None:
    d = Daemon(cfg)
    address = d.start()
    print(f"peloton: serving on {address} (pid {os.getpid()}, data {cfg.data_dir})", flush=True)
    d.serve_forever()
