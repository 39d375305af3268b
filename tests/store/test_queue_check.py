"""The reconciler's queue check, through the real components in one daemon (sim backend) on both stores: when the
resource manager forgets what it held (it restarted on its own, or an enqueue was lost), queued gangs are queued
again and running gangs' allocations registered again, without a restart of the job manager."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

import peloton.jobmgr.manager as jobmgr_manager
from peloton.api.v1 import job_pb2, job_pb2_grpc
from peloton.domain.resources import Resources
from peloton.hostmgr.sim.backend import SimSettings
from peloton.server import Daemon
from peloton.settings import ServerConfig


@pytest.fixture
def daemon(db_url: str, tmp_path: Path) -> Iterator[Daemon]:
    d = Daemon(ServerConfig(listen="127.0.0.1:0", db_url=db_url, data_dir=tmp_path / "data", metrics_listen="",
                            backend="sim", sim=SimSettings(hosts=1, resources=Resources(cpu=8, mem=8192, gpu=2),
                                                           racks=1)))
    d.start()
    try:
        yield d
    finally:
        d.stop()


def spec(name: str) -> job_pb2.JobSpec:
    s = job_pb2.JobSpec(name=name, instances=2)  # one gang of two, the whole (one-host) cluster's GPUs
    s.task.command = "train.py"
    s.task.resources.cpu = 1
    s.task.resources.mem = "1Gi"
    s.task.resources.gpu = 1
    return s


def wait(pred, what: str, timeout: float = 20.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_the_queue_check_repairs_a_resource_manager_that_forgot_everything(
        daemon: Daemon, monkeypatch: pytest.MonkeyPatch) -> None:
    rm = daemon.resmgr
    assert rm is not None
    with grpc.insecure_channel(daemon.address) as ch:
        jobs = job_pb2_grpc.JobServiceStub(ch)

        def state(job_id: str) -> str:
            return str(jobs.GetJob(job_pb2.GetJobRequest(job_id=job_id), timeout=10).job.status.state)

        running = jobs.CreateJob(job_pb2.CreateJobRequest(spec=spec("running")), timeout=10).job_id
        wait(lambda: state(running) == "RUNNING", "the first job to run")
        waiting = jobs.CreateJob(job_pb2.CreateJobRequest(spec=spec("waiting")), timeout=10).job_id
        wait(lambda: rm.usage()[1].get("/", 0) == 1, "the second gang to be queued")
        assert rm.usage()[0]["/"].gpu == 2

        rm.reset()  # what a restart of the resmgr process leaves behind
        assert rm.usage() == ({}, {})
        # the check looks at gangs unchanged for QUEUE_CHECK_S; here, at once
        monkeypatch.setattr(jobmgr_manager, "QUEUE_CHECK_S", 0.0)
        assert daemon.jobmgr is not None
        daemon.jobmgr._queue_check_at = 0.0  # noqa: SLF001 - due now
        daemon.jobmgr.reconcile_once()
        assert daemon.jobmgr.effects.drain(10)
        allocated, queued = rm.usage()
        assert allocated["/"].gpu == 2  # the running gang's allocation, registered again
        assert queued == {"/": 1}  # the waiting gang, queued again
        assert state(waiting) == "PENDING"  # and still waiting: the running gang holds the GPUs

        daemon.jobmgr._queue_check_at = 0.0  # noqa: SLF001 - a second check finds nothing to repair
        daemon.jobmgr.reconcile_once()
        assert daemon.jobmgr.effects.drain(10)
        assert rm.usage()[1] == {"/": 1} and rm.usage()[0]["/"].gpu == 2

        jobs.StopJob(job_pb2.StopJobRequest(job_id=running), timeout=10)
        wait(lambda: state(waiting) == "RUNNING", "the queued job to run once the GPUs are free")
        assert state(running) == "KILLED"


def test_a_gang_whose_enqueue_is_on_its_way_is_not_taken_for_lost(
        daemon: Daemon, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The check right after resmgr started afresh asks about every open gang, however new. A gang created a
    moment before, whose enqueue the side effects have not sent yet, is not lost: the check waits for it to be sent
    (here it is held up) and, when it is not, asks nothing and comes back at the next pass."""
    jm, rm = daemon.jobmgr, daemon.resmgr
    assert jm is not None and rm is not None
    gate = threading.Event()
    send = jm.effects.resmgr.enqueue

    def held(*args, **kwargs):  # type: ignore[no-untyped-def]
        gate.wait(20)
        return send(*args, **kwargs)

    asked: list[int] = []
    unknown = jm.resmgr.unknown_gangs

    def counted(keys):  # type: ignore[no-untyped-def]
        asked.append(len(keys))
        return unknown(keys)

    monkeypatch.setattr(jm.effects.resmgr, "enqueue", held)
    monkeypatch.setattr(jm.resmgr, "unknown_gangs", counted)
    monkeypatch.setattr(jobmgr_manager, "SENT_WAIT_S", 0.3)
    with grpc.insecure_channel(daemon.address) as ch:
        jobs = job_pb2_grpc.JobServiceStub(ch)
        job = jobs.CreateJob(job_pb2.CreateJobRequest(spec=spec("new")), timeout=10).job_id
        jm._check_every_gang = True  # noqa: SLF001 - as after resmgr started afresh
        jm._queue_check_at = 0.0  # noqa: SLF001
        with caplog.at_level("WARNING", logger="peloton.jobmgr.manager"):
            jm.reconcile_once()
            assert asked == []  # its enqueue is held up: nothing asked
            assert jm._queue_check_at <= time.time() and jm._check_every_gang  # noqa: SLF001 - due again
            gate.set()
            assert jm.effects.drain(10)
            jm.reconcile_once()
        assert asked and sum(asked) >= 1  # asked, now that the enqueue went
        assert "did not know" not in caplog.text
        wait(lambda: jobs.GetJob(job_pb2.GetJobRequest(job_id=job), timeout=10).job.status.state == "RUNNING",
             "the job to run")


def test_a_gang_that_a_later_status_of_the_same_batch_ended_is_not_queued_in_resmgr(
        daemon: Daemon, monkeypatch: pytest.MonkeyPatch) -> None:
    """One batch of status updates: the first member's failure restarts its gang (an enqueue of its next attempt
    recorded), the second's, permanent, fails the job, which stops that gang at once (DONE, released). The sender
    sends the releases before the enqueues: the enqueue, built from the gang as it was at the commit, queued in resmgr
    a gang that was over, which placement could then place for nothing (and its pool's share stayed counted until the
    queue check released it)."""
    from peloton.domain.launch import TaskStatus
    from peloton.domain.model import task_id_for
    from peloton.domain.states import TaskState

    jm = daemon.jobmgr
    assert jm is not None
    sent: list[tuple[str, int]] = []  # every gang attempt enqueued in resmgr
    enqueue = jm.effects.resmgr.enqueue

    def recorded(gangs, running, *args, **kwargs):  # type: ignore[no-untyped-def]
        sent.extend((g.gang_id, g.attempt) for g in gangs)
        return enqueue(gangs, running, *args, **kwargs)

    monkeypatch.setattr(jm.effects.resmgr, "enqueue", recorded)
    with grpc.insecure_channel(daemon.address) as ch:
        jobs = job_pb2_grpc.JobServiceStub(ch)
        s = spec("elastic")
        s.gang.min_available = 1  # two gangs of one member each
        s.retry.max_attempts = 2
        job_id = jobs.CreateJob(job_pb2.CreateJobRequest(spec=s), timeout=10).job_id

        def get() -> job_pb2.Job:
            return jobs.GetJob(job_pb2.GetJobRequest(job_id=job_id), timeout=10).job

        wait(lambda: all(t.state == TaskState.RUNNING for t in jm.list_tasks(job_id)[0]), "both gangs to run")
        jm.apply_statuses([
            TaskStatus(task_id_for(job_id, 0, 1), TaskState.FAILED, time.time(), exit_code=1, message="crashed"),
            TaskStatus(task_id_for(job_id, 1, 1), TaskState.FAILED, time.time(), message="bad image",
                       permanent=True),
        ])
        assert jm.effects.drain(10)
        assert str(get().status.state) in ("FAILING", "FAILED")
        assert (f"{job_id}/0", 2) not in sent, sent  # its next attempt was never queued
