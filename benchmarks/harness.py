"""What the end-to-end benchmarks share: a real daemon in a subprocess, a gRPC client as a user's program would
use it, a watch that tells when each submitted job runs, and result output (a readable table and JSON).

Nothing here asserts a timing: benchmarks measure and print."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from peloton.api.v1 import job_pb2, job_pb2_grpc

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
PY_SPY_RATE = 200  # samples per second (Daemon.profiled)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_SETTING = re.compile(r"([a-z][a-z0-9_.]*)=(.*)")


def database_settings(settings: tuple[str, ...]) -> list[tuple[str, str]]:
    """KEY=VALUE settings as (key, value); ValueError naming one that is not."""
    out = []
    for kv in settings:
        m = _SETTING.fullmatch(kv)
        if m is None:
            raise ValueError(f"--pg-set: {kv!r} is not KEY=VALUE (a PostgreSQL setting's name, e.g. "
                             "log_min_duration_statement=0)")
        out.append((m.group(1), m.group(2)))
    return out


def set_database(url: str, settings: tuple[str, ...]) -> None:
    """ALTER DATABASE ... SET each KEY=VALUE on `url`'s database (the server refuses an unknown setting)."""
    pairs = database_settings(settings)
    if not pairs:
        return
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    name = make_url(url).database
    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            for key, value in pairs:
                conn.execute(text(f'ALTER DATABASE "{name}" SET {key} = ' + "'" + value.replace("'", "''") + "'"))
    finally:
        engine.dispose()
    print(f"  (database {name}: {', '.join(settings)})", file=sys.stderr)


@dataclass
class Daemon:
    """`peloton server` in a subprocess, with its own data dir (and database, for PostgreSQL)."""

    args: list[str]
    store: str = "sqlite"  # sqlite | postgresql
    data_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="peloton-bench-")))
    proc: subprocess.Popen[str] | None = None
    address: str = ""
    metrics: str = ""
    pg_url: str = ""
    console: str = ""  # the web console's URL, when its args ask for one (--ui-listen; none by default)
    root: Path = ROOT  # the checkout whose code the daemon runs (another tree's: an A/B against it)
    # KEY=VALUE server settings of the PostgreSQL database, as ALTER DATABASE ... SET (the daemon's connections pass
    # options of their own, so PGOPTIONS does not reach them): e.g. log_min_duration_statement=0 for pg_replay.py
    pg_settings: tuple[str, ...] = ()

    def start(self) -> Daemon:
        if self.store == "postgresql":
            sys.path.insert(0, str(ROOT))
            from tests.dbutil import fresh_postgres_url

            self.pg_url = fresh_postgres_url()
            set_database(self.pg_url, self.pg_settings)
            db = self.pg_url
        else:
            db = f"sqlite:///{self.data_dir}/peloton.db"
        mport = free_port()
        self.metrics = f"http://127.0.0.1:{mport}/metrics"
        log = open(self.data_dir / "daemon.log", "w")  # noqa: SIM115 - the child keeps it
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "peloton.cli.main", "server", "--listen", "127.0.0.1:0", "--db", db,
             "--data-dir", str(self.data_dir), "--metrics-listen", f"127.0.0.1:{mport}", "--log-level", "warning",
             # as root: the benchmark's clients call over TCP without tokens (its tasks run as nobody)
             *(["--insecure"] if os.geteuid() == 0 else []), "--ui-listen", "", *self.args],
            stdout=subprocess.PIPE, stderr=log, text=True, cwd=self.root,
        )
        assert self.proc.stdout is not None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            c = re.search(r"web console on (\S+)", line)
            if c:
                self.console = c.group(1)
            m = re.search(r"serving on (\S+)", line)
            if m:
                self.address = m.group(1)
                return self
        raise RuntimeError(f"daemon did not start: {(self.data_dir / 'daemon.log').read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        # nothing of the benchmark may keep running
        subprocess.run(["pkill", "-9", "-f", f"PELOTON_SANDBOX={self.data_dir}"], check=False)
        for pids in self.data_dir.glob("**/sandboxes/*/pids"):
            with contextlib.suppress(ValueError, OSError):
                os.killpg(int(pids.read_text().strip()), signal.SIGKILL)
        if (self.data_dir / "local").is_dir():  # and the task cgroups of its local backend (they outlive it)
            from peloton.hostmgr.local import cgroups

            cgroups.kill_and_remove_subtree(self.data_dir / "local")
        if self.pg_url:
            from tests.dbutil import drop_postgres_db

            drop_postgres_db(self.pg_url)

    def rss_mib(self) -> float:
        """Resident memory now (VmRSS)."""
        return self._status_mib("VmRSS:")

    def rss_peak_mib(self) -> float:
        """The highest resident memory since the daemon started (VmHWM)."""
        return self._status_mib("VmHWM:")

    def _status_mib(self, key: str) -> float:
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(key):
                return int(line.split()[1]) / 1024
        return 0.0

    def pg_backend_pids(self) -> list[int]:
        """The PostgreSQL server processes serving this daemon's database (empty for SQLite)."""
        if not self.pg_url:
            return []
        from sqlalchemy import create_engine, text
        from sqlalchemy.pool import NullPool

        engine = create_engine(self.pg_url, poolclass=NullPool)
        try:
            with engine.connect() as conn:
                rows = conn.execute(text("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                                         "AND pid <> pg_backend_pid()"))
                return [int(r[0]) for r in rows]
        finally:
            engine.dispose()

    def metric(self, name: str, **labels: str) -> float:
        """The sum of a Prometheus metric's samples with these labels."""
        text = urllib.request.urlopen(self.metrics, timeout=10).read().decode()
        total = 0.0
        for line in text.splitlines():
            if not line.startswith(name) or line.startswith("#"):
                continue
            m = re.match(r"([a-zA-Z_:]+)(\{[^}]*\})?\s+(\S+)", line)
            if not m or m.group(1) != name:
                continue
            got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
            if all(got.get(k) == v for k, v in labels.items()):
                total += float(m.group(3))
        return total

    def metric_samples(self, name: str) -> dict[tuple[tuple[str, str], ...], float]:
        """Every sample of a Prometheus metric: {its labels (sorted (name, value) pairs): value}."""
        text = urllib.request.urlopen(self.metrics, timeout=10).read().decode()
        out: dict[tuple[tuple[str, str], ...], float] = {}
        for line in text.splitlines():
            m = re.match(r"([a-zA-Z_:]+)(\{[^}]*\})?\s+(\S+)", line)
            if m and m.group(1) == name:
                out[tuple(sorted(re.findall(r'(\w+)="([^"]*)"', m.group(2) or "")))] = float(m.group(3))
        return out

    @contextlib.contextmanager
    def profiled(self, out: str | None) -> Iterator[None]:
        """py-spy (if installed) samples the daemon while the block runs (only the samples of threads holding the
    GIL) into `out`, in py-spy's raw (collapsed stacks) format: `profile_summary` reads it, and flamegraph.pl or
    speedscope.app open it."""
        if not out:
            yield
            return
        assert self.proc is not None
        exe = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
        if exe is None:
            print("  (--profile: py-spy is not installed (`.venv/bin/pip install py-spy`); not profiling)",
                  file=sys.stderr)
            yield
            return
        spy = subprocess.Popen([exe, "record", "--pid", str(self.proc.pid), "--rate", str(PY_SPY_RATE), "--format",
                                "raw", "-o", out, "--threads", "--nonblocking",
                                # PELOTON_PROFILE=wall: every thread's stack, waiting included (where a thread waits)
                                "--idle" if os.environ.get("PELOTON_PROFILE") == "wall" else "--gil"], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
        try:
            yield
        finally:
            spy.send_signal(signal.SIGINT)
            spy.wait(60)

    def cpu_seconds(self) -> float:
        assert self.proc is not None
        return proc_cpu_seconds(self.proc.pid)


def profile_summary(path: str, top: int = 15) -> dict[str, Any]:
    """What a `Daemon.profiled` file (py-spy raw, one `thread;frame;...;leaf COUNT` line per stack, GIL samples
    only) says: seconds the GIL was held, each thread's share, and the functions with the most samples, on top of
    the stack (self) and anywhere in it (inclusive)."""
    from collections import Counter

    own: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    total = 0
    with contextlib.suppress(OSError), open(path) as f:
        for line in f:
            stack, _, n_text = line.rstrip("\n").rpartition(" ")
            if not n_text.isdigit():
                continue
            n = int(n_text)
            frames = stack.split(";")
            total += n
            threads[re.sub(r"^thread \(\w+\): ", "", frames[0])] += n
            if len(frames) > 1:
                own[frames[-1]] += n
            for fr in set(frames[1:]):
                incl[fr] += n
    share = (lambda c: [(k, v / total) for k, v in c.most_common(top)]) if total else (lambda c: [])
    return {"file": path, "samples": total, "gil_held_s": total / PY_SPY_RATE, "threads": share(threads),
            "self": share(own), "inclusive": share(incl)}


def profile_rows(p: dict[str, Any], n: int = 8) -> list[tuple[str, str]]:
    if os.environ.get("PELOTON_PROFILE") == "wall":  # every thread's samples, waiting included
        rows = [("profile", f"{p['samples']} wall-clock samples of all threads, {p['file']}")]
    else:
        rows = [("profile", f"{p['samples']} GIL samples ({p['gil_held_s']:.1f} s held), {p['file']}")]
    rows += [(f"  thread {k}", f"{v:.0%}") for k, v in p["threads"][:4]]
    rows += [(f"  self  {v:4.0%}", k) for k, v in p["self"][:n]]
    # inclusive: skip the frames every thread has (bootstrap, run)
    rows += [(f"  incl  {v:4.0%}", k) for k, v in p["inclusive"] if "threading.py" not in k][:n]
    return rows


def proc_cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (all its threads); 0 when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _pids_named(name: str) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError):
                if (d / "comm").read_text().strip() == name:
                    out.append(int(d.name))
    return out


def _machine_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of every core since boot, from /proc/stat."""
    vals = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)  # idle + iowait
    total = sum(vals[:8])  # guest time is already in user
    return total - idle, total


class CpuMeter:
    """Who used the cores over a stretch of a benchmark: the daemon, this process (the clients, the watch), the
    PostgreSQL processes serving the daemon's database, every PostgreSQL process (WAL writer, checkpointer, other
    people's databases), and the whole machine (so what none of those used shows as `other`)."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self._start = self._snap()
        self._t0 = time.perf_counter()

    def _snap(self) -> dict[str, Any]:
        ru = resource.getrusage(resource.RUSAGE_SELF)
        pg_db = self.daemon.pg_backend_pids()
        pg_all = _pids_named("postgres")
        busy, total = _machine_jiffies()
        return {"daemon": self.daemon.cpu_seconds(), "clients": ru.ru_utime + ru.ru_stime,
                "pg_db": {p: proc_cpu_seconds(p) for p in pg_db}, "pg_all": {p: proc_cpu_seconds(p) for p in pg_all},
                "busy": busy, "total": total}

    def stop(self) -> dict[str, float]:
        """CPU seconds of each since the meter started, and the wall time; a PostgreSQL process that ended in
        between is not counted, one that started in between is counted whole."""
        end = self._snap()
        wall = time.perf_counter() - self._t0
        a = self._start
        hz = os.sysconf("SC_CLK_TCK")
        ncpu = os.cpu_count() or 1

        def pg(key: str) -> float:
            return sum(v - a[key].get(p, 0.0) for p, v in end[key].items())

        out = {"wall_s": wall, "daemon_cpu_s": end["daemon"] - a["daemon"],
               "clients_cpu_s": end["clients"] - a["clients"], "postgres_db_cpu_s": pg("pg_db"),
               "postgres_all_cpu_s": pg("pg_all"),
               "machine_busy_cpu_s": (end["busy"] - a["busy"]) / hz,
               "machine_capacity_cpu_s": (end["total"] - a["total"]) / hz, "cpus": ncpu}
        out["other_cpu_s"] = max(0.0, out["machine_busy_cpu_s"] - out["daemon_cpu_s"] - out["clients_cpu_s"]
                                 - out["postgres_all_cpu_s"])
        return out


def cpu_rows(c: dict[str, float]) -> list[tuple[str, str]]:
    """Table rows of a CpuMeter result: seconds and cores busy on average."""
    w = max(c["wall_s"], 1e-9)
    rows = [("daemon", "daemon_cpu_s"), ("clients (this process)", "clients_cpu_s"),
            ("postgres, this database", "postgres_db_cpu_s"), ("postgres, all processes", "postgres_all_cpu_s"),
            ("anything else on the machine", "other_cpu_s"), ("machine, all busy", "machine_busy_cpu_s")]
    return [(f"  cpu: {name}", f"{c[k]:.1f} s  ({c[k] / w:.2f} of {c['cpus']} cores)") for name, k in rows]


class JobWatch:
    """One WatchJobs stream for every job: resolves a future when a job reaches one of the states asked for."""

    def __init__(self, channel: grpc.Channel) -> None:
        self.stub = job_pb2_grpc.JobServiceStub(channel)
        self._lock = threading.Lock()
        self._waiting: dict[str, tuple[frozenset[str], Future[tuple[str, float]]]] = {}
        self._seen: dict[str, str] = {}
        self._call = self.stub.WatchJobs(job_pb2.WatchJobsRequest())
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with contextlib.suppress(grpc.RpcError):
            for msg in self._call:
                now = time.perf_counter()
                with self._lock:
                    for c in msg.changes:
                        self._seen[c.job_id] = c.state
                        w = self._waiting.get(c.job_id)
                        if w is not None and c.state in w[0]:
                            del self._waiting[c.job_id]
                            w[1].set_result((c.state, now))

    def when(self, job_id: str, *states: str) -> Future[tuple[str, float]]:
        fut: Future[tuple[str, float]] = Future()
        with self._lock:
            if self._seen.get(job_id) in states:
                fut.set_result((self._seen[job_id], time.perf_counter()))
            else:
                self._waiting[job_id] = (frozenset(states), fut)
        return fut

    def close(self) -> None:
        self._call.cancel()


def run_clients(client: Callable[[int], None], n: int) -> float:
    """`client(k)` in n threads at once (k = 0 .. n-1) until every one returns; the seconds that took."""
    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0


@dataclass
class ClosedLoop:
    """What `closed_loop_clients` saw: each gang as (job id, the first of the states waited for that it reached,
    seconds from submitting it to then), what the clients raised, and the seconds the clients ran."""

    gangs: list[tuple[str, str, float]]
    raised: list[str]
    seconds: float


def closed_loop_clients(create: Callable[[], str], watch: JobWatch, clients: int, until: float,
                        states: tuple[str, ...]) -> ClosedLoop:
    """`clients` users at once, each submitting a gang (`create` returns its job id), waiting until it reaches one
    of `states`, and submitting the next, until time.monotonic() passes `until`. A client that raises stops; the
    others go on."""
    gangs: list[tuple[str, str, float]] = []
    raised: list[str] = []
    lock = threading.Lock()

    def loop(_k: int) -> None:
        try:
            while time.monotonic() < until:
                t0 = time.perf_counter()
                jid = create()
                state, t1 = watch.when(jid, *states).result(120)
                with lock:
                    gangs.append((jid, state, t1 - t0))
        except Exception as e:  # noqa: BLE001 - reported; the other clients go on
            with lock:
                raised.append(f"{type(e).__name__}: {e}")

    seconds = run_clients(loop, clients)
    return ClosedLoop(gangs, raised, seconds)


def gang_spec(size: int, command: str, gpu: int = 1, cpu: float = 1.0, mem: str = "1Gi",
              env: dict[str, str] | None = None, name: str = "bench") -> job_pb2.JobSpec:
    spec = job_pb2.JobSpec(name=name, instances=size)
    spec.task.command = command
    spec.task.resources.cpu = cpu
    spec.task.resources.mem = mem
    spec.task.resources.gpu = gpu
    spec.gang.launch_timeout.FromSeconds(300)
    spec.retry.max_attempts = 1
    if env:
        spec.task.env.update(env)
    return spec


def percentile(xs: list[float], p: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def summary(xs: list[float]) -> dict[str, float]:
    return {"n": len(xs), "p50_ms": percentile(xs, 50) * 1000, "p99_ms": percentile(xs, 99) * 1000,
            "mean_ms": (statistics.fmean(xs) * 1000) if xs else float("nan")}


def machine() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
            "load_1m": os.getloadavg()[0]}


def write_results(name: str, results: dict[str, Any], path: str | None = None) -> Path:
    out = Path(path) if path else RESULTS / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"benchmark": name, "machine": machine(), "time": time.time(), **results}, indent=2))
    return out


def table(rows: list[tuple[str, str]]) -> str:
    w = max(len(k) for k, _ in rows)
    return "\n".join(f"  {k.ljust(w)}  {v}" for k, v in rows)


@contextlib.contextmanager
def throwaway_store(store: str, data_dir: Path) -> Iterator[str]:
    """A store for one run: `sqlite`, a file in `data_dir`; `postgresql`, a fresh database, dropped after it."""
    if store != "postgresql":
        yield f"sqlite:///{data_dir}/peloton.db"
        return
    sys.path.insert(0, str(ROOT))
    from tests.dbutil import drop_postgres_db, fresh_postgres_url

    url = fresh_postgres_url()
    try:
        yield url
    finally:
        drop_postgres_db(url)


@contextlib.contextmanager
def running(daemon: Daemon) -> Iterator[Daemon]:
    daemon.start()
    try:
        yield daemon
    finally:
        daemon.stop()
