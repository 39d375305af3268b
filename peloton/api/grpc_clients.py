"""The internal services' clients over gRPC (the interfaces are api/clients.py): each method builds its request
with convert.py, calls the stub, and turns the answer back into domain values; a failed call becomes the error
hierarchy by its status code (codes.py's table, through status.from_rpc_error), never by its text.

A launch must know whether it was sent at all (nothing started: the gang goes back to its queue as the same
attempt). gRPC does not say so by code, so `ConnectedStub` sends such a call only over a connected channel and
otherwise raises `NotSent` without sending it; that is mapped to errors.Unreachable.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import grpc

from peloton import errors
from peloton.api import convert
from peloton.api.clients import Dequeued, GangKey, HostChanges, Placed, Preemption, Reserved, TaskEvents
from peloton.api.status import from_rpc_error
from peloton.api.v1 import internal_pb2
from peloton.domain.allocation import AdmissionPreview, GangAsk, whole_gpus
from peloton.domain.launch import GangLaunch, LaunchResult, TaskStatus
from peloton.domain.placement import GangPlacement, GangRequest, HostOffer, PlacementFailure
from peloton.domain.resources import Resources

SEND_ONLY_WHEN_CONNECTED = frozenset({"LaunchGangs"})  # not safe to repeat blindly, so "never sent" matters
CONNECT_WAIT_S = 0.5  # how long such a call waits for a channel that is not connected before it is not sent


class NotSent(grpc.RpcError):
    """A call not sent: its channel had no connection (UNAVAILABLE, so FailoverStub moves on as for any other)."""

    def __init__(self, method: str) -> None:
        super().__init__(f"{method}: not sent (no connection)")
        self._method = method

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return f"{self._method}: not sent: no connection to the component"


class ConnectedStub:
    """A generated stub over `channel` whose SEND_ONLY_WHEN_CONNECTED methods are sent only while the channel is
    connected (its state as gRPC last reported it: one field read; otherwise up to CONNECT_WAIT_S for it to
    connect), so that their failure before sending is known for certain. Every call carries `metadata` (the
    components' shared secret): passed with the call, which costs less than a client interceptor on the channel."""

    def __init__(self, stub: Any, channel: grpc.Channel, metadata: Sequence[tuple[str, str]] = ()) -> None:
        self._stub = stub
        self._channel = channel
        self._metadata = tuple(metadata)
        self._state = grpc.ChannelConnectivity.IDLE
        channel.subscribe(self._changed, try_to_connect=False)

    def _changed(self, state: grpc.ChannelConnectivity) -> None:
        self._state = state

    def _connected(self) -> bool:
        if self._state == grpc.ChannelConnectivity.READY:
            return True
        try:
            grpc.channel_ready_future(self._channel).result(timeout=CONNECT_WAIT_S)
        except grpc.FutureTimeoutError:
            return False
        return True

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name.startswith("_"):
            raise AttributeError(name)
        method = getattr(self._stub, name)
        guarded = name in SEND_ONLY_WHEN_CONNECTED
        metadata = self._metadata
        if not guarded and not metadata:
            return method

        def call(request: Any, **kwargs: Any) -> Any:
            if guarded and not self._connected():
                raise NotSent(name)
            if metadata:
                kwargs["metadata"] = (*(kwargs.get("metadata") or ()), *metadata)
            return method(request, **kwargs)

        setattr(self, name, call)  # made once per method: later calls find it without __getattr__
        return call


def _error(e: grpc.RpcError) -> errors.PelotonError:
    if isinstance(e, NotSent):
        return errors.Unreachable(e.details())
    return from_rpc_error(e)


@contextlib.contextmanager
def _encoding(method: str) -> Iterator[None]:
    """A request the message cannot hold (a number past its field's range, a string that is not UTF-8) is refused
    here, as the receiver would refuse it, by InvalidArgument: the same values never encode (a bug), and the job
    manager's side effects tell that from a call worth another try."""
    try:
        yield
    except (ValueError, TypeError) as e:  # (UnicodeError is a ValueError)
        raise errors.InvalidArgument(f"{method}: the request cannot be encoded: {e}") from None


def _keys(keys: Sequence[GangKey]) -> list[internal_pb2.GangKey]:
    return [internal_pb2.GangKey(gang_id=g, attempt=a) for g, a in keys]


class _GrpcClient:
    """A typed client's gRPC side: one method of its stub called, a failed call raised as the project's error."""

    def __init__(self, stub: Any) -> None:
        self._stub = stub

    def _call(self, method: str, request: Any, timeout_s: float) -> Any:
        try:
            return getattr(self._stub, method)(request, timeout=timeout_s)
        except grpc.RpcError as e:
            raise _error(e) from None


class GrpcResourceManager(_GrpcClient):
    """ResourceManagerClient over a ResourceManagerInternal stub (or a FailoverStub of several).

    A resmgr of an earlier release (a rolling upgrade) ignores EnqueueGangs' `remove` and `call_id`, and says so
    (`removed` false): it queued the gangs without the removals that were to come first. The first such answer is
    mended (the removals sent by RemoveGangs, then what they undid of the gangs just queued, queued again: the order
    of one call), and from then on this client sends the removals first, each call's by a RemoveGangs of its own.
    A try again of a call whose EnqueueGangs that resmgr applied does not send it again (it would apply it again)."""

    def __init__(self, stub: Any) -> None:
        super().__init__(stub)
        # (enqueue is called by the job manager's side effects' one sender thread alone: no lock)
        self._remove_ignored = False  # the resmgr answered that it ignores EnqueueGangs.remove
        self._applied: collections.OrderedDict[str, None] = collections.OrderedDict()  # call ids, see above

    def enqueue(self, gangs: Sequence[GangRequest], running: Sequence[GangRequest],
                remove: Sequence[GangKey] = (), call_id: str = "") -> None:
        remove_id = f"{call_id}/remove" if call_id else ""  # (a resmgr that applies ids applies each part once)
        if not (call_id and call_id in self._applied):
            if remove and self._remove_ignored:
                self.remove_gangs(remove, call_id=remove_id)
                if gangs or running:
                    self._enqueue(gangs, running, (), call_id)
                return
            if self._enqueue(gangs, running, remove, call_id) or not remove:
                return
            # an earlier release queued the gangs, ignoring the removals that were to come before them
            self._remove_ignored = True
            if call_id:
                self._applied[call_id] = None
                while len(self._applied) > 64:
                    self._applied.popitem(last=False)
        self.remove_gangs(remove, call_id=remove_id)
        up_to: dict[str, int] = {}
        for gid, attempt in remove:
            up_to[gid] = max(attempt, up_to.get(gid, attempt))
        again = [g for g in gangs if g.gang_id in up_to and g.attempt <= up_to[g.gang_id]]
        held = [g for g in running if g.gang_id in up_to and g.attempt <= up_to[g.gang_id]]
        if again or held:  # what the removals undid of what was just queued (or adopted)
            self._enqueue(again, held, (), f"{call_id}/again" if call_id else "")
        self._applied.pop(call_id, None)

    def _enqueue(self, gangs: Sequence[GangRequest], running: Sequence[GangRequest], remove: Sequence[GangKey],
                 call_id: str) -> bool:
        """One EnqueueGangs; whether the resmgr applied `remove` (an earlier release ignores it)."""
        with _encoding("EnqueueGangs"):
            adopted = [convert.gang_request_to_proto(g) for g in running]
            for p in adopted:
                p.running = True
            request = internal_pb2.EnqueueGangsRequest(
                gangs=[*(convert.gang_request_to_proto(g) for g in gangs), *adopted], remove=_keys(remove),
                call_id=call_id)
        return bool(self._call("EnqueueGangs", request, 30).removed)

    def dequeue(self, max_gangs: int, timeout_s: float, capacity: Resources | None, engine: str) -> Dequeued:
        r = self._call("DequeueGangs", internal_pb2.DequeueGangsRequest(
            max_gangs=max_gangs, timeout_ms=round(timeout_s * 1000), engine=engine,
            capacity=convert.vec_to_proto(capacity) if capacity is not None else None), timeout_s + 10)
        return Dequeued(gangs=[convert.gang_request_from_proto(g) for g in r.gangs],
                        release_claims=[(k.gang_id, k.attempt) for k in r.release_claims],
                        probes=[convert.probe_from_proto(p) for p in r.probes],
                        reserving=[(k.gang_id, k.attempt) for k in r.reserving],
                        placement_order=r.placement_order, idle=r.idle)

    def set_placements(self, placements: Sequence[GangPlacement], failures: Sequence[PlacementFailure],
                       stale: Sequence[PlacementFailure], preemptions: Sequence[Preemption],
                       reservations: Sequence[Reserved], engine: str) -> None:
        self._call("SetPlacements", internal_pb2.SetPlacementsRequest(
            placements=[convert.placement_to_proto(p) for p in placements],
            failures=[*(convert.failure_to_proto(f) for f in failures),
                      *(convert.failure_to_proto(f, stale=True) for f in stale)],
            preemptions=[internal_pb2.Preemption(gang=internal_pb2.GangKey(gang_id=g, attempt=a), victims=_keys(v))
                         for (g, a), v in preemptions],
            reservations=[internal_pb2.Reservation(gang=internal_pb2.GangKey(gang_id=g, attempt=a), hosts=hosts,
                                                   expected_start=start) for (g, a), hosts, start in reservations],
            engine=engine), 30)

    def get_placements(self, max_placements: int, timeout_s: float, consumer: str,
                       ack_done: Sequence[GangKey] = ()) -> Placed:
        r = self._call("GetPlacements", internal_pb2.GetPlacementsRequest(
            max=max_placements, timeout_ms=round(timeout_s * 1000), consumer=consumer, ack_done=_keys(ack_done)),
            timeout_s + 10)
        if ack_done and not r.acked:  # a resmgr of an earlier release ignored them (a rolling upgrade)
            self.ack_placements(ack_done, [])
        return Placed(placements=[convert.placement_from_proto(p) for p in r.placements],
                      pending=[convert.failure_from_proto(f) for f in r.pending],
                      preempt=[(p.gang_id, p.attempt, p.reason) for p in r.preempt], incarnation=r.incarnation)

    def ack_placements(self, done: Sequence[GangKey], retry: Sequence[GangKey]) -> None:
        self._call("AckPlacements", internal_pb2.AckPlacementsRequest(done=_keys(done), retry=_keys(retry)), 30)

    def unknown_gangs(self, gangs: Sequence[GangKey]) -> list[GangKey]:
        r = self._call("CheckGangs", internal_pb2.CheckGangsRequest(gangs=_keys(gangs)), 30)
        return [(k.gang_id, k.attempt) for k in r.unknown]

    def remove_gangs(self, gangs: Sequence[GangKey], call_id: str = "") -> None:
        with _encoding("RemoveGangs"):
            request = internal_pb2.RemoveGangsRequest(gangs=_keys(gangs), call_id=call_id)
        self._call("RemoveGangs", request, 30)

    def held_gangs(self, page_token: str) -> tuple[list[GangKey], str]:
        try:
            r = self._stub.ListGangs(internal_pb2.ListGangsRequest(page_token=page_token), timeout=30)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.UNIMPLEMENTED:  # a resmgr of an earlier release: nothing to check
                return [], ""
            raise _error(e) from None
        return [(k.gang_id, k.attempt) for k in r.gangs], r.next_page_token

    def entitled_gpus(self, pool: str, extra_demand: Resources) -> int | None:
        r = self._call("GetPoolUsage", internal_pb2.GetPoolUsageRequest(
            path=pool, extra_demand=convert.vec_to_proto(extra_demand)), 10)
        for p in r.pools:
            if p.HasField("entitlement_gpu"):
                return whole_gpus(p.entitlement_gpu)
        return None

    def preview_admission(self, pool: str, gangs: Sequence[GangAsk]) -> list[AdmissionPreview]:
        r = self._call("PreviewAdmission", internal_pb2.PreviewAdmissionRequest(
            pool=pool, gangs=[convert.gang_ask_to_proto(g) for g in gangs]), 10)
        return [AdmissionPreview(p.reason, p.ahead, p.borrows) for p in r.gangs]

    def held_pools(self) -> None:
        return None  # (resmgr's copy is in another process: read the store)


class GrpcHostManager(_GrpcClient):
    """HostManagerClient over a HostManagerInternal stub (a ConnectedStub, or a FailoverStub of them)."""

    # whether the last LaunchGangs answer said the host manager reads the shared form (one bool, written whole by
    # whichever launcher thread called last: a stale read costs one launch sent the other way)
    _launch_shared = False

    def sync_hosts(self, since_version: int, stream_id: str = "", timeout_s: float = 30,
                   idle: bool = False) -> HostChanges:
        r = self._call("SyncHosts", internal_pb2.SyncHostsRequest(since_version=since_version, stream_id=stream_id,
                                                                  idle=idle), timeout_s)
        return HostChanges(r.stream_id, r.version, r.full, [convert.offer_from_proto(o) for o in r.hosts],
                           list(r.removed))

    def claim(self, placements: Sequence[GangPlacement]) -> tuple[list[GangPlacement], list[PlacementFailure]]:
        r = self._call("ClaimPlacements", internal_pb2.ClaimPlacementsRequest(
            placements=[convert.placement_to_proto(p) for p in placements]), 30)
        return [convert.placement_from_proto(p) for p in r.claimed], [convert.failure_from_proto(f)
                                                                      for f in r.refused]

    def release_claims(self, gangs: Sequence[GangKey]) -> None:
        self._call("ReleaseClaims", internal_pb2.ReleaseClaimsRequest(gangs=_keys(gangs)), 30)

    def cluster_capacity(self, if_version: int) -> tuple[int, list[HostOffer] | None]:
        r = self._call("ClusterCapacity", internal_pb2.ClusterCapacityRequest(if_version=if_version), 10)
        return r.version, None if r.unchanged else [convert.offer_from_proto(o) for o in r.hosts]

    def launch(self, gangs: Sequence[GangLaunch]) -> list[LaunchResult]:
        # the shared form once the host manager said it reads it, each member whole until then and again after an
        # answer without it (an earlier release's, say after a rollback: it refused the shared launches, and the
        # launcher retries those gangs)
        shared = self._launch_shared
        r = self._call("LaunchGangs", internal_pb2.LaunchGangsRequest(
            gangs=[convert.gang_launch_to_proto(g, shared) for g in gangs]), 60)
        self._launch_shared = r.shared_read
        return [convert.launch_result_from_proto(x) for x in r.results]

    def kill(self, task_ids: Sequence[str], grace_s: float | None = None) -> None:
        with _encoding("KillTasks"):
            request = internal_pb2.KillTasksRequest(task_ids=task_ids, grace_s=grace_s or 0.0)
        self._call("KillTasks", request, 30)

    def wait_events(self, after_seq: int, max_events: int, timeout_s: float, ack_up_to_seq: int = 0,
                    ack_stream_id: str = "") -> TaskEvents:
        r = self._call("WaitTaskEvents", internal_pb2.WaitTaskEventsRequest(
            after_seq=after_seq, max_events=max_events, timeout_ms=round(timeout_s * 1000),
            ack_up_to_seq=ack_up_to_seq, ack_stream_id=ack_stream_id), timeout_s + 10)
        if ack_up_to_seq > 0 and not r.acked and r.stream_id == ack_stream_id:  # a hostmgr of an earlier release
            self._call("AckTaskEvents", internal_pb2.AckTaskEventsRequest(up_to_seq=ack_up_to_seq), 30)
        return TaskEvents([(e.seq, convert.status_from_proto(e)) for e in r.events], r.stream_id, r.gap)

    def reconcile(self, task_ids: Sequence[str]) -> list[TaskStatus]:
        r = self._call("ReconcileTasks", internal_pb2.ReconcileTasksRequest(task_ids=task_ids), 60)
        return [convert.status_from_proto(p) for p in r.statuses]

    def running_tasks(self, page_token: str) -> tuple[list[str], str]:
        r = self._call("ListRunningTasks", internal_pb2.ListRunningTasksRequest(page_token=page_token), 60)
        return list(r.task_ids), r.next_page_token

    def read_log(self, task_id: str, stream: str, offset: int, max_bytes: int,
                 timeout_s: float = 30) -> tuple[bytes, int]:
        r = self._call("ReadTaskLog", internal_pb2.ReadTaskLogRequest(
            task_id=task_id, stream=stream, offset=offset, max_bytes=max_bytes), timeout_s)
        return r.content, r.next_offset

    def drains(self) -> dict[str, float]:
        return dict(self._call("ListDrains", internal_pb2.ListDrainsRequest(), 30).drains)

    def remove_sandboxes(self, job_ids: Sequence[str]) -> int:
        return int(self._call("RemoveSandboxes", internal_pb2.RemoveSandboxesRequest(job_ids=job_ids), 60).removed)
