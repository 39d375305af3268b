"""Big jobs through the real daemon (sim backend; SQLite and PostgreSQL): a 100,000-instance elastic job is
accepted while other users' creates keep being answered, and runs; the largest job spec the limits allow is
accepted and runs. Figures are printed (run with -s), never asserted: docs/performance.md reports them."""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Iterator
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


def creates_meanwhile(stub: job_pb2_grpc.JobServiceStub, work: Callable[[], object], tag: str,
                      small_ids: list[str]) -> tuple[object, float, list[float]]:
    """Run `work` in a thread while creating small jobs one after another (at least 5): its result, how long it
    took, and how long each create took meanwhile."""
    result: dict[str, object] = {}

    def run() -> None:
        t0 = time.monotonic()
        result["value"] = work()
        result["took"] = time.monotonic() - t0

    t = threading.Thread(target=run)
    t.start()
    latencies: list[float] = []
    while t.is_alive() or len(latencies) < 5:
        t0 = time.monotonic()
        small_ids.append(stub.CreateJob(job_pb2.CreateJobRequest(spec=small_spec(f"{tag}-{len(latencies)}")),
                                        timeout=60).job_id)
        latencies.append(time.monotonic() - t0)
        time.sleep(0.1)
    t.join()
    assert "took" in result, "the big request failed (see the output above)"
    return result["value"], float(result["took"]), latencies  # type: ignore[arg-type]


def figures(latencies: list[float]) -> str:
    return (f"{len(latencies)} small creates meanwhile: median {statistics.median(latencies) * 1000:.0f} ms, "
            f"max {max(latencies) * 1000:.0f} ms")


def test_a_100k_instance_job_is_accepted_and_stopped_while_other_creates_keep_answering(big_sim: SimDaemon) -> None:
    channel = grpc.insecure_channel(big_sim.address)
    stub = job_pb2_grpc.JobServiceStub(channel)
    big = job_pb2.JobSpec(name="huge", instances=100_000)
    big.gang.min_available = 1  # elastic: a gang of one per instance
    big.task.command = "train.py"
    big.task.resources.cpu = 0.05  # 500 hosts x 16 cores: room for all of them
    big.task.resources.mem = "16Mi"
    small_ids: list[str] = []
    job_id, accepted_s, create_latencies = creates_meanwhile(
        stub, lambda: stub.CreateJob(job_pb2.CreateJobRequest(spec=big), timeout=300).job_id, "small", small_ids)
    job = stub.GetJob(job_pb2.GetJobRequest(job_id=str(job_id)), timeout=30).job
    assert job.spec.instances == 100_000 and job.status.gang_count == 100_000 and len(job.status.gangs) == 1000
    assert job.ByteSize() < 1024 * 1024  # the answer stays small: the first gangs, and a count of all by state

    def running() -> int:
        return int(stub.GetJob(job_pb2.GetJobRequest(job_id=str(job_id)), timeout=30).job.status.task_states["RUNNING"])

    t0 = time.monotonic()
    wait_until(lambda: running() >= 1000, timeout=300, interval=0.5, what="the big job's instances to start")
    print(f"\n100k-instance elastic job on {big_sim.db_url.split(':')[0]}: accepted in {accepted_s:.1f} s "
          f"({figures(create_latencies)}); 1000 instances running {time.monotonic() - t0:.1f} s later")
    # a watch of it with its tasks starts with a snapshot of all 100,000 (~5 MB): in parts a client with grpcio's
    # default 4 MiB receive limit takes (it was one message, and the stream failed RESOURCE_EXHAUSTED)
    stream = stub.WatchJobs(job_pb2.WatchJobsRequest(job_ids=[str(job_id)], tasks=True), timeout=120)
    instances: list[int] = []
    parts = 0
    for resp in stream:
        assert resp.snapshot and [c.job_id for c in resp.changes] == [job_id]
        parts += 1
        instances += [t.instance for t in resp.changes[0].tasks]
        if not resp.more:
            assert resp.stream_id  # a whole revision: a resume point
            break
        assert not resp.stream_id
    stream.cancel()
    assert parts > 1 and sorted(instances) == list(range(100_000))
    _, stop_s, stop_latencies = creates_meanwhile(
        stub, lambda: stub.StopJob(job_pb2.StopJobRequest(job_id=str(job_id)), timeout=300), "during-stop", small_ids)
    t0 = time.monotonic()
    wait_until(lambda: stub.GetJob(job_pb2.GetJobRequest(job_id=str(job_id))).job.status.state == "KILLED",
               timeout=300, interval=1.0, what="the big job to be stopped")
    print(f"stopped (100,000 gangs): StopJob took {stop_s:.1f} s ({figures(stop_latencies)}), KILLED "
          f"{time.monotonic() - t0:.1f} s later")
    for sid in small_ids:  # other users' jobs were not held up behind it
        def succeeded(sid: str = sid) -> bool:
            return stub.GetJob(job_pb2.GetJobRequest(job_id=sid)).job.status.state == "SUCCEEDED"

        wait_until(succeeded, timeout=120, interval=0.5, what=f"small job {sid} to succeed")
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
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "task.command" in e.value.details()
    channel.close()
