"""Hostile input against the real daemon, in-process, over real gRPC, on SQLite AND PostgreSQL.

Table-driven over every mutating RPC (CreateJob, StopJob, DeleteJob, CreatePool, DeletePool) and every field, and
over the request fields of the read RPCs (job ids, instance, attempt, filters, limit). For every case, on both
stores: either the request is accepted and works (the job or pool reads back as sent), or it fails with the
expected status (INVALID_ARGUMENT whose details start with the field at fault, or NOT_FOUND / FAILED_PRECONDITION
for a well-formed request about something absent or busy) and nothing was written (ListJobs and ListPools are
unchanged). Both stores give the same outcome. Never INTERNAL: that is reserved for bugs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from peloton.api import convert
from peloton.api.v1 import job_pb2, job_pb2_grpc, respool_pb2, respool_pb2_grpc, task_pb2, task_pb2_grpc
from peloton.domain import limits as L
from peloton.domain.resources import Resources
from peloton.server import Daemon
from peloton.settings import ServerConfig
from tests.asroot import AS_ROOT_SETTINGS
from tests.dbutil import postgres_database

RPC_TIMEOUT = 30.0
STORES = ("sqlite", "postgresql")
SEG = L.MAX_POOL_SEGMENT_CHARS
# a pool path of exactly MAX_POOL_PATH_CHARS, made in the fixture so that a job can name it
LONG_POOL = "/" + "/".join(["l" * SEG] * 3) + "/" + "l" * (L.MAX_POOL_PATH_CHARS - 3 * (SEG + 1) - 1)
# its parent chain, for CreatePool at the limit
DEEP_PARENT = "/" + "/".join(["d" * SEG] * 3)
assert len(LONG_POOL) == L.MAX_POOL_PATH_CHARS


def _chain(path: str) -> list[str]:
    """/a/b/c -> [/a, /a/b, /a/b/c]"""
    parts = path.strip("/").split("/")
    return ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]


@dataclass
class Api:
    store: str
    daemon: Daemon
    channel: grpc.Channel
    jobs: job_pb2_grpc.JobServiceStub
    tasks: task_pb2_grpc.TaskServiceStub
    pools: respool_pb2_grpc.ResourcePoolServiceStub
    created_jobs: list[str] = field(default_factory=list)
    _known_job: str = ""

    @property
    def known_job(self) -> str:
        """A job that exists, created on first use (so that a daemon unable to create jobs fails only the cases
        that need one)."""
        if not self._known_job:
            self._known_job = self.jobs.CreateJob(job_pb2.CreateJobRequest(spec=base_spec()),
                                                  timeout=RPC_TIMEOUT).job_id
        return self._known_job

    def raw(self, method: str) -> Callable[..., bytes]:
        """A call that sends bytes as they are: what a client not using protobuf can send."""
        return self.channel.unary_unary(method, request_serializer=None, response_deserializer=None)


def _start(store: str, db_url: str, tmp: Path, port_base: int, stack: contextlib.ExitStack) -> Api:
    """A daemon on `db_url`, stopped when `stack` closes (registered before anything else can fail)."""
    cfg = ServerConfig(
        listen="127.0.0.1:0", db_url=db_url, data_dir=tmp / "data", local_hosts=2,
        # every per-task ceiling fits one host: a spec at the limits is accepted, not "can never fit"
        local_host_resources=Resources(cpu=L.MAX_TASK_CPU, mem=L.MAX_TASK_MEM_MIB, disk=L.MAX_TASK_DISK_MIB,
                                       gpu=L.MAX_TASK_GPU),
        local_port_base=port_base, metrics_listen="", **AS_ROOT_SETTINGS,
    )
    d = Daemon(cfg)
    address = d.start()
    ch = grpc.insecure_channel(address)
    api = Api(store, d, ch, job_pb2_grpc.JobServiceStub(ch), task_pb2_grpc.TaskServiceStub(ch),
              respool_pb2_grpc.ResourcePoolServiceStub(ch))
    stack.callback(_stop, api)
    for path in _chain(LONG_POOL) + _chain(DEEP_PARENT):
        api.pools.CreatePool(respool_pb2.CreatePoolRequest(pool=respool_pb2.ResourcePool(path=path)),
                             timeout=RPC_TIMEOUT)
    return api


def _stop(api: Api) -> None:
    try:
        for j in api.jobs.ListJobs(job_pb2.ListJobsRequest(limit=L.MAX_LIST_LIMIT), timeout=RPC_TIMEOUT).jobs:
            if j.status.state not in ("SUCCEEDED", "FAILED", "KILLED"):
                api.jobs.StopJob(job_pb2.StopJobRequest(job_id=j.id), timeout=RPC_TIMEOUT)
    finally:
        api.channel.close()
        api.daemon.stop()


@pytest.fixture(scope="module")
def apis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Api]]:
    base = random.randrange(20000, 50001, 4000)
    with contextlib.ExitStack() as stack:
        out: dict[str, Api] = {}
        for i, store in enumerate(STORES):
            tmp = tmp_path_factory.mktemp(store)
            url = f"sqlite:///{tmp}/p.db" if store == "sqlite" else stack.enter_context(postgres_database())
            out[store] = _start(store, url, tmp, base + i * 2000, stack)
        yield out


# --- requests -----------------------------------------------------------------------------------------------------
def base_spec() -> job_pb2.JobSpec:
    s = job_pb2.JobSpec(name="hostile", instances=1)
    s.task.command = "true"
    s.task.resources.cpu = 0.5
    s.task.resources.mem = "64Mi"
    return s


def spec(change: Callable[[job_pb2.JobSpec], Any]) -> Callable[[Api], job_pb2.CreateJobRequest]:
    def build(_: Api) -> job_pb2.CreateJobRequest:
        s = base_spec()
        change(s)
        return job_pb2.CreateJobRequest(spec=s)

    return build


def setter(path: str, value: Any) -> Callable[[job_pb2.JobSpec], None]:
    """`task.resources.cpu` = value on the spec."""

    def change(s: Any) -> None:
        *outer, last = path.split(".")
        for part in outer:
            s = getattr(s, part)
        setattr(s, last, value)

    return change


def duration(path: str, seconds: int, nanos: int) -> Callable[[job_pb2.JobSpec], None]:
    def change(s: job_pb2.JobSpec) -> None:
        outer, inner = path.split(".")
        d = getattr(getattr(s, outer), inner)
        d.seconds, d.nanos = seconds, nanos

    return change


def env(values: dict[str, str]) -> Callable[[job_pb2.JobSpec], None]:
    return lambda s: s.task.env.update(values)


def constraints(n: int, attribute: str = "rack", op: str = "exists", value: str = "") -> Callable[..., None]:
    def change(s: job_pb2.JobSpec) -> None:
        for _ in range(n):
            s.placement.constraints.add(attribute=attribute, op=op, value=value)

    return change


def pool(path: str, share: float = 0.0, **dims: Any) -> Callable[[Api], respool_pb2.CreatePoolRequest]:
    """dims: reservation_cpu=..., limit_mem=..."""

    def build(_: Api) -> respool_pb2.CreatePoolRequest:
        p = respool_pb2.ResourcePool(path=path, share=share)
        for k, v in dims.items():
            which, dim = k.split("_")
            setattr(getattr(p, which), dim, v)
        return respool_pb2.CreatePoolRequest(pool=p)

    return build


def const(request: Any) -> Callable[[Api], Any]:
    return lambda _: request


OK = "ok"
NO_SUCH_JOB = "0123456789ab"  # well-formed: a request field past its limit is refused before any lookup
NOT_FOUND = grpc.StatusCode.NOT_FOUND
FAILED_PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION


@dataclass(frozen=True)
class Case:
    id: str
    rpc: str
    request: Callable[[Api], Any]
    expect: str | grpc.StatusCode  # "ok", the field of an INVALID_ARGUMENT, or another status


MiB_TEXT = "x" * (L.MAX_SPEC_BYTES + 1)

CREATE_JOB = [
    # name, owner, respool
    Case("name-at-limit", "CreateJob", spec(setter("name", "é" * L.MAX_JOB_NAME_CHARS)), OK),
    Case("name-past-limit", "CreateJob", spec(setter("name", "é" * (L.MAX_JOB_NAME_CHARS + 1))), "name"),
    Case("name-nul", "CreateJob", spec(setter("name", "a\x00b")), "name"),
    Case("name-empty", "CreateJob", spec(setter("name", "")), "name"),
    Case("owner-at-limit", "CreateJob", spec(setter("owner", "o" * L.MAX_OWNER_CHARS)), OK),
    Case("owner-past-limit", "CreateJob", spec(setter("owner", "o" * (L.MAX_OWNER_CHARS + 1))), "owner"),
    Case("owner-nul", "CreateJob", spec(setter("owner", "\x00")), "owner"),
    Case("respool-at-limit", "CreateJob", spec(setter("respool", LONG_POOL)), OK),
    Case("respool-past-limit", "CreateJob", spec(setter("respool", LONG_POOL + "x")), "respool"),
    Case("respool-newline", "CreateJob", spec(setter("respool", "/a\n")), "respool"),
    Case("respool-nul", "CreateJob", spec(setter("respool", "/a\x00")), "respool"),
    Case("respool-missing", "CreateJob", spec(setter("respool", "/nope")), "respool"),
    # instances and the gang
    Case("instances-3", "CreateJob", spec(setter("instances", 3)), OK),
    Case("instances-past-limit", "CreateJob", spec(lambda s: (setter("instances", L.MAX_INSTANCES + 1)(s),
                                                              setter("gang.min_available", 1)(s))), "instances"),
    Case("instances-0", "CreateJob", spec(setter("instances", 0)), "instances"),
    Case("instances-negative", "CreateJob", spec(setter("instances", -(2**31))), "instances"),
    Case("gang-past-limit", "CreateJob", spec(setter("instances", L.MAX_GANG_SIZE + 1)), "instances"),
    Case("min-available-past-limit", "CreateJob",
         spec(lambda s: (setter("instances", L.MAX_INSTANCES)(s), setter("gang.min_available", L.MAX_GANG_SIZE + 1)(s))),
         "gang.min_available"),
    Case("min-available-negative", "CreateJob", spec(setter("gang.min_available", -1)), "gang.min_available"),
    Case("min-available-over-instances", "CreateJob", spec(setter("gang.min_available", 2)), "gang.min_available"),
    Case("on-member-failure-nul", "CreateJob", spec(setter("gang.on_member_failure", "fail_job\x00")),
         "gang.on_member_failure"),
    # durations
    Case("launch-timeout-at-limit", "CreateJob",
         spec(duration("gang.launch_timeout", int(L.MAX_LAUNCH_TIMEOUT_S), 0)), OK),
    Case("launch-timeout-1ns", "CreateJob", spec(duration("gang.launch_timeout", 0, 1)), OK),
    Case("launch-timeout-past-limit", "CreateJob",
         spec(duration("gang.launch_timeout", int(L.MAX_LAUNCH_TIMEOUT_S), 1)), "gang.launch_timeout"),
    Case("launch-timeout-0", "CreateJob", spec(duration("gang.launch_timeout", 0, 0)), "gang.launch_timeout"),
    Case("launch-timeout-overflow", "CreateJob", spec(duration("gang.launch_timeout", 2**63 - 1, 0)),
         "gang.launch_timeout"),
    Case("launch-timeout-overflow-negative", "CreateJob", spec(duration("gang.launch_timeout", -(2**63), 0)),
         "gang.launch_timeout"),
    Case("launch-timeout-bad-nanos", "CreateJob", spec(duration("gang.launch_timeout", 1, 10**9)),
         "gang.launch_timeout"),
    Case("launch-timeout-mixed-signs", "CreateJob", spec(duration("gang.launch_timeout", 1, -1)),
         "gang.launch_timeout"),
    Case("max-runtime-at-limit", "CreateJob", spec(duration("sla.max_runtime", int(L.MAX_RUNTIME_S), 0)), OK),
    Case("max-runtime-past-limit", "CreateJob", spec(duration("sla.max_runtime", int(L.MAX_RUNTIME_S) + 1, 0)),
         "sla.max_runtime"),
    Case("max-runtime-negative", "CreateJob", spec(duration("sla.max_runtime", -1, 0)), "sla.max_runtime"),
    Case("max-runtime-overflow", "CreateJob", spec(duration("sla.max_runtime", L.PROTO_DURATION_MAX_SECONDS + 1, 0)),
         "sla.max_runtime"),
    Case("max-runtime-bad-nanos", "CreateJob", spec(duration("sla.max_runtime", 0, -(2**31))), "sla.max_runtime"),
    Case("max-runtime-mixed-signs", "CreateJob", spec(duration("sla.max_runtime", -1, 5)), "sla.max_runtime"),
    # sla, retry
    Case("priority-int32-max", "CreateJob", spec(setter("sla.priority", L.INT32_MAX)), OK),
    Case("priority-int32-min", "CreateJob", spec(setter("sla.priority", L.INT32_MIN)), OK),
    Case("max-attempts-at-limit", "CreateJob", spec(setter("retry.max_attempts", L.MAX_ATTEMPTS)), OK),
    Case("max-attempts-past-limit", "CreateJob", spec(setter("retry.max_attempts", L.MAX_ATTEMPTS + 1)),
         "retry.max_attempts"),
    Case("max-attempts-negative", "CreateJob", spec(setter("retry.max_attempts", -1)), "retry.max_attempts"),
    # the command and the environment
    Case("command-at-limit", "CreateJob", spec(setter("task.command", "true #" + "c" * (L.MAX_COMMAND_BYTES - 6))),
         OK),
    Case("command-past-limit", "CreateJob",
         spec(setter("task.command", "true #" + "c" * (L.MAX_COMMAND_BYTES - 5))), "task.command"),
    Case("command-past-limit-in-bytes", "CreateJob",
         spec(setter("task.command", "true #" + "€" * (L.MAX_COMMAND_BYTES // 3))), "task.command"),
    Case("command-nul", "CreateJob", spec(setter("task.command", "true\x00false")), "task.command"),
    Case("command-blank", "CreateJob", spec(setter("task.command", " \n ")), "task.command"),
    Case("env-value-at-limit", "CreateJob", spec(env({"V": "v" * L.MAX_ENV_VALUE_BYTES})), OK),
    Case("env-value-past-limit", "CreateJob", spec(env({"V": "v" * (L.MAX_ENV_VALUE_BYTES + 1)})), "task.env.V"),
    Case("env-value-nul", "CreateJob", spec(env({"V": "a\x00b"})), "task.env.V"),
    Case("env-name-newline", "CreateJob", spec(env({"FOO\n": "x"})), "task.env.FOO\\n"),
    Case("env-name-nul", "CreateJob", spec(env({"F\x00": "x"})), "task.env.F\\x00"),
    Case("env-name-at-limit", "CreateJob", spec(env({"N" * L.MAX_ENV_NAME_CHARS: "x"})), OK),
    Case("env-name-past-limit", "CreateJob", spec(env({"N" * (L.MAX_ENV_NAME_CHARS + 1): "x"})),
         "task.env." + "N" * 64 + "..."),
    Case("env-entries-at-limit", "CreateJob", spec(env({f"V{i}": "" for i in range(L.MAX_ENV_ENTRIES)})), OK),
    Case("env-entries-past-limit", "CreateJob", spec(env({f"V{i}": "" for i in range(L.MAX_ENV_ENTRIES + 1)})),
         "task.env"),
    Case("env-total-past-limit", "CreateJob",
         spec(env({f"V{i}": "v" * L.MAX_ENV_VALUE_BYTES for i in range(L.MAX_COMMAND_AND_ENV_BYTES
                                                                       // L.MAX_ENV_VALUE_BYTES)})), "task.env"),
    # resources
    Case("cpu-at-limit", "CreateJob", spec(setter("task.resources.cpu", L.MAX_TASK_CPU)), OK),
    Case("cpu-at-granularity", "CreateJob", spec(setter("task.resources.cpu", L.MIN_CPU)), OK),
    Case("cpu-past-limit", "CreateJob", spec(setter("task.resources.cpu", L.MAX_TASK_CPU + 0.5)),
         "task.resources.cpu"),
    Case("cpu-denormal", "CreateJob", spec(setter("task.resources.cpu", 5e-324)), "task.resources.cpu"),
    Case("cpu-tiny", "CreateJob", spec(setter("task.resources.cpu", 0.0009)), "task.resources.cpu"),
    Case("cpu-nan", "CreateJob", spec(setter("task.resources.cpu", float("nan"))), "task.resources.cpu"),
    Case("cpu-inf", "CreateJob", spec(setter("task.resources.cpu", float("inf"))), "task.resources.cpu"),
    Case("cpu-huge", "CreateJob", spec(setter("task.resources.cpu", 1e308)), "task.resources.cpu"),
    Case("mem-at-limit", "CreateJob", spec(setter("task.resources.mem", "64Ti")), OK),
    Case("mem-at-granularity", "CreateJob", spec(setter("task.resources.mem", "1Ki")), OK),
    Case("mem-past-limit", "CreateJob", spec(setter("task.resources.mem", "65Ti")), "task.resources.mem"),
    Case("mem-1e400Gi", "CreateJob", spec(setter("task.resources.mem", "1e400Gi")), "task.resources.mem"),
    Case("mem-400-digits", "CreateJob", spec(setter("task.resources.mem", "9" * 400 + "Gi")), "task.resources.mem"),
    Case("mem-tiny", "CreateJob", spec(setter("task.resources.mem", "0.5Ki")), "task.resources.mem"),
    Case("mem-nul", "CreateJob", spec(setter("task.resources.mem", "1Gi\x00")), "task.resources.mem"),
    Case("mem-long-garbage", "CreateJob", spec(setter("task.resources.mem", "x" * 100_000)), "task.resources.mem"),
    Case("disk-at-limit", "CreateJob", spec(setter("task.resources.disk", "1024Ti")), OK),
    Case("disk-past-limit", "CreateJob", spec(setter("task.resources.disk", "1025Ti")), "task.resources.disk"),
    Case("disk-tiny", "CreateJob", spec(setter("task.resources.disk", "0.0000001")), "task.resources.disk"),
    Case("gpu-at-limit", "CreateJob", spec(setter("task.resources.gpu", L.MAX_TASK_GPU)), OK),
    Case("gpu-past-limit", "CreateJob", spec(setter("task.resources.gpu", L.MAX_TASK_GPU + 1)),
         "task.resources.gpu"),
    Case("gpu-negative", "CreateJob", spec(setter("task.resources.gpu", -1)), "task.resources.gpu"),
    Case("ports-at-limit", "CreateJob", spec(setter("task.resources.ports", L.MAX_TASK_PORTS)), OK),
    Case("ports-past-limit", "CreateJob", spec(setter("task.resources.ports", L.MAX_TASK_PORTS + 1)),
         "task.resources.ports"),
    Case("ports-negative", "CreateJob", spec(setter("task.resources.ports", -(2**31))), "task.resources.ports"),
    Case("image-at-limit", "CreateJob", spec(setter("task.container.image", "i" * L.MAX_CONTAINER_IMAGE_CHARS)), OK),
    Case("image-past-limit", "CreateJob",
         spec(setter("task.container.image", "i" * (L.MAX_CONTAINER_IMAGE_CHARS + 1))), "task.container.image"),
    Case("image-nul", "CreateJob", spec(setter("task.container.image", "\x00")), "task.container.image"),
    # placement
    Case("strategy-nul", "CreateJob", spec(setter("placement.strategy", "pack\x00")), "placement.strategy"),
    Case("strategy-100k", "CreateJob", spec(setter("placement.strategy", "s" * 100_000)), "placement.strategy"),
    Case("constraints-at-limit", "CreateJob", spec(constraints(L.MAX_CONSTRAINTS)), OK),
    Case("constraints-past-limit", "CreateJob", spec(constraints(L.MAX_CONSTRAINTS + 1)), "placement.constraints"),
    Case("constraint-attribute-nul", "CreateJob", spec(constraints(1, attribute="ra\x00ck")),
         "placement.constraints[0].attribute"),
    Case("constraint-attribute-past-limit", "CreateJob",
         spec(constraints(1, attribute="a" * (L.MAX_CONSTRAINT_ATTRIBUTE_CHARS + 1))),
         "placement.constraints[0].attribute"),
    Case("constraint-op-nul", "CreateJob", spec(constraints(1, op="eq\x00", value="local")),
         "placement.constraints[0].op"),
    Case("constraint-value-nul", "CreateJob", spec(constraints(1, op="eq", value="local\x00")),
         "placement.constraints[0].value"),
    Case("constraint-value-past-limit", "CreateJob",
         spec(constraints(1, op="in", value="v" * (L.MAX_CONSTRAINT_VALUE_CHARS + 1))),
         "placement.constraints[0].value"),
    # the request as a whole
    Case("spec-missing", "CreateJob", const(job_pb2.CreateJobRequest()), "spec"),
    Case("spec-past-size-limit", "CreateJob", spec(setter("task.command", MiB_TEXT)), "spec"),
    # past the public port's 4 MiB (limits.MAX_REQUEST_BYTES): gRPC refuses it before it is read
    Case("spec-past-grpc-limit", "CreateJob", spec(setter("task.command", MiB_TEXT * 5)),
         grpc.StatusCode.RESOURCE_EXHAUSTED),
    Case("spec-bad-utf8", "CreateJob", const(b"\x0a\x03\x0a\x01\xff"), "request"),
]

JOB_IDS = [
    ("empty", "", "job_id"),
    ("nul", "0123456789a\x00", "job_id"),
    ("past-limit", "j" * (L.MAX_JOB_ID_CHARS + 1), "job_id"),
    ("at-limit-absent", "j" * L.MAX_JOB_ID_CHARS, NOT_FOUND),
    ("percent", "%", NOT_FOUND),
    ("unicode", "\U0001f600", NOT_FOUND),
]
STOP_DELETE = [Case(f"{rpc}-job-id-{name}", rpc, const(req(job_id=v)), expect) for rpc, req in
               (("StopJob", job_pb2.StopJobRequest), ("DeleteJob", job_pb2.DeleteJobRequest))
               for name, v, expect in JOB_IDS]
STOP_DELETE += [
    Case("StopJob-known", "StopJob", lambda api: job_pb2.StopJobRequest(job_id=api.known_job), OK),
    Case("StopJob-bad-utf8", "StopJob", const(b"\x0a\x02\xc3\x28"), "request"),
    Case("DeleteJob-bad-utf8", "DeleteJob", const(b"\x0a\x01\x80"), "request"),
]

CREATE_POOL = [
    Case("pool-path-at-limit", "CreatePool",
         pool(DEEP_PARENT + "/" + "q" * (L.MAX_POOL_PATH_CHARS - len(DEEP_PARENT) - 1)), OK),
    Case("pool-path-past-limit", "CreatePool",
         pool(DEEP_PARENT + "/" + "q" * (L.MAX_POOL_PATH_CHARS - len(DEEP_PARENT))), "pool.path"),
    Case("pool-segment-at-limit", "CreatePool", pool("/" + "s" * SEG), OK),
    Case("pool-segment-past-limit", "CreatePool", pool("/" + "s" * (SEG + 1)), "pool.path"),
    Case("pool-path-newline", "CreatePool", pool("/a\n"), "pool.path"),
    Case("pool-path-nul", "CreatePool", pool("/a\x00"), "pool.path"),
    Case("pool-path-root", "CreatePool", pool("/"), "pool.path"),
    Case("pool-path-empty", "CreatePool", pool(""), "pool.path"),
    Case("pool-path-dotdot", "CreatePool", pool("/a/.."), "pool.path"),
    Case("pool-parent-missing", "CreatePool", pool("/missing/child"), NOT_FOUND),
    Case("pool-exists", "CreatePool", pool(LONG_POOL), grpc.StatusCode.ALREADY_EXISTS),
    Case("pool-share-at-limit", "CreatePool", pool("/share-max", share=L.MAX_POOL_SHARE), OK),
    Case("pool-share-at-granularity", "CreatePool", pool("/share-min", share=L.MIN_POOL_SHARE), OK),
    Case("pool-share-past-limit", "CreatePool", pool("/p", share=L.MAX_POOL_SHARE * 2), "pool.share"),
    Case("pool-share-nan", "CreatePool", pool("/p", share=float("nan")), "pool.share"),
    Case("pool-share-inf", "CreatePool", pool("/p", share=float("inf")), "pool.share"),
    Case("pool-share-negative", "CreatePool", pool("/p", share=-1.0), "pool.share"),
    Case("pool-share-denormal", "CreatePool", pool("/p", share=5e-324), "pool.share"),
    Case("pool-bad-utf8", "CreatePool", const(b"\x0a\x03\x0a\x01\xfe"), "request"),
]
for _which in ("reservation", "limit"):
    CREATE_POOL += [
        Case(f"pool-{_which}-at-limits", "CreatePool",
             pool(f"/{_which}-max", 0.0, **{f"{_which}_cpu": L.MAX_POOL_CPU, f"{_which}_mem": "1048576Ti",
                                      f"{_which}_disk": "1048576Ti", f"{_which}_gpu": L.MAX_POOL_GPU,
                                      f"{_which}_ports": L.MAX_POOL_PORTS}), OK),
        Case(f"pool-{_which}-at-granularity", "CreatePool",
             pool(f"/{_which}-min", 0.0, **{f"{_which}_cpu": L.MIN_CPU, f"{_which}_mem": "1Ki", f"{_which}_disk": "1Ki"}),
             OK),
        Case(f"pool-{_which}-mem-past-limit", "CreatePool", pool("/p", 0.0, **{f"{_which}_mem": "1048577Ti"}),
             f"pool.{_which}.mem"),
        Case(f"pool-{_which}-mem-inf", "CreatePool", pool("/p", 0.0, **{f"{_which}_mem": "9" * 400}), f"pool.{_which}.mem"),
        Case(f"pool-{_which}-disk-tiny", "CreatePool", pool("/p", 0.0, **{f"{_which}_disk": "0.1Ki"}),
             f"pool.{_which}.disk"),
        Case(f"pool-{_which}-gpu-past-limit", "CreatePool", pool("/p", 0.0, **{f"{_which}_gpu": L.MAX_POOL_GPU + 1}),
             f"pool.{_which}.gpu"),
        Case(f"pool-{_which}-gpu-negative", "CreatePool", pool("/p", 0.0, **{f"{_which}_gpu": -1}), f"pool.{_which}.gpu"),
        Case(f"pool-{_which}-ports-negative", "CreatePool", pool("/p", 0.0, **{f"{_which}_ports": -1}),
             f"pool.{_which}.ports"),
        Case(f"pool-{_which}-ports-past-limit", "CreatePool",
             pool("/p", 0.0, **{f"{_which}_ports": L.MAX_POOL_PORTS + 1}), f"pool.{_which}.ports"),
    ]
    for _v, _name in ((float("nan"), "nan"), (float("inf"), "inf"), (-1.0, "negative"), (5e-324, "denormal"),
                      (L.MAX_POOL_CPU * 2, "huge")):
        CREATE_POOL.append(Case(f"pool-{_which}-cpu-{_name}", "CreatePool", pool("/p", 0.0, **{f"{_which}_cpu": _v}),
                                f"pool.{_which}.cpu"))

POOL_PATHS = [
    ("empty", "", "path"),
    ("nul", "/a\x00", "path"),
    ("newline", "/a\n", "path"),
    ("relative", "a", "path"),
    ("past-limit", LONG_POOL + "x", "path"),
    ("absent", "/absent", NOT_FOUND),
]
DELETE_POOL = [Case(f"DeletePool-{name}", "DeletePool", const(respool_pb2.DeletePoolRequest(path=v)), expect)
               for name, v, expect in POOL_PATHS]
DELETE_POOL += [
    Case("DeletePool-root", "DeletePool", const(respool_pb2.DeletePoolRequest(path="/")), FAILED_PRECONDITION),
    Case("DeletePool-with-children", "DeletePool", const(respool_pb2.DeletePoolRequest(path=_chain(LONG_POOL)[-2])),
         FAILED_PRECONDITION),
    Case("DeletePool-bad-utf8", "DeletePool", const(b"\x0a\x02/\xff"), "request"),
]

READS = [Case(f"GetPool-{name}", "GetPool", const(respool_pb2.GetPoolRequest(path=v)), expect)
         for name, v, expect in POOL_PATHS]
READS += [Case("GetPool-long", "GetPool", const(respool_pb2.GetPoolRequest(path=LONG_POOL)), OK)]
READS += [Case(f"{rpc}-job-id-{name}", rpc, const(req(job_id=v)), expect) for rpc, req in
          (("GetJob", job_pb2.GetJobRequest), ("ListTasks", task_pb2.ListTasksRequest),
           ("GetTask", task_pb2.GetTaskRequest), ("GetTaskLogs", task_pb2.GetTaskLogsRequest),
           ("ListTaskEvents", task_pb2.ListTaskEventsRequest))
          for name, v, expect in JOB_IDS]
READS += [
    Case("GetJob-known", "GetJob", lambda api: job_pb2.GetJobRequest(job_id=api.known_job), OK),
    Case("GetJob-bad-utf8", "GetJob", const(b"\x0a\x01\xff"), "request"),
    Case("ListTasks-known", "ListTasks", lambda api: task_pb2.ListTasksRequest(job_id=api.known_job), OK),
    Case("GetTask-known", "GetTask", lambda api: task_pb2.GetTaskRequest(job_id=api.known_job), OK),
    Case("GetTask-instance-negative", "GetTask",
         const(task_pb2.GetTaskRequest(job_id=NO_SUCH_JOB, instance=-1)), "instance"),
    Case("GetTask-instance-absent", "GetTask",
         lambda api: task_pb2.GetTaskRequest(job_id=api.known_job, instance=L.INT32_MAX), NOT_FOUND),
    Case("GetTaskLogs-instance-negative", "GetTaskLogs",
         const(task_pb2.GetTaskLogsRequest(job_id=NO_SUCH_JOB, instance=-1)), "instance"),
    Case("GetTaskLogs-attempt-negative", "GetTaskLogs",
         const(task_pb2.GetTaskLogsRequest(job_id=NO_SUCH_JOB, attempt=-1)), "attempt"),
    Case("GetTaskLogs-tail-negative", "GetTaskLogs",
         const(task_pb2.GetTaskLogsRequest(job_id=NO_SUCH_JOB, tail_bytes=-1)), "tail_bytes"),
    Case("GetTaskLogs-tail-over-a-message", "GetTaskLogs",
         const(task_pb2.GetTaskLogsRequest(job_id=NO_SUCH_JOB, tail_bytes=(1 << 20) + 1)), "tail_bytes"),
    Case("GetTaskLogs-stream-nul", "GetTaskLogs",
         const(task_pb2.GetTaskLogsRequest(job_id=NO_SUCH_JOB, stream="stdout\x00")), "stream"),
    Case("ListTaskEvents-known", "ListTaskEvents",
         lambda api: task_pb2.ListTaskEventsRequest(job_id=api.known_job, instances=[0], limit=10_000), OK),
    Case("ListTaskEvents-instance-negative", "ListTaskEvents",
         const(task_pb2.ListTaskEventsRequest(job_id=NO_SUCH_JOB, instances=[0, -1])), "instances[1]"),
    Case("ListTaskEvents-too-many-instances", "ListTaskEvents",
         const(task_pb2.ListTaskEventsRequest(job_id=NO_SUCH_JOB, instances=range(10_001))), "instances"),
    Case("ListTaskEvents-limit-negative", "ListTaskEvents",
         const(task_pb2.ListTaskEventsRequest(job_id=NO_SUCH_JOB, limit=-1)), "limit"),
    Case("ListTaskEvents-limit-over", "ListTaskEvents",
         const(task_pb2.ListTaskEventsRequest(job_id=NO_SUCH_JOB, limit=10_001)), "limit"),
    Case("ListTaskEvents-unknown-job", "ListTaskEvents",
         const(task_pb2.ListTaskEventsRequest(job_id=NO_SUCH_JOB)), NOT_FOUND),
    Case("GetTaskLogs-attempt-absent", "GetTaskLogs",
         lambda api: task_pb2.GetTaskLogsRequest(job_id=api.known_job, attempt=L.INT32_MAX), grpc.StatusCode.NOT_FOUND),
]
LIST: list[tuple[str, dict[str, Any], str]] = [
    ("limit-at-limit", {"limit": L.MAX_LIST_LIMIT}, OK),
    ("limit-past-limit", {"limit": L.MAX_LIST_LIMIT + 1}, "limit"),
    ("limit-negative", {"limit": -1}, "limit"),
    ("owner-at-limit", {"owner": "o" * L.MAX_OWNER_CHARS}, OK),
    ("owner-past-limit", {"owner": "o" * (L.MAX_OWNER_CHARS + 1)}, "owner"),
    ("owner-nul", {"owner": "al\x00ice"}, "owner"),
    ("respool-at-limit", {"respool": LONG_POOL}, OK),
    ("respool-past-limit", {"respool": LONG_POOL + "x"}, "respool"),
    ("respool-nul", {"respool": "/\x00"}, "respool"),
    ("respool-newline", {"respool": "/a\n"}, "respool"),
    ("name-contains-at-limit", {"name_contains": "n" * L.MAX_NAME_CONTAINS_CHARS}, OK),
    ("name-contains-past-limit", {"name_contains": "n" * (L.MAX_NAME_CONTAINS_CHARS + 1)}, "name_contains"),
    ("name-contains-nul", {"name_contains": "\x00"}, "name_contains"),
    ("name-contains-wildcards", {"name_contains": "%_\\"}, OK),
    ("states-ok", {"states": ["running", "KILLED"]}, OK),
    ("states-unknown", {"states": ["RUNNING", "SLEEPING"]}, "states[1]"),
    ("states-nul", {"states": ["RUNNING\x00"]}, "states[0]"),
    ("states-past-limit", {"states": ["RUNNING"] * (L.MAX_STATE_FILTERS + 1)}, "states"),
    ("states-100k", {"states": ["x" * 100_000]}, "states[0]"),
]
READS += [Case(f"ListJobs-{name}", "ListJobs", const(job_pb2.ListJobsRequest(**kw)), expect)
          for name, kw, expect in LIST]
READS += [Case("ListJobs-bad-utf8", "ListJobs", const(b"\x12\x01\xff"), "request")]

MUTATING = CREATE_JOB + STOP_DELETE + CREATE_POOL + DELETE_POOL

METHODS = {
    "CreateJob": ("jobs", "/peloton.v1.JobService/CreateJob"),
    "GetJob": ("jobs", "/peloton.v1.JobService/GetJob"),
    "ListJobs": ("jobs", "/peloton.v1.JobService/ListJobs"),
    "StopJob": ("jobs", "/peloton.v1.JobService/StopJob"),
    "DeleteJob": ("jobs", "/peloton.v1.JobService/DeleteJob"),
    "ListTasks": ("tasks", "/peloton.v1.TaskService/ListTasks"),
    "GetTask": ("tasks", "/peloton.v1.TaskService/GetTask"),
    "GetTaskLogs": ("tasks", "/peloton.v1.TaskService/GetTaskLogs"),
    "ListTaskEvents": ("tasks", "/peloton.v1.TaskService/ListTaskEvents"),
    "CreatePool": ("pools", "/peloton.v1.ResourcePoolService/CreatePool"),
    "GetPool": ("pools", "/peloton.v1.ResourcePoolService/GetPool"),
    "DeletePool": ("pools", "/peloton.v1.ResourcePoolService/DeletePool"),
}


# --- running a case -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Outcome:
    code: grpc.StatusCode
    details: str
    response: Any = None

    def summary(self) -> tuple[str, str]:
        """What must be the same on both stores: the code, and for INVALID_ARGUMENT the field at fault."""
        if self.code == grpc.StatusCode.INVALID_ARGUMENT:
            return self.code.name, self.details.split(": ", 1)[0]
        return self.code.name, ""


def call(api: Api, case: Case) -> Outcome:
    request = case.request(api)
    stub_name, method = METHODS[case.rpc]
    fn = api.raw(method) if isinstance(request, bytes) else getattr(getattr(api, stub_name), case.rpc)
    try:
        return Outcome(grpc.StatusCode.OK, "", fn(request, timeout=RPC_TIMEOUT))
    except grpc.RpcError as e:
        return Outcome(e.code(), e.details() or "")


def snapshot(api: Api) -> tuple[set[str], list[tuple[str, str, str, float]]]:
    """What a mutating RPC may change: the jobs that exist, and the pools with their definitions."""
    jobs = {j.id for j in api.jobs.ListJobs(job_pb2.ListJobsRequest(limit=L.MAX_LIST_LIMIT), timeout=RPC_TIMEOUT).jobs}
    pools = [(p.path, p.reservation.SerializeToString(deterministic=True),
              p.limit.SerializeToString(deterministic=True) if p.HasField("limit") else "-", p.share)
             for p in api.pools.ListPools(respool_pb2.ListPoolsRequest(), timeout=RPC_TIMEOUT).pools]
    return jobs, pools


def check_expected(case: Case, out: Outcome, store: str) -> None:
    where = f"{case.id} on {store}: {out.code.name} {out.details[:300]!r}"
    assert out.code not in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN), where
    if case.expect == OK:
        assert out.code == grpc.StatusCode.OK, where
    elif isinstance(case.expect, grpc.StatusCode):
        assert out.code == case.expect, where
    else:
        assert out.code == grpc.StatusCode.INVALID_ARGUMENT, where
        assert out.details.startswith(case.expect + ": "), where
    assert "\n" not in out.details and len(out.details.encode()) <= 1100, where


def check_it_worked(api: Api, case: Case, out: Outcome) -> None:
    """An accepted mutation did what it says."""
    request = case.request(api)
    if case.rpc == "CreateJob":
        api.created_jobs.append(out.response.job_id)
        got = api.jobs.GetJob(job_pb2.GetJobRequest(job_id=out.response.job_id), timeout=RPC_TIMEOUT).job
        sent = convert.spec_from_proto(request.spec)
        back = convert.spec_from_proto(got.spec)
        assert back.gang_size == sent.gang_size  # the API shows min_available 0 ("all") as the gang size
        assert dataclasses.replace(back, min_available=sent.min_available) == sent, case.id
    elif case.rpc == "CreatePool":
        got = api.pools.GetPool(respool_pb2.GetPoolRequest(path=request.pool.path), timeout=RPC_TIMEOUT).pool
        assert convert.pool_from_proto(got) == convert.pool_from_proto(request.pool)
        api.pools.DeletePool(respool_pb2.DeletePoolRequest(path=request.pool.path), timeout=RPC_TIMEOUT)
    elif case.rpc == "StopJob":
        job = api.jobs.GetJob(job_pb2.GetJobRequest(job_id=request.job_id), timeout=RPC_TIMEOUT).job
        assert job.status.desired_state == "KILLED" or job.status.state in ("SUCCEEDED", "FAILED", "KILLED")


def run_on_both_stores(apis: dict[str, Api], case: Case, mutating: bool) -> None:
    outcomes = {}
    for store, api in apis.items():
        before = snapshot(api) if mutating else None
        out = call(api, case)
        check_expected(case, out, store)
        if out.code == grpc.StatusCode.OK:
            check_it_worked(api, case, out)
        elif mutating:
            assert snapshot(api) == before, f"{case.id} on {store}: refused, yet something was written"
        outcomes[store] = out.summary()
    assert outcomes["sqlite"] == outcomes["postgresql"], f"{case.id}: the stores disagree: {outcomes}"


@pytest.mark.parametrize("case", MUTATING, ids=[c.id for c in MUTATING])
def test_mutating_rpc(apis: dict[str, Api], case: Case) -> None:
    run_on_both_stores(apis, case, mutating=True)


@pytest.mark.parametrize("case", READS, ids=[c.id for c in READS])
def test_read_rpc(apis: dict[str, Api], case: Case) -> None:
    run_on_both_stores(apis, case, mutating=False)


def test_every_mutating_rpc_and_read_rpc_is_covered() -> None:
    assert {c.rpc for c in MUTATING} == {"CreateJob", "StopJob", "DeleteJob", "CreatePool", "DeletePool"}
    assert {c.rpc for c in READS} == {"GetJob", "ListJobs", "ListTasks", "GetTask", "GetTaskLogs", "ListTaskEvents",
                                           "GetPool"}


def test_accepted_jobs_are_listed_on_both_stores(apis: dict[str, Api]) -> None:
    """Runs after the cases: every job a case created is still there, and listing them all works."""
    for api in apis.values():
        listed = {j.id for j in api.jobs.ListJobs(job_pb2.ListJobsRequest(limit=L.MAX_LIST_LIMIT),
                                                  timeout=RPC_TIMEOUT).jobs}
        assert api.created_jobs and set(api.created_jobs) <= listed
