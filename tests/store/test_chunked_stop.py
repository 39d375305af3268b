"""Stopping a job a range of gangs per commit, through the real components in one daemon (sim backend) on both
stores: every gang ends up stopped and the queue gives up the job's queued gangs at once; a stop cut short after
its first commit (the store went away) is finished by the reconciler."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

import peloton.jobmgr.manager as jobmgr_manager
from peloton.api.v1 import job_pb2, job_pb2_grpc
from peloton.domain.resources import Resources
from peloton.errors import Unavailable
from peloton.hostmgr.sim.backend import SimSettings
from peloton.server import Daemon
from peloton.settings import ServerConfig


@pytest.fixture
def daemon(db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Daemon]:
    monkeypatch.setattr(jobmgr_manager, "STOP_CHUNK", 2)
    d = Daemon(ServerConfig(listen="127.0.0.1:0", db_url=db_url, data_dir=tmp_path / "data", metrics_listen="",
                            backend="sim", sim=SimSettings(hosts=1, resources=Resources(cpu=8, mem=8192, gpu=2),
                                                           racks=1)))
    d.start()
    try:
        yield d
    finally:
        d.stop()


def wait(pred: Callable[[], object], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def elastic_job(jobs: job_pb2_grpc.JobServiceStub) -> str:
    """Five gangs of one 1-GPU member on a 2-GPU cluster: two run, three wait in the queue."""
    s = job_pb2.JobSpec(name="elastic", instances=5)
    s.gang.min_available = 1
    s.task.command = "train.py"
    s.task.resources.cpu = 1
    s.task.resources.mem = "1Gi"
    s.task.resources.gpu = 1
    return str(jobs.CreateJob(job_pb2.CreateJobRequest(spec=s), timeout=10).job_id)


def gang_states(jobs: job_pb2_grpc.JobServiceStub, job_id: str) -> list[str]:
    return [g.state for g in jobs.GetJob(job_pb2.GetJobRequest(job_id=job_id), timeout=10).job.status.gangs]


def test_a_job_is_stopped_a_range_of_gangs_per_commit(daemon: Daemon) -> None:
    rm = daemon.resmgr
    assert rm is not None
    with grpc.insecure_channel(daemon.address) as ch:
        jobs = job_pb2_grpc.JobServiceStub(ch)
        job_id = elastic_job(jobs)
        wait(lambda: gang_states(jobs, job_id).count("RUNNING") == 2, "two gangs to run")
        assert rm.usage()[1] == {"/": 3}
        jobs.StopJob(job_pb2.StopJobRequest(job_id=job_id), timeout=10)
        wait(lambda: jobs.GetJob(job_pb2.GetJobRequest(job_id=job_id)).job.status.state == "KILLED", "KILLED")
        assert gang_states(jobs, job_id) == ["DONE"] * 5
        assert daemon.jobmgr is not None and daemon.jobmgr.effects.drain(10)
        assert rm.usage() == ({}, {})


def test_a_stop_cut_short_is_finished_by_the_reconciler(daemon: Daemon, monkeypatch: pytest.MonkeyPatch,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    jm, rm = daemon.jobmgr, daemon.resmgr
    assert jm is not None and rm is not None

    def store_gone(job_id: str, start: int, end: int) -> None:
        raise Unavailable("the store is unavailable (test)")

    with grpc.insecure_channel(daemon.address) as ch:
        jobs = job_pb2_grpc.JobServiceStub(ch)
        job_id = elastic_job(jobs)
        wait(lambda: gang_states(jobs, job_id).count("RUNNING") == 2, "two gangs to run")
        monkeypatch.setattr(jm, "_stop_gangs", store_gone)
        with pytest.raises(grpc.RpcError) as e:
            jobs.StopJob(job_pb2.StopJobRequest(job_id=job_id), timeout=10)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        monkeypatch.undo()
        # the first commit went in: KILLED is desired, the first two gangs are told to stop, the queue gave up the
        # three queued gangs at once, and the last three are not stopped yet
        job = jobs.GetJob(job_pb2.GetJobRequest(job_id=job_id), timeout=10).job
        assert job.status.state == "KILLING" and job.status.desired_state == "KILLED"
        assert gang_states(jobs, job_id)[2:] == ["QUEUED"] * 3
        assert jm.effects.drain(10)
        assert rm.usage()[1] == {}
        with caplog.at_level("WARNING", logger="peloton.jobmgr.manager"):
            jm.reconcile_once()
            wait(lambda: jobs.GetJob(job_pb2.GetJobRequest(job_id=job_id)).job.status.state == "KILLED", "KILLED")
            assert gang_states(jobs, job_id) == ["DONE"] * 5
            jm.reconcile_once()  # nothing left to finish
        assert [r.getMessage() for r in caplog.records if "cut short" in r.getMessage()] == [
            f"job {job_id}: finishing a stop that was cut short"]
