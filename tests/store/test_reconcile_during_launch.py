"""A full reconciliation that runs while a gang's launch is on its way (its intent committed: LAUNCHING; the host
manager not called yet), through the real components in one daemon (sim backend) on both stores. The backend does
not know the members yet and answers "unknown" (LOST): the gang was failed and started again as a new attempt
(one of its attempts used for nothing, a job with none left failed). Members whose launch is under way are left
out of the pass; the gang runs as the attempt it was launched as."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc
import pytest

from peloton.api.v1 import job_pb2, job_pb2_grpc
from peloton.domain.launch import GangLaunch, LaunchResult, TaskStatus
from peloton.domain.states import TaskState
from peloton.server import Daemon
from tests.e2e.harness import wait_until


def test_a_full_reconciliation_during_a_launch_leaves_the_gang_to_start_as_its_attempt(
        daemon: Daemon, monkeypatch: pytest.MonkeyPatch) -> None:
    hm, jm = daemon.hostmgr, daemon.jobmgr
    assert hm is not None and jm is not None
    launch = hm.launch
    asked: list[str] = []
    reconcile = hm.reconcile

    def recorded(task_ids: Sequence[str]) -> dict[str, TaskStatus]:
        asked.extend(task_ids)
        return reconcile(task_ids)

    passes: list[bool] = []

    def reconcile_first(gangs: Sequence[GangLaunch]) -> list[LaunchResult]:
        # the reconciler's full pass (every live member, every 10 minutes) lands between the gang's intent and its
        # launch call
        if not passes:
            jm._full_reconcile_at = 0.0
            passes.append(jm.reconcile_once())
        return launch(gangs)

    monkeypatch.setattr(hm, "reconcile", recorded)
    monkeypatch.setattr(hm, "launch", reconcile_first)
    s = job_pb2.JobSpec(name="g", instances=2)
    s.task.command = "train.py"
    s.task.resources.cpu = 1
    s.task.resources.mem = "1Gi"
    s.task.env["PELOTON_SIM_DURATION"] = "3600s"
    with grpc.insecure_channel(daemon.address) as ch:
        job = job_pb2_grpc.JobServiceStub(ch).CreateJob(job_pb2.CreateJobRequest(spec=s), timeout=10).job_id

    def running() -> list[Any] | None:
        tasks = jm.list_tasks(job)[0]
        return tasks if all(t.state == TaskState.RUNNING for t in tasks) else None

    tasks = wait_until(running, timeout=20, interval=0.05, what="the gang to run")
    assert passes  # the pass ran in the window
    assert [t.attempt for t in tasks] == [1, 1]  # no attempt lost
    assert not any(tid.startswith(job) for tid in asked)  # its members were not asked about while launching
