"""Request -> every member RUNNING on the local backend, this tree against another checkout, on one machine at the
same moments: two daemons (SQLite, the local benchmark's 8 hosts x 8 GPUs, members running `sleep`) side by side,
one request outstanding, the requests alternating between them (A, B, B, A, ...), so a loaded machine's noise falls
on both alike. Prints p50/p99 per gang size and daemon; asserts nothing.

    .venv/bin/python scripts/local_launch_ab.py --before ../wt-main [--samples 30] [--sizes 1,8,16]
    .venv/bin/python scripts/local_launch_ab.py --before . --before-args '--default-task-user root'  # one tree,
                                                                          # members as root against as nobody

The other checkout runs with this tree's interpreter and packages (its code from its own directory).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import Daemon, JobWatch, gang_spec, summary  # noqa: E402
from benchmarks.local_bench import HOSTS, create  # noqa: E402
from peloton.api.v1 import job_pb2_grpc  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, help="the other checkout (a worktree of the tree before)")
    ap.add_argument("--samples", type=int, default=30, help="requests per gang size and daemon")
    ap.add_argument("--sizes", default="1,8,16")
    ap.add_argument("--sleep", type=float, default=0.05, help="seconds each member runs")
    ap.add_argument("--before-args", default="", help="more flags for the before daemon")
    ap.add_argument("--after-args", default="", help="more flags for the after daemon")
    a = ap.parse_args()
    sizes = [int(x) for x in a.sizes.split(",")]
    daemons = {"before": Daemon([*HOSTS, *a.before_args.split()], root=Path(a.before).resolve()),
               "after": Daemon([*HOSTS, *a.after_args.split()])}
    samples: dict[str, dict[int, list[float]]] = {k: {s: [] for s in sizes} for k in daemons}
    with contextlib.ExitStack() as stack:
        ends = {}
        for name, d in daemons.items():
            d.start()
            stack.callback(d.stop)
            ch = grpc.insecure_channel(d.address)
            watch = JobWatch(ch)
            stack.callback(watch.close)
            ends[name] = (job_pb2_grpc.JobServiceStub(ch), watch)
        order = list(daemons)
        for size in sizes:
            for i in range(a.samples + 1):  # the first of each: a warm-up, not counted
                for name in (order if i % 2 else order[::-1]):
                    stub, watch = ends[name]
                    t0 = time.perf_counter()
                    jid = create(stub, gang_spec(size, f"sleep {a.sleep}"))
                    _, t1 = watch.when(jid, "RUNNING", "SUCCEEDED", "FAILED").result(60)
                    watch.when(jid, "SUCCEEDED", "FAILED", "KILLED").result(60)
                    if i:
                        samples[name][size].append(t1 - t0)
    out = {name: {str(s): summary(v) for s, v in by.items()} for name, by in samples.items()}
    print(f"request -> every member RUNNING, {a.samples} requests a size and daemon, alternating (ms)")
    for size in sizes:
        print(f"  {size:3} members: before p50 {out['before'][str(size)]['p50_ms']:7.1f}  p99 "
              f"{out['before'][str(size)]['p99_ms']:7.1f}   after p50 {out['after'][str(size)]['p50_ms']:7.1f}  "
              f"p99 {out['after'][str(size)]['p99_ms']:7.1f}")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
