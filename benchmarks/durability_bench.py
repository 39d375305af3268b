"""What `--store-durability` costs: the time of one commit of a small write, on SQLite and PostgreSQL, full (every
commit synced) against relaxed. A commit of the job manager's writer is a group of many changes; this measures the
fixed part each group pays. Prints a table and writes JSON; asserts nothing.

    .venv/bin/python benchmarks/durability_bench.py [--commits 300] [--stores sqlite,postgresql]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from sqlalchemy import text

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import summary, table, write_results  # noqa: E402
from peloton.store import db  # noqa: E402
from tests.dbutil import postgres_database  # noqa: E402


def commits(url: str, durability: str, n: int) -> list[float]:
    eng = db.make_engine(url, durability=durability)
    sessions = db.make_sessions(eng)
    times = []
    try:
        for i in range(n + 10):
            t = time.perf_counter()
            with db.transaction(sessions) as s:
                s.execute(text("UPDATE meta SET value = :v WHERE key = 'bench'"), {"v": str(i)})
            if i >= 10:  # (the first few warm the pool and the caches)
                times.append(time.perf_counter() - t)
    finally:
        eng.dispose()
    return times


def run(url: str, n: int) -> dict[str, Any]:
    db.upgrade(url)
    eng = db.make_engine(url)
    with db.transaction(db.make_sessions(eng)) as s:
        s.execute(text("INSERT INTO meta (key, value) VALUES ('bench', '0')"))
    eng.dispose()
    return {d: summary(commits(url, d, n)) for d in db.DURABILITIES}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--commits", type=int, default=300)
    ap.add_argument("--stores", default="sqlite,postgresql")
    ap.add_argument("--json", default=None, help="where to write the figures (default benchmarks/results/)")
    a = ap.parse_args()
    out: dict[str, Any] = {}
    for store in a.stores.split(","):
        if store == "sqlite":
            with tempfile.TemporaryDirectory(prefix="peloton-durability-") as d:
                out[store] = run(db.default_sqlite_url(Path(d)), a.commits)
        else:
            with postgres_database() as url:
                out[store] = run(url, a.commits)
    rows = [(f"{store} {d}", f"commit p50 {s['p50_ms']:.2f} ms, p99 {s['p99_ms']:.2f} ms, mean {s['mean_ms']:.2f} ms")
            for store, by in out.items() for d, s in by.items()]
    print("one small commit, by store and --store-durability:")
    print(table(rows))
    print(f"wrote {write_results('durability', {'commits': a.commits, 'stores': out}, a.json)}")


if __name__ == "__main__":
    main()
