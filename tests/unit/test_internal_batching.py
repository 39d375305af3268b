"""What rides together across the internal services (issue 24, the split roles' CPU): a batch of side effects sends
its releases and its new gangs to resmgr in one EnqueueGangs (releases first, as two calls would), and the
task-events loop acknowledges a batch with its next WaitTaskEvents (only on the stream it belongs to), and a launch
sends what a gang's members share (the hostfile, the common environment) once for the gang. Both over real gRPC (a
split deployment's typed clients) and in one process."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from prometheus_client import REGISTRY

from peloton.api import convert
from peloton.api.clients import HostManagerClient, ResourceManagerClient
from peloton.api.grpc_clients import ConnectedStub, GrpcHostManager, GrpcResourceManager
from peloton.api.v1 import internal_pb2
from peloton.domain.launch import GangLaunch, LaunchOutcome, LaunchResult, LaunchSpec, TaskStatus
from peloton.domain.model import ResourcePool
from peloton.domain.placement import GangRequest, MemberRequest
from peloton.domain.resources import Resources
from peloton.domain.states import TaskState
from peloton.errors import InvalidArgument, ResourceExhausted, Unavailable
from peloton.hostmgr.manager import HostManager
from peloton.jobmgr import effects
from peloton.jobmgr.effects import Outbox, SideEffects, resmgr_call
from peloton.resmgr.inprocess import InProcessResourceManager
from peloton.resmgr.manager import ResourceManager
from tests.unit.internal_services import resmgr_and_hostmgr_clients
from tests.unit.test_hostmgr_manager import FakeBackend, placed


def gang(job: str, attempt: int = 1) -> GangRequest:
    r = Resources(cpu=1, mem=10, gpu=1)
    return GangRequest(gang_id=f"{job}/0", job_id=job, attempt=attempt,
                       members=(MemberRequest(0, f"{job}-0-{attempt}", r),))


# --- the split of a batch into calls (pure) --------------------------------------------------------------------


def test_releases_and_enqueues_that_fit_a_chunk_go_in_one_call() -> None:
    a, b = (gang("a"), False), (gang("b"), True)
    assert resmgr_call([("x/0", 1), ("y/0", 2)], [a, b], 10) == ([("x/0", 1), ("y/0", 2)], [a, b])
    assert resmgr_call([], [a], 10) == ([], [a])
    assert resmgr_call([("x/0", 1)], [], 10) == ([("x/0", 1)], [])


def test_enqueues_wait_for_the_last_chunk_of_releases() -> None:
    """Every release goes before any enqueue, as when they were two calls: the first chunks of releases go alone."""
    rel = [(f"r{i}/0", 1) for i in range(5)]
    enq = [(gang(f"e{i}"), False) for i in range(3)]
    assert resmgr_call(rel, enq, 2) == (rel[:2], [])
    assert resmgr_call(rel[4:], enq, 2) == (rel[4:], enq[:2])


class Recording:
    """A ResourceManagerClient's enqueue and remove_gangs, recorded; `fail_at`: the call (0-based) that raises."""

    def __init__(self, fail_at: int = -1) -> None:
        self.calls: list[tuple[str, list[str], list[tuple[str, int]]]] = []
        self.ids: list[str] = []  # each try's call id (a failed try's too)
        self.fail_at = fail_at

    def _record(self, call: tuple[str, list[str], list[tuple[str, int]]]) -> None:
        if len(self.calls) == self.fail_at:
            self.fail_at = -1
            raise Unavailable("resmgr away")
        self.calls.append(call)

    def enqueue(self, gangs: Sequence[GangRequest], running: Sequence[GangRequest],
                remove: Sequence[tuple[str, int]] = (), call_id: str = "") -> None:
        self.ids.append(call_id)
        self._record(("enqueue", [g.gang_id for g in [*gangs, *running]], list(remove)))

    def remove_gangs(self, gangs: Sequence[tuple[str, int]], call_id: str = "") -> None:
        self.ids.append(call_id)
        self._record(("remove", [], list(gangs)))


def test_the_side_effects_send_a_batch_in_as_few_calls_as_keep_its_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(effects, "CHUNK", 2)
    rm = Recording()
    out = Outbox(release=[("r0/0", 1), ("r1/0", 1), ("r2/0", 1)],
                 enqueue=[(gang("e0"), False), (gang("e1"), True), (gang("e2"), False)])
    SideEffects(rm, None)._send(out)  # type: ignore[arg-type]
    assert rm.calls == [("remove", [], [("r0/0", 1), ("r1/0", 1)]),
                        ("enqueue", ["e0/0", "e1/0"], [("r2/0", 1)]),
                        ("enqueue", ["e2/0"], [])]
    assert not len(out)


def test_a_failed_call_leaves_only_what_was_not_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(effects, "CHUNK", 2)
    rm = Recording(fail_at=1)
    out = Outbox(release=[("r0/0", 1), ("r1/0", 1), ("r2/0", 1)], enqueue=[(gang("e0"), False)])
    with pytest.raises(Unavailable):
        SideEffects(rm, None)._send(out)  # type: ignore[arg-type]
    assert out.release == [("r2/0", 1)] and [g.gang_id for g, _ in out.enqueue] == ["e0/0"]
    SideEffects(rm, None)._send(out)  # type: ignore[arg-type]  # the retry sends the rest, once
    assert rm.calls == [("remove", [], [("r0/0", 1), ("r1/0", 1)]), ("enqueue", ["e0/0"], [("r2/0", 1)])]


def test_a_failed_call_is_tried_again_as_it_was_with_the_id_of_its_first_try(monkeypatch: pytest.MonkeyPatch) -> None:
    """resmgr applies a call once by its id (its answer may have been all that was lost), so a try again must be
    the same call: the same releases and enqueues, though more arrived meanwhile, which go in a call of their own."""
    monkeypatch.setattr(effects, "CHUNK", 4)
    rm = Recording(fail_at=0)
    fx = SideEffects(rm, None)  # type: ignore[arg-type]
    out = Outbox(release=[("r0/0", 1)], enqueue=[(gang("e0"), False)])
    with pytest.raises(Unavailable):
        fx._send(out)
    out.merge(Outbox(release=[("r1/0", 1)], enqueue=[(gang("e1"), False)]))  # (what a retry's outbox is)
    fx._send(out)
    assert rm.calls == [("enqueue", ["e0/0"], [("r0/0", 1)]), ("enqueue", ["e1/0"], [("r1/0", 1)])]
    assert rm.ids[0] == rm.ids[1] != rm.ids[2] and all(rm.ids)  # the failed try and its try again: one id
    assert not len(out)


def test_a_release_submitted_after_an_enqueue_of_the_same_gang_is_not_sent_before_it() -> None:
    """Batches submitted while the sender is busy are sent together, and a call sends its releases first. A gang
    created and stopped in that time (its enqueue in one batch, its release in the next) was released in resmgr
    before it was queued there: queued for ever for a stopped job, then admitted, placed, and its placement dropped
    as stale, so its pool's share stayed counted for ever. The later release now takes the earlier enqueue back."""
    rm = ResourceManager(lambda: [ResourcePool("/")], clock=lambda: 1000.0)
    fx = SideEffects(InProcessResourceManager(rm), None)  # type: ignore[arg-type]
    fx.submit(Outbox(enqueue=[(gang("a"), False), (gang("b"), False)]))  # created (the sender busy meanwhile)
    fx.submit(Outbox(release=[("a/0", 1)]))  # a stopped before its enqueue went
    fx.submit(Outbox(enqueue=[(gang("c"), True)]))  # c adopted, then ended
    fx.submit(Outbox(release=[("c/0", 1)], enqueue=[(gang("c", attempt=2), False)]))  # ... its next attempt queued
    fx.start()
    try:
        assert fx.drain(10)
    finally:
        fx.stop()
    assert sorted((g.gang_id, g.attempt) for g in rm.queue()[0]) == [("b/0", 1), ("c/0", 2)]
    assert rm.usage()[0] == {}  # nothing held for a, or for c's first attempt


def test_an_enqueue_whose_call_failed_is_tried_again_before_a_later_release_of_its_gang(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A call tried again must be the same call (resmgr may have applied it): its enqueue is not taken back by a
    release that arrived meanwhile, which goes in the next call."""
    monkeypatch.setattr(effects, "SEND_BACKOFF", effects.Backoff(0.01, 0.01))
    rm = Recording(fail_at=0)
    fx = SideEffects(rm, None)  # type: ignore[arg-type]
    gate = threading.Event()
    real = rm._record

    def failing_then_held(call: tuple[str, list[str], list[tuple[str, int]]]) -> None:
        try:
            real(call)
        finally:
            gate.wait(10)

    rm._record = failing_then_held  # type: ignore[method-assign]
    fx.start()
    try:
        fx.submit(Outbox(enqueue=[(gang("a"), False)]))
        while not rm.ids:  # its first try is on its way (and fails)
            threading.Event().wait(0.01)
        fx.submit(Outbox(release=[("a/0", 1)]))
        gate.set()
        assert fx.drain(10)
    finally:
        fx.stop()
    assert rm.calls == [("enqueue", ["a/0"], []), ("remove", [], [("a/0", 1)])]
    assert rm.ids[0] == rm.ids[1] != rm.ids[2]


def test_a_mark_is_reached_only_once_what_was_submitted_before_it_went_through(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The queue check asks resmgr about gangs only after their enqueues went: wait_sent(mark) is False while a
    send before the mark keeps failing, and True once it went (a submit after the mark is not waited for)."""
    monkeypatch.setattr(effects, "SEND_BACKOFF", effects.Backoff(0.01, 0.01))
    rm = Recording(fail_at=0)
    fx = SideEffects(rm, None)  # type: ignore[arg-type]
    assert fx.wait_sent(fx.mark(), 0)  # nothing submitted: reached
    gate = threading.Event()
    real = rm._record

    def held(call: tuple[str, list[str], list[tuple[str, int]]]) -> None:
        gate.wait(10)
        real(call)

    rm._record = held  # type: ignore[method-assign]
    fx.start()
    try:
        fx.submit(Outbox(enqueue=[(gang("e0"), False)]))
        mark = fx.mark()
        assert not fx.wait_sent(mark, 0.2)  # on its way (held, then failing once)
        gate.set()
        assert fx.wait_sent(mark, 10)
        assert rm.calls == [("enqueue", ["e0/0"], [])]
        gate.clear()
        fx.submit(Outbox(enqueue=[(gang("e1"), False)]))  # after the mark
        assert fx.wait_sent(mark, 0)
        gate.set()
    finally:
        fx.stop()


# --- a call refused for good (a bug, a version skew, a message too large) -----------------------------------------


class Refusing:
    """A resmgr client that refuses for good (InvalidArgument) a call carrying a gang or release of `bad`, and one of
    more than `most` releases and gangs (ResourceExhausted, as gRPC's bound on a message's size); `away` calls fail
    first as if resmgr could not be reached. What went through: `sent`, in order, with each call's id."""

    def __init__(self, bad: set[str] = frozenset(), most: int = 1_000_000, away: int = 0) -> None:  # type: ignore[assignment]
        self.bad, self.most, self.away = bad, most, away
        self.tries = 0
        self.sent: list[tuple[str, list[str]]] = []  # (call id, releases and gangs: "-r0/0", "+e0/0", "@a0/0")
        self.ids: list[str] = []

    def _call(self, call_id: str, items: list[str]) -> None:
        self.tries += 1
        self.ids.append(call_id)
        if self.away:
            self.away -= 1
            raise Unavailable("resmgr away")
        if len(items) > self.most:
            raise ResourceExhausted(f"Received message larger than max ({len(items)} vs. {self.most})")
        bad = [i for i in items if i[1:] in self.bad]
        if bad:
            raise InvalidArgument(f"gangs: {bad[0][1:]} is bad")
        self.sent.append((call_id, items))

    def enqueue(self, gangs: Sequence[GangRequest], running: Sequence[GangRequest],
                remove: Sequence[tuple[str, int]] = (), call_id: str = "") -> None:
        self._call(call_id, [*(f"-{g}" for g, _ in remove), *(f"+{g.gang_id}" for g in gangs),
                             *(f"@{g.gang_id}" for g in running)])

    def remove_gangs(self, gangs: Sequence[tuple[str, int]], call_id: str = "") -> None:
        self._call(call_id, [f"-{g}" for g, _ in gangs])

    def items(self) -> list[str]:
        return [i for _, items in self.sent for i in items]


def refused_total(kind: str) -> float:
    """`peloton_jobmgr_side_effects_refused_total{kind}` so far."""
    return REGISTRY.get_sample_value("peloton_jobmgr_side_effects_refused_total", {"kind": kind}) or 0.0


def test_a_call_refused_for_good_is_split_to_send_all_but_the_gang_it_refuses() -> None:
    """A call resmgr refused for good (InvalidArgument: a bug, a version skew) was tried again for ever, and every
    later release and enqueue waited behind it. Now its halves go, each a call of its own, down to the one gang
    refused, which is dropped and handed back to the job manager; the rest goes, in order."""
    rm = Refusing(bad={"e5/0"})
    fx = SideEffects(rm, None)  # type: ignore[arg-type]
    before = refused_total("enqueue")
    rel = [(f"r{i}/0", 1) for i in range(3)]
    enq = [(gang(f"e{i}"), i == 7) for i in range(9)]
    out = Outbox(release=list(rel), enqueue=list(enq))
    fx._send(out)
    assert not len(out)
    got = rm.items()  # (a call's adoptions follow its new gangs: the order of a call's own items does not matter)
    assert got[:3] == [f"-r{i}/0" for i in range(3)]
    assert sorted(got[3:]) == sorted(f"{'@' if i == 7 else '+'}e{i}/0" for i in range(9) if i != 5)
    assert fx.take_refused() == [effects.Refusal("e5/0", 1, False, "gangs: e5/0 is bad")] and fx.take_refused() == []
    assert refused_total("enqueue") == before + 1
    assert len(set(rm.ids)) == len(rm.ids)  # each a call of its own: a refused call was not applied
    assert rm.tries <= 2 * 4 + 1  # a bisection: about two calls a halving
    fx._send(Outbox(enqueue=[(gang("later"), False)]))  # nothing waits behind it any more
    assert rm.sent[-1][1] == ["+later/0"] and len(rm.sent[-1]) == 2


def test_a_call_too_large_for_a_message_goes_in_halves_and_then_whole_again() -> None:
    rm = Refusing(most=3)
    fx = SideEffects(rm, None)  # type: ignore[arg-type]
    out = Outbox(release=[("r0/0", 1)], enqueue=[(gang(f"e{i}"), False) for i in range(9)])
    fx._send(out)
    assert rm.items() == ["-r0/0", *(f"+e{i}/0" for i in range(9))] and fx.take_refused() == []
    assert [len(items) for _, items in rm.sent] == [3, 2, 3, 2]  # 10 -> 5 -> 3 + 2, 5 -> 3 + 2
    rm.most = 100
    fx._send(Outbox(enqueue=[(gang(f"f{i}"), False) for i in range(9)]))  # the halving was for that call alone
    assert len(rm.sent[-1][1]) == 9


def test_a_release_refused_for_good_is_dropped_and_counted() -> None:
    rm = Refusing(bad={"r1/0"})
    fx = SideEffects(rm, None)  # type: ignore[arg-type]
    before = refused_total("release")
    fx._send(Outbox(release=[("r0/0", 1), ("r1/0", 1), ("r2/0", 1)], enqueue=[(gang("e0"), False)]))
    assert rm.items() == ["-r0/0", "-r2/0", "+e0/0"] and fx.take_refused() == []
    assert refused_total("release") == before + 1


def test_a_half_that_fails_for_a_while_is_tried_again_as_the_same_call() -> None:
    """Only a refusal for good splits a call: one that fails otherwise (resmgr away) is tried again as it was, with
    the id of its first try (resmgr may have applied it), a half being isolated included."""
    rm = Refusing(bad={"e3/0"})
    fx = SideEffects(rm, None)  # type: ignore[arg-type]
    out = Outbox(enqueue=[(gang(f"e{i}"), False) for i in range(4)])
    with pytest.raises(InvalidArgument):  # (not from _send: the client's first try, for the test's own check)
        rm.enqueue([g for g, _ in out.enqueue], [], call_id="x")
    rm.tries, rm.ids = 0, []
    rm.away = 1
    real = rm._call

    def away_at_second(call_id: str, items: list[str]) -> None:
        rm.away = 1 if rm.tries == 1 else 0  # the first half, after the refusal of the whole
        real(call_id, items)

    rm._call = away_at_second  # type: ignore[method-assign]
    with pytest.raises(Unavailable):
        fx._send(out)
    fx._send(out)
    assert rm.ids[1] == rm.ids[2] and len(set(rm.ids)) == len(rm.ids) - 1
    assert rm.items() == ["+e0/0", "+e1/0", "+e2/0"] and [r.gang_id for r in fx.take_refused()] == ["e3/0"]


def test_a_refused_call_no_longer_holds_up_the_sender(monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the sender's thread: before, a call refused for good was tried again with back-off for ever (the
    outbox never drained; what followed it never went)."""
    monkeypatch.setattr(effects, "SEND_BACKOFF", effects.Backoff(0.01, 0.01))
    rm = Refusing(bad={"a/0"})
    fx = SideEffects(rm, None)  # type: ignore[arg-type]
    fx.start()
    try:
        fx.submit(Outbox(enqueue=[(gang("a"), False), (gang("b"), False)]))
        fx.submit(Outbox(release=[("c/0", 1)], enqueue=[(gang("d"), False)]))
        assert fx.drain(5)
    finally:
        fx.stop()
    assert rm.items() == ["-c/0", "+b/0", "+d/0"] and [r.gang_id for r in fx.take_refused()] == ["a/0"]


def test_only_a_refusal_of_the_request_itself_is_for_good() -> None:
    from peloton.api.codes import error_for

    for code in ("INVALID_ARGUMENT", "OUT_OF_RANGE", "RESOURCE_EXHAUSTED"):
        assert effects.refused_for_good(error_for(code, "x")), code
    for code in ("UNAVAILABLE", "DEADLINE_EXCEEDED", "FAILED_PRECONDITION", "UNAUTHENTICATED", "INTERNAL",
                 "UNIMPLEMENTED", "UNKNOWN", "ABORTED"):
        assert not effects.refused_for_good(error_for(code, "x")), code
    assert not effects.refused_for_good(RuntimeError("a bug of the sender"))


def test_a_request_the_message_cannot_hold_is_refused_for_good_by_the_client() -> None:
    old = OldPeer()
    with pytest.raises(InvalidArgument, match="EnqueueGangs: the request cannot be encoded"):
        GrpcResourceManager(old).enqueue([gang("a", attempt=2**40)], [])
    with pytest.raises(InvalidArgument, match="RemoveGangs: the request cannot be encoded"):
        GrpcResourceManager(old).remove_gangs([("a/0", 2**40)])
    assert old.sent == []


class RefusingKills:
    """A host manager client that refuses for good (InvalidArgument) a kill call naming a task of `bad`; `away_at`:
    the try (0-based) that fails as if the host manager could not be reached. What went through: `killed`."""

    def __init__(self, bad: set[str], away_at: int = -1) -> None:
        self.bad, self.away_at = bad, away_at
        self.tries = 0
        self.killed: list[tuple[str, float | None]] = []

    def kill(self, task_ids: Sequence[str], grace_s: float | None = None) -> None:
        self.tries += 1
        if self.tries - 1 == self.away_at:
            raise Unavailable("host manager away")
        bad = [t for t in task_ids if t in self.bad]
        if bad:
            raise InvalidArgument(f"task_ids: {bad[0]} is bad")
        self.killed += [(t, grace_s) for t in task_ids]


def test_a_kill_refused_for_good_is_dropped_once_and_the_rest_go() -> None:
    """Kills had no refusal for good: a kill call the host manager refused (a bug, a version skew) was tried again for
    ever, and every later kill, release and enqueue waited behind it. Now it is split in halves down to the one task
    it refuses, dropped and counted once, though a try in between failed for a while."""
    hm = RefusingKills(bad={"k5", "p1"}, away_at=3)
    rm = Refusing()
    fx = SideEffects(rm, hm)  # type: ignore[arg-type]
    kills, preempts = refused_total("kill"), refused_total("preempt")
    out = Outbox(kill=[f"k{i}" for i in range(8)], preempt=[("p0", 5.0), ("p1", 5.0), ("p2", 30.0)],
                 release=[("r0/0", 1)], enqueue=[(gang("e0"), False)])
    with pytest.raises(Unavailable):
        fx._send(out)
    fx._send(out)  # the try again: what was sent or refused before the failure is not sent again
    assert not len(out)
    assert sorted(t for t, _ in hm.killed if t.startswith("k")) == [f"k{i}" for i in range(8) if i != 5]
    assert [x for x in hm.killed if x[0].startswith("p")] == [("p0", 5.0), ("p2", 30.0)]
    assert rm.items() == ["-r0/0", "+e0/0"]
    assert refused_total("kill") == kills + 1 and refused_total("preempt") == preempts + 1


def test_a_kill_the_client_cannot_encode_does_not_hold_up_the_sender(monkeypatch: pytest.MonkeyPatch) -> None:
    """Over real gRPC, through the sender's thread: a task id that is not UTF-8 raised the encoder's own error, taken
    for a bug of the sender and tried again for ever (the outbox never drained: the enqueue after it never went)."""
    monkeypatch.setattr(effects, "SEND_BACKOFF", effects.Backoff(0.01, 0.01))
    rm = ResourceManager(lambda: [ResourcePool("/")], clock=lambda: 1000.0)
    be = FakeBackend()
    hm = HostManager(be, clock=lambda: 1000.0, claim_ttl_s=3600)
    hm.start()
    try:
        with resmgr_and_hostmgr_clients("grpc", rm, hm) as (rmc, hmc):
            fx = SideEffects(rmc, hmc)
            fx.start()
            try:
                fx.submit(Outbox(kill=["t1", "t\udc80", "t2"], preempt=[("p1", 5.0)], enqueue=[(gang("a"), False)]))
                assert fx.drain(5)
            finally:
                fx.stop()
    finally:
        hm.stop()
    assert be.killed == ["t1", "t2", "p1"]
    assert [(g.gang_id, g.attempt) for g in rm.queue()[0]] == [("a/0", 1)]


# --- over gRPC and in one process ------------------------------------------------------------------------------


@pytest.fixture(params=["grpc", "inprocess"])
def clients(request: pytest.FixtureRequest) -> Iterator[tuple[ResourceManagerClient, HostManagerClient,
                                                              ResourceManager, HostManager, FakeBackend]]:
    rm = ResourceManager(lambda: [ResourcePool("/")], clock=lambda: 1000.0)
    be = FakeBackend()
    hm = HostManager(be, clock=lambda: 1000.0, claim_ttl_s=3600)
    hm.start()
    try:
        with resmgr_and_hostmgr_clients(request.param, rm, hm) as (rmc, hmc):
            yield rmc, hmc, rm, hm, be
    finally:
        hm.stop()


def test_an_enqueue_forgets_what_it_removes_first(clients: tuple) -> None:
    rmc, _, rm, _, _ = clients
    rmc.enqueue([gang("a"), gang("b")], [])
    rmc.enqueue([gang("a", attempt=2), gang("c")], [], remove=[("a/0", 1), ("b/0", 1)])
    queued, total = rm.queue()
    assert total == 2 and sorted((g.gang_id, g.attempt) for g in queued) == [("a/0", 2), ("c/0", 1)]
    rmc.enqueue([], [], remove=[("c/0", 1)])  # removals alone
    assert [(g.gang_id, g.attempt) for g in rm.queue()[0]] == [("a/0", 2)]


def test_a_call_tried_again_is_applied_once(clients: tuple) -> None:
    """Every try of one call of the side effects carries its id; resmgr applies it once, in-process and over gRPC."""
    rmc, _, rm, _, _ = clients
    rmc.enqueue([gang("a")], [], call_id="first")
    rmc.remove_gangs([("a/0", 1)], call_id="second")
    rmc.enqueue([gang("a")], [], call_id="first")  # the first call again (its answer lost): applied already
    rmc.remove_gangs([("a/0", 1)], call_id="second")
    assert rm.queue()[1] == 0
    rmc.enqueue([gang("a")], [], call_id="third")
    assert [(g.gang_id, g.attempt) for g in rm.queue()[0]] == [("a/0", 1)]


def test_a_poll_acknowledges_the_batch_before_it_only_on_its_stream(clients: tuple) -> None:
    _, hmc, _, hm, be = clients
    assert be.cb is not None
    be.cb(TaskStatus("j-0-1", TaskState.RUNNING, 1.0, ack="a1"))
    be.cb(TaskStatus("j-1-1", TaskState.RUNNING, 1.0, ack="a2"))
    r = hmc.wait_events(0, 1, 0.05)
    assert [seq for seq, _ in r.events] == [1] and be.acked == []
    r2 = hmc.wait_events(1, 10, 0.05, ack_up_to_seq=1, ack_stream_id="another stream")
    assert [seq for seq, _ in r2.events] == [2] and be.acked == []  # a restarted host manager's: ignored
    r3 = hmc.wait_events(2, 10, 0.05, ack_up_to_seq=2, ack_stream_id=r.stream_id)
    assert r3.events == [] and be.acked == [["a1", "a2"]]
    assert hm.wait_events(0, 10, 0.05) == ([], False)  # forgotten once acknowledged


def test_a_poll_for_placements_acknowledges_the_last_pass_first(clients: tuple) -> None:
    """A placement acknowledged with the next poll is forgotten: a job manager that takes over (another consumer)
    is not handed it again, as it is one that was not acknowledged."""
    from peloton.domain.placement import GangPlacement, MemberAssignment

    rmc, _, rm, _, _ = clients
    cluster = Resources(cpu=16, mem=1000, gpu=8)
    rm.enqueue([gang("a"), gang("b")])
    got = rm.dequeue(10, 0.05, cluster)
    rm.set_placements([GangPlacement(g.gang_id, g.job_id, g.attempt, tuple(
        MemberAssignment(m.instance, m.task_id, "h1", "127.0.0.1", m.resources) for m in g.members)) for g in got], [])
    first = rmc.get_placements(10, 0.05, "one")
    assert sorted(p.gang_id for p in first.placements) == ["a/0", "b/0"]
    assert rmc.get_placements(10, 0.05, "one", ack_done=[("a/0", 1)]).placements == []
    again = rmc.get_placements(10, 0.05, "two")  # "one" went away: what it did not acknowledge is handed again
    assert [p.gang_id for p in again.placements] == ["b/0"]


# --- a peer of an earlier release ignores the new fields: the client sends them the old way -----------------------


class OldPeer:
    """A stub of a release before these fields: every answer is the empty message of its method's response (no
    `removed` / `acked`; WaitTaskEvents of stream "s1"), every request recorded."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, Any]] = []

    def __getattr__(self, name: str) -> Any:
        def call(request: Any, timeout: float | None = None) -> Any:
            self.sent.append((name, request))
            if name == "WaitTaskEvents":
                return internal_pb2.WaitTaskEventsResponse(stream_id="s1")
            return getattr(internal_pb2, f"{name}Response")()

        return call


def test_removals_an_old_resmgr_ignored_are_sent_by_remove_gangs() -> None:
    old = OldPeer()
    GrpcResourceManager(old).enqueue([gang("a")], [], remove=[("b/0", 1)])
    assert [n for n, _ in old.sent] == ["EnqueueGangs", "RemoveGangs"]
    assert [(k.gang_id, k.attempt) for k in old.sent[1][1].gangs] == [("b/0", 1)]
    old.sent.clear()
    GrpcResourceManager(old).enqueue([gang("a")], [])  # nothing to remove: one call
    assert [n for n, _ in old.sent] == ["EnqueueGangs"]


class OldResmgr:
    """The resmgr side of a release before EnqueueGangs' `remove` and `call_id`, over a real ResourceManager: it
    queues (or adopts) the gangs, ignores both fields (`removed` false), and RemoveGangs removes; `fail_removes`:
    RemoveGangs calls that fail first, as if resmgr could not be reached."""

    def __init__(self, rm: ResourceManager, fail_removes: int = 0) -> None:
        self.rm, self.fail_removes = rm, fail_removes
        self.sent: list[str] = []

    def EnqueueGangs(self, request: Any, timeout: float | None = None) -> Any:  # noqa: N802 - the gRPC method
        self.sent.append("EnqueueGangs")
        gangs = [convert.gang_request_from_proto(p) for p in request.gangs]
        self.rm.enqueue([g for g, p in zip(gangs, request.gangs, strict=True) if not p.running],
                        [g for g, p in zip(gangs, request.gangs, strict=True) if p.running])
        return internal_pb2.EnqueueGangsResponse()

    def RemoveGangs(self, request: Any, timeout: float | None = None) -> Any:  # noqa: N802 - the gRPC method
        self.sent.append("RemoveGangs")
        if self.fail_removes:
            self.fail_removes -= 1
            raise Unavailable("resmgr away")
        self.rm.remove([(k.gang_id, k.attempt) for k in request.gangs])
        return internal_pb2.RemoveGangsResponse()


def _queued(rm: ResourceManager) -> list[tuple[str, int]]:
    return sorted((g.gang_id, g.attempt) for g in rm.queue()[0])


def test_an_old_resmgr_is_sent_a_calls_removals_before_its_gangs() -> None:
    """The removals an old resmgr ignored were sent after the gangs it had queued: a release and an enqueue of the
    same gang attempt in one call (its allocation released, then queued again) left it out of the queue."""
    rm = ResourceManager(lambda: [ResourcePool("/")], clock=lambda: 1000.0)
    old = OldResmgr(rm)
    c = GrpcResourceManager(old)
    c.enqueue([gang("a"), gang("b")], [])
    c.enqueue([gang("a"), gang("c")], [], remove=[("a/0", 1), ("b/0", 1)], call_id="1")
    assert _queued(rm) == [("a/0", 1), ("c/0", 1)]
    old.sent.clear()
    c.enqueue([gang("b", attempt=2)], [], remove=[("b/0", 2)], call_id="2")  # known old now: removals first
    assert old.sent == ["RemoveGangs", "EnqueueGangs"] and _queued(rm) == [("a/0", 1), ("b/0", 2), ("c/0", 1)]


def test_a_call_an_old_resmgr_applied_is_not_applied_again_when_tried_again() -> None:
    """The removals' RemoveGangs failed after the old resmgr had queued the call's gangs: the call, tried again as
    it was, sent its EnqueueGangs again, which that resmgr (it ignores call ids) applied again. Here the gang had
    been placed and launched in between: queued again, its allocation released (its pool over-admitted)."""
    from peloton.domain.placement import GangPlacement, MemberAssignment

    rm = ResourceManager(lambda: [ResourcePool("/")], clock=lambda: 1000.0)
    old = OldResmgr(rm, fail_removes=1)
    c = GrpcResourceManager(old)
    with pytest.raises(Unavailable):
        c.enqueue([gang("a")], [], remove=[("z/0", 1)], call_id="1")
    (got,) = rm.dequeue(10, 0.05, Resources(cpu=16, mem=1000, gpu=8))
    rm.set_placements([GangPlacement(got.gang_id, got.job_id, got.attempt, tuple(
        MemberAssignment(m.instance, m.task_id, "h1", "127.0.0.1", m.resources) for m in got.members))], [])
    assert [p.gang_id for p in rm.take_placements(10, 0.05, "launcher")[0]] == ["a/0"]
    rm.ack_placements([("a/0", 1)], [])  # launched: held, no longer queued
    assert _queued(rm) == [] and rm.unknown([("a/0", 1)]) == []
    c.enqueue([gang("a")], [], remove=[("z/0", 1)], call_id="1")  # the sender's try again
    assert _queued(rm) == [] and rm.unknown([("a/0", 1)]) == []
    assert old.sent == ["EnqueueGangs", "RemoveGangs", "RemoveGangs"]


def test_acks_an_old_peer_ignored_are_sent_by_their_own_calls() -> None:
    old = OldPeer()
    GrpcResourceManager(old).get_placements(10, 0.0, "one", ack_done=[("a/0", 1)])
    assert [n for n, _ in old.sent] == ["GetPlacements", "AckPlacements"]
    assert [(k.gang_id, k.attempt) for k in old.sent[1][1].done] == [("a/0", 1)] and not old.sent[1][1].retry
    old.sent.clear()
    GrpcHostManager(old).wait_events(5, 10, 0.0, ack_up_to_seq=5, ack_stream_id="s1")
    assert [n for n, _ in old.sent] == ["WaitTaskEvents", "AckTaskEvents"] and old.sent[1][1].up_to_seq == 5
    old.sent.clear()
    GrpcHostManager(old).wait_events(5, 10, 0.0, ack_up_to_seq=5, ack_stream_id="s0")  # its stream changed
    assert [n for n, _ in old.sent] == ["WaitTaskEvents"]


def test_every_call_of_a_connected_stub_carries_its_metadata() -> None:
    got: list[Any] = []

    class Stub:
        def __getattr__(self, name: str) -> Any:
            return lambda request, timeout=None, metadata=None: got.append((name, metadata))

    class Channel:  # only watched for its state (which matters to LaunchGangs alone)
        def subscribe(self, callback: Any, **_: Any) -> None:
            pass

    stub = ConnectedStub(Stub(), Channel(), [("x-peloton-component", "s3cret")])
    stub.KillTasks(internal_pb2.KillTasksRequest(), timeout=1)
    stub.KillTasks(internal_pb2.KillTasksRequest(), timeout=1, metadata=[("k", "v")])
    assert got == [("KillTasks", (("x-peloton-component", "s3cret"),)),
                   ("KillTasks", (("k", "v"), ("x-peloton-component", "s3cret")))]


# --- a launch's shared form: what every member has, once a gang -------------------------------------------------


def training_gang(n: int = 3, attempt: int = 1) -> GangLaunch:
    """A launch as the launcher makes one: the same hostfile dict for every member, an environment mostly common
    (one variable a member overrides, one only some members have)."""
    files = {"hostfile": "h1 slots=2\nh2 slots=1\n"}
    r = Resources(1, 10, 0, 1, 1)
    tasks = []
    for i in range(n):
        env = {"PELOTON_JOB_ID": "j", "PELOTON_PEERS": "h1,h1,h2", "PELOTON_INSTANCE": str(i), "SHARED": "x"}
        if i == 1:
            env["SHARED"] = "mine"  # not common: each keeps its own
            env["ONLY_ONE"] = "1"
        tasks.append(LaunchSpec(f"j-{i}-{attempt}", "j", i, attempt, "h1" if i < 2 else "h2", f"run {i}", env, r,
                                (0,), (), files, "", "#70000", False))
    return GangLaunch("j/0", attempt, tuple(tasks))


def test_the_shared_form_reads_back_as_the_same_launch() -> None:
    g = training_gang()
    p = convert.gang_launch_to_proto(g, shared=True)
    assert not p.tasks and len(p.members) == 3  # an earlier release reads `tasks` alone: it sees no member
    s = p.shared
    assert dict(s.env) == {"PELOTON_JOB_ID": "j", "PELOTON_PEERS": "h1,h1,h2"}
    assert dict(s.files) == {"hostfile": "h1 slots=2\nh2 slots=1\n"} and not any(m.files for m in p.members)
    assert dict(p.members[1].env) == {"PELOTON_INSTANCE": "1", "SHARED": "mine", "ONLY_ONE": "1"}
    # the same for all: once; a command of each member's own: with each
    assert (s.job_id, s.user, s.resources.gpu) == ("j", "#70000", 1) and not any(m.job_id or m.user for m in p.members)
    assert not s.command and [m.command for m in p.members] == ["run 0", "run 1", "run 2"]
    back = convert.gang_launch_from_proto(internal_pb2.GangLaunch.FromString(p.SerializeToString()))
    assert back == g
    whole = convert.gang_launch_to_proto(g)  # the form an earlier release reads
    assert not whole.members and not whole.HasField("shared") and dict(whole.tasks[0].env) == g.tasks[0].env
    assert convert.gang_launch_from_proto(whole) == g


def test_the_shared_form_of_members_with_nothing_in_common() -> None:
    r = Resources(1, 10, 0, 0, 0)
    g = GangLaunch("k/0", 2, (LaunchSpec("k-0-2", "k", 0, 2, "h1", "a", {"A": "1"}, r),
                              LaunchSpec("k-1-2", "k", 1, 2, "h1", "b", {"B": "2"}, r, files={"f": "x"})))
    g = GangLaunch("k/0", 2, (*g.tasks, LaunchSpec("k-2-2", "k", 2, 2, "h2", "b", {}, Resources(2, 10, 0, 0, 0),
                                                   container_image="img", legacy_user=True)))
    p = convert.gang_launch_to_proto(g, shared=True)
    assert not p.shared.env and not p.shared.files and not p.shared.HasField("resources")
    assert not p.shared.container_image and not p.shared.legacy_user and p.shared.job_id == "k"
    assert convert.gang_launch_from_proto(p) == g
    one = GangLaunch("k/0", 2, g.tasks[:1])  # one member: all of it is "shared"
    assert convert.gang_launch_from_proto(convert.gang_launch_to_proto(one, shared=True)) == one


def test_a_launch_reaches_the_backend_whole_in_either_form(clients: tuple) -> None:
    """The first launch goes each member whole (the client does not yet know what the host manager reads), the next
    in the shared form over gRPC; the backend gets the same members either way."""
    _, hmc, _, hm, be = clients
    got: list[GangLaunch] = []
    real = be.launch

    def launch(gangs: Sequence[GangLaunch]) -> list[LaunchResult]:
        got.extend(gangs)
        return real(gangs)

    be.launch = launch
    for attempt in (1, 2):
        host = f"h{attempt}"  # (each host has 2 GPUs: the first launch holds those of h1)
        [c], _ = hm.claim([placed("j/0", [host, host], attempt=attempt)])
        g = GangLaunch(c.gang_id, attempt, tuple(LaunchSpec(  # the claim's GPUs and ports, the rest a training gang's
            m.task_id, t.job_id, m.instance, attempt, m.hostname, t.command, t.env, m.resources, m.gpu_ids, m.ports,
            t.files, user=t.user) for m, t in zip(c.members, training_gang(2, attempt).tasks, strict=True)))
        assert [r.outcome for r in hmc.launch([g])] == [LaunchOutcome.OK]
        assert got[-1] == g
        hm.release_claims([("j/0", attempt)])
    if isinstance(hmc, GrpcHostManager):
        assert hmc._launch_shared  # the answer said so


def test_an_old_host_manager_is_sent_each_member_whole() -> None:
    old = OldPeer()
    hmc = GrpcHostManager(old)
    hmc.launch([training_gang()])
    hmc.launch([training_gang()])
    assert [len(r.gangs[0].tasks) for _, r in old.sent] == [3, 3] and not any(r.gangs[0].members for _, r in old.sent)
    hmc._launch_shared = True  # a new host manager answered before it, then an old one took over (a rollback)
    hmc.launch([training_gang()])
    assert len(old.sent[-1][1].gangs[0].members) == 3
    hmc.launch([training_gang()])  # its answer lacked `shared_read`: whole again
    assert len(old.sent[-1][1].gangs[0].tasks) == 3 and not old.sent[-1][1].gangs[0].members


def test_an_old_host_manager_refuses_a_shared_launch_starting_nothing() -> None:
    """What a host manager of an earlier release makes of the shared form: a gang of no members (it reads `tasks`
    only), which its claim refuses; the launcher launches such a gang again (the next time each member whole)."""
    be = FakeBackend()
    hm = HostManager(be, clock=lambda: 1000.0, claim_ttl_s=3600)
    hm.start()
    try:
        hm.claim([placed("j/0", ["h1", "h1"])])
        p = convert.gang_launch_to_proto(training_gang(2), shared=True)
        as_old = GangLaunch(p.gang_id, p.attempt, tuple(convert.launch_from_proto(t) for t in p.tasks))
        [r] = hm.launch([as_old])
        assert r.outcome == LaunchOutcome.REFUSED and be.launched == []
    finally:
        hm.stop()


def test_resmgr_lists_the_gangs_it_holds_page_by_page(clients: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the job manager's queue check compares with its records to release what resmgr holds in vain: every
    gang queued or holding an allocation, its newest attempt, by gang id."""
    from peloton.resmgr import service

    monkeypatch.setattr(service, "MAX_GANGS_PAGE", 2)
    rmc, _, rm, _, _ = clients

    def listed() -> list[tuple[str, int]]:
        got: list[tuple[str, int]] = []
        token = ""
        while True:
            page, token = rmc.held_gangs(token)
            got += page
            if not token:
                return got

    assert listed() == []
    rmc.enqueue([gang("d"), gang("a"), gang("b", attempt=2)], [gang("c")])  # c: running, adopted
    assert listed() == [("a/0", 1), ("b/0", 2), ("c/0", 1), ("d/0", 1)]
    rmc.remove_gangs([("a/0", 1), ("c/0", 1)])
    assert listed() == [("b/0", 2), ("d/0", 1)]


def test_a_resmgr_of_an_earlier_release_lists_no_gangs() -> None:
    """It does not serve ListGangs (UNIMPLEMENTED): nothing to check, not an error that stops the reconciler."""
    from concurrent import futures

    import grpc

    from peloton.api.v1 import internal_pb2_grpc

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    internal_pb2_grpc.add_ResourceManagerInternalServicer_to_server(
        internal_pb2_grpc.ResourceManagerInternalServicer(), server)  # type: ignore[abstract]  # (none served)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            assert GrpcResourceManager(internal_pb2_grpc.ResourceManagerInternalStub(ch)).held_gangs("") == ([], "")
    finally:
        server.stop(None)


def test_a_send_that_raises_something_unexpected_is_tried_again_and_the_sender_lives_on() -> None:
    """A call failing with an error that is not the project's (a bug on the path, a client library's surprise)
    ended the sender's thread: every kill, release and enqueue after it waited for ever while the daemon looked
    healthy. It is logged, counted and tried again as any failed send."""
    from prometheus_client import REGISTRY

    def errors() -> float:
        return REGISTRY.get_sample_value("peloton_loop_errors_total", {"loop": "jobmgr-side-effects"}) or 0.0

    class Surprising(Recording):
        def _record(self, call: tuple[str, list[str], list[tuple[str, int]]]) -> None:
            if not self.calls and len(self.ids) == 1:
                raise RuntimeError("surprise")
            super()._record(call)

    rm = Surprising()
    fx = SideEffects(rm, None)  # type: ignore[arg-type]
    before = errors()
    fx.start()
    try:
        fx.submit(Outbox(release=[("r0/0", 1)]))
        assert fx.drain(10)
        fx.submit(Outbox(release=[("r1/0", 1)]))
        assert fx.drain(10)
    finally:
        fx.stop()
    assert rm.calls == [("remove", [], [("r0/0", 1)]), ("remove", [], [("r1/0", 1)])]
    assert rm.ids[0] == rm.ids[1]  # tried again as the same call
    assert errors() - before == 1


def test_a_graceful_stop_sends_what_is_pending_first_within_its_grace() -> None:
    """A stop dropped the side effects not yet sent (a kill, a release waiting for a try again): after a graceful
    stop they waited for the next leader's recovery and queue check. Now a stop gives them a grace to go out."""
    rm = Recording(fail_at=0)  # the first try fails: the release waits for its try again (0.05 s later)
    fx = SideEffects(rm, None)  # type: ignore[arg-type]
    fx.start()
    fx.submit(Outbox(release=[("r0/0", 1)]))
    fx.stop(grace_s=5)
    assert rm.calls == [("remove", [], [("r0/0", 1)])]
