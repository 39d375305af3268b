"""PostgreSQL's CPU for the job manager writers' own statements, replayed (issue 24): what one of their commits
costs the server apart from the daemon running beside it. Reads the statements a `sim_bench.py` run's writers sent
from the server's log (a run with `--pg-set log_min_duration_statement=0`, which prints its database's name), and
replays each writer backend's batches in their order on a fresh database, each one transaction as it was (BEGIN,
the batch, COMMIT), with one connection per writer backend at once (`--connections each`) or all on one. Prints the
replay's backend CPU (the kernel's count for the server processes, so PostgreSQL must run on this machine) per
commit and per job created; asserts nothing.

    .venv/bin/python benchmarks/sim_bench.py --store postgresql --seconds 10 --samples 3 --sizes 8 \\
        --pg-set log_min_duration_statement=0
    .venv/bin/python benchmarks/pg_replay.py /var/log/postgresql/postgresql-15-main.log DATABASE [--pace-ms 1]

`--pace-ms MS`: a pause before each round trip of a commit, as the live writer's backend waits while the writer
does its Python between statements (back to back, the server's caches stay warm). The log's lines must start as
the default `log_line_prefix` of Debian's PostgreSQL does (`%m [%p] %q%u@%d `)."""

from __future__ import annotations

import argparse
import re
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import proc_cpu_seconds  # noqa: E402

_LINE = re.compile(r"\[(\d+)\] \S*@(\S+) LOG:  duration: [\d.]+ ms  statement: (.*)$")
_JOBS_VALUES = re.compile(r'INSERT INTO "jobs" \([^)]*\) VALUES (.*?) RETURNING')
_JOB_ID = re.compile(r"(?:^|\), )\('((?:[^']|'')*)'")
_FENCE_KEYS = re.compile(r"FROM meta WHERE key = ANY\(ARRAY\[([^\]]*)\]\)")


def writer_batches(lines: Iterable[str], database: str) -> dict[int, list[str]]:
    """The one-statement batches (`WITH ...`, store/bulk.py's write_batch) each backend of `database` ran, by
    backend pid, in the log's order."""
    out: dict[int, list[str]] = {}
    for line in lines:
        m = _LINE.search(line.rstrip("\n"))
        if m and m.group(2) == database and m.group(3).startswith("WITH "):
            out.setdefault(int(m.group(1)), []).append(m.group(3))
    return out


def jobs_created(batches: Iterable[str]) -> int:
    """How many jobs the batches insert (each a gang of the sim benchmark's closed loop)."""
    ids: set[str] = set()
    for q in batches:
        for values in _JOBS_VALUES.findall(q):
            ids.update(_JOB_ID.findall(values))
    return len(ids)


def fence_keys(batches: Iterable[str]) -> set[str]:
    """The `meta` keys the fence's epoch check reads (leadership/fence.py), to be present as they were live."""
    return {k.strip().strip("'") for q in batches for m in _FENCE_KEYS.findall(q) for k in m.split(",") if k.strip()}


def replay(url: str, by_backend: dict[int, list[str]], each: bool, pace_s: float) -> tuple[float, int]:
    """Backend CPU seconds and commits of the batches replayed on `url` (a current schema)."""
    import psycopg2
    from sqlalchemy.engine import make_url

    u = make_url(url)

    def connect() -> psycopg2.extensions.connection:
        return psycopg2.connect(host=u.host, port=u.port or 5432, user=u.username, dbname=u.database)

    conn = connect()
    try:
        with conn, conn.cursor() as cur:  # (the block commits)
            for k in sorted(fence_keys(q for qs in by_backend.values() for q in qs)):
                cur.execute("INSERT INTO meta (key, value) VALUES (%s, '1') ON CONFLICT DO NOTHING", (k,))
    finally:
        conn.close()
    results: list[tuple[float, int]] = []

    def run(batches: list[str]) -> None:
        conn = connect()
        try:
            cur, pid = conn.cursor(), conn.get_backend_pid()
            cpu = proc_cpu_seconds(pid)
            for q in batches:
                time.sleep(pace_s)
                cur.execute(q)  # psycopg2 sends BEGIN first, as live
                cur.fetchall()
                time.sleep(pace_s)
                conn.commit()
            results.append((proc_cpu_seconds(pid) - cpu, len(batches)))
        finally:
            conn.close()

    groups = list(by_backend.values()) if each else [[q for qs in by_backend.values() for q in qs]]
    threads = [threading.Thread(target=run, args=(g,)) for g in groups]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if len(results) != len(groups):
        raise RuntimeError("a replay connection failed (its error is above)")
    return sum(r[0] for r in results), sum(r[1] for r in results)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("log", help="the PostgreSQL server's log of the run")
    ap.add_argument("database", help="the run's database (sim_bench.py --pg-set prints it)")
    ap.add_argument("--connections", choices=["each", "one"], default="each",
                    help="one connection per writer backend of the run, at once (default), or all batches on one")
    ap.add_argument("--pace-ms", type=float, default=0.0, help="pause before each round trip of a commit")
    a = ap.parse_args()
    with open(a.log, errors="replace") as f:
        by_backend = writer_batches(f, a.database)
    if not by_backend:
        sys.exit(f"{a.log}: no batches of database {a.database} (was the run's log_min_duration_statement 0?)")
    batches = [q for qs in by_backend.values() for q in qs]
    jobs = jobs_created(batches)

    from peloton.store import db
    from tests.dbutil import postgres_database

    with postgres_database() as url:
        db.upgrade(url)
        cpu, commits = replay(url, by_backend, a.connections == "each", a.pace_ms / 1000)
    print(f"{len(by_backend)} writer backends, {commits} commits, {jobs} jobs, mean batch "
          f"{sum(map(len, batches)) // len(batches)} bytes; connections {a.connections}, pace {a.pace_ms:g} ms")
    print(f"PostgreSQL CPU {cpu:.2f} s: {cpu / commits * 1000:.2f} ms a commit, "
          f"{cpu / max(jobs, 1) * 1000:.2f} ms a job")


if __name__ == "__main__":
    main()
