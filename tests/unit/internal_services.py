"""The typed clients of a real resmgr and host manager, as a job manager or placement engine holds them: over real
gRPC (a split deployment's) or in one process. The tests that run both ways share them from here."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from concurrent import futures

import grpc

from peloton.api.clients import HostManagerClient, ResourceManagerClient
from peloton.api.grpc_clients import GrpcHostManager, GrpcResourceManager
from peloton.api.v1 import internal_pb2_grpc
from peloton.hostmgr.inprocess import InProcessHostManager
from peloton.hostmgr.manager import HostManager
from peloton.hostmgr.service import HostManagerServicer
from peloton.resmgr.inprocess import InProcessResourceManager
from peloton.resmgr.manager import ResourceManager
from peloton.resmgr.service import ResourceManagerServicer


@contextlib.contextmanager
def resmgr_and_hostmgr_clients(via: str, rm: ResourceManager,
                               hm: HostManager) -> Iterator[tuple[ResourceManagerClient, HostManagerClient]]:
    """Clients of `rm` and `hm`: via "grpc", through a gRPC server of both on a local port (stopped after the
    block), else ("inprocess") the in-process ones."""
    if via == "inprocess":
        yield InProcessResourceManager(rm), InProcessHostManager(hm)
        return
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    internal_pb2_grpc.add_ResourceManagerInternalServicer_to_server(ResourceManagerServicer(rm), server)
    internal_pb2_grpc.add_HostManagerInternalServicer_to_server(HostManagerServicer(hm), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield (GrpcResourceManager(internal_pb2_grpc.ResourceManagerInternalStub(channel)),
               GrpcHostManager(internal_pb2_grpc.HostManagerInternalStub(channel)))
    finally:
        channel.close()
        server.stop(None)
