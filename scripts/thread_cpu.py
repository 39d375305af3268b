"""The CPU time of each of a daemon's threads, by name, over its life: polls /proc/PID/task/*/stat (user + system
time of each thread) until the process ends, and names the threads with `py-spy dump` every few seconds (Python
threads have no OS names; py-spy is not a dependency: `.venv/bin/pip install py-spy`). Thread names' numbers are
folded (`jobmgr-writer-N`). Where py-spy's samples cannot say which threads were on a core (a thread blocked in C,
e.g. in libpq, looks busy to it), this can: the kernel counts each thread's CPU time.

    .venv/bin/python scripts/thread_cpu.py --pid PID [--json out.json]
    .venv/bin/python scripts/thread_cpu.py --parent PID    # the first `peloton ... server` started by PID

With a benchmark: start it, then `--parent` its pid (the benchmark's daemon is its child). The daemon's start
(MainThread loading the hosts) counts too: compare the threads that serve, not the total.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path


def _stat_fields(path: str) -> list[str]:
    return Path(path).read_text().rsplit(")", 1)[1].split()


def daemon_of(parent: int, timeout_s: float = 60.0) -> int:
    """The pid of the first `peloton ... server` process whose parent is `parent`."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        for p in filter(str.isdigit, os.listdir("/proc")):
            try:
                cmd = Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")
                if b"server" in cmd and any(b"peloton" in c for c in cmd) and int(_stat_fields(f"/proc/{p}/stat")[1]) == parent:
                    return int(p)
            except (OSError, IndexError, ValueError):
                continue
        time.sleep(0.2)
    raise SystemExit(f"no peloton server started by {parent} within {timeout_s:.0f} s")


def names(pid: int, spy: str) -> dict[int, str]:
    try:
        r = subprocess.run([spy, "dump", "--pid", str(pid), "--json", "--nonblocking"], capture_output=True, text=True,
                           timeout=10, check=False)
        return {t["os_thread_id"]: t.get("thread_name") or "?" for t in json.loads(r.stdout) if t.get("os_thread_id")}
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return {}


def watch(pid: int, spy: str | None, poll_s: float = 0.5, name_every_s: float = 3.0) -> dict[str, float]:
    tick = os.sysconf("SC_CLK_TCK")
    cpu: dict[int, float] = {}
    named: dict[int, str] = {}
    last = 0.0
    while Path(f"/proc/{pid}").exists():
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            break
        for t in tids:
            try:
                f = _stat_fields(f"/proc/{pid}/task/{t}/stat")
                cpu[int(t)] = (int(f[11]) + int(f[12])) / tick
            except (OSError, IndexError, ValueError):
                continue
        if spy is not None and time.monotonic() - last > name_every_s:
            last = time.monotonic()
            named.update(names(pid, spy))
        time.sleep(poll_s)
    out: dict[str, float] = {}
    for tid, seconds in cpu.items():
        key = re.sub(r"\d+", "N", named.get(tid, "MainThread" if tid == pid else "(not named: native)"))
        out[key] = out.get(key, 0.0) + seconds
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    who = ap.add_mutually_exclusive_group(required=True)
    who.add_argument("--pid", type=int, help="the daemon's pid")
    who.add_argument("--parent", type=int, help="the pid of the process that starts the daemon (a benchmark)")
    ap.add_argument("--json", default=None, help="also write {thread name: CPU seconds} here")
    a = ap.parse_args()
    pid = a.pid if a.pid is not None else daemon_of(a.parent)
    spy = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if spy is None:
        print("py-spy is not installed: threads are shown by id only", file=sys.stderr)
    by_name = watch(pid, spy)
    total = sum(by_name.values()) or 1.0
    for name, seconds in by_name.items():
        print(f"{seconds:8.2f} s  {100 * seconds / total:5.1f}%  {name}")
    if a.json:
        Path(a.json).write_text(json.dumps(by_name, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
