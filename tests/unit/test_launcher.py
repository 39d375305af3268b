"""The launcher: placements are acknowledged to resmgr only once their intent is durable; what could not be
recorded goes back to the queue and its claim is released; stale placements are released; a refused launch goes
back to the queue without costing an attempt, and so does a launch never sent (no connection to the host manager); a
failed one costs one; a call cut once sent leaves the gang LAUNCHING for the reconciler."""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import Callable
from typing import Any

import grpc
import pytest

from peloton.api import convert
from peloton.api.clients import GangKey, Placed
from peloton.api.grpc_clients import ConnectedStub, GrpcHostManager
from peloton.api.v1 import internal_pb2_grpc
from peloton.domain.launch import GangLaunch, LaunchOutcome, LaunchResult
from peloton.domain.placement import GangPlacement, MemberAssignment
from peloton.domain.resources import Resources
from peloton.domain.spec import JobSpec
from peloton.domain.states import GangState, TaskState
from peloton.errors import Unavailable
from peloton.jobmgr import gang_policy as policy
from peloton.jobmgr.launcher import Launcher
from peloton.jobmgr.writer import Views


class FakeWriter:
    def __init__(self, views: Views, fail: Exception | None = None) -> None:
        self.views = views
        self.fail = fail

    def mutate(self, job_ids: Any, apply: Callable[[Views, float], policy.Effects], check: Any = None
               ) -> policy.Effects:
        if self.fail is not None:
            raise self.fail
        return apply({j: self.views[j] for j in job_ids if j in self.views}, 100.0)

    def submit(self, m: Any) -> None:
        m.apply({j: self.views[j] for j in m.job_ids if j in self.views}, 100.0)


class FakeResmgr:
    def __init__(self, placements: list[GangPlacement]) -> None:
        self.placements = placements
        self.acks: list[tuple[list[tuple[str, int]], list[tuple[str, int]]]] = []
        self.fail: Exception | None = None  # what the next polls raise

    def get_placements(self, max_placements: int, timeout_s: float, consumer: str,
                       ack_done: list[GangKey] = []) -> Placed:  # noqa: B006 - never changed
        if self.fail is not None:
            raise self.fail
        if ack_done:
            self.acks.append((list(ack_done), []))
        out = Placed(self.placements, [], [], "")
        self.placements = []
        return out

    def ack_placements(self, done: list[GangKey], retry: list[GangKey]) -> None:
        self.acks.append((list(done), list(retry)))


class FakeHostmgr:
    def __init__(self, outcome: LaunchOutcome = LaunchOutcome.OK, message: str = "") -> None:
        self.outcome = outcome
        self.message = message
        self.released: list[tuple[str, int]] = []
        self.launched: list[list[str]] = []

    def release_claims(self, gangs: list[GangKey]) -> None:
        self.released += gangs

    def launch(self, gangs: list[GangLaunch]) -> list[LaunchResult]:
        self.launched += [[t.task_id for t in g.tasks] for g in gangs]
        return [LaunchResult(g.gang_id, g.attempt, self.outcome, g.tasks[0].task_id, self.message) for g in gangs]


def job(job_id: str) -> policy.JobView:
    spec = JobSpec(name="x", instances=2, command="true", resources=Resources(cpu=1, mem=64))
    return policy.new_job_view(*policy.new_job_records(job_id, spec, 1.0))


def placed(jv: policy.JobView) -> GangPlacement:
    g = jv.gangs[0].gang
    return GangPlacement(g.gang_id, jv.job.id, g.attempt, tuple(
        MemberAssignment(t.instance, t.task_id, "h1", "10.0.0.1", Resources(cpu=1, mem=64), (), (31000 + t.instance,))
        for t in jv.gangs[0].members()))


def run(views: Views, placements: list[GangPlacement], writer_fail: Exception | None = None,
        hm: FakeHostmgr | None = None) -> tuple[FakeResmgr, FakeHostmgr]:
    rm, hm = FakeResmgr(placements), hm or FakeHostmgr()
    launcher = Launcher(FakeWriter(views, writer_fail), rm, hm)  # type: ignore[arg-type]
    launcher.launch_once(timeout_ms=0)
    launcher.launch_once(timeout_ms=0)  # the next poll acknowledges what the pass made durable
    return rm, hm


def test_intents_are_acknowledged_once_durable_then_launched() -> None:
    a = job("a")
    rm, hm = run({"a": a}, [placed(a)])
    assert rm.acks == [([("a/0", 1)], [])]
    assert hm.launched == [["a-0-1", "a-1-1"]] and hm.released == []
    assert a.gangs[0].gang.state == GangState.LAUNCHING and a.tasks[1].ports == [31001]


def test_a_poll_that_fails_keeps_its_acknowledgements_for_the_next() -> None:
    a = job("a")
    rm, hm = FakeResmgr([placed(a)]), FakeHostmgr()
    launcher = Launcher(FakeWriter({"a": a}), rm, hm)  # type: ignore[arg-type]
    launcher.launch_once(timeout_ms=0)
    assert rm.acks == [] and hm.launched == [["a-0-1", "a-1-1"]]  # launched; acknowledged with the next poll
    rm.fail = Unavailable("resmgr away")
    with pytest.raises(Unavailable):
        launcher.launch_once(timeout_ms=0)
    rm.fail = None
    launcher.launch_once(timeout_ms=0)
    launcher.launch_once(timeout_ms=0)
    assert rm.acks == [([("a/0", 1)], [])]  # once


def test_a_store_that_is_down_sends_the_placements_back_and_releases_their_claims() -> None:
    a, b = job("a"), job("b")
    rm, hm = FakeResmgr([placed(a), placed(b)]), FakeHostmgr()
    with pytest.raises(Unavailable):
        Launcher(FakeWriter({}, Unavailable("store down")), rm, hm).launch_once(timeout_ms=0)  # type: ignore[arg-type]
    assert rm.acks == [([], [("a/0", 1), ("b/0", 1)])]  # back to resmgr's queue, none forgotten
    assert sorted(hm.released) == [("a/0", 1), ("b/0", 1)] and hm.launched == []


def test_stale_placements_are_forgotten_and_their_claims_released() -> None:
    a, stopped = job("a"), job("s")
    policy.stop_job(stopped, 5.0)
    rm, hm = run({"a": a, "s": stopped}, [placed(a), placed(stopped)])
    assert rm.acks == [([("a/0", 1), ("s/0", 1)], [])]
    assert hm.released == [("s/0", 1)] and hm.launched == [["a-0-1", "a-1-1"]]


def test_a_refused_launch_goes_back_to_the_queue_as_the_same_attempt() -> None:
    a = job("a")
    run({"a": a}, [placed(a)], hm=FakeHostmgr(LaunchOutcome.REFUSED, "the claim expired"))
    g = a.gangs[0].gang
    assert g.state == GangState.QUEUED and g.attempt == 1 and "launch refused" in g.reason
    assert all(t.state == TaskState.PENDING and t.host == "" for t in a.gangs[0].members())


def test_a_failed_launch_costs_an_attempt() -> None:
    a = job("a")
    run({"a": a}, [placed(a)], hm=FakeHostmgr(LaunchOutcome.FAILED, "cannot start"))
    g = a.gangs[0].gang
    assert g.state == GangState.QUEUED and g.attempt == 2 and "launch failed" in g.reason


def test_a_host_manager_that_cannot_be_reached_started_nothing_so_the_gang_is_queued_again_as_the_same_attempt(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A real channel to a port nobody listens on (a host manager failing over): the launch is not sent while the
    channel has no connection, tried again for a while, then given up. Nothing was started, so no attempt is
    used."""
    monkeypatch.setattr("peloton.jobmgr.launcher.UNREACHABLE_RETRY_S", 0.6)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: connections are refused
    a = job("a")
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        rm = FakeResmgr([placed(a)])
        hm = GrpcHostManager(ConnectedStub(internal_pb2_grpc.HostManagerInternalStub(ch), ch))
        Launcher(FakeWriter({"a": a}, None), rm, hm).launch_once(timeout_ms=0)  # type: ignore[arg-type]
    g = a.gangs[0].gang
    assert g.state == GangState.QUEUED and g.attempt == 1 and "could not be reached" in g.reason, g.reason
    assert all(t.state == TaskState.PENDING for t in a.gangs[0].members())


class _Dropped(grpc.RpcError):
    """A call cut once sent, in gRPC's words for a connection it could not make: the text does not matter."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "failed to connect to all addresses; Socket closed"


def test_a_launch_call_cut_once_sent_leaves_the_gang_launching_for_the_reconciler() -> None:
    class Cut:
        def LaunchGangs(self, req: Any, timeout: float) -> Any:
            raise _Dropped()

    a = job("a")
    rm = FakeResmgr([placed(a)])
    Launcher(FakeWriter({"a": a}), rm, GrpcHostManager(Cut())).launch_once(timeout_ms=0)  # type: ignore[arg-type]
    assert a.gangs[0].gang.state == GangState.LAUNCHING and a.gangs[0].gang.attempt == 1


def test_each_member_carries_its_jobs_identity() -> None:
    """The identity decided at submit (run_as.py) goes to the backend as the member's user; a uid of the owner's
    has no account, so USER and LOGNAME name the owner; a job from before identities is marked so the backend
    vets its task.user."""
    def members(spec: JobSpec) -> list[Any]:
        jv = policy.new_job_view(*policy.new_job_records("j1", spec, 1.0))
        return list(Launcher._gang_launch(placed(jv), spec).tasks)

    base = JobSpec(name="x", instances=2, command="true", resources=Resources(cpu=1, mem=64), owner="alice",
                   user="ml-team")
    dyn = members(dataclasses.replace(base, user="", run_as="#70001"))
    assert {(m.user, m.legacy_user, m.env["USER"], m.env["LOGNAME"]) for m in dyn} == {("#70001", False, "alice",
                                                                                         "alice")}
    mine = members(dataclasses.replace(base, user="", run_as="#70001", env={"USER": "me"}))
    assert {m.env["USER"] for m in mine} == {"me"}  # the job's own env wins
    named = members(dataclasses.replace(base, run_as="ml-team"))
    assert {(m.user, m.legacy_user, "USER" in m.env) for m in named} == {("ml-team", False, False)}
    old = members(base)  # created before identities: run_as None
    assert {(m.user, m.legacy_user) for m in old} == {("ml-team", True)}
    # and it crosses the internal API as it is
    p = convert.launch_from_proto(convert.launch_to_proto(old[0]))
    assert (p.user, p.legacy_user) == ("ml-team", True)
