"""The CPU time of one write transaction on a real store, three ways, in alternating blocks in one process:
`db.transaction(sessions)` (a pool checkout and checkin per transaction), `db.KeptConnection(...).transaction()`
(the job manager writers' kept connection), and the bare DB-API connection (no SQLAlchemy: the floor). Each does
the same one-row bulk UPDATE of `meta` (a group commit's statement, small) and commits. Measured by
time.thread_time per block; prints the median and range of all blocks but the first (warm-up); asserts nothing.

    .venv/bin/python scripts/commit_cpu.py postgresql|sqlite [TRANSACTIONS_PER_BLOCK=300] [BLOCKS=6]

Run it from the tree to measure (its peloton is imported from the working directory).
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, ".")
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))
from peloton.store import bulk, db, repo  # noqa: E402
from peloton.store.models import MetaRow  # noqa: E402
from tests.dbutil import scratch_database  # noqa: E402

_TABLE: Any = MetaRow.__table__


def _update(s: Any) -> None:
    bulk.update_rows(s, _TABLE, ("key",), ("value",), [("k", "1")])


def measure(url: str, n: int, blocks: int) -> dict[str, list[float]]:
    """µs of CPU per transaction of each way, one figure per block."""
    db.upgrade(url)
    eng = db.make_engine(url)
    sessions = db.make_sessions(eng)
    with db.transaction(sessions) as s:
        repo.set_meta(s, "k", "0")
    kept = db.KeptConnection(sessions)
    raw = eng.raw_connection()
    dbapi: Any = raw.dbapi_connection
    sqlite = eng.dialect.name == "sqlite"

    def pooled() -> None:
        with db.transaction(sessions) as s:
            _update(s)

    def keeping() -> None:
        with kept.transaction() as s:
            _update(s)

    def bare() -> None:
        cur = dbapi.cursor()
        try:
            if sqlite:
                cur.execute("BEGIN IMMEDIATE")
                cur.execute('UPDATE "meta" SET "value" = ? WHERE "key" = ?', ("1", "k"))
                cur.execute("COMMIT")
            else:
                cur.execute(bulk._pg_update_sql(_TABLE, ("key",), ("value",)), (["k"], ["1"]))
                dbapi.commit()
        finally:
            cur.close()

    ways: dict[str, Callable[[], None]] = {"pool": pooled, "kept": keeping, "bare": bare}
    out: dict[str, list[float]] = {name: [] for name in ways}
    try:
        for _ in range(blocks):
            for name, tx in ways.items():
                c0 = time.thread_time()
                for _ in range(n):
                    tx()
                out[name].append(1e6 * (time.thread_time() - c0) / n)
    finally:
        kept.close()
        raw.close()
        eng.dispose()
    return out


def main() -> int:
    store = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 300
    blocks = int(sys.argv[3]) if len(sys.argv) > 3 else 6
    with scratch_database(store) as url:
        res = measure(url, n, blocks)
    for name, figures in res.items():
        warm = figures[1:] or figures
        print(f"{store} {name}: µs CPU per write transaction, median {statistics.median(warm):.0f} "
              f"(range {min(warm):.0f}-{max(warm):.0f}, {len(warm)} blocks of {n})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
