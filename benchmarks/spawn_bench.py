"""Benchmark 7: what starting a task costs the local backend's spawner, by how the task is contained (no daemon, no
store), through a real spawner process: the plain wrapper (its process group only, as before cgroups), a cgroup per
task (the spawner makes the cgroup, starts the wrapper gated, replies, then moves the wrapper in and lets it go:
the reply is what is timed), and a child subreaper (fork, prctl, exec). Batches of `--batch` tasks (a gang)
running `true`, 50 ms apart, as the daemon's own user and, as root, as `nobody`. Then a task cgroup's own steps.
Prints a table and writes JSON; asserts nothing.

    .venv/bin/python benchmarks/spawn_bench.py [--batches 40] [--batch 8] [--rounds 3]
"""

from __future__ import annotations

import argparse
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


def run(mode: str, user: str, batches: int, batch: int, root: Path) -> dict[str, float]:
    cg = None
    if mode == "cgroup":
        cg, _ = cgroups.probe(root)
        if cg is None:
            return {"skipped": 1.0}
    pool = SpawnerPool(1, inherited(os.environ))
    per_task: list[float] = []
    fds: list[int] = []
    parent = root / mode / (user or "self")
    parent.mkdir(mode=0o711, parents=True, exist_ok=True)  # prepare() makes the sandbox, not the dirs above it
    try:
        for b in range(batches + 1):  # the first batch starts the spawner: not counted
            tasks: list[dict[str, object]] = []
            for i in range(batch):
                sandbox = parent / f"t{b}-{i}"
                task: dict[str, object] = {"sandbox": str(sandbox), "command": "true", "env": {}, "files": {},
                                           "user": user, "root_allowed": False}
                if mode == "cgroup":
                    assert cg is not None
                    task["cgroup"] = cg.new_path(f"t{b}-{i}")
                elif mode == "subreaper":
                    task["subreaper"] = True
                tasks.append(task)
            t0 = time.perf_counter()
            results = pool.spawn(tasks)
            took = time.perf_counter() - t0
            assert all(isinstance(r, Started) for r in results), results
            fds += [r.pidfd for r in results if isinstance(r, Started) and r.pidfd is not None]
            if b:
                per_task.append(took / batch * 1000)
            time.sleep(0.05)  # let them end: the next batch is timed on a quiet spawner
            for t in tasks:  # as the daemon does once a wrapper ended (not timed: not on the launch's path)
                if "cgroup" in t:
                    cgroups.kill(str(t["cgroup"]))
                    cgroups.remove(str(t["cgroup"]))
    finally:
        pool.close()
        for fd in fds:
            os.close(fd)
        if cg is not None:
            cgroups.kill_and_remove_subtree(root)
    return {"ms_per_task_p50": statistics.median(per_task), "ms_per_task_mean": statistics.fmean(per_task),
            "ms_per_task_min": min(per_task)}


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
    ap.add_argument("--rounds", type=int, default=3, help="the modes are measured in turn this many times")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    users = [""] + (["nobody"] if os.geteuid() == 0 else [])
    modes = ("plain", "cgroup", "subreaper")
    root = Path(tempfile.mkdtemp(prefix="peloton-spawn-bench-"))
    os.chmod(root, 0o711)
    out: dict[str, dict[str, float]] = {}
    try:
        samples: dict[str, list[dict[str, float]]] = {}
        for _ in range(a.rounds):  # interleaved, so that the machine's load hits every mode alike
            for user in users:
                for mode in modes:
                    samples.setdefault(f"{mode}/{user or 'self'}", []).append(run(mode, user, a.batches, a.batch,
                                                                                   root))
        steps = cgroup_steps(200, root)
        for key, runs in samples.items():
            if any("skipped" in r for r in runs):
                out[key] = {"skipped": 1.0}
                continue
            out[key] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"spawner: ms per task started, batches of {a.batch} (`true`), median of {a.rounds} rounds")
    for key, r in out.items():
        if "skipped" in r:
            print(f"  {key:22} skipped (no cgroup v2 here)")
        else:
            print(f"  {key:22} p50 {r['ms_per_task_p50']:.3f}  mean {r['ms_per_task_mean']:.3f}  "
                  f"min {r['ms_per_task_min']:.3f}")
    if steps:
        print("  a task's cgroup, step by step (ms, p50): " + ", ".join(f"{k} {v:.3f}" for k, v in steps.items()))
    path = write_results("spawn", {"modes": out, "cgroup_steps_ms": steps, "parameters": vars(a)}, a.json)
    print(f"  json: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
