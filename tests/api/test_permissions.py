"""Who may do what, through the real daemon (gRPC over a socket, sim backend) on SQLite and PostgreSQL: every role
against every mutating RPC (a table), owner-only stop/delete/logs, the owner set from the caller, environment
values hidden from others, calls without credentials, and an open watch once its token is revoked."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from peloton.api.v1 import (
    job_pb2,
    job_pb2_grpc,
    respool_pb2,
    respool_pb2_grpc,
    sim_pb2,
    sim_pb2_grpc,
    task_pb2,
    task_pb2_grpc,
)
from peloton.domain.resources import Resources
from peloton.hostmgr.sim.backend import SimSettings
from peloton.security.identity import add_token
from peloton.server import Daemon
from peloton.settings import ServerConfig
from tests.dbutil import postgres_database

ROLES = ("admin", "operator", "submitter", "viewer")
OK, DENIED = "ok", "denied"
T = 15.0


@dataclass
class Cluster:
    daemon: Daemon
    channel: grpc.Channel
    tokens: dict[str, str]  # principal -> token; principals are named after their role, plus "bob" (submitter)

    def md(self, who: str | None) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.tokens[who]}"),) if who else ()

    def jobs(self) -> job_pb2_grpc.JobServiceStub:
        return job_pb2_grpc.JobServiceStub(self.channel)

    def create(self, who: str, owner: str = "", env: dict[str, str] | None = None) -> str:
        spec = job_pb2.JobSpec(name="p", instances=1, owner=owner)
        spec.task.command = "train.py"
        spec.task.resources.cpu = 1
        spec.task.resources.mem = "64Mi"
        spec.task.env.update(env or {"PELOTON_SIM_DURATION": "1h"})
        return str(self.jobs().CreateJob(job_pb2.CreateJobRequest(spec=spec), timeout=T, metadata=self.md(who)).job_id)


@pytest.fixture(params=["sqlite", "postgresql"], scope="module")
def cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("perm")
    principals = tmp / "principals.json"
    tokens = {role: add_token(principals, role, [role]) for role in ROLES}
    tokens["bob"] = add_token(principals, "bob", ["submitter"])
    doc = json.loads(principals.read_text())
    doc["principals"]["bob"]["users"] = ["ml-team"]  # Unix users bob's jobs may run as, besides "bob"
    principals.write_text(json.dumps(doc))

    yield from running(request.param, tmp, principals, tokens,
                       sim=SimSettings(hosts=4, resources=Resources(cpu=64, mem=65536), racks=1))


def running(store: str, tmp: Path, principals: Path, tokens: dict[str, str], **settings: Any) -> Iterator[Cluster]:
    """A daemon on `store` (a fresh PostgreSQL database, or SQLite in `tmp`) reading `principals`, over TCP."""

    def start(db_url: str) -> Iterator[Cluster]:
        d = Daemon(ServerConfig(listen="127.0.0.1:0", db_url=db_url, data_dir=tmp / "data", metrics_listen="",
                                backend="sim", unix_socket="", principals_file=principals, **settings))
        channel = grpc.insecure_channel(d.start())
        try:
            yield Cluster(d, channel, tokens)
        finally:
            channel.close()
            d.stop()

    if store == "sqlite":
        yield from start(f"sqlite:///{tmp}/p.db")
    else:
        with postgres_database() as url:
            yield from start(url)


def outcome(fn: Any, request: Any, md: Any) -> str:
    try:
        fn(request, timeout=T, metadata=md)
        return OK
    except grpc.RpcError as e:
        if e.code() == grpc.StatusCode.PERMISSION_DENIED:
            return DENIED
        raise


# role -> expected outcome of: create job, stop own, stop another's, delete another's, read logs of another's,
# create pool, delete pool, fail a sim host
TABLE = {
    "admin": (OK, OK, OK, OK, OK, OK, OK, OK, OK),
    "operator": (OK, OK, OK, OK, OK, DENIED, DENIED, DENIED, OK),
    "submitter": (OK, OK, DENIED, DENIED, DENIED, DENIED, DENIED, DENIED, DENIED),
    "viewer": (DENIED, DENIED, DENIED, DENIED, DENIED, DENIED, DENIED, DENIED, DENIED),
}


@pytest.mark.parametrize("role", ROLES)
def test_every_role_against_every_mutating_call(cluster: Cluster, role: str) -> None:
    jobs = cluster.jobs()
    md = cluster.md(role)
    own = cluster.create(role if role != "viewer" else "submitter")  # a viewer owns nothing: try someone's
    others = [cluster.create("bob") for _ in range(2)]
    jobs.StopJob(job_pb2.StopJobRequest(job_id=others[1]), timeout=T, metadata=cluster.md("bob"))  # deletable
    spec = job_pb2.JobSpec(name="new", instances=1)
    spec.task.command, spec.task.resources.cpu, spec.task.resources.mem = "train.py", 1, "64Mi"
    pools = respool_pb2_grpc.ResourcePoolServiceStub(cluster.channel)
    pools.CreatePool(respool_pb2.CreatePoolRequest(pool=respool_pb2.ResourcePool(path=f"/gone-{role}")), timeout=T,
                     metadata=cluster.md("admin"))
    got = (
        outcome(jobs.CreateJob, job_pb2.CreateJobRequest(spec=spec), md),
        outcome(jobs.StopJob, job_pb2.StopJobRequest(job_id=own), md),
        outcome(jobs.StopJob, job_pb2.StopJobRequest(job_id=others[0]), md),
        outcome(jobs.DeleteJob, job_pb2.DeleteJobRequest(job_id=others[1]), md),
        outcome(task_pb2_grpc.TaskServiceStub(cluster.channel).GetTaskLogs,
                task_pb2.GetTaskLogsRequest(job_id=others[0], instance=0), md),
        outcome(pools.CreatePool, respool_pb2.CreatePoolRequest(pool=respool_pb2.ResourcePool(path=f"/t-{role}")), md),
        outcome(pools.UpdatePool, respool_pb2.UpdatePoolRequest(pool=respool_pb2.ResourcePool(
            path=f"/gone-{role}", share=2)), md),
        outcome(pools.DeletePool, respool_pb2.DeletePoolRequest(path=f"/gone-{role}"), md),
        outcome(sim_pb2_grpc.SimServiceStub(cluster.channel).RecoverHost,
                sim_pb2.RecoverHostRequest(hostname="sim-00000"), md),
    )
    assert got == TABLE[role]


def test_reads_are_open_to_every_role_but_not_to_strangers(cluster: Cluster) -> None:
    jobs = cluster.jobs()
    job = cluster.create("bob")
    for role in ROLES:
        assert jobs.GetJob(job_pb2.GetJobRequest(job_id=job), timeout=T, metadata=cluster.md(role)).job.id == job
        assert jobs.ListJobs(job_pb2.ListJobsRequest(), timeout=T, metadata=cluster.md(role)).jobs
    for md, why in (((), "no credentials"), ((("authorization", "Bearer pt_nope"),), "not known"),
                    ((("authorization", "Basic dXNlcjpwYXNz"),), "Bearer")):
        with pytest.raises(grpc.RpcError) as e:
            jobs.ListJobs(job_pb2.ListJobsRequest(), timeout=T, metadata=md)
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED and why in e.value.details()
    health = health_pb2_grpc.HealthStub(cluster.channel).Check(health_pb2.HealthCheckRequest(), timeout=T)
    assert health.status == health_pb2.HealthCheckResponse.SERVING  # load balancers need no token


def test_the_owner_is_the_caller(cluster: Cluster) -> None:
    jobs = cluster.jobs()
    mine = cluster.create("bob")
    assert jobs.GetJob(job_pb2.GetJobRequest(job_id=mine), timeout=T, metadata=cluster.md("bob")).job.spec.owner == "bob"
    with pytest.raises(grpc.RpcError) as e:
        cluster.create("bob", owner="submitter")
    assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED and e.value.details().startswith("owner:")
    theirs = cluster.create("admin", owner="bob")  # an admin may create on someone's behalf
    assert jobs.GetJob(job_pb2.GetJobRequest(job_id=theirs), timeout=T,
                       metadata=cluster.md("admin")).job.spec.owner == "bob"


def test_environment_values_are_shown_to_the_owner_operators_and_admins_only(cluster: Cluster) -> None:
    jobs = cluster.jobs()
    job = cluster.create("bob", env={"PELOTON_SIM_DURATION": "1h", "API_KEY": "hunter2"})
    seen = {who: dict(jobs.GetJob(job_pb2.GetJobRequest(job_id=job), timeout=T, metadata=cluster.md(who))
                      .job.spec.task.env) for who in ("bob", "admin", "operator", "submitter", "viewer")}
    for who in ("bob", "admin", "operator"):
        assert seen[who]["API_KEY"] == "hunter2", who
    for who in ("submitter", "viewer"):
        assert seen[who] == {"PELOTON_SIM_DURATION": "<redacted>", "API_KEY": "<redacted>"}, who
    listed = {j.id: j for j in jobs.ListJobs(job_pb2.ListJobsRequest(), timeout=T,
                                             metadata=cluster.md("viewer")).jobs}
    assert listed[job].spec.task.env["API_KEY"] == "<redacted>"
    assert "hunter2" not in json.dumps(str(listed[job]))
    # each role's environment of a job with roles, too
    spec = job_pb2.JobSpec(name="roles")
    for name, env in (("ps", {"PELOTON_SIM_DURATION": "1h"}), ("worker", {"API_KEY": "hunter2"})):
        r = spec.roles.add(name=name, instances=1)
        r.task.command, r.task.resources.cpu, r.task.resources.mem = "train.py", 0.5, "64Mi"
        r.task.env.update(env)
    roles = jobs.CreateJob(job_pb2.CreateJobRequest(spec=spec), timeout=T, metadata=cluster.md("bob")).job_id
    for who, value in (("bob", "hunter2"), ("viewer", "<redacted>")):
        got = jobs.GetJob(job_pb2.GetJobRequest(job_id=roles), timeout=T, metadata=cluster.md(who)).job.spec
        assert dict(got.roles[1].task.env) == {"API_KEY": value}, who


@pytest.fixture(params=["sqlite", "postgresql"])
def bounded(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Cluster]:
    principals = tmp_path / "principals.json"
    tokens = {who: add_token(principals, who, [role])
              for who, role in (("alice", "submitter"), ("bob", "submitter"), ("admin", "admin"))}

    yield from running(request.param, tmp_path, principals, tokens, rate_limit=1.0, max_waiting_jobs=3,
                       sim=SimSettings(hosts=1, resources=Resources(cpu=1, mem=1024), racks=1))


def test_waiting_jobs_and_the_rate_of_changes_are_bounded_per_principal(bounded: Cluster) -> None:
    jobs = bounded.jobs()
    blocker = bounded.create("admin")  # the cluster's one cpu, for an hour: every other job waits
    deadline = time.monotonic() + 30
    while jobs.GetJob(job_pb2.GetJobRequest(job_id=blocker), timeout=T,
                      metadata=bounded.md("admin")).job.status.state != "RUNNING":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    spec = job_pb2.JobSpec(name="wait", instances=1)
    spec.task.command, spec.task.resources.cpu, spec.task.resources.mem = "train.py", 1, "64Mi"

    def create(who: str) -> Any:
        return jobs.CreateJob(job_pb2.CreateJobRequest(spec=spec), timeout=T, metadata=bounded.md(who))

    for _ in range(3):
        create("alice")
    with pytest.raises(grpc.RpcError) as e:
        create("alice")
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert e.value.details().startswith("jobs: alice has 3 jobs waiting to start")
    create("bob")  # another principal's own allowance
    # the rate: a bucket of 10 (at 1 a second); alice has used 4 of it, bob 1
    waiting = [j.id for j in jobs.ListJobs(job_pb2.ListJobsRequest(owner="alice"), timeout=T,
                                          metadata=bounded.md("alice")).jobs]
    codes = []
    for i in range(14):
        try:
            jobs.StopJob(job_pb2.StopJobRequest(job_id=waiting[i % len(waiting)]), timeout=T,
                         metadata=bounded.md("alice"))
            codes.append("ok")
        except grpc.RpcError as err:
            codes.append(err.code().name)
            assert "rate limit: alice made more than 1 changing calls a second" in err.details()
            assert any(k == "retry-after-ms" for k, _ in err.trailing_metadata())
    oks = codes.index("RESOURCE_EXHAUSTED")
    assert 6 <= oks <= 9  # what was left of the 10 (a token comes back each second meanwhile)
    assert codes[oks:].count("ok") <= 2  # then refused, but for a refill
    # reads are not counted
    for _ in range(20):
        jobs.ListJobs(job_pb2.ListJobsRequest(), timeout=T, metadata=bounded.md("alice"))
    # both refusals are audited as such, with their messages
    from peloton.api.v1 import audit_pb2, audit_pb2_grpc

    denied = audit_pb2_grpc.AuditServiceStub(bounded.channel).ListAuditEvents(audit_pb2.ListAuditEventsRequest(
        principal="alice", denied_only=True, limit=1000), timeout=T, metadata=bounded.md("admin")).events
    kinds = [(e.method, e.code, e.message.split(" made ")[0].split(" has ")[0]) for e in denied]
    assert kinds.count(("JobService/CreateJob", "RESOURCE_EXHAUSTED", "jobs: alice")) == 1
    assert kinds.count(("JobService/StopJob", "RESOURCE_EXHAUSTED", "rate limit: alice")) == codes.count(
        "RESOURCE_EXHAUSTED")


def test_the_audit_log_records_changes_and_refusals(cluster: Cluster) -> None:
    from peloton.api.v1 import audit_pb2, audit_pb2_grpc

    jobs = cluster.jobs()
    job = cluster.create("bob")
    with pytest.raises(grpc.RpcError):
        jobs.StopJob(job_pb2.StopJobRequest(job_id=job), timeout=T, metadata=cluster.md("viewer"))
    with pytest.raises(grpc.RpcError):
        jobs.StopJob(job_pb2.StopJobRequest(job_id=job), timeout=T)  # no credentials
    jobs.StopJob(job_pb2.StopJobRequest(job_id=job), timeout=T, metadata=cluster.md("bob"))
    audit = audit_pb2_grpc.AuditServiceStub(cluster.channel)
    about = audit.ListAuditEvents(audit_pb2.ListAuditEventsRequest(object=job), timeout=T,
                                  metadata=cluster.md("operator")).events
    seen = [(e.principal, e.method, e.allowed, e.code) for e in reversed(about)]
    assert seen == [("bob", "JobService/CreateJob", True, "OK"),
                    ("viewer", "JobService/StopJob", False, "PERMISSION_DENIED"),
                    ("bob", "JobService/StopJob", True, "OK")]
    assert about[-1].via == "token" and about[-1].at > 0 and "job.control.own" in about[1].message
    # a caller without credentials: its request is not read (edge.py), so its record names no object
    strangers = audit.ListAuditEvents(audit_pb2.ListAuditEventsRequest(principal="-", denied_only=True), timeout=T,
                                      metadata=cluster.md("operator")).events
    assert any(e.method == "JobService/StopJob" and e.code == "UNAUTHENTICATED" and e.object == "" and
               e.message.startswith("no credentials") for e in strangers)
    assert all(e.via.startswith("ipv") for e in strangers)  # its peer address
    # a host drained and undrained (the console's actions too) is recorded, and so is a viewer's refused drain
    from peloton.api.v1 import host_pb2, host_pb2_grpc
    hosts = host_pb2_grpc.HostServiceStub(cluster.channel)
    with pytest.raises(grpc.RpcError):
        hosts.DrainHost(host_pb2.DrainHostRequest(hostname="sim-00001"), timeout=T, metadata=cluster.md("viewer"))
    hosts.DrainHost(host_pb2.DrainHostRequest(hostname="sim-00001"), timeout=T, metadata=cluster.md("operator"))
    hosts.UndrainHost(host_pb2.UndrainHostRequest(hostname="sim-00001"), timeout=T, metadata=cluster.md("operator"))
    drains = audit.ListAuditEvents(audit_pb2.ListAuditEventsRequest(object="sim-00001"), timeout=T,
                                   metadata=cluster.md("operator")).events
    assert [(e.principal, e.method, e.allowed) for e in reversed(drains)] == [
        ("viewer", "HostService/DrainHost", False), ("operator", "HostService/DrainHost", True),
        ("operator", "HostService/UndrainHost", True)]
    denied = audit.ListAuditEvents(audit_pb2.ListAuditEventsRequest(principal="viewer", denied_only=True), timeout=T,
                                   metadata=cluster.md("admin")).events
    assert denied and all(not e.allowed and e.principal == "viewer" for e in denied)
    with pytest.raises(grpc.RpcError) as err:
        audit.ListAuditEvents(audit_pb2.ListAuditEventsRequest(), timeout=T, metadata=cluster.md("submitter"))
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(grpc.RpcError) as err:
        audit.ListAuditEvents(audit_pb2.ListAuditEventsRequest(limit=5000), timeout=T, metadata=cluster.md("admin"))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and err.value.details().startswith("limit:")


def test_a_pools_access_list_decides_who_submits_to_its_subtree(cluster: Cluster) -> None:
    pools = respool_pb2_grpc.ResourcePoolServiceStub(cluster.channel)
    admin = cluster.md("admin")
    pools.CreatePool(respool_pb2.CreatePoolRequest(pool=respool_pb2.ResourcePool(
        path="/research", submitters=["bob"])), timeout=T, metadata=admin)
    pools.CreatePool(respool_pb2.CreatePoolRequest(pool=respool_pb2.ResourcePool(path="/research/vision")),
                     timeout=T, metadata=admin)  # no list of its own: the parent's applies
    pools.CreatePool(respool_pb2.CreatePoolRequest(pool=respool_pb2.ResourcePool(
        path="/research/open", submitters=["submitter", "bob"])), timeout=T, metadata=admin)
    got = pools.GetPool(respool_pb2.GetPoolRequest(path="/research"), timeout=T, metadata=cluster.md("viewer")).pool
    assert list(got.submitters) == ["bob"]

    def create(who: str, pool: str) -> str:
        spec = job_pb2.JobSpec(name="acl", instances=1, respool=pool)
        spec.task.command, spec.task.resources.cpu, spec.task.resources.mem = "train.py", 1, "64Mi"
        try:
            cluster.jobs().CreateJob(job_pb2.CreateJobRequest(spec=spec), timeout=T, metadata=cluster.md(who))
            return OK
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.PERMISSION_DENIED, e.details()
            assert e.details().startswith("respool: ")
            return DENIED

    assert [create(w, "/research/vision") for w in ("bob", "submitter", "operator", "admin")] == [OK, DENIED, OK, OK]
    assert [create(w, "/research/open") for w in ("bob", "submitter")] == [OK, OK]
    assert create("submitter", "/") == OK  # the root has no list: anyone with job.create
    with pytest.raises(grpc.RpcError) as e:
        pools.CreatePool(respool_pb2.CreatePoolRequest(pool=respool_pb2.ResourcePool(
            path="/bad", submitters=["a b"])), timeout=T, metadata=admin)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and e.value.details().startswith("pool.submitters[0]")


def test_task_user_is_the_principals_own_and_root_needs_a_pool_that_allows_it(cluster: Cluster) -> None:
    pools = respool_pb2_grpc.ResourcePoolServiceStub(cluster.channel)
    admin = cluster.md("admin")
    pools.CreatePool(respool_pb2.CreatePoolRequest(pool=respool_pb2.ResourcePool(path="/ops", allow_root=True)),
                     timeout=T, metadata=admin)
    pools.CreatePool(respool_pb2.CreatePoolRequest(pool=respool_pb2.ResourcePool(path="/ops/infra")),
                     timeout=T, metadata=admin)  # allowed by its parent
    assert pools.GetPool(respool_pb2.GetPoolRequest(path="/ops"), timeout=T, metadata=admin).pool.allow_root

    def create(who: str, user: str, pool: str = "/") -> str:
        spec = job_pb2.JobSpec(name="user", instances=1, respool=pool)
        spec.task.command, spec.task.resources.cpu, spec.task.resources.mem = "train.py", 1, "64Mi"
        spec.task.user = user
        try:
            job_id = cluster.jobs().CreateJob(job_pb2.CreateJobRequest(spec=spec), timeout=T,
                                              metadata=cluster.md(who)).job_id
        except grpc.RpcError as e:
            assert e.details().startswith("task.user: "), e.details()
            return f"{e.code().name}: {e.details()}"
        got = cluster.jobs().GetJob(job_pb2.GetJobRequest(job_id=job_id), timeout=T, metadata=cluster.md(who))
        assert got.job.spec.task.user == user
        return OK

    assert create("bob", "ml-team") == OK and create("bob", "") == OK
    # a name alone is no permission: not even the account named like the principal (issue 19: a principal called
    # postgres ran as the store's superuser)
    assert create("bob", "bob") == ("PERMISSION_DENIED: task.user: bob may not run tasks as 'bob': only as ml-team "
                                    "(the principals file's user and users for bob); a name alone is no permission, "
                                    "and an admin may name any user")
    assert create("bob", "alice").startswith("PERMISSION_DENIED: task.user: bob may not run tasks as 'alice': only "
                                             "as ml-team")
    assert create("operator", "alice").startswith("PERMISSION_DENIED: task.user: operator may not run tasks as")
    assert create("admin", "alice") == OK
    assert create("admin", "root").startswith("PERMISSION_DENIED: task.user: pool / does not allow tasks to run "
                                              "as root")
    assert create("admin", "root", "/ops/infra") == OK  # allowed by its parent
    pools.CreatePool(respool_pb2.CreatePoolRequest(pool=respool_pb2.ResourcePool(path="/sre", allow_root=True)),
                     timeout=T, metadata=admin)
    assert create("admin", "root", "/sre") == OK
    assert create("admin", "bad user").startswith("INVALID_ARGUMENT: task.user: 'bad user' is not a user name")


def test_every_refusal_is_audited_as_denied_with_its_message(cluster: Cluster) -> None:
    """Wherever a call is refused (authentication, the method's permission, a job's owner, a pool's access list,
    task.user, root in a pool, the owner of a new job): one record, allowed=false, with the code and the message
    the caller got; reads too (a refused log read)."""
    from peloton.api.v1 import audit_pb2, audit_pb2_grpc

    pools = respool_pb2_grpc.ResourcePoolServiceStub(cluster.channel)
    pools.CreatePool(respool_pb2.CreatePoolRequest(pool=respool_pb2.ResourcePool(
        path="/audited", submitters=["admin"])), timeout=T, metadata=cluster.md("admin"))
    theirs = cluster.create("submitter")
    jobs, tasks = cluster.jobs(), task_pb2_grpc.TaskServiceStub(cluster.channel)

    def spec(**kw: str) -> job_pb2.JobSpec:
        s = job_pb2.JobSpec(name="refused", instances=1, respool=kw.pop("respool", ""), owner=kw.pop("owner", ""))
        s.task.command, s.task.resources.cpu, s.task.resources.mem = "train.py", 1, "64Mi"
        s.task.user = kw.pop("user", "")
        return s

    attempts = [  # (principal, call, request, the object its record names)
        ("bob", jobs.StopJob, job_pb2.StopJobRequest(job_id=theirs), theirs),  # another's job
        ("bob", jobs.DeleteJob, job_pb2.DeleteJobRequest(job_id=theirs), theirs),
        ("bob", tasks.GetTaskLogs, task_pb2.GetTaskLogsRequest(job_id=theirs), theirs),  # a read
        ("bob", jobs.CreateJob, job_pb2.CreateJobRequest(spec=spec(respool="/audited")), "/audited"),  # access list
        ("bob", jobs.CreateJob, job_pb2.CreateJobRequest(spec=spec(user="alice")), ""),  # task.user
        ("bob", jobs.CreateJob, job_pb2.CreateJobRequest(spec=spec(owner="viewer")), ""),  # the owner
        ("admin", jobs.CreateJob, job_pb2.CreateJobRequest(spec=spec(user="root")), ""),  # root in a pool
        ("viewer", jobs.CreateJob, job_pb2.CreateJobRequest(spec=spec()), ""),  # the method's permission
    ]
    got = []
    for who, call, request, obj in attempts:
        with pytest.raises(grpc.RpcError) as e:
            call(request, timeout=T, metadata=cluster.md(who))
        assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED, e.value.details()
        got.append((who, e.value.details(), obj))
    audit = audit_pb2_grpc.AuditServiceStub(cluster.channel)
    denied = audit.ListAuditEvents(audit_pb2.ListAuditEventsRequest(denied_only=True, limit=1000), timeout=T,
                                   metadata=cluster.md("admin")).events
    recorded = {(e.principal, e.message, e.object) for e in denied
                if not e.allowed and e.code == "PERMISSION_DENIED" and e.via == "token"}
    missing = [g for g in got if g not in recorded]
    assert not missing, missing
    # and none of them as allowed
    allowed = audit.ListAuditEvents(audit_pb2.ListAuditEventsRequest(principal="bob", limit=1000), timeout=T,
                                    metadata=cluster.md("admin")).events
    assert not [e for e in allowed if e.allowed and e.code == "PERMISSION_DENIED"]


@pytest.fixture
def revocable(tmp_path: Path) -> Iterator[Cluster]:
    """Each principal a viewer of its own token, in a principals file the test rewrites (one store: nothing of it
    is stored)."""
    principals = tmp_path / "principals.json"
    tokens = {who: add_token(principals, who, [role])
              for who, role in (("revoked", "viewer"), ("demoted", "viewer"), ("kept", "viewer"), ("admin", "admin"))}
    yield from running("sqlite", tmp_path, principals, tokens,
                       sim=SimSettings(hosts=1, resources=Resources(cpu=4, mem=4096), racks=1))


def test_an_open_watch_ends_once_its_token_is_revoked_or_its_principal_loses_the_permission(
        revocable: Cluster, tmp_path: Path) -> None:
    """A WatchJobs stream was authenticated once, at its start: after its token was removed from the principals
    file (the way a token is revoked) it went on delivering every job's changes for as long as it stayed open.
    Now it ends UNAUTHENTICATED, and one whose principal lost its roles PERMISSION_DENIED (docs/security.md: the
    re-check at most every second, at a message, and a heartbeat every 5 s; waited for here up to 15 s, not
    timed), audited as refused; a stream whose token stays goes on."""
    jobs = revocable.jobs()
    streams = {who: jobs.WatchJobs(job_pb2.WatchJobsRequest(), timeout=60, metadata=revocable.md(who))
               for who in ("revoked", "demoted", "kept")}
    for s in streams.values():
        next(s)  # open: its first message
    ended: dict[str, tuple[grpc.StatusCode, str, float]] = {}
    received: dict[str, list[float]] = {who: [] for who in streams}

    def read(who: str) -> None:
        try:
            for _ in streams[who]:
                received[who].append(time.monotonic())
        except grpc.RpcError as e:
            ended[who] = (e.code(), e.details(), time.monotonic())

    readers = [threading.Thread(target=read, args=(who,), daemon=True) for who in streams]
    for t in readers:
        t.start()
    time.sleep(1.5)  # (past the streams' first re-check: what follows is a change of the file, not of their start)
    principals = tmp_path / "principals.json"
    doc = json.loads(principals.read_text())
    doc["principals"]["revoked"]["tokens"] = []
    doc["principals"]["demoted"]["roles"] = []
    tmp = principals.with_name("principals.json.new")
    tmp.write_text(json.dumps(doc))
    tmp.chmod(0o600)
    tmp.replace(principals)
    job = revocable.create("admin")  # a change: every stream has a message to send at once
    for t in readers[:2]:
        t.join(timeout=15)
    assert ended["revoked"][0] == grpc.StatusCode.UNAUTHENTICATED, ended["revoked"]
    assert "the token is not known to this daemon" in ended["revoked"][1]
    assert ended["demoted"][0] == grpc.StatusCode.PERMISSION_DENIED, ended["demoted"]
    assert "demoted may not call WatchJobs" in ended["demoted"][1]
    # the stream whose token stays: it goes on past the others' end (a heartbeat, 5 s apart)
    wait_until = time.monotonic() + 12
    while time.monotonic() < wait_until and not [t for t in received["kept"] if t > ended["revoked"][2] + 1]:
        time.sleep(0.1)
    assert "kept" not in ended and [t for t in received["kept"] if t > ended["revoked"][2] + 1]
    streams["kept"].cancel()
    # each end is audited as a refused WatchJobs, with its message
    from peloton.api.v1 import audit_pb2, audit_pb2_grpc

    audit = audit_pb2_grpc.AuditServiceStub(revocable.channel)
    deadline = time.monotonic() + 10
    while True:
        denied = {(e.principal, e.method, e.code) for e in audit.ListAuditEvents(audit_pb2.ListAuditEventsRequest(
            denied_only=True, limit=100), timeout=T, metadata=revocable.md("admin")).events}
        want = {("revoked", "JobService/WatchJobs", "UNAUTHENTICATED"),
                ("demoted", "JobService/WatchJobs", "PERMISSION_DENIED")}
        if want <= denied or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert want <= denied, denied
    jobs.StopJob(job_pb2.StopJobRequest(job_id=job), timeout=T, metadata=revocable.md("admin"))
