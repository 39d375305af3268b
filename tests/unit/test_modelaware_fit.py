"""Fitting the cost model (peloton/modelaware/fit.py): known parameters come back from a profile the model made,
and fitted on the issue's small profile of the public bert and cifar10 measurements it predicts their other
placements (an accuracy check on fixed data: deterministic)."""

from __future__ import annotations

import statistics
from dataclasses import replace

import pytest

from peloton.errors import InvalidArgument
from peloton.modelaware import fit
from peloton.modelaware.cost import HIERARCHICAL, PARAM_NAMES, PS, RING, CostParams, Reference, predict, uniform_hosts
from peloton.modelaware.document import Measurement
from peloton.modelaware.plan import FreeHost, PlanRequest, search
from peloton.modelaware.profile import ProfileRow, select
from tests.unit.modelaware_data import REFERENCE, SMALL, profile

PLACEMENTS = [(1,), (2,), (3,), (4,), (1, 1), (3, 1), (2, 2), (1, 1, 1), (2, 1, 1), (2, 2, 2), (1, 1, 1, 1),
              (4, 4), (4, 4, 4, 4)]


def synthetic(true: CostParams, pattern: str) -> list[ProfileRow]:
    return [ProfileRow(pl, b, predict(true, uniform_hosts(pl, REFERENCE), b, pattern).step_time)
            for pl in PLACEMENTS for b in (4, 8, 16, 32, 64)]


@pytest.mark.parametrize("pattern", [RING, HIERARCHICAL])
@pytest.mark.parametrize("true", [
    CostParams(0.05, 0.004, 0.03, 0.08, 0.2, 0.06, 1.8, REFERENCE, alpha_h=0.01, kappa=0.1),
    CostParams(0.2, 0.05, 0.1, 0.1, 1.0, 0.1, 2.1, REFERENCE, alpha_h=0.003, kappa=0.01),  # like bert's fit
    CostParams(0.01, 0.0007, 0.025, 0.015, 0.1, 0.006, 1.0, REFERENCE, alpha_h=0.0055,
               kappa=0.027),  # no overlap at all; cifar10's contention
], ids=["overlap", "bert-like", "gamma1"])
def test_fit_recovers_the_parameters_of_a_profile_the_model_made(true: CostParams, pattern: str) -> None:
    r = fit.fit(synthetic(true, pattern), REFERENCE, pattern=pattern)
    for name in PARAM_NAMES:
        assert getattr(r.params, name) == pytest.approx(getattr(true, name), rel=0.01), name
    assert r.fitted == PARAM_NAMES and r.rows == len(PLACEMENTS) * 5
    assert r.max_error < 1e-6 and r.params.reference == REFERENCE


def test_what_a_profile_cannot_tell_keeps_the_base() -> None:
    """Single-host rows tell nothing of the network: its parameters stay the base's (the description's prior).
    They do tell the contention: the compute of 2, 3 and 4 GPUs on one host grows with the batch apart from the
    sync."""
    true = CostParams(0.05, 0.004, 0.03, 0.08, 0.2, 0.06, 1.5, REFERENCE, kappa=0.05)
    rows = [r for r in synthetic(true, RING) if len(r.placement) == 1]
    base = CostParams(0.01, 0.01, 0.01, 0.01, 0.7, 0.3, 1.0)
    r = fit.fit(rows, REFERENCE, base=base)
    assert r.fitted == ("alpha_c", "beta_c", "alpha_r", "beta_r", "kappa", "gamma")
    assert (r.params.alpha_n, r.params.beta_n) == (0.7, 0.3)
    assert r.params.alpha_r == pytest.approx(0.03, rel=0.01) and r.params.gamma == pytest.approx(1.5, rel=0.01)
    assert r.params.alpha_h == base.alpha_h and r.params.kappa == pytest.approx(0.05, rel=0.01)
    one = fit.fit([r for r in rows if r.gpus == 1], REFERENCE, base=base)
    assert one.fitted == ("alpha_c", "beta_c")
    assert one.params.beta_c == pytest.approx(0.004, rel=0.01) and one.params.gamma == 1.0
    assert one.params.kappa == 0.0
    with pytest.raises(InvalidArgument) as e:
        fit.fit([], REFERENCE)
    assert e.value.field == "profile"


def test_the_per_host_latency_needs_rows_on_two_host_counts() -> None:
    """alpha_h (per ring step across hosts, 2(N-1) of them) is told from alpha_n only by rows on different numbers
    of hosts: with every multi-host row on two hosts it keeps the base's value and alpha_n takes the rest."""
    true = CostParams(0.05, 0.004, 0.03, 0.08, 0.2, 0.06, 1.5, REFERENCE, alpha_h=0.02)
    rows = synthetic(true, RING)
    two = [r for r in rows if len(r.placement) <= 2]
    base = CostParams(0.01, 0.01, 0.01, 0.01, 0.7, 0.3, 1.0, alpha_h=0.004)
    r = fit.fit(two, REFERENCE, base=base)
    assert "alpha_h" not in r.fitted and r.params.alpha_h == 0.004
    assert r.params.alpha_n == pytest.approx(0.2 + 2 * (0.02 - 0.004), rel=0.01)  # 2(N-1) = 2 steps at N = 2
    assert r.max_error < 1e-6  # on two hosts the two latencies are one
    both = fit.fit(rows, REFERENCE, base=base)
    assert "alpha_h" in both.fitted and both.params.alpha_h == pytest.approx(0.02, rel=0.01)


def test_the_contention_needs_a_crowded_host_at_two_batches() -> None:
    """kappa scales the compute of a host's GPUs with how many are busy on it, so it grows with the batch while
    the sync does not: rows of crowded hosts at one local batch cannot tell it from the sync (kappa keeps the
    base's value), rows at two or more can. Without a row of one GPU per host it would be beta_c's."""
    true = CostParams(0.05, 0.004, 0.03, 0.08, 0.2, 0.06, 1.5, REFERENCE, alpha_h=0.01, kappa=0.08)
    rows = synthetic(true, RING)
    base = CostParams(0.01, 0.01, 0.01, 0.01, 0.7, 0.3, 1.0, kappa=0.02)
    one_batch = [r for r in rows if r.local_bsz == 16]
    r = fit.fit(one_batch, REFERENCE, base=base)
    assert "kappa" not in r.fitted and r.params.kappa == 0.02
    crowded = [r for r in rows if max(r.placement) > 1]
    assert "kappa" not in fit.fit(crowded, REFERENCE, base=base).fitted
    both = fit.fit(rows, REFERENCE, base=base)
    assert "kappa" in both.fitted and both.params.kappa == pytest.approx(0.08, rel=0.01)


def test_with_contention_the_plan_moves_with_the_batch() -> None:
    """Fitted on cifar10's six placements, kappa > 0: the compute of a crowded host grows with the batch, so the
    plan for 2 GPUs is one host at the smallest batch (sync dominates) and two at the largest (compute does), as
    the measurements have it; with kappa = 0 and the rest the same it is one host at both."""
    rows = profile("cifar10")
    step = measured_steps("cifar10")
    params = fit.fit(select(rows, SMALL), REFERENCE).params
    assert params.kappa > 0.01
    hosts = [FreeHost(f"h{i}", 4, REFERENCE.gpu_model, REFERENCE.nic_gbps, REFERENCE.gpu_link) for i in range(4)]
    lo, hi = min(r.local_bsz for r in rows), max(r.local_bsz for r in rows)

    def planned(p: CostParams, bsz: float) -> tuple[int, ...]:
        return tuple(sorted(search(p, hosts, PlanRequest(gpus=2, local_bsz=bsz, top=1))[0].gpus_per_host))

    assert (planned(params, lo), planned(params, hi)) == ((2,), (1, 1))
    assert ratio(step, (2,), lo) == 1.0 and ratio(step, (1, 1), hi) == 1.0
    blind = replace(params, kappa=0.0)
    assert planned(blind, lo) == planned(blind, hi) == (2,)


def test_quantiles_interpolate_like_numpy() -> None:
    assert fit.quantile([3, 1, 2, 4], 0.5) == 2.5
    assert fit.quantile([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 0.9) == pytest.approx(9.1)
    assert fit.quantile([], 0.5) == 0.0 and fit.quantile([7], 0.9) == 7


@pytest.mark.parametrize(("app", "median", "p90"), [("bert", 0.10, 0.30), ("cifar10", 0.10, 0.30)])
def test_fitted_on_the_small_profile_it_predicts_the_other_placements(app: str, median: float, p90: float) -> None:
    """The issue's target: fitted on the placements {1, 4, 11, 1111, 44, 4444} (every local batch of them), the
    median error of the predicted step time on the application's other placements at most 10%, the 90th
    percentile at most 30% (today: bert 4.4% / 11.7%, cifar10 6.7% / 14.6%; docs/model-aware.md, Accuracy)."""
    rows = profile(app)
    small = select(rows, SMALL)
    others = [r for r in rows if tuple(sorted(r.placement)) not in SMALL]
    assert len(small) + len(others) == len(rows) and {tuple(sorted(r.placement)) for r in small} == SMALL
    r = fit.fit(small, REFERENCE)
    errs = fit.relative_errors(r.params, others)
    assert fit.quantile(errs, 0.5) <= median and fit.quantile(errs, 0.9) <= p90, (app, r.params)
    assert r.median_error <= median  # and it explains the rows it was fitted on


def measured_steps(app: str) -> dict[tuple[tuple[int, ...], float], float]:
    """The profile's mean step time of each (placement as a multiset, local batch)."""
    steps: dict[tuple[tuple[int, ...], float], list[float]] = {}
    for r in profile(app):
        steps.setdefault((tuple(sorted(r.placement)), r.local_bsz), []).append(r.step_time)
    return {key: statistics.fmean(v) for key, v in steps.items()}


def ratio(step: dict[tuple[tuple[int, ...], float], float], placement: tuple[int, ...], bsz: float) -> float:
    """The measured throughput of `placement` over the best measured placement of as many GPUs, at `bsz`."""
    k = sum(placement)
    best = max(k * bsz / t for (p, b), t in step.items() if b == bsz and sum(p) == k)
    return k * bsz / step[(placement, bsz)] / best


@pytest.mark.parametrize("app", ["bert", "cifar10"])
def test_the_plan_picked_for_k_gpus_is_near_the_best_measured(app: str) -> None:
    """Issue 20's plan quality, as benchmarks/model_bench.py measures it: for each K = 1..16 and local batch of the
    profile, the plan `plan.search` picks on four free 4-GPU hosts with the model fitted on the small profile,
    its measured throughput over the best measured placement of that K and batch (a planned placement the profile
    never measured is left out). The mean at least 0.95 on both applications, and never below 0.80 on bert.
    cifar10's least (0.72 today: K=7 at batch 45, where 1114 beats every placement of three hosts by a quarter,
    the opposite of what contention predicts) misses 0.80 (docs/model-aware.md, Accuracy)."""
    rows = profile(app)
    step = measured_steps(app)
    params = fit.fit(select(rows, SMALL), REFERENCE).params
    hosts = [FreeHost(f"h{i}", 4, REFERENCE.gpu_model, REFERENCE.nic_gbps, REFERENCE.gpu_link) for i in range(4)]
    ratios = []
    for bsz in sorted({r.local_bsz for r in rows}):
        for k in range(1, 17):
            plan = search(params, hosts, PlanRequest(gpus=k, local_bsz=bsz, top=1))[0]
            placement = tuple(sorted(plan.gpus_per_host))
            if (placement, bsz) in step:
                ratios.append(ratio(step, placement, bsz))
    assert len(ratios) >= 80
    assert statistics.fmean(ratios) >= 0.95
    if app == "bert":
        assert min(ratios) >= 0.80


def test_no_choice_that_ignores_the_batch_reaches_080_on_cifar10() -> None:
    """Without contention (kappa = 0), on hosts alike the compute term is the same for every placement of K GPUs
    and the sync term does not depend on the batch, so the cost model ranks the placements of K the same at every
    batch. With the measurements themselves as the oracle, the best such choice for K = 9 on four 4-GPU hosts
    still falls below 0.80 at some batch (333, the best at most batches, is measured at batch 64 19% slower than
    at batch 45): only a model whose ranking moves with the batch can reach 0.80 there."""
    step = measured_steps("cifar10")
    nine = {p for p, _ in step if sum(p) == 9 and len(p) <= 4}
    least = {p: min(ratio(step, p, b) for q, b in step if q == p) for p in nine}
    assert len(nine) >= 6 and max(least.values()) < 0.80
    assert least[(3, 3, 3)] < 0.80 and ratio(step, (3, 3, 3), 45) == 1.0


# --- model refit: only measurements made on hardware like the reference ------------------------------------------

def _measured(job: str, placement: tuple[int, ...], step: float, *hardware: Reference,
              gpu_model: str = "") -> Measurement:
    return Measurement(job, placement, 8, step, 0.0, gpu_model, hardware)


T4 = Reference("t4", 50, "pcie")  # the reference of these tests (tests.unit.modelaware_data.REFERENCE)
A100 = Reference("a100", 100, "nvlink")


def test_which_measurements_refit_uses_and_why_it_leaves_the_others_out() -> None:
    """A measurement is fitted only when the hardware the cost model reads for its placement is the reference's:
    every host's GPU model; the NICs when the gang spans hosts; the link when a host has two of its GPUs or more.
    One made on other hardware would be fitted as if it ran on the reference, silently corrupting the parameters:
    it is left out, naming what differs. One recorded before measurements carried their hardware (an older
    document) is assumed to be on the reference, as before; one that gives only its GPU model is judged by it."""
    cases = [
        (_measured("like", (2, 2), 1.0, T4), ""),
        (_measured("a100", (2,), 0.2, A100), "gpu_model a100, not t4; gpu_link nvlink, not pcie"),
        (_measured("a100-alone", (1,), 0.2, A100), "gpu_model a100, not t4"),
        # one GPU on one host: neither its NIC nor its link is read
        (_measured("slow-nic-one-gpu", (1,), 0.5, Reference("t4", 25, "pcie")), ""),
        (_measured("slow-nic-one-host", (4,), 0.5, Reference("t4", 25, "pcie")), ""),
        (_measured("slow-nic", (1, 1), 0.5, Reference("t4", 25, "pcie")), "nic_gbps 25, not 50"),
        # one GPU per host: the ring's steps within a host are none, its link is not read
        (_measured("nvlink-one-per-host", (1, 1), 0.5, Reference("t4", 50, "nvlink")), ""),
        (_measured("nvlink", (2, 1), 0.5, Reference("t4", 50, "nvlink")), "gpu_link nvlink, not pcie"),
        (_measured("mixed", (2, 2), 0.5, T4, Reference("a100", 50, "pcie")), "gpu_model a100, not t4"),
        (_measured("older", (2, 2), 1.0), ""),
        (_measured("older-v100", (2, 2), 1.0, gpu_model="v100"), "gpu_model v100, not t4"),
        (_measured("older-t4", (2, 2), 1.0, gpu_model="T4"), ""),
    ]
    for m, why in cases:
        assert fit.unlike_reference(m, T4) == why, m.job_id
    # a parameter-server gang's NICs carry its servers' traffic even on one host
    assert fit.unlike_reference(_measured("ps", (1,), 0.5, Reference("t4", 25, "pcie")), T4, PS) == \
        "nic_gbps 25, not 50"
    used, left_out = fit.split_measured([m for m, _ in cases], T4)
    assert [m.job_id for m in used] == [m.job_id for m, why in cases if not why]
    assert [(m.job_id, why) for m, why in left_out] == [(m.job_id, why) for m, why in cases if why]


def test_refit_fits_the_profile_and_only_the_measurements_like_the_reference() -> None:
    """The A100 gang's 0.2 s for two GPUs is not a T4's: fitted as one it would move every parameter. refit leaves
    it out: its parameters are those of the profile and the T4 measurement alone."""
    true = CostParams(0.05, 0.004, 0.03, 0.08, 0.2, 0.06, 1.8, REFERENCE, alpha_h=0.01, kappa=0.1)
    rows = [r for r in synthetic(true, RING) if r.placement in {(1,), (4,), (1, 1), (2, 2), (4, 4)}]
    base = fit.fit(rows, REFERENCE).params
    on_t4 = _measured("t4", (2,), 0.3, T4)
    on_a100 = _measured("a100", (2,), 0.02, A100)
    got = fit.refit(rows, [on_t4, on_a100], REFERENCE, base)
    assert got == fit.fit([*rows, ProfileRow((2,), 8, 0.3)], REFERENCE, base)
    corrupted = fit.fit([*rows, ProfileRow((2,), 8, 0.3), ProfileRow((2,), 8, 0.02)], REFERENCE, base)
    assert got.rows == len(rows) + 1 and corrupted.params != got.params
