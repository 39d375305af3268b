"""The daemon's CPU per gang on the local backend, one gang at a time: a daemon (the local benchmark's 8 hosts x 8
GPUs, SQLite) runs `--gangs` gangs of 8 members running `sleep 0.02`, each submitted once the one before has ended,
after 10 to warm up; prints the daemon's CPU a gang (the kernel's count for its process, spawners excluded) and the
p50 of request -> every member RUNNING. Less swayed by the machine's other work than the closed loop of
local_bench.py, whose bursts outlast a run; for A/B runs in turns with another checkout (`--tree`). Asserts nothing.

    .venv/bin/python scripts/local_gang_cpu.py [--gangs 150] [--tree ../other-checkout]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import Daemon, JobWatch, gang_spec, proc_cpu_seconds, running  # noqa: E402
from benchmarks.local_bench import HOSTS, create  # noqa: E402
from benchmarks.sim_bench import ENDED  # noqa: E402
from peloton.api.v1 import job_pb2_grpc  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gangs", type=int, default=150)
    ap.add_argument("--tree", default=None, help="run another checkout's daemon")
    a = ap.parse_args()
    d = Daemon(HOSTS, store="sqlite")
    if a.tree:
        d.root = Path(a.tree).resolve()
    spec = gang_spec(8, "sleep 0.02", gpu=1, cpu=1.0, mem="64Mi", name="gang-cpu")
    with running(d):
        assert d.proc is not None
        ch = grpc.insecure_channel(d.address)
        stub, watch = job_pb2_grpc.JobServiceStub(ch), JobWatch(ch)
        for _ in range(10):
            watch.when(create(stub, spec), *ENDED).result(60)
        cpu0, latency = proc_cpu_seconds(d.proc.pid), []
        for _ in range(a.gangs):
            t0 = time.perf_counter()
            job = create(stub, spec)
            _, t1 = watch.when(job, "RUNNING", *ENDED).result(60)
            latency.append(t1 - t0)
            watch.when(job, *ENDED).result(60)
        cpu = proc_cpu_seconds(d.proc.pid) - cpu0
        watch.close()
        ch.close()
    print(f"{d.root.name}: daemon CPU a gang {1000 * cpu / a.gangs:.2f} ms, request -> every member RUNNING p50 "
          f"{1000 * statistics.median(latency):.1f} ms ({a.gangs} gangs of 8)")


if __name__ == "__main__":
    main()
