"""Model-aware plans against the public measurements (issue 20's targets). Prints a table and writes JSON; asserts
nothing (tests never time anything; tests/unit/test_modelaware_fit.py checks the accuracy targets).

    .venv/bin/python benchmarks/model_bench.py [--repeat 7] [--hosts 1000]

For bert and cifar10 (the Pollux artifact's profiles in ../shared/data/public; its other applications are held
out and nothing here reads them), on their measurement cluster's hardware (T4, PCIe, 50 Gb/s):
(a) accuracy: the cost model fitted on the placements {1, 4, 11, 1111, 44, 4444} (every local batch of them);
    the error of the predicted step time on every other row: median, 90th percentile, max (targets: median at
    most 10%, p90 at most 30%);
(b) plan quality: for each K in 1..16 and each local batch of the profile, the plan `plan.search` picks for K GPUs
    on four free 4-GPU hosts, looked up in the measurements (its placement as a multiset of GPUs per host; the
    mean of the rows measuring it), its measured throughput K * bsz / step_time against the best measured
    placement of the same K and batch: the mean and the least ratio (targets: mean at least 0.95, never below
    0.80). A (K, batch) with no measurement of the planned placement is counted as skipped. Beside it, what the
    measurements allow, with them as the oracle: the least ratio a choice that ignores the batch can reach (the
    least over K of the best placement's worst batch; the model without contention, kappa = 0, is such a choice on
    hosts alike), the least a choice that switches placement once as the batch grows can reach (kappa lets the
    model's choice move with the batch), and the spread of step times between orderings of one multiset at one
    batch (e.g. 1134, 4311);
(c) plan time: 64 GPUs among `--hosts` heterogeneous hosts (GPU models t4/v100/a100/a10/l4, NICs 10-100 Gb/s,
    PCIe or NVLink, 0-8 free GPUs), for exactly 64 (`--gpus`) and for the best size up to 64 (`--max-gpus`),
    ring and hierarchical: the median of `--repeat` runs (target: under 50 ms);
(d) auto sizing: what `instances: auto` does at job creation (jobmgr/planning.py, Planner.auto_count) for counts
    2,000..3,000 (`--auto-sizes`) among `--auto-hosts` (1,100) hosts like (c)'s: the best plan's samples/s of every
    count, by `plan.size_rates` (least CPU time of `--repeat` runs) and, as before it, by one `plan.search` per
    count (one run; `--auto-slow 0` skips it), and whether the two agree to the bit;
(e) parameter-server auto sizing: counts 1..`--ps-sizes` (128) among `--ps-hosts` (100) hosts like (c)'s, with
    two servers and with the servers' count chosen, by `plan.size_rates` (least CPU time of up to 3 runs) and, with
    two servers, by one full search per count as before it (`--auto-slow 0` skips it).
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import table, write_results  # noqa: E402
from peloton.modelaware import fit  # noqa: E402
from peloton.modelaware.cost import HIERARCHICAL, PS, RING, CostParams, Reference  # noqa: E402
from peloton.modelaware.plan import FreeHost, PlanRequest, search, size_rates  # noqa: E402
from peloton.modelaware.profile import ProfileRow, format_placement, read_profile, select  # noqa: E402
from tests.public_data import public_data  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TRACES = (public_data() or ROOT.parent / "shared" / "data" / "public") / "adaptdl" / "traces"
APPS = ("bert", "cifar10")
REFERENCE = Reference("t4", 50, "pcie")  # 16 x g4dn.12xlarge: 4 T4 (PCIe) each, 50 Gb/s (SOURCES.md)
FITTED_ON = ((1,), (4,), (1, 1), (1, 1, 1, 1), (4, 4), (4, 4, 4, 4))  # the small profile
SMALL = set(FITTED_ON)


def accuracy(rows: list[ProfileRow]) -> tuple[CostParams, dict[str, Any]]:
    t0 = time.perf_counter()
    result = fit.fit(select(rows, SMALL), REFERENCE)
    seconds = time.perf_counter() - t0
    others = [r for r in rows if tuple(sorted(r.placement)) not in SMALL]
    errs = fit.relative_errors(result.params, others)
    return result.params, {
        "fitted_rows": result.rows, "other_rows": len(others), "fit_s": round(seconds, 3),
        "median_error": fit.quantile(errs, 0.5), "p90_error": fit.quantile(errs, 0.9), "max_error": max(errs),
        "params": result.params.as_dict()}


def plan_quality(params: CostParams, rows: list[ProfileRow]) -> dict[str, Any]:
    measured: dict[tuple[tuple[int, ...], float], list[float]] = {}
    for r in rows:
        measured.setdefault((tuple(sorted(r.placement)), r.local_bsz), []).append(r.step_time)
    step = {key: statistics.fmean(v) for key, v in measured.items()}
    hosts = [FreeHost(f"h{i}", 4, REFERENCE.gpu_model, REFERENCE.nic_gbps, REFERENCE.gpu_link) for i in range(4)]
    cases: list[dict[str, Any]] = []
    skipped = []
    for bsz in sorted({r.local_bsz for r in rows}):
        for k in range(1, 17):
            plan = search(params, hosts, PlanRequest(gpus=k, local_bsz=bsz, top=1))[0]
            key = (tuple(sorted(plan.gpus_per_host)), bsz)
            if key not in step:
                skipped.append({"gpus": k, "local_bsz": bsz, "planned": format_placement(key[0])})
                continue
            got = k * bsz / step[key]
            best_t, best_p = max((k * bsz / t, p) for (p, b), t in step.items() if b == bsz and sum(p) == k)
            cases.append({"gpus": k, "local_bsz": bsz, "planned": format_placement(key[0]),
                          "best": format_placement(best_p), "ratio": got / best_t})
    ratios = [c["ratio"] for c in cases]
    worst = sorted(cases, key=lambda c: c["ratio"])[:10]
    return {"cases": len(cases), "skipped": skipped, "mean_ratio": statistics.fmean(ratios),
            "min_ratio": min(ratios), "below_0.95": sum(1 for r in ratios if r < 0.95),
            "below_0.80": sum(1 for r in ratios if r < 0.80), "worst": worst, **noise(rows, step)}


def noise(rows: list[ProfileRow], step: dict[tuple[tuple[int, ...], float], float]) -> dict[str, Any]:
    """The ceiling of the least ratio for a choice that ignores the batch (the best placement of each K, judged by
    its worst batch, the measurements as the oracle; K's placements that fit four 4-GPU hosts), and the spread
    max / min - 1 of the step times of different orderings of one multiset at one batch."""
    per_k: list[dict[str, Any]] = []
    for k in range(1, 17):
        best: tuple[float, tuple[int, ...]] = (-1.0, ())
        for p in sorted({p for p, _ in step if sum(p) == k and len(p) <= 4 and max(p) <= 4}):
            worst = min(k * b / t / max(k * b / u for (q, c), u in step.items() if c == b and sum(q) == k)
                        for (q, b), t in step.items() if q == p)
            best = max(best, (worst, p))
        per_k.append({"gpus": k, "placement": format_placement(best[1]), "least": best[0]})
    orders: dict[tuple[tuple[int, ...], float], list[float]] = {}
    for r in rows:
        orders.setdefault((tuple(sorted(r.placement)), r.local_bsz), []).append(r.step_time)
    spread = [max(v) / min(v) - 1 for v in orders.values() if len(v) > 1]
    low = min(per_k, key=lambda c: c["least"])
    switch = switch_ceiling(step)
    low_switch = min(switch, key=lambda c: c["least"])
    return {"ceiling": low["least"], "ceiling_at": low, "ceiling_per_k": per_k, "switch_ceiling": low_switch["least"],
            "switch_ceiling_at": low_switch, "switch_ceiling_per_k": switch, "orderings": len(spread),
            "orderings_median": fit.quantile(spread, 0.5), "orderings_p90": fit.quantile(spread, 0.9)}


def switch_ceiling(step: dict[tuple[tuple[int, ...], float], float]) -> list[dict[str, Any]]:
    """Per K: the best least ratio of a choice that takes one placement below a batch and another from it on (each
    measured at every batch K is; the measurements as the oracle)."""
    out: list[dict[str, Any]] = []
    for k in range(1, 17):
        places = sorted({p for p, _ in step if sum(p) == k and len(p) <= 4 and max(p) <= 4})
        batches = sorted({b for p, b in step if p in places})
        best_of = {b: max(k * b / step[(p, b)] for p in places if (p, b) in step) for b in batches}
        ratios = {p: [k * b / step[(p, b)] / best_of[b] for b in batches] for p in places
                  if all((p, b) in step for b in batches)}
        best: tuple[float, str, str, float] = (-1.0, "", "", 0.0)
        for a, ra in ratios.items():
            for c, rc in ratios.items():
                for i in range(len(batches) + 1):
                    least = min(ra[:i] + rc[i:])
                    if least > best[0]:
                        best = (least, format_placement(a), format_placement(c),
                                batches[i] if i < len(batches) else math.inf)
        out.append({"gpus": k, "least": best[0], "below": best[1], "from": best[2], "switch_at": best[3]})
    return out


def cluster(n: int, seed: int) -> list[FreeHost]:
    rng = random.Random(seed)
    return [FreeHost(f"n{i:05d}", rng.choice([0, 1, 2, 4, 8]), rng.choice(["t4", "v100", "a100", "a10", "l4"]),
                     rng.choice([10, 25, 50, 100]), rng.choice(["pcie", "nvlink"])) for i in range(n)]


def plan_time(params: CostParams, hosts: list[FreeHost], repeat: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pattern in (RING, HIERARCHICAL):
        for label, req in (("gpus=64", PlanRequest(gpus=64, local_bsz=8, pattern=pattern)),
                           ("max_gpus=64", PlanRequest(max_gpus=64, local_bsz=8, pattern=pattern))):
            times = []
            plans = []
            for _ in range(repeat):
                t0 = time.perf_counter()
                plans = search(params, hosts, req)
                times.append(time.perf_counter() - t0)
            out[f"{pattern} {label}"] = {"median_ms": statistics.median(times) * 1000, "min_ms": min(times) * 1000,
                                         "gpus": plans[0].gpus, "hosts_used": len(plans[0].hosts)}
    return out


def _rates_timed(params: CostParams, hosts: list[FreeHost], sizes: range, req: PlanRequest, repeat: int,
                 ) -> tuple[list[float], list[float]]:
    """`size_rates`' answer and the CPU seconds of each of `repeat` runs."""
    times = []
    rates: list[float] = []
    for _ in range(repeat):
        t0 = time.process_time()
        rates = size_rates(params, hosts, sizes, req)
        times.append(time.process_time() - t0)
    return rates, times


def auto_time(params: CostParams, hosts: list[FreeHost], lo: int, hi: int, repeat: int, slow: bool,
              ) -> dict[str, Any]:
    """Every count's best samples/s, lo..hi (at most the free GPUs), at once and by one search per count: CPU s."""
    top = min(hi, sum(h.free_gpus for h in hosts))
    sizes = range(min(lo, top), top + 1)
    out: dict[str, Any] = {}
    for pattern in (RING, HIERARCHICAL):
        req = PlanRequest(local_bsz=8, pattern=pattern, top=1)
        rates, times = _rates_timed(params, hosts, sizes, req, repeat)
        row: dict[str, Any] = {"sizes": len(sizes), "size_rates_cpu_ms": min(times) * 1000,
                               "size_rates_median_cpu_ms": statistics.median(times) * 1000,
                               "best_gpus": sizes[max(range(len(rates)), key=lambda i: rates[i])]}
        if slow:
            t0 = time.process_time()
            each = [f[0].samples_per_s if (f := search(params, hosts, PlanRequest(gpus=k, local_bsz=8,
                                                                                    pattern=pattern, top=1)))
                    else 0.0 for k in sizes]
            row["per_size_search_cpu_ms"] = (time.process_time() - t0) * 1000
            row["same"] = each == rates
        out[pattern] = row
    return out


def ps_auto_time(params: CostParams, hosts: list[FreeHost], hi: int, repeat: int, slow: bool) -> dict[str, Any]:
    """(e) A parameter-server goal's counts 1..hi rated at once (`size_rates`: least CPU time of `repeat` runs), two
    servers (as a job's roles give the daemon) and the servers' count chosen (`peloton model plan`); with `slow`,
    two servers also by one full search per count (what size_rates ran before) and whether the two agree."""
    sizes = range(1, min(hi, sum(h.free_gpus for h in hosts)) + 1)
    out: dict[str, Any] = {}
    for label, servers in (("2 servers", 2), ("servers chosen", 0)):
        req = PlanRequest(local_bsz=8, pattern=PS, servers=servers, top=1)
        rates, times = _rates_timed(params, hosts, sizes, req, repeat)
        row: dict[str, Any] = {"sizes": len(sizes), "size_rates_cpu_ms": min(times) * 1000}
        if slow and servers:
            t0 = time.process_time()
            each = [f[0].samples_per_s if (f := search(params, hosts, replace(req, gpus=k))) else 0.0 for k in sizes]
            row["per_size_search_cpu_ms"] = (time.process_time() - t0) * 1000
            row["same"] = each == rates
        out[label] = row
    return out


def placement_time(params: CostParams, n_hosts: int, repeat: int, seed: int) -> dict[str, Any]:
    """The placer on an index of `n_hosts` (three kinds of 8-GPU hosts): one gang of 64 one-GPU workers, pack
    against model-aware (which reads every host's free slots for the search)."""
    from peloton.domain.placement import GangRequest, HostOffer, MemberRequest
    from peloton.domain.resources import Resources
    from peloton.modelaware.plan import PlanGoal
    from peloton.placement.index import HostIndex
    from peloton.placement.placer import place

    rng = random.Random(seed)
    kinds = [("t4", "50", "pcie"), ("v100", "100", "nvlink"), ("a100", "200", "nvlink")]
    cap = Resources(cpu=64, mem=262144, gpu=8)
    offers = []
    for i in range(n_hosts):
        model, nic, link = rng.choice(kinds)
        offers.append(HostOffer(hostname=f"h{i:05d}", address="10.0.0.1", free=cap, capacity=cap, has_gpus=True,
                                labels={"gpu_model": model, "nic_gbps": nic, "gpu_link": link, "rack": f"r{i % 40}"}))
    index = HostIndex(offers)
    worker = Resources(cpu=4, mem=8192, gpu=1)
    out: dict[str, Any] = {}
    for label, goal in (("pack", None), ("model-aware", PlanGoal(params, local_bsz=8))):
        times = []
        for r in range(repeat):
            g = GangRequest(gang_id=f"{label}{r}/0", job_id=f"{label}{r}", attempt=1, goal=goal,
                            members=tuple(MemberRequest(j, f"{label}{r}-{j}-1", worker) for j in range(64)))
            t0 = time.perf_counter()
            placed, _ = place([g], index)
            times.append(time.perf_counter() - t0)
            assert placed, "the cluster is big enough for every gang of the run"
        out[label] = {"median_ms": statistics.median(times) * 1000, "min_ms": min(times) * 1000}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", type=int, default=1000, help="hosts of the plan-time cluster (default 1000)")
    ap.add_argument("--repeat", type=int, default=7, help="runs of each plan-time case, the median taken (7)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the plan-time cluster (0)")
    ap.add_argument("--placement-hosts", type=int, default=10000,
                    help="hosts of the index one gang is placed on (default 10000)")
    ap.add_argument("--auto-hosts", type=int, default=1100, help="hosts of the auto-sizing cluster (default 1100)")
    ap.add_argument("--auto-sizes", default="2000-3000", help="counts auto sizing rates (default 2000-3000)")
    ap.add_argument("--auto-slow", type=int, default=1, help="also one search per count, as before (1; 0: not)")
    ap.add_argument("--ps-hosts", type=int, default=100, help="hosts of the parameter-server sizing (default 100)")
    ap.add_argument("--ps-sizes", type=int, default=128, help="counts 1..N it rates (default 128)")
    ap.add_argument("--json", default=None, help="output (default benchmarks/results/model.json)")
    a = ap.parse_args()
    results: dict[str, Any] = {"apps": {}, "parameters": {"hosts": a.hosts, "repeat": a.repeat, "seed": a.seed,
                                                           "fitted_on": [format_placement(p) for p in FITTED_ON]}}
    hosts = cluster(a.hosts, a.seed)
    auto_hosts = cluster(a.auto_hosts, a.seed)
    ps_hosts = cluster(a.ps_hosts, a.seed)
    auto_lo, auto_hi = (int(x) for x in a.auto_sizes.split("-"))
    for app in APPS:
        path = TRACES / app / "placements.csv"
        if not path.is_file():
            print(f"{path}: missing (the public profiles are read from ../shared/data/public)", file=sys.stderr)
            return 1
        rows = read_profile(path.read_text(), source=str(path))
        params, acc = accuracy(rows)
        quality = plan_quality(params, rows)
        timing = plan_time(params, hosts, a.repeat)
        placing = placement_time(params, a.placement_hosts, a.repeat, a.seed)
        auto = auto_time(params, auto_hosts, auto_lo, auto_hi, a.repeat, bool(a.auto_slow))
        ps_auto = ps_auto_time(params, ps_hosts, a.ps_sizes, min(a.repeat, 3), bool(a.auto_slow))
        results["apps"][app] = {"accuracy": acc, "plan_quality": quality, "plan_time": timing,
                                "placement_time": placing, "auto_time": auto, "ps_auto_time": ps_auto}
        print(f"{app}: fitted on {acc['fitted_rows']} rows (placements {', '.join(results['parameters']['fitted_on'])})"
              f", {acc['fit_s']:.2f} s")
        lines = [
            (f"error on the other {acc['other_rows']} rows",
             f"median {acc['median_error']:.1%}  p90 {acc['p90_error']:.1%}  max {acc['max_error']:.1%}"
             "   (targets: median <= 10%, p90 <= 30%)"),
            (f"plan / best measured, {quality['cases']} (K, bsz)",
             f"mean {quality['mean_ratio']:.3f}  min {quality['min_ratio']:.3f}  below 0.95: "
             f"{quality['below_0.95']}  below 0.80: {quality['below_0.80']}   (targets: mean >= 0.95, min >= 0.80)"),
        ]
        lines.append(("least a batch-blind choice could reach",
                      f"{quality['ceiling']:.3f} (K={quality['ceiling_at']['gpus']}: "
                      f"{quality['ceiling_at']['placement']}, the measurements as the oracle)"))
        sw = quality["switch_ceiling_at"]
        lines.append(("least a choice switching once with the batch could reach",
                      f"{quality['switch_ceiling']:.3f} (K={sw['gpus']}: {sw['below']} below batch "
                      f"{sw['switch_at']:g}, {sw['from']} from it on)"))
        lines.append((f"orderings of one multiset, {quality['orderings']} (placement, bsz)",
                      f"step time max/min - 1: median {quality['orderings_median']:.1%}  "
                      f"p90 {quality['orderings_p90']:.1%}"))
        if quality["skipped"]:
            lines.append(("skipped (planned placement not measured)",
                          ", ".join(f"K={s['gpus']} bsz={s['local_bsz']:g} {s['planned']}"
                                    for s in quality["skipped"])))
        lines.append(("worst plans", "; ".join(f"K={c['gpus']} bsz={c['local_bsz']:g}: {c['planned']} vs "
                                               f"{c['best']} ({c['ratio']:.2f})" for c in quality["worst"][:3])))
        for case, t in timing.items():
            lines.append((f"plan time, {case}, {a.hosts} hosts",
                          f"{t['median_ms']:.1f} ms (min {t['min_ms']:.1f})  -> {t['gpus']} GPUs on "
                          f"{t['hosts_used']} hosts"))
        for label, t in placing.items():
            lines.append((f"placing a gang of 64, {label}, {a.placement_hosts} hosts",
                          f"{t['median_ms']:.1f} ms (min {t['min_ms']:.1f})"))
        for pattern, t in auto.items():
            slow = (f"; one search per count {t['per_size_search_cpu_ms']:.0f} ms, same: {t['same']}"
                    if "per_size_search_cpu_ms" in t else "")
            lines.append((f"auto sizing, {pattern}, {t['sizes']} counts, {a.auto_hosts} hosts",
                          f"{t['size_rates_cpu_ms']:.0f} ms CPU (median {t['size_rates_median_cpu_ms']:.0f})"
                          f"{slow}  -> fastest {t['best_gpus']} GPUs"))
        for label, t in ps_auto.items():
            slow = (f"; one search per count {t['per_size_search_cpu_ms']:.0f} ms, same: {t['same']}"
                    if "per_size_search_cpu_ms" in t else "")
            lines.append((f"auto sizing, ps, {label}, {t['sizes']} counts, {a.ps_hosts} hosts",
                          f"{t['size_rates_cpu_ms']:.0f} ms CPU{slow}"))
        print(table(lines))
    print(f"  json: {write_results('model', results, a.json)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
