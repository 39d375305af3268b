"""ListHosts paged and filtered on the server, each GPU's state (used by which task, free, stranded, reserved,
drained), and GetClusterSummary: the real daemon on the sim backend, in-process, over real gRPC, on both stores."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest

from peloton.api.v1 import cluster_pb2, cluster_pb2_grpc, host_pb2, host_pb2_grpc, job_pb2, job_pb2_grpc
from peloton.domain.resources import Resources
from peloton.hostmgr.sim.backend import SimSettings
from peloton.server import Daemon
from peloton.settings import ServerConfig
from tests.dbutil import postgres_database

T = 15.0
HOSTS = 9  # 3 racks of 3, 4 GPUs each


@dataclass
class Api:
    daemon: Daemon
    hosts: host_pb2_grpc.HostServiceStub
    jobs: job_pb2_grpc.JobServiceStub
    cluster: cluster_pb2_grpc.ClusterServiceStub


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def api(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    with contextlib.ExitStack() as stack:
        tmp = tmp_path_factory.mktemp("hosts")
        url = f"sqlite:///{tmp}/p.db" if request.param == "sqlite" else stack.enter_context(postgres_database())
        # no preemption (a waiting gang only reserves hosts), and it reserves after a short settling time
        d = Daemon(ServerConfig(listen="127.0.0.1:0", db_url=url, data_dir=tmp / "data", metrics_listen="",
                                backend="sim", unix_socket="", preemption=False, preemption_settle_s=0.5,
                                sim=SimSettings(hosts=HOSTS, racks=3, resources=Resources(cpu=16, mem=65536, gpu=4))))
        ch = grpc.insecure_channel(d.start())
        try:
            yield Api(d, host_pb2_grpc.HostServiceStub(ch), job_pb2_grpc.JobServiceStub(ch),
                      cluster_pb2_grpc.ClusterServiceStub(ch))
        finally:
            ch.close()
            d.stop()


def hosts(api: Api, **kw: Any) -> host_pb2.ListHostsResponse:
    return api.hosts.ListHosts(host_pb2.ListHostsRequest(with_gpus=True, **kw), timeout=T)


def wait_for(pred: Callable[[], Any], timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError("timed out")


def create(api: Api, name: str, instances: int, gpu: int) -> str:
    s = job_pb2.JobSpec(name=name, instances=instances)
    s.task.command = "train.py"
    s.task.resources.cpu = 1
    s.task.resources.mem = "1Gi"
    s.task.resources.gpu = gpu
    s.task.env["PELOTON_SIM_DURATION"] = "3600s"
    return str(api.jobs.CreateJob(job_pb2.CreateJobRequest(spec=s), timeout=T).job_id)


def code(fn: Callable[..., Any], request: Any) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as ei:
        fn(request, timeout=T)
    return ei.value.code(), ei.value.details() or ""


def test_an_empty_request_lists_every_host_by_rack_then_name_as_before(api: Api) -> None:
    r = hosts(api)
    assert len(r.hosts) == r.total == HOSTS and r.next_page_token == ""
    keys = [(h.labels["rack"], h.hostname) for h in r.hosts]
    assert keys == sorted(keys)
    assert list(r.racks) == ["r0", "r1", "r2"]
    assert all(h.status == "up" and len(h.gpus) == 4 for h in r.hosts)
    plain = api.hosts.ListHosts(host_pb2.ListHostsRequest(), timeout=T)  # as before: no GPUs unless asked
    assert [h.hostname for h in plain.hosts] == [h.hostname for h in r.hosts] and not any(h.gpus for h in plain.hosts)
    assert all(h.status == "up" for h in plain.hosts)


def test_pages_cover_every_host_once_in_order(api: Api) -> None:
    seen: list[str] = []
    token = ""
    for _ in range(HOSTS):
        r = hosts(api, page_size=2, page_token=token)
        assert r.total == HOSTS and len(r.hosts) <= 2
        seen += [h.hostname for h in r.hosts]
        token = r.next_page_token
        if not token:
            break
    assert seen == [h.hostname for h in hosts(api).hosts]


def test_filters_by_rack_name_and_label(api: Api) -> None:
    r1 = hosts(api, rack="r1")
    assert r1.total == 3 and {h.labels["rack"] for h in r1.hosts} == {"r1"}
    assert list(r1.racks) == ["r0", "r1", "r2"]  # every rack still, for the filter's choices
    one = r1.hosts[0].hostname
    assert [h.hostname for h in hosts(api, name_contains=one).hosts] == [one]
    assert hosts(api, labels=["rack=r2"]).total == 3
    assert hosts(api, labels=["rack"]).total == HOSTS
    assert hosts(api, labels=["rack=r2", "rack=r1"]).total == 0
    assert hosts(api, labels=["no-such-label"]).total == 0


@pytest.mark.parametrize(("request_", "field"), [
    (host_pb2.ListHostsRequest(page_size=1001), "page_size"),
    (host_pb2.ListHostsRequest(page_size=-1), "page_size"),
    (host_pb2.ListHostsRequest(states=["sleeping"]), "states"),
    (host_pb2.ListHostsRequest(min_free_gpus=-1), "min_free_gpus"),
    (host_pb2.ListHostsRequest(labels=["=x"]), "labels"),
    (host_pb2.ListHostsRequest(page_token="not a token"), "page_token"),
    (host_pb2.ListHostsRequest(page_token="WyJhIl0="), "page_token"),  # ["a"]: not a key
    (host_pb2.ListHostsRequest(rack="a\x00b"), "rack"),
    (host_pb2.ListHostsRequest(name_contains="x" * 256), "name_contains"),
    (host_pb2.ListHostsRequest(labels=["rack"] * 33), "labels"),
    (host_pb2.ListHostsRequest(states=["up"] * 33), "states"),
])
def test_a_bad_request_names_its_field(api: Api, request_: host_pb2.ListHostsRequest, field: str) -> None:
    status, details = code(api.hosts.ListHosts, request_)
    assert status == grpc.StatusCode.INVALID_ARGUMENT and field in details


def test_gpus_used_by_which_task_stranded_reserved_and_drained_and_the_summary(api: Api) -> None:
    """Three members of 3 GPUs take three hosts, leaving one GPU free on each; a member of 2 GPUs then waits: no
    host has 2 free. Those free GPUs are stranded, but for the host the waiting gang gets reserved. A drained host's
    free GPUs say drained. The summary adds it up without a host list."""
    busy = create(api, "three-of-three", 3, 3)
    used = wait_for(lambda: [h for h in hosts(api).hosts if any(g.state == "used" for g in h.gpus)]
                    if len([h for h in hosts(api).hosts if h.allocated.gpu == 3]) == 3 else None)
    assert len(used) == 3
    for h in used:
        holders = [g for g in h.gpus if g.state == "used"]
        assert len(holders) == 3 and {g.task_id.split("-")[0] for g in holders} == {busy}
        assert len({g.id for g in h.gpus}) == 4
    # the six idle hosts are free for everyone: drain two of them, and take the rest's GPUs
    idle = [h.hostname for h in hosts(api).hosts if h.allocated.gpu == 0]
    assert len(idle) == 6
    drained = api.hosts.DrainHost(host_pb2.DrainHostRequest(hostname=idle[0]), timeout=T).host
    assert (drained.drain, drained.status, [g.state for g in drained.gpus]) == ("drained", "drained", ["drained"] * 4)
    filler = create(api, "fill", 5, 4)
    wait_for(lambda: hosts(api, min_free_gpus=1).total == 3)  # the three with one free GPU each
    waiting = create(api, "two", 1, 2)
    gang = f"{waiting}/0"

    def states() -> dict[str, list[str]]:
        return {h.hostname: [g.state for g in h.gpus] for h in hosts(api).hosts}

    reserved = wait_for(lambda: [h for h in hosts(api).hosts if h.reserved_for])
    s = states()
    assert reserved and all(h.reserved_for == gang for h in reserved)
    assert s[idle[0]] == ["drained"] * 4
    stranded = [h for h in used if h.hostname not in {r.hostname for r in reserved}]
    assert stranded, "a reservation takes one host at a time"
    for h in stranded:
        assert sorted(s[h.hostname]) == ["stranded", "used", "used", "used"]
    assert hosts(api, states=["drained"]).total == 1 and hosts(api, states=["up", "drained"]).total == HOSTS
    assert hosts(api, min_free_gpus=1).total == len(stranded) + sum(
        1 for h in reserved if h.allocated.gpu < 4)
    assert hosts(api, min_free_gpus=2).total == 0

    summary = api.cluster.GetClusterSummary(cluster_pb2.GetClusterSummaryRequest(), timeout=T)
    assert set(summary.sources) == {"hosts", "queue", "gangs"}
    assert summary.hosts == HOSTS and summary.racks == 3
    assert dict(summary.host_states) == {"up": HOSTS - 1, "drained": 1}
    assert summary.capacity.gpu == 4 * HOSTS and summary.allocated.gpu == 3 * 3 + 5 * 4
    gpus = dict(summary.gpus)
    assert sum(gpus.values()) == 4 * HOSTS and gpus["used"] == 29 and gpus["drained"] == 4
    flat = [x for v in states().values() for x in v]
    assert gpus == {k: flat.count(k) for k in set(flat)}
    assert summary.queued_gangs == 1
    jobs = [api.jobs.GetJob(job_pb2.GetJobRequest(job_id=j), timeout=T).job.status for j in (busy, filler, waiting)]
    want: dict[str, int] = {}
    for st in jobs:
        for k, n in st.gang_states.items():
            want[k] = want.get(k, 0) + n
    assert dict(summary.gang_states) == want and want.get("RUNNING") == jobs[0].gang_count + jobs[1].gang_count
    stages = {g.stage: g for g in summary.stages}
    assert list(stages) == ["queued", "placing", "launched", "launching", "submitted_to_running"]
    run = stages["submitted_to_running"]
    assert run.count >= 2 and 0 <= run.p50_seconds <= run.p95_seconds <= run.p99_seconds
    for j in (busy, filler, waiting):
        api.jobs.StopJob(job_pb2.StopJobRequest(job_id=j), timeout=T)
    api.hosts.UndrainHost(host_pb2.UndrainHostRequest(hostname=idle[0]), timeout=T)
