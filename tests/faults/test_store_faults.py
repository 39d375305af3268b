"""Store faults through the real daemon on PostgreSQL: the store restarted twice and stopped for 10 s under a
submitter and a reader. At the end every job finished, none was created twice, none is stuck, no member ran twice
(every task finished on its first attempt); meanwhile the API answered UNAVAILABLE and health said NOT_SERVING.

The faults are injected between the daemon and the real PostgreSQL by a TCP proxy (tcp_proxy.py), so the test
disturbs nothing else that uses the server."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from sqlalchemy.engine import make_url

from peloton.api.v1 import job_pb2, job_pb2_grpc
from tests.dbutil import postgres_database
from tests.e2e.harness import Daemon, kill_sandboxed_processes, wait_until
from tests.faults.tcp_proxy import TcpProxy

pytestmark = pytest.mark.e2e

OUTAGE_S = 10.0  # how long the store is stopped
SPEC = job_pb2.JobSpec(name="x", instances=2)
SPEC.task.command = "sleep 1"
SPEC.task.resources.cpu = 0.5
SPEC.task.resources.mem = "64Mi"


@dataclass
class Observed:
    codes: dict[str, list[tuple[float, grpc.StatusCode]]] = field(default_factory=dict)
    health: list[tuple[float, int]] = field(default_factory=list)
    submitted: dict[str, str] = field(default_factory=dict)  # submission name -> job id
    lock: threading.Lock = field(default_factory=threading.Lock)

    def code(self, who: str, c: grpc.StatusCode) -> None:
        with self.lock:
            self.codes.setdefault(who, []).append((time.monotonic(), c))


@pytest.fixture
def store_behind_proxy(tmp_path: Path) -> Iterator[tuple[str, TcpProxy]]:
    with postgres_database() as url:
        u = make_url(url)
        proxy = TcpProxy(u.host or "127.0.0.1", u.port or 5432)
        try:
            yield u.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False), proxy
        finally:
            proxy.close()


def submitter(stub: job_pb2_grpc.JobServiceStub, obs: Observed, stop: threading.Event) -> None:
    n = 0
    while not stop.is_set():
        name, rid = f"sub-{n}", uuid.uuid4().hex
        spec = job_pb2.JobSpec()
        spec.CopyFrom(SPEC)
        spec.name = name
        while not stop.is_set():  # a submission is retried (same request id) until it is accepted
            try:
                r = stub.CreateJob(job_pb2.CreateJobRequest(spec=spec, request_id=rid), timeout=10)
                obs.code("create", grpc.StatusCode.OK)
                with obs.lock:
                    obs.submitted[name] = r.job_id
                break
            except grpc.RpcError as e:
                obs.code("create", e.code())
                assert e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED), e
                time.sleep(0.3)
        n += 1
        time.sleep(0.4)  # a little over what the host runs (2 one-second jobs at a time): a queue, not a long backlog


def reader(stub: job_pb2_grpc.JobServiceStub, obs: Observed, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            jobs = stub.ListJobs(job_pb2.ListJobsRequest(page_size=20), timeout=10).jobs
            for j in jobs[:3]:
                stub.GetJob(job_pb2.GetJobRequest(job_id=j.id), timeout=10)
            obs.code("read", grpc.StatusCode.OK)
        except grpc.RpcError as e:
            obs.code("read", e.code())
            assert e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED), e
        time.sleep(0.2)


def health_watcher(channel: grpc.Channel, obs: Observed, stop: threading.Event) -> None:
    stub = health_pb2_grpc.HealthStub(channel)
    while not stop.is_set():
        try:
            st = stub.Check(health_pb2.HealthCheckRequest(service="peloton"), timeout=5).status
        except grpc.RpcError:
            st = -1
        with obs.lock:
            obs.health.append((time.monotonic(), st))
        time.sleep(0.25)


def test_store_restarted_and_stopped_under_load(store_behind_proxy: tuple[str, TcpProxy], tmp_path: Path) -> None:
    url, proxy = store_behind_proxy
    # room for 2 jobs at a time, fewer than are submitted: gangs wait for placements, so placements are in flight
    # (claimed, handed to the job manager) whenever the store goes away
    d = Daemon(tmp_path / "data", url, hosts=1, host_resources="cpu=2,mem=8Gi")
    d.start()
    obs = Observed()
    stop = threading.Event()
    channel = grpc.insecure_channel(d.address)
    stub = job_pb2_grpc.JobServiceStub(channel)
    threads = [threading.Thread(target=fn, args=(stub if fn is not health_watcher else channel, obs, stop),
                                daemon=True) for fn in (submitter, reader, health_watcher)]
    try:
        for t in threads:
            t.start()
        # The phases are as long as the daemon needs to see each fault, no longer: it looks at its store every
        # second (the `store` loop) and a refused connection fails at once, so a 10 s stop is seen as long as a 20 s
        # one (the health and API checks below look from 3 s into it), and after it the test waits for the daemon
        # to serve again rather than for a fixed time.
        time.sleep(3)
        proxy.cut()  # restart 1: every connection dropped at once
        time.sleep(3)
        proxy.cut()  # restart 2
        time.sleep(3)
        outage_start = time.monotonic()
        proxy.down()  # stopped for 10 s
        time.sleep(OUTAGE_S)
        outage_end = time.monotonic()
        proxy.up()

        def serving_again() -> bool:  # health SERVING and a create accepted, both since the store came back
            with obs.lock:
                healthy = any(t > outage_end and st == health_pb2.HealthCheckResponse.SERVING for t, st in obs.health)
                created = any(t > outage_end and c == grpc.StatusCode.OK for t, c in obs.codes.get("create", []))
            return healthy and created

        wait_until(serving_again, timeout=60, interval=0.2, what="health SERVING and a create accepted again")
        time.sleep(2)  # a few more submissions on the store come back
        stop.set()
        for t in threads:
            t.join(30)

        with obs.lock:
            submitted = dict(obs.submitted)
        assert len(submitted) >= 10, submitted

        def all_done() -> bool:
            states = [stub.GetJob(job_pb2.GetJobRequest(job_id=j), timeout=10).job.status.state
                      for j in submitted.values()]
            return all(s in ("SUCCEEDED", "FAILED", "KILLED") for s in states)

        t0 = time.monotonic()
        wait_until(all_done, timeout=180, interval=1.0, what="every submitted job to finish")
        print(f"\n{len(submitted)} jobs submitted; the queue drained {time.monotonic() - t0:.1f} s after the last")
        jobs = []
        token = ""
        while True:
            page = stub.ListJobs(job_pb2.ListJobsRequest(page_size=1000, page_token=token), timeout=10)
            jobs += page.jobs
            token = page.next_page_token
            if not token:
                break
        names = [j.spec.name for j in jobs]
        assert sorted(names) == sorted(submitted), "a submission created no job, or more than one"
        for j in jobs:
            assert j.status.state == "SUCCEEDED", (j.id, j.status.state, j.status.reason)
            assert all(g.attempt == 1 for g in j.status.gangs), (j.id, [g.attempt for g in j.status.gangs])

        during = [c for who in ("create", "read") for t, c in obs.codes.get(who, [])
                  if outage_start + 2 < t < outage_end]
        assert grpc.StatusCode.UNAVAILABLE in during, "the API did not say UNAVAILABLE while the store was down"
        assert grpc.StatusCode.INTERNAL not in [c for cs in obs.codes.values() for _, c in cs]
        down = [st for t, st in obs.health if outage_start + 3 < t < outage_end]
        assert health_pb2.HealthCheckResponse.NOT_SERVING in down, "health stayed SERVING while the store was down"
        assert obs.health[-1][1] == health_pb2.HealthCheckResponse.SERVING
        # no placement was lost on the way: the periodic repair (re-queueing QUEUED gangs resmgr does not know)
        # never had anything to do
        assert "resource manager did not know" not in d.log()
    finally:
        stop.set()
        channel.close()
        d.stop()
        kill_sandboxed_processes(d.data_dir)
