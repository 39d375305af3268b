"""Big jobs through the real daemon (sim backend; SQLite and PostgreSQL): a 100,000-instance elastic job is
accepted while other users' creates keep being answered, and runs; the largest job spec the limits allow is
accepted and runs. Figures are printed (run with -s), never asserted: docs/performance.md reports them."""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from peloton.api.v1 import job_pb2, job_pb2_grpc
from peloton.domain import limits
from tests.e2e.harness import wait_until
from tests.e2e.test_sim_e2e import SimDaemon

pytestmark = pytest.mark.e2e


@pytest.fixture
def big_sim(db_url: str, tmp_path: Path) -> Iterator[SimDaemon]:
    d = SimDaemon(tmp_path / "data", db_url, sim_hosts=500)
    try:
        d.start()
        yield d
    finally:
        d.stop()


def small_spec(name: str) -> job_pb2.JobSpec:
    spec = job_pb2.JobSpec(name=name, instances=2)
    spec.sla.priority = 10  # ahead of the big job's 100,000 queued gangs (fair sharing between jobs: issue 9)
    spec.task.command = "train.py"
    spec.task.env["PELOTON_SIM_DURATION"] = "1s"
    spec.task.resources.cpu = 1
    spec.task.resources.mem = "1Gi"
    return spec


def test_a_100k_instance_job_is_accepted_while_other_creates_keep_answering(big_sim: SimDaemon) -> None:
    channel = grpc.insecure_channel(big_sim.address)
    stub = job_pb2_grpc.JobServiceStub(channel)
    big = job_pb2.JobSpec(name="huge", instances=100_000)
    big.gang.min_available = 1  # elastic: a gang of one per instance
    big.task.command = "train.py"
    big.task.resources.cpu = 0.05  # 500 hosts x 16 cores: room for all of them
    big.task.resources.mem = "16Mi"
    result: dict[str, object] = {}

    def create_big() -> None:
        t0 = time.monotonic()
        result["job_id"] = stub.CreateJob(job_pb2.CreateJobRequest(spec=big), timeout=300).job_id
        result["accepted_s"] = time.monotonic() - t0

    small_latencies: list[float] = []
    small_ids: list[str] = []
    t = threading.Thread(target=create_big)
    t.start()
    n = 0
    while t.is_alive() or n < 5:
        t0 = time.monotonic()
        small_ids.append(stub.CreateJob(job_pb2.CreateJobRequest(spec=small_spec(f"small-{n}")), timeout=60).job_id)
        small_latencies.append(time.monotonic() - t0)
        n += 1
        time.sleep(0.1)
    t.join()
    job_id = str(result["job_id"])
    job = stub.GetJob(job_pb2.GetJobRequest(job_id=job_id), timeout=30).job
    assert job.spec.instances == 100_000 and job.status.gang_count == 100_000 and len(job.status.gangs) == 1000
    assert job.ByteSize() < 1024 * 1024  # the answer stays small: the first gangs, and a count of all by state
    for sid in small_ids:  # other users' jobs were not held up behind it
        wait_until(lambda sid=sid: stub.GetJob(job_pb2.GetJobRequest(job_id=sid)).job.status.state == "SUCCEEDED",
                   timeout=120, interval=0.5, what=f"small job {sid} to succeed")

    def running() -> int:
        return int(stub.GetJob(job_pb2.GetJobRequest(job_id=job_id), timeout=30).job.status.task_states["RUNNING"])

    t0 = time.monotonic()
    wait_until(lambda: running() >= 1000, timeout=300, interval=0.5, what="the big job's instances to start")
    print(f"\n100k-instance elastic job on {big_sim.db_url.split(':')[0]}: accepted in {result['accepted_s']:.1f} s; "
          f"1000 instances running {time.monotonic() - t0:.1f} s later; {len(small_latencies)} small creates "
          f"meanwhile: median {statistics.median(small_latencies) * 1000:.0f} ms, "
          f"max {max(small_latencies) * 1000:.0f} ms")
    t0 = time.monotonic()
    stub.StopJob(job_pb2.StopJobRequest(job_id=job_id), timeout=120)
    wait_until(lambda: stub.GetJob(job_pb2.GetJobRequest(job_id=job_id)).job.status.state == "KILLED",
               timeout=300, interval=1.0, what="the big job to be stopped")
    print(f"stopped (100,000 gangs) in {time.monotonic() - t0:.1f} s")
    channel.close()


def test_the_largest_spec_the_limits_allow_is_accepted_and_runs(big_sim: SimDaemon) -> None:
    channel = grpc.insecure_channel(big_sim.address)
    stub = job_pb2_grpc.JobServiceStub(channel)
    spec = small_spec("largest")
    value = "v" * (limits.MAX_ENV_VALUE_BYTES - 16)
    spec.task.command = "x" * (limits.MAX_COMMAND_BYTES - 1)
    budget = limits.MAX_COMMAND_AND_ENV_BYTES - limits.MAX_COMMAND_BYTES - 100
    i = 0
    while budget > len(value) + 16:
        spec.task.env[f"E{i}"] = value
        budget -= len(value) + len(f"E{i}=") + 1
        i += 1
    for k in range(limits.MAX_CONSTRAINTS):
        spec.placement.constraints.add(attribute=f"a{k}", op="ne", value="z" * (limits.MAX_CONSTRAINT_VALUE_CHARS - 1))
    assert spec.ByteSize() < limits.MAX_SPEC_BYTES
    job_id = stub.CreateJob(job_pb2.CreateJobRequest(spec=spec), timeout=60).job_id
    wait_until(lambda: stub.GetJob(job_pb2.GetJobRequest(job_id=job_id)).job.status.state == "SUCCEEDED",
               timeout=120, interval=0.5, what="the largest job to succeed")
    over = job_pb2.JobSpec()
    over.CopyFrom(spec)
    over.task.command += "xx"  # one byte past the limit
    with pytest.raises(grpc.RpcError) as e:
        stub.CreateJob(job_pb2.CreateJobRequest(spec=over), timeout=60)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "task.command" in e.value.details()  # type: ignore[attr-defined]
    channel.close()
