"""Benchmark 5: what a CLI call costs a user, each a new `peloton` process against a running daemon, and what the
interpreter and its imports cost on their own for comparison. Prints a table and writes JSON; asserts nothing.

    .venv/bin/python benchmarks/cli_bench.py [--runs 30]

Byte-code caching is left on for the children (PYTHONDONTWRITEBYTECODE is removed from their environment, after
one warm-up run), as on a user's machine; otherwise every run would compile the CLI's modules again.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import Daemon, percentile, running, table, write_results  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def timed(cmd: list[str], runs: int, env: dict[str, str]) -> dict[str, float]:
    subprocess.run(cmd, env=env, capture_output=True, check=True)  # warm-up: byte-code written
    xs = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(cmd, env=env, capture_output=True, check=True)
        xs.append(time.perf_counter() - t0)
    return {"n": runs, "min_ms": min(xs) * 1000, "p50_ms": percentile(xs, 50) * 1000,
            "p90_ms": percentile(xs, 90) * 1000}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=30, help="runs of each command")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    peloton = str(Path(sys.executable).parent / "peloton")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    d = Daemon(["--local-hosts", "1", "--local-host-resources", "cpu=8,mem=16Gi"])
    with running(d):
        env["PELOTON_ADDRESS"] = d.address
        job = subprocess.run([peloton, "job", "create", "-f", str(ROOT / "examples/hello-gang.yaml")], env=env,
                             capture_output=True, text=True, check=True).stdout.strip()
        subprocess.run([peloton, "job", "wait", job, "--timeout", "60"], env=env, capture_output=True, check=True)
        commands = {
            "peloton job get JOB": [peloton, "job", "get", job],
            "peloton job list": [peloton, "job", "list"],
            "peloton task list JOB": [peloton, "task", "list", job],
            "peloton host list": [peloton, "host", "list"],
        }
        baseline = {
            "python -c pass": [sys.executable, "-c", "pass"],
            "python -c 'import grpc' (what the CLI no longer loads)": [sys.executable, "-c", "import grpc"],
            "python -c 'import peloton.api.v1.job_pb2'": [sys.executable, "-c", "import peloton.api.v1.job_pb2"],
        }
        res = {"commands": {k: timed(v, a.runs, env) for k, v in commands.items()},
               "baseline": {k: timed(v, a.runs, env) for k, v in baseline.items()}}
    rows = [(k, f"p50 {v['p50_ms']:.0f} ms  p90 {v['p90_ms']:.0f} ms  min {v['min_ms']:.0f} ms")
            for part in ("commands", "baseline") for k, v in res[part].items()]
    print(f"CLI, a new process per call ({a.runs} runs each; target: job get under 100 ms)")
    print(table(rows))
    print(f"  json: {write_results('cli', res, a.json)}")


if __name__ == "__main__":
    main()
