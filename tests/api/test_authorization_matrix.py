"""Every public RPC against every kind of caller, through one real daemon (gRPC over TCP, sim backend, SQLite: who
may call what is decided above the store; test_permissions.py runs the owner checks on both stores): the answer
docs/security.md ("Principals and roles") documents, and each refusal in the audit log. The RPCs are listed from the
generated descriptors, so a new one without a row fails `test_every_public_rpc_has_a_row`.

Callers: no credentials; a viewer; alice, a submitter who owns the job, task, logs and model a row acts on; bob, a
submitter, another tenant; an operator; an admin; the daemon's own user over its owner-only Unix socket (an admin,
and the only caller of CreateConsoleLogin). Reads are open to every role (the documented rule: no tenant's jobs,
pools, hosts or models are hidden from another's, only environment values and logs are the owner's); another
tenant's object is PERMISSION_DENIED, not NOT_FOUND. The internal services are served on no public port
(test_headers_that_name_another_caller_count_for_nothing_over_tcp)."""

from __future__ import annotations

import functools
import http.client
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import grpc
import pytest
from google.protobuf import message_factory

from peloton.api.v1 import (
    audit_pb2,
    cluster_pb2,
    host_pb2,
    internal_pb2,
    job_pb2,
    model_pb2,
    respool_pb2,
    sim_pb2,
    task_pb2,
)
from peloton.domain.resources import Resources
from peloton.hostmgr.sim.backend import SimSettings
from peloton.security.identity import add_token
from peloton.server import Daemon
from peloton.settings import ServerConfig

T = 15.0
PUBLIC = (audit_pb2, cluster_pb2, host_pb2, job_pb2, model_pb2, respool_pb2, sim_pb2, task_pb2)  # not internal_pb2
CALLERS = ("nobody", "viewer", "alice", "bob", "operator", "admin", "socket")
OK, DENIED, UNAUTH = "OK", "PERMISSION_DENIED", "UNAUTHENTICATED"
MODEL_DOC = json.dumps({"kind": "peloton.model/v1", "description": {
    "parameters": 110_000_000, "flops_per_sample": 2.5e11, "sync": "allreduce-ring"}})
HOST = "sim-00003"  # drained and failed by the host rows (alice's jobs are small: they start on sim-00000)


def public_methods() -> dict[str, Any]:
    """'/peloton.v1.Service/Method' -> its MethodDescriptor, for every service of the public API."""
    out = {}
    for module in PUBLIC:
        for service in module.DESCRIPTOR.services_by_name.values():
            for m in service.methods:
                out[f"/{service.full_name}/{m.name}"] = m
    return out


@dataclass
class Daemon1:
    daemon: Daemon
    channel: grpc.Channel
    socket: grpc.Channel  # the daemon's owner-only Unix socket: the daemon's own user, an admin
    tokens: dict[str, str]
    n: int = 0
    model: str = ""  # alice's stored model, for plans
    running: str = ""  # alice's job whose task runs
    socket_principal: str = ""  # the name of the daemon's own user, as the socket's caller is known

    def md(self, who: str) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.tokens[who]}"),) if who in self.tokens else ()

    def call(self, path: str, request: Any, who: str) -> Any:
        """The answer of `path` (a stream's first message) as `who`; raises grpc.RpcError."""
        m = public_methods()[path]
        out = message_factory.GetMessageClass(m.output_type)
        channel = self.socket if who == "socket" else self.channel
        if m.server_streaming:
            stream = channel.unary_stream(path, request_serializer=type(request).SerializeToString,
                                               response_deserializer=out.FromString)(
                request, timeout=T, metadata=self.md(who))
            try:
                return next(stream)
            finally:
                stream.cancel()
        return channel.unary_unary(path, request_serializer=type(request).SerializeToString,
                                        response_deserializer=out.FromString)(request, timeout=T, metadata=self.md(who))

    def unique(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}-{self.n}"

    def alices_job(self, stopped: bool = False) -> str:
        job_id = str(self.call("/peloton.v1.JobService/CreateJob", job_pb2.CreateJobRequest(spec=spec()), "alice")
                     .job_id)
        if stopped:  # and ended: only then may it be deleted
            self.call("/peloton.v1.JobService/StopJob", job_pb2.StopJobRequest(job_id=job_id), "alice")
            self.wait(job_id, lambda: self.call("/peloton.v1.JobService/GetJob", job_pb2.GetJobRequest(job_id=job_id),
                                                "alice").job.status.state == "KILLED")
        return job_id

    def wait(self, what: str, done: Callable[[], bool]) -> None:
        deadline = time.monotonic() + 60
        while not done():
            assert time.monotonic() < deadline, what
            time.sleep(0.02)

    def alices_model(self) -> str:
        name = self.unique("alices-model")
        self.call("/peloton.v1.ModelService/CreateModel",
                  model_pb2.CreateModelRequest(name=name, document_json=MODEL_DOC), "alice")
        return name

    def pool(self) -> str:
        path = "/" + self.unique("pool")
        self.call("/peloton.v1.ResourcePoolService/CreatePool",
                  respool_pb2.CreatePoolRequest(pool=respool_pb2.ResourcePool(path=path)), "admin")
        return path


def spec(owner: str = "", model: str = "") -> job_pb2.JobSpec:
    s = job_pb2.JobSpec(name="authz", instances=1, owner=owner)
    s.task.command, s.task.resources.cpu, s.task.resources.mem = "train.py", 1, "64Mi"
    s.task.env["PELOTON_SIM_DURATION"] = "1h"
    if model:
        s.task.resources.gpu, s.model.name, s.model.local_bsz, s.placement.strategy = 1, model, 32, "model-aware"
    return s


@pytest.fixture(scope="module")
def d(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon1]:
    tmp: Path = tmp_path_factory.mktemp("authz")
    principals = tmp / "principals.json"
    tokens = {who: add_token(principals, who, [role]) for who, role in (
        ("viewer", "viewer"), ("alice", "submitter"), ("bob", "submitter"), ("operator", "operator"),
        ("admin", "admin"))}
    daemon = Daemon(ServerConfig(listen="127.0.0.1:0", db_url=f"sqlite:///{tmp}/p.db", data_dir=tmp / "data",
                                 metrics_listen="", backend="sim", principals_file=principals, ui_listen="127.0.0.1:0",
                                 rate_limit=0, sim=SimSettings(hosts=4, resources=Resources(cpu=64, mem=65536, gpu=8),
                                                               racks=1)))
    channel = grpc.insecure_channel(daemon.start())
    socket = grpc.insecure_channel(f"unix:{tmp / 'data' / 'peloton.sock'}")
    try:
        d = Daemon1(daemon, channel, socket, tokens)
        d.model = d.alices_model()
        d.socket_principal = d.call(C + "GetClusterInfo", cluster_pb2.GetClusterInfoRequest(), "socket").security.caller
        d.running = d.alices_job()  # one that has started: its logs can be read
        d.wait("alice's job did not start", lambda: d.call(
            "/peloton.v1.TaskService/GetTask", task_pb2.GetTaskRequest(job_id=d.running), "alice"
        ).task.state == "RUNNING")
        yield d
    finally:
        channel.close()
        socket.close()
        daemon.stop()


ADMIN = frozenset({"admin", "socket"})
EVERY_ROLE = frozenset({"viewer", "alice", "bob", "operator"}) | ADMIN
SUBMITTERS = frozenset({"alice", "bob", "operator"}) | ADMIN  # job.create
OWNER_OR_ANY = frozenset({"alice", "operator"}) | ADMIN  # alice's object: its owner, or job.control/secrets.any
OWNER_OR_ADMIN = frozenset({"alice"}) | ADMIN  # alice's stored model, a job for alice: her, or an admin
HOSTS = frozenset({"operator"}) | ADMIN  # host.operate
AUDIT = frozenset({"operator"}) | ADMIN
SOCKET = frozenset({"socket"})  # decided by how the caller came, not by a role
CONSOLE = frozenset[str]()  # only the daemon's own console, which this test is not


@dataclass(frozen=True)
class Row:
    path: str  # '/peloton.v1.Service/Method'
    variant: str  # what of the call this row tries
    allowed: frozenset[str]  # the callers answered OK; every other one with credentials: PERMISSION_DENIED
    request: Callable[[Daemon1, str], Any]  # (daemon, caller) -> the request, made just before the call


J, TS, P, H, S = ("/peloton.v1.JobService/", "/peloton.v1.TaskService/", "/peloton.v1.ResourcePoolService/",
                  "/peloton.v1.HostService/", "/peloton.v1.SimService/")
M, C, A = "/peloton.v1.ModelService/", "/peloton.v1.ClusterService/", "/peloton.v1.AuditService/"

ROWS = (
    Row(J + "CreateJob", "", SUBMITTERS, lambda d, w: job_pb2.CreateJobRequest(spec=spec())),
    Row(J + "CreateJob", "owned by alice", OWNER_OR_ADMIN, lambda d, w: job_pb2.CreateJobRequest(spec=spec("alice"))),
    Row(J + "CreateJob", "dry run", SUBMITTERS, lambda d, w: job_pb2.CreateJobRequest(spec=spec(), dry_run=True)),
    Row(J + "GetJob", "alice's", EVERY_ROLE, lambda d, w: job_pb2.GetJobRequest(job_id=d.alices_job())),
    Row(J + "PlanJob", "", EVERY_ROLE, lambda d, w: job_pb2.PlanJobRequest(spec=spec(model=d.model))),
    Row(J + "ListJobs", "", EVERY_ROLE, lambda d, w: job_pb2.ListJobsRequest()),
    Row(J + "WatchJobs", "every job", EVERY_ROLE, lambda d, w: job_pb2.WatchJobsRequest(tasks=True)),
    Row(J + "WatchJobs", "alice's", EVERY_ROLE, lambda d, w: job_pb2.WatchJobsRequest(job_ids=[d.alices_job()])),
    Row(J + "StopJob", "alice's", OWNER_OR_ANY, lambda d, w: job_pb2.StopJobRequest(job_id=d.alices_job())),
    Row(J + "DeleteJob", "alice's", OWNER_OR_ANY,
        lambda d, w: job_pb2.DeleteJobRequest(job_id=d.alices_job(stopped=True))),
    Row(TS + "ListTasks", "alice's", EVERY_ROLE, lambda d, w: task_pb2.ListTasksRequest(job_id=d.alices_job())),
    Row(TS + "GetTask", "alice's", EVERY_ROLE, lambda d, w: task_pb2.GetTaskRequest(job_id=d.alices_job())),
    Row(TS + "ListTaskEvents", "alice's", EVERY_ROLE,
        lambda d, w: task_pb2.ListTaskEventsRequest(job_id=d.alices_job())),
    Row(TS + "GetTaskLogs", "alice's", OWNER_OR_ANY, lambda d, w: task_pb2.GetTaskLogsRequest(job_id=d.running)),
    Row(P + "CreatePool", "", ADMIN, lambda d, w: respool_pb2.CreatePoolRequest(
        pool=respool_pb2.ResourcePool(path="/" + d.unique("new")))),
    Row(P + "UpdatePool", "", ADMIN, lambda d, w: respool_pb2.UpdatePoolRequest(
        pool=respool_pb2.ResourcePool(path=d.pool(), share=2))),
    Row(P + "DeletePool", "", ADMIN, lambda d, w: respool_pb2.DeletePoolRequest(path=d.pool())),
    Row(P + "GetPool", "", EVERY_ROLE, lambda d, w: respool_pb2.GetPoolRequest(path="/")),
    Row(P + "ListPools", "", EVERY_ROLE, lambda d, w: respool_pb2.ListPoolsRequest()),
    Row(P + "ListQueue", "", EVERY_ROLE, lambda d, w: respool_pb2.ListQueueRequest()),
    Row(H + "ListHosts", "", EVERY_ROLE, lambda d, w: host_pb2.ListHostsRequest()),
    Row(H + "DrainHost", "", HOSTS, lambda d, w: host_pb2.DrainHostRequest(hostname=HOST)),
    Row(H + "UndrainHost", "", HOSTS, lambda d, w: host_pb2.UndrainHostRequest(hostname=HOST)),
    Row(S + "FailHost", "", HOSTS, lambda d, w: sim_pb2.FailHostRequest(hostname=HOST)),
    Row(S + "RecoverHost", "", HOSTS, lambda d, w: sim_pb2.RecoverHostRequest(hostname=HOST)),
    Row(A + "ListAuditEvents", "", AUDIT, lambda d, w: audit_pb2.ListAuditEventsRequest()),
    Row(C + "GetClusterInfo", "", EVERY_ROLE, lambda d, w: cluster_pb2.GetClusterInfoRequest()),
    Row(C + "GetClusterSummary", "", EVERY_ROLE, lambda d, w: cluster_pb2.GetClusterSummaryRequest()),
    Row(C + "CreateConsoleLogin", "", SOCKET, lambda d, w: cluster_pb2.CreateConsoleLoginRequest()),
    Row(C + "RedeemConsoleLogin", "", CONSOLE,
        lambda d, w: cluster_pb2.RedeemConsoleLoginRequest(login_id="x", secret="y")),
    Row(M + "CreateModel", "", SUBMITTERS, lambda d, w: model_pb2.CreateModelRequest(
        name=d.unique("model"), document_json=MODEL_DOC)),
    Row(M + "CreateModel", "replacing alice's", OWNER_OR_ADMIN, lambda d, w: model_pb2.CreateModelRequest(
        name=d.alices_model(), document_json=MODEL_DOC, replace=True)),
    Row(M + "GetModel", "alice's", EVERY_ROLE, lambda d, w: model_pb2.GetModelRequest(name=d.alices_model())),
    Row(M + "ListModels", "", EVERY_ROLE, lambda d, w: model_pb2.ListModelsRequest()),
    Row(M + "DeleteModel", "alice's", OWNER_OR_ADMIN, lambda d, w: model_pb2.DeleteModelRequest(
        name=d.alices_model())),
)


def test_every_public_rpc_has_a_row() -> None:
    assert public_methods(), "no services found in the generated descriptors"
    assert sorted(set(public_methods()) - {r.path for r in ROWS}) == []
    assert sorted({r.path for r in ROWS} - set(public_methods())) == []


def answer(d: Daemon1, row: Row, who: str) -> tuple[str, str]:
    """(the status code's name, its message)."""
    try:
        d.call(row.path, row.request(d, who), who)
        return OK, ""
    except grpc.RpcError as e:
        return e.code().name, e.details()


@pytest.mark.parametrize("row", ROWS, ids=[f"{r.path.rsplit('.', 1)[1]}{'[' + r.variant + ']' if r.variant else ''}"
                                           for r in ROWS])
def test_each_caller_gets_the_documented_answer_and_each_refusal_is_audited(d: Daemon1, row: Row) -> None:
    since = time.time()
    got = {who: answer(d, row, who) for who in CALLERS}
    want = {who: OK if who in row.allowed else UNAUTH if who == "nobody" else DENIED for who in CALLERS}
    assert {who: code for who, (code, _) in got.items()} == want, got
    # every refusal is in the audit log as the caller got it (written in the background: wait for it)
    method = row.path.removeprefix("/peloton.v1.")

    def audited(who: str, code: str, message: str) -> bool:
        name = "-" if who == "nobody" else d.socket_principal if who == "socket" else who
        return any(e.method == method and e.code == code and e.message == message and not e.allowed
                   for e in d.call(A + "ListAuditEvents", audit_pb2.ListAuditEventsRequest(
                       principal=name, since=since - 1, denied_only=True, limit=1000), "admin").events)

    for who, (code, message) in got.items():
        if code != OK:
            d.wait(f"{who}'s refused {method} is not audited", functools.partial(audited, who, code, message))


def test_a_create_repeating_anothers_request_id_never_answers_with_their_job(d: Daemon1) -> None:
    key = d.unique("request")
    create = J + "CreateJob"
    first = d.call(create, job_pb2.CreateJobRequest(spec=spec(), request_id=key), "alice").job_id
    assert d.call(create, job_pb2.CreateJobRequest(spec=spec(), request_id=key), "alice").job_id == first  # a retry
    for who in ("bob", "operator", "admin", "socket"):
        code, message = answer(d, Row(create, "", frozenset(), lambda d, w: job_pb2.CreateJobRequest(
            spec=spec(), request_id=key)), who)
        assert code == "ALREADY_EXISTS", (who, code, message)


def test_headers_that_name_another_caller_count_for_nothing_over_tcp(d: Daemon1) -> None:
    """The console's secret and for whom it calls (auth.py: only over its Unix socket) and the components' secret
    (the internal services): over TCP no header makes a caller someone else, and the internal services are not
    served there to anyone, an admin included."""
    secret = (d.daemon.cfg.data_dir / "internal.secret")
    forged = (("x-peloton-console", "x" * 64), ("x-peloton-as", "local"),
              ("x-peloton-component", secret.read_text().strip() if secret.exists() else "0" * 64))
    pool = respool_pb2.CreatePoolRequest(pool=respool_pb2.ResourcePool(path="/" + d.unique("forged")))
    channel = d.channel
    create_pool = channel.unary_unary(P + "CreatePool",
                                      request_serializer=respool_pb2.CreatePoolRequest.SerializeToString,
                                      response_deserializer=respool_pb2.CreatePoolResponse.FromString)
    for md, code in ((forged, grpc.StatusCode.UNAUTHENTICATED),
                     ((*d.md("viewer"), *forged), grpc.StatusCode.PERMISSION_DENIED)):
        with pytest.raises(grpc.RpcError) as e:
            create_pool(pool, timeout=T, metadata=md)
        assert e.value.code() == code, e.value.details()
    for service in internal_pb2.DESCRIPTOR.services_by_name.values():
        m = service.methods[0]
        with pytest.raises(grpc.RpcError) as e:
            channel.unary_unary(f"/{service.full_name}/{m.name}", request_serializer=lambda r: r.SerializeToString(),
                                response_deserializer=message_factory.GetMessageClass(m.output_type).FromString)(
                message_factory.GetMessageClass(m.input_type)(), timeout=T, metadata=(*d.md("admin"), *forged))
        assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED, (service.full_name, e.value.details())


# The web console's /api, as each caller: it calls the API with the caller's token (its cookie), so each answer is
# the API's, as HTTP (docs/ui.md). (method, path of alice's objects, who is answered 200; others with a session 403)
CONSOLE_ROWS: tuple[tuple[str, str, frozenset[str]], ...] = (
    ("GET", "/api/session", EVERY_ROLE),
    ("GET", "/api/cluster", EVERY_ROLE),
    ("GET", "/api/jobs", EVERY_ROLE),
    ("GET", "/api/jobs/{job}", EVERY_ROLE),
    ("GET", "/api/jobs/{job}/members/0", EVERY_ROLE),
    ("GET", "/api/jobs/{job}/events", EVERY_ROLE),
    ("GET", "/api/jobs/{job}/gangs/0/timeline", EVERY_ROLE),
    ("GET", "/api/jobs/{running}/members/0/logs", OWNER_OR_ANY),
    ("GET", "/api/audit", AUDIT),
    ("GET", "/api/queue", EVERY_ROLE),
    ("GET", "/api/pools", EVERY_ROLE),
    ("GET", "/api/hosts", EVERY_ROLE),
    ("POST", "/api/jobs/{job}/stop", OWNER_OR_ANY),
    ("POST", "/api/jobs/{stopped}/delete", OWNER_OR_ANY),
    ("POST", "/api/hosts/" + HOST + "/drain", HOSTS),
    ("POST", "/api/hosts/" + HOST + "/undrain", HOSTS),
)


def console(d: Daemon1, method: str, path: str, who: str) -> int:
    """The console's HTTP status for `who` (a token's session: the token is the cookie; "nobody": no cookie)."""
    assert d.daemon.console is not None
    base = urlsplit(d.daemon.console.url)
    conn = http.client.HTTPConnection(base.hostname or "", base.port, timeout=T)
    try:
        cookie = {"Cookie": f"peloton_console={d.tokens[who]}"} if who in d.tokens else {}
        headers = dict(cookie)
        if method == "POST" and cookie:  # as the console's own page sends it
            conn.request("GET", "/api/session", headers=cookie)
            headers["X-CSRF-Token"] = json.loads(conn.getresponse().read())["csrf"]
        conn.request(method, path, headers={**headers, "Content-Length": "0"} if method == "POST" else headers)
        r = conn.getresponse()
        r.read()
        return r.status
    finally:
        conn.close()


@pytest.mark.parametrize(("method", "path", "allowed"), CONSOLE_ROWS, ids=[f"{m} {p}" for m, p, _ in CONSOLE_ROWS])
def test_the_consoles_api_gives_each_caller_what_the_api_does(d: Daemon1, method: str, path: str,
                                                               allowed: frozenset[str]) -> None:
    got, want = {}, {}
    for who in ("nobody", "viewer", "alice", "bob", "operator", "admin"):
        url = path.format(job=d.alices_job() if "{job}" in path else "", running=d.running,
                          stopped=d.alices_job(stopped=True) if "{stopped}" in path else "")
        got[who] = console(d, method, url, who)
        want[who] = 200 if who in allowed else 401 if who == "nobody" else 403
    assert got == want
