"""Benchmark 3: the local backend, driven over gRPC as a user's program would (8 simulated hosts x 8 GPUs, gangs of
1-GPU members running `sleep`). Prints a table and writes JSON; asserts nothing.

    .venv/bin/python benchmarks/local_bench.py [--store sqlite|postgresql] [--seconds 20] [--daemon-args "--warm-wrappers 0"]

Measures: gangs/s with N closed-loop submitters (each submits an 8-member gang and waits until every member
runs, then the next), request -> every member RUNNING by gang size with one request outstanding, the time until
200 gangs submitted at once are all accepted, the time from StopJob to every member ended and its resources free,
store statements per gang, daemon CPU per gang, and daemon memory.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import Daemon, JobWatch, gang_spec, run_clients, running, summary, table, write_results  # noqa: E402
from peloton.api.v1 import job_pb2, job_pb2_grpc  # noqa: E402

HOSTS = ["--local-hosts", "8", "--local-host-resources", "cpu=64,mem=256Gi,gpu=8"]


def create(stub: job_pb2_grpc.JobServiceStub, spec: job_pb2.JobSpec) -> str:
    return str(stub.CreateJob(job_pb2.CreateJobRequest(spec=spec), timeout=60).job_id)


def latency_by_size(stub: job_pb2_grpc.JobServiceStub, watch: JobWatch, sizes: list[int], n: int,
                    sleep_s: float) -> dict[str, dict[str, float]]:
    out = {}
    for size in sizes:
        samples = []
        for _ in range(n):
            t0 = time.perf_counter()
            jid = create(stub, gang_spec(size, f"sleep {sleep_s}"))
            _, t1 = watch.when(jid, "RUNNING", "SUCCEEDED", "FAILED").result(60)
            samples.append(t1 - t0)
            watch.when(jid, "SUCCEEDED", "FAILED", "KILLED").result(60)
        out[str(size)] = summary(samples)
    return out


def throughput(stub: job_pb2_grpc.JobServiceStub, watch: JobWatch, submitters: int, seconds: float,
               sleep_s: float, daemon: Daemon) -> dict[str, float]:
    stop = time.monotonic() + seconds
    done = [0] * submitters
    lat: list[float] = []
    lock = threading.Lock()
    stmts0 = daemon.metric("peloton_store_statements_total", kind="statement")
    commits0 = daemon.metric("peloton_store_statements_total", kind="commit")
    cpu0 = daemon.cpu_seconds()

    def loop(i: int) -> None:
        while time.monotonic() < stop:
            t0 = time.perf_counter()
            jid = create(stub, gang_spec(8, f"sleep {sleep_s}"))
            _, t1 = watch.when(jid, "RUNNING", "SUCCEEDED", "FAILED").result(120)
            done[i] += 1
            with lock:
                lat.append(t1 - t0)

    elapsed = run_clients(loop, submitters)
    gangs = sum(done)
    time.sleep(2 * sleep_s + 1)  # let the last gangs finish: their statements count too
    stmts = daemon.metric("peloton_store_statements_total", kind="statement") - stmts0
    commits = daemon.metric("peloton_store_statements_total", kind="commit") - commits0
    cpu = daemon.cpu_seconds() - cpu0
    return {"submitters": submitters, "seconds": elapsed, "gangs": gangs, "gangs_per_s": gangs / elapsed,
            "members_per_s": 8 * gangs / elapsed, "latency_p50_ms": summary(lat)["p50_ms"],
            "latency_p99_ms": summary(lat)["p99_ms"], "store_statements_per_gang": stmts / max(gangs, 1),
            "store_commits_per_gang": commits / max(gangs, 1),
            "daemon_cpu_ms_per_gang": 1000 * cpu / max(gangs, 1)}


def burst(stub: job_pb2_grpc.JobServiceStub, watch: JobWatch, n: int, sleep_s: float) -> dict[str, float]:
    spec = gang_spec(8, f"sleep {sleep_s}")
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=n) as pool:
        ids = list(pool.map(lambda _: create(stub, spec), range(n)))
    accepted = time.perf_counter() - t0
    ends = [watch.when(j, "SUCCEEDED", "FAILED", "KILLED") for j in ids]
    last = max(f.result(600)[1] for f in ends)
    return {"gangs": n, "all_accepted_s": accepted, "all_finished_s": last - t0}


def stop_to_free(stub: job_pb2_grpc.JobServiceStub, watch: JobWatch, n: int) -> dict[str, float]:
    samples = []
    for _ in range(n):
        jid = create(stub, gang_spec(8, "sleep 600"))
        watch.when(jid, "RUNNING").result(60)
        t0 = time.perf_counter()
        stub.StopJob(job_pb2.StopJobRequest(job_id=jid), timeout=30)
        _, t1 = watch.when(jid, "KILLED").result(60)
        samples.append(t1 - t0)
    return summary(samples)


def _profiled(d: Daemon, out: str | None, fn):  # type: ignore[no-untyped-def]
    with d.profiled(out):
        return fn()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", choices=["sqlite", "postgresql"], default="sqlite")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--submitters", type=int, default=4)
    ap.add_argument("--sleep", type=float, default=0.05, help="seconds each member runs")
    ap.add_argument("--samples", type=int, default=30, help="latency samples per gang size")
    ap.add_argument("--json", default=None)
    ap.add_argument("--profile", default=None, help="py-spy the daemon during the throughput run into this file")
    ap.add_argument("--daemon-args", default="", help="more flags for the daemon, e.g. '--warm-wrappers 0'")
    a = ap.parse_args()
    d = Daemon([*HOSTS, *a.daemon_args.split()], store=a.store)
    with running(d):
        ch = grpc.insecure_channel(d.address)
        stub = job_pb2_grpc.JobServiceStub(ch)
        watch = JobWatch(ch)
        latency_by_size(stub, watch, [8], 5, a.sleep)  # warm-up
        res = {
            "store": a.store, "workload": "8 local hosts x 8 GPUs; gangs of 1-GPU members running "
                                          f"sleep {a.sleep}",
            "latency_by_size": latency_by_size(stub, watch, [1, 8, 16], a.samples, a.sleep),
            "throughput": _profiled(d, a.profile, lambda: throughput(stub, watch, a.submitters, a.seconds, a.sleep,
                                                                      d)),
            "burst_200": burst(stub, watch, 200, a.sleep),
            "stop_to_free": stop_to_free(stub, watch, 10),
            "daemon_rss_mib": d.rss_mib(),
        }
        watch.close()
    t = res["throughput"]
    rows = [(f"latency size {s} p50 / p99", f"{v['p50_ms']:.1f} / {v['p99_ms']:.1f} ms")
            for s, v in res["latency_by_size"].items()]
    rows += [
        (f"gangs/s ({t['submitters']} submitters)", f"{t['gangs_per_s']:.1f}  ({t['members_per_s']:.0f} members/s)"),
        ("  latency under load p50 / p99", f"{t['latency_p50_ms']:.1f} / {t['latency_p99_ms']:.1f} ms"),
        ("  store statements / commits per gang",
         f"{t['store_statements_per_gang']:.1f} / {t['store_commits_per_gang']:.1f}"),
        ("  daemon CPU per gang", f"{t['daemon_cpu_ms_per_gang']:.1f} ms"),
        ("200 gangs at once: all accepted", f"{res['burst_200']['all_accepted_s']:.2f} s"),
        ("200 gangs at once: all finished", f"{res['burst_200']['all_finished_s']:.2f} s"),
        ("stop -> resources free p50 / p99", f"{res['stop_to_free']['p50_ms']:.1f} / "
                                             f"{res['stop_to_free']['p99_ms']:.1f} ms"),
        ("daemon RSS", f"{res['daemon_rss_mib']:.0f} MiB"),
    ]
    print(f"local backend, {a.store}: {res['workload']}")
    print(table(rows))
    print(f"  json: {write_results(f'local-{a.store}', res, a.json)}")


if __name__ == "__main__":
    main()
