"""The resource manager's pure cores alone, without the shell's lock or clock: the pool paths, the holdings book,
the queues and their states, the admission round, the probes and the preemption orders."""

from __future__ import annotations

import dataclasses
import random

from peloton.domain.allocation import Entitlement
from peloton.domain.model import ResourcePool
from peloton.domain.placement import GangRequest, MemberAssignment, MemberRequest
from peloton.domain.resources import Resources
from peloton.placement.reservation import Reservation
from peloton.resmgr.admission import admission_round, admit
from peloton.resmgr.callers import MAX_RETIRED, Current
from peloton.resmgr.entitlement import entitlements, policies
from peloton.resmgr.holdings import Holdings
from peloton.resmgr.paths import chain, sub, subtree_sums
from peloton.resmgr.preemption import PROBE_EVERY_S, Preemptions, find_probes, reclaim_candidates
from peloton.resmgr.queues import Entry, Queues, State
from tests.unit.test_resmgr import gang, placement

R = Resources


def running(job: str, *, pool: str = "/p", cpu: float = 1, priority: int = 0, preemptible: bool = True,
            max_runtime_s: float = 0.0, since: float = 0.0, host: str = "h1") -> GangRequest:
    r = R(cpu=cpu, mem=256)
    return GangRequest(f"{job}/0", job, 1, (MemberRequest(0, f"{job}-0-1", r, host),), priority, pool,
                       preemptible=preemptible, running_since=since, max_runtime_s=max_runtime_s)


# --- paths ------------------------------------------------------------------------------------------------------
def test_subtree_sums_add_each_pool_to_its_known_ancestors() -> None:
    assert chain("/a/b") == ("/a/b", "/a", "/")
    got = subtree_sums({"/a/b": R(cpu=1), "/a": R(cpu=2), "/x/y": R(cpu=4)}, {"/", "/a", "/a/b"})
    assert got == {"/a/b": R(cpu=1), "/a": R(cpu=3), "/": R(cpu=7), "/x/y": R(cpu=4)}  # /x unknown: skipped


def test_a_figure_taken_down_to_zero_leaves_the_book() -> None:
    book = {"/p": R(cpu=2)}
    sub(book, "/p", R(cpu=1))
    assert book == {"/p": R(cpu=1)}
    sub(book, "/p", R(cpu=1))
    assert book == {}


def test_the_books_empty_exactly_when_their_last_gang_goes_whatever_the_float_residue() -> None:
    """Sums of inexact quantities (0.1 cores, 1.1Gi) do not come back to 0 when taken away in another order: after
    3,000 gangs held and released, /p still 'held' 5e-9 MiB and 6e-13 cores with no gang, for ever (and every
    later sum carried it). The books list only holders: a figure goes with its last gang."""
    gangs = [GangRequest(f"g{i}/0", f"g{i}", 1, (MemberRequest(0, f"g{i}-0-1", R(cpu=0.1 * (1 + i % 7),
                                                                             mem=1126.4 * (1 + i % 5))),),
                         0, "/p", preemptible=bool(i % 3)) for i in range(3000)]
    h, q = Holdings(), Queues()
    for g in gangs:
        h.hold(g)
        q.add(g, 0.0)
    order = list(gangs)
    random.Random(1).shuffle(order)
    for g in order:
        h.release(g.gang_id, 1)
        q.drop(g.gang_id)
    assert (h.allocated, h.own, h.pinned, q.demand) == ({}, {}, {}, {})


# --- holdings ---------------------------------------------------------------------------------------------------
def test_holdings_sum_per_pool_and_subtree_and_pin_only_non_preemptible_gangs() -> None:
    released: list[str] = []
    h = Holdings(on_release=released.append)
    h.hold(running("a", pool="/t/l", cpu=2))
    h.hold(running("b", pool="/t/l", cpu=1, preemptible=False))
    h.hold(running("c", pool="/t", cpu=4))
    assert h.allocated == {"/t/l": R(cpu=3, mem=512), "/t": R(cpu=7, mem=768), "/": R(cpu=7, mem=768)}
    assert h.own == {"/t/l": R(cpu=3, mem=512), "/t": R(cpu=4, mem=256)}
    assert h.pinned == {"/t/l": R(cpu=1, mem=256)}
    assert h.pool_gangs == {"/t/l": {"a/0": None, "b/0": None}, "/t": {"c/0": None}}
    assert h.release("b/0", 1) is not None and released == ["b/0"]
    assert h.pinned == {} and h.allocated["/"] == R(cpu=6, mem=512)


def test_a_newer_attempts_holding_is_not_released_for_an_older_one() -> None:
    h = Holdings()
    h.hold(dataclasses.replace(running("a"), attempt=3))
    assert h.release("a/0", 2) is None and h.get("a/0") is not None
    assert h.release("a/0", 3) is not None and h.by_gang == {} and h.allocated == {} and h.pool_gangs == {}


def test_holding_an_attempt_again_replaces_the_older_one_and_reports_its_release() -> None:
    released: list[str] = []
    h = Holdings(on_release=released.append)
    h.hold(running("a", cpu=2))
    h.hold(dataclasses.replace(running("a", cpu=1), attempt=2))
    assert released == ["a/0"] and h.own == {"/p": R(cpu=1, mem=256)} and h.by_gang["a/0"].attempt == 2


def test_the_earliest_ends_come_first_and_only_placed_gangs_with_a_max_runtime_count() -> None:
    h = Holdings()
    h.hold(running("late", max_runtime_s=100, since=50))
    h.hold(running("soon", max_runtime_s=10, since=50))
    h.hold(running("forever", since=50))
    h.hold(dataclasses.replace(running("unplaced", max_runtime_s=1), members=(MemberRequest(0, "u", R(cpu=1)),)))
    assert [gid for gid, _ in h.earliest_ends(10)] == ["soon/0", "late/0"]
    assert [gid for gid, _ in h.earliest_ends(1)] == ["soon/0"]


def test_placed_records_where_and_since_when_only_for_the_same_attempt() -> None:
    h = Holdings()
    h.hold(gang("a", n=1, pool="/p"))
    assert h.by_gang["a/0"].usage == ()  # admitted, not placed: no hosts yet
    usage = (("h9", R(cpu=1)),)
    h.placed("a/0", 2, usage, 77.0)
    assert h.by_gang["a/0"].usage == ()
    h.placed("a/0", 1, usage, 77.0)
    assert h.by_gang["a/0"].usage == usage and h.by_gang["a/0"].since == 77.0


# --- queues -----------------------------------------------------------------------------------------------------
def test_a_pools_queue_is_by_priority_then_age_and_skips_dropped_entries() -> None:
    q = Queues()
    for g in (gang("old", at=1), gang("new", at=2), gang("urgent", at=3, priority=5)):
        q.add(g, 0.0)
    assert (e := q.head("/")) is not None and e.req.job_id == "urgent"
    q.drop("urgent/0")
    assert (e := q.head("/")) is not None and e.req.job_id == "old"
    q.pop_head("/")
    assert (e := q.head("/")) is not None and e.req.job_id == "new"
    q.pop_head("/")
    assert q.head("/") is None and q.waiting_pools() == []  # an empty queue is forgotten


def test_demand_counts_waiting_gangs_only() -> None:
    q = Queues()
    e = q.add(gang("a", n=2, cpu=1, pool="/p"), 0.0)
    assert q.demand == {"/p": R(cpu=2, mem=512)}
    q.admit(e)
    assert q.demand == {} and q.in_flight == {"a/0"} and e.state == State.PLACING
    q.push(e, 0.0)
    assert q.demand == {"/p": R(cpu=2, mem=512)} and q.in_flight == set()
    q.drop("a/0")
    assert q.demand == {} and len(q) == 0


def test_a_parked_gang_waits_for_its_time_or_freed_capacity_unless_held() -> None:
    q = Queues()
    a, b = q.add(gang("a", at=1), 0.0), q.add(gang("b", at=2), 0.0)
    for e in (a, b):
        q.pop_head("/")
        q.admit(e)
    a.not_before = b.not_before = 10.0
    q.push(a, 0.0)
    q.push(b, 0.0, hold=True)
    assert q.head("/") is None and q.next_unpark() == 10.0
    q.unpark_all(1.0)  # capacity freed: a comes back, b's back-off holds
    assert (h := q.head("/")) is not None and h is a and q.next_unpark() == 10.0
    q.pop_head("/")
    q.unpark_due(9.9)
    assert q.head("/") is None
    q.unpark_due(10.0)
    assert q.head("/") is b and q.next_unpark() is None


def test_placements_are_handed_best_first_handed_back_and_expire_oldest_first() -> None:
    q = Queues()
    gs = [gang("low", at=1), gang("high", at=2, priority=9)]
    for g in gs:
        e = q.add(g, 0.0)
        q.pop_head("/")
        q.admit(e)
        q.place(e, placement(g))
    assert q.has_ready()
    assert [p.job_id for p in q.hand(1, 5.0)] == ["high"]
    assert [p.job_id for p in q.hand(5, 6.0)] == ["low"] and not q.has_ready()
    assert [e.req.job_id for e in q.expired(65.5, 60.0)] == ["high"]  # handed at 5: past 60 s; low at 6: not yet
    assert q.hand_back() == 2 and q.handed == {} and [p.job_id for p in q.hand(5, 7.0)] == ["high", "low"]


def test_live_finds_only_the_same_attempt_in_the_given_states() -> None:
    q = Queues()
    q.add(gang("a", attempt=2), 0.0)
    assert q.live("a/0", 2, State.WAITING) is not None
    assert q.live("a/0", 1, State.WAITING) is None and q.live("a/0", 2, State.PLACING) is None


def test_the_reason_names_the_victims_a_gang_waits_for_and_counts_changes() -> None:
    q = Queues()
    e = q.add(gang("a"), 0.0)
    e.waits_for = ("v1/0", "v2/0")
    assert q.set_reason(e, "over the entitlement", 0.0, {"v2/0"})
    assert e.reason == "waiting for preempted gangs to exit: v2/0" and q.reasons["a/0"].reason == e.reason
    assert not q.set_reason(e, "", 0.0, {"v2/0"}) and q.reason_changes == 1  # the same: no news
    assert q.set_reason(e, "over the entitlement", 0.0, set()) and e.waits_for == ()  # the victims are gone


def test_the_listing_gives_positions_per_pool_and_says_who_a_gang_waits_behind() -> None:
    q = Queues()
    q.add(gang("a", at=1, pool="/p"), 0.0)
    q.add(gang("b", at=2, pool="/p"), 0.0)
    q.add(gang("c", at=3, pool="/p/x"), 0.0)
    q.add(gang("d", at=4, pool="/other"), 0.0)
    out, total = q.listing("/p", limit=10)
    assert total == 3 and [(g.job_id, g.position) for g in out] == [("a", 1), ("b", 2), ("c", 1)]
    assert out[1].reason == "waiting behind a/0, the first gang of pool /p's queue" and out[2].reason == ""
    assert q.queued() == {"/p": 2, "/p/x": 1, "/other": 1}


def test_the_listing_gives_a_reserved_gangs_hosts_and_expected_start_and_what_it_rests_on() -> None:
    """`peloton queue` and the console's queue: the hosts kept for a gang, sorted, and when they free up: by the
    max_runtime of the gangs there (a time), by victims being preempted (no time), or not bounded at all."""
    q = Queues()
    timed, unbounded, preempting, plain = (q.add(gang(j, at=i, pool=f"/{j}"), 0.0)
                                           for i, j in enumerate(("t", "u", "v", "w")))
    timed.reservation = Reservation(frozenset({"h2", "h10", "h1"}), 1234.5)
    unbounded.reservation = Reservation(frozenset({"h3"}), None)
    preempting.reservation = Reservation(frozenset({"h4"}), None)
    preempting.waits_for = ("victim/0",)
    got = {g.job_id: (g.reserved_hosts, g.expected_start, g.start_basis) for g in q.listing()[0]}
    assert got == {"t": (("h1", "h10", "h2"), 1234.5, "max_runtime"), "u": (("h3",), None, "unknown"),
                   "v": (("h4",), None, "preemption"), "w": ((), None, "")}
    assert plain.reservation is None


def test_each_pools_first_starved_gang_is_a_head_best_first() -> None:
    q = Queues()
    es = [q.add(gang(j, at=i, pool=p, priority=pr), 0.0)
          for i, (j, p, pr) in enumerate([("a", "/p", 0), ("b", "/p", 1), ("c", "/q", 5), ("d", "/r", 0)])]
    for e in es[:3]:
        q.starve(e, 5.0, "pool")
    q.starve(es[3], 5.0, "pool")
    q.drop("d/0")
    assert [e.req.job_id for e in q.starved_heads()] == ["c", "b"] and "d/0" not in q.starved


# --- admission round --------------------------------------------------------------------------------------------
POOLS = {"/": ResourcePool("/"), "/p": ResourcePool("/p", limit=R(cpu=3)),
         "/r": ResourcePool("/r", reservation=R(cpu=1, mem=1024))}


def test_a_round_admits_across_pools_best_first_and_a_blocked_first_gang_stops_its_pool() -> None:
    q, h = Queues(), Holdings()
    q.add(gang("big", n=2, cpu=1, pool="/p", at=1), 0.0)
    q.add(gang("next", n=2, cpu=1, pool="/p", at=2), 0.0)  # fits alone, not beside big (limit cpu=3)
    q.add(gang("small", n=1, cpu=1, pool="/p", at=3), 0.0)  # would fit, but waits behind next
    q.add(gang("root", n=1, pool="/", at=4, priority=1), 0.0)
    got = admission_round(q, h, POOLS, {}, 10, 5.0, 1.0, set())
    assert [e.req.job_id for e in got] == ["root", "big"]
    nxt = q.get("next/0")
    assert nxt is not None and nxt.state == State.WAITING and nxt.block == "pool" and nxt.starved_since == 5.0
    assert "limit cpu=3 would be exceeded" in q.reasons["next/0"].reason
    assert h.allocated["/p"] == R(cpu=2, mem=512) and {e.state for e in got} == {State.PLACING}


def test_a_round_stops_at_max_n() -> None:
    q, h = Queues(), Holdings()
    for i in range(3):
        q.add(gang(f"g{i}", n=1, at=i), 0.0)
    assert [e.req.job_id for e in admission_round(q, h, POOLS, {}, 2, 0.0, 1.0, set())] == ["g0", "g1"]


def test_a_non_preemptible_gang_beyond_its_reservation_backs_off_and_the_gangs_behind_go_on() -> None:
    q, h = Queues(), Holdings()
    q.add(dataclasses.replace(gang("pinned", n=2, cpu=1, pool="/r", at=1), preemptible=False), 0.0)
    q.add(gang("free", n=2, cpu=1, pool="/r", at=2), 0.0)
    got = admission_round(q, h, POOLS, {}, 10, 5.0, 1.0, set())
    assert [e.req.job_id for e in got] == ["free"]
    e = q.get("pinned/0")
    assert e is not None and e.block == "reservation" and e.not_before == 6.0 and q.next_unpark() == 6.0


def test_a_round_checks_the_entitlement_below_the_root() -> None:
    q, h = Queues(), Holdings()
    q.add(gang("a", n=4, cpu=1, pool="/r"), 0.0)
    # 3 cpus in the cluster: too few to borrow beyond the entitlement (with 100 it would: below)
    got = admission_round(q, h, POOLS, {"/": Entitlement(3, 10**6), "/r": Entitlement(2, 10**6)}, 10, 0.0, 1.0,
                          set())
    assert got == [] and "over pool /r's entitlement in cpu" in q.reasons["a/0"].reason
    e = q.get("a/0")
    assert e is not None and e.block == "pool" and e.starved_since == 0.0 and "a/0" in q.starved


def test_a_gang_refused_at_clock_zero_stays_starved_from_then() -> None:
    """A clock may read 0.0 (a replay's does at its start): a gang refused then was "not starved" (0.0 was the
    mark for never): the next refusal restarted its settling window, and the starved heads (those preemption
    may probe for) forgot it."""
    q, h = Queues(), Holdings()
    q.add(gang("a", n=4, cpu=1, pool="/r"), 0.0)
    ent = {"/": Entitlement(3, 10**6), "/r": Entitlement(2, 10**6)}
    assert admission_round(q, h, POOLS, ent, 10, 0.0, 1.0, set()) == []
    e = q.get("a/0")
    assert e is not None and e.starved_since == 0.0
    assert q.starved_heads() == [e]  # still starved: preemption may probe for it
    assert admission_round(q, h, POOLS, ent, 10, 5.0, 1.0, set()) == []
    assert e.starved_since == 0.0  # its window runs from the first refusal
    find_probes(q.starved_heads(), 5.0, 4, 5.0, True, h, POOLS, ent, Resources(cpu=3, mem=10**6), set())
    assert e.probed_at == 5.0  # probed: past the 5 s settling window from 0.0


def test_wait_reasons_show_what_gangs_hold_without_a_float_sums_drift() -> None:
    """Holdings are float sums of inexact quantities (1.1 cores, 1.1Gi = 1126.4 MiB): reasons showed
    `mem=1126400.0000000088Mi`; they show what a person would write (and the CLI takes)."""
    h = Holdings()
    for i in range(1000):
        g = gang(f"g{i}", n=1, pool="/p")
        h.hold(dataclasses.replace(g, members=(dataclasses.replace(g.members[0], resources=R(cpu=1.1, mem=1126.4)),)))
    used = h.allocated["/p"]
    assert used.mem != 1126400.0 and used.cpu != 1100.0  # the drift is there
    pools = {"/": ResourcePool("/"), "/p": ResourcePool("/p", limit=R(cpu=1100, mem=1100 * 1024))}
    why = admit(R(cpu=1.1, mem=1126.4), "/p", pools, h.allocated)
    assert why == ("waiting for admission: pool /p limit cpu=1100,mem=1100Gi would be exceeded in cpu, mem "
                   "(allocated cpu=1100,mem=1100Gi, gang needs cpu=1.1,mem=1126.4Mi)"), why
    q = Queues()
    q.add(gang("a", n=1, cpu=2, pool="/r"), 0.0)
    admission_round(q, h, POOLS, {"/": Entitlement(3, 10**6), "/r": Entitlement(1 / 3, 10**6)}, 10, 0.0, 1.0,
                    set())
    assert "entitled to 0.333 now" in q.reasons["a/0"].reason, q.reasons["a/0"].reason


# --- borrowing beyond the entitlement and backfill at admission ---------------------------------------------------
TWO = {"/": ResourcePool("/"), "/a": ResourcePool("/a"), "/b": ResourcePool("/b")}
GPUS = R(cpu=1000, mem=10**7, gpu=64)


def _ent(q: Queues, h: Holdings, pools: dict[str, ResourcePool] = TWO, cap: Resources = GPUS) -> dict[str, Entitlement]:
    return entitlements(policies(pools.values()), cap, q.demand, h.own)


def _wide(job: str, pool: str, gpus: int, at: float, max_runtime_s: float = 0.0) -> GangRequest:
    return dataclasses.replace(gang(job, n=gpus, cpu=1, gpu=1, pool=pool, at=at), max_runtime_s=max_runtime_s)


def test_two_pools_whose_first_gangs_are_wider_than_their_shares_do_not_deadlock() -> None:
    """Pollux workload-5's stall: each pool entitled to 32 of 64 GPUs, each first gang 48 wide. Before borrowing,
    neither was admitted, nor anything behind them, for ever."""
    q, h = Queues(), Holdings()
    q.add(_wide("a48", "/a", 48, 1), 0.0)
    q.add(_wide("b48", "/b", 48, 2), 0.0)
    q.add(_wide("b8", "/b", 8, 3), 0.0)
    ent = _ent(q, h)
    assert ent["/a"].gpu == ent["/b"].gpu == 32
    got = admission_round(q, h, TWO, ent, 10, 5.0, 1.0, set())
    assert [e.req.job_id for e in got] == ["a48"]  # the first in order borrows 16 GPUs of /b's share
    assert h.allocated["/a"].gpu == 48 and "a48/0" not in q.starved
    b = q.get("b48/0")  # 16 GPUs are left: it waits for them (and b8 behind it: no max_runtime to backfill)
    assert b is not None and b.state == State.WAITING and b.block == "pool"
    assert q.reasons["b48/0"].reason == (
        "waiting for admission: over pool /b's entitlement in gpu (entitled to 32 now, holds 0, the gang needs 48) "
        "(or beyond it, borrowing, once the cluster has room for the whole gang)")
    assert q.get("b8/0").state == State.WAITING  # type: ignore[union-attr]
    # a48 ends: /b alone asks, entitled to the cluster
    h.release("a48/0", 1)
    q.drop("a48/0")
    assert [e.req.job_id for e in admission_round(q, h, TWO, _ent(q, h), 10, 6.0, 1.0, set())] == ["b48", "b8"]


def test_gangs_within_their_share_go_first_then_the_borrowers_best_first() -> None:
    q, h = Queues(), Holdings()
    h.hold(_wide("run", "/a", 40, 0))  # /a holds 40 of 64
    q.add(_wide("a8", "/a", 8, 1), 0.0)  # over /a's share: borrows, first in order, 8 of the 20 free
    q.add(_wide("b48", "/b", 48, 2), 0.0)  # over /b's share, 48 > 12 free: waits
    q.add(_wide("c", "/c", 4, 3), 0.0)  # within /c's share of 4
    pools = {**TWO, "/c": ResourcePool("/c")}
    ent = _ent(q, h, pools)
    assert (ent["/a"].gpu, ent["/b"].gpu, ent["/c"].gpu) == (30, 30, 4)
    got = admission_round(q, h, pools, ent, 10, 0.0, 1.0, set())
    assert [e.req.job_id for e in got] == ["c", "a8"]
    assert q.get("b48/0").state == State.WAITING  # type: ignore[union-attr]


def test_a_gang_later_in_order_does_not_borrow_past_one_that_cannot() -> None:
    q, h = Queues(), Holdings()
    h.hold(_wide("run", "/a", 40, 0))
    q.add(_wide("b48", "/b", 48, 1), 0.0)  # first in order, 24 free: it cannot borrow, and stops the others
    q.add(_wide("a8", "/a", 8, 2), 0.0)  # /a holds 40 > its 32: over its share, it would borrow 8 of the 24 free
    got = admission_round(q, h, TWO, _ent(q, h), 10, 0.0, 1.0, set())
    assert got == [] and q.reasons["a8/0"].reason.endswith(
        "(it may borrow beyond it only after gang b48/0, ahead of it, does)")
    # without b48, a8 borrows
    q.drop("b48/0")
    assert [e.req.job_id for e in admission_round(q, h, TWO, _ent(q, h), 10, 0.0, 1.0, set())] == ["a8"]


def test_no_borrowing_past_a_limit_nor_into_a_static_reservation_nor_beyond_a_pinned_reservation() -> None:
    pools = {"/": ResourcePool("/"), "/a": ResourcePool("/a", limit=R(gpu=40)),
             "/s": ResourcePool("/s", reservation=R(gpu=32), reservation_type="static")}
    q, h = Queues(), Holdings()
    q.add(_wide("a48", "/a", 48, 1), 0.0)  # beyond /a's limit: never, and it does not stop the others
    q.add(_wide("a2", "/a", 2, 2), 0.0)
    got = admission_round(q, h, pools, _ent(q, h, pools), 10, 0.0, 1.0, set())
    assert got == [] and q.reasons["a48/0"].reason.endswith("(allocated cpu=0,mem=0Mi, gang needs cpu=48,mem=12Gi,gpu=48)")
    q.drop("a48/0")
    h.hold(_wide("run", "/a", 32, 0))  # /a holds 32: the rest of the cluster is /s's, idle but static
    q.add(_wide("a4", "/a", 4, 3), 0.0)
    ent = _ent(q, h, pools)
    assert ent["/a"].gpu == 32
    assert admission_round(q, h, pools, ent, 10, 0.0, 1.0, set()) == []
    # /s elastic: its idle reservation is lent by the entitlement itself; a non-preemptible gang still runs only
    # within its own pool's reservation (none here)
    pools["/s"] = ResourcePool("/s", reservation=R(gpu=32))
    pools["/b"] = ResourcePool("/b")
    q2, h2 = Queues(), Holdings()
    h2.hold(_wide("run", "/b", 32, 0))
    q2.add(dataclasses.replace(_wide("pin", "/b", 8, 1), preemptible=False), 0.0)
    q2.add(_wide("s40", "/s", 40, 2), 0.0)
    ent2 = _ent(q2, h2, pools)
    got2 = admission_round(q2, h2, pools, ent2, 10, 0.0, 1.0, set())
    assert "pin" not in [e.req.job_id for e in got2]


def test_a_borrower_makes_its_pool_a_reclaim_candidate() -> None:
    q, h = Queues(), Holdings()
    q.add(_wide("a48", "/a", 48, 1), 0.0)
    q.add(_wide("b16", "/b", 16, 2), 0.0)
    got = admission_round(q, h, TWO, _ent(q, h), 10, 0.0, 1.0, set())
    assert [e.req.job_id for e in got] == ["a48", "b16"]  # b16 within /b's share of 32
    h.placed("a48/0", 1, (("h1", R(gpu=48)),), 1.0)
    h.launched("a48/0", 1)  # (jobmgr took its placement: a victim may be chosen from it)
    q.add(_wide("b32", "/b", 16, 3), 0.0)  # /b wants its share back: 16 more
    ent = _ent(q, h)
    assert ent["/b"].gpu == 32 and h.allocated["/a"].gpu > ent["/a"].gpu
    assert reclaim_candidates(R(gpu=16), "/b", h.by_gang, h.pool_gangs, h.own, ent, GPUS) == ["a48/0"]


def test_backfill_at_admission_admits_only_what_ends_before_the_first_gang_could_be_admitted() -> None:
    q, h = Queues(), Holdings()
    running_gang = _wide("run", "/a", 34, 0, max_runtime_s=1000)  # /a holds 34, over its 32
    h.hold(running_gang)
    h.placed("run/0", 1, (("h1", R(gpu=34)),), 100.0)  # ends at 1100 at the latest
    h.hold(_wide("mine", "/b", 26, 0))  # /b holds 26 (no max_runtime): 4 GPUs free
    h.placed("mine/0", 1, (("h2", R(gpu=26)),), 100.0)
    q.add(_wide("b8", "/b", 8, 1), 0.0)  # 26 + 8 > 32, 8 > 4 free: waits for run's end (borrowing)
    q.add(_wide("short", "/b", 2, 2, max_runtime_s=500), 0.0)  # ends by 700 < 1100: backfills
    q.add(_wide("long", "/b", 2, 3, max_runtime_s=2000), 0.0)  # would end after 1100: waits
    q.add(_wide("open", "/b", 2, 4), 0.0)  # no max_runtime: waits
    q.add(_wide("short2", "/b", 2, 5, max_runtime_s=100), 0.0)  # ends in time, fits the 2 left
    q.add(_wide("short3", "/b", 2, 6, max_runtime_s=100), 0.0)  # nothing left
    ent = _ent(q, h)
    got = admission_round(q, h, TWO, ent, 10, 200.0, 1.0, set())
    assert [e.req.job_id for e in got] == ["short", "short2"]
    assert q.get("b8/0").state == State.WAITING and "b8/0" in q.starved  # type: ignore[union-attr]
    assert "long/0" not in q.reasons and "open/0" not in q.reasons  # `peloton queue`: behind b8, as before
    why = {g.job_id: (g.state, g.reason) for g in q.listing("/b")[0]}
    assert why["b8"][1].startswith("waiting for admission: over pool /b's entitlement in gpu")
    assert why["long"] == ("waiting", "waiting behind b8/0, the first gang of pool /b's queue")
    assert why["short"][0] == why["short2"][0] == "placing"
    # under fifo the same queues admit nothing behind b8
    q2, h2 = Queues(), Holdings()
    h2.hold(running_gang)
    h2.placed("run/0", 1, (("h1", R(gpu=34)),), 100.0)
    h2.hold(_wide("mine", "/b", 26, 0))
    h2.placed("mine/0", 1, (("h2", R(gpu=26)),), 100.0)
    for j in ("b8", "short", "short2"):
        e = q.get(f"{j}/0")
        assert e is not None
        q2.add(e.req, 0.0)
    assert admission_round(q2, h2, TWO, _ent(q2, h2), 10, 200.0, 1.0, set(), fifo=True) == []
    # nothing ends in a known time: no backfill
    q3, h3 = Queues(), Holdings()
    h3.hold(_wide("run", "/a", 34, 0))
    h3.placed("run/0", 1, (("h1", R(gpu=34)),), 100.0)
    h3.hold(_wide("mine", "/b", 26, 0))
    h3.placed("mine/0", 1, (("h2", R(gpu=26)),), 100.0)
    for j in ("b8", "short"):
        e = q.get(f"{j}/0")
        assert e is not None
        q3.add(e.req, 0.0)
    assert admission_round(q3, h3, TWO, _ent(q3, h3), 10, 200.0, 1.0, set()) == []


def test_a_second_backfill_does_not_pass_while_the_first_is_being_placed() -> None:
    """The first gang's latest admission time took a backfilled gang not placed yet (no hosts, so no end known)
    to run for ever: in the next round, before the placement engine placed it, the estimate moved from 101 to
    1001 and a second gang that ends at 506 backfilled; at 101 it held the room the first gang needed."""
    q, h = Queues(), Holdings()
    ent = {"/": Entitlement(1000, 10**7, 0, 64), "/a": Entitlement(500, 10**7, 0, 54),
           "/b": Entitlement(500, 10**7, 0, 10)}
    h.hold(_wide("full", "/a", 54, 0))  # /a holds 54 for ever: 6 GPUs free, too few for b7 to borrow
    h.placed("full/0", 1, (("h0", R(gpu=54)),), 1.0)
    for job, rt in (("r1", 100), ("r2", 1000)):  # /b holds 4: 2 end at 101, 2 at 1001
        h.hold(_wide(job, "/b", 2, 0, max_runtime_s=rt))
        h.placed(f"{job}/0", 1, ((job, R(gpu=2)),), 1.0)
    q.add(_wide("b7", "/b", 7, 1), 0.0)  # 4 + 7 > 10: admitted at 101 at the latest (2 + 7 <= 10)
    q.add(_wide("g", "/b", 2, 2, max_runtime_s=50), 0.0)  # ends by 55: backfills
    q.add(_wide("g2", "/b", 2, 3, max_runtime_s=500), 0.0)  # would end by 506, after 101
    assert [e.req.job_id for e in admission_round(q, h, TWO, ent, 10, 0.0, 1.0, set())] == ["g"]
    # a second round, g still being placed
    assert admission_round(q, h, TWO, ent, 10, 1.0, 1.0, set()) == []
    assert q.get("g2/0").state == State.WAITING  # type: ignore[union-attr]


# --- preemption orders and probes -------------------------------------------------------------------------------
def _waiting(q: Queues, g: GangRequest) -> Entry:
    return q.add(g, 0.0)


def test_victims_are_ordered_once_by_kind_and_given_again_after_a_while() -> None:
    q, h, pre = Queues(), Holdings(), Preemptions()
    h.hold(running("mine", pool="/p", priority=0))
    h.hold(running("theirs", pool="/o"))
    e = _waiting(q, gang("w", pool="/p", priority=5))
    assert pre.order(e, 1, [("mine/0", 1), ("theirs/0", 1)], h, 10.0) == [("/p", "priority"), ("/o", "reclaim")]
    assert e.waits_for == ("mine/0", "theirs/0")
    assert [(g, a) for g, a, _ in pre.take()] == [("mine/0", 1), ("theirs/0", 1)] and pre.take() == []
    pre.again(69.0, 60.0)
    assert pre.take() == []
    pre.again(70.0, 60.0)
    assert [g for g, _, _ in pre.take()] == ["mine/0", "theirs/0"]
    pre.forget("mine/0")
    assert set(pre.preempting) == {"theirs/0"}


def test_nothing_is_ordered_when_anything_moved_on() -> None:
    q, h, pre = Queues(), Holdings(), Preemptions()
    h.hold(running("v", pool="/p"))
    h.hold(running("pinned", pool="/p", preemptible=False))
    e = _waiting(q, gang("w", pool="/p", priority=5))
    assert pre.order(e, 1, [("v/0", 2)], h, 0.0) == []  # another attempt of the victim
    assert pre.order(e, 1, [("v/0", 1), ("pinned/0", 1)], h, 0.0) == []  # one of them cannot be preempted
    assert pre.order(e, 2, [("v/0", 1)], h, 0.0) == []  # another attempt of the waiting gang
    assert pre.preempting == {} and e.waits_for == ()


def test_probes_wait_for_the_settling_window_and_the_room_left() -> None:
    q, h = Queues(), Holdings()
    h.hold(running("low", pool="/p", priority=0, since=1.0))
    es = [_waiting(q, gang(j, pool=p, priority=5)) for j, p in (("a", "/p"), ("b", "/p2"))]
    for e in es:
        q.starve(e, 100.0, "pool")
    pools = {"/": ResourcePool("/"), "/p": ResourcePool("/p"), "/p2": ResourcePool("/p2")}
    ent: dict[str, Entitlement] = {}
    args = (h, pools, ent, R(cpu=64, mem=10**6))
    assert find_probes(q.starved_heads(), 105.0, 8, 10.0, True, *args, set()) == []  # settling
    probes = find_probes(q.starved_heads(), 110.0, 1, 10.0, True, *args, set())
    assert len(probes) == 1 and probes[0].gang.job_id == "a" and [c for c, _ in probes[0].candidates] == ["low/0"]
    assert es[0].probed_at == 110.0
    assert find_probes([es[0]], 110.0 + PROBE_EVERY_S / 2, 8, 10.0, True, *args, set()) == []  # asked recently
    assert find_probes([es[1]], 110.0, 8, 10.0, True, *args, set()) == []  # nothing to preempt in /p2


def test_a_gang_entitled_without_hosts_probes_for_the_hosts_that_free_up_first() -> None:
    q, h = Queues(), Holdings()
    h.hold(running("ends", pool="/o", max_runtime_s=30, since=1.0))
    e = _waiting(q, gang("w", pool="/p"))
    q.starve(e, 0.0, "hosts")
    e.reservation = Reservation(frozenset({"h1"}), None)
    pools = {"/": ResourcePool("/"), "/p": ResourcePool("/p"), "/o": ResourcePool("/o")}
    probes = find_probes([e], 50.0, 8, 10.0, False, h, pools, {}, R(cpu=64), set())
    assert len(probes) == 1 and probes[0].candidates == () and [g for g, _ in probes[0].ending] == ["ends/0"]
    e.block = "reservation"
    e.probed_at = float("-inf")
    assert find_probes([e], 60.0, 8, 10.0, False, h, pools, {}, R(cpu=64), set()) == []


def test_a_borrower_without_hosts_reclaims_nothing_and_has_no_hosts_kept() -> None:
    """Reclaim is for a gang within its pool's entitlement (docs/pools.md): a gang admitted beyond it (borrowing)
    that then found no hosts waited with block "hosts" like an entitled one, and so was given the gangs of other
    pools over their entitlement as victims (one borrower preempting another, 'pool /a ... needs its share back'
    for a pool beyond its share) and the hosts that free up first."""
    q, h = Queues(), Holdings()
    h.hold(_wide("a34", "/a", 34, 0, max_runtime_s=100))  # /a holds 34, 2 over its 32
    h.placed("a34/0", 1, (("h1", R(gpu=34)),), 1.0)
    h.launched("a34/0", 1)
    ent = {"/": Entitlement(1000, 10**7, 0, 64), "/a": Entitlement(500, 10**7, 0, 32),
           "/b": Entitlement(500, 10**7, 0, 16)}
    borrower = _waiting(q, _wide("b20", "/b", 20, 1))  # beyond /b's 16: it borrowed, then found no hosts
    q.starve(borrower, 0.0, "hosts")
    assert find_probes([borrower], 50.0, 8, 10.0, True, h, TWO, ent, GPUS, set()) == []
    q.drop("b20/0")
    entitled = _waiting(q, _wide("b16", "/b", 16, 2))  # within /b's 16: /a gives back what it holds beyond 32
    q.starve(entitled, 0.0, "hosts")
    probes = find_probes([entitled], 50.0, 8, 10.0, True, h, TWO, ent, GPUS, set())
    assert [[c for c, _ in p.candidates] for p in probes] == [["a34/0"]]


def test_an_entry_placed_leaves_the_starved_and_reserving_indexes() -> None:
    q = Queues()
    g = gang("a")
    e = q.add(g, 0.0)
    q.starve(e, 1.0, "hosts")
    q.reserving["a/0"] = None
    e.reservation = Reservation(frozenset({"h1"}), None)
    assert q.live_reservations() == [("a/0", 1)]
    q.pop_head("/")
    q.admit(e)
    q.place(e, dataclasses.replace(placement(g), members=(MemberAssignment(0, "t", "h1", "ip", R(cpu=1)),)))
    assert q.starved == {} and q.reserving == {} and e.reservation is None and q.live_reservations() == []


# --- callers ----------------------------------------------------------------------------------------------------
def test_a_new_caller_replaces_the_current_one_for_good() -> None:
    c = Current()
    assert c.asks("") == (True, "") and c.asks("e1") == (True, "")  # no id: always answered; the first: no one replaced
    assert c.asks("e2") == (True, "e1") and c.superseded("e1") and not c.superseded("e2") and not c.superseded("")
    assert c.asks("e1") == (False, "") and c.id == "e2"  # a retired caller never comes back


def test_only_the_last_retired_callers_are_remembered() -> None:
    c = Current()
    for i in range(MAX_RETIRED + 2):
        c.asks(f"e{i}")
    assert c.asks("e0") == (True, f"e{MAX_RETIRED + 1}")  # forgotten: it is taken as a new caller
    assert c.asks(f"e{MAX_RETIRED}") == (False, "")


def test_fifo_admits_nothing_behind_the_first_gang_waiting_for_hosts_in_any_pool() -> None:
    pools = {"/": ResourcePool("/"), "/x": ResourcePool("/x"), "/y": ResourcePool("/y")}
    q, h = Queues(), Holdings()
    big = q.add(gang("big", n=2, cpu=1, pool="/x", at=1), 0.0)
    q.add(gang("later", n=1, cpu=1, pool="/y", at=2), 0.0)
    q.add(gang("urgent", n=1, cpu=1, pool="/y", at=3, priority=5), 0.0)
    assert [e.req.job_id for e in admission_round(q, h, pools, {}, 10, 0.0, 1.0, set(), fifo=True)] == [
        "urgent", "big", "later"]  # nothing waits for hosts yet: all go, best first
    for e in list(q.entries.values()):  # placement: urgent placed; big found no hosts; later behind it
        h.release(e.req.gang_id, e.req.attempt)
        if e.req.job_id == "urgent":
            q.drop(e.req.gang_id)
            continue
        q.starve(e, 1.0, "hosts")
        e.not_before = 0.0
        q.push(e, 1.0)
    assert q.first_unplaced() is big
    q.add(gang("new", n=1, cpu=1, pool="/y", at=4), 2.0)
    q.add(gang("vip", n=1, cpu=1, pool="/y", at=5, priority=9), 2.0)
    got = admission_round(q, h, pools, {}, 10, 2.0, 1.0, set(), fifo=True)
    assert [e.req.job_id for e in got] == ["vip", "big"]  # ahead of big, and big: not later nor new
    assert q.reasons["later/0"].reason.startswith("waiting behind gang big/0 (pool /x)")  # /y's first says why
    assert "new/0" not in q.reasons  # (behind later in its own pool: `peloton queue` says so)
    # without fifo the same queues admit everything
    q2, h2 = Queues(), Holdings()
    for entry in [*got, q.get("later/0"), q.get("new/0")]:
        assert entry is not None
        q2.starve(q2.add(entry.req, 2.0), 2.0, "hosts")
    assert [e.req.job_id for e in admission_round(q2, h2, pools, {}, 10, 2.0, 1.0, set())] == [
        "vip", "big", "later", "new"]
    # big placed: the next one waiting for hosts is the barrier
    q.drop("big/0")
    assert [e.req.job_id for e in admission_round(q, h, pools, {}, 10, 2.0, 1.0, set(), fifo=True)] == ["later"]


def test_under_fifo_a_gang_behind_the_first_waiting_for_hosts_loses_its_reservation() -> None:
    """Workload-2 under fifo with preemption stalled: /b's gang got hosts reserved, then /a's gang ahead of it in
    order was admitted by borrowing, found those hosts kept from it, and became the first waiting for hosts, which
    nothing behind it may pass: each waited for the other."""
    q = Queues()
    ahead = q.add(_wide("ahead", "/a", 48, 1), 0.0)
    later = q.add(_wide("later", "/b", 24, 2), 0.0)
    later.reservation = Reservation(frozenset({"h1", "h2"}), None)
    later.block = "hosts"
    q.reserving["later/0"] = None
    assert q.live_reservations() == [("later/0", 1)]  # no barrier: kept
    assert q.live_reservations(later) == [("later/0", 1)]  # the barrier itself keeps its own
    q.starve(ahead, 1.0, "hosts")
    assert q.first_unplaced() is ahead
    assert q.live_reservations(ahead) == [] and later.reservation is None and "later/0" not in q.reserving


def test_a_gang_in_line_behind_the_first_borrower_backfills_until_that_one_could_borrow() -> None:
    """/a's first gang could borrow when ra ends (1001), but b48 is first in line to borrow, not before rb ends
    (5001): so a gang of /a ending by 3005 cannot delay a40, and backfills."""
    q, h = Queues(), Holdings()
    for name, pool, gpus, runtime in (("rb", "/b", 20, 5000.0), ("ra", "/a", 30, 1000.0)):
        h.hold(_wide(name, pool, gpus, 0, max_runtime_s=runtime))
        h.placed(f"{name}/0", 1, (("h1", R(gpu=gpus)),), 1.0)
    q.add(_wide("b48", "/b", 48, 1), 0.0)  # over /b's 32, 48 > 14 free: stops the borrowing
    q.add(_wide("a40", "/a", 40, 2), 0.0)  # over /a's 32, behind b48 in line
    q.add(_wide("as", "/a", 2, 3, max_runtime_s=3000), 0.0)
    ent = _ent(q, h)
    assert ent["/a"].gpu == ent["/b"].gpu == 32
    got = admission_round(q, h, TWO, ent, 10, 0.0, 1.0, set())
    assert [e.req.job_id for e in got] == ["as"]
    # with b48 gone, a40 fits /a's entitlement at 1001: as (3005) would delay it
    q2, h2 = Queues(), Holdings()
    h2.hold(_wide("ra", "/a", 30, 0, max_runtime_s=1000.0))
    h2.placed("ra/0", 1, (("h1", R(gpu=30)),), 1.0)
    h2.hold(_wide("rb", "/b", 20, 0, max_runtime_s=5000.0))
    h2.placed("rb/0", 1, (("h2", R(gpu=20)),), 1.0)
    q2.add(_wide("a40", "/a", 40, 2), 0.0)  # /a entitled to 44: a40 fits it once ra ends
    q2.add(_wide("as", "/a", 2, 3, max_runtime_s=3000), 0.0)
    assert _ent(q2, h2)["/a"].gpu == 44
    assert admission_round(q2, h2, TWO, _ent(q2, h2), 10, 0.0, 1.0, set()) == []


def test_gangs_stopped_while_they_wait_leave_no_items_behind_in_their_pools_queue() -> None:
    """A pool's queue is a heap with lazy deletion: a gang stopped while it waited left its item, dropped only
    when it reached the head. Behind a head that waits long (a big gang waiting for capacity, or higher
    priorities always queued) those items piled up for as long as the pool stayed busy: every job submitted and
    stopped in that time. The queue is compacted as it grows, so it stays within twice its live items (or
    WAITING_COMPACT_MIN)."""
    from peloton.resmgr.queues import WAITING_COMPACT_MIN

    q = Queues()
    q.add(gang("big", priority=5), 0.0)  # the head, the whole time
    for i in range(WAITING_COMPACT_MIN * 4):
        q.add(gang(f"j{i}", at=float(i)), float(i))
        q.drop(f"j{i}/0")  # stopped while it waited
    q.add(gang("kept", at=1e9), 1e9)
    assert len(q._waiting["/"]) <= WAITING_COMPACT_MIN  # noqa: SLF001 - the structure under test
    assert (e := q.head("/")) is not None and e.req.job_id == "big"
    q.pop_head("/")
    assert (e := q.head("/")) is not None and e.req.job_id == "kept"
