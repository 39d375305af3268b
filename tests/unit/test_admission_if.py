"""A dry run's question to the resource manager: would a job's gangs be admitted now (admission.admission_if, pure),
and the shell's what-if over its own books (ResourceManager.admission_if), which changes nothing."""

from __future__ import annotations

from peloton.domain.allocation import AdmissionPreview, GangAsk
from peloton.domain.model import ResourcePool
from peloton.domain.resources import Resources
from peloton.resmgr.admission import admission_if
from tests.unit.test_resmgr import SHORT, failure, gang, make

R = Resources
ROOT = ResourcePool("/")


def tree(*extra: ResourcePool) -> dict[str, ResourcePool]:
    return {p.path: p for p in (ROOT, *extra)}


def test_the_limit_counts_what_the_pool_holds_and_the_jobs_earlier_gangs() -> None:
    pools = tree(ResourcePool("/a", limit=R(cpu=4)))
    held = {"/a": R(cpu=2), "/": R(cpu=2)}
    out = admission_if("/a", [GangAsk(R(cpu=2)), GangAsk(R(cpu=1))], pools, None, {}, {}, held, {}, [])
    assert out[0] == AdmissionPreview("", 0)  # 2 held + 2 = the limit
    # alone it would fit (2 + 1 <= 4); after the job's first gang it does not
    assert "pool /a limit cpu=4 would be exceeded in cpu" in out[1].reason
    assert admission_if("/a", [GangAsk(R(cpu=1))], pools, None, {}, {}, held, {}, [])[0].reason == ""


def test_a_limit_up_the_chain_refuses_too() -> None:
    pools = tree(ResourcePool("/a", limit=R(gpu=2)), ResourcePool("/a/b"))
    out = admission_if("/a/b", [GangAsk(R(gpu=1)), GangAsk(R(gpu=1)), GangAsk(R(gpu=1))], pools, None, {}, {},
                       {"/a": R(gpu=1)}, {}, [])
    assert [bool(p.reason) for p in out] == [False, True, True]
    assert "pool /a limit gpu=2" in out[1].reason


def test_the_entitlement_is_computed_as_if_the_pool_asked_for_the_whole_job() -> None:
    pools = tree(ResourcePool("/a"), ResourcePool("/b"))
    capacity = R(cpu=10, mem=10_000, disk=10_000)
    demand = {"/b": R(cpu=10)}  # /b wants the whole cluster (its first gang waits); /a wants nothing yet
    # without the job in /a's demand, /a would be entitled to nothing and refuse even a small gang
    out = admission_if("/a", [GangAsk(R(cpu=4)), GangAsk(R(cpu=4))], pools, capacity, demand, {}, {}, {}, [],
                       [("/b", R(cpu=10), 0)])
    assert out[0].reason == "" and not out[0].borrows  # /a wants 8, /b 10: 5 each
    assert out[1].reason == ("waiting for admission: over pool /a's entitlement in cpu (entitled to 5 now, holds 4, the gang needs 4) (it "
                             "may borrow beyond it only after the first waiting gang of pool /b, ahead of it, does)")


def test_no_capacity_known_yet_checks_no_entitlement() -> None:
    pools = tree(ResourcePool("/a"), ResourcePool("/b"))
    out = admission_if("/a", [GangAsk(R(cpu=100))], pools, None, {"/b": R(cpu=10)}, {}, {}, {}, [])
    assert out == [AdmissionPreview("", 0)]


def test_a_non_preemptible_gang_must_fit_its_pools_reservation_beside_the_earlier_ones() -> None:
    pools = tree(ResourcePool("/a", reservation=R(cpu=3)))
    asks = [GangAsk(R(cpu=2), preemptible=False), GangAsk(R(cpu=2), preemptible=False), GangAsk(R(cpu=2))]
    out = admission_if("/a", asks, pools, None, {}, {}, {}, {}, [])
    assert out[0].reason == ""
    assert "not preemptible" in out[1].reason and "reserves 3, its non-preemptible gangs hold 2" in out[1].reason
    assert out[2].reason == ""  # preemptible: the reservation does not bound it
    held = admission_if("/a", asks[:1], pools, None, {}, {}, {}, {"/a": R(cpu=2)}, [])
    assert "not preemptible" in held[0].reason  # what the pool's own non-preemptible gangs hold counts


def test_the_gangs_ahead_are_the_waiting_ones_of_the_same_or_a_higher_priority() -> None:
    asks = [GangAsk(R(cpu=1), priority=p) for p in (0, 3, 6)]
    out = admission_if("/", asks, tree(), None, {}, {}, {}, {}, [5, 0, 3])
    assert [p.ahead for p in out] == [3, 2, 0]


def test_an_unknown_pool_would_wait_and_the_books_are_not_changed() -> None:
    demand, held = {"/": R(cpu=1)}, {"/": R(cpu=1)}
    out = admission_if("/nope", [GangAsk(R(cpu=1))], tree(), R(cpu=4), demand, dict(held), held, {}, [])
    assert "does not exist" in out[0].reason
    assert demand == {"/": R(cpu=1)} and held == {"/": R(cpu=1)}


def test_the_shell_asks_over_its_books_and_changes_nothing() -> None:
    rm, _, _ = make(ResourcePool("/team", limit=R(cpu=4)), ResourcePool("/other"))
    a, c = gang("a", n=2, cpu=2, pool="/team", at=1, priority=5), gang("c", n=1, pool="/other", at=3, priority=9)
    rm.enqueue([a])
    assert rm.dequeue(10, SHORT) == [a]  # a holds the whole limit
    rm.enqueue([gang("b", n=1, cpu=1, pool="/team", at=2, priority=5), c])
    assert rm.dequeue(10, SHORT) == [c]  # b waits: over the limit
    before = (rm.usage(), rm.queue())
    out = rm.admission_if("/team", [GangAsk(R(cpu=1), priority=5), GangAsk(R(cpu=1), priority=6)])
    assert [p.ahead for p in out] == [1, 0]  # b (priority 5) waits in /team; c is another pool's
    assert all("pool /team limit cpu=4 would be exceeded" in p.reason for p in out)
    assert (rm.usage(), rm.queue()) == before


def test_a_gang_parked_after_a_failed_placement_still_waits_ahead() -> None:
    rm, _, _ = make(ResourcePool("/a"))
    g = gang("g", pool="/a")
    rm.enqueue([g])
    assert rm.dequeue(10, SHORT) == [g]
    assert [p.ahead for p in rm.admission_if("/a", [GangAsk(R(cpu=1))])] == [0]  # placing: admitted, not ahead
    rm.set_placements([], [failure(g)])  # back to WAITING, parked until its retry
    assert rm.admission_if("/a", [GangAsk(R(cpu=1))]) == [AdmissionPreview("", 1)]
    assert rm.admission_if("/", [GangAsk(R(cpu=1))]) == [AdmissionPreview("", 0)]  # its own pool's only


# a gang over its pool's entitlement alone borrows the capacity nobody holds, as an admission round lets it
GPU_POOLS = (ResourcePool("/a", reservation=R(gpu=4)), ResourcePool("/b", reservation=R(gpu=4)))
GPU_CLUSTER = R(cpu=64, mem=65536, gpu=8)


def _preview(asks: list[GangAsk], heads: list[tuple[str, Resources, int]],
             held: dict[str, Resources]) -> list[AdmissionPreview]:
    demand = {p: R(gpu=t.gpu) for p, t, _ in heads}
    return admission_if("/a", asks, tree(*GPU_POOLS), GPU_CLUSTER, demand, {}, held, {}, [], heads)


def test_a_gang_over_its_entitlement_borrows_when_no_first_gang_ahead_stops_it() -> None:
    held = {"/a": R(gpu=2), "/": R(gpu=2)}  # /a runs 2 GPUs; 6 are free
    asks = [GangAsk(R(gpu=4), priority=5)]  # /a would hold 6, entitled to 4
    # /b's first gang (8 GPUs, does not fit the 6 free) is behind it (lower priority): it borrows
    (p,) = _preview(asks, [("/b", R(gpu=8), 0)], held)
    assert p == AdmissionPreview("", 0, borrows=True)
    # ... ahead of it (same priority, queued earlier), it stops the borrowing
    (p,) = _preview(asks, [("/b", R(gpu=8), 5)], held)
    assert not p.borrows and p.reason.endswith("(it may borrow beyond it only after the first waiting gang of "
                                               "pool /b, ahead of it, does)")
    # ... ahead and fitting, it borrows first: 2 GPUs are left, too few
    (p,) = _preview(asks, [("/b", R(gpu=4), 9)], {**held, "/b": R(gpu=1), "/": R(gpu=3)})
    assert not p.borrows and p.reason.endswith("(or beyond it, borrowing, once the cluster has room for the whole "
                                               "gang)")
    # not the pool's first gang: only first gangs borrow
    out = admission_if("/a", asks, tree(*GPU_POOLS), GPU_CLUSTER, {"/b": R(gpu=8)}, {}, held, {}, [9],
                       [("/b", R(gpu=8), 0)])
    assert not out[0].borrows and out[0].ahead == 1 and "entitlement" in out[0].reason


def test_a_non_preemptible_gang_borrows_only_within_its_pools_reservation() -> None:
    held = {"/a": R(gpu=2), "/": R(gpu=2)}  # (preemptible: its non-preemptible gangs hold nothing)
    (p,) = _preview([GangAsk(R(gpu=4), preemptible=False, priority=5)], [("/b", R(gpu=8), 0)], held)
    assert p.borrows  # 4 GPUs: within /a's reservation of 4
    (p,) = _preview([GangAsk(R(gpu=5), preemptible=False, priority=5)], [("/b", R(gpu=8), 0)], held)
    assert not p.borrows and "over pool /a's entitlement" in p.reason  # 5 fit the 6 free, but not the reservation


def test_the_preview_says_borrows_where_the_admission_round_borrows() -> None:
    rm, _, _ = make(*GPU_POOLS)
    rm.enqueue([gang("a0", n=1, gpu=2, pool="/a", at=1)])
    assert [g.job_id for g in rm.dequeue(10, SHORT, GPU_CLUSTER)] == ["a0"]
    rm.enqueue([gang("b1", n=1, gpu=8, pool="/b", at=2)])
    assert rm.dequeue(10, SHORT, GPU_CLUSTER) == []  # 6 free: b1 waits
    (p,) = rm.admission_if("/a", [GangAsk(R(cpu=1, mem=256, gpu=4), priority=5)])
    assert p == AdmissionPreview("", 0, borrows=True)
    (q,) = rm.admission_if("/a", [GangAsk(R(cpu=1, mem=256, gpu=4), priority=0)])
    assert not q.borrows and "after the first waiting gang of pool /b" in q.reason
    rm.enqueue([gang("a1", n=1, gpu=4, pool="/a", at=3, priority=5)])
    assert [g.job_id for g in rm.dequeue(10, SHORT, GPU_CLUSTER)] == ["a1"]  # admitted beyond /a's 4, as said
    assert rm.pool_usage()["/a"].allocated.gpu == 6
