"""gRPC servicers of the host manager: the internal HostManagerInternal and the public HostService. Thin."""

from __future__ import annotations

import base64
import binascii
import bisect
import json
from collections.abc import Callable
from typing import Any

import grpc

from peloton.api import convert
from peloton.api.status import grpc_errors
from peloton.api.v1 import host_pb2, host_pb2_grpc, internal_pb2, internal_pb2_grpc
from peloton.domain import checks, limits
from peloton.domain.checks import duration_seconds
from peloton.domain.gpumap import HOST_STATUSES, Waiting
from peloton.hostmgr import listing
from peloton.hostmgr.inprocess import MAX_LOG_BYTES
from peloton.hostmgr.manager import HostManager

MAX_RUNNING_PAGE = 10_000
MAX_HOST_FILTERS = 32  # states or labels in one ListHosts request


class HostManagerServicer(internal_pb2_grpc.HostManagerInternalServicer):
    def __init__(self, hm: HostManager) -> None:
        self.hm = hm

    @grpc_errors
    def SyncHosts(self, request: internal_pb2.SyncHostsRequest, context: grpc.ServicerContext) -> internal_pb2.SyncHostsResponse:
        r = self.hm.sync(request.since_version, request.stream_id, idle=request.idle)
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
        return internal_pb2.LaunchGangsResponse(results=[convert.launch_result_to_proto(r) for r in results],
                                                shared_read=True)

    @grpc_errors
    def KillTasks(self, request: internal_pb2.KillTasksRequest, context: grpc.ServicerContext) -> internal_pb2.KillTasksResponse:
        self.hm.kill(list(request.task_ids), request.grace_s or None)
        return internal_pb2.KillTasksResponse()

    @grpc_errors
    def WaitTaskEvents(self, request: internal_pb2.WaitTaskEventsRequest, context: grpc.ServicerContext) -> internal_pb2.WaitTaskEventsResponse:
        timeout = min(max(request.timeout_ms, 0), 30_000) / 1000.0
        if request.ack_up_to_seq > 0 and request.ack_stream_id == self.hm.stream_id:  # as AckTaskEvents
            self.hm.ack_events(request.ack_up_to_seq)
        events, gap = self.hm.wait_events(request.after_seq, request.max_events or 1000, timeout)
        return internal_pb2.WaitTaskEventsResponse(
            events=[convert.status_to_proto(st, seq) for seq, st in events], stream_id=self.hm.stream_id, gap=gap,
            acked=True)

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
    def __init__(self, hm: HostManager, waiting: Callable[[], Waiting] = Waiting) -> None:
        """`waiting()`: the queue's GPU asks and reservations (the resource manager's, when it runs in this
        process; none otherwise: no GPU is then reserved or stranded)."""
        self.hm = hm
        self.waiting = waiting
        # the last rows and their summary, with what they were made from: a console re-reading an unchanged
        # cluster of 10,000 hosts reuses them (one tuple, replaced whole: two calls at once may both compute it)
        self._cached: tuple[Any, list[listing.HostRow], list[listing.Summary]] | None = None

    def _rows(self) -> tuple[list[listing.HostRow], list[listing.Summary]]:
        version = self.hm.version  # read first: a host that changes after it moves it again
        drains, health, windows, waiting = self.hm.drains(), self.hm.health(), self.hm.maintenance(), self.waiting()
        key = (version, drains, health, windows, waiting)
        cached = self._cached
        if cached is not None and cached[0] == key:
            return cached[1], cached[2]
        rows = listing.rows(self.hm.hosts(), drains, health, windows, waiting)
        summary: list[listing.Summary] = []  # made when first asked for
        self._cached = (key, rows, summary)
        return rows, summary

    def rows(self) -> list[listing.HostRow]:
        """Every host, by rack then name, with its status and GPUs' states (read-only)."""
        return self._rows()[0]

    def summary(self) -> listing.Summary:
        """The sums of every host, for GetClusterSummary."""
        rows, made = self._rows()
        if not made:
            made.append(listing.summarize(rows))
        return made[0]

    @grpc_errors
    def ListHosts(self, request: host_pb2.ListHostsRequest, context: grpc.ServicerContext) -> host_pb2.ListHostsResponse:
        f, after = _host_filter(request)
        rows = self.rows()
        chosen, nxt, total = listing.page(rows, f, request.page_size, after)
        return host_pb2.ListHostsResponse(
            hosts=[_row_to_proto(r, request.with_gpus) for r in chosen], next_page_token=_token(nxt) if nxt else "", total=total,
            racks=sorted({r.rack for r in rows}))

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
        """The host as ListHosts shows it, with its GPUs (after a drain: its status says draining or drained)."""
        for r in self.rows():
            if r.info.hostname == hostname:
                return _row_to_proto(r, True)
        return host_pb2.Host(hostname=hostname)  # gone meanwhile


def _row_to_proto(r: listing.HostRow, with_gpus: bool) -> host_pb2.Host:
    p = convert.host_to_proto(r.info, r.held, r.drain_deadline, r.health, maintenance=r.maintenance)
    p.status = r.status
    p.reserved_for = r.reserved_for
    if with_gpus:
        p.gpus.extend(host_pb2.HostGpu(id=g.id, state=g.state, task_id=g.task_id) for g in r.gpus())
    return p


def _token(key: tuple[str, str]) -> str:
    return base64.urlsafe_b64encode(json.dumps(list(key)).encode()).decode()


def _host_filter(r: host_pb2.ListHostsRequest) -> tuple[listing.HostFilter, tuple[str, str] | None]:
    """The request's filters and where its page starts, checked: a bad one names its field."""
    checks.number(r.page_size, "page_size", minimum=0, maximum=listing.MAX_PAGE)
    for name, items in (("states", r.states), ("labels", r.labels)):
        if len(items) > MAX_HOST_FILTERS:
            raise checks.bad(name, f"at most {MAX_HOST_FILTERS} filters, got {len(items)}")
    for s in r.states:
        if s not in HOST_STATUSES:
            raise checks.bad("states", f"{s!r} is not a host status; one of {', '.join(HOST_STATUSES)}")
    checks.number(r.min_free_gpus, "min_free_gpus", minimum=0, maximum=1_000_000)
    for name, text in (("rack", r.rack), ("name_contains", r.name_contains)):
        checks.text(text, name, max_chars=255)
    labels: list[tuple[str, str | None]] = []
    for item in r.labels:
        checks.text(item, "labels", max_chars=512)
        k, eq, v = item.partition("=")
        if not k.strip():
            raise checks.bad("labels", f"{item!r}: a label filter is key=value or key")
        labels.append((k.strip(), v.strip() if eq else None))
    after = None
    if r.page_token:
        try:
            key = json.loads(base64.urlsafe_b64decode(r.page_token.encode()))
            if not (isinstance(key, list) and len(key) == 2 and all(isinstance(x, str) for x in key)):
                raise ValueError
            after = (key[0], key[1])
        except (ValueError, binascii.Error, UnicodeError):
            raise checks.bad("page_token", "not a page token ListHosts gave (next_page_token of the page "
                                           "before)") from None
    return listing.HostFilter(frozenset(r.states), r.rack, tuple(labels), r.min_free_gpus, r.name_contains), after


def _hostname(name: str) -> None:
    checks.text(name, "hostname", max_chars=255)
    if not name.strip():
        raise checks.bad("hostname", "is required")
