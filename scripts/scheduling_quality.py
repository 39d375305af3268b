"""Replays every Pollux workload and the Tiresias trace under every policy (two pools with preemption on and off, and
one pool) with `peloton sim replay`, and prints the Results tables of docs/scheduling-quality.md as Markdown.

    .venv/bin/python scripts/scheduling_quality.py [--data ../shared/data/public] [--jobs 2] [--out DIR [--reuse]]
        [--queue-order arrival|gpu-time] [--queue-promote-after 4h] [--against DIR]

Each replay's JSON is kept in --out (default: a temporary directory). `--queue-order` replays every policy under
that daemon setting; `--against DIR` (another run's --out, e.g. under arrival) adds a table of mean JCT and share of
the offline bound there and here, per trace and policy. Asserts nothing."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
POLICIES = ("fifo", "default", "model-aware", "auto")


def traces(data: Path) -> list[tuple[str, list[str]]]:
    pollux = [(f"workload-{i}", [str(data / f"adaptdl/workloads/workload-{i}.csv"), "--format", "pollux",
                                 "--cluster", "16x4", "--profiles", str(data / "adaptdl/traces")])
              for i in range(1, 9)]
    return pollux + [("Tiresias 60 jobs", [str(data / "tiresias/60_job.csv"), "--format", "tiresias",
                                           "--cluster-file", str(data / "tiresias/cluster_spec.csv")])]


def replay(args: list[str], out: Path, reuse: bool = False, order: Sequence[str] = ()) -> dict[str, Any]:
    if reuse and out.exists():
        return json.loads(out.read_text())["policies"]
    cmd = [str(ROOT / ".venv/bin/peloton"), "sim", "replay", *args, *order, "-o", "json"]
    r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}: exit {r.returncode}\n{r.stderr}")
    out.write_text(r.stdout)
    return json.loads(r.stdout)["policies"]


def n(v: float) -> str:
    return f"{v:,.0f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=str(ROOT.parent / "shared/data/public"))
    ap.add_argument("--jobs", type=int, default=2, help="replays at once")
    ap.add_argument("--out", default=None)
    ap.add_argument("--reuse", action="store_true", help="read the replays' JSON already in --out instead of running them")
    ap.add_argument("--queue-order", default="arrival", help="the daemon's --queue-order for every replay")
    ap.add_argument("--queue-promote-after", default="4h", help="the daemon's --queue-promote-after")
    ap.add_argument("--against", default=None, metavar="DIR",
                    help="another run's --out: compare mean JCT and the share of the bound with it")
    a = ap.parse_args()
    out = Path(a.out or tempfile.mkdtemp(prefix="peloton-sq-"))
    out.mkdir(parents=True, exist_ok=True)
    pools = out / "one-pool.json"
    pools.write_text(json.dumps([{"path": "/all"}]))
    ts = traces(Path(a.data))
    order = ["--queue-order", a.queue_order, "--queue-promote-after", a.queue_promote_after]
    with ThreadPoolExecutor(a.jobs) as ex:
        two = {name: ex.submit(replay, [*args, "--preemption", "both"], out / f"{name}-two.json", a.reuse, order)
               for name, args in ts}
        one = {name: ex.submit(replay, [*args, "--pools", str(pools)], out / f"{name}-one.json", a.reuse, order)
               for name, args in ts}
        two_r = {k: f.result() for k, f in two.items()}
        one_r = {k: f.result() for k, f in one.items()}
    print("| trace | policy | mean JCT (s) | p99 JCT (s) | mean queueing (s) | makespan (s) | GPU alloc | of bound | "
          "preemptions | partial GPU-s | fifo / mean JCT | mean JCT, preemption off (s) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    problems = []
    for name, by in two_r.items():
        base = by["fifo/preempt"]["jct_mean_s"]
        for i, p in enumerate(POLICIES):
            r, off = by[f"{p}/preempt"], by[f"{p}/no-preempt"]
            for key, doc in ((f"{p}/preempt", r), (f"{p}/no-preempt", off)):
                if doc["unfinished"] or doc["partial_gang_gpu_s"] or doc["runs_over_max_runtime"]:
                    problems.append(f"{name} {key}: unfinished {doc['unfinished']}, partial "
                                    f"{doc['partial_gang_gpu_s']}, over max_runtime {doc['runs_over_max_runtime']}")
            print(f"| {name if i == 0 else ''} | {p} | {n(r['jct_mean_s'])} | {n(r['jct_p99_s'])} | "
                  f"{n(r['queue_mean_s'])} | {n(r['makespan_s'])} | {r['gpu_alloc_frac']:.3f} | "
                  f"{r['gpu_alloc_of_bound']:.3f} | {r['preemptions']} | {n(r['partial_gang_gpu_s'])} | "
                  f"{base / r['jct_mean_s']:.2f}x | {n(off['jct_mean_s'])} |")
    print()
    print("| trace | fifo | default | model-aware | auto | fifo / model-aware | fifo / auto | GPU alloc (fifo, "
          "default, model-aware, auto) | of bound |")
    print("|---|---:|---:|---:|---:|---:|---:|---|---|")
    for name, by in one_r.items():
        rs = [by[p] for p in POLICIES]  # (one --preemption setting: keyed by the policy alone)
        for p in POLICIES:
            doc = by[p]
            if doc["unfinished"] or doc["partial_gang_gpu_s"] or doc["runs_over_max_runtime"]:
                problems.append(f"{name} one pool {p}: unfinished {doc['unfinished']}")
        print(f"| {name} | " + " | ".join(n(r["jct_mean_s"]) for r in rs)
              + f" | {rs[0]['jct_mean_s'] / rs[2]['jct_mean_s']:.2f}x | {rs[0]['jct_mean_s'] / rs[3]['jct_mean_s']:.2f}x"
              + " | " + ", ".join(f"{r['gpu_alloc_frac']:.2f}" for r in rs)
              + " | " + ", ".join(f"{r['gpu_alloc_of_bound']:.2f}" for r in rs) + " |")
    if a.against is not None:
        against(Path(a.against), two_r, one_r)
    print()
    print("problems:", problems or "none", file=sys.stderr)
    print(f"JSON in {out}", file=sys.stderr)


def against(base: Path, two_r: dict[str, Any], one_r: dict[str, Any]) -> None:
    """Mean JCT and share of the offline bound per trace and policy: in `base` (another run's --out) -> here."""
    print()
    print("| trace | policy | mean JCT (s), two pools, preemption on | of bound | preemption off: mean JCT | of bound | "
          "one pool: mean JCT | of bound |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for name, by in two_r.items():
        was_two = json.loads((base / f"{name}-two.json").read_text())["policies"]
        was_one = json.loads((base / f"{name}-one.json").read_text())["policies"]
        for i, p in enumerate(POLICIES):
            cells = []
            for was, now in ((was_two[f"{p}/preempt"], by[f"{p}/preempt"]),
                             (was_two[f"{p}/no-preempt"], by[f"{p}/no-preempt"]), (was_one[p], one_r[name][p])):
                cells += [f"{n(was['jct_mean_s'])} -> {n(now['jct_mean_s'])}",
                          f"{was['gpu_alloc_of_bound']:.3f} -> {now['gpu_alloc_of_bound']:.3f}"]
            print(f"| {name if i == 0 else ''} | {p} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
