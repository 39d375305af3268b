"""HostManager: the status-event log, acknowledgement after persistence, and leases over a backend."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from peloton.domain.placement import HostOffer, MemberAssignment
from peloton.domain.resources import Resources
from peloton.domain.states import TaskState
from peloton.errors import Conflict
from peloton.hostmgr.backend import HostInfo, LaunchSpec, StatusCallback, TaskStatus
from peloton.hostmgr.manager import HostManager


class FakeBackend:
    def __init__(self) -> None:
        self.cb: StatusCallback | None = None
        self.acked: list[list[str]] = []
        self.launched: list[str] = []

    def start(self, on_status: StatusCallback) -> None:
        self.cb = on_status

    def stop(self) -> None:
        pass

    def offers(self) -> list[HostOffer]:
        r = Resources(cpu=4, mem=1024, gpu=2, ports=2)
        return [HostOffer("h1", "10.0.0.1", r, (0, 1), (31000, 31001), {}, r, True)]

    def hosts(self) -> list[HostInfo]:
        return []

    def launch(self, tasks: Sequence[LaunchSpec]) -> None:
        self.launched += [t.task_id for t in tasks]

    def kill(self, task_ids: Sequence[str]) -> None:
        pass

    def reconcile(self, task_ids: Sequence[str]) -> dict[str, TaskStatus]:
        return {}

    def running_task_ids(self) -> set[str]:
        return set()

    def acknowledge(self, acks: Sequence[str]) -> None:
        self.acked.append(list(acks))

    def read_log(self, task_id: str, stream: str, tail_bytes: int) -> bytes:
        return b""


def test_updates_are_acknowledged_only_after_the_caller_says_they_are_persisted() -> None:
    be = FakeBackend()
    hm = HostManager(be, clock=lambda: 100.0)
    hm.start()
    assert be.cb is not None
    be.cb(TaskStatus("j-0-1", TaskState.RUNNING, 1.0, ack="a1"))
    be.cb(TaskStatus("j-1-1", TaskState.RUNNING, 1.0))  # nothing to acknowledge (no uuid)
    be.cb(TaskStatus("j-2-1", TaskState.RUNNING, 1.0, ack="a3"))
    events = hm.wait_events(0, 10, 0.1)
    assert [seq for seq, _ in events] == [1, 2, 3]
    assert be.acked == []
    assert hm.ack_events(2) == 1
    assert be.acked == [["a1"]]
    assert hm.ack_events(2) == 0  # never twice
    assert hm.ack_events(3) == 1
    assert be.acked == [["a1"], ["a3"]]
    assert hm.wait_events(3, 10, 0.05) == []


def test_launch_consumes_the_lease_and_a_stale_lease_is_a_conflict() -> None:
    now = [100.0]
    be = FakeBackend()
    hm = HostManager(be, clock=lambda: now[0])
    lease, offers = hm.acquire_offers(30)
    assert offers[0].gpu_ids == (0, 1)
    _, again = hm.acquire_offers(30)
    assert again[0].gpu_ids == () and again[0].free.gpu == 0  # held by the first lease
    spec = LaunchSpec("j-0-1", "j", 0, 1, "h1", "true", {}, Resources(cpu=1, mem=10, gpu=1, ports=1), (0,), (31000,))
    hm.retain(lease, [MemberAssignment(0, "j-0-1", "h1", "10.0.0.1", spec.resources, (0,), (31000,))])
    hm.launch_gang(lease, [spec])
    assert be.launched == ["j-0-1"]
    with pytest.raises(Conflict):
        hm.launch_gang(lease, [spec])  # consumed
    lease2, _ = hm.acquire_offers(1)
    now[0] += 5
    with pytest.raises(Conflict):
        hm.launch_gang(lease2, [spec])  # expired


def test_a_permanent_member_failure_fails_the_job_instead_of_restarting() -> None:
    from peloton.domain.resources import Resources as R
    from peloton.domain.spec import JobSpec
    from peloton.jobmgr import gang_policy as policy

    spec = JobSpec(name="x", instances=2, command="true", resources=R(cpu=1), max_attempts=3)
    job, gangs, tasks = policy.new_job_records("abc", spec, 1.0)
    jv = policy.JobView(job, {0: policy.GangView(gangs[0], {t.instance: t for t in tasks})})
    for t in tasks:
        t.state, t.host = TaskState.LAUNCHING, "h"
    gangs[0].state = policy.G.LAUNCHING
    eff = policy.apply_status(jv, TaskStatus("abc-0-1", TaskState.FAILED, 2.0, "h", reason="TASK_ERROR",
                                             message="invalid", permanent=True), 2.0)
    assert gangs[0].attempt == 1 and not eff.enqueue
    assert eff.kill == ["abc-1-1"]
    assert "will not be retried" in job.reason
    policy.apply_status(jv, TaskStatus("abc-1-1", TaskState.KILLED, 3.0, "h"), 3.0)
    assert job.state.value == "FAILED"
