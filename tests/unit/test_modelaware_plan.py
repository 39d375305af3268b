"""The plan search (peloton/modelaware/plan.py). Property: on random small clusters and models where exhaustive
search is possible, the plan found is within 1% of the exhaustive optimum under the same cost model (issue 20).
Seeded loops over a few hundred cases each: deterministic, and a failure names its seed."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace

import pytest

from peloton.errors import InvalidArgument
from peloton.modelaware.cost import HIERARCHICAL, PS, RING, CostParams, HostUse, Reference, predict
from peloton.modelaware.plan import (
    FreeHost,
    Plan,
    PlanRequest,
    _ring_fastest,
    _ring_hosts,
    exhaustive,
    search,
    size_rates,
)

MODELS = ("t4", "v100", "a100")
NICS = (10, 25, 100)
LINKS = ("pcie", "nvlink")


def random_params(rng: random.Random) -> CostParams:
    return CostParams(alpha_c=rng.uniform(0.001, 0.3), beta_c=rng.uniform(1e-4, 0.1), alpha_r=rng.uniform(0, 0.2),
                      beta_r=rng.uniform(0, 0.3), alpha_n=rng.uniform(0, 1.0), beta_n=rng.uniform(0, 0.5),
                      gamma=rng.choice([1.0, rng.uniform(1, 4)]),
                      reference=Reference(rng.choice(MODELS), rng.choice(NICS), rng.choice(LINKS)),
                      alpha_h=rng.choice([0.0, rng.uniform(0, 0.05), rng.uniform(0, 0.5)]),
                      kappa=rng.choice([0.0, rng.uniform(0, 0.1), rng.uniform(0, 1.0)]))


def random_cluster(rng: random.Random, most: int = 5) -> list[FreeHost]:
    """2..most hosts with 0-4 free GPUs; half the time from a palette of two kinds (so hosts share a kind)."""
    kinds = [(rng.choice(MODELS), rng.choice(NICS), rng.choice(LINKS)) for _ in range(2)]
    out = []
    for i in range(rng.randint(2, most)):
        m, nic, link = rng.choice(kinds) if rng.random() < 0.5 else (
            rng.choice(MODELS), rng.choice(NICS), rng.choice(LINKS))
        out.append(FreeHost(f"h{i}", rng.randint(0, 4), m, nic, link))
    return out


def check_plan(plan: Plan, hosts: list[FreeHost], params: CostParams, pattern: str) -> None:
    """A plan uses hosts that exist, within their free GPUs, and its prediction is the cost model's."""
    by_name = {h.name: h for h in hosts}
    assert len({n for n, _ in plan.hosts}) == len(plan.hosts)
    for name, g in plan.hosts:
        assert 1 <= g <= by_name[name].free_gpus
    uses = [HostUse(g, by_name[n].gpu_model, by_name[n].nic_gbps, by_name[n].gpu_link) for n, g in plan.hosts]
    assert predict(params, uses, plan.prediction.local_bsz, pattern).step_time == pytest.approx(
        plan.prediction.step_time, rel=1e-12)


@pytest.mark.parametrize("pattern", [RING, HIERARCHICAL])
@pytest.mark.parametrize("top", [1, 5])
def test_the_plan_for_k_gpus_is_within_1pct_of_the_exhaustive_optimum(pattern: str, top: int) -> None:
    cases = 0
    for seed in range(300):
        rng = random.Random(seed)
        hosts = random_cluster(rng)
        free = sum(h.free_gpus for h in hosts)
        if not free:
            continue
        params = random_params(rng)
        k = rng.randint(1, free)
        bsz = rng.choice([1, 4, 32, 128])
        plans = search(params, hosts, PlanRequest(gpus=k, local_bsz=bsz, pattern=pattern, top=top))
        best = exhaustive(params, hosts, k, bsz, pattern)
        assert best is not None and plans, seed
        assert plans[0].gpus == k
        assert plans[0].prediction.step_time <= best.step_time * 1.01, (seed, plans[0], best, hosts)
        for p in plans:
            check_plan(p, hosts, params, pattern)
        cases += 1
    assert cases >= 250


def test_ring_host_counts_come_fastest_first() -> None:
    """The ring search walks its host counts n by the network term alone, alpha_h making it convex from n = 3 on
    (least near sqrt(A/B)), n = 2 (P = 1) in its place; against a plain sort on random parameters."""
    from peloton.modelaware.cost import network_time

    for seed in range(400):
        rng = random.Random(seed)
        p = random_params(rng)
        k = rng.randint(2, 200)
        lo = rng.randint(2, 12)
        hi = rng.randint(lo, 60)
        nic = rng.choice(NICS)
        scale = p.reference.nic_gbps / nic
        want = sorted(range(lo, hi + 1), key=lambda n: (round(network_time(p, scale, n, 2 * (k - 1)), 12), -n))
        got = list(_ring_hosts(p, k, lo, hi, nic))
        assert [round(network_time(p, scale, n, 2 * (k - 1)), 12) for n in got] == [
            round(network_time(p, scale, n, 2 * (k - 1)), 12) for n in want], seed
        assert sorted(got) == list(range(lo, hi + 1)), seed
        best = _ring_fastest(p, k, hi, nic)
        assert network_time(p, scale, best, 2 * (k - 1)) == pytest.approx(
            min(network_time(p, scale, n, 2 * (k - 1)) for n in range(2, hi + 1)), rel=1e-12), seed


@pytest.mark.parametrize("pattern", [RING, HIERARCHICAL])
def test_the_chosen_size_is_within_1pct_of_the_exhaustive_optimum_over_every_size(pattern: str) -> None:
    """--max-gpus/--min-gpus, both objectives, a local or a global batch: the best over every allowed K."""
    for seed in range(150):
        rng = random.Random(10_000 + seed)
        hosts = random_cluster(rng, most=4)
        free = sum(h.free_gpus for h in hosts)
        if not free:
            continue
        params = random_params(rng)
        lo = rng.randint(1, free)
        hi = rng.randint(lo, free)
        objective = rng.choice(["throughput", "efficiency"])
        glob = rng.choice([0, 0, 256])
        req = PlanRequest(max_gpus=hi, min_gpus=lo, local_bsz=0 if glob else 16, global_bsz=glob,
                          objective=objective, pattern=pattern, top=rng.choice([1, 3]))
        plans = search(params, hosts, req)
        best = 0.0
        for k in range(lo, hi + 1):
            bsz = glob / k if glob else 16
            pred = exhaustive(params, hosts, k, bsz, pattern)
            assert pred is not None
            best = max(best, pred.samples_per_s / (k if objective == "efficiency" else 1))
        assert plans and lo <= plans[0].gpus <= hi
        assert plans[0].score(objective) >= best / 1.01, (seed, plans[0], best, hosts)


def test_hierarchical_puts_more_gpus_on_the_nvlink_host() -> None:
    """Within hosts the term is f(g) * link scale: 2 GPUs over NVLink cost less than 2 over PCIe, so the 3 GPUs
    go 2 on the NVLink host and 1 on the PCIe host, not 2 on the host with more free GPUs (the search before
    issue 20's tests spread by free GPUs alone)."""
    params = CostParams(0.05, 0.001, 0.05, 0.5, 0.01, 0.01, 1.0, Reference("t4", 100, "pcie"))
    hosts = [FreeHost("a", 3, "t4", 100, "pcie"), FreeHost("b", 2, "t4", 100, "nvlink")]
    plan = search(params, hosts, PlanRequest(gpus=3, local_bsz=8, pattern=HIERARCHICAL))[0]
    assert dict(plan.hosts) == {"b": 2, "a": 1}
    best = exhaustive(params, hosts, 3, 8, HIERARCHICAL)
    assert best is not None and plan.prediction.step_time == pytest.approx(best.step_time)


@pytest.mark.parametrize("pattern", [RING, HIERARCHICAL])
def test_with_contention_the_faster_host_takes_more_gpus(pattern: str) -> None:
    """Under contention each host's GPUs compute (1 + kappa (g - 1)) / (relative speed) times the reference alone,
    so 6 GPUs on an A100 host and a T4 host (8 free each) go 5 and 1, the A100's 5 still computing faster than
    the T4's one, not 3 and 3 nor all 6 on the A100 (whose crowding would then be the slowest)."""
    params = CostParams(0.05, 0.01, 0.001, 0.001, 0.01, 0.001, 1.0, Reference("t4", 100, "pcie"), kappa=0.6)
    hosts = [FreeHost("fast", 8, "a100", 100, "pcie"), FreeHost("slow", 8, "t4", 100, "pcie")]
    plan = search(params, hosts, PlanRequest(gpus=6, local_bsz=32, pattern=pattern))[0]
    assert dict(plan.hosts) == {"fast": 5, "slow": 1}
    best = exhaustive(params, hosts, 6, 32, pattern)
    assert best is not None and plan.prediction.step_time == pytest.approx(best.step_time)
    alike = search(replace(params, kappa=0.0), hosts, PlanRequest(gpus=6, local_bsz=32, pattern=pattern))[0]
    assert alike.hosts == (("fast", 6),)


def test_plans_are_ranked_one_per_shape() -> None:
    params = CostParams(0.22, 0.058, 0.14, 0.095, 0.99, 0.1, 2.1, Reference("t4", 50, "pcie"))  # bert's fit
    hosts = [FreeHost(f"h{i}", 4, "t4", 50, "pcie") for i in range(4)]
    plans = search(params, hosts, PlanRequest(gpus=8, local_bsz=8, top=5))
    shapes = [tuple(sorted(p.gpus_per_host, reverse=True)) for p in plans]
    assert shapes[0] == (2, 2, 2, 2) and len(set(shapes)) == len(shapes) and all(p.gpus == 8 for p in plans)
    assert [p.samples_per_s for p in plans] == sorted((p.samples_per_s for p in plans), reverse=True)
    assert plans[0].hosts == (("h0", 2), ("h1", 2), ("h2", 2), ("h3", 2))
    # up to all 16: the most throughput is every GPU; per GPU, one GPU alone
    assert search(params, hosts, PlanRequest(local_bsz=8))[0].gpus_per_host == (4, 4, 4, 4)
    assert search(params, hosts, PlanRequest(local_bsz=8, objective="efficiency"))[0].gpus_per_host == (1,)
    assert search(params, hosts, PlanRequest(gpus=17, local_bsz=8)) == []
    assert search(params, hosts, PlanRequest(gpus=8, local_bsz=8, top=1))[0] == plans[0]


def test_a_thousand_hosts_cost_what_their_kinds_cost() -> None:
    """1,000 hosts of 24 kinds: plans on their hosts, from the right kinds."""
    rng = random.Random(7)
    kinds = [(free, m, nic, link) for m in MODELS for nic in (10, 100) for link in LINKS for free in (2, 4)]
    hosts = [FreeHost(f"n{i:04d}", *rng.choice(kinds)) for i in range(1000)]
    params = CostParams(0.05, 0.004, 0.03, 0.08, 0.2, 0.06, 1.8, Reference("t4", 25, "pcie"))
    for pattern in (RING, HIERARCHICAL):
        plans = search(params, hosts, PlanRequest(gpus=64, local_bsz=32, pattern=pattern))
        for p in plans:
            check_plan(p, hosts, params, pattern)
        used = Counter((h.gpu_model, h.nic_gbps) for h in hosts if h.name in dict(plans[0].hosts))
        assert set(used) == {("a100", 100)}, used  # the fastest GPUs and NICs, and there are enough of them


def test_every_sizes_rate_at_once_is_exactly_one_search_per_size() -> None:
    """plans.size_rates (`instances: auto` rates every allowed count with it) against one search per size, top 1,
    the best plan's samples/s or 0.0: equal to the bit, on random clusters of 2-150 hosts of a few kinds (0-8 free
    GPUs), random models, bounds past the free GPUs, both all-reduce patterns and objectives, a local or a global
    batch; and the parameter-server pattern (one search per size)."""
    for seed in range(100):
        rng = random.Random(20_000 + seed)
        kinds = [(rng.choice(MODELS), rng.choice(NICS), rng.choice(LINKS)) for _ in range(rng.randint(1, 4))]
        hosts = [FreeHost(f"h{i}", rng.randint(0, 8), *rng.choice(kinds))
                 for i in range(rng.choice([2, 5, 20, 60, 150]))]
        free = sum(h.free_gpus for h in hosts)
        params = random_params(rng)
        pattern = PS if seed % 20 == 0 else rng.choice([RING, HIERARCHICAL])
        glob = rng.choice([0, 0, 512])
        req = PlanRequest(local_bsz=0 if glob else rng.choice([1, 8, 64]), global_bsz=glob, pattern=pattern,
                          objective=rng.choice(["throughput", "efficiency"]), servers=1 if pattern == PS else 0)
        lo = rng.randint(1, max(free, 1))
        sizes = range(lo, min(rng.randint(lo, free + 3), lo + (6 if pattern == PS else 50)) + 1)
        slow = [found[0].samples_per_s if (found := search(params, hosts, replace(req, gpus=k, top=1))) else 0.0
                for k in sizes]
        assert size_rates(params, hosts, sizes, req) == slow, seed
    with pytest.raises(InvalidArgument) as e:
        size_rates(params, hosts, [5000], req)
    assert e.value.field == "gpus"


def test_parameter_server_sizes_rated_at_once_are_exactly_one_search_per_size() -> None:
    """size_rates for the parameter-server pattern rates a layout from one of each kind of host and leaves out
    workers that cannot beat the best found: the same samples/s to the bit as one full search per size, with the
    servers' count given or chosen, on clusters where hosts share kinds (ties between layouts are common) and some
    hosts cannot take a server, beta_n sometimes 0 (the bound equals the layout's), both objectives."""
    for seed in range(200):
        rng = random.Random(30_000 + seed)
        kinds = [(rng.choice(MODELS), rng.choice(NICS), rng.choice(LINKS)) for _ in range(rng.randint(1, 3))]
        hosts = [FreeHost(f"h{i}", rng.choice([0, 1, 2, 4, 4, 8]), *rng.choice(kinds), can_host_server=rng.random() < 0.8)
                 for i in range(rng.choice([2, 2, 3, 3, 6, 12, 25]))]
        free = sum(h.free_gpus for h in hosts)
        params = random_params(rng)
        if seed % 5 == 0:
            params = replace(params, beta_n=0.0)
        glob = rng.choice([0, 0, 256])
        req = PlanRequest(local_bsz=0 if glob else rng.choice([1, 16, 128]), global_bsz=glob, pattern=PS,
                          objective=rng.choice(["throughput", "efficiency"]), servers=rng.choice([0, 0, 1, 3]))
        lo = rng.randint(1, max(free, 1))
        sizes = range(lo, min(free + 2, lo + 12) + 1)
        slow = [found[0].samples_per_s if (found := search(params, hosts, replace(req, gpus=k, top=1))) else 0.0
                for k in sizes]
        assert size_rates(params, hosts, sizes, req) == slow, seed


def test_parameter_server_plans_name_their_servers() -> None:
    params = CostParams(0.05, 0.004, 0.03, 0.08, 0.2, 0.06, 1.0, Reference("t4", 25, "pcie"))
    hosts = [FreeHost(f"h{i}", 4, "t4", 25, "pcie") for i in range(4)] + [FreeHost("spare", 0, "t4", 100, "pcie")]
    plans = search(params, hosts, PlanRequest(gpus=8, local_bsz=32, pattern=PS, servers=2, top=3))
    assert plans and all(len(p.servers) == 2 and p.gpus == 8 for p in plans)
    names = {h.name for h in hosts}
    assert all(set(p.servers) <= names for p in plans)


@pytest.mark.parametrize(("req", "field"), [
    (PlanRequest(gpus=4, local_bsz=8, objective="speed"), "objective"),
    (PlanRequest(gpus=4), "local_bsz"),
    (PlanRequest(gpus=4, local_bsz=8, global_bsz=64), "local_bsz"),
    (PlanRequest(gpus=4, max_gpus=8, local_bsz=8), "max_gpus"),
    (PlanRequest(max_gpus=2, min_gpus=4, local_bsz=8), "min_gpus"),
    (PlanRequest(gpus=5000, local_bsz=8), "gpus"),
    (PlanRequest(gpus=4, local_bsz=8, servers=2), "servers"),
])
def test_bad_requests_name_the_field(req: PlanRequest, field: str) -> None:
    with pytest.raises(InvalidArgument) as e:
        search(CostParams(0.1, 0.01, 0.01, 0.01, 0.1, 0.1, 1.0), [FreeHost("a", 4)], req)
    assert e.value.field == field


def test_a_goal_recorded_before_the_per_host_latency_reads_without_it() -> None:
    """A model-aware job records its cost model with its spec (goal_to_dict, in the store). One recorded before
    params.alpha_h existed reads with alpha_h = 0, the model it was planned with; a new one keeps its alpha_h."""
    from peloton.modelaware.plan import PlanGoal, goal_from_dict, goal_to_dict

    params = CostParams(0.22, 0.058, 0.14, 0.095, 0.99, 0.1, 2.1, Reference("t4", 50, "pcie"), alpha_h=0.0055)
    goal = PlanGoal(params, local_bsz=8)
    assert goal_from_dict(goal_to_dict(goal)) == goal
    old = goal_to_dict(goal)
    old_params = dict(old["params"])  # type: ignore[call-overload]
    del old_params["alpha_h"]
    assert goal_from_dict({**old, "params": old_params}).params == CostParams(
        0.22, 0.058, 0.14, 0.095, 0.99, 0.1, 2.1, Reference("t4", 50, "pcie"))


def test_a_goal_recorded_before_the_contention_term_reads_without_it() -> None:
    """A goal recorded before params.kappa existed reads with kappa = 0, the model it was planned with, and plans
    as it did; a new one keeps its kappa."""
    from peloton.modelaware.plan import PlanGoal, choose, goal_from_dict, goal_to_dict

    params = CostParams(0.017, 0.0007, 0.023, 0.015, 0.083, 0.0063, 3.0, Reference("t4", 50, "pcie"),
                        alpha_h=0.0054, kappa=0.027)
    goal = PlanGoal(params, local_bsz=1024)
    assert goal_from_dict(goal_to_dict(goal)) == goal
    old = goal_to_dict(goal)
    old_params = dict(old["params"])  # type: ignore[call-overload]
    del old_params["kappa"]
    was = goal_from_dict({**old, "params": old_params})
    assert was.params == CostParams(0.017, 0.0007, 0.023, 0.015, 0.083, 0.0063, 3.0, Reference("t4", 50, "pcie"),
                                    alpha_h=0.0054)
    hosts = [FreeHost(f"h{i}", 4, "t4", 50, "pcie") for i in range(4)]
    old_plan, new_plan = choose(was, hosts, 4), choose(goal, hosts, 4)
    assert old_plan is not None and new_plan is not None
    assert old_plan[1].gpus_per_host == (4,) and new_plan[1].gpus_per_host == (1, 1, 1, 1)


def test_the_chosen_plan_keeps_its_hosts_hardware_and_older_records_read_without_it() -> None:
    """What the gang's measurements were made on is kept with its plan (`model refit` fits a model only to those
    made on hardware like its reference), in the order of gpus_per_host; a plan recorded before reads with none."""
    import json

    from peloton.modelaware.plan import PlanChoice, PlanGoal, PlanHost, choice_from_dict, choice_to_dict, choose

    params = CostParams(0.22, 0.058, 0.064, 0.145, 0.99, 0.1, 2.1, Reference("t4", 50, "pcie"))
    hosts = [FreeHost("t0", 4, "t4", 50, "pcie"), FreeHost("t1", 4, "t4", 50, "pcie"),
             FreeHost("a0", 2, "a100", 100, "nvlink")]
    chosen = choose(PlanGoal(params, local_bsz=8), hosts, 6)
    assert chosen is not None
    best, record = chosen
    assert [h.name for h in record.hosts] == [name for name, _ in best.hosts]
    by_name = {h.name: h for h in hosts}
    assert record.hosts == tuple(PlanHost(n, by_name[n].gpu_model, by_name[n].nic_gbps, by_name[n].gpu_link)
                                 for n, _ in best.hosts)
    assert choice_from_dict(json.loads(json.dumps(choice_to_dict(record)))) == record
    old = choice_to_dict(record)
    del old["hosts"]
    assert choice_from_dict(old) == PlanChoice(record.gpus_per_host, record.step_time, record.samples_per_s,
                                               record.local_bsz, record.alternatives)
