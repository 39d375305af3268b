"""A host drained while a gang placed on it is on its way to launch, through the real components in one daemon
(sim backend) on both stores: the gang starts nothing there; it is queued again whole, as the same attempt, and
runs on another host."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc
import pytest

from peloton.api.v1 import job_pb2, job_pb2_grpc
from peloton.domain.launch import GangLaunch, LaunchResult
from peloton.domain.states import TaskState
from peloton.server import Daemon
from tests.e2e.harness import wait_until


def test_a_gang_whose_host_is_drained_before_its_launch_runs_whole_elsewhere_as_the_same_attempt(
        daemon: Daemon, monkeypatch: pytest.MonkeyPatch) -> None:
    hm, jm = daemon.hostmgr, daemon.jobmgr
    assert hm is not None and jm is not None
    launch = hm.launch
    drained: list[str] = []

    def drain_first(gangs: Sequence[GangLaunch]) -> list[LaunchResult]:
        # the operator's drain lands between the gang's claim and its launch (a drain without a deadline: what
        # started there would stay)
        if not drained:
            drained.append(gangs[0].tasks[0].hostname)
            hm.drain(drained[0], 0.0)
        return launch(gangs)

    monkeypatch.setattr(hm, "launch", drain_first)
    s = job_pb2.JobSpec(name="g", instances=2)  # one gang of two, one host's GPUs
    s.task.command = "train.py"
    s.task.resources.cpu = 1
    s.task.resources.mem = "1Gi"
    s.task.resources.gpu = 1
    s.task.env["PELOTON_SIM_DURATION"] = "3600s"
    with grpc.insecure_channel(daemon.address) as ch:
        job = job_pb2_grpc.JobServiceStub(ch).CreateJob(job_pb2.CreateJobRequest(spec=s), timeout=10).job_id

    def running() -> list[Any] | None:
        tasks = jm.list_tasks(job)[0]
        return tasks if all(t.state == TaskState.RUNNING for t in tasks) else None

    tasks = wait_until(running, timeout=20, interval=0.05, what="the gang to run")
    assert drained
    assert all(t.host and t.host != drained[0] for t in tasks)  # none on the drained host, all placed anew
    assert [t.attempt for t in tasks] == [1, 1]  # refused, not failed: no attempt lost
    assert not any(t.hostname == drained[0] for t in hm.backend.running())
