"""Benchmark 4: daemon memory per 100,000 active tasks, on the sim backend (20,000 in-memory hosts, cpu=64 mem=256Gi
gpu=8, 40 racks) with PostgreSQL (or SQLite). Prints a table and writes JSON; asserts nothing.

    .venv/bin/python benchmarks/memory_bench.py [--store postgresql|sqlite] [--tasks 100000] [--size 8]
        [--scenario both|gangs|elastic] [--hosts 20000] [--submitters 8] [--profile FILE]

The default (20,000 tasks) is short and gives the RSS delta per 100,000 tasks by proportion; `--tasks 100000`
measures the real thing.

Two scenarios, each on a fresh daemon (and database):
- gangs: `--tasks / --size` jobs, each one gang of `--size` 1-GPU members that run until killed (no
  PELOTON_SIM_DURATION), submitted by `--submitters` clients as fast as the daemon accepts them. Measured: RSS idle
  (after a warm-up gang has come and gone), the time until every job is accepted and until every member runs,
  RSS then and `--settle` seconds later, and the RSS delta per 100,000 active tasks;
- elastic: one job of `--tasks` instances with `gang.min_available: 1` (a gang of one, then gangs of one): the time
  CreateJob takes, the time until every instance runs, and the same RSS figures.

Waiting for "every member runs" reads the daemon's `peloton_hostmgr_task_status_total{state="RUNNING"}` (and, for
the gangs, each job's RUNNING on the WatchJobs stream); the elastic job's task counts are checked with GetJob at
the end; a scenario gives up after `--timeout`, or when no task has started for `--stall` seconds, and says so
(the table's "NOT ALL", `gave_up` in the JSON). `gang launches ok / refused / failed` are the host manager's
answers to the launches (`peloton_hostmgr_gang_launches_total`): refusals are launches of stale placements. Target of the hot-path issue (not asserted): under 1 GB of daemon memory per 100,000 active tasks.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path
from typing import Any

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import (  # noqa: E402
    CpuMeter,
    Daemon,
    JobWatch,
    cpu_rows,
    gang_spec,
    profile_rows,
    profile_summary,
    run_clients,
    running,
    table,
    write_results,
)
from peloton.api.v1 import job_pb2, job_pb2_grpc  # noqa: E402

RUNNING_STATUSES = "peloton_hostmgr_task_status_total"
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", 64 * 1024 * 1024)]  # GetJob of 100,000 gangs


def sim_args(hosts: int, resources: str, racks: int) -> list[str]:
    return ["--backend", "sim", "--sim-hosts", str(hosts), "--sim-host-resources", resources,
            "--sim-racks", str(racks)]


def member_spec(instances: int, duration: str | None = None, min_available: int = 0) -> job_pb2.JobSpec:
    spec = gang_spec(instances, "sim", gpu=1, cpu=1.0, mem="2Gi",
                     env={"PELOTON_SIM_DURATION": duration} if duration else None, name="memory-bench")
    spec.gang.min_available = min_available
    return spec


def running_count(d: Daemon) -> float:
    return d.metric(RUNNING_STATUSES, state="RUNNING")


def warm_up(d: Daemon, stub: job_pb2_grpc.JobServiceStub, watch: JobWatch) -> None:
    """One gang that comes and goes, so lazily built state (the host index, pools, caches) is in the idle RSS."""
    jid = stub.CreateJob(job_pb2.CreateJobRequest(spec=member_spec(8, "100ms")), timeout=60).job_id
    watch.when(jid, "SUCCEEDED", "FAILED", "KILLED").result(120)
    time.sleep(1)


def wait_running(d: Daemon, base: float, want: int, t0: float, a: argparse.Namespace) -> dict[str, Any]:
    """Poll the daemon's RUNNING status counter until `want` more tasks have been reported running; give up after
    `a.timeout` seconds, or when the count has not moved for `a.stall` seconds (a stalled daemon)."""
    deadline = time.perf_counter() + a.timeout
    last_print = moved_at = time.perf_counter()
    n = last = 0.0
    why = "timeout"
    while time.perf_counter() < deadline:
        n = running_count(d) - base
        now = time.perf_counter()
        if n >= want:
            return {"all_running": True, "all_running_s": now - t0, "running": int(n), "gave_up": ""}
        if n != last:
            last, moved_at = n, now
        elif a.stall and now - moved_at >= a.stall:
            why = f"stalled: no task started for {a.stall:.0f} s"
            break
        if a.progress and now - last_print >= a.progress:
            last_print = now
            print(f"    ... {int(n):,} of {want:,} running after {now - t0:.0f} s, RSS {d.rss_mib():.0f} MiB, "
                  f"launches refused {launches(d, 'refused'):,.0f}", file=sys.stderr)
        time.sleep(0.25)
    print(f"    gave up ({why}): {int(n):,} of {want:,} running after {time.perf_counter() - t0:.0f} s",
          file=sys.stderr)
    return {"all_running": False, "all_running_s": float("nan"), "running": int(n), "gave_up": why}


def launches(d: Daemon, result: str) -> float:
    """Gang launches the host manager answered with `result` (ok, refused, failed) since the daemon started."""
    return d.metric("peloton_hostmgr_gang_launches_total", result=result)


def memory_figures(d: Daemon, idle: float, tasks: int, settle: float) -> dict[str, Any]:
    at = d.rss_mib()
    time.sleep(settle)
    after = d.rss_mib()
    delta = after - idle
    return {"rss_idle_mib": idle, "rss_all_running_mib": at, "rss_settled_mib": after,
            "rss_peak_mib": d.rss_peak_mib(), "rss_delta_mib": delta,
            "mib_per_100k_tasks": delta * 100_000 / max(tasks, 1), "kib_per_task": delta * 1024 / max(tasks, 1)}


def db_size_mib(d: Daemon) -> float | None:
    if d.pg_url:
        from sqlalchemy import create_engine, text
        from sqlalchemy.pool import NullPool

        engine = create_engine(d.pg_url, poolclass=NullPool)
        try:
            with engine.connect() as conn:
                return float(conn.execute(text("SELECT pg_database_size(current_database())")).scalar_one()) / 2**20
        finally:
            engine.dispose()
    db = d.data_dir / "peloton.db"
    return sum(p.stat().st_size for p in d.data_dir.glob("peloton.db*")) / 2**20 if db.exists() else None


def gangs_scenario(d: Daemon, a: argparse.Namespace) -> dict[str, Any]:
    ch = grpc.insecure_channel(d.address, options=CHANNEL_OPTIONS)
    stub = job_pb2_grpc.JobServiceStub(ch)
    watch = JobWatch(ch)
    warm_up(d, stub, watch)
    idle = d.rss_mib()
    jobs = a.tasks // a.size
    tasks = jobs * a.size
    base = running_count(d)
    spec = member_spec(a.size)
    ids: list[str] = []
    errors: list[str] = []
    lock = threading.Lock()
    counter = iter(range(jobs))

    def submit(_k: int) -> None:
        while True:
            with lock:
                if next(counter, None) is None:
                    return
            try:
                jid = stub.CreateJob(job_pb2.CreateJobRequest(spec=spec), timeout=120).job_id
            except grpc.RpcError as e:
                with lock:
                    errors.append(f"{e.code()}: {e.details()}")
                continue
            with lock:
                ids.append(jid)

    meter = CpuMeter(d)
    t0 = time.perf_counter()
    with d.profiled(a.profile):
        run_clients(submit, a.submitters)
        accepted = time.perf_counter() - t0
        wait = wait_running(d, base, tasks - a.size * len(errors), t0, a)
        futs = [watch.when(j, "RUNNING", "SUCCEEDED", "FAILED", "KILLED") for j in ids]
        states: dict[str, int] = {}
        for f in futs:
            if wait["all_running"]:
                st, _ = f.result(max(1.0, a.timeout - (time.perf_counter() - t0)))
            else:
                st = f.result()[0] if f.done() else "not running"
            states[st] = states.get(st, 0) + 1
    cpu = meter.stop()
    mem = memory_figures(d, idle, tasks, a.settle)
    watch.close()
    ch.close()
    return {"jobs": jobs, "gang_size": a.size, "tasks": tasks, "submitters": a.submitters,
            "all_accepted_s": accepted, **wait, "job_states": states, "create_errors": len(errors),
            "create_error_sample": errors[:5], "tasks_per_s_to_running": tasks / wait["all_running_s"]
            if wait["all_running"] else float("nan"), **mem, "db_size_mib": db_size_mib(d),
            "daemon_cpu_ms_per_task": 1000 * cpu["daemon_cpu_s"] / max(tasks, 1), "cpu": cpu}


def elastic_scenario(d: Daemon, a: argparse.Namespace) -> dict[str, Any]:
    ch = grpc.insecure_channel(d.address, options=CHANNEL_OPTIONS)
    stub = job_pb2_grpc.JobServiceStub(ch)
    watch = JobWatch(ch)
    warm_up(d, stub, watch)
    idle = d.rss_mib()
    base = running_count(d)
    meter = CpuMeter(d)
    t0 = time.perf_counter()
    with d.profiled(a.profile):
        jid = stub.CreateJob(job_pb2.CreateJobRequest(spec=member_spec(a.tasks, min_available=1)),
                             timeout=a.timeout).job_id
        accepted = time.perf_counter() - t0
        rss_accepted = d.rss_mib()
        job_running = watch.when(jid, "RUNNING", "SUCCEEDED", "FAILED", "KILLED")
        wait = wait_running(d, base, a.tasks, t0, a)
    cpu = meter.stop()
    first = job_running.result(1) if job_running.done() else ("", float("nan"))
    mem = memory_figures(d, idle, a.tasks, a.settle)
    t1 = time.perf_counter()
    job = stub.GetJob(job_pb2.GetJobRequest(job_id=jid), timeout=120).job
    get_job_s = time.perf_counter() - t1
    watch.close()
    ch.close()
    return {"instances": a.tasks, "min_available": 1, "create_job_s": accepted, "rss_after_create_mib": rss_accepted,
            "job_running_s": first[1] - t0, **wait, "job_state": job.status.state,
            "task_states": dict(job.status.task_states), "get_job_s": get_job_s,
            "tasks_per_s_to_running": a.tasks / wait["all_running_s"] if wait["all_running"] else float("nan"),
            **mem, "db_size_mib": db_size_mib(d), "daemon_cpu_ms_per_task": 1000 * cpu["daemon_cpu_s"] / a.tasks,
            "cpu": cpu}


def mem_rows(r: dict[str, Any]) -> list[tuple[str, str]]:
    rows = [
        ("  RSS idle / all running / settled / peak",
         f"{r['rss_idle_mib']:.0f} / {r['rss_all_running_mib']:.0f} / {r['rss_settled_mib']:.0f} / "
         f"{r['rss_peak_mib']:.0f} MiB"),
        ("  memory per 100,000 active tasks" if r["all_running"] else "  memory per 100,000 tasks (NOT all running)",
         f"{r['mib_per_100k_tasks']:.0f} MiB  ({r['kib_per_task']:.2f} KiB/task, "
         f"RSS delta {r['rss_delta_mib']:.0f} MiB)"),
        ("  daemon CPU per task", f"{r['daemon_cpu_ms_per_task']:.2f} ms"),
    ]
    if r.get("db_size_mib") is not None:
        rows.append(("  database size", f"{r['db_size_mib']:.0f} MiB"))
    return rows + cpu_rows(r["cpu"])


def _launch_text(r: dict[str, Any]) -> str:
    n = r["gang_launches"]
    return f"{n['ok']:,.0f} / {n['refused']:,.0f} / {n['failed']:,.0f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", choices=["postgresql", "sqlite"], default="postgresql")
    ap.add_argument("--scenario", choices=["both", "gangs", "elastic"], default="both")
    ap.add_argument("--tasks", type=int, default=20_000,
                    help="active tasks to reach; 100000 for the issue's figure (about 5 minutes a scenario on 2 "
                         "busy cores); at most 100,000 for elastic (the instances limit)")
    ap.add_argument("--size", type=int, default=8, help="members per gang in the gangs scenario")
    ap.add_argument("--submitters", type=int, default=8, help="concurrent CreateJob clients (gangs scenario)")
    ap.add_argument("--hosts", type=int, default=20_000)
    ap.add_argument("--host-resources", default="cpu=64,mem=256Gi,gpu=8")
    ap.add_argument("--racks", type=int, default=40)
    ap.add_argument("--timeout", type=float, default=900.0, help="give up waiting for every task to run after this")
    ap.add_argument("--stall", type=float, default=120.0,
                    help="give up waiting when no task has started for this many seconds (0: never)")
    ap.add_argument("--settle", type=float, default=5.0, help="seconds between 'all running' and the settled RSS")
    ap.add_argument("--progress", type=float, default=15.0, help="print progress every this many seconds (0: never)")
    ap.add_argument("--json", default=None, help="where to write the figures (default benchmarks/results/)")
    ap.add_argument("--profile", default=None, help="py-spy the daemon while the tasks start; the scenario name is "
                                                    "added to the file name")
    a = ap.parse_args()

    res: dict[str, Any] = {"store": a.store, "parameters": vars(a),
                           "workload": f"sim backend, {a.hosts} hosts ({a.host_resources}, {a.racks} racks); "
                                       "1-GPU members (cpu=1, mem=2Gi) that run until killed"}
    scenarios = ["gangs", "elastic"] if a.scenario == "both" else [a.scenario]
    profile = a.profile
    for name in scenarios:
        a.profile = f"{profile}.{name}" if profile else None
        d = Daemon(sim_args(a.hosts, a.host_resources, a.racks), store=a.store)
        t0 = time.perf_counter()
        with running(d):
            start_s = time.perf_counter() - t0
            print(f"  {name}: daemon up in {start_s:.1f} s, RSS {d.rss_mib():.0f} MiB", file=sys.stderr)
            r = gangs_scenario(d, a) if name == "gangs" else elastic_scenario(d, a)
            r["daemon_start_s"] = start_s
            r["loop_errors"] = d.metric("peloton_loop_errors_total")
            r["gang_launches"] = {k: launches(d, k) for k in ("ok", "refused", "failed")}
            r["profile"] = profile_summary(a.profile) if a.profile else None
            stop0 = time.perf_counter()
        r["daemon_stop_s"] = time.perf_counter() - stop0
        res[name] = r
    a.profile = profile

    print(f"daemon memory, {a.store}: {res['workload']}")
    rows: list[tuple[str, str]] = []
    if "gangs" in res:
        g = res["gangs"]
        done = f"{g['all_running_s']:.1f} s" if g["all_running"] else f"NOT ALL: {g['running']:,} ({g['gave_up']})"
        rows += [
            (f"gangs: {g['jobs']:,} jobs x {g['gang_size']} members", f"{g['tasks']:,} tasks, {g['submitters']} "
                                                                       "submitters"),
            ("  all accepted (CreateJob returned)", f"{g['all_accepted_s']:.1f} s"),
            ("  all running", f"{done}  ({g['tasks_per_s_to_running']:,.0f} tasks/s)"),
            ("  job states", f"{g['job_states']}, CreateJob errors {g['create_errors']}"),
            ("  gang launches ok / refused / failed", _launch_text(g)),
            *mem_rows(g),
            ("  loop errors", f"{g['loop_errors']:.0f}"),
        ]
        if g["profile"]:
            rows += profile_rows(g["profile"])
    if "elastic" in res:
        e = res["elastic"]
        done = f"{e['all_running_s']:.1f} s" if e["all_running"] else f"NOT ALL: {e['running']:,} ({e['gave_up']})"
        rows += [
            (f"elastic: 1 job x {e['instances']:,} instances", "gang.min_available 1"),
            ("  CreateJob returned", f"{e['create_job_s']:.1f} s  (RSS then {e['rss_after_create_mib']:.0f} MiB)"),
            ("  job RUNNING (first gang)", f"{e['job_running_s']:.1f} s"),
            ("  all running", f"{done}  ({e['tasks_per_s_to_running']:,.0f} tasks/s)"),
            ("  GetJob at the end", f"{e['job_state']} {e['task_states']} in {e['get_job_s']:.1f} s"),
            ("  gang launches ok / refused / failed", _launch_text(e)),
            *mem_rows(e),
            ("  loop errors", f"{e['loop_errors']:.0f}"),
        ]
        if e["profile"]:
            rows += profile_rows(e["profile"])
    print(table(rows))
    print(f"  json: {write_results(f'memory-{a.store}', res, a.json)}")


if __name__ == "__main__":
    main()
