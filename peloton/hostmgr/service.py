"""gRPC servicers of the host manager: the internal HostManagerInternal and the public HostService. Thin."""

from __future__ import annotations

import bisect

import grpc

from peloton.api import convert
from peloton.api.status import grpc_errors
from peloton.api.v1 import host_pb2, host_pb2_grpc, internal_pb2, internal_pb2_grpc
from peloton.domain import checks, limits
from peloton.domain.checks import duration_seconds
from peloton.hostmgr.inprocess import MAX_LOG_BYTES
from peloton.hostmgr.manager import HostManager

MAX_RUNNING_PAGE = 10_000


class HostManagerServicer(internal_pb2_grpc.HostManagerInternalServicer):
    def __init__(self, hm: HostManager) -> None:
        self.hm = hm

    @grpc_errors
    def SyncHosts(self, request: internal_pb2.SyncHostsRequest, context: grpc.ServicerContext) -> internal_pb2.SyncHostsResponse:
        r = self.hm.sync(request.since_version, request.stream_id)
        return internal_pb2.SyncHostsResponse(stream_id=r.stream_id, version=r.version, full=r.full,
                                              hosts=[convert.offer_to_proto(o) for o in r.offers],
                                              removed=r.removed)

    @grpc_errors
    def ClaimPlacements(self, request: internal_pb2.ClaimPlacementsRequest, context: grpc.ServicerContext) -> internal_pb2.ClaimPlacementsResponse:
        claimed, refused = self.hm.claim([convert.placement_from_proto(p) for p in request.placements])
        return internal_pb2.ClaimPlacementsResponse(
            claimed=[convert.placement_to_proto(p) for p in claimed],
            refused=[convert.failure_to_proto(f, stale=True) for f in refused],
        )

    @grpc_errors
    def ReleaseClaims(self, request: internal_pb2.ReleaseClaimsRequest, context: grpc.ServicerContext) -> internal_pb2.ReleaseClaimsResponse:
        self.hm.release_claims([(k.gang_id, k.attempt) for k in request.gangs])
        return internal_pb2.ReleaseClaimsResponse()

    @grpc_errors
    def ClusterCapacity(self, request: internal_pb2.ClusterCapacityRequest, context: grpc.ServicerContext) -> internal_pb2.ClusterCapacityResponse:
        version, hosts = self.hm.capacity(request.if_version)
        if hosts is None:
            return internal_pb2.ClusterCapacityResponse(version=version, unchanged=True)
        return internal_pb2.ClusterCapacityResponse(version=version, hosts=[convert.offer_to_proto(o) for o in hosts])

    @grpc_errors
    def LaunchGangs(self, request: internal_pb2.LaunchGangsRequest, context: grpc.ServicerContext) -> internal_pb2.LaunchGangsResponse:
        results = self.hm.launch([convert.gang_launch_from_proto(g) for g in request.gangs])
        return internal_pb2.LaunchGangsResponse(results=[convert.launch_result_to_proto(r) for r in results])

    @grpc_errors
    def KillTasks(self, request: internal_pb2.KillTasksRequest, context: grpc.ServicerContext) -> internal_pb2.KillTasksResponse:
        self.hm.kill(list(request.task_ids), request.grace_s or None)
        return internal_pb2.KillTasksResponse()

    @grpc_errors
    def WaitTaskEvents(self, request: internal_pb2.WaitTaskEventsRequest, context: grpc.ServicerContext) -> internal_pb2.WaitTaskEventsResponse:
        timeout = min(max(request.timeout_ms, 0), 30_000) / 1000.0
        events, gap = self.hm.wait_events(request.after_seq, request.max_events or 1000, timeout)
        return internal_pb2.WaitTaskEventsResponse(
            events=[convert.status_to_proto(st, seq) for seq, st in events], stream_id=self.hm.stream_id, gap=gap
        )

    @grpc_errors
    def AckTaskEvents(self, request: internal_pb2.AckTaskEventsRequest, context: grpc.ServicerContext) -> internal_pb2.AckTaskEventsResponse:
        self.hm.ack_events(request.up_to_seq)
        return internal_pb2.AckTaskEventsResponse()

    @grpc_errors
    def ReconcileTasks(self, request: internal_pb2.ReconcileTasksRequest, context: grpc.ServicerContext) -> internal_pb2.ReconcileTasksResponse:
        statuses = self.hm.reconcile(list(request.task_ids))
        return internal_pb2.ReconcileTasksResponse(statuses=[convert.status_to_proto(s) for s in statuses.values()])

    @grpc_errors
    def ListRunningTasks(self, request: internal_pb2.ListRunningTasksRequest, context: grpc.ServicerContext) -> internal_pb2.ListRunningTasksResponse:
        ids = self.hm.running_task_ids()
        start = bisect.bisect_right(ids, request.page_token) if request.page_token else 0
        size = min(request.page_size or MAX_RUNNING_PAGE, MAX_RUNNING_PAGE)
        page = ids[start:start + size]
        more = start + size < len(ids)
        return internal_pb2.ListRunningTasksResponse(task_ids=page, next_page_token=page[-1] if more else "")

    @grpc_errors
    def ReadTaskLog(self, request: internal_pb2.ReadTaskLogRequest, context: grpc.ServicerContext) -> internal_pb2.ReadTaskLogResponse:
        size = request.max_bytes if 0 < request.max_bytes <= MAX_LOG_BYTES else MAX_LOG_BYTES
        content, nxt = self.hm.read_log(request.task_id, request.stream or "stdout", request.offset, size)
        return internal_pb2.ReadTaskLogResponse(content=content, next_offset=nxt)


    @grpc_errors
    def ListDrains(self, request: internal_pb2.ListDrainsRequest, context: grpc.ServicerContext) -> internal_pb2.ListDrainsResponse:
        return internal_pb2.ListDrainsResponse(drains=self.hm.drains())

    @grpc_errors
    def RemoveSandboxes(self, request: internal_pb2.RemoveSandboxesRequest, context: grpc.ServicerContext) -> internal_pb2.RemoveSandboxesResponse:
        return internal_pb2.RemoveSandboxesResponse(removed=self.hm.remove_sandboxes(list(request.job_ids)))


class HostServicer(host_pb2_grpc.HostServiceServicer):
    def __init__(self, hm: HostManager) -> None:
        self.hm = hm

    @grpc_errors
    def ListHosts(self, request: host_pb2.ListHostsRequest, context: grpc.ServicerContext) -> host_pb2.ListHostsResponse:
        drains, health, windows = self.hm.drains(), self.hm.health(), self.hm.maintenance()
        return host_pb2.ListHostsResponse(hosts=[
            convert.host_to_proto(h, held, drains.get(h.hostname), health.get(h.hostname, ""),
                                  maintenance=h.hostname in windows)
            for h, held in self.hm.hosts()])

    @grpc_errors
    def DrainHost(self, request: host_pb2.DrainHostRequest, context: grpc.ServicerContext) -> host_pb2.DrainHostResponse:
        _hostname(request.hostname)
        deadline = 0.0
        if request.HasField("deadline"):
            after = duration_seconds(request.deadline.seconds, request.deadline.nanos, "deadline")
            checks.number(after, "deadline", minimum=0, maximum=limits.MAX_DRAIN_DEADLINE_S, unit="s")
            deadline = self.hm.clock() + after
        self.hm.drain(request.hostname, deadline)
        return host_pb2.DrainHostResponse(host=self._host(request.hostname))

    @grpc_errors
    def UndrainHost(self, request: host_pb2.UndrainHostRequest, context: grpc.ServicerContext) -> host_pb2.UndrainHostResponse:
        _hostname(request.hostname)
        self.hm.undrain(request.hostname)
        return host_pb2.UndrainHostResponse(host=self._host(request.hostname))

    def _host(self, hostname: str) -> host_pb2.Host:
        drains, windows = self.hm.drains(), self.hm.maintenance()
        for h, held in self.hm.hosts():
            if h.hostname == hostname:
                return convert.host_to_proto(h, held, drains.get(hostname), maintenance=hostname in windows)
        return host_pb2.Host(hostname=hostname)  # gone meanwhile


def _hostname(name: str) -> None:
    checks.text(name, "hostname", max_chars=255)
    if not name.strip():
        raise checks.bad("hostname", "is required")
