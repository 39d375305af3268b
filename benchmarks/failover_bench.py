"""Benchmark 17: how long a standby takes to take over from a leader killed with SIGKILL, on the local backend, on
SQLite and PostgreSQL (tests assert that a standby takes over, never how fast: the timings are here). Per run: a
leader (`peloton server`) runs a job of two tasks; a `--standby` shares its data dir (as on one machine: it adopts
the leader's tasks) and stands by; the leader is sent SIGKILL, and from that moment a client sends CreateJob to the
standby's address every 20 ms (one request_id: a retry cannot duplicate the job) until it is accepted. Timed from
the SIGKILL: the standby's "serving on" line, the create accepted, the new job RUNNING (its task started by the new
leader), and the adopted job seen RUNNING there. Prints a table and writes JSON; asserts nothing.

    .venv/bin/python benchmarks/failover_bench.py [--runs 3] [--stores sqlite,postgresql]

The daemons are started as tests/e2e/harness.py starts them (2 local hosts; as root, `--insecure` and tasks as
root), so the client calls over plain TCP. A run takes ~5 s on 2 cores.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("PELOTON_UI_LISTEN", "")  # no web console (two daemons would want its one default port)

import grpc  # noqa: E402

from benchmarks.harness import gang_spec, percentile, table, throwaway_store, write_results  # noqa: E402
from peloton.api.v1 import job_pb2, job_pb2_grpc  # noqa: E402
from tests.e2e.harness import Daemon, kill_sandboxed_processes  # noqa: E402

SETTLE_S = 1.0  # the standby stands by this long before the kill (in its lock-polling loop, as in production)
RETRY_S = 0.02  # the client's pause between CreateJob attempts while the standby refuses
_REDIAL = [("grpc.initial_reconnect_backoff_ms", 20), ("grpc.min_reconnect_backoff_ms", 20),
           ("grpc.max_reconnect_backoff_ms", 20)]
ADOPTED = """
name: adopted
instances: 2
task: {command: "sleep 600", resources: {cpu: 1, mem: 64Mi}}
"""


def _state(stub: job_pb2_grpc.JobServiceStub, job_id: str) -> str:
    try:
        return str(stub.GetJob(job_pb2.GetJobRequest(job_id=job_id), timeout=5).job.status.state)
    except grpc.RpcError:
        return ""


def failover(data_dir: Path, db_url: str) -> dict[str, Any]:
    leader = Daemon(data_dir, db_url)
    standby = Daemon(data_dir, db_url, port_base=leader.port_base)  # same machine, data dir and flags
    try:
        leader.start()
        adopted = leader.create(ADOPTED, data_dir)
        leader.wait_state(adopted, "RUNNING")
        standby.start(standby=True)
        time.sleep(SETTLE_S)
        served: list[float] = []
        t0 = time.monotonic()

        def serving() -> None:
            standby.wait_serving(120)
            served.append(time.monotonic() - t0)

        waiter = threading.Thread(target=serving, daemon=True)
        waiter.start()
        leader.kill9()
        out: dict[str, Any] = {"refused_creates": 0, "refusals": {}}  # what the creates were refused with, how often
        # the channel redials every 20 ms (gRPC's own backoff, 1 s and growing, would be most of what is measured
        # while the port changes hands: the standby's answering closes before the leader's serving opens)
        with grpc.insecure_channel(standby.address, options=_REDIAL) as ch:
            stub = job_pb2_grpc.JobServiceStub(ch)
            request = job_pb2.CreateJobRequest(spec=gang_spec(1, "sleep 600", gpu=0, mem="64Mi", name="after-failover"),
                                               request_id=str(uuid.uuid4()))
            deadline = t0 + 120
            while True:
                try:
                    job_id = stub.CreateJob(request, timeout=10).job_id
                    break
                except grpc.RpcError as e:
                    if e.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED) \
                            or time.monotonic() > deadline:
                        raise
                    out["refused_creates"] += 1
                    why = f"{e.code().name}: {(e.details() or '')[:100]}"
                    out["refusals"][why] = out["refusals"].get(why, 0) + 1
                    out["last_refusal_s"] = time.monotonic() - t0
                    time.sleep(RETRY_S)
            out["create_accepted_s"] = time.monotonic() - t0
            while _state(stub, job_id) != "RUNNING":
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the job created after the failover is not running: {standby.log()[-3000:]}")
                time.sleep(RETRY_S)
            out["new_job_running_s"] = time.monotonic() - t0
            while _state(stub, adopted) != "RUNNING":
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the adopted job is not running: {standby.log()[-3000:]}")
                time.sleep(RETRY_S)
            out["adopted_running_s"] = time.monotonic() - t0
        waiter.join(120)
        out["serving_s"] = served[0] if served else float("nan")
        return out
    finally:
        standby.stop()
        leader.stop()
        kill_sandboxed_processes(data_dir)
        if (data_dir / "local").is_dir():  # the task cgroups of the local backend (they outlive the daemons)
            from peloton.hostmgr.local import cgroups

            cgroups.kill_and_remove_subtree(data_dir / "local")


def stats(xs: list[float]) -> dict[str, float]:
    return {"n": len(xs), "p50_ms": percentile(xs, 50) * 1000, "max_ms": max(xs) * 1000, "min_ms": min(xs) * 1000}


MEASURES = (("serving_s", "kill_to_serving"), ("create_accepted_s", "kill_to_create_accepted"),
            ("new_job_running_s", "kill_to_new_job_running"), ("adopted_running_s", "kill_to_adopted_running"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="failovers per store")
    ap.add_argument("--stores", default="sqlite,postgresql")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    results: dict[str, Any] = {"cases": {}, "parameters": {"runs": a.runs, "settle_s": SETTLE_S,
                                                            "retry_s": RETRY_S}}
    rows: list[tuple[str, str]] = []
    for store in a.stores.split(","):
        runs = []
        for _ in range(a.runs):
            data_dir = Path(tempfile.mkdtemp(prefix="peloton-bench-failover-"))
            try:
                with throwaway_store(store, data_dir) as db:
                    runs.append(failover(data_dir, db))
            finally:
                shutil.rmtree(data_dir, ignore_errors=True)
        case: dict[str, Any] = {name: stats([r[key] for r in runs]) for key, name in MEASURES}
        case["refused_creates"] = [r["refused_creates"] for r in runs]
        case["runs"] = runs
        results["cases"][store] = case
        for _, name in MEASURES:
            s = case[name]
            rows.append((f"{store:10s} {name}", f"p50 {s['p50_ms']:6.0f} ms  min {s['min_ms']:6.0f} ms  "
                                                f"max {s['max_ms']:6.0f} ms"))
    print(f"SIGKILL of the leader -> its standby ({a.runs} runs each, local backend, data dir shared; "
          f"load {os.getloadavg()[0]:.2f})")
    print(table(rows))
    print(f"JSON: {write_results('failover', results, a.json)}")


if __name__ == "__main__":
    main()
