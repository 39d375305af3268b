"""The public gRPC API of the real daemon, started in-process, over real gRPC with the generated stubs."""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from peloton.api.v1 import (
    host_pb2,
    host_pb2_grpc,
    internal_pb2,
    internal_pb2_grpc,
    job_pb2,
    job_pb2_grpc,
    respool_pb2,
    respool_pb2_grpc,
    task_pb2,
    task_pb2_grpc,
)
from peloton.domain.resources import Resources
from peloton.server import Daemon
from peloton.settings import ServerConfig
from tests.asroot import AS_ROOT_SETTINGS
from tests.dbutil import postgres_database

RPC_TIMEOUT = 15.0


@dataclass
class Api:
    address: str
    daemon: Daemon
    channel: grpc.Channel
    jobs: job_pb2_grpc.JobServiceStub
    pools: respool_pb2_grpc.ResourcePoolServiceStub
    hosts: host_pb2_grpc.HostServiceStub
    health: health_pb2_grpc.HealthStub
    tasks: task_pb2_grpc.TaskServiceStub


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def api(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    """One daemon per store for the whole module (each test runs on both)."""
    with contextlib.ExitStack() as stack:
        tmp = tmp_path_factory.mktemp("daemon")
        url = f"sqlite:///{tmp}/p.db" if request.param == "sqlite" else stack.enter_context(postgres_database())
        yield from _serve(tmp, url)


def _serve(tmp: Path, url: str) -> Iterator[Api]:
    cfg = ServerConfig(
        listen="127.0.0.1:0",
        db_url=url,
        data_dir=tmp / "data",
        local_hosts=2,
        local_host_resources=Resources(cpu=4, mem=4096, gpu=2),
        local_port_base=random.randrange(42000, 58001, 2000),
        metrics_listen="",
        **AS_ROOT_SETTINGS,
    )
    d = Daemon(cfg)
    address = d.start()
    channel = grpc.insecure_channel(address)
    try:
        yield Api(address, d, channel, job_pb2_grpc.JobServiceStub(channel),
                  respool_pb2_grpc.ResourcePoolServiceStub(channel), host_pb2_grpc.HostServiceStub(channel),
                  health_pb2_grpc.HealthStub(channel), task_pb2_grpc.TaskServiceStub(channel))
    finally:
        try:
            for j in job_pb2_grpc.JobServiceStub(channel).ListJobs(job_pb2.ListJobsRequest(),
                                                                    timeout=RPC_TIMEOUT).jobs:
                if j.status.state not in ("SUCCEEDED", "FAILED", "KILLED"):
                    job_pb2_grpc.JobServiceStub(channel).StopJob(job_pb2.StopJobRequest(job_id=j.id),
                                                                 timeout=RPC_TIMEOUT)
        finally:
            channel.close()
            d.stop()


def call_error(fn: Callable[..., Any], request: Any) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as ei:
        fn(request, timeout=RPC_TIMEOUT)
    return ei.value


def spec(name: str = "t", *, instances: int = 1, command: str = "true", cpu: float = 0.5, mem: str = "64Mi",
         gpu: int = 0, min_available: int = 0, respool: str = "") -> job_pb2.JobSpec:
    s = job_pb2.JobSpec(name=name, instances=instances, respool=respool)
    s.task.command = command
    s.task.resources.cpu = cpu
    s.task.resources.mem = mem
    s.task.resources.gpu = gpu
    s.gang.min_available = min_available
    return s


def wait_for(pred: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met within the deadline")
        time.sleep(0.1)


def wait_state(api: Api, job_id: str, states: set[str], timeout: float = 30.0) -> job_pb2.Job:
    deadline = time.monotonic() + timeout
    job = None
    while time.monotonic() < deadline:
        job = api.jobs.GetJob(job_pb2.GetJobRequest(job_id=job_id), timeout=RPC_TIMEOUT).job
        if job.status.state in states:
            return job
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} never reached {states}: {job}")


def job_count(api: Api) -> int:
    return len(api.jobs.ListJobs(job_pb2.ListJobsRequest(), timeout=RPC_TIMEOUT).jobs)


# --- health and reflection ----------------------------------------------------------------------------------
@pytest.mark.parametrize("service", ["peloton", ""])
def test_health_is_serving(api: Api, service: str) -> None:
    r = api.health.Check(health_pb2.HealthCheckRequest(service=service), timeout=RPC_TIMEOUT)
    assert r.status == health_pb2.HealthCheckResponse.SERVING



def test_health_right_after_start_is_serving_even_if_the_health_loop_runs_late(tmp_path: Path) -> None:
    d = Daemon(ServerConfig(listen="127.0.0.1:0", db_url=f"sqlite:///{tmp_path}/p.db", data_dir=tmp_path / "data",
                            local_hosts=1, local_host_resources=Resources(cpu=1, mem=512),
                            local_port_base=random.randrange(42000, 58001, 2000) + 1000, metrics_listen=""))
    address = d.start()
    try:
        d._update_health()  # what the health loop does when its first iteration runs after start() returned
        with grpc.insecure_channel(address) as ch:
            r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service="peloton"),
                                                     timeout=RPC_TIMEOUT)
        assert r.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        d.stop()


def test_a_stopping_daemon_refuses_new_calls_first_lets_the_loop_finish_its_pass_then_frees_the_store(
        tmp_path: Path) -> None:
    """SIGTERM's order: stop accepting, finish the current round, release leadership, exit within a bound."""
    def config() -> ServerConfig:
        return ServerConfig(listen="127.0.0.1:0", db_url=f"sqlite:///{tmp_path}/p.db", data_dir=tmp_path / "data",
                            local_hosts=1, local_host_resources=Resources(cpu=1, mem=512),
                            local_port_base=random.randrange(42000, 58001, 2000) + 1000, metrics_listen="",
                            **AS_ROOT_SETTINGS)

    d = Daemon(config())
    address = d.start()
    release, entered, finished = threading.Event(), threading.Event(), threading.Event()
    stopper = threading.Thread(target=d.stop)
    try:
        assert d.placement is not None
        real = d.placement.run_once

        def in_a_pass() -> bool:
            entered.set()
            release.wait(30)
            finished.set()  # the pass ran to its end: stop() did not cut it short
            return bool(real())

        d.placement.run_once = in_a_pass  # type: ignore[method-assign]
        assert entered.wait(10)
        stopper.start()
        with grpc.insecure_channel(address) as ch:
            deadline = time.monotonic() + 5
            while True:  # stop() refuses new public calls first thing
                try:
                    job_pb2_grpc.JobServiceStub(ch).ListJobs(job_pb2.ListJobsRequest(), timeout=RPC_TIMEOUT)
                except grpc.RpcError as e:
                    assert e.code() == grpc.StatusCode.UNAVAILABLE and "shutting down" in str(e.details())
                    break
                assert time.monotonic() < deadline, "the stopping daemon still accepted calls"
                time.sleep(0.01)
        assert not finished.is_set() and stopper.is_alive()  # still waiting for the placement pass
    finally:
        release.set()
        if stopper.ident is None:  # failed before the stop: stopped here, not left running
            d.stop()
        else:
            stopper.join(15)
    assert not stopper.is_alive() and finished.is_set()  # (its bounds: 3 s for the loops, 2 s for calls in flight)
    again = Daemon(config())  # the data dir's and the store's locks were released
    again.start()
    again.stop()


def test_reflection_lists_the_public_services(api: Api) -> None:
    stub = reflection_pb2_grpc.ServerReflectionStub(api.channel)
    responses = list(stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]),
                                               timeout=RPC_TIMEOUT))
    names = {s.name for r in responses for s in r.list_services_response.service}
    assert {"peloton.v1.JobService", "peloton.v1.TaskService", "peloton.v1.ResourcePoolService",
            "peloton.v1.HostService", "peloton.v1.ModelService", "grpc.health.v1.Health"} <= names
    assert not any("Internal" in n for n in names)


def test_the_internal_services_are_not_served_to_clients(api: Api) -> None:
    """One process: the components call each other in process; nothing internal listens anywhere."""
    calls: list[tuple[Callable[..., Any], Any]] = [
        (internal_pb2_grpc.HostManagerInternalStub(api.channel).KillTasks, internal_pb2.KillTasksRequest()),
        (internal_pb2_grpc.ResourceManagerInternalStub(api.channel).RemoveGangs, internal_pb2.RemoveGangsRequest()),
    ]
    for call, request in calls:
        with pytest.raises(grpc.RpcError) as e:
            call(request, timeout=RPC_TIMEOUT)
        assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert not list(api.daemon.cfg.data_dir.glob("internal.*"))


# --- invalid jobs -------------------------------------------------------------------------------------------
def _bad_specs() -> list[tuple[str, job_pb2.CreateJobRequest, str]]:
    return [
        ("instances0", job_pb2.CreateJobRequest(spec=spec(instances=0)), "instances"),
        ("min_available", job_pb2.CreateJobRequest(spec=spec(instances=2, min_available=3)), "gang.min_available"),
        ("negative_cpu", job_pb2.CreateJobRequest(spec=spec(cpu=-1)), "task.resources.cpu"),
        ("bad_mem", job_pb2.CreateJobRequest(spec=spec(mem="12Zi")), "task.resources.mem"),
        ("gpu100", job_pb2.CreateJobRequest(spec=spec(gpu=100)), "never fit"),
        ("missing_spec", job_pb2.CreateJobRequest(), "spec"),
        ("empty_command", job_pb2.CreateJobRequest(spec=spec(command=" ")), "task.command"),
        ("unknown_pool", job_pb2.CreateJobRequest(spec=spec(respool="/nope")), "respool"),
    ]


@pytest.mark.parametrize("name,request_,field", _bad_specs(), ids=[c[0] for c in _bad_specs()])
def test_create_job_with_an_invalid_spec_is_invalid_argument(api: Api, name: str,
                                                             request_: job_pb2.CreateJobRequest, field: str) -> None:
    before = job_count(api)
    err = call_error(api.jobs.CreateJob, request_)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err
    assert field in err.details(), err.details()
    assert "\n" not in err.details()
    assert job_count(api) == before


def test_nothing_was_written_by_invalid_creates(api: Api) -> None:
    for _, req, _ in _bad_specs():
        with pytest.raises(grpc.RpcError):
            api.jobs.CreateJob(req, timeout=RPC_TIMEOUT)
    # this module creates its first valid job further down: so far ListJobs is empty
    assert list(api.jobs.ListJobs(job_pb2.ListJobsRequest(), timeout=RPC_TIMEOUT).jobs) == []


def test_a_dry_run_is_refused_as_a_create_is_and_writes_nothing(api: Api) -> None:
    for _, req, field in _bad_specs():
        dry = job_pb2.CreateJobRequest()
        dry.CopyFrom(req)
        dry.dry_run = True
        err = call_error(api.jobs.CreateJob, dry)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and field in err.details(), err.details()
    before = job_count(api)
    r = api.jobs.CreateJob(job_pb2.CreateJobRequest(spec=spec("dry", instances=3, cpu=3, min_available=2),
                                                    request_id="dry-key", dry_run=True), timeout=RPC_TIMEOUT)
    assert r.job_id == "" and job_count(api) == before
    # the gangs are placed in turn, each on what the ones before it left: the first takes cpu 3 of both hosts' 4
    first, second = r.dry_run
    assert (first.index, list(first.instances), first.waits, len(set(first.hosts))) == (0, [0, 1], "", 2)
    assert (second.index, list(second.instances), list(second.hosts)) == (1, [2], [])
    assert "needs cpu=3" in second.waits and "short of cpu" in second.waits, second.waits
    # the root pool limits nothing and nothing waits in it: both would be admitted now, hosts or not
    assert (first.admission_waits, first.queued_ahead, second.admission_waits, second.queued_ahead) == ("", 0, "", 0)
    # the key was not kept: a create with it and another spec is a new job, not ALREADY_EXISTS
    job_id = api.jobs.CreateJob(job_pb2.CreateJobRequest(spec=spec("real"), request_id="dry-key"),
                                timeout=RPC_TIMEOUT).job_id
    assert job_id and job_count(api) == before + 1
    wait_state(api, job_id, {"SUCCEEDED"})


@pytest.mark.parametrize("job_id,code", [("0123456789ab", grpc.StatusCode.NOT_FOUND),
                                         ("", grpc.StatusCode.INVALID_ARGUMENT)])
def test_get_job_of_an_unknown_id(api: Api, job_id: str, code: grpc.StatusCode) -> None:
    err = call_error(api.jobs.GetJob, job_pb2.GetJobRequest(job_id=job_id))
    assert err.code() == code


def test_stop_and_delete_of_an_unknown_job_are_not_found(api: Api) -> None:
    assert call_error(api.jobs.StopJob, job_pb2.StopJobRequest(job_id="nope")).code() == grpc.StatusCode.NOT_FOUND
    assert call_error(api.jobs.DeleteJob, job_pb2.DeleteJobRequest(job_id="nope")).code() == grpc.StatusCode.NOT_FOUND


def test_list_jobs_with_a_bad_filter_is_invalid_argument(api: Api) -> None:
    err = call_error(api.jobs.ListJobs, job_pb2.ListJobsRequest(states=["SLEEPING"]))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "states" in err.details()
    err = call_error(api.jobs.ListJobs, job_pb2.ListJobsRequest(limit=-1))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "limit" in err.details()


# --- hosts --------------------------------------------------------------------------------------------------
def test_list_hosts_shows_two_hosts_with_capacity(api: Api) -> None:
    hosts = api.hosts.ListHosts(host_pb2.ListHostsRequest(), timeout=RPC_TIMEOUT).hosts
    assert len(hosts) == 2
    assert len({h.hostname for h in hosts}) == 2
    for h in hosts:
        assert h.capacity.cpu == 4 and h.capacity.gpu == 2
        assert h.capacity.mem in ("4Gi", "4096Mi")
        assert h.state == "UP"


# --- resource pools -----------------------------------------------------------------------------------------
def test_root_pool_exists(api: Api) -> None:
    pools = api.pools.ListPools(respool_pb2.ListPoolsRequest(), timeout=RPC_TIMEOUT).pools
    assert "/" in {p.path for p in pools}
    root = api.pools.GetPool(respool_pb2.GetPoolRequest(path="/"), timeout=RPC_TIMEOUT).pool
    assert root.path == "/" and not root.HasField("limit")


def test_pool_create_get_list_duplicate(api: Api) -> None:
    pool = respool_pb2.ResourcePool(path="/team")
    pool.limit.cpu = 2
    api.pools.CreatePool(respool_pb2.CreatePoolRequest(pool=pool), timeout=RPC_TIMEOUT)
    got = api.pools.GetPool(respool_pb2.GetPoolRequest(path="/team"), timeout=RPC_TIMEOUT).pool
    assert got.path == "/team" and got.HasField("limit") and got.limit.cpu == 2
    assert {"/", "/team"} <= {p.path for p in api.pools.ListPools(respool_pb2.ListPoolsRequest(),
                                                                  timeout=RPC_TIMEOUT).pools}
    err = call_error(api.pools.CreatePool, respool_pb2.CreatePoolRequest(pool=respool_pb2.ResourcePool(path="/team")))
    assert err.code() == grpc.StatusCode.ALREADY_EXISTS


@pytest.mark.parametrize("path,code", [
    ("/missing/child", grpc.StatusCode.NOT_FOUND),
    ("team", grpc.StatusCode.INVALID_ARGUMENT),
    ("/a//b", grpc.StatusCode.INVALID_ARGUMENT),
    ("/a/../b", grpc.StatusCode.INVALID_ARGUMENT),
    ("/sp ace", grpc.StatusCode.INVALID_ARGUMENT),
    ("/", grpc.StatusCode.INVALID_ARGUMENT),
    ("", grpc.StatusCode.INVALID_ARGUMENT),
])
def test_pool_create_errors(api: Api, path: str, code: grpc.StatusCode) -> None:
    err = call_error(api.pools.CreatePool, respool_pb2.CreatePoolRequest(pool=respool_pb2.ResourcePool(path=path)))
    assert err.code() == code, err.details()


def test_pool_with_a_negative_limit_is_invalid(api: Api) -> None:
    pool = respool_pb2.ResourcePool(path="/neg")
    pool.limit.cpu = -1
    err = call_error(api.pools.CreatePool, respool_pb2.CreatePoolRequest(pool=pool))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "pool.limit.cpu" in err.details()


def test_pool_delete(api: Api) -> None:
    api.pools.CreatePool(respool_pb2.CreatePoolRequest(pool=respool_pb2.ResourcePool(path="/scratch")),
                         timeout=RPC_TIMEOUT)
    api.pools.DeletePool(respool_pb2.DeletePoolRequest(path="/scratch"), timeout=RPC_TIMEOUT)
    err = call_error(api.pools.GetPool, respool_pb2.GetPoolRequest(path="/scratch"))
    assert err.code() == grpc.StatusCode.NOT_FOUND
    err = call_error(api.pools.DeletePool, respool_pb2.DeletePoolRequest(path="/scratch"))
    assert err.code() == grpc.StatusCode.NOT_FOUND
    err = call_error(api.pools.DeletePool, respool_pb2.DeletePoolRequest(path="/"))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_delete_of_a_pool_with_children_is_refused(api: Api) -> None:
    api.pools.CreatePool(respool_pb2.CreatePoolRequest(pool=respool_pb2.ResourcePool(path="/p")), timeout=RPC_TIMEOUT)
    api.pools.CreatePool(respool_pb2.CreatePoolRequest(pool=respool_pb2.ResourcePool(path="/p/c")),
                         timeout=RPC_TIMEOUT)
    err = call_error(api.pools.DeletePool, respool_pb2.DeletePoolRequest(path="/p"))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    api.pools.DeletePool(respool_pb2.DeletePoolRequest(path="/p/c"), timeout=RPC_TIMEOUT)
    api.pools.DeletePool(respool_pb2.DeletePoolRequest(path="/p"), timeout=RPC_TIMEOUT)


def test_pool_update_and_the_tree_rules(api: Api) -> None:
    """UpdatePool replaces a pool's settings; every change is checked against the tree (nothing written when
    refused); reservations beyond the cluster are accepted with a warning; Get/List show the live figures."""
    def pool(path: str, **kw: Any) -> respool_pb2.ResourcePool:
        p = respool_pb2.ResourcePool(path=path, **{k: v for k, v in kw.items() if k not in ("res", "lim")})
        for field, values in (("reservation", kw.get("res")), ("limit", kw.get("lim"))):
            for k, v in (values or {}).items():
                setattr(getattr(p, field), k, v)
        return p

    # the cluster (2 hosts x 4 cpu, 2 gpu) is known once the placement engine has reported it
    wait_for(lambda: api.pools.GetPool(respool_pb2.GetPoolRequest(path="/"), timeout=RPC_TIMEOUT).pool
             .HasField("entitlement"))
    r = api.pools.CreatePool(respool_pb2.CreatePoolRequest(pool=pool("/lab", res={"cpu": 100, "gpu": 2})),
                             timeout=RPC_TIMEOUT)
    assert [w.split(":")[0] for w in r.warnings] == ["the top-level pools reserve 100 cpu in all, more than the "
                                                     "cluster has now (8)"]
    for bad, field in ((pool("/lab", res={"cpu": 100, "gpu": 2}, lim={"gpu": 1}), "pool.limit.gpu"),
                       (pool("/lab", reservation_type="fixed"), "pool.reservation_type"),
                       (pool("/", res={"cpu": 1}), "pool.reservation")):
        err = call_error(api.pools.UpdatePool, respool_pb2.UpdatePoolRequest(pool=bad))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and err.details().startswith(field), err.details()
    err = call_error(api.pools.UpdatePool, respool_pb2.UpdatePoolRequest(pool=pool("/nowhere")))
    assert err.code() == grpc.StatusCode.NOT_FOUND
    err = call_error(api.pools.CreatePool, respool_pb2.CreatePoolRequest(pool=pool("/lab/x", res={"gpu": 3})))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details() == "pool.reservation.gpu: /lab/x and its siblings would reserve 3 in all, more than /lab " \
                            "reserves (2)"
    api.pools.UpdatePool(respool_pb2.UpdatePoolRequest(pool=pool("/lab", res={"cpu": 4, "gpu": 2}, share=3,
                                                                 reservation_type="static", submitters=["alice"])),
                         timeout=RPC_TIMEOUT)
    got = api.pools.GetPool(respool_pb2.GetPoolRequest(path="/lab"), timeout=RPC_TIMEOUT).pool
    assert (got.share, got.reservation_type, list(got.submitters), got.reservation.cpu) == (3, "static", ["alice"], 4)
    assert got.entitlement.gpu == 2 and got.entitlement.cpu == 4  # static: held while idle
    api.pools.DeletePool(respool_pb2.DeletePoolRequest(path="/lab"), timeout=RPC_TIMEOUT)


def test_a_gang_over_its_pool_limit_is_invalid_argument(api: Api) -> None:
    pool = respool_pb2.ResourcePool(path="/small")
    pool.limit.cpu = 2
    api.pools.CreatePool(respool_pb2.CreatePoolRequest(pool=pool), timeout=RPC_TIMEOUT)
    before = job_count(api)
    err = call_error(api.jobs.CreateJob,
                     job_pb2.CreateJobRequest(spec=spec(instances=3, cpu=1, respool="/small")))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "/small" in err.details() and "limit" in err.details()
    assert job_count(api) == before


# --- jobs that run ------------------------------------------------------------------------------------------
def test_a_small_job_succeeds(api: Api) -> None:
    job_id = api.jobs.CreateJob(job_pb2.CreateJobRequest(spec=spec("ok", instances=2, command="true")),
                                timeout=RPC_TIMEOUT).job_id
    assert job_id
    job = wait_state(api, job_id, {"SUCCEEDED", "FAILED", "KILLED"})
    assert job.status.state == "SUCCEEDED", job.status
    assert dict(job.status.task_states) == {"SUCCEEDED": 2}
    assert [g.state for g in job.status.gangs] == ["DONE"]
    assert job.spec.name == "ok" and job.spec.instances == 2
    assert job_id in {j.id for j in api.jobs.ListJobs(job_pb2.ListJobsRequest(states=["SUCCEEDED"]),
                                                      timeout=RPC_TIMEOUT).jobs}
    api.jobs.DeleteJob(job_pb2.DeleteJobRequest(job_id=job_id), timeout=RPC_TIMEOUT)
    assert call_error(api.jobs.GetJob, job_pb2.GetJobRequest(job_id=job_id)).code() == grpc.StatusCode.NOT_FOUND


def test_a_jobs_members_events_come_together_in_one_call(api: Api) -> None:
    """ListTaskEvents: every member's state changes, oldest first, each naming its member, as GetTask has them
    one member at a time; the members named only; the newest `limit`, with the total."""
    job_id = api.jobs.CreateJob(job_pb2.CreateJobRequest(spec=spec("events", instances=3, command="true")),
                                timeout=RPC_TIMEOUT).job_id
    wait_state(api, job_id, {"SUCCEEDED", "FAILED", "KILLED"})
    r = api.tasks.ListTaskEvents(task_pb2.ListTaskEventsRequest(job_id=job_id), timeout=RPC_TIMEOUT)
    each = {i: api.tasks.GetTask(task_pb2.GetTaskRequest(job_id=job_id, instance=i), timeout=RPC_TIMEOUT).task.events
            for i in range(3)}
    assert r.total == len(r.events) == sum(len(v) for v in each.values())
    assert [e.time for e in r.events] == sorted(e.time for e in r.events)
    for i, evs in each.items():
        assert [(e.state, e.time) for e in r.events if e.instance == i] == [(e.state, e.time) for e in evs]
        assert {e.instance for e in evs} == {i}  # GetTask's events name their member too
    assert {e.state for e in r.events} >= {"PENDING", "RUNNING", "SUCCEEDED"}
    two = api.tasks.ListTaskEvents(task_pb2.ListTaskEventsRequest(job_id=job_id, instances=[0, 2]),
                                   timeout=RPC_TIMEOUT)
    assert {e.instance for e in two.events} == {0, 2} and two.total == len(each[0]) + len(each[2])
    last = api.tasks.ListTaskEvents(task_pb2.ListTaskEventsRequest(job_id=job_id, limit=2), timeout=RPC_TIMEOUT)
    assert list(last.events) == list(r.events)[-2:] and last.total == r.total
    for request, field in ((task_pb2.ListTaskEventsRequest(job_id=job_id, limit=10_001), "limit"),
                           (task_pb2.ListTaskEventsRequest(job_id=job_id, instances=[1, -1]), "instances[1]"),
                           (task_pb2.ListTaskEventsRequest(job_id=job_id, instances=list(range(10_001))),
                            "instances")):
        e = call_error(api.tasks.ListTaskEvents, request)
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and field in (e.details() or ""), e.details()
    e = call_error(api.tasks.ListTaskEvents, task_pb2.ListTaskEventsRequest(job_id="0123456789ab"))
    assert e.code() == grpc.StatusCode.NOT_FOUND


def test_a_job_in_a_limited_pool_runs(api: Api) -> None:
    job_id = api.jobs.CreateJob(job_pb2.CreateJobRequest(spec=spec("inteam", instances=2, cpu=1, respool="/team")),
                                timeout=RPC_TIMEOUT).job_id
    job = wait_state(api, job_id, {"SUCCEEDED", "FAILED", "KILLED"})
    assert job.status.state == "SUCCEEDED", job.status


def test_delete_of_a_running_job_is_refused_then_stop_kills_it(api: Api) -> None:
    job_id = api.jobs.CreateJob(job_pb2.CreateJobRequest(spec=spec("sleeper", instances=2, command="sleep 60")),
                                timeout=RPC_TIMEOUT).job_id
    try:
        wait_state(api, job_id, {"RUNNING"})
        err = call_error(api.jobs.DeleteJob, job_pb2.DeleteJobRequest(job_id=job_id))
        assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "stop it" in err.details()
    finally:
        api.jobs.StopJob(job_pb2.StopJobRequest(job_id=job_id), timeout=RPC_TIMEOUT)
    job = wait_state(api, job_id, {"KILLED", "FAILED", "SUCCEEDED"})
    assert job.status.state == "KILLED" and job.status.desired_state == "KILLED"
    assert dict(job.status.task_states) == {"KILLED": 2}
    api.jobs.DeleteJob(job_pb2.DeleteJobRequest(job_id=job_id), timeout=RPC_TIMEOUT)


def test_stop_of_a_finished_job_is_harmless(api: Api) -> None:
    job_id = api.jobs.CreateJob(job_pb2.CreateJobRequest(spec=spec("done", command="true")),
                                timeout=RPC_TIMEOUT).job_id
    wait_state(api, job_id, {"SUCCEEDED"})
    api.jobs.StopJob(job_pb2.StopJobRequest(job_id=job_id), timeout=RPC_TIMEOUT)
    assert wait_state(api, job_id, {"SUCCEEDED", "KILLED"}).status.state == "SUCCEEDED"


def test_pool_usage_is_reported_and_a_busy_pool_cannot_be_deleted(api: Api) -> None:
    pool = respool_pb2.ResourcePool(path="/busy")
    api.pools.CreatePool(respool_pb2.CreatePoolRequest(pool=pool), timeout=RPC_TIMEOUT)
    job_id = api.jobs.CreateJob(job_pb2.CreateJobRequest(spec=spec("busy", cpu=1, command="sleep 60",
                                                                   respool="/busy")), timeout=RPC_TIMEOUT).job_id
    try:
        wait_state(api, job_id, {"RUNNING"})
        got = api.pools.GetPool(respool_pb2.GetPoolRequest(path="/busy"), timeout=RPC_TIMEOUT).pool
        assert got.allocated.cpu == 1
        err = call_error(api.pools.DeletePool, respool_pb2.DeletePoolRequest(path="/busy"))
        assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    finally:
        api.jobs.StopJob(job_pb2.StopJobRequest(job_id=job_id), timeout=RPC_TIMEOUT)
    wait_state(api, job_id, {"KILLED"})
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        got = api.pools.GetPool(respool_pb2.GetPoolRequest(path="/busy"), timeout=RPC_TIMEOUT).pool
        if got.allocated.cpu == 0:
            break
        time.sleep(0.1)
    assert got.allocated.cpu == 0
