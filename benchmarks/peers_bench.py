"""Benchmark 13: peloton side by side with Slurm on one workload, one driver, one clock, one JSON.

    .venv/bin/python benchmarks/peers_bench.py [--peers peloton-sqlite,peloton-postgresql,slurm]

The workload (issue 24): `--hosts` hosts x 8 GPUs, gangs whose members take 1 GPU + 1 CPU each and run `sleep`.
For each peer, in turn, driven by this one process with one clock (`time.perf_counter`):

- latency by gang size, one request outstanding: request -> every member running (and the gang ended before the
  next request);
- `--submitters` closed-loop submitters of `--size`-member gangs for `--seconds`: gangs/s and members/s;
- the fill: `--fill-gangs` gangs of seeded sizes (1-16) and durations (0.5-1.5 s) submitted at once; the makespan
  until the last has ended, against the bound sum(size x duration) / GPUs;
- stop: a running gang stopped (StopJob / `scancel`) -> every member ended.

peloton runs its local backend (simulated hosts, members are real processes) on SQLite and on PostgreSQL. Slurm
runs from the Debian packages: `slurmctld`, one `slurmd -N` per host on loopback and `munged`, with their own
`slurm.conf`, `gres.conf` (8 file-backed fake GPUs per host) and key in a scratch dir; a gang is `salloc -n SIZE
--gpus-per-task=1 --cpus-per-task=1 srun -v sleep S`, running when srun has reported every member started. This
benchmark installs nothing: without Slurm it says how to install it and skips that peer. Asserts nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import (  # noqa: E402
    Daemon,
    _machine_jiffies,
    free_port,
    gang_spec,
    proc_cpu_seconds,
    run_clients,
    summary,
    table,
    write_results,
)
from peloton.api.v1 import job_pb2, job_pb2_grpc  # noqa: E402

GPUS_PER_HOST = 8
SLURM_PROGRAMS = ("slurmctld", "slurmd", "salloc", "srun", "scancel", "sinfo", "squeue", "munged")
SLURM_INSTALL = "apt-get install -y slurmctld slurmd slurm-client munge"
FILL_SIZES = (1, 2, 4, 8, 16)
FILL_DURATIONS_S = (0.5, 1.5)


# -- the pure parts (tests/unit/test_peers_bench.py) ------------------------------------------------------------------

def fill_plan(n: int, seed: int) -> list[tuple[int, float]]:
    """The fill's gangs, the same for every peer: (members, seconds each member runs)."""
    rng = random.Random(seed)
    return [(rng.choice(FILL_SIZES), round(rng.uniform(*FILL_DURATIONS_S), 2)) for _ in range(n)]


def fill_bound(plan: list[tuple[int, float]], gpus: int) -> float:
    """No schedule finishes the fill sooner: every GPU busy all along, and no gang shorter than its members."""
    if not plan:
        return 0.0
    return max(sum(size * secs for size, secs in plan) / gpus, max(secs for _, secs in plan))


_GRANTED = re.compile(r"^salloc: Granted job allocation (\d+)")
_STARTED = re.compile(r"_task_start: Node \S+, (\d+) tasks started")


def slurm_granted(line: str) -> int | None:
    """The job id of salloc's `Granted job allocation N` line, else None."""
    m = _GRANTED.match(line)
    return int(m.group(1)) if m else None


def slurm_started(line: str) -> int:
    """How many members `srun -v` reports started on one node in this line (0 for any other line)."""
    m = _STARTED.search(line)
    return int(m.group(1)) if m else 0


# -- a gang, whichever peer runs it ----------------------------------------------------------------------------------

class Gang(Protocol):
    def running(self, timeout: float) -> float:
        """When (perf_counter) every member was running."""

    def ended(self, timeout: float) -> float:
        """When (perf_counter) the gang had ended, every member gone."""

    def ok(self) -> bool:
        """Whether it ended well (after `ended`)."""

    def stop(self) -> None: ...


class Peer(Protocol):
    name: str

    def submit(self, size: int, seconds: float) -> Gang: ...

    def server_cpu_s(self) -> float:
        """CPU seconds so far of the peer's own processes (the daemon; slurmctld, slurmd and munged)."""


# -- peloton -------------------------------------------------------------------------------------------------------

class StateWatch:
    """One WatchJobs stream: when (perf_counter) each job first reached each state, so a gang's running and its
    end can both be waited for (harness.JobWatch keeps one waiter a job)."""

    def __init__(self, channel: grpc.Channel) -> None:
        self._cv = threading.Condition()
        self._at: dict[str, dict[str, float]] = {}
        self._call = job_pb2_grpc.JobServiceStub(channel).WatchJobs(job_pb2.WatchJobsRequest())
        threading.Thread(target=self._run, daemon=True, name="peers-watch").start()

    def _run(self) -> None:
        with contextlib.suppress(grpc.RpcError):
            for msg in self._call:
                now = time.perf_counter()
                with self._cv:
                    for c in msg.changes:
                        self._at.setdefault(c.job_id, {}).setdefault(c.state, now)
                    self._cv.notify_all()

    def wait(self, job_id: str, states: tuple[str, ...], timeout: float) -> tuple[str, float]:
        """The first of `states` the job reached, and when."""
        deadline = time.monotonic() + timeout
        with self._cv:
            while True:
                seen = [(t, st) for st, t in self._at.get(job_id, {}).items() if st in states]
                if seen:
                    t, st = min(seen)
                    return st, t
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"job {job_id}: none of {states} in {timeout:.0f} s")
                self._cv.wait(left)

    def close(self) -> None:
        self._call.cancel()


_ENDED = ("SUCCEEDED", "FAILED", "KILLED", "LOST")


@dataclass
class PelotonGang:
    stub: job_pb2_grpc.JobServiceStub
    watch: StateWatch
    job_id: str

    def running(self, timeout: float) -> float:
        return self.watch.wait(self.job_id, ("RUNNING", *_ENDED), timeout)[1]

    def ended(self, timeout: float) -> float:
        return self.watch.wait(self.job_id, _ENDED, timeout)[1]

    def ok(self) -> bool:
        return self.watch.wait(self.job_id, _ENDED, 0)[0] == "SUCCEEDED"

    def stop(self) -> None:
        self.stub.StopJob(job_pb2.StopJobRequest(job_id=self.job_id), timeout=30)


class PelotonPeer:
    def __init__(self, store: str, hosts: int) -> None:
        self.name = f"peloton-{store}"
        self.daemon = Daemon(["--local-hosts", str(hosts), "--local-host-resources",
                              f"cpu=64,mem=256Gi,gpu={GPUS_PER_HOST}"], store=store)
        self.channel: grpc.Channel | None = None

    @contextlib.contextmanager
    def up(self) -> Iterator[PelotonPeer]:
        self.daemon.start()
        try:
            self.channel = grpc.insecure_channel(self.daemon.address)
            self.stub = job_pb2_grpc.JobServiceStub(self.channel)
            self.watch = StateWatch(self.channel)
            yield self
        finally:
            if self.channel is not None:
                self.watch.close()
                self.channel.close()
            self.daemon.stop()

    def submit(self, size: int, seconds: float) -> Gang:
        spec = gang_spec(size, f"sleep {seconds}", name="peers-bench")
        jid = str(self.stub.CreateJob(job_pb2.CreateJobRequest(spec=spec), timeout=60).job_id)
        return PelotonGang(self.stub, self.watch, jid)

    def server_cpu_s(self) -> float:
        return self.daemon.cpu_seconds()


# -- Slurm ---------------------------------------------------------------------------------------------------------

def slurm_missing() -> list[str]:
    return [p for p in SLURM_PROGRAMS if shutil.which(p) is None]


@dataclass
class SlurmGang:
    proc: subprocess.Popen[str]
    size: int
    job_id: int | None = None
    granted_at: float | None = None
    run: Future[float] = field(default_factory=Future)
    end: Future[float] = field(default_factory=Future)
    lines: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)  # SLURM_CONF, for scancel
    stopping: bool = False

    def read(self) -> None:
        """salloc's and srun's stderr, line by line, until they exit (one thread per gang)."""
        started = 0
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            now = time.perf_counter()
            if len(self.lines) < 50:
                self.lines.append(line.rstrip())
            jid = slurm_granted(line)
            if jid is not None:
                self.job_id, self.granted_at = jid, now
            started += slurm_started(line)
            if self.granted_at is not None and started >= self.size and not self.run.done():
                self.run.set_result(now)
            if self.size == 0 and self.stopping and "has been revoked" in line and not self.end.done():
                self.end.set_result(now)  # allocation only, stopped: it has ended once released
                with contextlib.suppress(OSError):  # and salloc's own sleep with it
                    os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        now = time.perf_counter()
        if not self.run.done():
            self.run.set_exception(RuntimeError(f"salloc ended ({self.proc.returncode}) before every member ran: "
                                                + " | ".join(self.lines[-5:])))
        if not self.end.done():
            self.end.set_result(now)

    def running(self, timeout: float) -> float:
        return self.run.result(timeout)

    def ended(self, timeout: float) -> float:
        return self.end.result(timeout)

    def ok(self) -> bool:
        return self.proc.returncode == 0

    def stop(self) -> None:
        self.stopping = True
        if self.job_id is not None:
            subprocess.run(["scancel", str(self.job_id)], env=self.env, check=False)


class SlurmPeer:
    """slurmctld, `hosts` slurmd (`-N n<i>`, each on its own loopback port) and munged, in a scratch dir."""

    name = "slurm"

    def __init__(self, hosts: int, launch: str = "srun", sched_params: str = "") -> None:
        self.hosts = hosts
        self.sched_params = sched_params  # slurm.conf's SchedulerParameters, when given
        self.launch = launch  # srun: the members run on the nodes; none: allocation only (salloc runs one sleep)
        self.dir = Path(tempfile.mkdtemp(prefix="peloton-peers-slurm-"))
        self.procs: list[subprocess.Popen[bytes]] = []
        self.names: list[str] = []  # of procs, for messages
        self.sallocs: list[subprocess.Popen[str]] = []
        self.env = {**os.environ, "SLURM_CONF": str(self.dir / "slurm.conf")}

    def _write_config(self) -> None:
        d, me = self.dir, getpass.getuser()
        host = socket.gethostname().split(".")[0]
        for sub in ("state", "log", "dev", *(f"spool/n{i}" for i in range(1, self.hosts + 1))):
            (d / sub).mkdir(parents=True, exist_ok=True)
        key = d / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        for g in range(GPUS_PER_HOST):  # Slurm drops a GPU without a File; task/none never opens it
            (d / "dev" / f"gpu{g}").touch()
        (d / "gres.conf").write_text(f"NodeName=n[1-{self.hosts}] Name=gpu File={d}/dev/gpu[0-{GPUS_PER_HOST - 1}]\n")
        nodes = "\n".join(f"NodeName=n{i} NodeHostname={host} NodeAddr=127.0.0.1 Port={free_port()} CPUs=64 "
                          f"RealMemory=262144 Gres=gpu:{GPUS_PER_HOST} State=UNKNOWN" for i in range(1, self.hosts + 1))
        (d / "slurm.conf").write_text(f"""\
ClusterName=peers
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
AuthType=auth/munge
AuthInfo=socket={d}/munge.socket
CredType=cred/munge
SlurmUser={me}
SlurmdUser={me}
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd-%n.log
SlurmctldDebug=error
SlurmdDebug=error
ProctrackType=proctrack/pgid
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
GresTypes=gpu
SchedulerType=sched/backfill
{f"SchedulerParameters={self.sched_params}" if self.sched_params else ""}
MpiDefault=none
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SwitchType=switch/none
SlurmdParameters=config_overrides
PlugStackConfig=/dev/null
{nodes}
PartitionName=bench Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")

    def _start(self, *argv: str) -> None:
        with open(self.dir / "log" / f"{Path(argv[0]).name}-{len(self.procs)}.err", "wb") as err:  # the child's copy stays
            self.procs.append(subprocess.Popen(list(argv), env=self.env, stdout=subprocess.DEVNULL, stderr=err))
        self.names.append(" ".join(argv[:1] + argv[-2:] if argv[0] == "slurmd" else argv[:1]))

    @contextlib.contextmanager
    def up(self) -> Iterator[SlurmPeer]:
        d = self.dir
        try:
            self._write_config()
            self._start("munged", "-F", "-f", f"--socket={d}/munge.socket", f"--key-file={d}/munge.key",
                        f"--log-file={d}/log/munged.log", f"--pid-file={d}/munged.pid", f"--seed-file={d}/munged.seed")
            self._wait(lambda: (d / "munge.socket").exists(), "munged's socket", 15)
            self._start("slurmctld", "-D", "-c", "-i", "-f", str(d / "slurm.conf"))
            for i in range(1, self.hosts + 1):
                self._start("slurmd", "-D", "-f", str(d / "slurm.conf"), "-N", f"n{i}")
            self._wait(self._all_idle, f"{self.hosts} idle Slurm nodes", 60)
            yield self
        finally:
            self._stop()

    def _all_idle(self) -> bool:
        r = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], env=self.env, capture_output=True, text=True,
                           check=False, timeout=30)
        states = r.stdout.split()
        return r.returncode == 0 and len(states) == self.hosts and all(s == "idle" for s in states)

    def _wait(self, cond: Callable[[], bool], what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        dead: list[str] = []
        while time.monotonic() < deadline and not dead:
            if cond():
                return
            dead = [n for n, p in zip(self.names, self.procs, strict=True) if p.poll() is not None]  # no use waiting
            time.sleep(0.2)
        logs = "".join(f"\n--- {f.name}\n{f.read_text(errors='replace')[-1500:]}"
                       for f in sorted((self.dir / "log").iterdir()))
        why = f"{', '.join(dead)} exited" if dead else f"not after {timeout:.0f} s"
        raise RuntimeError(f"Slurm: no {what}: {why} (scratch dir {self.dir}){logs}")

    def _stop(self) -> None:
        with contextlib.suppress(OSError, subprocess.SubprocessError, RuntimeError):
            subprocess.run(["scancel", "--full", "--user", getpass.getuser()], env=self.env, check=False, timeout=30,
                           capture_output=True)
            # the jobs' steps end while their slurmd is still there to end them (else slurmstepd outlives it)
            self._wait(lambda: not subprocess.run(["squeue", "-h"], env=self.env, capture_output=True, text=True,
                                                  check=False, timeout=30).stdout.strip(), "empty queue", 20)
        for sa in self.sallocs:
            if sa.poll() is None:
                with contextlib.suppress(OSError):
                    os.killpg(sa.pid, signal.SIGKILL)
        for p in reversed(self.procs):  # slurmd, then slurmctld, then munged
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in reversed(self.procs):
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)

    def submit(self, size: int, seconds: float) -> Gang:
        members = ["srun", "-v"] if self.launch == "srun" else []
        proc = subprocess.Popen(["salloc", "-n", str(size), "--cpus-per-task=1", "--gpus-per-task=1", *members,
                                 "sleep", str(seconds)], env=self.env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)  # its group: salloc and its command, killed together
        self.sallocs.append(proc)
        # allocation only: "running" once granted (no member is started on a node)
        g = SlurmGang(proc, size if self.launch == "srun" else 0, env=self.env)
        threading.Thread(target=g.read, daemon=True, name="salloc-reader").start()
        return g

    def server_cpu_s(self) -> float:
        return sum(proc_cpu_seconds(p.pid) for p in self.procs)


# -- the scenarios, the same for every peer ------------------------------------------------------------------------

def latency_by_size(peer: Peer, sizes: list[int], n: int, sleep_s: float) -> dict[str, dict[str, Any]]:
    """Per size: request -> every member running; for Slurm also request -> allocation granted (`allocated`)."""
    out: dict[str, dict[str, Any]] = {}
    for size in sizes:
        samples, granted = [], []
        for _ in range(n):
            t0 = time.perf_counter()
            g = peer.submit(size, sleep_s)
            samples.append(g.running(120) - t0)
            g.ended(120)
            if isinstance(g, SlurmGang) and g.granted_at is not None:
                granted.append(g.granted_at - t0)
        out[str(size)] = {**summary(samples), **({"allocated": summary(granted)} if granted else {})}
    return out


def throughput(peer: Peer, submitters: int, size: int, seconds: float, sleep_s: float) -> dict[str, float]:
    stop = time.monotonic() + seconds
    lat: list[float] = []
    gangs: list[Gang] = []
    lock = threading.Lock()

    def loop(_k: int) -> None:
        while time.monotonic() < stop:
            t0 = time.perf_counter()
            g = peer.submit(size, sleep_s)
            t1 = g.running(120)
            with lock:
                lat.append(t1 - t0)
                gangs.append(g)

    busy0, _ = _machine_jiffies()
    cpu0 = peer.server_cpu_s()
    elapsed = run_clients(loop, submitters)
    for g in gangs:  # their whole life counts in the CPU figures
        g.ended(120)
    cpu = peer.server_cpu_s() - cpu0
    busy1, _ = _machine_jiffies()
    n = max(len(gangs), 1)
    s = summary(lat)
    return {"submitters": submitters, "size": size, "seconds": elapsed, "gangs": len(gangs),
            "gangs_per_s": len(gangs) / elapsed, "members_per_s": size * len(gangs) / elapsed,
            "latency_p50_ms": s["p50_ms"], "latency_p99_ms": s["p99_ms"],
            "failed": sum(not g.ok() for g in gangs),
            "server_cpu_ms_per_gang": 1000 * cpu / n,
            "machine_cpu_ms_per_gang": 1000 * (busy1 - busy0) / os.sysconf("SC_CLK_TCK") / n}


def fill(peer: Peer, plan: list[tuple[int, float]], gpus: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=32) as pool:  # as many clients as a burst of users; Popen is quick
        gangs = list(pool.map(lambda p: peer.submit(*p), plan))
    accepted = time.perf_counter() - t0
    last = max(g.ended(900) for g in gangs)
    return {"gangs": len(plan), "members": sum(s for s, _ in plan), "gpu_s": sum(s * d for s, d in plan),
            "all_submitted_s": accepted, "makespan_s": last - t0, "bound_s": fill_bound(plan, gpus),
            "failed": sum(not g.ok() for g in gangs)}


def stop_to_end(peer: Peer, n: int, size: int) -> dict[str, float]:
    samples = []
    for _ in range(n):
        g = peer.submit(size, 600)
        g.running(120)
        t0 = time.perf_counter()
        g.stop()
        samples.append(g.ended(60) - t0)
    return summary(samples)


def run_peer(peer: PelotonPeer | SlurmPeer, a: argparse.Namespace) -> dict[str, Any]:
    print(f"  {peer.name}: running", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    with peer.up():
        setup = time.perf_counter() - t0
        latency_by_size(peer, [a.size], 3, a.sleep)  # warm-up
        return {"setup_s": setup,
                "latency_by_size": latency_by_size(peer, a.sizes, a.samples, a.sleep),
                "throughput": throughput(peer, a.submitters, a.size, a.seconds, a.sleep),
                "fill": fill(peer, fill_plan(a.fill_gangs, a.seed), a.hosts * GPUS_PER_HOST),
                "stop": stop_to_end(peer, a.stop_samples, a.size)}


def rows(results: dict[str, Any]) -> list[tuple[str, str]]:
    names = list(results)
    out = [("", "  |  ".join(names))]

    def line(label: str, f: Callable[[dict[str, Any]], str]) -> None:
        out.append((label, "  |  ".join(f(results[n]) if "skipped" not in results[n] else "skipped" for n in names)))

    sizes = next((list(r["latency_by_size"]) for r in results.values() if "latency_by_size" in r), [])
    def running(s: str) -> Callable[[dict[str, Any]], str]:
        return lambda r: f"{r['latency_by_size'][s]['p50_ms']:.1f} / {r['latency_by_size'][s]['p99_ms']:.1f} ms"

    def allocated(s: str) -> Callable[[dict[str, Any]], str]:
        return lambda r: (f"{r['latency_by_size'][s]['allocated']['p50_ms']:.1f} ms"
                          if "allocated" in r["latency_by_size"][s] else "-")

    for s in sizes:
        line(f"request -> {s} running, p50 / p99", running(s))
    if any("allocated" in v for r in results.values() for v in r.get("latency_by_size", {}).values()):
        for s in sizes:
            line(f"  request -> {s} allocated (Slurm), p50", allocated(s))
    line("closed loop: gangs/s (members/s)",
         lambda r: f"{r['throughput']['gangs_per_s']:.1f} ({r['throughput']['members_per_s']:.0f})")
    line("  latency under load p50 / p99",
         lambda r: f"{r['throughput']['latency_p50_ms']:.1f} / {r['throughput']['latency_p99_ms']:.1f} ms")
    line("  server / machine CPU per gang",
         lambda r: f"{r['throughput']['server_cpu_ms_per_gang']:.1f} / {r['throughput']['machine_cpu_ms_per_gang']:.1f} ms")
    line("fill: makespan (bound)", lambda r: f"{r['fill']['makespan_s']:.1f} s ({r['fill']['bound_s']:.1f} s)")
    line("fill: all submitted, failed", lambda r: f"{r['fill']['all_submitted_s']:.2f} s, {r['fill']['failed']}")
    line("stop -> ended p50 / p99", lambda r: f"{r['stop']['p50_ms']:.1f} / {r['stop']['p99_ms']:.1f} ms")
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--peers", default="peloton-sqlite,peloton-postgresql,slurm",
                    help="comma-separated, in this order: peloton-sqlite, peloton-postgresql, slurm")
    ap.add_argument("--hosts", type=int, default=8, help="hosts of 8 GPUs each")
    ap.add_argument("--sizes", default="1,2,4,8,16", help="gang sizes of the latency measurement")
    ap.add_argument("--samples", type=int, default=20, help="latency samples per gang size")
    ap.add_argument("--sleep", type=float, default=0.05, help="seconds each member runs (latency, closed loop)")
    ap.add_argument("--submitters", type=int, default=4)
    ap.add_argument("--size", type=int, default=8, help="members per gang in the closed loop and the stop")
    ap.add_argument("--seconds", type=float, default=20.0, help="length of the closed loop")
    ap.add_argument("--fill-gangs", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0, help="of the fill's sizes and durations")
    ap.add_argument("--stop-samples", type=int, default=10)
    ap.add_argument("--slurm-launch", choices=["srun", "none"], default="srun",
                    help="srun: a Slurm gang runs when srun has started every member on the nodes; none: when salloc "
                         "is granted the allocation (no member started; salloc itself runs one sleep)")
    ap.add_argument("--slurm-sched-params", default="batch_sched_delay=0",
                    help="slurm.conf's SchedulerParameters ('' for Slurm's defaults: a job that could not start at "
                         "once waits for the next scheduling pass, up to batch_sched_delay=3 s)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    a.sizes = [int(s) for s in a.sizes.split(",") if s.strip()]
    known = {"peloton-sqlite", "peloton-postgresql", "slurm"}
    peers = [p.strip() for p in a.peers.split(",") if p.strip()]
    if not peers or set(peers) - known:
        ap.error(f"--peers: expected some of {', '.join(sorted(known))}, got {a.peers!r}")
    results: dict[str, Any] = {}
    for name in peers:
        if name == "slurm":
            missing = slurm_missing()
            if missing:
                why = (f"not installed ({', '.join(missing)} not on PATH); this benchmark installs nothing. "
                       f"On Debian/Ubuntu, as root: `{SLURM_INSTALL}`")
                print(f"  slurm: skipped: {why}", file=sys.stderr)
                results[name] = {"skipped": why}
                continue
            results[name] = run_peer(SlurmPeer(a.hosts, a.slurm_launch, a.slurm_sched_params), a)
        else:
            results[name] = run_peer(PelotonPeer(name.removeprefix("peloton-"), a.hosts), a)
    res = {"workload": f"{a.hosts} hosts x {GPUS_PER_HOST} GPUs; gang members take 1 GPU + 1 CPU and run sleep",
           "peers": results, "parameters": {k: v for k, v in vars(a).items() if k != "json"}}
    print(f"side by side: {res['workload']}")
    print(table(rows(results)))
    print(f"  json: {write_results('peers', res, a.json)}")
    return res


if __name__ == "__main__":
    main()
