"""Benchmark 16: how long the daemon takes to start and to stop, as an operator's restart and the test suite's ~200
daemons see it. `peloton server` is started N times per store and backend, each on a fresh data dir and store (the
first start of a cluster, and every test's: the migrations run) and then again on the same ones (a restart: the
store at head, the local backend's journal read back). Per start: exec -> the "serving on" line (what the suite's
harness waits for), then SIGTERM -> the process's exit (and its status, which must be 0). Prints a table and
writes JSON; asserts nothing.

    .venv/bin/python benchmarks/startstop_bench.py [--runs 5] [--stores sqlite,postgresql] [--backends local,sim]
        [--console]

`--console` serves the web console too (`--ui-listen 127.0.0.1:0`): its accept loop is part of every stop (it
waited up to half a second for socketserver's poll before it was woken at shutdown).

Byte-code: by default peloton's modules are compiled first (compileall, as tests/conftest.py does for the suite) and
the children run as found otherwise; `--bytecode as-found` compiles nothing, so with PYTHONDONTWRITEBYTECODE set and
no cache every start compiles peloton again (what the suite did before). `--root DIR` runs another checkout's code
(an A/B against it, as the other benchmarks do).
"""

from __future__ import annotations

import argparse
import compileall
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import percentile, table, throwaway_store, write_results  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SETTLE_S = 0.3  # serving this long before the SIGTERM (the loops in their waits, as in a test's teardown)


def stale_modules(package: Path) -> int:
    """How many of the package's modules have no up-to-date byte-code cache."""
    import importlib.util

    n = 0
    for src in package.rglob("*.py"):
        pyc = Path(importlib.util.cache_from_source(str(src)))
        if not pyc.exists() or pyc.stat().st_mtime < src.stat().st_mtime:
            n += 1
    return n


def start_stop(root: Path, data_dir: Path, db: str, backend: str, console: bool = False) -> dict[str, Any]:
    args = [sys.executable, "-m", "peloton.cli.main", "server", "--listen", "127.0.0.1:0", "--db", db,
            "--data-dir", str(data_dir), "--metrics-listen", "", "--ui-listen", "127.0.0.1:0" if console else "", "--log-level", "info",
            *(["--insecure", "--default-task-user", "root"] if os.geteuid() == 0 else [])]
    if backend == "local":  # as the suite's harness starts it (tests/e2e/harness.py)
        args += ["--local-hosts", "2", "--local-host-resources", "cpu=4,mem=4Gi,gpu=2"]
    else:
        args += ["--backend", "sim", "--sim-hosts", "100"]
    with open(data_dir / "daemon.log", "a") as log:
        t0 = time.monotonic()
        p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log, text=True, cwd=root)
    assert p.stdout is not None
    serving = None
    while True:
        line = p.stdout.readline()
        if not line:
            break
        if "serving on" in line:
            serving = time.monotonic() - t0
            break
    if serving is None:
        p.wait(10)
        raise RuntimeError(f"daemon did not start: {(data_dir / 'daemon.log').read_text()[-3000:]}")
    time.sleep(SETTLE_S)
    # a blocking wait (waitpid), not Popen.wait(timeout), which polls in sleeps of up to 50 ms; a daemon that does
    # not exit is killed after a minute (and its status says so)
    watchdog = threading.Timer(60, p.kill)
    watchdog.start()
    t1 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    rc = p.wait()
    stop = time.monotonic() - t1
    watchdog.cancel()
    return {"start_s": serving, "stop_s": stop, "exit_status": rc}


def stats(xs: list[float]) -> dict[str, float]:
    return {"n": len(xs), "p50_ms": percentile(xs, 50) * 1000, "max_ms": max(xs) * 1000,
            "min_ms": min(xs) * 1000}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5, help="fresh starts (each followed by a restart) per case")
    ap.add_argument("--stores", default="sqlite,postgresql")
    ap.add_argument("--backends", default="local,sim")
    ap.add_argument("--root", default=str(ROOT), help="the checkout whose code the daemons run")
    ap.add_argument("--bytecode", choices=("compiled", "as-found"), default="compiled")
    ap.add_argument("--console", action="store_true", help="serve the web console too (--ui-listen)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    root = Path(a.root).resolve()
    stale = stale_modules(root / "peloton")
    if a.bytecode == "compiled":
        compileall.compile_dir(root / "peloton", quiet=1)
    results: dict[str, Any] = {"cases": {}, "parameters": {
        "runs": a.runs, "console": a.console, "root": str(root), "bytecode": a.bytecode, "stale_modules_before": stale,
        "stale_modules_now": stale_modules(root / "peloton"),
        "PYTHONDONTWRITEBYTECODE": os.environ.get("PYTHONDONTWRITEBYTECODE", ""), "settle_s": SETTLE_S}}
    rows: list[tuple[str, str]] = []
    sys.path.insert(0, str(ROOT))
    for store in a.stores.split(","):
        for backend in a.backends.split(","):
            runs: dict[str, list[dict[str, Any]]] = {"fresh": [], "restart": []}
            for _ in range(a.runs):
                data_dir = Path(tempfile.mkdtemp(prefix="peloton-bench-startstop-"))
                try:
                    with throwaway_store(store, data_dir) as db:
                        runs["fresh"].append(start_stop(root, data_dir, db, backend, a.console))
                        runs["restart"].append(start_stop(root, data_dir, db, backend, a.console))
                finally:
                    shutil.rmtree(data_dir, ignore_errors=True)
            case: dict[str, Any] = {}
            for kind, rs in runs.items():
                case[kind] = {"exec_to_serving": stats([r["start_s"] for r in rs]),
                              "sigterm_to_exit": stats([r["stop_s"] for r in rs]),
                              "exit_statuses": sorted({r["exit_status"] for r in rs}),
                              "runs": rs}
                s, t = case[kind]["exec_to_serving"], case[kind]["sigterm_to_exit"]
                rows.append((f"{store:10s} {backend:5s} {kind:7s}",
                             f"start p50 {s['p50_ms']:6.0f} ms  max {s['max_ms']:6.0f} ms   "
                             f"stop p50 {t['p50_ms']:5.0f} ms  max {t['max_ms']:5.0f} ms   "
                             f"exit {case[kind]['exit_statuses']}"))
            results["cases"][f"{store}/{backend}"] = case
    print(f"peloton server: exec -> serving, SIGTERM -> exit ({a.runs} runs each; console {a.console}; bytecode {a.bytecode}, "
          f"{stale} modules without a fresh cache before; load {os.getloadavg()[0]:.2f}; root {root})")
    print(table(rows))
    print(f"JSON: {write_results('startstop', results, a.json)}")


if __name__ == "__main__":
    main()
