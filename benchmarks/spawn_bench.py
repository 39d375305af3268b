"""Benchmark 7: what starting a task costs the local backend's spawner, by how the task is contained (no daemon, no
store), through a real spawner process: the plain wrapper (its process group only, as before cgroups), a cgroup per
task (the spawner makes the cgroup, starts the wrapper gated, replies, then moves the wrapper in and lets it go:
the reply is what is timed), and a child subreaper (fork, prctl, exec); and the plain and cgroup ways with the
batch split over 4 spawners, as a launch does (`x4`). Batches of `--batch` tasks (a gang) running `true`, 50 ms
apart, every way in turn, as the daemon's own user and, as root, as `nobody`; beside each way's time a task, its
CPU a task, from a batch's start until its tasks ended and their cgroups went: the spawners, the users' launchers,
the wrappers, `true` and this process (counted in a cgroup v2 of the benchmark's own, so other work on the machine is
not; without cgroup v2, the whole machine's busy time). Then a task cgroup's own steps.
Prints a table and writes JSON; asserts nothing.

    .venv/bin/python benchmarks/spawn_bench.py [--batches 40] [--batch 8] [--rounds 3]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import write_results  # noqa: E402
from peloton.hostmgr.local import cgroups  # noqa: E402
from peloton.hostmgr.local.spawn import SpawnerPool, Started  # noqa: E402
from peloton.hostmgr.local.task_env import inherited  # noqa: E402


class Runner:
    """One way of starting tasks (a mode, a user, how many spawners), with its own spawner pool; `batch()` starts
    and times one batch. `spawners` > 1: the batch is split over them as a launch does (spawn_many)."""

    def __init__(self, mode: str, user: str, spawners: int, root: Path) -> None:
        self.mode, self.user, self.spawners = mode, user, spawners
        self.cg = None
        self.skipped = False
        if mode == "cgroup":
            self.cg, _ = cgroups.probe(root)
            self.skipped = self.cg is None
        self.pool = SpawnerPool(spawners, inherited(os.environ))
        self.per_task: list[float] = []
        self.machine_cpu_ms = 0.0  # the whole machine's CPU over the counted batches' windows (machine_cpu_ms())
        self.counted = 0
        self.fds: list[int] = []
        self.parent = root / f"{mode}-{spawners}" / (user or "self")
        self.parent.mkdir(mode=0o711, parents=True, exist_ok=True)  # prepare() makes the sandbox, not its parents
        self.n = 0

    @property
    def key(self) -> str:
        return f"{self.mode}{'' if self.spawners == 1 else f' x{self.spawners}'}/{self.user or 'self'}"

    def batch(self, size: int, counted: bool) -> None:
        tasks: list[dict[str, object]] = []
        for _ in range(size):
            self.n += 1
            task: dict[str, object] = {"sandbox": str(self.parent / f"t{self.n}"), "command": "true", "env": {},
                                       "files": {}, "user": self.user, "root_allowed": False}
            if self.cg is not None:
                task["cgroup"] = self.cg.new_path(f"t{self.n}")
            elif self.mode == "subreaper":
                task["subreaper"] = True
            tasks.append(task)
        t0 = time.perf_counter()
        results: list[object] = list(self.pool.spawn(tasks) if self.spawners == 1 else self.pool.spawn_many(tasks))
        took = time.perf_counter() - t0
        assert all(isinstance(r, Started) for r in results), results
        self.fds += [r.pidfd for r in results if isinstance(r, Started) and r.pidfd is not None]
        if counted:
            self.per_task.append(took / size * 1000)
        self._tasks = tasks

    def after(self) -> None:
        for t in self._tasks:  # as the daemon does once a wrapper ended (not timed: not on the launch's path)
            if "cgroup" in t:
                cgroups.kill(str(t["cgroup"]))
                cgroups.remove(str(t["cgroup"]))

    def close(self) -> dict[str, float]:
        self.pool.close()
        for fd in self.fds:
            os.close(fd)
        return {"ms_per_task_p50": statistics.median(self.per_task),
                "ms_per_task_mean": statistics.fmean(self.per_task), "ms_per_task_min": min(self.per_task),
                "cpu_ms_per_task": self.machine_cpu_ms / max(1, self.counted)}


_TICK_MS = 1000 / os.sysconf("SC_CLK_TCK")
_OWN: list[str] = []  # this benchmark's own cgroup v2 (enter_own_cgroup), whose CPU counts everything it started


def enter_own_cgroup() -> str:
    """Move this process into a cgroup v2 of its own below its cgroup, so that the CPU of all it starts (spawners,
    launchers, wrappers, commands, wherever below it they are moved: the task cgroups are made below it too) is
    counted apart from the rest of the machine; '' where cgroup v2 cannot be used (then the machine's CPU)."""
    cg, _ = cgroups.probe(Path("/nonexistent/peloton-spawn-bench"))
    if cg is None:
        return ""
    cgroups.kill_and_remove_subtree(Path("/nonexistent/peloton-spawn-bench"))
    path = f"{cg.home}/peloton-spawn-bench-{os.getpid()}"
    try:
        os.mkdir(path, 0o755)
        with open(f"{path}/cgroup.procs", "w") as f:
            f.write(str(os.getpid()))
    except OSError:
        return ""
    _OWN.append(cg.home)
    _OWN.append(path)
    return path


def leave_own_cgroup() -> None:
    if _OWN:
        with open(f"{_OWN[0]}/cgroup.procs", "w") as f:
            f.write(str(os.getpid()))
        for d in sorted((dp for dp, _dirs, _files in os.walk(_OWN[1])), key=len, reverse=True):
            with contextlib.suppress(OSError):
                os.rmdir(d)


def machine_cpu_ms() -> float:
    """The CPU time of this benchmark's cgroup and all below it (enter_own_cgroup), in ms; without one, every
    core's busy time since boot (/proc/stat: all but idle and iowait)."""
    if _OWN:
        with open(f"{_OWN[1]}/cpu.stat", encoding="ascii") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("usage_usec")) / 1000
    with open("/proc/stat", encoding="ascii") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) * _TICK_MS


def run(runners: list[Runner], batches: int, batch: int) -> None:
    """Every runner a batch in turn (the order rotating), `batches` times after an uncounted first (which starts the
    spawners), 50 ms apart: the machine's load falls on every way alike."""
    for b in range(batches + 1):
        for k in range(len(runners)):
            r = runners[(b + k) % len(runners)]
            cpu0 = machine_cpu_ms()
            r.batch(batch, counted=b > 0)
            time.sleep(0.05)  # let them end: the next batch is timed on quiet spawners
            r.after()
            if b > 0:  # the batch's whole cost: the spawners, the launchers, the wrappers, `true`, the cleanup
                r.machine_cpu_ms += machine_cpu_ms() - cpu0
                r.counted += batch


def cgroup_steps(n: int, root: Path) -> dict[str, float]:
    """What a task's cgroup costs, step by step, in this process: mkdir, moving a process in (back to back, and
    after 50 ms without any move: then the kernel waits for an RCU grace period), and the daemon's kill and rmdir
    once it is empty. ms, medians."""
    import subprocess

    cg, _ = cgroups.probe(root)
    if cg is None:
        return {}
    child = subprocess.Popen(["sleep", "600"])
    steps: dict[str, list[float]] = {"mkdir": [], "move in, back to back": [], "move in, after 50 ms idle": [],
                                     "kill + rmdir": []}
    try:
        for i in range(n):
            path = cg.new_path(f"t{i}")
            idle = i % 2 == 1
            if idle:
                time.sleep(0.05)
            t0 = time.perf_counter()
            os.mkdir(path)
            t1 = time.perf_counter()
            with open(f"{path}/cgroup.procs", "w") as f:
                f.write(str(child.pid))
            t2 = time.perf_counter()
            with open(f"{cg.home}/cgroup.procs", "w") as f:  # out again (not timed), so that it can go
                f.write(str(child.pid))
            t3 = time.perf_counter()
            cgroups.kill(path)
            cgroups.remove(path)
            t4 = time.perf_counter()
            steps["mkdir"].append(t1 - t0)
            steps["move in, after 50 ms idle" if idle else "move in, back to back"].append(t2 - t1)
            steps["kill + rmdir"].append(t4 - t3)
    finally:
        child.kill()
        child.wait()
        cgroups.kill_and_remove_subtree(root)
    return {k: statistics.median(v) * 1000 for k, v in steps.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, default=40)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3, help="this many times --batches batches of every way, in turn")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    own = enter_own_cgroup()
    users = [""] + (["nobody"] if os.geteuid() == 0 else [])
    modes = ("plain", "cgroup", "subreaper")
    root = Path(tempfile.mkdtemp(prefix="peloton-spawn-bench-"))
    os.chmod(root, 0o711)
    out: dict[str, dict[str, float]] = {}
    try:
        runners = [Runner(mode, user, 1, root) for user in users for mode in modes]
        # a gang split over 4 spawners, as a launch does now (spawn_many; not in trees before issue 24)
        if hasattr(SpawnerPool, "spawn_many"):
            runners += [Runner(mode, user, 4, root) for user in users for mode in ("plain", "cgroup")]
        live = [r for r in runners if not r.skipped]
        samples: dict[str, list[dict[str, float]]] = {}
        try:
            for _ in range(a.rounds):
                run(live, a.batches, a.batch)
        finally:
            for r in live:
                samples[r.key] = [r.close()]
        for r in runners:
            if r.skipped:
                samples[r.key] = [{"skipped": 1.0}]
        for r in runners:
            if r.cg is not None:
                cgroups.kill_and_remove_subtree(root)
                break
        steps = cgroup_steps(200, root)
        for key, runs in samples.items():
            if any("skipped" in r for r in runs):
                out[key] = {"skipped": 1.0}
                continue
            out[key] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    finally:
        shutil.rmtree(root, ignore_errors=True)
        leave_own_cgroup()
    print(f"spawner: ms per task started, batches of {a.batch} (`true`), every way in turn, medians over "
          f"{a.rounds} x {a.batches} batches; CPU a task: "
          f"{'of this benchmark and all it started (its cgroup ' + own + ')' if own else 'the whole machine'}")
    for key, got in out.items():
        if "skipped" in got:
            print(f"  {key:24} skipped (no cgroup v2 here)")
        else:
            print(f"  {key:24} p50 {got['ms_per_task_p50']:.3f}  mean {got['ms_per_task_mean']:.3f}  "
                  f"min {got['ms_per_task_min']:.3f}   CPU {got['cpu_ms_per_task']:.2f} a task")
    if steps:
        print("  a task's cgroup, step by step (ms, p50): " + ", ".join(f"{k} {v:.3f}" for k, v in steps.items()))
    path = write_results("spawn", {"modes": out, "cgroup_steps_ms": steps, "parameters": vars(a)}, a.json)
    print(f"  json: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
