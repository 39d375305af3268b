"""What a standby serves while it waits to take over: the same port as when it leads, answering every call with
UNAVAILABLE and the leader's address (the message, and the trailing metadata `peloton-leader` that clients follow),
and health NOT_SERVING (`peloton.standby` SERVING, for a liveness probe). It knows nothing else: jobs are read
from the leader. Taking over stops it and serves the full API on the same port (server.py)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent import futures
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from peloton.api.edge import PUBLIC_PORT_OPTIONS, GatePublicReads, refusing
from peloton.config import split_hostport
from peloton.errors import FailedPrecondition
from peloton.store.lock import Owner

log = logging.getLogger(__name__)

LEADER_METADATA = "peloton-leader"  # the leader's advertised address, on every answer of a standby
HEALTH_SERVICE = "peloton.standby"


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
        if handler_call_details.method.startswith("/grpc.health.v1.Health/"):  # type: ignore[attr-defined]
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
