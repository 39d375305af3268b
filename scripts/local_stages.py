"""Where the time of request -> every member RUNNING goes on the local backend, stage by stage: a daemon (SQLite, or
PostgreSQL with --store; the local benchmark's 8 hosts x 8 GPUs, members running `sleep`) with scripts/stage_trace
loaded, one request outstanding; each request's way is cut at the calls it passes (the API, resmgr's queue, the
placement round, the launcher, the host manager, the local backend's journal and spawners, the status hand-over, the
job manager's commit) and at the client's sight of RUNNING. Prints the median and p90 of each stage per gang size;
asserts nothing.

    .venv/bin/python scripts/local_stages.py [--samples 30] [--sizes 1,8,16] [--store sqlite|postgresql]
                                             [--tree ../other-checkout]

The times are CLOCK_MONOTONIC, which the client and the daemon share. The tracing costs a few microseconds a call.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import Daemon, JobWatch, gang_spec, percentile, running  # noqa: E402
from benchmarks.local_bench import HOSTS, create  # noqa: E402
from peloton.api.v1 import job_pb2_grpc  # noqa: E402
from peloton.observability.gang_metrics import STAGES as GANG_STAGES  # noqa: E402

# (stage, the mark it ends at); a mark is `event.enter` or `event.exit` of the first such event after the request
STAGES = (
    ("api: CreateJob to its handler", "api.enter"),
    ("create committed (handler returns)", "api.exit"),
    ("-> enqueued in resmgr", "enqueue.enter"),
    ("-> admitted to the placement engine", "dequeue.exit"),
    ("-> placed and claimed", "set_placements.enter"),
    ("-> the launcher has it", "take_placements.exit"),
    ("-> launch intent committed", "send_launch.enter"),
    ("-> local backend called", "backend_launch.enter"),
    ("-> launch journalled (fsync)", "journal_durable.exit"),
    ("-> spawners asked", "spawn_many.enter"),
    ("-> spawners answered (processes running)", "spawn_many.exit"),
    ("-> RUNNING handed to the host manager", "statuses_handed.enter"),
    ("-> job manager has the statuses", "wait_events.exit"),
    ("-> RUNNING committed", "apply_statuses.exit"),
    ("-> client sees RUNNING", "client"),
)


def marks(events: list[tuple[str, float, float]], t0: float, t1: float) -> dict[str, float]:
    """The first enter and the first exit of each event name in [t0, t1] (a long poll's exit counts without its
    enter, which came before the request), and the client's sight (t1)."""
    out: dict[str, float] = {"client": t1}
    for name, enter, leave in events:
        if t0 <= enter <= t1:
            out.setdefault(f"{name}.enter", enter)
        if t0 <= leave <= t1:
            out[f"{name}.exit"] = min(leave, out.get(f"{name}.exit", leave))
    return out


def breakdown(samples: list[dict[str, float]], t0s: list[float]) -> list[tuple[str, float, float]]:
    """(stage, median ms, p90 ms) of each stage: its end minus the end of the last stage before it that the request
    has a mark for, request by request (a stage whose mark a request lacks is left out for that request)."""
    rows = []
    for i, (label, mark) in enumerate(STAGES):
        vals = []
        for m, t0 in zip(samples, t0s, strict=True):
            prev = next((m[p] for _, p in reversed(STAGES[:i]) if p in m), t0)
            if mark in m:
                vals.append(1000 * (m[mark] - prev))
        rows.append((label, percentile(vals, 50) if vals else float("nan"),
                     percentile(vals, 90) if vals else float("nan")))
    return rows


def gang_stage_totals(d: Daemon) -> dict[str, tuple[float, float]]:
    """The daemon's own gang stage histogram (observability/gang_metrics.py): stage -> (sum of seconds, count)."""
    sums = d.metric_samples("peloton_gang_stage_seconds_sum")
    counts = d.metric_samples("peloton_gang_stage_seconds_count")
    return {s: (sums.get((("stage", s),), 0.0), counts.get((("stage", s),), 0.0)) for s in GANG_STAGES}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=30, help="requests per gang size")
    ap.add_argument("--sizes", default="1,8,16")
    ap.add_argument("--sleep", type=float, default=0.05, help="seconds each member runs")
    ap.add_argument("--store", choices=("sqlite", "postgresql"), default="sqlite")
    ap.add_argument("--tree", default=None, help="run another checkout's daemon (with this tree's tracer)")
    ap.add_argument("--daemon-args", default="", help="more flags for the daemon, e.g. '--task-cgroups off'")
    a = ap.parse_args()
    trace = Path(tempfile.mkdtemp(prefix="peloton-stages-")) / "trace"
    os.environ["PYTHONPATH"] = str(Path(__file__).resolve().parent / "stage_trace")
    os.environ["PELOTON_STAGE_TRACE"] = str(trace)
    d = Daemon([*HOSTS, *a.daemon_args.split()], store=a.store)
    if a.tree:
        d.root = Path(a.tree).resolve()
    windows: dict[int, list[tuple[float, float]]] = {}
    histogram: dict[int, dict[str, float]] = {}  # size -> stage -> the daemon's mean over the size's requests, ms
    with running(d):
        ch = grpc.insecure_channel(d.address)
        stub = job_pb2_grpc.JobServiceStub(ch)
        watch = JobWatch(ch)
        for size in [int(x) for x in a.sizes.split(",")]:
            windows[size] = []
            before: dict[str, tuple[float, float]] = {}
            for i in range(a.samples + 1):  # the first: a warm-up
                if i == 1:
                    before = gang_stage_totals(d)
                t0 = time.monotonic()
                jid = create(stub, gang_spec(size, f"sleep {a.sleep}"))
                _, seen = watch.when(jid, "RUNNING", "SUCCEEDED", "FAILED").result(60)
                t1 = time.monotonic() - (time.perf_counter() - seen)  # JobWatch's perf_counter, on this clock
                watch.when(jid, "SUCCEEDED", "FAILED", "KILLED").result(60)
                if i:
                    windows[size].append((t0, t1))
            after = gang_stage_totals(d)
            histogram[size] = {s: 1000 * (after[s][0] - before[s][0]) / max(1.0, after[s][1] - before[s][1])
                               for s in GANG_STAGES}
        watch.close()
    events = []
    for line in trace.read_text().splitlines():
        name, enter, leave = line.split()
        events.append((name, float(enter), float(leave)))
    events.sort(key=lambda e: e[1])
    for size, ws in windows.items():
        total = [1000 * (t1 - t0) for t0, t1 in ws]
        print(f"\n{size} members: request -> every member RUNNING p50 {percentile(total, 50):.1f} ms, "
              f"p90 {percentile(total, 90):.1f} ms ({len(ws)} requests)")
        for label, p50, p90 in breakdown([marks(events, t0, t1) for t0, t1 in ws], [t0 for t0, _ in ws]):
            print(f"  {label:<45} {p50:7.2f}  {p90:7.2f} ms")
        fsyncs = [1000 * (leave - enter) for name, enter, leave in events
                  if name == "journal_fsync" and any(t0 <= enter <= t1 for t0, t1 in ws)]
        if fsyncs:
            print(f"  (the journal's durable write itself: p50 {percentile(fsyncs, 50):.2f} ms, "
                  f"p90 {percentile(fsyncs, 90):.2f} ms)")
        print("  the daemon's own gang stage histogram, mean ms: "
              + ", ".join(f"{s} {v:.1f}" for s, v in histogram[size].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
