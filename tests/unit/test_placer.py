"""The placement decision: table tests plus hypothesis properties (whole gangs, no over-commit, distinct ids)."""

from __future__ import annotations

from collections import Counter, defaultdict

from hypothesis import given, settings
from hypothesis import strategies as st

from peloton.domain.placement import GangPlacement, GangRequest, HostOffer, MemberRequest, PlacementFailure
from peloton.domain.resources import Resources
from peloton.domain.spec import Constraint
from peloton.placement.placer import can_ever_fit, place

GI = 1024.0


def host(
    name: str,
    cpu: float = 8,
    mem: float = 32 * GI,
    gpus: int = 0,
    ports: int = 10,
    labels: dict[str, str] | None = None,
    port_base: int = 31000,
    gpu_ids: tuple[int, ...] | None = None,
    disk: float = 100 * GI,
) -> HostOffer:
    ids = tuple(range(gpus)) if gpu_ids is None else gpu_ids
    port_list = tuple(range(port_base, port_base + ports))
    free = Resources(cpu, mem, disk, len(ids), len(port_list))
    return HostOffer(
        hostname=name,
        address=f"10.0.0.{name}" if name.isdigit() else f"addr-{name}",
        free=free,
        gpu_ids=ids,
        ports=port_list,
        labels=dict(labels or {}),
        capacity=free,
        has_gpus=len(ids) > 0,
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


def one(gangs: list[GangRequest], offers: list[HostOffer]) -> GangPlacement:
    placed, failed = place(gangs, offers, "lease-1")
    assert not failed, failed
    assert len(placed) == 1
    return placed[0]


def fail(gangs: list[GangRequest], offers: list[HostOffer]) -> PlacementFailure:
    placed, failed = place(gangs, offers, "lease-1")
    assert not placed
    assert len(failed) == 1
    return failed[0]


def hosts_of(p: GangPlacement) -> Counter[str]:
    return Counter(m.hostname for m in p.members)


# --- table tests -------------------------------------------------------------------------------------------------


def test_pack_fills_one_host() -> None:
    offers = [host("a"), host("b"), host("c")]
    p = one([gang(4, cpu=2)], offers)
    assert hosts_of(p) == Counter({"a": 4})
    assert p.lease_id == "lease-1" and p.gang_id == "job/0" and p.attempt == 1
    assert sorted(m.instance for m in p.members) == [0, 1, 2, 3]


def test_pack_prefers_best_fit_host() -> None:
    offers = [host("big", cpu=64), host("small", cpu=4), host("mid", cpu=16)]
    assert hosts_of(one([gang(4, cpu=1)], offers)) == Counter({"small": 4})


def test_pack_spills_over_to_fewest_hosts() -> None:
    offers = [host("a", cpu=4), host("b", cpu=8), host("c", cpu=2)]
    p = one([gang(10, cpu=1)], offers)
    assert hosts_of(p) == Counter({"b": 8, "c": 2})


def test_spread_uses_distinct_hosts() -> None:
    offers = [host(f"h{i}") for i in range(5)]
    p = one([gang(4, strategy="spread")], offers)
    assert len(hosts_of(p)) == 4
    assert max(hosts_of(p).values()) == 1


def test_spread_prefers_most_free_then_balances() -> None:
    offers = [host("a", cpu=4), host("b", cpu=16), host("c", cpu=8)]
    p = one([gang(5, strategy="spread")], offers)
    by_instance = {m.instance: m.hostname for m in p.members}
    assert [by_instance[i] for i in range(3)] == ["b", "c", "a"]
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
    assert "constraint 2 (rack eq r9)" in f.reason


def test_gpu_ids_distinct_and_lowest_first() -> None:
    offers = [host("g", gpus=0, gpu_ids=(7, 3, 5, 1))]
    p = one([gang(3, gpu=1)], offers)
    ids = [m.gpu_ids for m in sorted(p.members, key=lambda m: m.instance)]
    assert ids == [(1,), (3,), (5,)]
    p2 = one([gang(2, gpu=2)], offers)
    assert sorted(m.gpu_ids for m in p2.members) == [(1, 3), (5, 7)]


def test_gpu_pack_prefers_smallest_free_gpu_count_that_fits() -> None:
    offers = [host("g8", gpus=8, cpu=64), host("g2", gpus=2, cpu=64), host("g4", gpus=4, cpu=64)]
    assert hosts_of(one([gang(1, gpu=1)], offers)) == Counter({"g2": 1})
    assert hosts_of(one([gang(4, gpu=1)], offers)) == Counter({"g4": 4})
    assert hosts_of(one([gang(3, gpu=1)], offers)) == Counter({"g4": 3})


def test_ports_assigned_from_offer_and_distinct() -> None:
    offers = [host("a", ports=5, port_base=40000)]
    p = one([gang(2, ports=2)], offers)
    ports = sorted(m.ports for m in p.members)
    assert ports == [(40000, 40001), (40002, 40003)]
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


def test_second_gang_sees_first_gangs_consumption() -> None:
    offers = [host("a", cpu=4, gpus=2)]
    placed, failed = place([gang(1, cpu=3, gpu=1, job="j1"), gang(1, cpu=3, gpu=1, job="j2")], offers, "L")
    assert [p.job_id for p in placed] == ["j1"]
    assert [f.job_id for f in failed] == ["j2"]
    assert failed[0].short_hosts == {"cpu": 1}
    # Smaller second gang still fits and gets the next GPU.
    placed, failed = place([gang(1, cpu=2, gpu=1, job="j1"), gang(1, cpu=2, gpu=1, job="j2")], offers, "L")
    assert not failed
    assert [p.members[0].gpu_ids for p in placed] == [(0,), (1,)]


def test_failed_gang_consumes_nothing() -> None:
    offers = [host("a", cpu=4), host("b", cpu=4)]
    big = gang(3, cpu=3, job="big")
    small = gang(2, cpu=4, job="small")
    placed, failed = place([big, small], offers, "L")
    assert [f.job_id for f in failed] == ["big"]
    assert "placed 2 of 3" in failed[0].reason
    assert [p.job_id for p in placed] == ["small"]


def test_gangs_are_placed_in_given_order() -> None:
    offers = [host("a", cpu=4)]
    placed, failed = place([gang(1, cpu=4, job="first"), gang(1, cpu=1, job="second")], offers, "L")
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
        "gang of 4 needs cpu=4,mem=8Gi,gpu=1 each; placed 2 of 4; hosts short of: gpu 3, constraint 1 (rack eq r1)"
    )


def test_failure_counts_several_dimensions_per_host() -> None:
    f = fail([gang(1, cpu=16, mem=64 * GI, gpu=1)], [host("a", cpu=8, mem=32 * GI)])
    assert f.short_hosts == {"cpu": 1, "mem": 1, "gpu": 1}


def test_no_hosts() -> None:
    f = fail([gang(2)], [])
    assert "no hosts" in f.reason and f.short_hosts == {}


def test_empty_batch() -> None:
    assert place([], [host("a")], "L") == ([], [])


def test_can_ever_fit() -> None:
    cluster = [host("a", cpu=8, gpus=4), host("b", cpu=8, gpus=4)]
    assert can_ever_fit(gang(8, gpu=1), cluster) is None
    f = can_ever_fit(gang(9, gpu=1), cluster)
    assert f is not None and f.short_hosts == {"gpu": 2} and "placed 8 of 9" in f.reason
    f = can_ever_fit(gang(1, cpu=9), cluster)
    assert f is not None and f.short_hosts == {"cpu": 2}


def test_deterministic_tie_break_by_hostname() -> None:
    offers = [host("c"), host("a"), host("b")]
    assert set(hosts_of(one([gang(2)], offers))) == {"a"}
    assert [
        m.hostname for m in sorted(one([gang(3, strategy="spread")], offers).members, key=lambda m: m.instance)
    ] == [
        "a",
        "b",
        "c",
    ]


def test_large_cluster_is_fast() -> None:
    import time

    offers = [host(f"h{i:05d}", cpu=8 + i % 4 * 8, gpus=8 if i % 3 == 0 else 0) for i in range(10_000)]
    for g in (gang(16, cpu=4, gpu=1), gang(16, cpu=4, strategy="spread"), gang(16, cpu=64)):
        t0 = time.perf_counter()
        place([g], offers, "L")
        assert time.perf_counter() - t0 < 1.0


# --- properties ----------------------------------------------------------------------------------------------------

LABEL_VALUES = ("r1", "r2", "r3")


@st.composite
def offers_st(draw: st.DrawFn) -> list[HostOffer]:
    n = draw(st.integers(0, 8))
    out = []
    for i in range(n):
        gpus = draw(st.sampled_from([0, 0, 1, 2, 4]))
        nports = draw(st.integers(0, 4))
        port_base = 30000 + 100 * i
        labels = {}
        if draw(st.booleans()):
            labels["rack"] = draw(st.sampled_from(LABEL_VALUES))
        gpu_ids = tuple(draw(st.permutations(list(range(10, 10 + gpus)))))
        free = Resources(
            cpu=draw(st.sampled_from([0.5, 1.0, 2.0, 3.5, 8.0])),
            mem=float(draw(st.integers(0, 8))) * 512,
            disk=float(draw(st.integers(0, 4))) * 1024,
            gpu=gpus,
            ports=nports,
        )
        out.append(
            HostOffer(
                hostname=f"h{i}",
                address=f"10.0.0.{i}",
                free=free,
                gpu_ids=gpu_ids,
                ports=tuple(range(port_base, port_base + nports)),
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
def gangs_st(draw: st.DrawFn) -> list[GangRequest]:
    out = []
    for g in range(draw(st.integers(0, 4))):
        n = draw(st.integers(1, 5))
        same = draw(st.booleans())
        sizes = [draw(resources_st)] * n if same else [draw(resources_st) for _ in range(n)]
        out.append(
            GangRequest(
                gang_id=f"j{g}/0",
                job_id=f"j{g}",
                attempt=1,
                members=tuple(MemberRequest(i, f"j{g}-{i}-1", sizes[i]) for i in range(n)),
                strategy=draw(st.sampled_from(["pack", "spread"])),
                constraints=tuple(draw(st.lists(constraint_st, max_size=2))),
            )
        )
    return out


def check_whole_gangs_or_failure(gangs: list[GangRequest], offers: list[HostOffer]) -> None:
    placed, failed = place(gangs, offers, "L")
    by_id = {g.gang_id: g for g in gangs}
    assert len(placed) + len(failed) == len(gangs)
    assert {p.gang_id for p in placed} | {f.gang_id for f in failed} == set(by_id)
    assert not {p.gang_id for p in placed} & {f.gang_id for f in failed}
    for p in placed:
        g = by_id[p.gang_id]
        assert len(p.members) == len(g.members)
        assert sorted(m.instance for m in p.members) == sorted(m.instance for m in g.members)
        want = {m.instance: m for m in g.members}
        for a in p.members:
            assert a.task_id == want[a.instance].task_id
            assert a.resources == want[a.instance].resources
            assert len(a.gpu_ids) == a.resources.gpu and len(a.ports) == a.resources.ports
    for f in failed:
        assert f.reason and "\n" not in f.reason
        assert all(v > 0 for v in f.short_hosts.values())


def check_no_overcommit_and_distinct_ids(gangs: list[GangRequest], offers: list[HostOffer]) -> None:
    placed, _ = place(gangs, offers, "L")
    offer_by_name = {o.hostname: o for o in offers}
    used: dict[str, Resources] = defaultdict(Resources)
    gpu_ids: dict[str, list[int]] = defaultdict(list)
    ports: dict[str, list[int]] = defaultdict(list)
    for p in placed:
        for a in p.members:
            o = offer_by_name[a.hostname]
            assert a.address == o.address
            used[a.hostname] = used[a.hostname] + a.resources
            gpu_ids[a.hostname].extend(a.gpu_ids)
            ports[a.hostname].extend(a.ports)
    for name, total in used.items():
        free = offer_by_name[name].free
        assert total.cpu <= free.cpu + 1e-6
        assert total.mem <= free.mem + 1e-6
        assert total.disk <= free.disk + 1e-6
        assert total.gpu <= free.gpu
        assert total.ports <= free.ports
    for name, ids in gpu_ids.items():
        assert len(ids) == len(set(ids))
        assert set(ids) <= set(offer_by_name[name].gpu_ids)
    for name, ps in ports.items():
        assert len(ps) == len(set(ps))
        assert set(ps) <= set(offer_by_name[name].ports)


def check_constraints_respected(gangs: list[GangRequest], offers: list[HostOffer]) -> None:
    placed, _ = place(gangs, offers, "L")
    offer_by_name = {o.hostname: o for o in offers}
    by_id = {g.gang_id: g for g in gangs}
    for p in placed:
        for a in p.members:
            labels = offer_by_name[a.hostname].labels
            assert all(c.matches(labels) for c in by_id[p.gang_id].constraints)


def check_deterministic(gangs: list[GangRequest], offers: list[HostOffer]) -> None:
    assert place(gangs, offers, "L") == place(gangs, offers, "L")
    assert place(list(gangs), list(offers), "L") == place(tuple(gangs), tuple(offers), "L")


def check_cpu_work_avoids_gpu_hosts(gangs: list[GangRequest], offers: list[HostOffer]) -> None:
    """A single-gang batch: a CPU-only member on a GPU host means no GPU-less eligible host had room for it."""
    for g in gangs[:1]:
        placed, _ = place([g], offers, "L")
        if not placed or not all(m.resources.gpu == 0 for m in g.members):
            continue
        offer_by_name = {o.hostname: o for o in offers}
        eligible_cpu_hosts = [o for o in offers if not o.has_gpus and all(c.matches(o.labels) for c in g.constraints)]
        if any(offer_by_name[a.hostname].has_gpus for a in placed[0].members):
            # Some member could not fit on any GPU-less host at that point: at least one such host is too small
            # for the whole gang (otherwise pack/spread would never have left them).
            total = Resources()
            for m in g.members:
                total = total + m.resources
            assert not any(total.fits_in(o.free) for o in eligible_cpu_hosts)


def check_can_ever_fit_agrees_with_place(gangs: list[GangRequest], offers: list[HostOffer]) -> None:
    for g in gangs:
        placed, failed = place([g], offers, "L")
        verdict = can_ever_fit(g, offers)
        assert (verdict is None) == bool(placed)
        if verdict is not None:
            assert verdict == failed[0]


@settings(max_examples=200, deadline=None)
@given(gangs=gangs_st(), offers=offers_st())
def test_properties_of_one_batch(gangs: list[GangRequest], offers: list[HostOffer]) -> None:
    """(a) whole gangs or a failure, (b) no over-commit, (c) distinct ids from the offer, (d) constraints, (e) determinism."""
    check_whole_gangs_or_failure(gangs, offers)
    check_no_overcommit_and_distinct_ids(gangs, offers)
    check_constraints_respected(gangs, offers)
    check_deterministic(gangs, offers)


@settings(max_examples=200, deadline=None)
@given(gangs=gangs_st(), offers=offers_st())
def test_properties_of_single_gangs(gangs: list[GangRequest], offers: list[HostOffer]) -> None:
    check_cpu_work_avoids_gpu_hosts(gangs, offers)
    check_can_ever_fit_agrees_with_place(gangs, offers)
