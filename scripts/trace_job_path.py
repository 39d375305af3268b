"""The path of a job spec from `CreateJob` to RUNNING, traced through the modules it visits (issue 21's measure).

    .venv/bin/python scripts/trace_job_path.py [--runs 7] [--size 8] [--json]

Starts the daemon in this process on the sim backend (SQLite), lets it settle, then for each run: turns on a
profile hook in every thread, creates a gang of `--size` members over gRPC, polls `GetJob` every 20 ms until the
job is RUNNING, turns the hook off. For each thread it keeps the sequence of `peloton` modules entered (a call into
the same module as the one before is not a new entry; generated protobuf modules are left out), and counts:

- modules: distinct modules visited by all threads;
- entries: module entries (length of the sequences);
- returns: entries into a module the thread had already left (A -> B -> A counts one);
- the same three at the level of packages (peloton.X: a component, or a loose top-level module);

the median over the runs is printed. The periodic loops of the daemon and the polling run in the same window, so the
figures are of the whole daemon during one job's way to RUNNING: compare runs of this script, not absolute values.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

_on = False
_skip: set[int] = set()
_seqs: dict[int, list[str]] = defaultdict(list)


def _hook(frame: FrameType, event: str, arg: Any) -> None:
    if not _on or event != "call":
        return
    mod = frame.f_globals.get("__name__") or ""
    if not mod.startswith("peloton") or mod.endswith(("_pb2", "_pb2_grpc")):
        return
    tid = threading.get_ident()
    if tid in _skip:
        return
    seq = _seqs[tid]
    if not seq or seq[-1] != mod:
        seq.append(mod)


def _collapse(seq: list[str]) -> list[str]:
    return [m for i, m in enumerate(seq) if i == 0 or seq[i - 1] != m]


def measure(address: str, runs: int, size: int) -> dict[str, Any]:
    global _on
    import grpc

    from benchmarks.harness import gang_spec
    from peloton.api.v1 import job_pb2, job_pb2_grpc

    _skip.add(threading.get_ident())
    stub = job_pb2_grpc.JobServiceStub(grpc.insecure_channel(address))
    spec = gang_spec(size, "sim", gpu=1, cpu=1.0, mem="1Gi", env={"PELOTON_SIM_DURATION": "1h"}, name="trace")
    stub.CreateJob(job_pb2.CreateJobRequest(spec=spec), timeout=60)  # warm every path once
    time.sleep(2.0)
    results: list[dict[str, Any]] = []
    for _ in range(runs):
        _seqs.clear()
        _on = True
        job_id = stub.CreateJob(job_pb2.CreateJobRequest(spec=spec), timeout=60).job_id
        while True:
            r = stub.GetJob(job_pb2.GetJobRequest(job_id=job_id), timeout=60)
            if r.job.status.state == "RUNNING":
                break
            time.sleep(0.02)
        _on = False
        seqs = [list(s) for s in _seqs.values()]
        pkgs = [_collapse([".".join(m.split(".")[:2]) for m in s]) for s in seqs]
        results.append({
            "modules": len({m for s in seqs for m in s}),
            "entries": sum(len(s) for s in seqs),
            "returns": sum(len(s) - len(set(s)) for s in seqs),
            "packages": len({m for s in pkgs for m in s}),
            "package_entries": sum(len(s) for s in pkgs),
            "package_returns": sum(len(s) - len(set(s)) for s in pkgs),
            "visited": sorted({m for s in seqs for m in s}),
        })
        time.sleep(0.5)
    med = {k: statistics.median(r[k] for r in results)
           for k in ("modules", "entries", "returns", "packages", "package_entries", "package_returns")}
    return {"runs": runs, "size": size, "median": med, "per_run": [{k: r[k] for k in med} for r in results],
            "visited_first_run": results[0]["visited"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--size", type=int, default=8)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()

    import peloton.server as server
    from peloton.cli import main as cli

    out: dict[str, Any] = {}

    def run_server(cfg: Any) -> None:  # instead of serving forever: serve, measure, stop
        d = server.Daemon(cfg)
        address = d.start()
        try:
            out.update(measure(address, a.runs, a.size))
        finally:
            d.stop()

    server.run_server = run_server
    threading.setprofile(_hook)
    sys.setprofile(_hook)
    data = tempfile.mkdtemp(prefix="peloton-trace-")
    cli.main(["server", "--listen", "127.0.0.1:0", "--db", f"sqlite:///{data}/peloton.db", "--data-dir", data,
              "--insecure", "--log-level", "warning", "--ui-listen", "", "--backend", "sim", "--sim-hosts", "16",
              "--sim-host-resources", "cpu=64,mem=256Gi,gpu=8"])
    sys.setprofile(None)
    threading.setprofile(None)
    if a.json:
        print(json.dumps(out, indent=2))
    else:
        m = out["median"]
        print(f"CreateJob -> RUNNING, gang of {a.size}, median of {a.runs} runs: {m['modules']:.0f} modules, "
              f"{m['entries']:.0f} module entries, {m['returns']:.0f} returns to a module already left; "
              f"{m['packages']:.0f} packages (peloton.X), {m['package_entries']:.0f} entries, "
              f"{m['package_returns']:.0f} returns")
        print("modules visited (first run):", ", ".join(x.replace("peloton.", "") for x in out["visited_first_run"]))


if __name__ == "__main__":
    main()
