"""gRPC servicers of the host manager: the internal HostManagerInternal and the public HostService. Thin."""

from __future__ import annotations

import grpc

from peloton.api import convert
from peloton.api.status import grpc_errors
from peloton.api.v1 import host_pb2, host_pb2_grpc, internal_pb2, internal_pb2_grpc
from peloton.hostmgr.backend import LaunchError
from peloton.hostmgr.manager import HostManager

MAX_LOG_BYTES = 4 * 1024 * 1024


class HostManagerServicer(internal_pb2_grpc.HostManagerInternalServicer):
    def __init__(self, hm: HostManager) -> None:
        self.hm = hm

    @grpc_errors
    def AcquireHostOffers(self, request, context):  # type: ignore[no-untyped-def]
        lease_id, offers = self.hm.acquire_offers(request.lease_seconds or 30)
        return internal_pb2.AcquireHostOffersResponse(
            lease_id=lease_id, offers=[convert.offer_to_proto(o) for o in offers]
        )

    @grpc_errors
    def ReleaseHostOffers(self, request, context):  # type: ignore[no-untyped-def]
        keep = [m for p in request.keep for m in convert.placement_from_proto(p).members]
        self.hm.retain(request.lease_id, keep)
        return internal_pb2.ReleaseHostOffersResponse()

    @grpc_errors
    def ClusterCapacity(self, request, context):  # type: ignore[no-untyped-def]
        return internal_pb2.ClusterCapacityResponse(hosts=[convert.offer_to_proto(o) for o in self.hm.capacity()])

    @grpc_errors
    def LaunchGang(self, request, context):  # type: ignore[no-untyped-def]
        tasks = [convert.launch_from_proto(t) for t in request.tasks]
        try:
            self.hm.launch_gang(request.lease_id, tasks)
        except LaunchError as e:
            return internal_pb2.LaunchGangResponse(ok=False, failed_task_id=e.task_id, message=e.message)
        return internal_pb2.LaunchGangResponse(ok=True)

    @grpc_errors
    def KillTasks(self, request, context):  # type: ignore[no-untyped-def]
        self.hm.kill(list(request.task_ids))
        return internal_pb2.KillTasksResponse()

    @grpc_errors
    def WaitTaskEvents(self, request, context):  # type: ignore[no-untyped-def]
        timeout = min(max(request.timeout_ms, 0), 30_000) / 1000.0
        events = self.hm.wait_events(request.after_seq, request.max_events or 1000, timeout)
        return internal_pb2.WaitTaskEventsResponse(
            events=[convert.status_to_proto(st, seq) for seq, st in events], stream_id=self.hm.stream_id
        )

    @grpc_errors
    def AckTaskEvents(self, request, context):  # type: ignore[no-untyped-def]
        self.hm.ack_events(request.up_to_seq)
        return internal_pb2.AckTaskEventsResponse()

    @grpc_errors
    def ReconcileTasks(self, request, context):  # type: ignore[no-untyped-def]
        statuses = self.hm.reconcile(list(request.task_ids), request.kill_unknown)
        return internal_pb2.ReconcileTasksResponse(statuses=[convert.status_to_proto(s) for s in statuses.values()])

    @grpc_errors
    def ReadTaskLog(self, request, context):  # type: ignore[no-untyped-def]
        tail = request.tail_bytes if 0 < request.tail_bytes <= MAX_LOG_BYTES else MAX_LOG_BYTES
        return internal_pb2.ReadTaskLogResponse(content=self.hm.read_log(request.task_id, request.stream or "stdout", tail))


class HostServicer(host_pb2_grpc.HostServiceServicer):
    def __init__(self, hm: HostManager) -> None:
        self.hm = hm

    @grpc_errors
    def ListHosts(self, request, context: grpc.ServicerContext):  # type: ignore[no-untyped-def]
        return host_pb2.ListHostsResponse(hosts=[convert.host_to_proto(h, held) for h, held in self.hm.hosts()])
