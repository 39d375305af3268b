"""gRPC servicers of the resource manager: internal queue API and the public ResourcePoolService. Thin."""

from __future__ import annotations

import bisect
import time
from dataclasses import replace
from typing import TYPE_CHECKING

from sqlalchemy.orm import Session, sessionmaker

from peloton.api import convert, request_checks
from peloton.api.status import grpc_errors
from peloton.api.v1 import internal_pb2, internal_pb2_grpc, respool_pb2, respool_pb2_grpc
from peloton.domain.limits import MAX_INSTANCES
from peloton.domain.model import ResourcePool
from peloton.domain.pools import check_pool, validate_pool
from peloton.domain.resources import Resources
from peloton.errors import FailedPrecondition, InvalidArgument, NotFound
from peloton.resmgr.manager import ResourceManager
from peloton.store import repo
from peloton.store.db import transaction

if TYPE_CHECKING:
    import grpc

MAX_GANGS_PAGE = 10_000  # gang keys in a ListGangs answer (~40 bytes each)
MAX_ATTEMPT = 2**31 - 1  # (a page token is a gang id: the next page starts after every attempt of it)


class ResourceManagerServicer(internal_pb2_grpc.ResourceManagerInternalServicer):
    def __init__(self, rm: ResourceManager) -> None:
        self.rm = rm

    @grpc_errors
    def EnqueueGangs(self, request: internal_pb2.EnqueueGangsRequest, context: grpc.ServicerContext) -> internal_pb2.EnqueueGangsResponse:
        gangs = [convert.gang_request_from_proto(g) for g in request.gangs]
        running = [g for g, p in zip(gangs, request.gangs, strict=True) if p.running]
        # `remove` first, as RemoveGangs: a batch's releases come before its new gangs; once per call_id
        self.rm.apply_call(request.call_id, [(k.gang_id, k.attempt) for k in request.remove],
                           [g for g, p in zip(gangs, request.gangs, strict=True) if not p.running], running)
        return internal_pb2.EnqueueGangsResponse(removed=True)

    @grpc_errors
    def DequeueGangs(self, request: internal_pb2.DequeueGangsRequest, context: grpc.ServicerContext) -> internal_pb2.DequeueGangsResponse:
        gone = None
        if self.rm.shared:
            # an engine that dies in its long poll ends it at once and takes nothing (its gangs, probes and claims
            # to release would otherwise wait for its lease to run out); with one engine a new one takes them back
            context.add_callback(self.rm.wake_engines)
            gone = lambda: not context.is_active()  # noqa: E731
        gangs = self.rm.dequeue(request.max_gangs or 100, min(max(request.timeout_ms, 0), 30_000) / 1000.0,
                                convert.vec_from_proto(request.capacity) if request.HasField("capacity") else None,
                                engine=request.engine, gone=gone)
        if gone is not None and gone():
            return internal_pb2.DequeueGangsResponse()
        return internal_pb2.DequeueGangsResponse(
            gangs=[convert.gang_request_to_proto(g) for g in gangs],
            release_claims=[internal_pb2.GangKey(gang_id=g, attempt=a) for g, a in self.rm.take_orphaned_claims(request.engine)],
            probes=[convert.probe_to_proto(p.gang, p.candidates, p.need, p.ending) for p in self.rm.take_probes()],
            reserving=[internal_pb2.GangKey(gang_id=g, attempt=a) for g, a in self.rm.reserving()],
            placement_order=self.rm.placement_order, idle=self.rm.idle)

    @grpc_errors
    def SetPlacements(self, request: internal_pb2.SetPlacementsRequest, context: grpc.ServicerContext) -> internal_pb2.SetPlacementsResponse:
        self.rm.set_placements(
            [convert.placement_from_proto(p) for p in request.placements],
            [convert.failure_from_proto(f) for f in request.failures if not f.stale],
            [convert.failure_from_proto(f) for f in request.failures if f.stale],
            [((p.gang.gang_id, p.gang.attempt), [(v.gang_id, v.attempt) for v in p.victims])
             for p in request.preemptions],
            [((r.gang.gang_id, r.gang.attempt), list(r.hosts), r.expected_start) for r in request.reservations],
            engine=request.engine,
        )
        return internal_pb2.SetPlacementsResponse()

    @grpc_errors
    def GetPlacements(self, request: internal_pb2.GetPlacementsRequest, context: grpc.ServicerContext) -> internal_pb2.GetPlacementsResponse:
        if request.ack_done:  # as AckPlacements' done, before taking
            self.rm.ack_placements([(k.gang_id, k.attempt) for k in request.ack_done], [])
        placements, pending = self.rm.take_placements(
            request.max or 100, min(max(request.timeout_ms, 0), 30_000) / 1000.0, consumer=request.consumer
        )
        return internal_pb2.GetPlacementsResponse(
            placements=[convert.placement_to_proto(p) for p in placements],
            pending=[convert.failure_to_proto(f) for f in pending],
            preempt=[internal_pb2.PreemptGang(gang_id=g, attempt=a, reason=r) for g, a, r in self.rm.take_preemptions()],
            incarnation=self.rm.incarnation,
            acked=True,
        )

    @grpc_errors
    def AckPlacements(self, request: internal_pb2.AckPlacementsRequest, context: grpc.ServicerContext) -> internal_pb2.AckPlacementsResponse:
        self.rm.ack_placements([(k.gang_id, k.attempt) for k in request.done],
                               [(k.gang_id, k.attempt) for k in request.retry])
        return internal_pb2.AckPlacementsResponse()

    @grpc_errors
    def CheckGangs(self, request: internal_pb2.CheckGangsRequest, context: grpc.ServicerContext) -> internal_pb2.CheckGangsResponse:
        unknown = self.rm.unknown([(k.gang_id, k.attempt) for k in request.gangs])
        return internal_pb2.CheckGangsResponse(unknown=[internal_pb2.GangKey(gang_id=g, attempt=a) for g, a in unknown])

    @grpc_errors
    def ListGangs(self, request: internal_pb2.ListGangsRequest, context: grpc.ServicerContext) -> internal_pb2.ListGangsResponse:
        keys = self.rm.gangs()
        start = bisect.bisect_right(keys, (request.page_token, MAX_ATTEMPT)) if request.page_token else 0
        size = min(request.page_size or MAX_GANGS_PAGE, MAX_GANGS_PAGE)
        page = keys[start:start + size]
        more = start + size < len(keys)
        return internal_pb2.ListGangsResponse(gangs=[internal_pb2.GangKey(gang_id=g, attempt=a) for g, a in page],
                                              next_page_token=page[-1][0] if more else "")

    @grpc_errors
    def RemoveGangs(self, request: internal_pb2.RemoveGangsRequest, context: grpc.ServicerContext) -> internal_pb2.RemoveGangsResponse:
        self.rm.apply_call(request.call_id, [(k.gang_id, k.attempt) for k in request.gangs])
        return internal_pb2.RemoveGangsResponse()

    @grpc_errors
    def GetPoolUsage(self, request: internal_pb2.GetPoolUsageRequest, context: grpc.ServicerContext) -> internal_pb2.GetPoolUsageResponse:
        usage = self.rm.pool_usage()
        out = internal_pb2.GetPoolUsageResponse()
        if request.path and request.HasField("extra_demand") and request.path in usage:
            u = usage[request.path]
            p = out.pools.add(path=request.path, allocated=convert.vec_to_proto(u.allocated), queued_gangs=u.queued)
            ent = self.rm.entitlement_if(request.path, convert.vec_from_proto(request.extra_demand))
            if ent is not None:
                p.entitlement_gpu = ent.gpu
            return out
        for path in sorted(usage) if not request.path else [request.path] if request.path in usage else []:
            u = usage[path]
            p = out.pools.add(path=path, allocated=convert.vec_to_proto(u.allocated), queued_gangs=u.queued)
            if u.entitlement is not None:
                p.entitlement_gpu = u.entitlement.gpu
        return out

    @grpc_errors
    def PreviewAdmission(self, request: internal_pb2.PreviewAdmissionRequest, context: grpc.ServicerContext) -> internal_pb2.PreviewAdmissionResponse:
        pool = request_checks.pool_path(request.pool, "pool")
        if len(request.gangs) > MAX_INSTANCES:  # a job has no more gangs than instances
            raise InvalidArgument(f"gangs: at most {MAX_INSTANCES}, got {len(request.gangs)}", field="gangs")
        out = self.rm.admission_if(pool, [convert.gang_ask_from_proto(g) for g in request.gangs])
        return internal_pb2.PreviewAdmissionResponse(
            gangs=[internal_pb2.AdmissionPreview(reason=p.reason, ahead=p.ahead, borrows=p.borrows) for p in out])


def create_pool(s: Session, pool: ResourcePool, capacity: Resources | None) -> list[str]:
    """CreatePool's transaction (the caller's, not committed here): `pool` checked against the tree in the
    transaction that writes it, and no other pool change in between (PostgreSQL: repo.lock_pool_tree). The parent's
    row is locked too before its unfinished jobs are counted (a pool with some gets no children): a new job's batch
    that holds it commits first and is counted, one that comes after finds the parent a leaf no more (its row's
    count of children, which create_pool adds to) and is refused. Returns check_pool's warnings."""
    repo.lock_pool_tree(s, pool.parent)
    pools = {p.path: p for p in repo.list_pools(s)}
    busy = repo.unfinished_jobs_in(s, pool.parent) if pool.parent and pool.path not in pools else 0
    warnings = check_pool(pools, pool, capacity, busy=busy)
    repo.create_pool(s, replace(pool, created_at=time.time()))
    return warnings


class ResourcePoolServicer(respool_pb2_grpc.ResourcePoolServiceServicer):
    def __init__(self, rm: ResourceManager, sessions: sessionmaker[Session]) -> None:
        self.rm = rm
        self.sessions = sessions

    @grpc_errors
    def CreatePool(self, request: respool_pb2.CreatePoolRequest, context: grpc.ServicerContext) -> respool_pb2.CreatePoolResponse:
        pool = validate_pool(convert.pool_from_proto(request.pool))
        with transaction(self.sessions) as s:
            warnings = create_pool(s, pool, self.rm.capacity())
        self.rm.refresh_pools()
        return respool_pb2.CreatePoolResponse(warnings=warnings)

    @grpc_errors
    def UpdatePool(self, request: respool_pb2.UpdatePoolRequest, context: grpc.ServicerContext) -> respool_pb2.UpdatePoolResponse:
        pool = validate_pool(convert.pool_from_proto(request.pool), updating=True)
        with transaction(self.sessions) as s:
            repo.lock_pool_tree(s)  # as CreatePool
            pools = {p.path: p for p in repo.list_pools(s)}
            if pool.path not in pools:
                raise NotFound(f"resource pool {pool.path!r} not found", field="pool.path")
            warnings = check_pool(pools, pool, self.rm.capacity())
            repo.update_pool(s, pool)
        self.rm.refresh_pools()
        return respool_pb2.UpdatePoolResponse(warnings=warnings)

    @grpc_errors
    def GetPool(self, request: respool_pb2.GetPoolRequest, context: grpc.ServicerContext) -> respool_pb2.GetPoolResponse:
        with transaction(self.sessions) as s:
            pool = repo.get_pool(s, request_checks.pool_path(request.path))
        return respool_pb2.GetPoolResponse(pool=convert.pool_to_proto(pool, self.rm.pool_usage().get(pool.path)))

    @grpc_errors
    def ListPools(self, request: respool_pb2.ListPoolsRequest, context: grpc.ServicerContext) -> respool_pb2.ListPoolsResponse:
        with transaction(self.sessions) as s:
            pools = repo.list_pools(s)
        usage = self.rm.pool_usage()
        return respool_pb2.ListPoolsResponse(pools=[convert.pool_to_proto(p, usage.get(p.path)) for p in pools])

    @grpc_errors
    def ListQueue(self, request: respool_pb2.ListQueueRequest, context: grpc.ServicerContext) -> respool_pb2.ListQueueResponse:
        pool = request_checks.pool_path(request.pool, "pool") if request.pool else ""
        if pool and pool not in self.rm.pools():
            raise NotFound(f"pool: resource pool {pool} does not exist", field="pool")
        limit = request.limit or 1000
        if not 0 < limit <= 100_000:
            raise InvalidArgument(f"limit: between 1 and 100000, got {request.limit}", field="limit")
        gangs, total = self.rm.queue(pool, limit)
        return respool_pb2.ListQueueResponse(total=total, gangs=[respool_pb2.QueuedGang(
            gang_id=g.gang_id, job_id=g.job_id, attempt=g.attempt, pool=g.pool, priority=g.priority,
            members=g.members, resources=convert.resources_to_proto(g.total), enqueued_at=g.queued_at,
            state=g.state, reason=g.reason, position=g.position, preemptible=g.preemptible,
            reserved_hosts=g.reserved_hosts, expected_start=g.expected_start or 0.0,
            expected_start_basis=g.start_basis) for g in gangs])

    @grpc_errors
    def DeletePool(self, request: respool_pb2.DeletePoolRequest, context: grpc.ServicerContext) -> respool_pb2.DeletePoolResponse:
        request_checks.pool_path(request.path)
        _, queued = self.rm.usage()
        if queued.get(request.path):
            raise FailedPrecondition(f"pool {request.path} has {queued[request.path]} queued gangs")
        with transaction(self.sessions) as s:
            repo.lock_pool_tree(s)  # as CreatePool: not while a child is being created under it
            repo.delete_pool(s, request.path)
        self.rm.refresh_pools()
        return respool_pb2.DeletePoolResponse()
