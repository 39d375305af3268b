"""The edge before authentication, through the real daemon (gRPC over its TLS port, its owner-only Unix socket and
its internal socket): the receive limit on every port, callers that are not known yet make nothing be read, the
reads of the calls open to anyone (health, reflection) are gated, and requests with fields this daemon does not
know are refused naming them. (The memory a flood costs: tests/e2e/test_edge_e2e.py.)"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import struct_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

from peloton.api.edge import BUSY, PUBLIC_READS
from peloton.api.request_checks import non_finite, unknown_fields
from peloton.api.v1 import internal_pb2, job_pb2, job_pb2_grpc
from peloton.domain import limits
from peloton.hostmgr.sim.backend import SimSettings
from peloton.security import certs
from peloton.security.component_auth import METADATA_KEY, load_secret
from peloton.security.identity import add_token
from peloton.server import Daemon
from peloton.settings import ServerConfig

T = 15.0
CREATE = "/peloton.v1.JobService/CreateJob"


@dataclass
class Edge:
    daemon: Daemon
    tls: grpc.Channel  # the API's TCP port, over TLS
    unix: grpc.Channel  # its owner-only Unix socket (the daemon's own user: an admin)
    internal: grpc.Channel  # the internal services' socket, without the components' secret
    token: str  # an admin's

    def md(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.token}"),)


@pytest.fixture(scope="module")
def edge() -> Iterator[Edge]:
    # a short path: a Unix socket's is at most 107 bytes
    tmp = Path(tempfile.mkdtemp(prefix="pe-", dir="/tmp"))
    certs.init(tmp / "certs", ["localhost"])
    principals = tmp / "principals.json"
    token = add_token(principals, "admin", ["admin"])
    d = Daemon(ServerConfig(
        listen="127.0.0.1:0", db_url=f"sqlite:///{tmp}/p.db", data_dir=tmp / "data", metrics_listen="",
        backend="sim", sim=SimSettings(hosts=2, racks=1), principals_file=principals,
        tls_cert=tmp / "certs" / "server.pem", tls_key=tmp / "certs" / "server-key.pem",
        unix_socket=str(tmp / "api.sock"), internal_listen=f"unix:{tmp}/internal.sock"))
    port = d.start().rpartition(":")[2]
    channels: list[grpc.Channel] = []
    try:
        creds = grpc.ssl_channel_credentials((tmp / "certs" / "ca.pem").read_bytes())
        channels = [grpc.secure_channel(f"localhost:{port}", creds), grpc.insecure_channel(f"unix:{tmp}/api.sock"),
                    grpc.insecure_channel(f"unix:{tmp}/internal.sock")]
        yield Edge(d, channels[0], channels[1], channels[2], token)
    finally:
        for ch in channels:
            ch.close()
        d.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def code_of(call: Any, *args: Any, **kwargs: Any) -> tuple[grpc.StatusCode, str]:
    try:
        call(*args, timeout=T, **kwargs)
        return grpc.StatusCode.OK, ""
    except grpc.RpcError as e:
        return e.code(), e.details() or ""


def test_every_port_refuses_a_request_over_the_documented_limit(edge: Edge) -> None:
    """limits.MAX_REQUEST_BYTES (4 MiB, docs/job-spec.md) on the TLS port and on the Unix socket: over it, gRPC's
    own RESOURCE_EXHAUSTED; under it, the request is read and checked (here: its spec is over 1 MiB)."""
    assert limits.MAX_REQUEST_BYTES == 4 * 1024 * 1024

    def create(size: int) -> job_pb2.CreateJobRequest:
        r = job_pb2.CreateJobRequest(spec=job_pb2.JobSpec(name="big", task=job_pb2.TaskSpec(command="x" * size)))
        return job_pb2.CreateJobRequest(spec=job_pb2.JobSpec(
            name="big", task=job_pb2.TaskSpec(command="x" * (size - (r.ByteSize() - size)))))

    over, under = create(limits.MAX_REQUEST_BYTES + 1), create(limits.MAX_REQUEST_BYTES)
    assert (over.ByteSize(), under.ByteSize()) == (limits.MAX_REQUEST_BYTES + 1, limits.MAX_REQUEST_BYTES)
    for name, channel, md in (("tls", edge.tls, edge.md()), ("unix", edge.unix, ())):
        stub = job_pb2_grpc.JobServiceStub(channel)
        code, details = code_of(stub.CreateJob, over, metadata=md)
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in details, (name, details)
        code, details = code_of(stub.CreateJob, under, metadata=md)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("spec: "), (name, details)
    # a caller without credentials is refused before its request is looked at, whatever its size
    code, details = code_of(job_pb2_grpc.JobServiceStub(edge.tls).CreateJob, over)
    assert code == grpc.StatusCode.UNAUTHENTICATED and details.startswith("no credentials"), details


def stalled(channel: grpc.Channel, method: str, metadata: Any = (), request: bytes = b"") -> tuple[Any, Any]:
    """A call whose request never comes until `release()`: the headers go out, the message does not (a client
    streaming call on the wire is a unary one that has not sent its message yet). (future, release)"""
    go = threading.Event()

    def requests() -> Iterator[bytes]:
        go.wait(60)
        yield request

    fut = channel.stream_unary(method).future(requests(), timeout=60, metadata=metadata)
    return fut, go.set


def test_a_caller_not_known_yet_is_answered_before_its_request_is_read(edge: Edge) -> None:
    """An unknown caller of the API, or of the internal services without their secret, is refused without the
    daemon waiting for (or holding) its request: gRPC would otherwise read each request whole before any check."""
    for channel, method, why in ((edge.tls, CREATE, "no credentials"),
                                 (edge.internal, "/peloton.v1.HostManagerInternal/ListRunningTasks",
                                  "the internal services answer only")):
        fut, release = stalled(channel, method)
        try:
            with pytest.raises(grpc.RpcError) as e:
                fut.result(timeout=10)  # before the request: it never comes
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED and why in e.value.details()
        finally:
            release()
    # a known caller's request is read once it is known: the call waits for it, then goes on
    fut, release = stalled(edge.tls, CREATE, edge.md(), job_pb2.CreateJobRequest().SerializeToString())
    time.sleep(0.5)
    assert not fut.done()
    release()
    with pytest.raises(grpc.RpcError) as e:
        fut.result(timeout=T)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and e.value.details() == "spec: required"


def test_reads_of_the_calls_open_to_anyone_are_gated(edge: Edge) -> None:
    """Health checks need no credentials, so their requests are read before anyone is known: at most PUBLIC_READS
    at once (each up to 4 MiB); one more waits a second, then gets RESOURCE_EXHAUSTED."""
    health = health_pb2_grpc.HealthStub(edge.tls)
    check = "/grpc.health.v1.Health/Check"
    held = [stalled(edge.tls, check, request=health_pb2.HealthCheckRequest().SerializeToString())
            for _ in range(PUBLIC_READS)]
    try:
        deadline = time.monotonic() + 20
        while True:  # until the stalled calls have reached the daemon and hold every slot
            code, details = code_of(health.Check, health_pb2.HealthCheckRequest())
            if code != grpc.StatusCode.OK or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert (code, details) == (grpc.StatusCode.RESOURCE_EXHAUSTED, BUSY)
    finally:
        for _, release in held:
            release()
    for fut, _ in held:  # read once they came, and answered
        assert health_pb2.HealthCheckResponse.FromString(fut.result(timeout=T)).status == \
            health_pb2.HealthCheckResponse.SERVING
    assert health.Check(health_pb2.HealthCheckRequest(), timeout=T).status == health_pb2.HealthCheckResponse.SERVING
    watch = health.Watch(health_pb2.HealthCheckRequest(service="peloton"), timeout=T)
    assert next(watch).status == health_pb2.HealthCheckResponse.SERVING  # a watch too (answered by callbacks)
    watch.cancel()


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (a message, a string) as protobuf writes it."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _unknown(number: int) -> bytes:
    return _varint(number << 3) + _varint(1)  # a varint field


def crafted_create(extra: bool) -> bytes:
    """A valid CreateJobRequest; with `extra`, fields the schema does not know: at the top, in spec.task and in
    the first of spec.placement.constraints."""
    fields = {f.name: f.number for f in job_pb2.JobSpec.DESCRIPTOR.fields}
    task = job_pb2.TaskSpec(command="train.py")
    task.resources.cpu, task.resources.mem = 1, "64Mi"
    constraint = job_pb2.Constraint(attribute="rack", op="exists")
    spec = job_pb2.JobSpec(name="crafted", instances=1).SerializeToString()
    spec += _field(fields["task"], task.SerializeToString() + (_unknown(98) if extra else b""))
    placement = _field(job_pb2.PlacementSpec.DESCRIPTOR.fields_by_name["constraints"].number,
                       constraint.SerializeToString() + (_unknown(97) if extra else b""))
    spec += _field(fields["placement"], placement)
    number = job_pb2.CreateJobRequest.DESCRIPTOR.fields_by_name["spec"].number
    return _field(number, spec) + (_unknown(99) + _unknown(100) if extra else b"")


def test_requests_with_fields_this_daemon_does_not_know_are_refused_naming_them(edge: Edge) -> None:
    call = edge.unix.unary_unary(CREATE)
    code, details = code_of(call, crafted_create(extra=True))
    assert code == grpc.StatusCode.INVALID_ARGUMENT, details
    assert details.startswith("request: unknown fields 99, 100 (peloton.v1.CreateJobRequest of this daemon's "
                              "release has no such field); spec.task: unknown field 98 (peloton.v1.TaskSpec"), details
    assert "spec.placement.constraints[0]: unknown field 97 (peloton.v1.Constraint" in details
    assert "a client of a newer release" in details
    jobs = job_pb2_grpc.JobServiceStub(edge.unix)
    assert not [j for j in jobs.ListJobs(job_pb2.ListJobsRequest(), timeout=T).jobs if j.spec.name == "crafted"]
    # the same request without them is a valid one
    assert job_pb2.CreateJobResponse.FromString(call(crafted_create(extra=False), timeout=T)).job_id
    # a caller not known yet learns nothing about the request: it is not read
    code, details = code_of(edge.tls.unary_unary(CREATE), crafted_create(extra=True))
    assert code == grpc.StatusCode.UNAUTHENTICATED
    # services that are not peloton's (health, for probes of any release) keep protobuf's rule: ignored
    check = edge.tls.unary_unary("/grpc.health.v1.Health/Check")
    answer = check(health_pb2.HealthCheckRequest(service="peloton").SerializeToString() + _unknown(9), timeout=T)
    assert health_pb2.HealthCheckResponse.FromString(answer).status == health_pb2.HealthCheckResponse.SERVING


def test_unknown_fields_are_found_at_any_depth() -> None:
    """Nested messages, repeated ones and the messages of a map (google.protobuf.Struct: map<string, Value>)."""
    assert unknown_fields(job_pb2.CreateJobRequest.FromString(crafted_create(extra=False))) == []
    assert unknown_fields(job_pb2.CreateJobRequest.FromString(crafted_create(extra=True))) == [
        "request: unknown fields 99, 100 (peloton.v1.CreateJobRequest of this daemon's release has no such field)",
        "spec.task: unknown field 98 (peloton.v1.TaskSpec of this daemon's release has no such field)",
        "spec.placement.constraints[0]: unknown field 97 (peloton.v1.Constraint of this daemon's release has no such "
        "field)"]
    value = struct_pb2.Value(string_value="v").SerializeToString() + _unknown(50)
    entry = _field(1, b"key") + _field(2, value)
    msg = struct_pb2.Struct.FromString(_field(1, entry))
    assert unknown_fields(msg, "labels") == [
        "labels.fields['key']: unknown field 50 (google.protobuf.Value of this daemon's release has no such field)"]


NAN, INF = float("nan"), float("inf")


def _vec(cpu: float = 1.0, mem_mib: float = 64.0, disk_mib: float = 0.0) -> internal_pb2.ResourceVector:
    return internal_pb2.ResourceVector(cpu=cpu, mem_mib=mem_mib, disk_mib=disk_mib)


def _gang(**kw: Any) -> internal_pb2.GangRequest:
    members = kw.pop("members", [internal_pb2.Member(instance=0, task_id="j-0-1", resources=_vec())])
    return internal_pb2.GangRequest(gang_id="g", job_id="j", attempt=1, respool="/", members=members,
                                    **{"enqueued_at": 1.0, **kw})


def _placement(**kw: Any) -> internal_pb2.Placement:
    member = internal_pb2.Assignment(instance=0, task_id="j-0-1", hostname="sim-00000", resources=kw.pop("res", _vec()))
    return internal_pb2.Placement(gang_id="g", job_id="j", attempt=1, members=[member], **kw)


RM, HM = "/peloton.v1.ResourceManagerInternal/", "/peloton.v1.HostManagerInternal/"
NON_FINITE = [
    (RM + "EnqueueGangs", internal_pb2.EnqueueGangsRequest(gangs=[_gang(members=[
        internal_pb2.Member(instance=0, task_id="j-0-1", resources=_vec()),
        internal_pb2.Member(instance=1, task_id="j-1-1", resources=_vec(cpu=NAN))], running=True)]),
     "gangs[0].members[1].resources.cpu: must be a finite number, got nan"),
    (RM + "EnqueueGangs", internal_pb2.EnqueueGangsRequest(gangs=[_gang(enqueued_at=-INF)]),
     "gangs[0].enqueued_at: must be a finite number, got -inf"),
    (RM + "EnqueueGangs", internal_pb2.EnqueueGangsRequest(gangs=[_gang(max_runtime_s=INF)]),
     "gangs[0].max_runtime_s: must be a finite number, got inf"),
    (RM + "EnqueueGangs", internal_pb2.EnqueueGangsRequest(gangs=[_gang(goal_json='{"local_bsz": NaN}')]),
     "gangs[0].goal_json: must be JSON with finite numbers, got NaN"),
    (RM + "EnqueueGangs", internal_pb2.EnqueueGangsRequest(gangs=[_gang(goal_json='{"local_bsz": 1e999}')]),
     "gangs[0].goal_json: must be JSON with finite numbers, got 1e999"),
    (RM + "EnqueueGangs", internal_pb2.EnqueueGangsRequest(gangs=[_gang(goal_json="{")]),
     "gangs[0].goal_json: not valid JSON"),
    (RM + "DequeueGangs", internal_pb2.DequeueGangsRequest(capacity=_vec(mem_mib=INF), timeout_ms=1),
     "capacity.mem_mib: must be a finite number, got inf"),
    (RM + "SetPlacements", internal_pb2.SetPlacementsRequest(placements=[_placement(res=_vec(disk_mib=NAN))]),
     "placements[0].members[0].resources.disk_mib: must be a finite number, got nan"),
    (RM + "SetPlacements", internal_pb2.SetPlacementsRequest(placements=[_placement(
        plan_json='{"gpus_per_host": [1], "step_time": Infinity, "samples_per_s": 1}')]),
     "placements[0].plan_json: must be JSON with finite numbers, got Infinity"),
    (RM + "SetPlacements", internal_pb2.SetPlacementsRequest(reservations=[internal_pb2.Reservation(
        gang=internal_pb2.GangKey(gang_id="g", attempt=1), hosts=["sim-00000"], expected_start=NAN)]),
     "reservations[0].expected_start: must be a finite number, got nan"),
    (RM + "GetPoolUsage", internal_pb2.GetPoolUsageRequest(path="/", extra_demand=_vec(cpu=INF)),
     "extra_demand.cpu: must be a finite number, got inf"),
    (RM + "PreviewAdmission", internal_pb2.PreviewAdmissionRequest(pool="/", gangs=[internal_pb2.GangAsk(
        total=_vec(cpu=NAN))]), "gangs[0].total.cpu: must be a finite number, got nan"),
    (HM + "ClaimPlacements", internal_pb2.ClaimPlacementsRequest(placements=[_placement(res=_vec(cpu=-INF))]),
     "placements[0].members[0].resources.cpu: must be a finite number, got -inf"),
    (HM + "LaunchGangs", internal_pb2.LaunchGangsRequest(gangs=[internal_pb2.GangLaunch(
        gang_id="g", attempt=1, members=[internal_pb2.LaunchTask(task_id="j-0-1")],
        shared=internal_pb2.LaunchTask(job_id="j", command="true", resources=_vec(mem_mib=NAN)))]),
     "gangs[0].shared.resources.mem_mib: must be a finite number, got nan"),
    (HM + "KillTasks", internal_pb2.KillTasksRequest(task_ids=["j-0-1"], grace_s=INF),
     "grace_s: must be a finite number, got inf"),
]


@pytest.mark.parametrize(("method", "request_", "error"), NON_FINITE, ids=[f"{m.rpartition('/')[2]}-{e.split(':')[0]}"
                                                                         for m, _, e in NON_FINITE])
def test_the_internal_services_refuse_numbers_that_are_not_finite_naming_them(
        edge: Edge, method: str, request_: Any, error: str) -> None:
    """A peer holding the components' secret is still refused NaN and infinities, at the edge: NaN compares false
    with everything, so a gang of NaN cores once made its pool's allocation NaN (and every share computed from it)."""
    secret = (METADATA_KEY, load_secret(edge.daemon.cfg.secret_file(), create=False))
    usage = edge.internal.unary_unary(RM + "GetPoolUsage", request_serializer=internal_pb2.GetPoolUsageRequest
                                      .SerializeToString, response_deserializer=internal_pb2.GetPoolUsageResponse
                                      .FromString)
    before = usage(internal_pb2.GetPoolUsageRequest(), timeout=T, metadata=[secret])
    code, details = code_of(edge.internal.unary_unary(method), request_.SerializeToString(), metadata=[secret])
    assert (code, details.partition(" (")[0]) == (grpc.StatusCode.INVALID_ARGUMENT, error), details
    after = usage(internal_pb2.GetPoolUsageRequest(), timeout=T, metadata=[secret])
    assert after == before  # nothing queued, claimed or accounted
    check = edge.internal.unary_unary(RM + "CheckGangs", request_serializer=internal_pb2.CheckGangsRequest
                                      .SerializeToString, response_deserializer=internal_pb2.CheckGangsResponse
                                      .FromString)
    gang = internal_pb2.GangKey(gang_id="g", attempt=1)
    assert list(check(internal_pb2.CheckGangsRequest(gangs=[gang]), timeout=T, metadata=[secret]).unknown) == [gang]


def test_numbers_that_are_not_finite_are_found_at_any_depth() -> None:
    """Repeated messages, maps of doubles and of messages (google.protobuf.Struct holds itself), JSON text; finite
    numbers whose sum overflows are finite all the same."""
    drains = internal_pb2.ListDrainsResponse(drains={"h1": 1.0, "h2": NAN})
    assert non_finite(drains) == ["drains['h2']: must be a finite number, got nan"]
    huge = internal_pb2.EnqueueGangsRequest(gangs=[_gang(members=[internal_pb2.Member(resources=_vec(1e308, 1e308))],
                                                         max_runtime_s=1e308, goal_json='{"a": [1e308, -1e308]}')])
    assert non_finite(huge) == []
    value = struct_pb2.Struct()
    value.update({"a": {"b": [1, NAN]}, "c": INF})
    assert sorted(non_finite(value, "labels")) == [  # (a map's order is protobuf's)
        "labels.fields['a'].struct_value.fields['b'].list_value.values[1].number_value: must be a finite number, "
        "got nan", "labels.fields['c'].number_value: must be a finite number, got inf"]
    many = internal_pb2.EnqueueGangsRequest(gangs=[_gang(members=[
        internal_pb2.Member(resources=_vec(cpu=NAN)) for _ in range(50)])])
    assert len(non_finite(many)) == 10  # the first ten: a message stays short
    assert non_finite(internal_pb2.GetPoolUsageRequest(path="/")) == []
