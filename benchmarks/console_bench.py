"""Benchmark 10: the web console's pages on a big cluster (issue 23): a sim daemon of `--hosts` hosts (cpu=64,
mem=256Gi, gpu=8, 40 racks) holding `--jobs` jobs in every state, and the time of each JSON answer the pages ask
for (and of the page itself and its script), `--samples` times each, one at a time, over HTTP from this process.
Prints a table and writes JSON; asserts nothing.

    .venv/bin/python benchmarks/console_bench.py [--hosts 10000] [--jobs 100000] [--samples 40]
        [--store sqlite|postgresql] [--clients 4]

The jobs: one member each (cpu 0.1, no GPU), created by `--clients` gRPC clients at once; most run 1 s of sim time
and succeed, one in ten runs an hour (RUNNING), and one in 500 asks for every GPU of a twentieth of the hosts for
an hour (the first twenty run, the rest wait: PENDING, with a reason); `--big-every`
sets how many jobs there are to one big one.
Measured once they are all created: the jobs list (first page, a state filter, a name filter, 20 pages deep), one
job, its events, a member's timeline and log, a big job's events and its gang's timeline (every member side by
side), the cluster summary, the hosts map (its first page, a rack, hosts with 8 GPUs free, the 10th page; a console
before paged ListHosts has no page token: that row is left out), the queue, the pools, the page and app.js. A page of
the browser makes one to three of these calls (the job page: the job and its events at once)."""

from __future__ import annotations

import argparse
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import Daemon, percentile, running, table, write_results  # noqa: E402
from peloton.api.v1 import job_pb2, job_pb2_grpc  # noqa: E402


def spec(i: int, hosts: int, big_every: int = 500) -> job_pb2.JobSpec:
    s = job_pb2.JobSpec(name=f"bench-{i}", instances=1)
    s.task.command = "train.py"
    s.task.resources.cpu = 0.1
    s.task.resources.mem = "64Mi"
    if i % big_every == big_every - 1:  # every GPU of a twentieth of the hosts, for an hour: the first twenty run, the rest wait
        s.instances = max(1, hosts // 20)
        s.task.resources.gpu = 8
        s.task.env["PELOTON_SIM_DURATION"] = "3600s"
    else:
        s.task.env["PELOTON_SIM_DURATION"] = "3600s" if i % 10 == 0 else "1s"
    return s


def create(address: str, n: int, clients: int, hosts: int, big_every: int = 500) -> float:
    """`n` jobs from `clients` threads; returns the seconds it took."""
    done = [0]
    lock = threading.Lock()

    def client(k: int) -> None:
        ch = grpc.insecure_channel(address)
        stub = job_pb2_grpc.JobServiceStub(ch)
        for i in range(k, n, clients):
            stub.CreateJob(job_pb2.CreateJobRequest(spec=spec(i, hosts, big_every), request_id=f"b{i}"), timeout=120)
            with lock:
                done[0] += 1
        ch.close()

    t0 = time.monotonic()
    threads = [threading.Thread(target=client, args=(k,), name=f"bench-client-{k}") for k in range(clients)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        time.sleep(5)
        print(f"  created {done[0]} of {n} jobs", flush=True)
    return time.monotonic() - t0


def timed(url: str) -> tuple[float, bytes]:
    t0 = time.perf_counter()
    with urllib.request.urlopen(url, timeout=60) as r:
        body = r.read()
    return time.perf_counter() - t0, body


def measure(name: str, url: str, samples: int) -> dict[str, Any]:
    times, size = [], 0
    for _ in range(samples):
        t, body = timed(url)
        times.append(t * 1000)
        size = len(body)
    return {"name": name, "p50_ms": percentile(times, 50), "p95_ms": percentile(times, 95), "max_ms": max(times),
            "bytes": size}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", type=int, default=10_000)
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--samples", type=int, default=40)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--big-every", type=int, default=500,
                    help="one job in this many is big (a twentieth of the hosts): the first twenty run, the rest wait")
    ap.add_argument("--store", choices=["sqlite", "postgresql"], default="sqlite")
    ap.add_argument("--out")
    a = ap.parse_args()
    d = Daemon(["--backend", "sim", "--sim-hosts", str(a.hosts), "--sim-host-resources", "cpu=64,mem=256Gi,gpu=8",
                "--sim-racks", "40", "--ui-listen", "127.0.0.1:0", "--max-waiting-jobs", "0"], store=a.store)
    with running(d):
        print(f"daemon at {d.address}, console at {d.console}; creating {a.jobs} jobs on {a.hosts} hosts", flush=True)
        took = create(d.address, a.jobs, a.clients, a.hosts, a.big_every)
        time.sleep(5)  # the last placements and 1 s runs settle
        u = d.console
        import json

        first = json.loads(timed(u + "api/jobs")[1])
        job = first["jobs"][-1]["id"]
        big = next(j["id"] for j in json.loads(timed(u + f"api/jobs?q=bench-{a.big_every - 1}&state=RUNNING")[1])["jobs"]
                   if j["name"] == f"bench-{a.big_every - 1}")  # the first big one, running
        # the 20th page's token, to time a page deep in the list
        token = ""
        for _ in range(19):
            token = json.loads(timed(u + f"api/jobs?page_token={token}")[1])["next_page_token"]
        # the hosts map's 10th page (a page token is the API's own, where paging goes by rack then name)
        htoken = ""
        for _ in range(9):
            htoken = json.loads(timed(u + f"api/hosts?page_token={htoken}")[1]).get("next_page_token", "")
        deep = [("hosts map, 10th page", f"api/hosts?page_token={htoken}")] if htoken else []
        rows = [measure(n, u + p, a.samples) for n, p in (
            ("page /jobs (HTML)", "jobs"),
            ("app.js", "assets/app.js"),
            ("jobs: first page", "api/jobs"),
            ("jobs: RUNNING", "api/jobs?state=RUNNING"),
            ("jobs: PENDING (+ queue)", "api/jobs?state=PENDING"),
            ("jobs: name contains", "api/jobs?q=bench-4242"),
            ("jobs: 20th page", f"api/jobs?page_token={token}"),
            ("one job", f"api/jobs/{job}"),
            ("a member's timeline", f"api/jobs/{job}/members/0"),
            ("a job's events", f"api/jobs/{job}/events"),
            ("a member's log", f"api/jobs/{job}/members/0/logs"),
            (f"a big job's events ({max(1, a.hosts // 20)} members)", f"api/jobs/{big}/events"),
            ("its gang's timeline (every member)", f"api/jobs/{big}/gangs/0/timeline"),
            ("cluster summary", "api/cluster"),
            ("hosts map, first page", "api/hosts"),
            ("hosts map, a rack", "api/hosts?rack=r7"),
            ("hosts map, 8 GPUs free", "api/hosts?free_gpus=8"),
            *deep,
            ("queue", "api/queue"),
            ("pools", "api/pools"),
        )]
        rss = d.rss_mib()
    print(table([(f"{r['name']}", f"p50 {r['p50_ms']:.0f} ms, p95 {r['p95_ms']:.0f} ms, max {r['max_ms']:.0f} ms, "
                                  f"{r['bytes']:,} bytes") for r in rows] +
                [("jobs created", f"{a.jobs} in {took:.0f} s"), ("daemon RSS after", f"{rss:.0f} MiB")]))
    out = write_results("console_bench", {"hosts": a.hosts, "jobs": a.jobs, "samples": a.samples, "store": a.store,
                                          "create_s": took, "rss_mib": rss, "rows": rows}, a.out)
    print(f"results: {out}")


if __name__ == "__main__":
    main()
