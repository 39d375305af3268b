"""What `--store-durability` costs: the time of one commit of a small write, on SQLite and PostgreSQL, full (every
commit synced) against relaxed. A commit of the job manager's writer is a group of many changes; this measures the
fixed part each group pays. Prints a table and writes JSON; asserts nothing.

    .venv/bin/python benchmarks/durability_bench.py [--commits 300] [--stores sqlite,postgresql]
        [--group-commits 150 [--gangs 2] [--rounds 3]]

With `--group-commits N` (not in `make bench`), also what one group commit of the job manager's writer costs on
PostgreSQL (synced), by how its statements are sent: psycopg2 a statement per table (the writer before issue 24),
psycopg2 the whole batch in one statement (store/bulk.py's write_batch, now), and psycopg 3 (if installed:
`.venv/bin/pip install "psycopg[binary]"`) with the per-table statements in pipeline mode (one round trip for all of
them and the commit; server-side parameters, prepared after 5 uses), or the one statement in a pipeline with its
commit. Each variant runs N gang lives in the sim benchmark's shape: `--gangs` new 8-task jobs (rows of jobs, gangs,
tasks, first events), then their launch intent and RUNNING (updates of the jobs, gangs and tasks, an event per task),
each batch one transaction with the fence's epoch check. Variants alternate in `--rounds` rounds on one database."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import text

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import summary, table, write_results  # noqa: E402
from peloton.domain.model import TaskEvent  # noqa: E402
from peloton.domain.resources import Resources  # noqa: E402
from peloton.domain.spec import JobSpec  # noqa: E402
from peloton.domain.states import GangState, JobState, TaskState  # noqa: E402
from peloton.jobmgr import gang_policy as policy  # noqa: E402
from peloton.leadership.fence import Fence, take_epochs  # noqa: E402
from peloton.store import bulk, db, repo  # noqa: E402
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


EPOCHS: dict[str, int] = {}  # one leader's, taken once: every variant writes as it
Batch = tuple[list[Any], list[Any], list[Any], list[Any], list[TaskEvent], bool]  # jobs, gangs, tasks, (rows), events, new


def life(prefix: str, gangs: int, now: float) -> list[Batch]:
    """The three batches of `gangs` 8-member gangs: create, launch intent, RUNNING."""
    spec = JobSpec(name="b", instances=8, command="true", resources=Resources(cpu=1, gpu=1), min_available=8)
    recs = [policy.new_job_records(f"{prefix}-{i}", spec, now) for i in range(gangs)]
    jobs = [r[0] for r in recs]
    gs = [g for r in recs for g in r[1]]
    ts = [t for r in recs for t in r[2]]
    out: list[Batch] = [(jobs, gs, ts, [], [TaskEvent(t.job_id, t.instance, 1, TaskState.PENDING, now) for t in ts],
                         True)]
    for state, gstate, jstate in ((TaskState.LAUNCHED, GangState.LAUNCHING, JobState.PENDING),
                                  (TaskState.RUNNING, GangState.RUNNING, JobState.RUNNING)):
        now += 0.01
        ts = [_replace(t, state=state, host="h1", updated_at=now) for t in ts]
        gs = [_replace(g, state=gstate, updated_at=now) for g in gs]
        jobs = [_replace(j, state=jstate, updated_at=now) for j in jobs]
        out.append((jobs, gs, ts, [], [TaskEvent(t.job_id, t.instance, 1, state, now, "h1") for t in ts], False))
    return out


def _replace(obj: Any, **kw: Any) -> Any:
    return dataclasses.replace(obj, **kw)


# --- psycopg2, through the store's own code ---------------------------------------------------------------------
def psycopg2_variant(url: str, one: bool) -> tuple[Callable[[Batch], None], Callable[[], None]]:
    eng = db.make_engine(url)
    sessions = db.make_sessions(eng)
    Fence(EPOCHS).install(sessions)

    def run(b: Batch) -> None:
        jobs, gangs, tasks, _, events, new = b
        with db.transaction(sessions) as s:
            if one:
                w = repo.Writes()
                if new:
                    for j in jobs:
                        w.insert_job(j, [g for g in gangs if g.job_id == j.id], [t for t in tasks if t.job_id == j.id])
                w.append_task_events(events)
                w.send(s, *(([], [], []) if new else (jobs, gangs, tasks)))
            else:  # one statement per table, the fence's check before the commit
                if new:
                    for j in jobs:
                        repo.insert_job(s, j, [g for g in gangs if g.job_id == j.id],
                                        [t for t in tasks if t.job_id == j.id])
                else:
                    repo.update_jobs(s, jobs)
                    repo.update_gangs(s, gangs)
                    repo.update_tasks(s, tasks)
                repo.append_task_events(s, events)
    return run, eng.dispose


# --- psycopg 3, the same statements on its own connection ----------------------------------------------------------
def psycopg3_variant(url: str, one: bool) -> tuple[Callable[[Batch], None], Callable[[], None]]:
    import psycopg
    from sqlalchemy.engine import make_url

    u = make_url(url)
    conn = psycopg.connect(host=u.host, port=u.port or 5432, user=u.username, dbname=u.database,
                           options="-c synchronous_commit=on", prepare_threshold=5)
    keys = sorted(EPOCHS)

    def rows(b: Batch) -> tuple[list[bulk.Insert], list[bulk.Update]]:
        jobs, gangs, tasks, _, events, new = b
        w = repo.Writes()
        if new:
            for j in jobs:
                w.insert_job(j, [g for g in gangs if g.job_id == j.id], [t for t in tasks if t.job_id == j.id])
        w.append_task_events(events)
        return w.parts(*(([], [], []) if new else (jobs, gangs, tasks)))

    def run(b: Batch) -> None:
        inserts, updates = rows(b)
        inserts = [i for i in inserts if i.rows]
        updates = [u for u in updates if u.rows]
        with conn.pipeline():
            if one:
                sql, params = bulk.batch_sql(inserts, updates, keys)
                cur = conn.execute(sql, params)
            else:
                cur = conn.cursor()
                for ins in inserts:
                    cols = ", ".join(f'"{c}"' for c in ins.cols)
                    marks = ", ".join("%s" for _ in ins.cols)
                    cur.executemany(f'INSERT INTO "{ins.table.name}" ({cols}) VALUES ({marks})', ins.rows)
                for up in updates:
                    width = len(up.keys) + len(up.cols)
                    cur.execute(bulk._pg_update_sql(up.table, up.keys, up.cols),  # noqa: SLF001
                                [[r[i] for r in up.rows] for i in range(width)])
                cur.execute("SELECT key, value FROM meta WHERE key = ANY(%s) ORDER BY key FOR KEY SHARE", (keys,))
            conn.commit()
        cur.fetchall()
    return run, conn.close


def group_commits(a: argparse.Namespace) -> dict[str, Any]:
    variants: dict[str, Callable[[str], tuple[Callable[[Batch], None], Callable[[], None]]]] = {
        "psycopg2, a statement per table": lambda url: psycopg2_variant(url, False),
        "psycopg2, one statement (now)": lambda url: psycopg2_variant(url, True),
    }
    try:
        import psycopg  # noqa: F401
        variants["psycopg 3 pipeline, a statement per table"] = lambda url: psycopg3_variant(url, False)
        variants["psycopg 3 pipeline, one statement"] = lambda url: psycopg3_variant(url, True)
    except ImportError:
        print("psycopg 3 is not installed: .venv/bin/pip install 'psycopg[binary]' to compare it", file=sys.stderr)
    times: dict[str, list[float]] = {k: [] for k in variants}
    cpu: dict[str, float] = {k: 0.0 for k in variants}
    with postgres_database() as url:
        db.upgrade(url)
        eng = db.make_engine(url)
        EPOCHS.update(take_epochs(db.make_sessions(eng)))
        eng.dispose()
        made = {k: make(url) for k, make in variants.items()}
        try:
            for rnd in range(a.rounds):
                for n, (k, (run, _)) in enumerate(made.items()):
                    lives = [life(f"r{rnd}v{n}b{i}", a.gangs, 1000.0 + i) for i in range(a.group_commits)]
                    c0 = time.process_time()
                    for batches in lives:
                        for b in batches:
                            t = time.perf_counter()
                            run(b)
                            times[k].append(time.perf_counter() - t)
                    cpu[k] += time.process_time() - c0
        finally:
            for _, close in made.values():
                close()
    res: dict[str, Any] = {"gang_lives": a.group_commits, "gangs_per_batch": a.gangs, "rounds": a.rounds,
                           "variants": {}}
    rows = []
    for k, ts in times.items():
        sm = summary(ts)
        per_gang_ms = 1000 * sum(ts) / (len(ts) / 3 * a.gangs)
        res["variants"][k] = {**sm, "client_cpu_ms_per_batch": 1000 * cpu[k] / len(ts), "ms_per_gang": per_gang_ms}
        rows.append((k, f"p50 {sm['p50_ms']:.2f} / p99 {sm['p99_ms']:.2f} / mean {sm['mean_ms']:.2f} ms a batch, "
                        f"client CPU {1000 * cpu[k] / len(ts):.2f} ms a batch, {per_gang_ms:.2f} ms a gang"))
    print(f"one group commit on PostgreSQL ({a.gangs} gangs x 8 members a batch; create, intent, RUNNING)")
    print(table(rows))
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--commits", type=int, default=300)
    ap.add_argument("--stores", default="sqlite,postgresql")
    ap.add_argument("--json", default=None, help="where to write the figures (default benchmarks/results/)")
    ap.add_argument("--group-commits", type=int, default=0,
                    help="gang lives per variant per round of the group-commit comparison (0: skip it)")
    ap.add_argument("--gangs", type=int, default=2, help="8-member gangs per group commit (the sim benchmark's "
                    "hold 1.5-3 mutations)")
    ap.add_argument("--rounds", type=int, default=3)
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
    res: dict[str, Any] = {"commits": a.commits, "stores": out}
    if a.group_commits:
        res["group_commit"] = group_commits(a)
    print(f"wrote {write_results('durability', res, a.json)}")


if __name__ == "__main__":
    main()
