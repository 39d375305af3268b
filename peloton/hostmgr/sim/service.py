"""gRPC servicer of the sim backend's failure injection (SimService). Thin; registered only with the sim backend."""

from __future__ import annotations

from typing import TYPE_CHECKING

from peloton.api.status import grpc_errors
from peloton.api.v1 import sim_pb2, sim_pb2_grpc
from peloton.errors import InvalidArgument
from peloton.hostmgr.sim.backend import SimBackend

if TYPE_CHECKING:
    import grpc


class SimServicer(sim_pb2_grpc.SimServiceServicer):
    def __init__(self, backend: SimBackend) -> None:
        self.backend = backend

    @grpc_errors
    def FailHost(self, request: sim_pb2.FailHostRequest, context: grpc.ServicerContext) -> sim_pb2.FailHostResponse:
        if not request.hostname:
            raise InvalidArgument("hostname: required", field="hostname")
        after = None
        if request.HasField("recover_after"):
            d = request.recover_after
            after = d.seconds + d.nanos / 1e9
            if after <= 0:
                raise InvalidArgument(f"recover_after: must be greater than 0, got {after:g}s", field="recover_after")
        lost = self.backend.fail_host(request.hostname, after)
        return sim_pb2.FailHostResponse(tasks_lost=lost)

    @grpc_errors
    def RecoverHost(self, request: sim_pb2.RecoverHostRequest, context: grpc.ServicerContext) -> sim_pb2.RecoverHostResponse:
        if not request.hostname:
            raise InvalidArgument("hostname: required", field="hostname")
        return sim_pb2.RecoverHostResponse(was_down=self.backend.recover_host(request.hostname))
