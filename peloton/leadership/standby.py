"""What a standby serves while it waits to take over: the same port as when it leads, answering every call with
UNAVAILABLE and the leader's address (the message, and the trailing metadata `peloton-leader` that clients follow),
and health NOT_SERVING (`peloton.leadership.standby` SERVING, for a liveness probe). It knows nothing else: jobs are read
from the leader. Taking over stops it and serves the full API on the same port (server.py).

And whether a standby could adopt the leader's tasks at all: on the local backend they are processes of the
leader's machine, recorded in its data dir, so only a daemon on that machine with that data dir can; one that
could not refuses to stand by (`adoption_refusal`), at start and again before it takes over."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import uuid
from collections.abc import Callable
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from peloton.api.edge import PUBLIC_PORT_OPTIONS, GatePublicReads, refusing
from peloton.config import split_hostport
from peloton.errors import FailedPrecondition
from peloton.leadership.owner import Owner

DATA_DIR_ID_FILE = "daemon.id"

log = logging.getLogger(__name__)

LEADER_METADATA = "peloton-leader"  # the leader's advertised address, on every answer of a standby
HEALTH_SERVICE = "peloton.leadership.standby"


def leader_hint(leader: Owner | None) -> tuple[str, list[tuple[str, str]]]:
    """The message and trailing metadata a standby answers with."""
    if leader is None or not leader.address:
        return ("this daemon is a standby and no leader is known yet (one is being elected); retry later",
                [("retry-after-ms", "1000")])
    return (f"this daemon is a standby; the leader is {leader.address} ({leader.describe()})",
            [(LEADER_METADATA, leader.address), ("retry-after-ms", "500")])


class _Redirect(grpc.GenericRpcHandler):
    """Every method but health's: UNAVAILABLE, naming the leader."""

    def __init__(self, leader: Callable[[], Owner | None]) -> None:
        self._leader = leader

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        if handler_call_details.method.startswith("/grpc.health.v1.Health/"):
            return None
        # answers unary and streaming calls alike, with a status before any message, the request left unread
        return refusing(grpc.StatusCode.UNAVAILABLE, lambda: leader_hint(self._leader()))


class StandbyServer:
    def __init__(self, listen: str, leader: Callable[[], Owner | None],
                 credentials: grpc.ServerCredentials | None = None) -> None:
        """`leader()`: who leads now, as the store lock's holder recorded itself (read on each call)."""
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="grpc-standby"),
                                   options=[("grpc.so_reuseport", 0), *PUBLIC_PORT_OPTIONS],
                                   interceptors=[GatePublicReads(("/grpc.health.v1.Health/",))])
        self._server.add_generic_rpc_handlers((_Redirect(leader),))
        self.health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        for name in ("", "peloton"):
            self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        self.health.set(HEALTH_SERVICE, health_pb2.HealthCheckResponse.SERVING)
        host, port = split_hostport(listen, "--listen")
        try:
            bound = (self._server.add_secure_port(f"{host}:{port}", credentials) if credentials is not None
                     else self._server.add_insecure_port(f"{host}:{port}"))
        except RuntimeError:
            bound = 0
        if bound == 0:
            raise FailedPrecondition(f"--listen: cannot listen on {listen} (address in use, or not ours)",
                                     field="--listen")
        self.listen = f"{host}:{bound}"  # what the daemon binds again when it takes over
        self._server.start()

    def stop(self) -> None:
        """Let the calls in flight finish; the port is free for the leader's server once this returns."""
        self._server.stop(grace=0.5).wait(2)


class RequireLeader(grpc.ServerInterceptor):
    """The internal services of a process that holds the locks of its roles but does not act (another process
    took over while it was paused or cut off): UNAVAILABLE to every call, so its peers move on to the leader
    (api/failover.py), as they do from a standby that does not listen yet."""

    def __init__(self, leads: Callable[[], bool], leader: Callable[[], Owner | None]) -> None:
        self._leads = leads
        self._refuse = refusing(grpc.StatusCode.UNAVAILABLE, lambda: leader_hint(leader()))

    def intercept_service(self, continuation: Callable[..., Any], details: grpc.HandlerCallDetails) -> Any:
        return continuation(details) if self._leads() else self._refuse


def machine_id() -> str:
    """The processes this daemon can see and signal: this boot of the kernel and this PID namespace (two containers
    of one machine are two machines here). The host name where /proc does not say."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        return f"{boot}/pid:{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return f"host:{socket.gethostname()}"


def data_dir_id(data_dir: Path) -> str:
    """The data dir's id, made at its first use (a random one in `daemon.id`, owner-only): the same directory under
    whatever path, and never a copy of it made before the first daemon wrote it."""
    path = data_dir / DATA_DIR_ID_FILE
    with contextlib.suppress(FileExistsError):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(uuid.uuid4().hex + "\n")
    text = path.read_text().strip()
    if not text:  # a daemon that died between making and writing it: make it again
        path.unlink()
        return data_dir_id(data_dir)
    return text


GUIDE = "docs/running.md#a-leader-and-standbys"


def adoption_refusal(me: Owner, leader: Owner | None) -> FailedPrecondition | None:
    """Why this daemon, standing by, could not adopt the tasks of `leader` (the host manager's leader as it recorded
    itself) once it took over, or None when it could, or cannot tell (it runs no host manager; no leader recorded
    yet; a leader of a release that did not record what it runs). Taking over anyway would run again gangs whose
    processes still run (a paused leader's)."""
    if not me.backend or leader is None or not leader.backend:
        return None
    who = leader.describe()
    if leader.backend != me.backend:
        return FailedPrecondition(
            f"--standby: this daemon could not adopt the leader's tasks: the leader ({who}) runs the "
            f"{leader.backend} backend, and this daemon the {me.backend} one; start a standby with the leader's flags "
            f"({GUIDE})", field="--backend")
    if me.backend != "local":
        return None  # Mesos: the master knows every task, a standby anywhere adopts them (sim: nothing outlives it)
    if leader.machine != me.machine:
        return FailedPrecondition(
            f"--standby: this daemon could not adopt the leader's tasks: on the local backend they are processes of "
            f"the leader's machine ({who}), and this daemon runs on another machine. A local-backend standby runs on "
            f"the leader's machine with its --data-dir ({leader.data_dir}); for a standby on another machine use the "
            f"Mesos backend ({GUIDE})", field="--standby")
    if leader.data_dir_id != me.data_dir_id:
        other = "another directory (another daemon.id)" if leader.data_dir == me.data_dir else "another"
        return FailedPrecondition(
            f"--standby: this daemon could not adopt the leader's tasks: on the local backend they are recorded in "
            f"the leader's data dir {leader.data_dir} ({who}), and this daemon's --data-dir {me.data_dir} is "
            f"{other}. Start it with --data-dir {leader.data_dir} ({GUIDE})", field="--data-dir")
    return None
