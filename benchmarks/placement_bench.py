"""Placement throughput of the pure placer on a simulated cluster. Prints numbers; asserts nothing.

    make bench        # or: .venv/bin/python benchmarks/placement_bench.py --hosts 10000 --gangs 200
"""

from __future__ import annotations

import argparse
import random
import time
import tracemalloc

from peloton.domain.placement import GangRequest, HostOffer, MemberRequest
from peloton.domain.resources import Resources
from peloton.placement.placer import place


def cluster(n: int, rng: random.Random) -> list[HostOffer]:
    hosts = []
    for i in range(n):
        gpus = rng.choice([0, 0, 4, 8])
        cap = Resources(cpu=32, mem=256 * 1024, disk=1024 * 1024, gpu=gpus, ports=200)
        hosts.append(HostOffer(
            hostname=f"host-{i:05d}", address=f"10.0.{i // 256}.{i % 256}", free=cap,
            gpu_ids=tuple(range(gpus)), ports=tuple(range(31000, 31200)),
            labels={"rack": f"r{i % 40}", "gpu_model": "a100" if gpus else ""}, capacity=cap, has_gpus=gpus > 0,
        ))
    return hosts


def gangs(n: int, size: int, rng: random.Random) -> list[GangRequest]:
    out = []
    for g in range(n):
        gpu = rng.choice([0, 1, 2])
        res = Resources(cpu=4, mem=16 * 1024, gpu=gpu, ports=1)
        members = tuple(MemberRequest(i, f"job{g}-{i}-1", res) for i in range(size))
        out.append(GangRequest(f"job{g}/0", f"job{g}", 1, members, strategy=rng.choice(["pack", "spread"])))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=10_000)
    ap.add_argument("--gangs", type=int, default=200)
    ap.add_argument("--size", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    rng = random.Random(42)
    offers = cluster(a.hosts, rng)
    batch = gangs(a.gangs, a.size, rng)
    best = float("inf")
    placed = 0
    for _ in range(a.rounds):
        t0 = time.perf_counter()
        ok, failed = place(batch, offers, "bench")
        best = min(best, time.perf_counter() - t0)
        placed = len(ok)
    tracemalloc.start()
    place(batch, offers, "bench")
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    tasks = placed * a.size
    print(f"placement: {a.hosts} hosts, {a.gangs} gangs x {a.size} members, best of {a.rounds}")
    print(f"  round time         {best * 1000:.1f} ms")
    print(f"  gangs placed       {placed} / {a.gangs}")
    print(f"  tasks per second   {tasks / best:,.0f}")
    print(f"  gangs per second   {placed / best:,.0f}")
    print(f"  peak extra memory  {peak / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
