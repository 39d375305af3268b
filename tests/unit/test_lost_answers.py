"""The resource manager and the placement engine when an answer is lost on its way (a call that got through and
whose reply did not, a reply never sent), and what a gang attempt holds meanwhile. Each test failed before its fix.

- What a gang attempt holds: a late older attempt must not replace the newer one's holding (the pool sums would
  keep the newer one's total for ever), and an enqueue tried again after the gang launched (a retry of a call
  that got through) must not free its share.
- The answers of a placement round that resmgr never got (a lost SetPlacements, a lost DequeueGangs answer) must
  not leave its gangs placing, holding their pool's share, for ever.
- A claim call that failed after the host manager made the claims must not keep the gangs refused as "already
  claimed" (and tried again at once, round after round) until the claims expire.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from peloton.domain.model import ResourcePool
from peloton.domain.placement import GangPlacement, GangRequest, MemberAssignment, MemberRequest
from peloton.domain.resources import Resources
from peloton.errors import Unavailable
from peloton.hostmgr.inprocess import InProcessHostManager
from peloton.hostmgr.manager import HostManager
from peloton.placement.engine import PlacementEngine
from peloton.resmgr.holdings import Holdings
from peloton.resmgr.inprocess import InProcessResourceManager
from peloton.resmgr.manager import ResourceManager
from tests.unit.test_hostmgr_manager import FakeBackend

SHORT = 0.05


def gang(job: str, *, attempt: int = 1, n: int = 2, cpu: float = 1, gpu: int = 0, pool: str = "/") -> GangRequest:
    r = Resources(cpu=cpu, mem=10, gpu=gpu)
    return GangRequest(gang_id=f"{job}/0", job_id=job, attempt=attempt, respool=pool,
                       members=tuple(MemberRequest(i, f"{job}-{i}-{attempt}", r) for i in range(n)))


def placement(g: GangRequest) -> GangPlacement:
    return GangPlacement(g.gang_id, g.job_id, g.attempt, tuple(
        MemberAssignment(m.instance, m.task_id, "h1", "127.0.0.1", m.resources) for m in g.members))


def manager(*pools: ResourcePool) -> ResourceManager:
    return ResourceManager(lambda: [ResourcePool("/"), *pools], clock=lambda: 1000.0)


# --- an enqueue tried again (a retry after a lost answer) --------------------------------------------------------------

def test_an_enqueue_tried_again_after_the_gang_launched_neither_places_it_again_nor_frees_its_share() -> None:
    """The job manager's side effects try a call to resmgr again when it failed, and the failure may have been its
    answer's alone: applied again once the gang was placed and launched, it would release what the gang holds and
    queue it again (its pool over-admitted until it ended). Every try of a call carries the id of its first, and
    resmgr applies a call once; another call (a recovered job manager's, with its own id) still applies."""
    rm = manager(ResourcePool("/team", limit=Resources(cpu=4)))
    a = gang("a", n=2, cpu=2, pool="/team")
    rm.apply_call("call-1", [], [a])
    assert rm.dequeue(10, SHORT) == [a]
    rm.set_placements([placement(a)], [])
    (p,), _ = rm.take_placements(10, SHORT)
    rm.ack_placements([(p.gang_id, p.attempt)], [])  # its launch intent is durable: a runs, holding cpu 4
    rm.apply_call("call-1", [], [a])  # the sender's try again of the call that queued it (its answer was lost)
    rm.apply_call("call-1", [("a/0", 1)], [a])  # (whatever it carried: it was applied)
    assert rm.usage()[0]["/team"].cpu == 4  # what it holds still counts
    b = gang("b", n=1, cpu=2, pool="/team")
    rm.apply_call("call-2", [], [b])
    assert b not in rm.dequeue(10, SHORT)  # the pool's limit is taken by a: b waits
    # a job manager that recovered (a launch refused, its release lost in a crash) releases and queues a anew
    rm.apply_call("call-3", [("a/0", 1)], [a])
    held = rm.usage()[0].get("/team")
    assert held is None or held.cpu == 0
    assert ("a/0", 1) in [(g.gang_id, g.attempt) for g in rm.queue()[0]]


def test_holding_an_older_attempt_keeps_the_newer_one_and_the_sums_match() -> None:
    h = Holdings()
    h.hold(gang("a", attempt=2, cpu=1))
    h.hold(gang("a", attempt=1, cpu=1))  # late: ignored
    got = h.get("a/0")
    assert got is not None and got.attempt == 2
    assert h.allocated["/"].cpu == 2
    h.release("a/0", 2)
    assert h.allocated == {} and h.own == {} and h.pinned == {} and h.by_gang == {}


# --- answers the resource manager never got --------------------------------------------------------------------

def test_gangs_an_engine_dequeued_and_never_answered_go_back_to_the_queue_at_its_next_dequeue() -> None:
    rm = manager(ResourcePool("/team", limit=Resources(cpu=4)))
    a = gang("a", n=2, cpu=2, pool="/team")
    rm.enqueue([a])
    assert rm.dequeue(10, SHORT, engine="e1") == [a]
    # its SetPlacements never arrived (or the answer to this dequeue was lost): the engine asks again
    assert rm.dequeue(10, SHORT, engine="e1") == [a]
    assert rm.take_orphaned_claims("e1") == [("a/0", 1)]  # whatever it claimed for a is released first
    assert rm.usage()[0]["/team"].cpu == 4  # counted once
    rm.set_placements([placement(a)], [], engine="e1")
    (p,), _ = rm.take_placements(10, SHORT)
    assert p.gang_id == "a/0"


def test_an_answered_round_is_not_taken_back() -> None:
    rm = manager()
    a, b = gang("a"), gang("b")
    rm.enqueue([a])
    assert rm.dequeue(10, SHORT, engine="e1") == [a]
    rm.set_placements([placement(a)], [], engine="e1")
    rm.enqueue([b])
    assert rm.dequeue(10, SHORT, engine="e1") == [b]
    assert rm.take_orphaned_claims("e1") == []
    (p,), _ = rm.take_placements(10, SHORT)
    assert p.gang_id == "a/0"


class FailingOnce:
    """Wraps a client: the named call fails once with Unavailable, before (`after` False) or after (True) it did
    its work (an answer lost on the way back)."""

    def __init__(self, inner: object, method: str, after: bool) -> None:
        self._inner, self._method, self._after, self.failed = inner, method, after, False

    def __getattr__(self, name: str) -> object:
        fn = getattr(self._inner, name)
        if name != self._method:
            return fn

        def call(*args: object, **kwargs: object) -> object:
            if self.failed:
                return fn(*args, **kwargs)
            self.failed = True
            if self._after:
                fn(*args, **kwargs)
            raise Unavailable(f"{name}: connection reset")

        return call


@pytest.fixture
def cluster() -> Iterator[tuple[ResourceManager, HostManager]]:
    rm = ResourceManager(lambda: [ResourcePool("/")], clock=lambda: 1000.0)
    hm = HostManager(FakeBackend(), clock=lambda: 1000.0, claim_ttl_s=3600)  # claims never expire here
    hm.start()
    try:
        yield rm, hm
    finally:
        hm.stop()


def whole_cluster(job: str) -> GangRequest:
    """Both GPUs of both hosts of the fake backend."""
    return gang(job, n=2, cpu=1, gpu=2)


def test_a_round_whose_answer_resmgr_never_got_is_placed_again_at_the_next_round(
        cluster: tuple[ResourceManager, HostManager]) -> None:
    rm, hm = cluster
    rmc = FailingOnce(InProcessResourceManager(rm), "set_placements", after=False)
    engine = PlacementEngine(rmc, InProcessHostManager(hm), poll_ms=50)  # type: ignore[arg-type]
    rm.enqueue([whole_cluster("a")])
    with pytest.raises(Unavailable):
        engine.run_once()  # placed and claimed; resmgr never heard of it
    assert engine.run_once()  # the claim is released, the gang placed again
    placed, pending = rm.take_placements(10, SHORT)
    assert [p.gang_id for p in placed] == ["a/0"] and pending == []
    assert hm.held_hosts() == {"h1", "h2"}


def test_a_claim_whose_answer_was_lost_does_not_keep_the_gang_refused_until_it_expires(
        cluster: tuple[ResourceManager, HostManager]) -> None:
    rm, hm = cluster
    hmc = FailingOnce(InProcessHostManager(hm), "claim", after=True)
    engine = PlacementEngine(InProcessResourceManager(rm), hmc, poll_ms=50)  # type: ignore[arg-type]
    rm.enqueue([whole_cluster("a")])
    with pytest.raises(Unavailable):
        engine.run_once()  # claimed in the host manager, but the engine never heard: back to the queue
    assert engine.run_once()
    placed, _ = rm.take_placements(10, SHORT)
    assert [p.gang_id for p in placed] == ["a/0"]  # not refused as "already claimed"
    assert hm.held_hosts() == {"h1", "h2"}
