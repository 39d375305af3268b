"""Placement decision throughput of the pure placer on a simulated cluster. Prints a table and writes JSON; asserts
nothing (tests never time anything).

    make bench        # or: .venv/bin/python benchmarks/placement_bench.py --hosts 10000 --gangs 1000 --size 8

Benchmark 1 of the placement-at-scale issue: the decision alone, 1,000 gangs x 8 members on 10,000 hosts (each
cpu=64, mem=256Gi, gpu=8, 200 ports, 40 racks), a mix of GPU and CPU-only gangs, pack and spread. Besides the cold
round (a fresh index per round) it measures what the placement engine does in steady state: an incremental round
(upsert the hosts whose free state changed, then place the next batch) and `can_ever_fit` against a full-capacity
index (called on every CreateJob). A second scenario starts from a fragmented cluster (hosts already running a
random mix of tasks), where hosts fall into many more equivalence classes.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import platform
import pstats
import random
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from peloton.domain.placement import GangRequest, HostOffer, MemberRequest
from peloton.domain.resources import Resources
from peloton.domain.spec import Constraint
from peloton.placement.index import HostIndex
from peloton.placement.placer import can_ever_fit, place

GI = 1024.0
HOST = Resources(cpu=64, mem=256 * GI, disk=1024 * GI, gpu=8, ports=200)

# (member shape, weight): GPU training workers and CPU-only services/preprocessing.
SHAPES: list[tuple[Resources, int]] = [
    (Resources(cpu=8, mem=32 * GI, gpu=1, ports=2), 3),
    (Resources(cpu=16, mem=64 * GI, gpu=2, ports=2), 2),
    (Resources(cpu=4, mem=16 * GI, ports=1), 3),
    (Resources(cpu=2, mem=4 * GI, ports=1), 2),
]


def cluster(n: int, racks: int, rng: random.Random, fragmented: bool = False) -> list[HostOffer]:
    """`n` identical hosts, rack i % racks (neighbouring names sit in different racks, so the lowest-hostname
    tie-break alone would scatter a gang). Fragmented: each host already runs up to 6 tasks of random shapes."""
    shapes = [s for s, _ in SHAPES]
    hosts = []
    for i in range(n):
        free = HOST
        if fragmented:
            for _ in range(rng.randint(0, 6)):
                s = rng.choice(shapes)
                if s.fits_in(free):
                    free = free - s
        hosts.append(
            HostOffer(
                hostname=f"host-{i:05d}",
                address=f"10.{i // 65536}.{i // 256 % 256}.{i % 256}",
                free=free,
                # The old placer needed concrete ids; the new one reads counts only (kept so both can run the same
                # workload when comparing).
                gpu_ids=tuple(range(8 - free.gpu, 8)),
                ports=tuple(range(31200 - free.ports, 31200)),
                labels={"rack": f"r{i % racks:02d}", "gpu_model": "h100"},
                capacity=HOST,
                has_gpus=True,
            )
        )
    return hosts


def workload(n: int, size: int, rng: random.Random, prefix: str = "job") -> list[GangRequest]:
    shapes = [s for s, _ in SHAPES]
    weights = [w for _, w in SHAPES]
    out = []
    for g in range(n):
        res = rng.choices(shapes, weights)[0]
        job = f"{prefix}{g}"
        members = tuple(MemberRequest(i, f"{job}-{i}-1", res) for i in range(size))
        out.append(GangRequest(f"{job}/0", job, 1, members, strategy=rng.choice(["pack", "spread"])))
    return out


def best_of(rounds: int, setup: Callable[[], Any], run: Callable[[Any], Any]) -> tuple[float, Any]:
    best, result = float("inf"), None
    for _ in range(rounds):
        arg = setup()
        t0 = time.perf_counter()
        result = run(arg)
        best = min(best, time.perf_counter() - t0)
    return best, result


def cold_round(offers: list[HostOffer], batch: list[GangRequest], size: int, rounds: int) -> dict[str, Any]:
    """The decision alone: a fresh index (built outside the timing) takes the whole batch."""
    t0 = time.perf_counter()
    HostIndex(offers)
    build_s = time.perf_counter() - t0
    secs, (ok, failed) = best_of(rounds, lambda: HostIndex(offers), lambda idx: place(batch, idx))
    idx = HostIndex(offers)
    place(batch, idx)
    return {
        "round_ms": secs * 1000,
        "tasks_per_s": len(ok) * size / secs,
        "gangs_per_s": len(ok) / secs,
        "gangs_placed": len(ok),
        "gangs_failed": len(failed),
        "tasks_placed": len(ok) * size,
        "index_build_ms": build_s * 1000,
        "classes_before": HostIndex(offers).class_count(),
        "classes_after": idx.class_count(),
    }


def incremental_round(
    offers: list[HostOffer], gangs: int, size: int, rng: random.Random, rounds: int
) -> dict[str, Any]:
    """Steady state: the index lives across rounds. After each round the host manager reports authoritative states:
    the hosts the round placed on (confirming what placement deducted) and as many hosts whose tasks all finished
    (back to full capacity). Then the next batch is placed."""
    idx = HostIndex(offers)
    by_name = {o.hostname: o for o in offers}
    warm, _ = place(workload(gangs, size, rng, prefix="warm"), idx)
    busy = sorted({m.hostname for p in warm for m in p.members})
    upsert_s: list[float] = []
    place_s: list[float] = []
    upserts = 0
    placed = 0
    for r in range(rounds):
        batch = workload(gangs, size, rng, prefix=f"r{r}-")
        t0 = time.perf_counter()
        ok, _ = place(batch, idx)
        place_s.append(time.perf_counter() - t0)
        placed += len(ok)
        used = sorted({m.hostname for p in ok for m in p.members})
        finished = rng.sample(busy, min(len(busy), len(used)))
        reports = [idx.get(h) for h in used]
        reports += [replace(by_name[h], free=by_name[h].capacity) for h in finished]
        t0 = time.perf_counter()
        for o in reports:
            assert o is not None
            idx.upsert(o)
        upsert_s.append(time.perf_counter() - t0)
        upserts += len(reports)
        busy = sorted(set(busy).difference(finished).union(used))
    tasks = placed * size
    return {
        "gangs_per_round": gangs,
        "rounds": rounds,
        "place_ms_per_round": sum(place_s) / rounds * 1000,
        "upsert_ms_per_round": sum(upsert_s) / rounds * 1000,
        "hosts_upserted_per_round": upserts / rounds,
        "upsert_us_per_host": sum(upsert_s) / max(1, upserts) * 1e6,
        "tasks_per_s": tasks / (sum(place_s) + sum(upsert_s)),
        "gangs_placed": placed,
        "classes_at_end": idx.class_count(),
    }


def can_ever_fit_cost(offers: list[HostOffer], batch: list[GangRequest], racks: int) -> dict[str, Any]:
    capacities = HostIndex(
        [
            HostOffer(o.hostname, o.address, o.capacity, labels=o.labels, capacity=o.capacity, has_gpus=o.has_gpus)
            for o in offers
        ]
    )
    probes = batch[:200]
    t0 = time.perf_counter()
    for g in probes:
        can_ever_fit(g, capacities)
    plain = (time.perf_counter() - t0) / len(probes)
    constrained = [
        GangRequest(
            g.gang_id,
            g.job_id,
            g.attempt,
            g.members,
            strategy=g.strategy,
            constraints=(Constraint("rack", "eq", f"r{i % racks:02d}"),),
        )
        for i, g in enumerate(probes)
    ]
    t0 = time.perf_counter()
    for g in constrained:
        can_ever_fit(g, capacities)
    with_constraint = (time.perf_counter() - t0) / len(constrained)
    too_big = GangRequest("big/0", "big", 1, tuple(MemberRequest(i, f"big-{i}-1", Resources(cpu=65)) for i in range(8)))
    t0 = time.perf_counter()
    for _ in range(20):
        can_ever_fit(too_big, capacities)
    refused = (time.perf_counter() - t0) / 20
    return {
        "us_per_call": plain * 1e6,
        "us_per_call_rack_constraint": with_constraint * 1e6,
        "us_per_call_refused": refused * 1e6,
        "probes": len(probes),
    }


def profile(offers: list[HostOffer], batch: list[GangRequest], top: int) -> None:
    idx = HostIndex(offers)
    prof = cProfile.Profile()
    prof.enable()
    place(batch, idx)
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(top)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", type=int, default=10_000)
    ap.add_argument("--racks", type=int, default=40)
    ap.add_argument("--gangs", type=int, default=1_000)
    ap.add_argument("--size", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3, help="best of this many cold rounds")
    ap.add_argument("--incremental-gangs", type=int, default=200, help="gangs per incremental round")
    ap.add_argument("--incremental-rounds", type=int, default=10)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--json", default="benchmarks/results/placement.json", help="where to write the figures")
    ap.add_argument(
        "--profile",
        choices=["empty", "fragmented"],
        help="print a cProfile of one cold round on that cluster instead of the benchmark",
    )
    a = ap.parse_args()

    rng = random.Random(a.seed)
    offers = cluster(a.hosts, a.racks, rng)
    batch = workload(a.gangs, a.size, rng)
    fragmented = cluster(a.hosts, a.racks, random.Random(a.seed + 1), fragmented=True)
    if a.profile:
        profile(offers if a.profile == "empty" else fragmented, batch, 30)
        return

    cold = cold_round(offers, batch, a.size, a.rounds)
    cold_frag = cold_round(fragmented, batch, a.size, a.rounds)
    incr = incremental_round(offers, a.incremental_gangs, a.size, random.Random(a.seed + 2), a.incremental_rounds)
    fit = can_ever_fit_cost(offers, batch, a.racks)

    print(f"placement decision: {a.hosts} hosts ({a.racks} racks), {a.gangs} gangs x {a.size} members")
    print(f"{'':38}{'tasks/s':>12}{'ms/round':>11}{'gangs placed':>15}{'classes':>10}")
    for name, r in (("cold round, empty cluster", cold), ("cold round, fragmented cluster", cold_frag)):
        placed = f"{r['gangs_placed']}/{a.gangs}"
        classes = f"{r['classes_before']}->{r['classes_after']}"
        print(f"  {name:36}{r['tasks_per_s']:>12,.0f}{r['round_ms']:>11.1f}{placed:>15}{classes:>10}")
    placed = f"{incr['gangs_placed']}/{a.incremental_gangs * a.incremental_rounds}"
    print(
        f"  {'incremental round (' + str(a.incremental_gangs) + ' gangs)':36}{incr['tasks_per_s']:>12,.0f}"
        f"{incr['place_ms_per_round'] + incr['upsert_ms_per_round']:>11.1f}{placed:>15}{incr['classes_at_end']:>10}"
    )
    print(
        f"    of which upsert {incr['upsert_ms_per_round']:.2f} ms for {incr['hosts_upserted_per_round']:.0f} hosts "
        f"({incr['upsert_us_per_host']:.1f} us/host), place {incr['place_ms_per_round']:.1f} ms"
    )
    print(f"  index build                         {cold['index_build_ms']:.1f} ms for {a.hosts} hosts")
    print(
        f"  can_ever_fit per call               {fit['us_per_call']:.1f} us"
        f" (rack constraint {fit['us_per_call_rack_constraint']:.1f} us, refused {fit['us_per_call_refused']:.1f} us)"
    )

    out = Path(a.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "benchmark": "placement decision (issue benchmark 1)",
        "parameters": {
            "hosts": a.hosts,
            "racks": a.racks,
            "gangs": a.gangs,
            "members_per_gang": a.size,
            "host": {"cpu": HOST.cpu, "mem_mib": HOST.mem, "disk_mib": HOST.disk, "gpu": HOST.gpu, "ports": HOST.ports},
            "shapes": [{"resources": s.describe(), "weight": w} for s, w in SHAPES],
            "strategies": ["pack", "spread"],
            "rounds": a.rounds,
            "incremental_gangs": a.incremental_gangs,
            "incremental_rounds": a.incremental_rounds,
            "seed": a.seed,
        },
        "cold_round": cold,
        "cold_round_fragmented": cold_frag,
        "incremental_round": incr,
        "can_ever_fit": fit,
        "python": sys.version.split()[0],
        "machine": platform.machine(),
    }
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
