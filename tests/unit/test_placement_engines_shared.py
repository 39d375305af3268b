"""Several placement engines at once (--placement-engines shared): the resource manager hands each gang to one
engine, takes back what an engine that went silent was placing, refuses the answers of an engine for gangs no longer
its own, and hands the claim of a gang taken back only to the engine that places it next (which releases it before
it claims the gang again). Two real engines over one resmgr and one host manager: a claim conflict between them is
a gang placed again, never a double placement."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from peloton.domain.model import ResourcePool
from peloton.domain.placement import GangPlacement, GangRequest, MemberAssignment, MemberRequest, PlacementFailure
from peloton.domain.resources import Resources
from peloton.hostmgr.inprocess import InProcessHostManager
from peloton.hostmgr.manager import HostManager
from peloton.placement.engine import PlacementEngine
from peloton.resmgr.callers import Engines, orphan_release
from peloton.resmgr.inprocess import InProcessResourceManager
from peloton.resmgr.manager import ResourceManager
from peloton.settings import ServerConfig
from tests.unit.test_hostmgr_manager import FakeBackend

SHORT = 0.05
LEASE = 10.0


def gang(job: str, gpus: int = 2) -> GangRequest:
    """Two members of `gpus` GPUs each (the fake backend: two hosts of 2 GPUs; gpus=2 takes the whole cluster)."""
    r = Resources(cpu=1, mem=10, gpu=gpus)
    return GangRequest(gang_id=f"{job}/0", job_id=job, attempt=1,
                       members=tuple(MemberRequest(i, f"{job}-{i}-1", r) for i in range(2)))


def placed(g: GangRequest) -> GangPlacement:
    return GangPlacement(g.gang_id, g.job_id, g.attempt, tuple(
        MemberAssignment(m.instance, m.task_id, f"h{m.instance + 1}", "", m.resources) for m in g.members))


# --- the pure parts ----------------------------------------------------------------------------------------------

def test_an_engine_silent_past_its_lease_is_gone_once_and_may_come_back() -> None:
    e = Engines(lease_s=LEASE)
    assert e.heard("a", 0.0) and e.heard("b", 0.0) and not e.heard("a", 1.0)
    assert e.gone(10.5) == ["b"]  # a was heard at 1.0
    assert e.gone(10.6) == []  # named once
    assert "b" not in e and "a" in e
    assert e.heard("b", 11.0)  # back: a live engine again
    assert e.gone(11.0) == [] and len(e) == 2


def test_an_engine_in_a_call_is_never_gone() -> None:
    e = Engines(lease_s=LEASE)
    assert e.begin("a", 0.0)
    assert e.gone(100.0) == []  # a long poll in progress
    e.end("a", 100.0)
    assert e.gone(105.0) == []  # heard at the end of its call
    assert e.gone(110.5) == ["a"]
    with pytest.raises(ValueError, match="lease_s"):
        Engines(lease_s=0)


@pytest.mark.parametrize("state, owner, engine, what", [
    (None, "", "a", "give"),  # the gang is gone: nobody claims that attempt again
    ("placing", "a", "a", "give"),  # the engine placing it releases it before it claims
    ("placing", "b", "a", "keep"),  # another engine places it: only that one may release it
    ("waiting", "", "a", "keep"),  # for the engine that dequeues it next
    ("ready", "b", "a", "drop"),  # placed since: its new claim succeeded, the old one was gone
    ("handed", "b", "a", "drop"),
])
def test_who_releases_an_orphaned_claim(state: str | None, owner: str, engine: str, what: str) -> None:
    assert orphan_release(state, owner, engine) == what


def test_the_flag_is_checked_naming_it(tmp_path: object) -> None:
    from pathlib import Path

    base = {"listen": "127.0.0.1:0", "db_url": None, "data_dir": Path(str(tmp_path))}
    with pytest.raises(Exception, match="--placement-engines"):
        ServerConfig(**base, placement_engines="many").check()  # type: ignore[arg-type]
    cfg = ServerConfig(**base, placement_engines="shared", roles=frozenset({"placement"}), standby=True,  # type: ignore[arg-type]
                       resmgr_address="unix:/r.sock", hostmgr_address="unix:/h.sock")
    assert cfg.lockless_placement
    with pytest.raises(Exception, match="--standby"):
        cfg.check()
    # a process with other roles too keeps its roles' lock (its own engine leads; others may act beside it)
    assert not ServerConfig(**base, placement_engines="shared").lockless_placement  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="placement_engines"):
        ResourceManager(lambda: [ResourcePool("/")], placement_engines="many")


# --- the resource manager with several engines -------------------------------------------------------------------

class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def rm() -> tuple[ResourceManager, Clock]:
    clock = Clock()
    return ResourceManager(lambda: [ResourcePool("/")], clock=clock, rate_clock=clock, placement_engines="shared",
                           engine_lease_s=LEASE), clock


def test_each_gang_goes_to_one_engine_and_both_engines_act(rm: tuple[ResourceManager, Clock]) -> None:
    r, _ = rm
    r.enqueue([gang("a", 1), gang("b", 1), gang("c", 1)])
    got_a = r.dequeue(2, SHORT, engine="A")
    got_b = r.dequeue(2, SHORT, engine="B")
    assert [g.gang_id for g in got_a] == ["a/0", "b/0"] and [g.gang_id for g in got_b] == ["c/0"]
    # each engine's answers count for its own gangs only
    r.set_placements([placed(got_b[0])], [], engine="A")  # (not A's: refused, its claim to be released)
    r.set_placements([placed(got_a[0])], [], engine="A")
    r.set_placements([placed(got_b[0])], [], engine="B")
    out, _ = r.take_placements(10, SHORT)
    assert sorted(p.gang_id for p in out) == ["a/0", "c/0"]
    # A's late claim of c was refused after B placed c: c's claim is B's, so nothing is released
    assert r.take_orphaned_claims("A") == [] and r.take_orphaned_claims("B") == []


def test_the_gangs_of_an_engine_that_went_silent_go_back_with_their_claims_to_whoever_places_them(
        rm: tuple[ResourceManager, Clock]) -> None:
    r, clock = rm
    r.enqueue([gang("a", 1)])
    (a,) = r.dequeue(1, SHORT, engine="A")
    clock.now += LEASE / 2
    assert r.dequeue(1, SHORT, engine="B") == []  # A is still within its lease: a stays with it
    clock.now += LEASE
    # B asks again: A is gone, a goes back and is B's, with A's claim of it to release first
    (again,) = r.dequeue(1, SHORT, engine="B")
    assert again.gang_id == "a/0"
    assert r.take_orphaned_claims("C") == []  # not for another engine: its release could free B's new claim
    assert r.take_orphaned_claims("B") == [("a/0", 1)]
    # A wakes up and answers for a: refused (not its gang any more), and its claim kept for B's round to settle
    r.set_placements([placed(a)], [], engine="A")
    assert r.take_placements(10, SHORT)[0] == []
    r.set_placements([], [], [PlacementFailure("a/0", "a", 1, "already claimed")], engine="B")  # A's claim in the way
    assert r.take_orphaned_claims("C") == []  # a waits: its claim goes with it to the next engine that takes it
    (again,) = r.dequeue(1, SHORT, engine="C")
    assert again.gang_id == "a/0" and r.take_orphaned_claims("C") == [("a/0", 1)]
    r.set_placements([placed(again)], [], engine="C")
    (p,), _ = r.take_placements(10, SHORT)
    assert p.gang_id == "a/0"


def test_the_claim_of_a_removed_gang_goes_to_any_engine(rm: tuple[ResourceManager, Clock]) -> None:
    r, clock = rm
    r.enqueue([gang("a", 1)])
    r.dequeue(1, SHORT, engine="A")
    clock.now += 2 * LEASE
    r.remove([("a/0", 1)])
    assert r.dequeue(1, SHORT, engine="B") == []  # A gone; a was removed meanwhile
    assert r.take_orphaned_claims("B") == [("a/0", 1)]


def test_the_default_one_engine_at_a_time_is_unchanged() -> None:
    r = ResourceManager(lambda: [ResourcePool("/")], clock=lambda: 1000.0)
    r.enqueue([gang("a", 1), gang("b", 1)])
    (a,) = r.dequeue(1, SHORT, engine="A")
    # a new engine replaces the last at once: a goes back to the queue, and A is given nothing from now on
    got = r.dequeue(2, SHORT, engine="B")
    assert sorted(g.gang_id for g in got) == ["a/0", "b/0"]
    assert r.take_orphaned_claims("B") == [("a/0", 1)]
    assert r.dequeue(1, SHORT, engine="A") == []
    r.set_placements([placed(a)], [], engine="A")
    assert r.take_orphaned_claims() == [("a/0", 1)]  # the replaced engine's claim, released by the next round


# --- two real engines --------------------------------------------------------------------------------------------

@pytest.fixture
def two() -> Iterator[tuple[PlacementEngine, PlacementEngine, ResourceManager, HostManager]]:
    r = ResourceManager(lambda: [ResourcePool("/")], clock=lambda: 1000.0, placement_engines="shared")
    hm = HostManager(FakeBackend(), clock=lambda: 1000.0, claim_ttl_s=3600)  # claims never expire here
    hm.start()
    try:
        yield (PlacementEngine(InProcessResourceManager(r), InProcessHostManager(hm), poll_ms=50),
               PlacementEngine(InProcessResourceManager(r), InProcessHostManager(hm), poll_ms=50), r, hm)
    finally:
        hm.stop()


def test_a_claim_conflict_between_two_engines_is_a_gang_placed_again_never_twice(
        two: tuple[PlacementEngine, PlacementEngine, ResourceManager, HostManager]) -> None:
    e1, e2, r, hm = two
    e1._sync()
    e2._sync()  # both copies: the whole cluster free
    r.enqueue([gang("a"), gang("b")])  # each takes every GPU of the cluster
    ga, gb = r.dequeue(1, SHORT, engine=e1.id), r.dequeue(1, SHORT, engine=e2.id)
    # each engine plans its gang on its own copy, then they claim in turn (as two processes may)
    from peloton.placement.reservation import place_around

    pa, _ = place_around(ga, e1.index, {}, 1000.0, "backfill")
    pb, _ = place_around(gb, e2.index, {}, 1000.0, "backfill")
    claimed_a, refused_a = hm.claim(pa)
    claimed_b, refused_b = hm.claim(pb)
    assert len(claimed_a) == 1 and refused_a == [] and claimed_b == [] and len(refused_b) == 1
    r.set_placements(claimed_a, [], [], engine=e1.id)
    r.set_placements([], [], refused_b, engine=e2.id)
    (p,), _ = r.take_placements(10, SHORT)
    assert p.gang_id == "a/0" and sorted(m.gpu_ids for m in p.members) == [(0, 1), (0, 1)]
    # b is back in the queue at once; either engine places it once a's hosts are free
    assert hm.held_hosts() == {"h1", "h2"} and [q.gang_id for q in r.queue()[0]] == ["b/0"]
    hm.release_claims([("a/0", 1)])  # (a's launch ended: its hosts free again)
    for _ in range(5):
        e1.run_once()
        e2.run_once()
        out, _ = r.take_placements(10, SHORT)
        if out:
            break
    assert [q.gang_id for q in out] == ["b/0"] and hm.held_hosts() == {"h1", "h2"}
