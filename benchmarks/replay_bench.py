"""Scheduling quality on a public trace (issue 22): Pollux's workload-6 (160 jobs over 8 hours) replayed on a 16 x 4
cluster by the production scheduler in virtual time, once per policy. Prints the wall time of each replay and what
its users felt (JCT, queueing, makespan, GPU allocation), and writes JSON; asserts nothing (the determinism and
no-partial-gang checks are tests: tests/unit/test_replay_*.py).

    .venv/bin/python benchmarks/replay_bench.py [--workload 6] [--cluster 16x4] [--policy P ...] [--preemption on]

The same replay as `peloton sim replay workload-6.csv --format pollux --cluster 16x4 --profiles
../shared/data/public/adaptdl/traces`, in this process (docs/scheduling-quality.md, "Results").
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import table, write_results  # noqa: E402
from peloton.replay import policies, run  # noqa: E402
from tests.public_data import public_data  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PUBLIC = public_data() or ROOT.parent / "shared" / "data" / "public"
SHOWN = ("jct_mean_s", "jct_p50_s", "jct_p99_s", "queue_mean_s", "makespan_s", "gpu_alloc_frac",
         "gpu_alloc_of_bound", "partial_gang_gpu_s", "preemptions", "runs_over_max_runtime")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", type=int, default=6, choices=range(1, 9), help="Pollux workload N (default 6)")
    ap.add_argument("--cluster", default="16x4", help="hosts x GPUs per host (default 16x4, Pollux's testbed)")
    ap.add_argument("--policy", action="append", default=[], help="fifo, default, model-aware, auto (default all)")
    ap.add_argument("--preemption", choices=["on", "off", "both"], default="on", help="between the two pools (on)")
    ap.add_argument("--seed", type=int, default=0, help="the replay's seed (0)")
    ap.add_argument("--json", default=None, help="output (default benchmarks/results/replay.json)")
    a = ap.parse_args()
    trace = PUBLIC / "adaptdl" / "workloads" / f"workload-{a.workload}.csv"
    if not trace.is_file():
        print(f"{trace}: missing (the public traces are read from ../shared/data/public)", file=sys.stderr)
        return 1
    t0 = time.perf_counter()
    s = run.setup(str(trace), "pollux", cluster=a.cluster, profiles=str(PUBLIC / "adaptdl" / "traces"), seed=a.seed)
    setup_s = time.perf_counter() - t0
    chosen = policies.parse_policies(a.policy)
    preemption = {"on": [True], "off": [False], "both": [True, False]}[a.preemption]
    print(f"{trace.name}: {len(s.jobs)} jobs over {max(j.submit_s for j in s.jobs) / 3600:.1f} h on "
          f"{s.cluster.hosts} x {s.cluster.gpus_per_host} GPUs; pools "
          f"{', '.join(f'{p.path} ({p.reservation.gpu} GPUs)' for p in s.pools)}; setup (read, fit) {setup_s:.1f} s")
    outcomes = run.replay_all(s, chosen, preemption)
    metrics = run.results(outcomes)
    out: dict[str, Any] = {"trace": trace.name, "jobs": len(s.jobs), "setup_s": setup_s, "policies": {},
                           "parameters": {"cluster": a.cluster, "seed": a.seed, "preemption": a.preemption}}
    for o in outcomes:
        m = metrics[o.label]
        out["policies"][o.label] = {"wall_s": o.result.wall_s, "instants": o.result.instants,
                                    **{k: m[k] for k in SHOWN}}
        print(f"{o.label}: replayed in {o.result.wall_s:.1f} s wall ({o.result.instants} virtual instants)")
        print(table([(k, f"{m[k]:.3f}" if isinstance(m[k], float) and not k.endswith("_s") else
                      f"{m[k]:.0f}" if isinstance(m[k], float) else str(m[k])) for k in SHOWN]))
    fifo = out["policies"].get("fifo", {}).get("jct_mean_s")
    if fifo:
        print("mean JCT against fifo: " + ", ".join(f"{label} {fifo / v['jct_mean_s']:.2f}x"
                                                     for label, v in out["policies"].items() if v["jct_mean_s"]))
    print(f"results: {write_results('replay', out, a.json)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
