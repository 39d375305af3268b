"""The placement decision and its host index: table tests plus hypothesis properties (whole gangs, no over-commit,
failed gangs consume nothing, determinism, incremental index == rebuilt index, placements an independent naive
search agrees with)."""

from __future__ import annotations

import random
from collections import Counter, defaultdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from peloton.domain.placement import GangPlacement, GangRequest, HostOffer, MemberRequest, PlacementFailure
from peloton.domain.resources import Resources
from peloton.domain.spec import Constraint
from peloton.placement.index import HostIndex, SortedNames
from peloton.placement.placer import can_ever_fit, place

GI = 1024.0


def host(
    name: str,
    cpu: float = 8,
    mem: float = 32 * GI,
    gpus: int = 0,
    ports: int = 10,
    labels: dict[str, str] | None = None,
    disk: float = 100 * GI,
    has_gpus: bool | None = None,
) -> HostOffer:
    free = Resources(cpu, mem, disk, gpus, ports)
    return HostOffer(
        hostname=name,
        address=f"10.0.0.{name}" if name.isdigit() else f"addr-{name}",
        free=free,
        labels=dict(labels or {}),
        capacity=free,
        has_gpus=gpus > 0 if has_gpus is None else has_gpus,
    )


def gang(
    n: int,
    cpu: float = 1,
    mem: float = 1 * GI,
    gpu: int = 0,
    ports: int = 0,
    strategy: str = "pack",
    constraints: tuple[Constraint, ...] = (),
    job: str = "job",
    index: int = 0,
    disk: float = 0,
) -> GangRequest:
    r = Resources(cpu, mem, disk, gpu, ports)
    return GangRequest(
        gang_id=f"{job}/{index}",
        job_id=job,
        attempt=1,
        members=tuple(MemberRequest(i, f"{job}-{i}-1", r) for i in range(n)),
        strategy=strategy,
        constraints=constraints,
    )


def one(gangs: list[GangRequest], hosts: list[HostOffer] | HostIndex) -> GangPlacement:
    placed, failed = place(gangs, hosts)
    assert not failed, failed
    assert len(placed) == 1
    return placed[0]


def fail(gangs: list[GangRequest], hosts: list[HostOffer] | HostIndex) -> PlacementFailure:
    placed, failed = place(gangs, hosts)
    assert not placed
    assert len(failed) == 1
    return failed[0]


def hosts_of(p: GangPlacement) -> Counter[str]:
    return Counter(m.hostname for m in p.members)


def by_instance(p: GangPlacement) -> list[str]:
    return [m.hostname for m in sorted(p.members, key=lambda m: m.instance)]


def rack_of(name: str) -> str:
    return f"r{int(name[1:]) % 2}"


# --- table tests -------------------------------------------------------------------------------------------------


def test_pack_fills_one_host() -> None:
    offers = [host("a"), host("b"), host("c")]
    p = one([gang(4, cpu=2)], offers)
    assert hosts_of(p) == Counter({"a": 4})
    assert p.gang_id == "job/0" and p.job_id == "job" and p.attempt == 1
    assert sorted(m.instance for m in p.members) == [0, 1, 2, 3]
    assert all(m.address == "addr-a" and m.resources == Resources(2, GI, 0, 0, 0) for m in p.members)


def test_pack_prefers_best_fit_host() -> None:
    offers = [host("big", cpu=64), host("small", cpu=4), host("mid", cpu=16)]
    assert hosts_of(one([gang(4, cpu=1)], offers)) == Counter({"small": 4})


def test_pack_spills_over_to_fewest_hosts() -> None:
    offers = [host("a", cpu=4), host("b", cpu=8), host("c", cpu=2)]
    p = one([gang(10, cpu=1)], offers)
    assert hosts_of(p) == Counter({"b": 8, "c": 2})


def test_pack_mixed_sizes_fill_the_host_that_takes_most() -> None:
    offers = [host("a", cpu=3), host("b", cpu=5)]
    g = GangRequest("j/0", "j", 1, tuple(MemberRequest(i, f"t{i}", Resources(cpu=c)) for i, c in enumerate([2, 2, 1])))
    assert hosts_of(one([g], offers)) == Counter({"b": 3})


def test_spread_uses_distinct_hosts() -> None:
    offers = [host(f"h{i}") for i in range(5)]
    p = one([gang(4, strategy="spread")], offers)
    assert len(hosts_of(p)) == 4
    assert max(hosts_of(p).values()) == 1


def test_spread_prefers_most_free_then_balances() -> None:
    offers = [host("a", cpu=4), host("b", cpu=16), host("c", cpu=8)]
    p = one([gang(5, strategy="spread")], offers)
    assert by_instance(p)[:3] == ["b", "c", "a"]
    assert sorted(hosts_of(p).values()) == [1, 2, 2]


def test_constraint_eq() -> None:
    offers = [host("a", labels={"rack": "r1"}), host("b", labels={"rack": "r2"})]
    p = one([gang(2, constraints=(Constraint("rack", "eq", "r2"),))], offers)
    assert set(hosts_of(p)) == {"b"}


def test_constraint_ne() -> None:
    offers = [host("a", labels={"rack": "r1"}), host("b", labels={"rack": "r2"})]
    p = one([gang(2, strategy="spread", constraints=(Constraint("rack", "ne", "r1"),))], offers)
    assert set(hosts_of(p)) == {"b"}


def test_constraint_exists() -> None:
    offers = [host("a"), host("b", labels={"ssd": "yes"})]
    p = one([gang(2, constraints=(Constraint("ssd", "exists"),))], offers)
    assert set(hosts_of(p)) == {"b"}


def test_constraint_in() -> None:
    offers = [host("a", labels={"zone": "z1"}), host("b", labels={"zone": "z2"}), host("c", labels={"zone": "z3"})]
    p = one([gang(3, strategy="spread", constraints=(Constraint("zone", "in", "z1, z3"),))], offers)
    assert set(hosts_of(p)) == {"a", "c"}


def test_constraint_unsatisfiable_fails() -> None:
    offers = [host("a", labels={"rack": "r1"}), host("b", labels={"rack": "r2"})]
    f = fail([gang(1, constraints=(Constraint("rack", "eq", "r9"),))], offers)
    assert f.short_hosts == {"constraint": 2}
    assert f.reason.endswith("placed 0 of 1; none of the 2 hosts satisfies rack eq r9"), f.reason


def test_failure_names_only_the_constraints_that_exclude_hosts() -> None:
    offers = [host("a", labels={"rack": "r1", "ssd": "y"}), host("b", labels={"rack": "r2", "ssd": "y"})]
    cons = (Constraint("ssd", "exists"), Constraint("rack", "eq", "r1"), Constraint("rack", "ne", "r2"))
    f = fail([gang(1, cpu=9, constraints=cons)], offers)
    assert f.short_hosts == {"cpu": 2, "constraint": 1}
    assert f.reason.endswith("placed 0 of 1; 0 of 1 hosts have cpu 9, mem 1Gi free; the best, a, is short of cpu 1; "
                             "1 host ruled out by rack eq r1, rack ne r2"), f.reason


def test_gpu_counts_are_the_offers_counts_not_its_id_lists() -> None:
    # The placer reads free.gpu only: the id list (the host manager's business) may be empty or stale.
    offers = [HostOffer("g", "addr-g", Resources(8, 32 * GI, 0, 3, 10), gpu_ids=(), has_gpus=True)]
    p = one([gang(3, gpu=1)], offers)
    assert all(m.gpu_ids == () and m.ports == () and m.resources.gpu == 1 for m in p.members)
    assert fail([gang(2, gpu=2)], offers).short_hosts == {"gpu": 1}
    stale = [HostOffer("g", "addr-g", Resources(8, 32 * GI, 0, 1, 10), gpu_ids=(0, 1, 2, 3), has_gpus=True)]
    assert fail([gang(2, gpu=1)], stale).short_hosts == {"gpu": 1}


def test_gpu_counts_per_host_never_exceed_free() -> None:
    offers = [host("g1", gpus=4, cpu=64), host("g2", gpus=4, cpu=64)]
    placed, failed = place([gang(3, gpu=1, job="a"), gang(2, gpu=2, job="b"), gang(2, gpu=1, job="c")], offers)
    assert [p.job_id for p in placed] == ["a", "b"] and [f.job_id for f in failed] == ["c"]
    gpus: Counter[str] = Counter()
    for p in placed:
        for m in p.members:
            assert m.gpu_ids == ()
            gpus[m.hostname] += m.resources.gpu
    assert gpus == Counter({"g1": 3, "g2": 4})


def test_gpu_pack_prefers_smallest_free_gpu_count_that_fits() -> None:
    offers = [host("g8", gpus=8, cpu=64), host("g2", gpus=2, cpu=64), host("g4", gpus=4, cpu=64)]
    assert hosts_of(one([gang(1, gpu=1)], offers)) == Counter({"g2": 1})
    assert hosts_of(one([gang(4, gpu=1)], offers)) == Counter({"g4": 4})
    assert hosts_of(one([gang(3, gpu=1)], offers)) == Counter({"g4": 3})


def test_ports_are_counted() -> None:
    offers = [HostOffer("a", "addr-a", Resources(8, 32 * GI, 0, 0, 5))]  # a count, no port list
    p = one([gang(2, ports=2)], offers)
    assert all(m.ports == () and m.resources.ports == 2 for m in p.members)
    f = fail([gang(3, ports=2)], offers)
    assert f.short_hosts == {"ports": 1}


def test_cpu_work_avoids_gpu_hosts() -> None:
    offers = [host("gpu", gpus=4, cpu=64), host("cpu", cpu=4)]
    assert hosts_of(one([gang(2, cpu=2)], offers)) == Counter({"cpu": 2})
    assert hosts_of(one([gang(2, cpu=2, strategy="spread")], offers)) == Counter({"cpu": 2})


def test_cpu_work_uses_gpu_hosts_only_when_nothing_else_fits() -> None:
    offers = [host("gpu", gpus=4, cpu=64), host("cpu", cpu=4)]
    assert hosts_of(one([gang(1, cpu=8)], offers)) == Counter({"gpu": 1})
    # Spill-over: what fits on the CPU host goes there, the rest on the GPU host.
    p = one([gang(3, cpu=2)], offers)
    assert hosts_of(p) == Counter({"cpu": 2, "gpu": 1})


def test_a_host_with_gpus_all_taken_is_still_a_gpu_host() -> None:
    offers = [host("gpu", gpus=0, cpu=8, has_gpus=True), host("cpu", cpu=8)]
    assert hosts_of(one([gang(1, cpu=1)], offers)) == Counter({"cpu": 1})


def test_second_gang_sees_first_gangs_consumption() -> None:
    offers = [host("a", cpu=4, gpus=2)]
    placed, failed = place([gang(1, cpu=3, gpu=1, job="j1"), gang(1, cpu=3, gpu=1, job="j2")], offers)
    assert [p.job_id for p in placed] == ["j1"]
    assert [f.job_id for f in failed] == ["j2"]
    assert failed[0].short_hosts == {"cpu": 1}
    placed, failed = place([gang(1, cpu=2, gpu=1, job="j1"), gang(1, cpu=2, gpu=1, job="j2")], offers)
    assert not failed and [p.members[0].hostname for p in placed] == ["a", "a"]
    assert fail([gang(1, cpu=0, gpu=1)], _after(placed, offers)).short_hosts == {"gpu": 1}


def _after(placed: list[GangPlacement], offers: list[HostOffer]) -> HostIndex:
    idx = HostIndex(offers)
    for p in placed:
        for m in p.members:
            o = idx.get(m.hostname)
            assert o is not None
            idx.upsert(
                HostOffer(
                    o.hostname,
                    o.address,
                    o.free - m.resources,
                    labels=o.labels,
                    capacity=o.capacity,
                    has_gpus=o.has_gpus,
                )
            )
    return idx


def test_failed_gang_consumes_nothing() -> None:
    offers = [host("a", cpu=4), host("b", cpu=4)]
    big = gang(3, cpu=3, job="big")
    small = gang(2, cpu=4, job="small")
    placed, failed = place([big, small], offers)
    assert [f.job_id for f in failed] == ["big"]
    assert "placed 2 of 3" in failed[0].reason
    assert [p.job_id for p in placed] == ["small"]


def test_gangs_are_placed_in_given_order() -> None:
    offers = [host("a", cpu=4)]
    placed, failed = place([gang(1, cpu=4, job="first"), gang(1, cpu=1, job="second")], offers)
    assert [p.job_id for p in placed] == ["first"]
    assert [f.job_id for f in failed] == ["second"]


def test_failure_reason_names_short_dimensions_and_counts() -> None:
    offers = [
        host("a", cpu=16, gpus=1, labels={"rack": "r1"}),
        host("b", cpu=16, gpus=1, labels={"rack": "r1"}),
        host("c", cpu=16, labels={"rack": "r1"}),
        host("d", cpu=16, gpus=8, labels={"rack": "r2"}),
    ]
    g = gang(4, cpu=4, mem=8 * GI, gpu=1, constraints=(Constraint("rack", "eq", "r1"),))
    f = fail([g], offers)
    assert f.gang_id == "job/0" and f.job_id == "job" and f.attempt == 1
    assert f.short_hosts == {"gpu": 3, "constraint": 1}
    assert f.reason == (
        "gang of 4 needs cpu=4,mem=8Gi,gpu=1 each; placed 2 of 4; 2 of 3 hosts have cpu 4, mem 8Gi, gpu 1 free, room "
        "for 2 of the 4 members; the best other, c, is short of gpu 1; 1 host ruled out by rack eq r1"
    )


def test_failure_counts_several_dimensions_per_host() -> None:
    f = fail([gang(1, cpu=16, mem=64 * GI, gpu=1)], [host("a", cpu=8, mem=32 * GI)])
    assert f.short_hosts == {"cpu": 1, "mem": 1, "gpu": 1}


def test_failure_of_mixed_gang_names_the_instance() -> None:
    g = GangRequest("j/0", "j", 1, (MemberRequest(0, "t0", Resources(cpu=1)), MemberRequest(1, "t1", Resources(cpu=8))))
    f = fail([g], [host("a", cpu=4)])
    assert f.reason == ("gang of 2: instance 1 needs cpu=8,mem=0Mi; placed 1 of 2; 0 of 1 hosts have cpu 8 free with "
                        "the members before it placed; the best, a, is short of cpu 5")


def test_failure_says_how_many_hosts_fit_and_how_far_the_nearest_falls_short() -> None:
    """Not `hosts short of: cpu 1` (one host? one core?): hosts that fit, out of how many, and the best of the rest,
    named, with what it lacks in the units of a spec."""
    f = fail([gang(2, cpu=4)], [host("local-0", cpu=3), host("local-1", cpu=2)])
    assert f.reason == ("gang of 2 needs cpu=4,mem=1Gi each; placed 0 of 2; 0 of 2 hosts have cpu 4, mem 1Gi free; "
                        "the best, local-0, is short of cpu 1")
    f = fail([gang(3, cpu=1, mem=512)], [host("h0", cpu=2), host("h1", cpu=0.5, mem=100)])
    assert f.reason.endswith("placed 2 of 3; 1 of 2 hosts has cpu 1, mem 512Mi free, room for 2 of the 3 members; "
                             "the best other, h1, is short of cpu 0.5, mem 412Mi"), f.reason
    # every host fits a member, but not all of them together: no "best other"
    f = fail([gang(9, cpu=1, gpu=1)], [host("h0", gpus=2), host("h1", gpus=2)])
    assert f.reason.endswith("placed 4 of 9; 2 of 2 hosts have cpu 1, mem 1Gi, gpu 1 free, room for 4 of the 9 "
                             "members"), f.reason
    # the nearest is the one short in the fewest dimensions, then by the least relative to the need
    # (c lacks little but in two; a lacks 3 of the 4 cores; b lacks 1 of the 2 GPUs)
    f = fail([gang(1, cpu=4, gpu=2)], [host("a", cpu=1, gpus=2), host("b", cpu=8, gpus=1), host("c", cpu=3, gpus=1)])
    assert f.reason.endswith("0 of 3 hosts have cpu 4, mem 1Gi, gpu 2 free; the best, b, is short of gpu 1"), f.reason


def test_no_hosts() -> None:
    f = fail([gang(2)], [])
    assert "no hosts" in f.reason and f.short_hosts == {}


def test_empty_batch() -> None:
    assert place([], [host("a")]) == ([], [])


def test_can_ever_fit() -> None:
    cluster = [host("a", cpu=8, gpus=4), host("b", cpu=8, gpus=4)]
    assert can_ever_fit(gang(8, gpu=1), cluster) is None
    f = can_ever_fit(gang(9, gpu=1), cluster)
    assert f is not None and f.short_hosts == {"gpu": 2} and "placed 8 of 9" in f.reason
    f = can_ever_fit(gang(1, cpu=9), cluster)
    assert f is not None and f.short_hosts == {"cpu": 2}


def test_can_ever_fit_does_not_mutate_the_index() -> None:
    idx = HostIndex([host(f"h{i}", cpu=4, gpus=i % 3, labels={"rack": rack_of(f"h{i}")}) for i in range(20)])
    before = idx.offers()
    classes = idx.class_count()
    for g in (
        gang(8, cpu=2),
        gang(30, cpu=2, strategy="spread"),
        gang(3, gpu=2),
        gang(100, cpu=1),
        gang(4, constraints=(Constraint("rack", "eq", "r1"),)),
        gang(40, constraints=(Constraint("rack", "eq", "r1"),)),
    ):
        can_ever_fit(g, idx)
        assert idx.offers() == before and idx.class_count() == classes
        idx.check()


def test_deterministic_tie_break_by_hostname() -> None:
    offers = [host("c"), host("a"), host("b")]
    assert set(hosts_of(one([gang(2)], offers))) == {"a"}
    assert by_instance(one([gang(3, strategy="spread")], offers)) == ["a", "b", "c"]


def test_equal_scores_in_different_classes_tie_break_by_hostname() -> None:
    # Ports do not count towards "most free": b and a are equally free although their free states differ.
    offers = [host("b", ports=10), host("a", ports=5), host("c", ports=7)]
    assert by_instance(one([gang(3, strategy="spread")], offers)) == ["a", "b", "c"]
    assert set(hosts_of(one([gang(2)], offers))) == {"a"}


# --- racks ---------------------------------------------------------------------------------------------------------


def test_pack_gang_spanning_hosts_stays_in_one_rack() -> None:
    # Racks alternate with hostnames: the hostname tie-break alone would take h0, h1, h2 (two racks).
    offers = [host(f"h{i}", cpu=4, labels={"rack": rack_of(f"h{i}")}) for i in range(8)]
    p = one([gang(12, cpu=1)], offers)
    assert hosts_of(p) == Counter({"h0": 4, "h2": 4, "h4": 4})
    assert {rack_of(h) for h in hosts_of(p)} == {"r0"}


def test_rack_preference_follows_the_configured_label() -> None:
    offers = [host(f"h{i}", cpu=4, labels={"row": rack_of(f"h{i}")}) for i in range(8)]
    assert set(hosts_of(one([gang(8, cpu=1)], HostIndex(offers, rack_label="row")))) == {"h0", "h2"}
    assert set(hosts_of(one([gang(8, cpu=1)], offers))) == {"h0", "h1"}  # no "rack" label: no preference


def test_rack_preference_never_costs_a_host() -> None:
    # a (r1) fills first; the rest fits whole on c (r2) but would need two more hosts in r1.
    offers = [
        host("a", cpu=4, labels={"rack": "r1"}),
        host("b", cpu=2, labels={"rack": "r1"}),
        host("b2", cpu=2, labels={"rack": "r1"}),
        host("c", cpu=4, labels={"rack": "r2"}),
    ]
    assert hosts_of(one([gang(8, cpu=1)], offers)) == Counter({"a": 4, "c": 4})


def test_rack_preference_never_breaks_a_whole_gpu_host() -> None:
    offers = [
        host("a", gpus=8, cpu=64, labels={"rack": "r1"}),
        host("b", gpus=8, cpu=64, labels={"rack": "r1"}),
        host("c", gpus=2, cpu=64, labels={"rack": "r2"}),
    ]
    assert hosts_of(one([gang(10, gpu=1)], offers)) == Counter({"a": 8, "c": 2})


def test_rack_preference_beats_cpu_best_fit() -> None:
    offers = [
        host("a", cpu=8, labels={"rack": "r1"}),
        host("b", cpu=8, labels={"rack": "r1"}),
        host("c", cpu=2, labels={"rack": "r2"}),
    ]
    assert hosts_of(one([gang(10, cpu=1)], offers)) == Counter({"a": 8, "b": 2})
    # A single-host gang has no rack to stay in: plain best fit.
    assert hosts_of(one([gang(2, cpu=1)], offers)) == Counter({"c": 2})


# --- the index across rounds ------------------------------------------------------------------------------------------


def test_index_basics() -> None:
    idx = HostIndex([host("a", cpu=4, labels={"rack": "r1"}), host("b", gpus=2)])
    assert len(idx) == 2 and "a" in idx and "zz" not in idx
    a = idx.get("a")
    assert a is not None and a.free == Resources(4, 32 * GI, 100 * GI, 0, 10) and a.labels == {"rack": "r1"}
    assert a.gpu_ids == () and a.ports == ()
    assert idx.get("zz") is None
    idx.upsert(host("a", cpu=2, labels={"rack": "r2"}))
    a = idx.get("a")
    assert a is not None and a.free.cpu == 2 and a.labels == {"rack": "r2"}
    idx.remove("b")
    idx.remove("nope")
    assert [o.hostname for o in idx.offers()] == ["a"]
    idx.check()
    assert fail([gang(1, gpu=1)], idx).short_hosts == {"gpu": 1}


def test_upsert_of_labels_and_capacity_is_seen_by_the_next_placement() -> None:
    r1 = (Constraint("rack", "eq", "r1"),)
    idx = HostIndex([host("a", labels={"rack": "r1"}), host("b", labels={"rack": "r2"})])
    assert set(hosts_of(one([gang(1, constraints=r1, job="x")], idx))) == {"a"}
    idx.upsert(host("a", labels={"rack": "r2"}))
    idx.upsert(host("b", labels={"rack": "r1"}))
    assert set(hosts_of(one([gang(1, constraints=r1, job="y")], idx))) == {"b"}
    # A bigger host changes what "most free" weighs; the classes are rescored.
    idx.upsert(host("c", cpu=64, mem=8 * GI))
    idx.check()
    assert by_instance(one([gang(2, cpu=0, mem=0, strategy="spread")], idx)) == ["c", "a"]
    idx.remove("c")
    idx.check()
    assert by_instance(one([gang(2, cpu=0, mem=0, strategy="spread")], idx)) == ["a", "b"]
    idx.upsert(host("a", labels={"rack": "r2"}))  # unchanged: nothing to refile
    idx.check()


def test_sorted_names_against_a_plain_sorted_list() -> None:
    rng = random.Random(7)
    names, model = SortedNames(), list[str]()
    pool = [f"h{i:05d}" for i in range(3000)]
    for step in range(12_000):
        if model and (rng.random() < 0.45 or len(model) > 2500):
            n = rng.choice(model)
            names.remove(n)
            model.remove(n)
        else:
            n = rng.choice(pool)
            if n in model:
                continue
            names.add(n)
            model.append(n)
            model.sort()
        if step % 500 == 0 or not model:
            assert list(names) == model and len(names) == len(model)
            assert not model or names.first() == model[0]
            assert names.lasts == [c[-1] for c in names.chunks]
    assert list(names) == model
    with pytest.raises(KeyError):
        names.remove("not-there")


def test_place_updates_an_index_but_not_a_list() -> None:
    offers = [host("a", cpu=4)]
    copy = list(offers)
    one([gang(4, cpu=1)], offers)
    assert offers == copy
    one([gang(4, cpu=1)], offers)  # the list still has room
    idx = HostIndex(offers)
    one([gang(4, cpu=1)], idx)
    a = idx.get("a")
    assert a is not None and a.free.cpu == 0
    fail([gang(1, cpu=1)], idx)


def test_incremental_rounds() -> None:
    offers = [host(f"h{i}", cpu=4, labels={"rack": rack_of(f"h{i}")}) for i in range(4)]
    idx = HostIndex(offers)
    p1 = one([gang(8, cpu=1, job="j1")], idx)
    assert hosts_of(p1) == Counter({"h0": 4, "h2": 4})
    # The host manager reports: h0's tasks finished; h1 lost a core to something else.
    idx.upsert(host("h0", cpu=4, labels={"rack": "r0"}))
    idx.upsert(host("h1", cpu=3, labels={"rack": "r1"}))
    idx.check()
    p2 = one([gang(4, cpu=1, job="j2")], idx)
    assert hosts_of(p2) == Counter({"h0": 4})
    p3 = one([gang(6, cpu=1, job="j3")], idx)
    assert hosts_of(p3) == Counter({"h3": 4, "h1": 2})
    fail([gang(2, cpu=1, job="j4")], idx)
    assert [o.free.cpu for o in idx.offers()] == [0, 1, 0, 0]
    # The same as a fresh index of those states.
    fresh = HostIndex(idx.offers())
    assert place([gang(1, cpu=1, job="j5")], fresh) == place([gang(1, cpu=1, job="j5")], idx)


def test_release_restores_exactly() -> None:
    offers = [host(f"h{i}", cpu=4 + i, gpus=i % 3, ports=4, labels={"rack": rack_of(f"h{i}")}) for i in range(6)]
    idx = HostIndex(offers)
    before = idx.offers()
    classes = idx.class_count()
    batch = [
        gang(5, cpu=1.5, mem=0.1, gpu=1, ports=1, job="a"),
        gang(3, cpu=0.1, strategy="spread", job="b"),
        gang(9, cpu=0.3, job="c"),
    ]
    placed, failed = place(batch, idx)
    assert len(placed) == 3 and not failed
    assert idx.offers() != before
    for p in reversed(placed):
        idx.release(p)
    assert idx.offers() == before
    assert idx.class_count() == classes
    idx.check()
    # Released in any order, and with a host gone meanwhile.
    placed, _ = place(batch, idx)
    idx.remove("h1")
    for p in placed:
        idx.release(p)
    assert idx.offers() == [o for o in before if o.hostname != "h1"]
    idx.check()


def test_constrained_gang_on_a_big_index() -> None:
    offers = [
        host(
            f"h{i:05d}",
            cpu=16,
            gpus=8 if i % 2 else 0,
            labels={"rack": f"r{i % 40:02d}", "zone": f"z{i % 3}", "pool": "batch" if i % 7 else "prod"},
        )
        for i in range(4000)
    ]
    idx = HostIndex(offers)
    in_r07 = [o.hostname for o in offers if o.labels["rack"] == "r07"]
    p = one([gang(40, cpu=4, constraints=(Constraint("rack", "eq", "r07"),))], idx)
    assert set(hosts_of(p)) <= set(in_r07) and len(hosts_of(p)) == 10
    p = one(
        [
            gang(
                8,
                cpu=1,
                strategy="spread",
                constraints=(Constraint("zone", "in", "z1,z2"), Constraint("pool", "eq", "prod")),
            )
        ],
        idx,
    )
    labels = {o.hostname: o.labels for o in offers}
    assert len(hosts_of(p)) == 8
    assert all(labels[h]["zone"] in ("z1", "z2") and labels[h]["pool"] == "prod" for h in hosts_of(p))
    # Rack r07 holds 100 hosts of 16 cores, 10 of them full now. At the failure all 100 are full, and the 8 hosts
    # of the spread gang have 15 cores left.
    f = fail([gang(91, cpu=16, constraints=(Constraint("rack", "eq", "r07"),))], idx)
    assert "placed 90 of 91" in f.reason
    assert f.short_hosts == {"cpu": 108, "constraint": 3900}
    idx.check()


# --- properties ----------------------------------------------------------------------------------------------------

LABEL_VALUES = ("r1", "r2", "r3")


@st.composite
def offers_st(draw: st.DrawFn) -> list[HostOffer]:
    n = draw(st.integers(0, 8))
    out = []
    for i in range(n):
        gpus = draw(st.sampled_from([0, 0, 1, 2, 4]))
        labels = {}
        if draw(st.booleans()):
            labels["rack"] = draw(st.sampled_from(LABEL_VALUES))
        free = Resources(
            cpu=draw(st.sampled_from([0.5, 1.0, 2.0, 3.5, 8.0])),
            mem=float(draw(st.integers(0, 8))) * 512,
            disk=float(draw(st.integers(0, 4))) * 1024,
            gpu=gpus,
            ports=draw(st.integers(0, 4)),
        )
        out.append(
            HostOffer(
                hostname=f"h{i}",
                address=f"10.0.0.{i}",
                free=free,
                # Id lists that disagree with the counts: the placer must not read them.
                gpu_ids=tuple(range(draw(st.integers(0, 4)))),
                ports=tuple(range(draw(st.integers(0, 3)))),
                labels=labels,
                capacity=free,
                has_gpus=gpus > 0 or draw(st.booleans()),
            )
        )
    return out


resources_st = st.builds(
    Resources,
    cpu=st.sampled_from([0.0, 0.5, 1.0, 2.0]),
    mem=st.sampled_from([0.0, 256.0, 1024.0]),
    disk=st.sampled_from([0.0, 512.0]),
    gpu=st.sampled_from([0, 0, 1, 2]),
    ports=st.integers(0, 2),
)

constraint_st = st.builds(
    Constraint,
    attribute=st.just("rack"),
    op=st.sampled_from(["eq", "ne", "exists", "in"]),
    value=st.sampled_from(["r1", "r2", "r1,r3"]),
)


@st.composite
def gangs_st(draw: st.DrawFn, prefix: str = "j") -> list[GangRequest]:
    out = []
    for g in range(draw(st.integers(0, 4))):
        n = draw(st.integers(1, 5))
        same = draw(st.booleans())
        sizes = [draw(resources_st)] * n if same else [draw(resources_st) for _ in range(n)]
        out.append(
            GangRequest(
                gang_id=f"{prefix}{g}/0",
                job_id=f"{prefix}{g}",
                attempt=1,
                members=tuple(MemberRequest(i, f"{prefix}{g}-{i}-1", sizes[i]) for i in range(n)),
                strategy=draw(st.sampled_from(["pack", "spread"])),
                constraints=tuple(draw(st.lists(constraint_st, max_size=2))),
            )
        )
    return out


def deducted(offers: list[HostOffer], placed: list[GangPlacement]) -> list[HostOffer]:
    """`offers` with what `placed` took subtracted: the free states the index should now hold."""
    used: dict[str, Resources] = defaultdict(Resources)
    for p in placed:
        for a in p.members:
            used[a.hostname] = used[a.hostname] + a.resources
    return [
        HostOffer(
            o.hostname, o.address, o.free - used[o.hostname], labels=o.labels, capacity=o.capacity, has_gpus=o.has_gpus
        )
        for o in offers
    ]


def check_whole_gangs_or_failure(gangs: list[GangRequest], offers: list[HostOffer]) -> None:
    placed, failed = place(gangs, offers)
    by_id = {g.gang_id: g for g in gangs}
    assert len(placed) + len(failed) == len(gangs)
    assert {p.gang_id for p in placed} | {f.gang_id for f in failed} == set(by_id)
    assert not {p.gang_id for p in placed} & {f.gang_id for f in failed}
    order = [g.gang_id for g in gangs]
    assert [p.gang_id for p in placed] == [i for i in order if i in {p.gang_id for p in placed}]
    for p in placed:
        g = by_id[p.gang_id]
        assert len(p.members) == len(g.members)
        assert sorted(m.instance for m in p.members) == sorted(m.instance for m in g.members)
        want = {m.instance: m for m in g.members}
        for a in p.members:
            assert a.task_id == want[a.instance].task_id
            assert a.resources == want[a.instance].resources
            assert a.gpu_ids == () and a.ports == ()
    for f in failed:
        assert f.reason and "\n" not in f.reason
        assert all(v > 0 for v in f.short_hosts.values())
        assert list(f.short_hosts) == [
            d for d in ("cpu", "mem", "disk", "gpu", "ports", "constraint") if d in f.short_hosts
        ]


def check_no_overcommit(gangs: list[GangRequest], offers: list[HostOffer]) -> None:
    placed, _ = place(gangs, offers)
    offer_by_name = {o.hostname: o for o in offers}
    used: dict[str, Resources] = defaultdict(Resources)
    for p in placed:
        for a in p.members:
            o = offer_by_name[a.hostname]
            assert a.address == o.address
            used[a.hostname] = used[a.hostname] + a.resources
    for name, total in used.items():
        assert total.fits_in(offer_by_name[name].free), (name, total, offer_by_name[name].free)


def check_constraints_respected(gangs: list[GangRequest], offers: list[HostOffer]) -> None:
    placed, _ = place(gangs, offers)
    offer_by_name = {o.hostname: o for o in offers}
    by_id = {g.gang_id: g for g in gangs}
    for p in placed:
        for a in p.members:
            labels = offer_by_name[a.hostname].labels
            assert all(c.matches(labels) for c in by_id[p.gang_id].constraints)


def check_failed_gangs_consume_nothing(gangs: list[GangRequest], offers: list[HostOffer]) -> None:
    """Placing the batch gives what placing only its successful gangs gives, and leaves the same index."""
    idx = HostIndex(offers)
    placed, _ = place(gangs, idx)
    ok = {p.gang_id for p in placed}
    idx_ok = HostIndex(offers)
    placed_ok, failed_ok = place([g for g in gangs if g.gang_id in ok], idx_ok)
    assert placed_ok == placed and not failed_ok
    assert idx.offers() == idx_ok.offers()


def check_deterministic(gangs: list[GangRequest], offers: list[HostOffer], seed: int) -> None:
    first = place(gangs, offers)
    assert place(gangs, offers) == first
    assert place(tuple(gangs), tuple(offers)) == first
    shuffled = list(offers)
    random.Random(seed).shuffle(shuffled)
    assert place(gangs, shuffled) == first  # hosts are an index, not a list: their order does not matter


def check_index_after_place_equals_rebuilt(
    gangs: list[GangRequest], more: list[GangRequest], offers: list[HostOffer]
) -> None:
    idx = HostIndex(offers)
    placed, _ = place(gangs, idx)
    idx.check()
    rebuilt = HostIndex(deducted(offers, placed))
    rebuilt.check()
    assert idx.offers() == rebuilt.offers()
    assert idx.class_count() == rebuilt.class_count()
    assert place(more, idx) == place(more, rebuilt)
    assert idx.offers() == rebuilt.offers()


def check_release_restores(gangs: list[GangRequest], offers: list[HostOffer]) -> None:
    idx = HostIndex(offers)
    before = idx.offers()
    placed, _ = place(gangs, idx)
    for p in placed:
        idx.release(p)
    idx.check()
    assert idx.offers() == before


def check_cpu_work_avoids_gpu_hosts(gangs: list[GangRequest], offers: list[HostOffer]) -> None:
    """A single-gang batch: a CPU-only member on a GPU host means no GPU-less eligible host had room for it."""
    idx = HostIndex(offers)
    offer_by_name = {o.hostname: o for o in idx.offers()}
    for g in gangs[:1]:
        placed, _ = place([g], offers)
        if not placed or not all(m.resources.gpu == 0 for m in g.members):
            continue
        eligible_cpu_hosts = [
            o for o in offer_by_name.values() if not o.has_gpus and all(c.matches(o.labels) for c in g.constraints)
        ]
        if any(offer_by_name[a.hostname].has_gpus for a in placed[0].members):
            # Some member could not fit on any GPU-less host at that point: at least one such host is too small
            # for the whole gang (otherwise pack/spread would never have left them).
            assert not any(g.total.fits_in(o.free) for o in eligible_cpu_hosts)


def naive_fit(g: GangRequest, offers: list[HostOffer]) -> bool:
    """Independent oracle: does any assignment of every member to a host allowed by the constraints exist that keeps
    every host within its free resources? Exhaustive backtracking (small inputs only)."""
    free = [
        [o.free.cpu, o.free.mem, o.free.disk, o.free.gpu, o.free.ports]
        for o in offers
        if all(c.matches(o.labels) for c in g.constraints)
    ]
    reqs = [m.resources for m in g.members]
    dead: set[tuple[object, ...]] = set()

    def go(i: int, lo: int) -> bool:
        if i == len(reqs):
            return True
        state = (i, lo, tuple(tuple(f) for f in free))
        if state in dead:
            return False
        r = reqs[i]
        # Identical neighbours are interchangeable: let them take hosts in non-decreasing order.
        start = lo if i > 0 and reqs[i - 1] == r else 0
        for j in range(start, len(free)):
            f = free[j]
            if r.fits_in(Resources(f[0], f[1], f[2], int(f[3]), int(f[4]))):
                f[0] -= r.cpu
                f[1] -= r.mem
                f[2] -= r.disk
                f[3] -= r.gpu
                f[4] -= r.ports
                ok = go(i + 1, j)
                f[0] += r.cpu
                f[1] += r.mem
                f[2] += r.disk
                f[3] += r.gpu
                f[4] += r.ports
                if ok:
                    return True
        dead.add(state)
        return False

    return go(0, 0)


def check_against_naive_fit(gangs: list[GangRequest], offers: list[HostOffer]) -> None:
    for g in gangs:
        idx = HostIndex(offers)
        before = idx.offers()
        verdict = can_ever_fit(g, idx)
        assert idx.offers() == before
        placed, failed = place([g], offers)
        assert (verdict is None) == bool(placed)
        if verdict is not None:
            assert verdict == failed[0]
        if placed:
            assert naive_fit(g, offers), "placed a gang that cannot fit"
        first = g.members[0].resources
        one_host_takes_all = any(
            g.total.fits_in(o.free) and all(c.matches(o.labels) for c in g.constraints) for o in offers
        )
        if all(m.resources == first for m in g.members) and one_host_takes_all:
            assert placed, f"missed a fit: {failed}"


@settings(max_examples=200, deadline=None)
@given(gangs=gangs_st(), offers=offers_st(), seed=st.integers(0, 1000))
def test_properties_of_one_batch(gangs: list[GangRequest], offers: list[HostOffer], seed: int) -> None:
    """Whole gangs or a failure, no over-commit, constraints, failed gangs consume nothing, determinism."""
    check_whole_gangs_or_failure(gangs, offers)
    check_no_overcommit(gangs, offers)
    check_constraints_respected(gangs, offers)
    check_failed_gangs_consume_nothing(gangs, offers)
    check_deterministic(gangs, offers, seed)


@settings(max_examples=150, deadline=None)
@given(gangs=gangs_st(), more=gangs_st(prefix="m"), offers=offers_st())
def test_properties_of_the_index(gangs: list[GangRequest], more: list[GangRequest], offers: list[HostOffer]) -> None:
    """The index after `place` is the index of the deducted states; release gives everything back."""
    check_index_after_place_equals_rebuilt(gangs, more, offers)
    check_release_restores(gangs, offers)


@settings(max_examples=200, deadline=None)
@given(gangs=gangs_st(), offers=offers_st())
def test_properties_of_single_gangs(gangs: list[GangRequest], offers: list[HostOffer]) -> None:
    check_cpu_work_avoids_gpu_hosts(gangs, offers)
    check_against_naive_fit(gangs, offers)


def test_naive_fit_oracle_sanity() -> None:
    """The oracle itself: a gang whose first member must not take the first host that fits is found to fit."""
    offers = [host("a", cpu=3, mem=0), host("b", cpu=2, mem=0)]
    members = (MemberRequest(0, "t0", Resources(cpu=2)), MemberRequest(1, "t1", Resources(cpu=3)))
    g = GangRequest("j/0", "j", 1, members)
    assert naive_fit(g, offers)
    assert not naive_fit(gang(3, cpu=2, mem=0), offers)


def test_the_member_size_caches_forget_sizes_of_gangs_long_gone() -> None:
    """Every distinct member size ever placed kept a shape id in the index, and a cached count in every class it
    was tried on, for the index's life (a daemon's: months of jobs whose sizes vary by a MiB). Past a bound the
    caches start again; placements are the same either way."""
    from peloton.placement.index import SHAPES_MAX

    index = HostIndex([host("h1", cpu=64, mem=1024 * GI), host("h2", cpu=64, mem=1024 * GI)])
    for i in range(SHAPES_MAX * 2 + 10):
        p = one([gang(2, mem=1 * GI + i, job=f"j{i}")], index)  # a size of its own
        assert hosts_of(p) == Counter({"h1": 2})
        index.release(p)  # the gang ended
    shapes = index._shapes  # noqa: SLF001 - the cache under test
    caps = [len(c.caps) for tier in index._tiers.values() for c in tier.values()]  # noqa: SLF001
    assert 0 < len(shapes) <= SHAPES_MAX and caps and max(caps) <= SHAPES_MAX
