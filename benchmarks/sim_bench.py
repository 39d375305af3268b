"""Benchmark 2: end to end on the sim backend (10,000 in-memory hosts, cpu=64 mem=256Gi gpu=8, 40 racks), driven over
gRPC as a user's program would, on PostgreSQL (or SQLite). Prints a table and writes JSON; asserts nothing.

    .venv/bin/python benchmarks/sim_bench.py [--store postgresql|sqlite] [--seconds 30] [--clients 8]
        [--hosts 10000] [--samples 20] [--profile FILE] [--scrape-every 15]
    .venv/bin/python benchmarks/sim_bench.py --scrape-only 10000,100000   # the /metrics scrape alone, in-process

Measures:
- closed loop: `--clients` gRPC clients, each submitting a gang of `--size` 1-GPU members, waiting until every
  member runs (the job RUNNING on the WatchJobs stream), then submitting the next, for `--seconds`: tasks/s and
  gangs/s from submit to RUNNING, and the latency of each gang under that load. Members run `--duration` (sim time,
  PELOTON_SIM_DURATION in task.env) and then succeed, so the cluster never fills;
- over the closed loop, until its last gang has ended: store statements and commits per gang (the daemon's
  `peloton_store_statements_total{kind}`), daemon CPU ms per gang, and the CPU time of the daemon, of the
  clients (this process), of PostgreSQL and of the whole machine, to show who used the cores;
- gang latency, request -> every member RUNNING, by gang size with one request outstanding (each gang's members
  run `--latency-duration` and the next request waits until the gang has ended, so the daemon is otherwise idle);
- the job manager's writer over the closed loop (`peloton_jobmgr_commit_seconds`, `..._mutations`): group
  commits, their mean time and size, and the fraction of the time it was committing (near 100%: it is the
  bottleneck);
- daemon RSS after the run, and its peak;
- with `--scrape-every S`, a Prometheus stand-in scrapes /metrics every S seconds during the closed loop (its
  cost is in the daemon CPU per gang);
- `--scrape-only N,..`: no daemon; the cost of one scrape of the cluster census (peloton/observability/census.py)
  over N sim hosts in this process: CPU ms of the first scrape, of a scrape of an unchanged cluster, and of one
  after 1% of the hosts changed (failed or recovered), and how long the backend's lock (which launches and status
  updates need) is held by it.

Targets of the hot-path issue (not asserted): >= 10,000 tasks/s end to end; p99 < 10 ms up to 16 members.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path
from typing import Any

import grpc
from sqlalchemy.engine import make_url

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import (  # noqa: E402
    CpuMeter,
    Daemon,
    JobWatch,
    closed_loop_clients,
    cpu_rows,
    database_settings,
    gang_spec,
    profile_rows,
    profile_summary,
    running,
    summary,
    table,
    write_results,
)
from peloton.api.v1 import job_pb2, job_pb2_grpc  # noqa: E402

ENDED = ("SUCCEEDED", "FAILED", "KILLED")


def scrape_costs(hosts: int, rounds: int = 10, seed: int = 1) -> dict[str, Any]:
    """CPU ms of a /metrics scrape of the cluster census over `hosts` sim hosts (the census alone, rendered as
    Prometheus text), and the time the backend's lock is held by it."""
    import random
    import statistics

    from prometheus_client import CollectorRegistry, generate_latest

    from peloton.domain.resources import Resources
    from peloton.hostmgr.manager import HostManager
    from peloton.hostmgr.sim.backend import SimBackend, make_sim_hosts
    from peloton.observability.census import ClusterCensus

    backend = SimBackend(make_sim_hosts(hosts, Resources(cpu=64, mem=256 * 1024, gpu=8), racks=40),
                         timer_thread=False)
    hm = HostManager(backend)
    hm.start()
    census = ClusterCensus()
    census.attach(hm.census)
    registry = CollectorRegistry()
    registry.register(census)
    held: list[float] = []
    listing = backend.hosts

    def timed_hosts() -> Any:  # hosts() holds the backend's lock from start to end
        t0 = time.perf_counter()
        try:
            return listing()
        finally:
            held.append(time.perf_counter() - t0)

    backend.hosts = timed_hosts  # type: ignore[method-assign]

    def scrape() -> float:
        t0 = time.process_time()
        generate_latest(registry)
        return 1000 * (time.process_time() - t0)

    first = scrape()
    unchanged = [scrape() for _ in range(rounds)]
    held_unchanged = held[1:]
    rng = random.Random(seed)
    names = [h.hostname for h in listing()]
    changed, held_changed = [], []
    down: set[str] = set()
    for _ in range(rounds):
        for name in rng.sample(names, max(1, hosts // 100)):
            if name in down:
                backend.recover_host(name)
                down.discard(name)
            else:
                backend.fail_host(name)
                down.add(name)
        n = len(held)
        changed.append(scrape())
        held_changed += held[n:]
    return {"hosts": hosts, "first_cpu_ms": first, "unchanged_cpu_ms": statistics.median(unchanged),
            "changed_1pct_cpu_ms": statistics.median(changed),
            "backend_lock_ms_unchanged": 1000 * statistics.median(held_unchanged),
            "backend_lock_ms_changed": 1000 * statistics.median(held_changed)}


def daemon_scrape_cpu(hosts: int, store: str, scrapes: int = 30) -> dict[str, float]:
    """CPU ms the daemon spends on one whole /metrics scrape (every family, the census included), idle daemon on
    `hosts` sim hosts: its CPU over `scrapes` scrapes in a row, less what it used idle over as long."""
    import urllib.request

    d = Daemon(sim_args(hosts, "cpu=64,mem=256Gi,gpu=8", 40), store=store)
    with running(d):
        urllib.request.urlopen(d.metrics, timeout=60).read()  # the first builds every host's HostInfo
        time.sleep(1.0)
        c0, t0 = d.cpu_seconds(), time.perf_counter()
        time.sleep(3.0)
        idle_rate = (d.cpu_seconds() - c0) / (time.perf_counter() - t0)
        c0, t0 = d.cpu_seconds(), time.perf_counter()
        for _ in range(scrapes):
            urllib.request.urlopen(d.metrics, timeout=60).read()
        wall = time.perf_counter() - t0
        cpu = d.cpu_seconds() - c0 - idle_rate * wall
    return {"hosts": hosts, "daemon_cpu_ms_per_scrape": 1000 * cpu / scrapes, "idle_cpu_ms_per_s": 1000 * idle_rate}


def scrape_only(counts: list[int], json_path: str | None, store: str) -> None:
    import logging

    logging.disable(logging.INFO)  # each failed sim host says so
    res = [scrape_costs(n) for n in counts]
    # a whole daemon only up to 20,000 hosts (100,000 sim hosts take a minute to start)
    daemons = [daemon_scrape_cpu(n, store) for n in counts if n <= 20_000]
    rows = [(f"{r['hosts']:,} hosts: scrape CPU first / unchanged / 1% changed",
             f"{r['first_cpu_ms']:.1f} / {r['unchanged_cpu_ms']:.2f} / {r['changed_1pct_cpu_ms']:.1f} ms; backend "
             f"lock held {r['backend_lock_ms_unchanged']:.2f} / {r['backend_lock_ms_changed']:.2f} ms")
            for r in res]
    rows += [(f"{r['hosts']:,} hosts: idle daemon, CPU per whole /metrics scrape",
              f"{r['daemon_cpu_ms_per_scrape']:.1f} ms (30 in a row, less its idle {r['idle_cpu_ms_per_s']:.0f} ms/s)")
             for r in daemons]
    print("cluster census scrape (in-process, sim hosts cpu=64 mem=256Gi gpu=8), medians of 10; then a daemon")
    print(table(rows))
    print(f"  json: {write_results('sim-scrape', {'scrapes': res, 'daemon': daemons}, json_path)}")


class Scraper:
    """A Prometheus stand-in: GET /metrics every `every_s` seconds until stopped."""

    def __init__(self, url: str, every_s: float) -> None:
        self.url, self.every_s, self.scrapes = url, every_s, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="scraper", daemon=True)
        if every_s > 0:
            self._thread.start()

    def _run(self) -> None:
        import urllib.request

        while not self._stop.wait(self.every_s):
            urllib.request.urlopen(self.url, timeout=30).read()
            self.scrapes += 1

    def stop(self) -> int:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(60)
        return self.scrapes
# The job manager's writer (one thread, group commits): how busy it was tells whether it is the bottleneck.
WRITER = ("peloton_jobmgr_commit_seconds_sum", "peloton_jobmgr_commit_seconds_count",
          "peloton_jobmgr_commit_mutations_sum")


def writer_snapshot(d: Daemon) -> list[float]:
    return [d.metric(name) for name in WRITER]


def writer_figures(before: list[float], after: list[float], wall: float) -> dict[str, float]:
    secs, commits, mutations = (b - a for a, b in zip(before, after, strict=True))
    return {"group_commits": commits, "commit_ms_mean": 1000 * secs / max(commits, 1),
            "mutations_per_commit": mutations / max(commits, 1), "busy_fraction": secs / max(wall, 1e-9)}


# Where one gang's time goes when it is alone (the latency samples): the stages' own histograms.
STAGES = {
    "commit": "peloton_jobmgr_commit_seconds",  # a group commit (create, intent, RUNNING statuses, end)
    "placement_round": "peloton_placement_round_seconds",  # sync, place, claim, hand back
    "launcher_pass": "peloton_jobmgr_launch_seconds",  # placements received -> intent committed -> launch answered
    "backend_launch": "peloton_hostmgr_launch_seconds",  # the backend starting a batch
    "queue_wait": "peloton_resmgr_queue_wait_seconds",  # enqueue -> handed to placement
}


def stage_snapshot(d: Daemon) -> dict[str, tuple[float, float]]:
    return {k: (d.metric(f"{m}_sum"), d.metric(f"{m}_count")) for k, m in STAGES.items()}


def stage_figures(before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]],
                  gangs: int) -> dict[str, dict[str, float]]:
    out = {}
    for k in STAGES:
        secs, n = after[k][0] - before[k][0], after[k][1] - before[k][1]
        out[k] = {"mean_ms": 1000 * secs / max(n, 1), "per_gang": n / max(gangs, 1)}
    return out


def sim_args(hosts: int, resources: str, racks: int) -> list[str]:
    return ["--backend", "sim", "--sim-hosts", str(hosts), "--sim-host-resources", resources,
            "--sim-racks", str(racks)]


def spec(size: int, duration: str) -> job_pb2.JobSpec:
    return gang_spec(size, "sim", gpu=1, cpu=1.0, mem="1Gi", env={"PELOTON_SIM_DURATION": duration},
                     name=f"sim-bench-{size}")


def create(stub: job_pb2_grpc.JobServiceStub, s: job_pb2.JobSpec) -> str:
    return str(stub.CreateJob(job_pb2.CreateJobRequest(spec=s), timeout=60).job_id)


def latency_by_size(stub: job_pb2_grpc.JobServiceStub, watch: JobWatch, sizes: list[int], n: int,
                    duration: str) -> dict[str, dict[str, Any]]:
    """One request outstanding: submit, wait for RUNNING (the sample), wait for the gang to end, next."""
    out: dict[str, dict[str, Any]] = {}
    for size in sizes:
        samples, accept = [], []
        for _ in range(n):
            t0 = time.perf_counter()
            jid = create(stub, spec(size, duration))
            accept.append(time.perf_counter() - t0)
            state, t1 = watch.when(jid, "RUNNING", *ENDED).result(60)
            if state != "RUNNING" and state != "SUCCEEDED":
                raise RuntimeError(f"gang of {size} ended {state} before running (job {jid})")
            samples.append(t1 - t0)
            watch.when(jid, *ENDED).result(60)
        out[str(size)] = {**summary(samples), "create_p50_ms": summary(accept)["p50_ms"],
                          "create_p99_ms": summary(accept)["p99_ms"]}
    return out


def closed_loop(stub: job_pb2_grpc.JobServiceStub, watch: JobWatch, d: Daemon, clients: int, seconds: float,
                size: int, duration: str, duration_s: float, scrape_every: float = 0.0) -> dict[str, Any]:
    stop = time.monotonic() + seconds
    s = spec(size, duration)

    targets0 = d.metric_samples(TARGETS)
    rows0 = d.metric_samples(ROWS)
    stmts0 = d.metric("peloton_store_statements_total", kind="statement")
    commits0 = d.metric("peloton_store_statements_total", kind="commit")
    writer0 = writer_snapshot(d)
    meter = CpuMeter(d)
    scraper = Scraper(d.metrics, scrape_every)
    run = closed_loop_clients(lambda: create(stub, s), watch, clients, stop, ("RUNNING", *ENDED))
    elapsed = run.seconds
    ids = [jid for jid, _, _ in run.gangs]
    lat = [seconds for _, state, seconds in run.gangs if state in ("RUNNING", "SUCCEEDED")]
    errors = [f"{jid}: {state}" for jid, state, _ in run.gangs if state not in ("RUNNING", "SUCCEEDED")]
    errors += run.raised
    # The gangs' whole lives count for the store and the CPU: wait until the last one has ended.
    drain0 = time.perf_counter()
    for jid in ids:
        watch.when(jid, *ENDED).result(duration_s + 120)
    drain = time.perf_counter() - drain0
    scrapes = scraper.stop()
    cpu = meter.stop()
    writer = writer_figures(writer0, writer_snapshot(d), cpu["wall_s"])
    stmts = d.metric("peloton_store_statements_total", kind="statement") - stmts0
    commits = d.metric("peloton_store_statements_total", kind="commit") - commits0
    gangs = len(lat)
    per = max(gangs, 1)
    targets = statements_by_target(targets0, d.metric_samples(TARGETS), per)
    rows = {dict(k).get("table", "?"): round((v - rows0.get(k, 0.0)) / per, 2)
            for k, v in d.metric_samples(ROWS).items()}
    return {
        "clients": clients, "gang_size": size, "member_duration": duration, "seconds": elapsed,
        "gangs": gangs, "tasks": gangs * size, "gangs_per_s": gangs / elapsed, "tasks_per_s": gangs * size / elapsed,
        "latency": summary(lat), "errors": errors[:20], "error_count": len(errors),
        "drain_s": drain, "store_statements_per_gang": stmts / per, "store_commits_per_gang": commits / per,
        "store_statements_per_gang_by_target": targets, "rows_written_per_gang_by_table": rows,
        "daemon_cpu_ms_per_gang": 1000 * cpu["daemon_cpu_s"] / per,
        "clients_cpu_ms_per_gang": 1000 * cpu["clients_cpu_s"] / per,
        "postgres_db_cpu_ms_per_gang": 1000 * cpu["postgres_db_cpu_s"] / per,
        "cpu": cpu, "writer": writer, "scrape_every_s": scrape_every, "scrapes": scrapes,
    }


TARGETS = "peloton_store_statement_targets_total"
ROWS = "peloton_jobmgr_rows_written_total"  # (a task_events row may stand for a gang's members: repo.py)


def statements_by_target(before: dict[Any, float], after: dict[Any, float], per: float) -> dict[str, float]:
    """Statements per gang by "VERB table" (the daemon's peloton_store_statement_targets_total), most first."""
    out: dict[str, float] = {}
    for labels, v in after.items():
        n = (v - before.get(labels, 0.0)) / per
        if n > 0.005:
            d = dict(labels)
            out[f"{d.get('op', '?')} {d.get('table', '')}".strip()] = round(n, 2)
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def parse_seconds(text: str) -> float:
    for suffix, mult in (("ms", 0.001), ("s", 1.0), ("m", 60.0), ("h", 3600.0)):
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * mult
    return float(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", choices=["postgresql", "sqlite"], default="postgresql")
    ap.add_argument("--hosts", type=int, default=10_000)
    ap.add_argument("--host-resources", default="cpu=64,mem=256Gi,gpu=8")
    ap.add_argument("--racks", type=int, default=40)
    ap.add_argument("--clients", type=int, default=8, help="closed-loop gRPC clients")
    ap.add_argument("--seconds", type=float, default=30.0, help="length of the closed loop")
    ap.add_argument("--size", type=int, default=8, help="members per gang in the closed loop")
    ap.add_argument("--duration", default="2s", help="how long each closed-loop member runs (PELOTON_SIM_DURATION)")
    ap.add_argument("--sizes", default="1,2,4,8,16", help="gang sizes of the latency measurement")
    ap.add_argument("--samples", type=int, default=20, help="latency samples per gang size")
    ap.add_argument("--latency-duration", default="100ms", help="how long each member of a latency sample runs")
    ap.add_argument("--json", default=None, help="where to write the figures (default benchmarks/results/)")
    ap.add_argument("--profile", default=None, help="py-spy the daemon (GIL samples) during the closed loop into "
                                                    "this file")
    ap.add_argument("--writers", type=int, default=None,
                    help="the daemon's --jobmgr-writers (default: its own, 2 on PostgreSQL, 1 on SQLite)")
    ap.add_argument("--scrape-every", type=float, default=0.0,
                    help="scrape /metrics every this many seconds during the closed loop (0: not)")
    ap.add_argument("--scrape-only", default=None, help="host counts (10000,100000): measure the census scrape "
                                                        "in-process and nothing else")
    ap.add_argument("--pg-set", action="append", default=[], metavar="KEY=VALUE",
                    help="a PostgreSQL setting of the run's database (repeatable), e.g. log_min_duration_statement=0 "
                         "to log the statements for benchmarks/pg_replay.py")
    a = ap.parse_args()
    if a.pg_set and a.store != "postgresql":
        ap.error("--pg-set: only with --store postgresql")
    try:
        database_settings(tuple(a.pg_set))
    except ValueError as e:
        ap.error(str(e))
    if a.scrape_only:
        scrape_only([int(x) for x in a.scrape_only.split(",") if x], a.json, a.store)
        return
    sizes = [int(x) for x in a.sizes.split(",") if x]

    extra = ["--jobmgr-writers", str(a.writers)] if a.writers is not None else []
    d = Daemon([*sim_args(a.hosts, a.host_resources, a.racks), *extra], store=a.store,
               pg_settings=tuple(a.pg_set))
    t_start = time.perf_counter()
    with running(d):
        started_s = time.perf_counter() - t_start
        rss_idle = d.rss_mib()
        ch = grpc.insecure_channel(d.address)
        stub = job_pb2_grpc.JobServiceStub(ch)
        watch = JobWatch(ch)
        latency_by_size(stub, watch, [8], 5, a.latency_duration)  # warm-up: the first gang builds the index
        stages0 = stage_snapshot(d)
        lat = latency_by_size(stub, watch, sizes, a.samples, a.latency_duration)
        stages = stage_figures(stages0, stage_snapshot(d), a.samples * len(sizes))
        with d.profiled(a.profile):
            loop = closed_loop(stub, watch, d, a.clients, a.seconds, a.size, a.duration, parse_seconds(a.duration),
                               a.scrape_every)
        res = {
            "store": a.store,
            # PostgreSQL's driver: psycopg2, or psycopg 3 with PELOTON_TEST_PG_URL=postgresql+psycopg://...
            "driver": make_url(d.pg_url).get_driver_name() if d.pg_url else "",
            "workload": f"sim backend, {a.hosts} hosts ({a.host_resources}, {a.racks} racks); gangs of 1-GPU "
                        f"members (cpu=1, mem=1Gi)",
            "daemon_start_s": started_s,
            "latency_by_size": lat,
            "latency_stages": stages,
            "closed_loop": loop,
            "daemon_rss_idle_mib": rss_idle,
            "daemon_rss_mib": d.rss_mib(),
            "daemon_rss_peak_mib": d.rss_peak_mib(),
            "loop_errors": d.metric("peloton_loop_errors_total"),
            "gang_launches": {k: d.metric("peloton_hostmgr_gang_launches_total", result=k)
                              for k in ("ok", "refused", "failed")},
            "profile": profile_summary(a.profile) if a.profile else None,
            "parameters": vars(a),
        }
        watch.close()
        ch.close()

    t = res["closed_loop"]
    rows = [(f"latency size {s:>2} p50 / p99", f"{v['p50_ms']:.1f} / {v['p99_ms']:.1f} ms   (CreateJob alone "
                                                 f"{v['create_p50_ms']:.1f} / {v['create_p99_ms']:.1f} ms, n={v['n']})")
            for s, v in lat.items()]
    rows.append(("  one gang alone, stage means", ", ".join(
        f"{k.replace('_', ' ')} {v['mean_ms']:.1f} ms x{v['per_gang']:.1f}" for k, v in res["latency_stages"].items())))
    rows += [
        (f"closed loop, {t['clients']} clients x gangs of {t['gang_size']}",
         f"{t['tasks_per_s']:,.0f} tasks/s  ({t['gangs_per_s']:.1f} gangs/s, {t['gangs']} gangs in "
         f"{t['seconds']:.1f} s)"),
        ("  latency under load p50 / p99", f"{t['latency']['p50_ms']:.1f} / {t['latency']['p99_ms']:.1f} ms"),
        ("  store statements / commits per gang",
         f"{t['store_statements_per_gang']:.1f} / {t['store_commits_per_gang']:.1f}"),
        ("    statements per gang by verb and table", ", ".join(
            f"{k} {v:.1f}" for k, v in t["store_statements_per_gang_by_target"].items()) or "-"),
        ("    rows written per gang by table", ", ".join(
            f"{k} {v:.1f}" for k, v in t.get("rows_written_per_gang_by_table", {}).items()) or "-"),
        ("  daemon CPU per gang", f"{t['daemon_cpu_ms_per_gang']:.1f} ms" + (
            f"  ({t['scrapes']} scrapes of /metrics, every {t['scrape_every_s']:g} s)" if t["scrapes"] else "")),
        ("  clients CPU per gang", f"{t['clients_cpu_ms_per_gang']:.1f} ms"),
        ("  postgres (this db) CPU per gang", f"{t['postgres_db_cpu_ms_per_gang']:.1f} ms"),
        ("  jobmgr writer: group commits", f"{t['writer']['group_commits']:.0f}, {t['writer']['commit_ms_mean']:.1f} ms "
                                            f"and {t['writer']['mutations_per_commit']:.1f} mutations each, busy "
                                            f"{t['writer']['busy_fraction']:.0%} of the time"),
        ("  until the last gang ended", f"{t['drain_s']:.1f} s after the loop"),
        *cpu_rows(t["cpu"]),
        ("  errors", f"{t['error_count']} {t['errors'][:3] if t['errors'] else ''}".strip()),
        ("daemon start", f"{res['daemon_start_s']:.1f} s"),
        ("daemon RSS idle / after / peak",
         f"{res['daemon_rss_idle_mib']:.0f} / {res['daemon_rss_mib']:.0f} / {res['daemon_rss_peak_mib']:.0f} MiB"),
        ("daemon loop errors", f"{res['loop_errors']:.0f}"),
        ("gang launches ok / refused / failed", " / ".join(f"{v:,.0f}" for v in res["gang_launches"].values())),
    ]
    if res["profile"]:
        rows += profile_rows(res["profile"])
    print(f"sim backend end to end, {a.store}{' (' + res['driver'] + ')' if res['driver'] else ''}: {res['workload']}")
    print(table(rows))
    print(f"  json: {write_results(f'sim-{a.store}', res, a.json)}")


if __name__ == "__main__":
    main()
