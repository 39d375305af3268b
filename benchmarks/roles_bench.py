"""Benchmark 14: what each component costs, run as separate `--role` processes (issue 24's scale on paper).

    .venv/bin/python benchmarks/roles_bench.py [--seconds 20] [--clients 8] [--rounds 1] [--engines 1,2]

On PostgreSQL and the sim backend (no processes run, so what is measured is the scheduler's own work), the same
closed loop twice in turn: one all-in-one daemon, then four processes (`--role hostmgr`, `resmgr`, `placement`,
`jobmgr`, calling each other over their internal gRPC services on Unix sockets). `--clients` clients each submit a
gang of `--size` 1-GPU members that run `--duration` (sim time) and wait until it runs, then the next, for
`--seconds`; then every gang is waited for until it has ended, so its whole life counts. For each process, its CPU
seconds from /proc over that stretch, per gang and per task; the same for the PostgreSQL backends serving the
database, every PostgreSQL process, and the clients. docs/performance.md turns these into what 4 machines of 32
cores would reach. `--engines 1,2` runs the split processes once with each number of `--role placement` processes
(more than one: --placement-engines shared; `placement-all` sums them); `--no-all-in-one` leaves that mode out.
`--threads`: the job manager's CPU by thread (/proc; py-spy names the threads), in either mode. It reports the writer's
group commits a gang and mutations in each too.
Asserts nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import (  # noqa: E402
    Daemon,
    JobWatch,
    _pids_named,
    closed_loop_clients,
    gang_spec,
    proc_cpu_seconds,
    summary,
    table,
    write_results,
)
from peloton.api.v1 import job_pb2, job_pb2_grpc  # noqa: E402

ENDED = ("SUCCEEDED", "FAILED", "KILLED", "LOST")
ROLES = ("jobmgr", "resmgr", "placement", "hostmgr")


def per_unit(cpu_s: dict[str, float], gangs: int, size: int) -> dict[str, dict[str, float]]:
    """CPU seconds of each process over a run -> ms per gang and µs per task (a gang is `size` tasks)."""
    g = max(gangs, 1)
    return {k: {"cpu_s": v, "ms_per_gang": 1000 * v / g, "us_per_task": 1e6 * v / (g * size)}
            for k, v in cpu_s.items()}


def ceiling_gangs_per_s(ms_per_gang: dict[str, float], cores_each: float = 1.0) -> dict[str, float | None]:
    """How many gangs/s one process of each component could sustain with `cores_each` cores of its own (a Python
    process: about one, its GIL), from its CPU per gang; None when it spent nothing (no ceiling)."""
    return {k: (1000 * cores_each / v if v > 0 else None) for k, v in ms_per_gang.items()}


class Cluster:
    """The daemon(s) of one mode on one fresh PostgreSQL database; `procs` names each process."""

    def __init__(self, split: bool, sim: list[str], engines: int = 1) -> None:
        from tests.dbutil import fresh_postgres_url

        self.url = fresh_postgres_url()
        self.dir = Path(tempfile.mkdtemp(prefix="peloton-roles-"))
        db = ["--db", self.url]  # after the harness's own --db: the last one given wins
        if not split:
            self.procs = {"all-in-one": Daemon([*sim, *db], data_dir=self.dir / "all")}
            return
        secret = ["--internal-secret-file", str(self.dir / "internal.secret")]
        hm, rm = self.dir / "hostmgr", self.dir / "resmgr"
        uses = ["--resmgr", f"unix:{rm}/internal.sock", "--hostmgr", f"unix:{hm}/internal.sock", *secret]
        shared = ["--placement-engines", "shared"] if engines > 1 else []
        self.procs = {  # in the order they start: the serving ones first (the first creates the secret)
            "hostmgr": Daemon(["--role", "hostmgr", *sim, *secret, *db], data_dir=hm),
            "resmgr": Daemon(["--role", "resmgr", *shared, *secret, *db], data_dir=rm),
            **{engine_name(i): Daemon(["--role", "placement", *shared, *uses, *db],
                                      data_dir=self.dir / engine_name(i)) for i in range(engines)},
            "jobmgr": Daemon(["--role", "jobmgr", *uses, *db], data_dir=self.dir / "jobmgr"),
        }

    @contextlib.contextmanager
    def up(self) -> Iterator[str]:
        """The address of the job API."""
        ok = False
        try:
            for d in self.procs.values():
                d.data_dir.mkdir(parents=True, exist_ok=True)
                d.start()
            yield self.procs.get("jobmgr", self.procs.get("all-in-one")).address  # type: ignore[union-attr]
            ok = True
        finally:
            for d in reversed(self.procs.values()):
                d.stop()
            from tests.dbutil import drop_postgres_db

            drop_postgres_db(self.url)
            if ok:
                shutil.rmtree(self.dir, ignore_errors=True)
            else:  # the processes' logs (daemon.log in each data dir) say why
                print(f"  kept {self.dir} (the daemons' logs)", file=sys.stderr)

    def statements(self) -> dict[str, float]:
        """The store's statements and commits so far, all processes together, and the claims the host manager
        refused (`refused`: another engine had taken the hosts, or they changed under the engine's copy)."""
        out = {kind: sum(d.metric("peloton_store_statements_total", kind=kind) for d in self.procs.values())
               for kind in ("statement", "commit")}
        out["refused"] = sum(d.metric("peloton_hostmgr_claims_total", result="refused") for d in self.procs.values())
        # the job manager's group commits and the mutations they carried (the writer's histogram)
        out["batches"] = sum(d.metric("peloton_jobmgr_commit_mutations_count") for d in self.procs.values())
        out["mutations"] = sum(d.metric("peloton_jobmgr_commit_mutations_sum") for d in self.procs.values())
        return out

    def internal_calls(self) -> dict[str, float]:
        """The internal gRPC calls answered so far (a split deployment's), by method, all processes together."""
        out: dict[str, float] = {}
        for d in self.procs.values():
            for labels, v in d.metric_samples("peloton_internal_calls_total").items():
                method = dict(labels).get("method", "")
                out[method] = out.get(method, 0.0) + v
        return out

    def cpu(self) -> dict[str, float]:
        """CPU seconds so far: each process, the PostgreSQL backends of the database, every PostgreSQL process,
        and this process (the clients)."""
        ru = resource.getrusage(resource.RUSAGE_SELF)
        some = next(iter(self.procs.values()))
        some.pg_url = self.url  # (only to list the database's backends; Cluster drops the database itself)
        try:
            backends = some.pg_backend_pids()
        finally:
            some.pg_url = ""
        return {**{k: d.cpu_seconds() for k, d in self.procs.items()},
                **{f"pg:{p}": proc_cpu_seconds(p) for p in backends},
                **{f"pgall:{p}": proc_cpu_seconds(p) for p in _pids_named("postgres")},
                "clients": ru.ru_utime + ru.ru_stime}


def thread_names(pid: int) -> dict[int, str]:
    """The daemon's threads by OS thread id -> name (digits as N: a pool's threads together), from `py-spy dump`
    ({} without py-spy); the threads py-spy does not name (gRPC's C threads, no Python frame) are left out."""
    exe = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if exe is None:
        print("  (--threads: py-spy is not installed (`.venv/bin/pip install py-spy`); by process only)", file=sys.stderr)
        return {}
    out = subprocess.run([exe, "dump", "--nonblocking", "--pid", str(pid)], capture_output=True, text=True,
                         timeout=60).stdout
    return {int(m.group(1), 0): re.sub(r"\d+", "N", m.group(2))
            for m in re.finditer(r'Thread (\S+) \([^)]*\): "([^"]*)"', out)}


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds of each thread of a process (user + system, /proc), by OS thread id."""
    out: dict[int, float] = {}
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                f = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
                out[int(tid)] = (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
    return out


def by_thread(names: dict[int, str], before: dict[int, float], after: dict[int, float]) -> dict[str, float]:
    """CPU seconds between two thread_cpu snapshots, summed by thread name ("other": gRPC's C threads and any
    thread py-spy did not name)."""
    out: dict[str, float] = {}
    for tid, v in after.items():
        k = names.get(tid, "other")
        out[k] = out.get(k, 0.0) + v - before.get(tid, 0.0)
    return out


def engine_name(i: int) -> str:
    """The i-th placement process (0: "placement", as with one)."""
    return "placement" if i == 0 else f"placement-{i + 1}"


def cpu_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Per process, the PostgreSQL ones summed (a backend that ended in between is not counted), and with several
    placement processes their sum (`placement-all`)."""
    out: dict[str, float] = {}
    for k, v in after.items():
        key = "postgres_db" if k.startswith("pg:") else "postgres_all" if k.startswith("pgall:") else k
        out[key] = out.get(key, 0.0) + v - before.get(k, 0.0)
    engines = [v for k, v in out.items() if k.startswith("placement-")]
    if engines and "placement" in out:
        out["placement-all"] = out["placement"] + sum(engines)
    return out


def closed_loop(address: str, cluster: Cluster, clients: int, seconds: float, size: int, duration: str,
                idle_s: float, profile: str | None = None, by_thread_cpu: bool = False) -> dict[str, Any]:
    ch = grpc.insecure_channel(address)
    stub = job_pb2_grpc.JobServiceStub(ch)
    watch = JobWatch(ch)
    spec = gang_spec(size, "sim", env={"PELOTON_SIM_DURATION": duration}, name="roles-bench")
    for _ in range(3):  # warm-up: every path taken once before the meter starts
        jid = str(stub.CreateJob(job_pb2.CreateJobRequest(spec=spec), timeout=60).job_id)
        watch.when(jid, "RUNNING", *ENDED).result(120)
        watch.when(jid, *ENDED).result(120)
    # what each process spends with nothing submitted (its loops' ticks): a fixed cost, not a gang's
    time.sleep(2)  # the warm-up's last gang's side effects settle
    idle0, t_idle = cluster.cpu(), time.perf_counter()
    time.sleep(idle_s)
    idle = {k: v / (time.perf_counter() - t_idle) for k, v in cpu_delta(idle0, cluster.cpu()).items()}
    stop = time.monotonic() + seconds

    # --threads: the job manager's (or the one daemon's) CPU by thread, from /proc (CPU, not GIL samples: a thread
    # the OS preempts while it holds the GIL shows in py-spy's --gil samples, not here)
    jm = cluster.procs.get("jobmgr", cluster.procs.get("all-in-one"))
    jm_pid = jm.proc.pid if by_thread_cpu and jm is not None and jm.proc is not None else 0
    names = thread_names(jm_pid) if jm_pid else {}
    threads0 = thread_cpu(jm_pid) if names else {}
    cpu0, stmts0, calls0 = cluster.cpu(), cluster.statements(), cluster.internal_calls()
    t0 = time.perf_counter()
    with contextlib.ExitStack() as profiling:  # py-spy on each process over the loop (--profile), GIL samples only
        if profile:
            for name, d in cluster.procs.items():
                profiling.enter_context(d.profiled(f"{profile}-{name}.txt"))
        run = closed_loop_clients(
            lambda: str(stub.CreateJob(job_pb2.CreateJobRequest(spec=spec), timeout=60).job_id), watch, clients,
            stop, ("RUNNING", *ENDED))
        elapsed = time.perf_counter() - t0
        ids = [jid for jid, _, _ in run.gangs]
        lat = [seconds for _, _, seconds in run.gangs]
        errors = [f"{jid}: {state}" for jid, state, _ in run.gangs if state not in ("RUNNING", "SUCCEEDED")]
        errors += run.raised
        for jid in ids:  # their whole lives count
            watch.when(jid, *ENDED).result(300)
        wall = time.perf_counter() - t0
    cpu = cpu_delta(cpu0, cluster.cpu())
    jm_threads = by_thread(names, threads0, thread_cpu(jm_pid)) if names else {}
    stmts = cluster.statements()
    calls = {k: (v - calls0.get(k, 0.0)) / max(len(ids), 1) for k, v in cluster.internal_calls().items()}
    watch.close()
    ch.close()
    gangs = len(ids)
    return {"gangs": gangs, "tasks": gangs * size, "seconds": elapsed, "wall_s": wall,
            "gangs_per_s": gangs / elapsed, "tasks_per_s": gangs * size / elapsed, "latency": summary(lat),
            "store_statements_per_gang": (stmts["statement"] - stmts0["statement"]) / max(gangs, 1),
            "store_commits_per_gang": (stmts["commit"] - stmts0["commit"]) / max(gangs, 1),
            # internal gRPC calls a gang, by method (split only: one process calls its components directly)
            "internal_calls_per_gang": {k: v for k, v in sorted(calls.items()) if v > 0},
            "claims_refused": stmts["refused"] - stmts0["refused"],
            # the writer's group commits a gang and mutations in each (smaller batches: more commits for the work)
            "writer_commits_per_gang": (stmts["batches"] - stmts0["batches"]) / max(gangs, 1),
            "mutations_per_commit": (stmts["mutations"] - stmts0["mutations"]) / max(stmts["batches"] - stmts0["batches"], 1),
            "error_count": len(errors), "errors": errors[:10], "cpu": per_unit(cpu, gangs, size),
            # one process of each with one core of its own (its GIL): the gangs/s it could sustain
            "ceiling_gangs_per_s": ceiling_gangs_per_s({k: 1000 * v / max(gangs, 1) for k, v in cpu.items()
                                                        if k in (*ROLES, "all-in-one")}),
            "cores_busy": {k: v / wall for k, v in cpu.items()}, "idle_cores": idle,
            # --threads: the job manager's CPU by thread, ms a gang
            "jobmgr_threads_ms_per_gang": {k: 1000 * v / max(gangs, 1) for k, v in
                                           sorted(jm_threads.items(), key=lambda x: -x[1]) if v > 0},
            # less what it would have spent idle over the same stretch: what the gangs themselves cost
            "cpu_beyond_idle": per_unit({k: max(0.0, v - idle.get(k, 0.0) * wall) for k, v in cpu.items()},
                                        gangs, size)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--seconds", type=float, default=20.0, help="length of each closed loop")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--size", type=int, default=8, help="members per gang")
    ap.add_argument("--duration", default="1s", help="how long each member runs (sim time)")
    ap.add_argument("--hosts", type=int, default=10_000, help="sim hosts (cpu=64,mem=256Gi,gpu=8; 40 racks)")
    ap.add_argument("--idle", type=float, default=5.0, help="seconds of each process's idle CPU, before the loop")
    ap.add_argument("--rounds", type=int, default=1, help="all-in-one and split, in turn, this many times")
    ap.add_argument("--profile", default=None, metavar="PREFIX",
                    help="py-spy (if installed) samples each process over the loop into PREFIX-<process>.txt "
                         "(the last round's; harness.profile_summary reads them)")
    ap.add_argument("--engines", default="1", help="placement processes of the split mode, a run for each number "
                                                   "given (1,2: one, then two with --placement-engines shared)")
    ap.add_argument("--no-all-in-one", action="store_true", help="the split processes only")
    ap.add_argument("--threads", action="store_true",
                    help="the job manager's (and the one daemon's) CPU by thread, from /proc (needs py-spy to name them)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    sim = ["--backend", "sim", "--sim-hosts", str(a.hosts), "--sim-host-resources", "cpu=64,mem=256Gi,gpu=8",
           "--sim-racks", str(min(40, a.hosts))]
    counts = [int(n) for n in a.engines.split(",") if n.strip()]
    if not counts or min(counts) < 1:
        ap.error(f"--engines: numbers of 1 or more, comma-separated, got {a.engines!r}")
    modes = {"split" if n == 1 else f"split-{n}-engines": n for n in counts}
    runs: dict[str, list[dict[str, Any]]] = {**({} if a.no_all_in_one else {"all-in-one": []}),
                                             **{m: [] for m in modes}}
    for _ in range(a.rounds):
        for mode in runs:
            cluster = Cluster(mode != "all-in-one", sim, modes.get(mode, 1))
            print(f"  {mode}: starting", file=sys.stderr, flush=True)
            with cluster.up() as address:
                runs[mode].append(closed_loop(address, cluster, a.clients, a.seconds, a.size, a.duration, a.idle,
                                              a.profile, a.threads))
    res = {"workload": f"sim backend, {a.hosts} hosts, PostgreSQL; {a.clients} closed-loop clients of {a.size}-member "
                       f"1-GPU gangs running {a.duration}", "runs": runs,
           "parameters": {k: v for k, v in vars(a).items() if k != "json"}}
    rows: list[tuple[str, str]] = []
    for mode, rs in runs.items():
        for i, r in enumerate(rs):
            rows.append((f"{mode} #{i + 1}", f"{r['gangs_per_s']:.1f} gangs/s ({r['tasks_per_s']:.0f} tasks/s), "
                                             f"p50 {r['latency']['p50_ms']:.1f} ms, {r['error_count']} errors, "
                                             f"{r['store_statements_per_gang']:.1f} statements and "
                                             f"{r['store_commits_per_gang']:.1f} commits a gang, "
                                             f"{r['claims_refused']:.0f} claims refused, writer: "
                                             f"{r['writer_commits_per_gang']:.2f} group commits a gang of "
                                             f"{r['mutations_per_commit']:.2f} mutations"))
            if r["internal_calls_per_gang"]:
                rows.append(("  internal calls a gang", f"{sum(r['internal_calls_per_gang'].values()):.2f}: " + ", ".join(
                    f"{k} {v:.2f}" for k, v in r["internal_calls_per_gang"].items())))
            if r["jobmgr_threads_ms_per_gang"]:
                rows.append(("  job manager's threads", ", ".join(
                    f"{k} {v:.2f}" for k, v in r["jobmgr_threads_ms_per_gang"].items()) + " ms/gang"))
            for k, v in r["cpu"].items():
                rows.append((f"  cpu: {k}", f"{v['ms_per_gang']:.2f} ms/gang  {v['us_per_task']:.0f} us/task  "
                                            f"({r['cores_busy'][k]:.2f} cores; idle {r['idle_cores'][k]:.3f}, "
                                            f"beyond idle {r['cpu_beyond_idle'][k]['ms_per_gang']:.2f} ms/gang)"))
    print(f"components as processes: {res['workload']}")
    print(table(rows))
    print(f"  json: {write_results('roles', res, a.json)}")
    return res


if __name__ == "__main__":
    main()
