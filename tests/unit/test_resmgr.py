"""ResourceManager: priority queue of gangs, hierarchical admission, placements handed to jobmgr. Fake clock."""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

import pytest

from peloton.domain.model import ResourcePool
from peloton.domain.placement import (
    GangPlacement,
    GangRequest,
    MemberAssignment,
    MemberRequest,
    PlacementFailure,
)
from peloton.domain.resources import Resources
from peloton.resmgr.manager import HANDED_TIMEOUT_S, RETRY_AFTER_FAILED_PLACEMENT_S, ResourceManager

SHORT = 0.05


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def gang(job: str, *, attempt: int = 1, n: int = 2, cpu: float = 1, gpu: int = 0, priority: int = 0,
         pool: str = "/", at: float = 0.0) -> GangRequest:
    r = Resources(cpu=cpu, mem=256, gpu=gpu)
    return GangRequest(
        gang_id=f"{job}/0", job_id=job, attempt=attempt,
        members=tuple(MemberRequest(i, f"{job}-{i}-{attempt}", r) for i in range(n)),
        priority=priority, respool=pool, enqueued_at=at,
    )


def placement(g: GangRequest) -> GangPlacement:
    return GangPlacement(g.gang_id, g.job_id, g.attempt, tuple(
        MemberAssignment(m.instance, m.task_id, "h1", "127.0.0.1", m.resources) for m in g.members))


def failure(g: GangRequest, reason: str = "no host has 8 GPUs free") -> PlacementFailure:
    return PlacementFailure(g.gang_id, g.job_id, g.attempt, reason, {"gpu": 2})


class Pools:
    def __init__(self, *extra: ResourcePool) -> None:
        self.pools = [ResourcePool("/"), *extra]
        self.calls = 0

    def __call__(self) -> list[ResourcePool]:
        self.calls += 1
        return list(self.pools)


def returns(call: Any, within_s: float = 30.0) -> Any:
    """What `call()` returns, asserting it returned within `within_s`: for a long poll of an hour, that something
    woke it (a bounded wait for that event, not a measure of how soon)."""
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(call()), daemon=True)
    t.start()
    t.join(within_s)
    assert not t.is_alive() and out, "still waiting: nothing woke the long poll"
    return out[0]


def make(*extra: ResourcePool, clock: Clock | None = None) -> tuple[ResourceManager, Clock, Pools]:
    clock = clock or Clock()
    pools = Pools(*extra)
    return ResourceManager(pools, clock=clock), clock, pools


TEAM = ResourcePool("/team", limit=Resources(cpu=4))


def test_pools_are_loaded_at_start_and_on_refresh() -> None:
    rm, _, pools = make(TEAM)
    assert pools.calls == 1 and set(rm.pools()) == {"/", "/team"}
    pools.pools.append(ResourcePool("/other"))
    rm.refresh_pools()
    assert pools.calls == 2 and set(rm.pools()) == {"/", "/team", "/other"}


def test_dequeue_in_priority_order_then_oldest() -> None:
    rm, _, _ = make()
    low = gang("low", priority=0, at=1)
    high_new = gang("highnew", priority=5, at=20)
    high_old = gang("highold", priority=5, at=10)
    mid = gang("mid", priority=2, at=0)
    rm.enqueue([low, high_new, high_old, mid])
    got = rm.dequeue(10, SHORT)
    assert [g.job_id for g in got] == ["highold", "highnew", "mid", "low"]


def test_dequeue_respects_max_and_does_not_hand_out_twice() -> None:
    rm, _, _ = make()
    rm.enqueue([gang(f"j{i}", at=i) for i in range(5)])
    assert [g.job_id for g in rm.dequeue(2, SHORT)] == ["j0", "j1"]
    assert [g.job_id for g in rm.dequeue(10, SHORT)] == ["j2", "j3", "j4"]
    assert rm.dequeue(10, SHORT) == []  # all placing


def test_dequeue_long_poll_returns_empty_on_timeout() -> None:
    rm, _, _ = make()
    t0 = time.monotonic()
    assert rm.dequeue(10, SHORT) == []
    assert time.monotonic() - t0 >= SHORT * 0.9  # it waited (and the timeout ended it)


def test_dequeue_wakes_when_a_gang_is_enqueued() -> None:
    rm, _, _ = make()
    g = gang("j")
    threading.Timer(0.05, rm.enqueue, args=([g],)).start()
    assert returns(lambda: rm.dequeue(10, 3600.0)) == [g]


def test_take_placements_long_poll_returns_empty_on_timeout() -> None:
    rm, _, _ = make()
    t0 = time.monotonic()
    assert rm.take_placements(10, SHORT) == ([], [])
    assert time.monotonic() - t0 >= SHORT * 0.9


def test_admission_blocks_a_second_gang_over_the_pool_limit() -> None:
    rm, _, _ = make(TEAM)
    a = gang("a", n=2, cpu=2, pool="/team", at=1)  # 4 cpu: the whole limit
    b = gang("b", n=1, cpu=1, pool="/team", at=2)
    rm.enqueue([a, b])
    assert rm.dequeue(10, SHORT) == [a]
    placements, pending = rm.take_placements(10, SHORT)
    assert placements == []
    assert [(f.gang_id, f.job_id, f.attempt) for f in pending] == [("b/0", "b", 1)]
    assert "waiting for admission" in pending[0].reason and "/team" in pending[0].reason
    alloc, queued = rm.usage()
    assert alloc["/team"] == Resources(cpu=4, mem=512) and alloc["/"] == Resources(cpu=4, mem=512)
    assert queued == {"/team": 2}
    # the same reason is reported once, not on every retry
    assert rm.dequeue(10, SHORT) == []
    assert rm.take_placements(10, SHORT) == ([], [])


def test_gangs_in_other_pools_are_not_blocked() -> None:
    rm, _, _ = make(TEAM)
    rm.enqueue([gang("a", n=4, cpu=1, pool="/team", at=1), gang("b", n=1, cpu=1, pool="/team", at=2),
                gang("c", n=8, cpu=1, pool="/", at=3)])
    assert [g.job_id for g in rm.dequeue(10, SHORT)] == ["a", "c"]


def test_unknown_pool_waits_with_a_reason() -> None:
    rm, _, _ = make()
    rm.enqueue([gang("x", pool="/gone")])
    assert rm.dequeue(10, SHORT) == []
    _, pending = rm.take_placements(10, SHORT)
    assert len(pending) == 1 and "/gone does not exist" in pending[0].reason


def test_set_placements_moves_a_gang_to_ready_and_keeps_its_allocation() -> None:
    rm, _, _ = make(TEAM)
    a = gang("a", n=2, cpu=2, pool="/team")
    rm.enqueue([a])
    assert rm.dequeue(10, SHORT) == [a]
    p = placement(a)
    rm.set_placements([p], [])
    placements, pending = rm.take_placements(10, SHORT)
    assert placements == [p] and pending == []
    alloc, queued = rm.usage()
    assert queued == {} and alloc["/team"].cpu == 4  # placed gangs hold their allocation until removed
    assert rm.take_placements(10, SHORT) == ([], [])


def test_a_refused_launch_released_and_enqueued_again_as_the_same_attempt_is_queued_anew() -> None:
    """The launcher acknowledges placements with its next poll, so a launch the backend refused at once comes back
    (release, then enqueue of the same attempt: gang_policy.launch_refused) while resmgr still holds it handed
    out. An enqueue alone would be ignored (an attempt it knows), and the late ack would then hold its allocation
    for a gang nobody places: the gang would never start."""
    rm, _, _ = make()
    a = gang("a", n=2, cpu=1)
    rm.enqueue([a])
    assert rm.dequeue(10, SHORT) == [a]
    rm.set_placements([placement(a)], [])
    (p,), _ = rm.take_placements(10, SHORT)  # handed out, not acknowledged yet
    rm.enqueue([a])  # alone: ignored, as any repeat of a known attempt is
    assert rm.dequeue(10, SHORT) == []
    rm.remove([("a/0", 1)])
    rm.enqueue([a])
    rm.ack_placements([("a/0", 1)], [])  # the late acknowledgement of the refused launch: no effect now
    assert rm.dequeue(10, SHORT) == [a]  # placed again
    rm.set_placements([placement(a)], [])
    (again,), _ = rm.take_placements(10, SHORT)
    assert again.gang_id == "a/0" and again.attempt == 1


def test_take_placements_honours_max() -> None:
    rm, _, _ = make()
    gs = [gang(f"j{i}", at=i) for i in range(3)]
    rm.enqueue(gs)
    rm.dequeue(10, SHORT)
    rm.set_placements([placement(g) for g in gs], [])
    first, _ = rm.take_placements(2, SHORT)
    second, _ = rm.take_placements(2, SHORT)
    assert len(first) == 2 and len(second) == 1
    assert {p.job_id for p in first + second} == {"j0", "j1", "j2"}


def test_placement_failure_goes_back_with_reason_and_not_before() -> None:
    rm, clock, _ = make(TEAM)
    a = gang("a", n=2, cpu=2, pool="/team")
    b = gang("b", n=1, cpu=1, pool="/team", at=5)
    rm.enqueue([a])
    assert rm.dequeue(10, SHORT) == [a]
    rm.set_placements([], [failure(a)])
    placements, pending = rm.take_placements(10, SHORT)
    assert placements == [] and pending == [PlacementFailure("a/0", "a", 1, "no host has 8 GPUs free")]
    # the allocation was given back: another gang of the pool fits now
    assert rm.usage()[0].get("/team", Resources()).cpu == 0
    rm.enqueue([b])
    assert rm.dequeue(10, SHORT) == [b]
    # the failed gang is parked until not_before
    assert rm.dequeue(10, SHORT) == []
    clock.t += RETRY_AFTER_FAILED_PLACEMENT_S - 0.01
    assert rm.dequeue(10, SHORT) == []
    clock.t += 0.02
    assert rm.dequeue(10, SHORT) == []  # retried now, but b holds 1 cpu and a needs all 4
    rm.remove([("b/0", 1)])
    assert rm.dequeue(10, SHORT) == [a]


def test_remove_releases_the_allocation_and_unparks_waiting_gangs() -> None:
    rm, clock, _ = make(TEAM)
    a = gang("a", n=2, cpu=2, pool="/team", at=1)
    b = gang("b", n=2, cpu=2, pool="/team", at=2)
    rm.enqueue([a, b])
    assert rm.dequeue(10, SHORT) == [a]
    rm.set_placements([placement(a)], [])
    rm.take_placements(10, SHORT)
    assert rm.dequeue(10, SHORT) == []  # b parked (not_before in the future on the fake clock)
    rm.remove([("a/0", 1)])
    assert rm.usage()[0].get("/team", Resources()).cpu == 0
    # no clock advance needed: remove un-parks
    assert rm.dequeue(10, SHORT) == [b]
    assert clock.t == 1000.0


def test_remove_wakes_a_waiting_dequeue() -> None:
    rm, _, _ = make(TEAM)
    a = gang("a", n=2, cpu=2, pool="/team", at=1)
    b = gang("b", n=2, cpu=2, pool="/team", at=2)
    rm.enqueue([a, b])
    rm.dequeue(10, SHORT)
    threading.Timer(0.05, rm.remove, args=([("a/0", 1)],)).start()
    assert returns(lambda: rm.dequeue(10, 3600.0)) == [b]


def test_remove_drops_queued_and_ready_gangs_up_to_the_attempt() -> None:
    rm, _, _ = make()
    a2 = gang("a", attempt=2)
    rm.enqueue([a2])
    rm.remove([("a/0", 1)])  # an older attempt: the queued attempt 2 stays
    assert rm.dequeue(10, SHORT) == [a2]
    rm.set_placements([placement(a2)], [])
    rm.remove([("a/0", 1)])
    assert [p.attempt for p in rm.take_placements(10, SHORT)[0]] == [2]
    b = gang("b")
    rm.enqueue([b])
    rm.remove([("b/0", 1)])
    assert rm.dequeue(10, SHORT) == []
    assert "/" in rm.usage()[0]  # attempt 2 of a still holds its allocation
    rm.remove([("a/0", 2)])
    assert rm.usage() == ({}, {})



def test_remove_of_an_old_attempt_keeps_the_new_attempts_allocation() -> None:
    rm, _, _ = make(TEAM)
    a2 = gang("a", attempt=2, n=2, cpu=2, pool="/team")
    rm.enqueue([a2])
    assert rm.dequeue(10, SHORT) == [a2]
    rm.remove([("a/0", 1)])
    assert rm.usage()[0]["/team"].cpu == 4
    assert rm.dequeue(10, SHORT) == []
    rm.enqueue([gang("b", n=2, cpu=2, pool="/team")])
    assert rm.dequeue(10, SHORT) == []  # the limit is taken by a's attempt 2


def test_enqueue_ignores_an_older_attempt_and_replaces_with_a_newer_one() -> None:
    rm, _, _ = make()
    rm.enqueue([gang("a", attempt=2)])
    rm.enqueue([gang("a", attempt=1)])
    assert [g.attempt for g in rm.dequeue(10, SHORT)] == [2]
    rm.enqueue([gang("a", attempt=3)])
    assert [g.attempt for g in rm.dequeue(10, SHORT)] == [3]


def test_stale_placements_and_failures_are_ignored() -> None:
    rm, _, _ = make()
    a1 = gang("a", attempt=1)
    rm.enqueue([a1])
    rm.dequeue(10, SHORT)
    a2 = gang("a", attempt=2)
    rm.enqueue([a2])  # restarted while attempt 1 was being placed
    rm.set_placements([placement(a1)], [failure(a1)])
    assert rm.take_placements(10, SHORT) == ([], [])
    assert rm.dequeue(10, SHORT) == [a2]
    rm.remove([("a/0", 2)])
    rm.set_placements([placement(a2)], [])  # removed (job stopped) while placing
    assert rm.take_placements(10, SHORT) == ([], [])
    # nobody will launch either placement: their claims are handed out for release
    assert rm.take_orphaned_claims() == [("a/0", 1), ("a/0", 2)]
    assert rm.take_orphaned_claims() == []


def test_claims_of_placements_dropped_before_jobmgr_took_them_are_orphaned() -> None:
    rm, _, _ = make()
    ready, handed, replaced, queued = gang("ready", at=1), gang("handed"), gang("replaced", at=2), gang("queued", at=3)
    rm.enqueue([handed])
    assert rm.dequeue(10, SHORT) == [handed]
    rm.set_placements([placement(handed)], [])
    assert rm.take_placements(10, SHORT)[0] == [placement(handed)]
    rm.enqueue([ready, replaced, queued])
    assert rm.dequeue(2, SHORT) == [ready, replaced]
    rm.set_placements([placement(ready), placement(replaced)], [])
    rm.remove([("ready/0", 1), ("handed/0", 1), ("queued/0", 1)])
    rm.enqueue([gang("replaced", attempt=2)])  # a newer attempt replaces the READY one
    # the HANDED placement is jobmgr's (its launcher releases what it does not launch); a queued gang held none
    assert rm.take_orphaned_claims() == [("ready/0", 1), ("replaced/0", 1)]


def test_reset_orphans_the_claims_of_ready_placements() -> None:
    rm, _, _ = make()
    a, b = gang("a", at=1), gang("b", at=2)
    rm.enqueue([a, b])
    assert rm.dequeue(10, SHORT) == [a, b]
    rm.set_placements([placement(a)], [])  # READY; b is still being placed
    rm.reset()
    rm.enqueue([a, b])  # the job manager's recovery queues them again, same attempts
    rm.set_placements([placement(b)], [])  # b's round ends after the reset: its entry is not PLACING any more
    assert rm.take_orphaned_claims() == [("a/0", 1), ("b/0", 1)]
    assert rm.dequeue(10, SHORT) == [a, b]  # placed again (the engine releases the orphans first)


def test_an_orphaned_claim_wakes_a_waiting_dequeue() -> None:
    rm, _, _ = make()
    a = gang("a")
    rm.enqueue([a])
    rm.dequeue(10, SHORT)
    rm.set_placements([placement(a)], [])
    threading.Timer(0.05, rm.remove, args=([("a/0", 1)],)).start()
    assert returns(lambda: rm.dequeue(10, 3600.0)) == []
    assert rm.take_orphaned_claims() == [("a/0", 1)]


def test_enqueue_with_running_counts_the_allocation() -> None:
    rm, _, _ = make(TEAM)
    running = gang("r", n=3, cpu=1, pool="/team")
    rm.enqueue([], running=[running])
    alloc, queued = rm.usage()
    assert alloc["/team"] == Resources(cpu=3, mem=768) and queued == {}
    assert rm.dequeue(10, SHORT) == []  # adopted gangs are not placed again
    b = gang("b", n=2, cpu=1, pool="/team")
    rm.enqueue([b])
    assert rm.dequeue(10, SHORT) == []
    _, pending = rm.take_placements(10, SHORT)
    assert [f.job_id for f in pending] == ["b"]
    rm.remove([("r/0", 1)])
    assert rm.dequeue(10, SHORT) == [b]


def test_usage_sums_up_the_tree_and_counts_queued_per_pool() -> None:
    sub = ResourcePool("/team/sub")
    rm, _, _ = make(ResourcePool("/team"), sub)
    rm.enqueue([gang("a", n=1, cpu=2, gpu=1, pool="/team/sub"), gang("b", n=1, cpu=1, pool="/team"),
                gang("c", n=1, cpu=1, pool="/team", at=1)])
    rm.dequeue(2, SHORT)
    alloc, queued = rm.usage()
    assert alloc["/team/sub"] == Resources(cpu=2, mem=256, gpu=1)
    assert alloc["/team"] == Resources(cpu=3, mem=512, gpu=1)
    assert alloc["/"] == alloc["/team"]
    assert queued == {"/team/sub": 1, "/team": 2}


def test_refresh_pools_applies_a_new_limit_and_unparks() -> None:
    rm, _, pools = make(TEAM)
    a = gang("a", n=2, cpu=2, pool="/team", at=1)
    b = gang("b", n=2, cpu=2, pool="/team", at=2)
    rm.enqueue([a, b])
    assert rm.dequeue(10, SHORT) == [a]
    assert rm.dequeue(10, SHORT) == []
    pools.pools[1] = ResourcePool("/team", limit=Resources(cpu=8))
    rm.refresh_pools()
    assert rm.dequeue(10, SHORT) == [b]


# --- placements are kept until the job manager says what became of them -----------------------------------
def _placed(rm: ResourceManager, g: GangRequest) -> GangPlacement:
    rm.enqueue([g])
    assert rm.dequeue(10, SHORT) == [g]
    p = placement(g)
    rm.set_placements([p], [])
    assert rm.take_placements(10, SHORT)[0] == [p]
    return p


def test_a_handed_out_placement_is_kept_until_acknowledged_done() -> None:
    rm, _, _ = make(TEAM)
    a = gang("a", n=2, cpu=2, pool="/team")
    _placed(rm, a)
    assert rm.unknown([("a/0", 1)]) == []  # still held: the periodic check does not re-enqueue it
    rm.enqueue([a])  # a repeat of the same attempt changes nothing
    assert rm.dequeue(10, SHORT) == []
    rm.ack_placements(done=[("a/0", 1)], retry=[])
    assert rm.usage()[0]["/team"].cpu == 4  # the launched gang keeps its allocation until it is removed
    assert rm.unknown([("a/0", 1)]) == []  # known by its allocation: the periodic check leaves it alone
    assert rm.unknown([("a/0", 2)]) == [("a/0", 2)]  # a newer attempt is not
    assert rm.take_placements(10, SHORT) == ([], [])
    rm.reset()  # a restarted resmgr: neither queued nor allocated
    assert rm.unknown([("a/0", 1)]) == [("a/0", 1)]


def test_a_placement_whose_intent_failed_goes_back_to_the_queue() -> None:
    rm, clock, _ = make(TEAM)
    a = gang("a", n=2, cpu=2, pool="/team")
    _placed(rm, a)
    rm.ack_placements(done=[], retry=[("a/0", 1)])
    assert rm.usage()[0].get("/team", Resources()).cpu == 0  # its allocation is given back
    assert rm.dequeue(10, SHORT) == []  # after the back-off
    clock.t += RETRY_AFTER_FAILED_PLACEMENT_S + 0.01
    assert rm.dequeue(10, SHORT) == [a]


def test_a_placement_never_acknowledged_goes_back_to_the_queue() -> None:
    rm, clock, _ = make()
    a = gang("a")
    _placed(rm, a)
    clock.t += HANDED_TIMEOUT_S + 1
    assert rm.take_placements(10, SHORT) == ([], [])  # expires the hand-over
    assert rm.dequeue(10, SHORT) == [a]


def test_acks_for_other_attempts_or_states_are_ignored() -> None:
    rm, _, _ = make()
    a = gang("a")
    _placed(rm, a)
    rm.ack_placements(done=[("a/0", 2)], retry=[("a/0", 7), ("zz/0", 1)])
    assert rm.unknown([("a/0", 1)]) == []


def test_stale_failures_are_retried_at_once_without_a_reason() -> None:
    rm, _, _ = make()
    a = gang("a")
    rm.enqueue([a])
    assert rm.dequeue(10, SHORT) == [a]
    rm.set_placements([], [], stale=[failure(a, "host h1 changed since placement")])
    assert rm.take_placements(10, SHORT) == ([], [])  # no user-visible reason: it was not the gang's fault
    assert rm.dequeue(10, SHORT) == [a]  # no back-off


def test_unknown_lists_what_resmgr_does_not_hold() -> None:
    rm, _, _ = make()
    rm.enqueue([gang("a", attempt=2)])
    assert rm.unknown([("a/0", 1), ("a/0", 2), ("a/0", 3), ("b/0", 1)]) == [("a/0", 3), ("b/0", 1)]


def test_reset_forgets_everything() -> None:
    rm, _, _ = make(TEAM)
    _placed(rm, gang("a", n=1, pool="/team"))
    rm.enqueue([gang("b")])
    rm.reset()
    assert rm.usage() == ({}, {}) and rm.dequeue(10, SHORT) == []


def test_no_more_than_the_window_is_in_flight_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Back-pressure: placement cannot run ahead of the launchers by more than MAX_IN_FLIGHT gangs (else claims
    expire while they wait, are refused at launch, placed again, and expire again)."""
    import peloton.resmgr.manager as mod

    monkeypatch.setattr(mod, "MAX_IN_FLIGHT", 3)
    rm, _, _ = make()
    gs = [gang(f"j{i}", at=i) for i in range(5)]
    rm.enqueue(gs)
    assert [g.job_id for g in rm.dequeue(10, SHORT)] == ["j0", "j1", "j2"]
    assert rm.dequeue(10, SHORT) == []  # full: nothing more until some launch is durable
    rm.set_placements([placement(g) for g in gs[:3]], [])
    handed, _ = rm.take_placements(10, SHORT)
    assert rm.dequeue(10, SHORT) == []  # handed out, not yet recorded
    rm.ack_placements(done=[(handed[0].gang_id, 1)], retry=[])
    assert [g.job_id for g in rm.dequeue(10, SHORT)] == ["j3"]
    rm.remove([("j1/0", 1)])
    assert [g.job_id for g in rm.dequeue(10, SHORT)] == ["j4"]


def test_ready_placements_are_handed_out_highest_priority_first() -> None:
    rm, _, _ = make()
    low, high = gang("low", priority=0, at=1), gang("high", priority=9, at=2)
    rm.enqueue([low])
    rm.dequeue(10, SHORT)
    rm.set_placements([placement(low)], [])
    rm.enqueue([high])
    rm.dequeue(10, SHORT)
    rm.set_placements([placement(high)], [])
    assert [p.job_id for p in rm.take_placements(1, SHORT)[0]] == ["high"]
    assert [p.job_id for p in rm.take_placements(1, SHORT)[0]] == ["low"]


# --- entitlement ------------------------------------------------------------------------------------------------
A = ResourcePool("/a", reservation=Resources(gpu=4))
B = ResourcePool("/b", reservation=Resources(gpu=4))
CLUSTER = Resources(cpu=64, mem=65536, gpu=8)


def reasons(rm: ResourceManager) -> dict[str, str]:
    return {f.job_id: f.reason for f in rm.take_placements(10, SHORT)[1]}


def test_without_a_known_capacity_entitlement_is_not_enforced() -> None:
    rm, _, _ = make(A, B)
    rm.enqueue([gang(f"a{i}", n=1, gpu=4, pool="/a", at=i) for i in range(3)])
    assert len(rm.dequeue(10, SHORT)) == 3  # placement is the judge
    assert rm.pool_usage()["/a"].entitlement is None


def test_pools_share_the_cluster_by_entitlement_and_idle_capacity_is_lent() -> None:
    rm, _, _ = make(A, B)
    rm.enqueue([gang(f"a{i}", n=1, gpu=4, pool="/a", at=i) for i in range(3)] + [gang("b0", n=1, gpu=4, pool="/b",
                                                                                        at=9)])
    got = rm.dequeue(10, SHORT, CLUSTER)
    assert sorted(g.job_id for g in got) == ["a0", "b0"]  # 4 GPUs each: their reservations
    why = reasons(rm)
    assert why["a1"] == ("waiting for admission: over pool /a's entitlement in gpu (entitled to 4 now, holds 4, the "
                         "gang needs 4) (or beyond it, borrowing, once the cluster has room for the whole gang)")
    usage = rm.pool_usage()
    assert usage["/a"].entitlement is not None and usage["/a"].entitlement.gpu == 4
    assert usage["/a"].demand == Resources(cpu=2, mem=512, gpu=8) and usage["/a"].queued == 3  # a0 is placing
    assert usage["/a"].allocated == Resources(cpu=1, mem=256, gpu=4)
    assert usage["/"].demand == Resources(cpu=2, mem=512, gpu=8)
    # b's gang ends: its reservation is lent to a, whose next gang is admitted at once
    rm.remove([("b0/0", 1)])
    assert [g.job_id for g in rm.dequeue(10, SHORT, CLUSTER)] == ["a1"]
    assert rm.pool_usage()["/a"].entitlement.gpu == 8  # type: ignore[union-attr]


def test_a_static_reservation_is_held_while_its_pool_is_idle() -> None:
    rm, _, pools = make(A, ResourcePool("/b", reservation=Resources(gpu=4), reservation_type="static"))
    rm.enqueue([gang(f"a{i}", n=1, gpu=4, pool="/a", at=i) for i in range(2)])
    assert [g.job_id for g in rm.dequeue(10, SHORT, CLUSTER)] == ["a0"]
    pools.pools[2] = B  # elastic now: lent
    rm.refresh_pools()
    assert [g.job_id for g in rm.dequeue(10, SHORT, CLUSTER)] == ["a1"]


def test_more_capacity_admits_more_and_the_root_is_left_to_placement() -> None:
    rm, _, _ = make(A, B)
    rm.enqueue([gang(f"a{i}", n=1, gpu=4, pool="/a", at=i) for i in range(3)] +
               [gang(f"r{i}", n=1, gpu=8, pool="/", at=10 + i) for i in range(2)])
    assert sorted(g.job_id for g in rm.dequeue(10, SHORT, Resources(cpu=64, mem=65536, gpu=4))) == ["a0", "r0", "r1"]
    assert [g.job_id for g in rm.dequeue(10, SHORT, Resources(cpu=64, mem=65536, gpu=12))] == ["a1"]


def test_a_non_preemptible_gang_runs_only_within_its_pools_reservation() -> None:
    rm, _, _ = make(ResourcePool("/a", reservation=Resources(cpu=8, mem=8192, gpu=4)), B)
    pinned = [dataclasses.replace(gang(f"p{i}", n=1, gpu=3, pool="/a", at=i), preemptible=False) for i in range(2)]
    rm.enqueue(pinned)
    assert [g.job_id for g in rm.dequeue(10, SHORT, CLUSTER)] == ["p0"]
    assert reasons(rm)["p1"] == (
        "waiting for admission: the gang is not preemptible, so it runs only within pool /a's reservation, short "
        "in gpu (reserves 4, its non-preemptible gangs hold 3, the gang needs 3)")
    root = dataclasses.replace(gang("r", n=1, gpu=1, at=5), preemptible=False)
    rm.enqueue([root])
    assert [g.job_id for g in rm.dequeue(10, SHORT, CLUSTER)] == ["r"]  # the root reserves nothing, takes anything


def test_pool_metrics_follow_the_entitlements_and_fall_back_to_zero() -> None:
    from prometheus_client import REGISTRY

    def metric(name: str, **labels: str) -> float | None:
        return REGISTRY.get_sample_value(name, labels)

    rm, _, _ = make(ResourcePool("/m1", reservation=Resources(gpu=4)), ResourcePool("/m2", reservation=Resources(gpu=4)))
    rm.enqueue([gang("m", n=2, gpu=2, pool="/m1")])
    rm.dequeue(10, SHORT, CLUSTER)
    rm.enqueue([gang("w", n=1, gpu=8, pool="/m1", at=5)])
    rm.dequeue(10, SHORT, CLUSTER)
    assert metric("peloton_pool_allocation", pool="/m1", resource="gpu") == 4
    assert metric("peloton_pool_allocation", pool="/m1", resource="mem") == 2 * 256 * 1024 * 1024  # bytes
    assert metric("peloton_pool_demand", pool="/m1", resource="gpu") == 8
    assert metric("peloton_pool_queued_gangs", pool="/m1") == 2  # m is placing, w waits
    assert metric("peloton_pool_entitlement", pool="/m1", resource="gpu") == 8  # m2 idle: lent
    rm.remove([("m/0", 1), ("w/0", 1)])
    rm.dequeue(10, SHORT, CLUSTER)
    assert metric("peloton_pool_allocation", pool="/m1", resource="gpu") == 0
    assert metric("peloton_pool_demand", pool="/m1", resource="gpu") == 0
    assert metric("peloton_pool_queued_gangs", pool="/m1") == 0


def test_the_queue_in_order_with_positions_per_pool_and_a_subtree_filter() -> None:
    rm, _, _ = make(TEAM, ResourcePool("/team/a"), ResourcePool("/other"))
    rm.enqueue([gang("big", n=4, cpu=1, pool="/team", at=1), gang("t1", n=1, cpu=1, pool="/team", at=2),
                gang("t2", n=1, cpu=1, pool="/team", at=3, priority=7), gang("o1", n=1, pool="/other", at=4),
                gang("ta", n=1, pool="/team/a", at=5)])
    rm.dequeue(1, SHORT)  # t2 (priority 7) is admitted first: placing
    everything, total = rm.queue()
    assert total == 5
    assert [(g.job_id, g.pool, g.position, g.state) for g in everything] == [
        ("t2", "/team", 1, "placing"), ("big", "/team", 2, "waiting"), ("t1", "/team", 3, "waiting"),
        ("o1", "/other", 1, "waiting"), ("ta", "/team/a", 1, "waiting")]
    assert everything[1].members == 4 and everything[1].total == Resources(cpu=4, mem=1024)
    team, total = rm.queue("/team", limit=2)
    assert [g.job_id for g in team] == ["t2", "big"] and total == 4  # /team/a is in its subtree, /other is not
    assert rm.queue("/team/a")[0][0].job_id == "ta"


def test_a_pools_first_gang_over_its_entitlement_holds_back_the_smaller_gangs_behind_it() -> None:
    rm, _, _ = make(A, B)
    rm.enqueue([gang("a0", n=1, gpu=3, pool="/a", at=0)])
    assert [g.job_id for g in rm.dequeue(10, SHORT, CLUSTER)] == ["a0"]
    # /b asks for its reservation: /a is entitled to 4 now and holds 3; its next gang needs 4
    rm.enqueue([gang("b0", n=1, gpu=4, pool="/b", at=1), gang("a1", n=1, gpu=4, pool="/a", at=2),
                gang("a2", n=1, gpu=1, pool="/a", at=3)])
    assert [g.job_id for g in rm.dequeue(10, SHORT, CLUSTER)] == ["b0"]
    queued = {q.job_id: q for q in rm.queue("/a")[0]}
    assert queued["a1"].reason.startswith("waiting for admission: over pool /a's entitlement")
    # a2 would fit, but it does not overtake a1 (which would starve)
    assert (queued["a2"].position, queued["a2"].state) == (3, "waiting")  # a0 is 1: being placed
    assert queued["a2"].reason == "waiting behind a1/0, the first gang of pool /a's queue"
    # a higher-priority gang goes first
    rm.enqueue([gang("a3", n=1, gpu=1, pool="/a", at=4, priority=5)])
    assert [g.job_id for g in rm.dequeue(10, SHORT, CLUSTER)] == ["a3"]


def test_close_answers_every_long_poll_at_once() -> None:
    rm, _, _ = make()
    got: list[object] = []
    threads = [threading.Thread(target=lambda: got.append(rm.dequeue(10, 3600.0)), daemon=True),
               threading.Thread(target=lambda: got.append(rm.take_placements(10, 3600.0)), daemon=True)]
    for t in threads:
        t.start()
    time.sleep(0.1)
    rm.close()
    for t in threads:
        t.join(30)  # (long polls of an hour: ended by the close)
    assert sorted(map(str, got)) == ["([], [])", "[]"]
    assert rm.dequeue(10, 30.0) == []  # and later ones at once


def test_the_queued_and_placing_stages_are_timed_once_per_gang() -> None:
    from peloton.observability.gang_metrics import GANG_STAGE

    def count(stage: str) -> float:
        for m in GANG_STAGE.collect():
            for s in m.samples:
                if s.name.endswith("_count") and s.labels.get("stage") == stage:
                    return s.value
        return 0.0

    rm, clock, _ = make()
    g = gang("s", at=1)
    queued, placing = count("queued"), count("placing")
    rm.enqueue([g])
    clock.t += 2
    assert rm.dequeue(10, SHORT) == [g]
    rm.set_placements([], [failure(g)])  # unplaced: admitted again later, not counted again
    clock.t += 5
    assert rm.dequeue(10, SHORT) == [g]
    rm.set_placements([placement(g)], [])
    assert count("queued") == queued + 1 and count("placing") == placing + 1


# --- the placement engine and the job manager replaced (a standby took over, or the process restarted) ---------
def test_a_new_placement_engine_takes_back_what_the_last_one_was_placing() -> None:
    """The engine that dequeued a gang died before it answered: the next engine gets the gang at once (no
    timeout), the claims the last one may have made are released first, and a late answer of the last one is
    dropped (its placement's claim released too) instead of handing out the gang twice."""
    rm, _, _ = make()
    g = gang("j")
    rm.enqueue([g])
    assert rm.dequeue(10, SHORT, engine="engine-a") == [g]
    # an engine answers before it asks again: asking again unanswered, its answer was lost, so the gang is its again
    # (test_lost_answers.py), the claim it may have made released first
    assert rm.dequeue(10, SHORT, engine="engine-a") == [g]
    assert rm.dequeue(10, SHORT, engine="engine-b") == [g]
    assert rm.take_orphaned_claims() == [("j/0", 1)]
    rm.set_placements([placement(g)], [], engine="engine-a")  # the replaced engine's late answer
    assert rm.take_orphaned_claims() == [("j/0", 1)]
    assert rm.take_placements(10, SHORT) == ([], [])  # not placed by it
    assert rm.dequeue(10, SHORT, engine="engine-a") == []  # a replaced engine is never answered again
    rm.set_placements([placement(g)], [], engine="engine-b")
    assert [p.gang_id for p in rm.take_placements(10, SHORT)[0]] == ["j/0"]


def test_a_long_poll_of_a_replaced_engine_admits_nothing() -> None:
    """A placement engine killed during its dequeue's long poll leaves that call waiting in resmgr: once another
    engine has asked, the gang enqueued next goes to the new one, not into the dead call."""
    rm, _, _ = make()
    got: list[list[GangRequest]] = []
    waiting = threading.Thread(target=lambda: got.append(rm.dequeue(10, 2.0, engine="engine-a")))
    waiting.start()
    time.sleep(0.05)
    assert rm.dequeue(10, SHORT, engine="engine-b") == []
    g = gang("j")
    rm.enqueue([g])
    waiting.join(5)
    assert got == [[]]
    assert rm.dequeue(10, SHORT, engine="engine-b") == [g]


def test_a_new_job_manager_is_handed_what_the_last_one_took_and_did_not_acknowledge() -> None:
    rm, _, _ = make()
    g = gang("j")
    _placed(rm, g)  # handed to a caller without an id
    rm.enqueue([gang("k")])
    assert [p.gang_id for p in rm.take_placements(10, SHORT, consumer="jobmgr-a")[0]] == []
    k = rm.dequeue(10, SHORT)
    rm.set_placements([placement(x) for x in k], [])
    assert [p.gang_id for p in rm.take_placements(10, SHORT, consumer="jobmgr-a")[0]] == ["k/0"]
    # jobmgr-a dies before it acknowledges: its standby gets the same placement at once (same claims)
    again = rm.take_placements(10, SHORT, consumer="jobmgr-b")[0]
    assert sorted(p.gang_id for p in again) == ["j/0", "k/0"]
    assert rm.take_placements(10, SHORT, consumer="jobmgr-a") == ([], [])  # replaced: handed nothing


def test_a_long_poll_of_a_replaced_job_manager_is_handed_nothing() -> None:
    rm, _, _ = make()
    got: list[tuple[list[GangPlacement], list[PlacementFailure]]] = []
    waiting = threading.Thread(target=lambda: got.append(rm.take_placements(10, 2.0, consumer="jobmgr-a")))
    waiting.start()
    time.sleep(0.05)
    assert rm.take_placements(10, SHORT, consumer="jobmgr-b") == ([], [])
    g = gang("j")
    rm.enqueue([g])
    rm.set_placements([placement(x) for x in rm.dequeue(10, SHORT)], [])
    waiting.join(5)
    assert got == [([], [])]
    assert [p.gang_id for p in rm.take_placements(10, SHORT, consumer="jobmgr-b")[0]] == ["j/0"]


def test_next_due_is_an_unplaced_gangs_retry_unless_only_changes_matter() -> None:
    clock = Clock()
    rm = ResourceManager(Pools(), clock=clock, rate_clock=clock)  # (one clock: the replay's)
    a = gang("a")
    rm.enqueue([a])
    assert rm.dequeue(10, 0.0, Resources(cpu=8, mem=4096)) == [a]
    rm.set_placements([], [failure(a)])
    clock.t += 0.1
    assert rm.dequeue(10, 0.0) == []  # (capacity freed: the unpark is done, the gang held for its back-off)
    assert rm.next_due() == clock.t - 0.1 + RETRY_AFTER_FAILED_PLACEMENT_S
    # a replay leaves the retry out: with nothing changed it can only fail again; the first probe past the
    # settling window (10 s from its first failure) is still due
    assert rm.next_due(retries=False) == clock.t - 0.1 + 10.0


def test_the_hosts_maps_view_of_the_queue_is_each_waiting_gangs_distinct_gpu_asks() -> None:
    """ResourceManager.waiting(): a gang of many alike members is one ask, made once for its request; gangs without
    GPUs ask nothing of the map; a gang that left the queue is forgotten."""
    rm, _, _ = make()
    big, cpu_only = gang("big", n=512, gpu=8), gang("cpu")
    rm.enqueue([big, cpu_only])
    w = rm.waiting()
    assert [a.resources for a in w.asks] == [Resources(cpu=1, mem=256, gpu=8)] and w.reserved == {}
    assert rm.waiting().asks[0] is w.asks[0]  # made once
    assert {g.gang_id for g in rm.dequeue(2, SHORT)} == {"big/0", "cpu/0"}  # being placed: still waiting for hosts
    assert len(rm.waiting().asks) == 1
    rm.set_placements([placement(big), placement(cpu_only)], [])
    assert rm.waiting().asks == ()


class _Wakes:
    """Counts the wakes of one of the manager's conditions (it still wakes: the real method is called)."""

    def __init__(self, cond: threading.Condition) -> None:
        self.n = 0
        real_notify = cond.notify

        def notify(n: int = 1) -> None:
            self.n += 1
            real_notify(n)

        def notify_all() -> None:  # (Condition.notify_all calls self.notify: counted once here)
            self.n += 1
            real_notify(len(cond._waiters))  # type: ignore[attr-defined]

        cond.notify, cond.notify_all = notify, notify_all  # type: ignore[method-assign]


def test_a_batch_of_placements_wakes_the_launchers_side_once_and_not_the_engines() -> None:
    rm, clock, _ = make()
    gs = [gang(f"j{i}", at=i) for i in range(3)]
    rm.enqueue(gs)
    assert rm.dequeue(10, SHORT) == gs
    engine, launchers = _Wakes(rm._cond), _Wakes(rm._ready)
    rm.set_placements([placement(g) for g in gs], [])
    assert (engine.n, launchers.n) == (0, 1)
    # a failure puts a gang back in the queue (news for admission), and its reason is news for jobmgr
    rm.enqueue([g4 := gang("j4", at=4)])
    assert rm.dequeue(10, SHORT) == [g4]
    engine.n = launchers.n = 0
    rm.set_placements([], [failure(g4)])
    assert engine.n == 1 and launchers.n >= 1
    # an enqueue is news for the engines only
    engine.n = launchers.n = 0
    rm.enqueue([gang("j5", at=5)])
    assert (engine.n, launchers.n) == (1, 0)


def test_a_launcher_leaving_placements_passes_the_wake_on() -> None:
    """One wake for a batch: the launcher woken takes its share and wakes the next while placements are left,
    so that every waiting launcher gets one without waiting out its long poll."""
    rm, _, _ = make()
    gs = [gang(f"j{i}", at=i) for i in range(3)]
    rm.enqueue(gs)
    assert rm.dequeue(10, SHORT) == gs
    got: list[list[GangPlacement]] = []
    lock = threading.Lock()

    def take() -> None:
        placements, _ = rm.take_placements(1, 60.0)
        with lock:
            got.append(placements)

    threads = [threading.Thread(target=take, daemon=True) for _ in range(3)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 10
    while len(rm._ready._waiters) < 3 and time.monotonic() < deadline:  # type: ignore[attr-defined]
        time.sleep(0.01)  # every launcher waits before the batch comes
    rm.set_placements([placement(g) for g in gs], [])
    for t in threads:
        t.join(20)  # (far less than the long poll's 60 s: a launcher never woken would still be waiting)
    assert not any(t.is_alive() for t in threads)
    assert sorted(p.job_id for ps in got for p in ps) == ["j0", "j1", "j2"] and all(len(ps) == 1 for ps in got)


def test_pool_metrics_stay_published_after_another_manager_forgets_the_pool() -> None:
    """Each manager keeps its pools' series; one removed from the registry by another manager (its pool gone
    there) is looked up again, not set where nobody reads it."""
    from prometheus_client import REGISTRY

    def queued(pool: str) -> float | None:
        return REGISTRY.get_sample_value("peloton_pool_queued_gangs", {"pool": pool})

    a, _, _ = make(ResourcePool("/kept"))
    b, _, b_pools = make(ResourcePool("/kept"))
    a.enqueue([gang("x", pool="/kept")])
    assert a.dequeue(10, SHORT, CLUSTER) and queued("/kept") == 1
    b_pools.pools = [ResourcePool("/")]
    b.refresh_pools()  # /kept is gone for b: its series is removed
    assert queued("/kept") is None
    a.enqueue([gang("y", pool="/kept")])
    a.dequeue(10, SHORT, CLUSTER)
    assert queued("/kept") == 2
