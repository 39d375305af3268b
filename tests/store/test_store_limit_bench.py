"""benchmarks/durability_bench.py --pgbench: the script pgbench replays is the job manager writer's own group
commits. The statements are recorded from the real Writer on PostgreSQL (bulk.write_batch: one statement of CTEs
per batch); on SQLite the writer sends a statement per table to a database inside the daemon's process, so there is
nothing for pgbench to drive: that store is checked to be refused with a clear error."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from benchmarks import durability_bench as bench
from peloton.store import db

GANGS, MEMBERS = 2, 3
_JOB_ID = re.compile(r"^(?:L\d+-|pgbenchjob)(\d+)x?$")  # pgbench's and the placeholders: gang g of the batch


def _rows(url: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row the lives wrote, the job ids replaced by their gang's index in the batch (and no event ids)."""
    eng = db.make_engine(url)
    out: dict[str, list[tuple[Any, ...]]] = {}
    try:
        with eng.connect() as conn:
            for table, order in (("jobs", "id"), ("gangs", "job_id, idx"), ("tasks", "job_id, instance"),
                                 ("task_events", "job_id, instance, id")):
                rows = conn.execute(text(f"SELECT * FROM {table} ORDER BY {order}")).mappings().all()
                out[table] = sorted(tuple((k, _JOB_ID.sub(r"gang \1", v) if k in ("id", "job_id")
                                           and isinstance(v, str) else v) for k, v in r.items() if
                                          not (table == "task_events" and k == "id")) for r in rows)
    finally:
        eng.dispose()
    return out


def _truncate(url: str) -> None:
    eng = db.make_engine(url)
    with eng.begin() as conn:
        conn.execute(text("TRUNCATE jobs, gangs, tasks, task_events"))
    eng.dispose()


def test_the_script_sends_the_writers_text_with_only_the_job_ids_changed(db_url: str) -> None:
    db.upgrade(db_url)
    if make_url(db_url).get_backend_name() == "sqlite":
        with pytest.raises(ValueError, match="store url: .*PostgreSQL"):
            bench.writer_transactions(db_url, GANGS, MEMBERS)
        return
    placeholders = bench.writer_transactions(db_url, GANGS, MEMBERS)
    assert list(placeholders) == list(bench.STEPS)
    # one statement a group commit (bulk.write_batch), the fence's epoch check in it
    assert all(len(sqls) == 1 and sqls[0].startswith("WITH ") and "FOR KEY SHARE" in sqls[0]
               for sqls in placeholders.values())
    life = 7 * bench._LIVES + 3  # client 7's third life
    real = bench.writer_transactions(db_url, GANGS, MEMBERS, job_ids=[f"L{life}-{g}" for g in range(GANGS)])
    script = bench.pgbench_script(placeholders, GANGS, prepared=False)
    sent = [line.replace(":life", str(life)).removesuffix(";") for line in script.splitlines()
            if line.startswith("WITH ")]
    assert sent == [q for step in bench.STEPS for q in real[step]]
    assert script.splitlines()[:2] == ["\\set n :n + 1", f"\\set life :client_id * {bench._LIVES} + :n"]
    assert script.count("BEGIN;") == script.count("COMMIT;") == len(bench.STEPS)


@pytest.mark.parametrize("mode", ["simple", "prepared"])
def test_pgbench_writes_what_the_writer_wrote(db_url: str, mode: str, tmp_path: Path) -> None:
    db.upgrade(db_url)
    if make_url(db_url).get_backend_name() == "sqlite":
        with pytest.raises(ValueError, match="store url"):
            bench.writer_transactions(db_url, GANGS, MEMBERS)
        return
    pgbench = bench.find_pgbench(None)
    if pgbench is None:
        pytest.skip("pgbench is not installed (Debian: postgresql-client)")
    txs = bench.writer_transactions(db_url, GANGS, MEMBERS)
    by_writer = _rows(db_url)
    _truncate(db_url)
    script = tmp_path / "life.sql"
    script.write_text(bench.pgbench_script(txs, GANGS, prepared=mode == "prepared"))
    u = make_url(db_url)
    run = subprocess.run([pgbench, "-n", "-h", u.host or "127.0.0.1", "-p", str(u.port or 5432), "-U",
                          u.username or "postgres", "-c", "2", "-t", "2", "-M", mode, "-D", "n=0", "-f", str(script),
                          u.database or ""], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert "number of failed transactions: 0" in run.stdout
    by_pgbench = _rows(db_url)
    # 2 clients x 2 lives, each the writer's rows under its own ids: every job, gang and task ended SUCCEEDED
    assert {t: len(rows) for t, rows in by_pgbench.items()} == {t: 4 * len(rows) for t, rows in by_writer.items()}
    assert {t: sorted(set(rows)) for t, rows in by_pgbench.items()} == {t: sorted(set(rows))
                                                                         for t, rows in by_writer.items()}
    assert {r for r in by_writer["tasks"] if ("state", "SUCCEEDED") in r} == set(by_writer["tasks"])


def test_the_script_refuses_what_pgbench_would_misread() -> None:
    with pytest.raises(ValueError, match=":life'"):  # simple mode would substitute it
        bench.pgbench_script({s: ["WITH x AS (SELECT ':life') SELECT 1"] for s in bench.STEPS}, 1, False)
    with pytest.raises(ValueError, match="outside a string literal"):
        bench.pgbench_script({s: [f"SELECT {bench._JOB.format(0)}"] for s in bench.STEPS}, 1, False)
    with pytest.raises(ValueError, match="gang past 1"):
        bench.pgbench_script({s: [f"SELECT '{bench._JOB.format(1)}'"] for s in bench.STEPS}, 1, False)
    # prepared mode makes every :name a parameter, inside literals too: the spec's JSON is split at its colons
    job = bench._JOB.format(0)
    got = bench._with_ids(f"""INSERT INTO t VALUES ('{job}', '{{"a":2}}', '{job}/0', 'x::y')""", 1, True)
    assert got == ("INSERT INTO t VALUES (('L' || :life || '-0'), ('{\"a\":' || '2}'), ('L' || :life || '-0/0'), "
                   "'x::y')")
    assert bench._with_ids(f"VALUES ('{job}', '{{\"a\":2}}')", 1, False) == "VALUES ('L:life-0', '{\"a\":2}')"


def test_gangs_tasks_and_cpu_from_pgbench_lives() -> None:
    r = {"lives": 100, "lives_per_s": 10.0, "postgres_cpu_s": 2.0, "seconds": 10.0}
    got = bench.derived(r, gangs=2, members=8, commits_per_life=4)
    assert got == {"gangs_per_s": 20.0, "tasks_per_s": 160.0, "commits_per_s": 40.0, "pg_cpu_ms_per_commit": 5.0,
                   "pg_cpu_ms_per_gang": 10.0, "postgres_cores": 0.2}
