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
each batch one transaction with the fence's epoch check. Variants alternate in `--rounds` rounds on one database.

    .venv/bin/python benchmarks/durability_bench.py --pgbench [--pgbench-clients 1,2,4,8,16] [--pgbench-seconds 10]
        [--durabilities full,relaxed] [--pgbench-modes simple,prepared] [--gangs 2] [--members 8] [--rounds 3]

With `--pgbench` (only that), the store's limit: the writer's group commits of a gang's life (create, launch intent,
RUNNING, end), recorded from the real Writer on a scratch database, replayed by PostgreSQL's pgbench from 1-16
clients; gangs/s, tasks/s, commits/s, latency and PostgreSQL's CPU per commit (benchmarks/README.md)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import event, text
from sqlalchemy.engine import make_url

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import _machine_jiffies, proc_cpu_seconds, summary, table, write_results  # noqa: E402
from peloton.domain.launch import TaskStatus  # noqa: E402
from peloton.domain.model import TaskEvent, gang_id_for, task_id_for  # noqa: E402
from peloton.domain.placement import GangPlacement, MemberAssignment  # noqa: E402
from peloton.domain.resources import Resources  # noqa: E402
from peloton.domain.spec import JobSpec  # noqa: E402
from peloton.domain.states import GangState, JobState, TaskState  # noqa: E402
from peloton.jobmgr import gang_policy as policy  # noqa: E402
from peloton.jobmgr.writer import Kind, Mutation, Writer  # noqa: E402
from peloton.leadership.fence import EPOCH_KEY, Fence, take_epochs  # noqa: E402
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


# --- pgbench: the store's limit on the job manager writer's own statements ------------------------------------------
# The writer's group commits for a gang's life, recorded from the real Writer (jobmgr/writer.py) on a scratch
# database and replayed by pgbench from many clients at once, so the figure is PostgreSQL's alone and the statements
# cannot drift from the product's: a change to the writer, the rules or the schema changes the script.
STEPS = ("create", "intent", "running", "end")  # a gang's life: one group commit each
_JOB_MARK = "pgbenchjob"
_JOB = _JOB_MARK + "{}x"  # a placeholder job id (gang g of the batch), replaced by each life's own in the script
_BEGIN, _COMMIT, _ROLLBACK = "\0BEGIN", "\0COMMIT", "\0ROLLBACK"
_LITERAL = re.compile(r"'(?:[^']|'')*'")
_VARIABLE = re.compile(r"(?<![:\w]):\w")  # what pgbench would take for a variable (`::type` is a cast)


def writer_transactions(url: str, gangs: int, members: int, job_ids: Sequence[str] = (),
                        now: float = 1_790_000_000.0) -> dict[str, list[str]]:
    """The statements the job manager's writer sends to PostgreSQL for one group commit of each step of the lives
    of `gangs` new `members`-member gangs (STEPS), each between the BEGIN and COMMIT psycopg2 adds: the text as
    psycopg2 sent it (it renders the parameters in on the client). Runs the real Writer, rules and store on `url`
    (a current schema) with the fence installed, one batch per step, and records its connection's cursors. The
    job ids are `job_ids`, else placeholders (_JOB) for pgbench_script."""
    import psycopg2.extensions

    sent: list[str] = []

    class Recording(psycopg2.extensions.cursor):
        def execute(self, query: Any, params: Any = None) -> Any:
            alone = self.connection.autocommit  # a batch that commits itself (bulk.commit_batch): its own transaction
            try:
                return super().execute(query, params)
            finally:
                sent.extend([_BEGIN, self.query.decode() if self.query is not None else "", _COMMIT] if alone else
                            [self.query.decode() if self.query is not None else ""])

        def executemany(self, query: Any, params: Any) -> Any:  # not the one-statement path: no script for it
            sent.append("\0executemany")
            return super().executemany(query, params)

        def copy_expert(self, sql: Any, file: Any, size: int = 8192) -> Any:
            sent.append("\0copy")
            return super().copy_expert(sql, file, size)

    eng = db.make_engine(url)
    if (eng.dialect.name, eng.dialect.driver) != ("postgresql", "psycopg2"):
        eng.dispose()  # SQLite runs in the daemon's process: there is no server for pgbench to drive
        raise ValueError(f"store url: the writer's statements are recorded on PostgreSQL through psycopg2 (the "
                         f"product's driver), got {eng.dialect.name}+{eng.dialect.driver}")
    event.listen(eng, "connect", lambda conn, _rec: setattr(conn, "cursor_factory", Recording))
    event.listen(eng, "begin", lambda _conn: sent.append(_BEGIN))
    event.listen(eng, "commit", lambda _conn: sent.append(_COMMIT))
    event.listen(eng, "rollback", lambda _conn: sent.append(_ROLLBACK))
    ids = list(job_ids) or [_JOB.format(g) for g in range(gangs)]
    spec = JobSpec(name="bench", instances=members, command="sleep 1", resources=Resources(cpu=1, mem=1024, gpu=1),
                   min_available=members)
    hosts = [f"host-{i:05d}" for i in range(members)]

    def views_apply(part: Callable[[policy.JobView], policy.Effects | None]) -> Callable[..., policy.Effects]:
        def apply(views: dict[str, policy.JobView], _now: float) -> policy.Effects:
            eff = policy.Effects()
            for jid in ids:
                e = part(views[jid])
                if e is not None:
                    eff.merge(e)
            return eff
        return apply

    def placement(jv: policy.JobView) -> policy.Effects | None:  # the launcher's intent (jobmgr/launcher.py)
        jid = jv.job.id
        p = GangPlacement(gang_id_for(jid, 0), jid, 1, tuple(
            MemberAssignment(i, task_id_for(jid, i, 1), hosts[i], f"10.0.{i // 250}.{i % 250 + 1}",
                             Resources(cpu=1, mem=1024, gpu=1), gpu_ids=(0,)) for i in range(members)))
        return policy.launch_intent(jv, p, now)

    def statuses(state: TaskState) -> Callable[[policy.JobView], policy.Effects]:
        def part(jv: policy.JobView) -> policy.Effects:  # the manager's apply_statuses, one job
            eff = policy.Effects()
            for i in range(members):
                eff.merge(policy.apply_status(jv, TaskStatus(
                    task_id_for(jv.job.id, i, 1), state, now, hosts[i],
                    exit_code=0 if state == TaskState.SUCCEEDED else None), now))
            return eff
        return part

    def created() -> list[Mutation[Any]]:  # the manager's create_job, each job a mutation
        out: list[Mutation[Any]] = []
        for jid in ids:
            job, gs, ts = policy.new_job_records(jid, spec, now)
            out.append(Mutation(Kind.CREATE, view=policy.new_job_view(job, gs, ts),
                                events=policy.first_events(ts, now), rows=1 + len(gs) + 2 * len(ts)))
        return out

    batches: dict[str, Callable[[], list[Mutation[Any]]]] = {
        "create": created,
        "intent": lambda: [Mutation(Kind.APPLY, ids, apply=views_apply(placement))],
        "running": lambda: [Mutation(Kind.APPLY, ids, apply=views_apply(statuses(TaskState.RUNNING)))],
        "end": lambda: [Mutation(Kind.APPLY, ids, apply=views_apply(statuses(TaskState.SUCCEEDED)))],
    }
    out: dict[str, list[str]] = {}
    prepared, bulk.PREPARED_PER_CONNECTION = bulk.PREPARED_PER_CONNECTION, 0  # the statements' text, not EXECUTEs
    try:
        sessions = db.make_sessions(eng)
        with db.transaction(sessions) as s:
            taken = repo.get_meta(s, EPOCH_KEY)
        # the epoch once taken (the statement checks it: a recording again sends the same text, and pgbench
        # replaying it on this database passes the check)
        Fence(int(taken) if taken else take_epochs(sessions)).install(sessions)
        w = Writer(sessions, publish=lambda *_: None, perform=lambda *_: None, clock=lambda: now)
        for step in STEPS:
            batch = batches[step]()
            del sent[:]
            w._commit_batch(batch)  # noqa: SLF001 - one group commit, as the writer's thread runs it
            for m in batch:
                m.future.result(timeout=0)  # a mutation that failed fails the benchmark
            sent[:] = _without_settings(sent)
            if sent.count(_BEGIN) != 1 or sent.count(_COMMIT) != 1 or _ROLLBACK in sent:
                raise RuntimeError(f"{step}: expected one committed transaction, the writer sent {sent!r:.300}")
            body = sent[sent.index(_BEGIN) + 1:sent.index(_COMMIT)]
            if any(q.startswith("\0") for q in body):
                raise RuntimeError(f"{step}: the writer did not send its batch as plain statements: {body!r:.300}")
            out[step] = body
    finally:
        bulk.PREPARED_PER_CONNECTION = prepared
        eng.dispose()
    return out


def _without_settings(sent: list[str]) -> list[str]:
    """`sent` without the transactions of session settings only (the writer's connection's db.WRITER_PG_SETTINGS,
    sent once when it is opened: not a step's)."""
    out: list[str] = []
    i = 0
    while i < len(sent):
        if sent[i] == _BEGIN and _COMMIT in sent[i:]:
            end = sent.index(_COMMIT, i)
            body = sent[i + 1:end]
            if body and all(q.startswith(("SET ", "RESET ")) for q in body):
                i = end + 1
                continue
        out.append(sent[i])
        i += 1
    return out


def pgbench_script(txs: dict[str, list[str]], gangs: int, prepared: bool) -> str:
    """A pgbench script of one life of the batches of writer_transactions (made with the placeholder ids): every
    step's BEGIN, statements and COMMIT, the job ids made of the client and its count of lives (`:life`; run it
    with `-D n=0`). `-M simple` sends the writer's text with only the ids changed (written into the literals).
    `-M prepared` makes every `:name` a parameter, inside literals too: there each id is an expression of `:life`,
    and a literal's other colons (the spec's JSON) are split off (`':' || '2'`)."""
    lines = ["\\set n :n + 1", f"\\set life :client_id * {_LIVES} + :n"]
    for step in STEPS:
        lines += [f"-- {step}", "BEGIN;"]
        for sql in txs[step]:
            for m in _VARIABLE.finditer(sql):
                if sql[m.start() + 1:].startswith(_PGBENCH_VARIABLES):
                    # simple mode would substitute it: the script would not send the writer's text
                    raise ValueError(f"{step}: the statement has {sql[m.start():m.start() + 20]!r}, a pgbench "
                                     "variable's name")
            lines.append(_with_ids(sql, gangs, prepared) + ";")
        lines.append("COMMIT;")
    return "\n".join(lines) + "\n"


_LIVES = 1_000_000_000  # a client's lives before its ids would repeat
_PGBENCH_VARIABLES = ("life", "n", "client_id", "scale", "random_seed", "default_seed")  # what pgbench defines


def _with_ids(sql: str, gangs: int, prepared: bool) -> str:
    def one(m: re.Match[str]) -> str:
        lit = m.group(0)
        if prepared:
            lit = _VARIABLE.sub(lambda v: ":' || '" + v.group(0)[1:], lit)
        if _JOB_MARK not in lit:
            return lit if not prepared or lit == m.group(0) else f"({lit})"
        for g in range(gangs):
            lit = lit.replace(_JOB.format(g), f"L' || :life || '-{g}" if prepared else f"L:life-{g}")
        return f"({lit})" if prepared else lit

    out = _LITERAL.sub(one, sql)
    if _JOB_MARK in out:
        raise ValueError(f"a job id outside a string literal, or of a gang past {gangs}: {out[:200]!r}")
    return out


def _backends(dbname: str) -> dict[int, str]:
    """The PostgreSQL server processes working on `dbname`, by their titles (`postgres: <cluster>: <user> <db>
    <client> ...`, `postgres: <cluster>: autovacuum worker <db>`): {pid: "backend" or "autovacuum"}."""
    out = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError):
                title = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                if title.startswith("postgres:") and dbname in title.split():
                    out[int(d.name)] = "autovacuum" if "autovacuum worker" in title else "backend"
    return out


def pgbench_once(pgbench: str, url: str, script: Path, clients: int, seconds: float, mode: str, durability: str,
                 logs: Path) -> dict[str, Any]:
    """One pgbench run on empty tables: its figures, each life's latency from its log, and the CPU of the database's
    backends and autovacuum workers (read from /proc every 0.1 s while they live, found every 0.5 s: what a backend
    spends in its last 0.1 s, and an autovacuum worker that lived less than 0.5 s, are missed)."""
    u = make_url(url)
    eng = db.make_engine(url)  # every run starts from the same tables (the meta rows of the fence stay)
    with eng.begin() as conn:
        conn.execute(text("TRUNCATE jobs, gangs, tasks, task_events"))
    eng.dispose()
    for f in logs.glob("*"):
        f.unlink()
    cmd = [pgbench, "-n", "-h", u.host or "127.0.0.1", "-p", str(u.port or 5432), "-U", u.username or "postgres",
           "-c", str(clients), "-j", str(clients), "-T", str(int(seconds)), "-M", mode, "-D", "n=0", "-f", str(script),
           "-l", "--log-prefix", str(logs / "life"), u.database or ""]
    # the daemon sets synchronous_commit the same way (store/db.py)
    env = {**os.environ, "PGOPTIONS": f"-c synchronous_commit={'on' if durability == db.FULL else 'off'}",
           **({"PGPASSWORD": u.password} if u.password else {})}
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    busy0, total0 = _machine_jiffies()
    load0 = os.getloadavg()[0]
    cpu: dict[int, float] = {}
    kinds: dict[int, str] = {}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    last_scan = 0.0
    while proc.poll() is None:
        if time.monotonic() - last_scan > 0.5:
            for pid, kind in _backends(u.database or "").items():
                kinds.setdefault(pid, kind)
                cpu.setdefault(pid, 0.0)
            last_scan = time.monotonic()
        for pid in cpu:
            cpu[pid] = max(cpu[pid], proc_cpu_seconds(pid))
        time.sleep(0.1)
    output = proc.stdout.read() if proc.stdout else ""
    busy1, total1 = _machine_jiffies()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"pgbench failed ({proc.returncode}): {' '.join(cmd)}\n{output[-2000:]}")
    lat = [int(line.split()[2]) / 1e6 for f in logs.glob("life*") for line in f.read_text().splitlines() if line]
    tps = re.search(r"tps = ([\d.]+) \(without", output)
    failed = re.search(r"number of failed transactions: (\d+)", output)
    if tps is None:
        raise RuntimeError(f"no tps in pgbench's output:\n{output[-2000:]}")
    return {"clients": clients, "mode": mode, "durability": durability, "seconds": seconds, "lives": len(lat),
            "failed": int(failed.group(1)) if failed else 0, "lives_per_s": float(tps.group(1)), **summary(lat),
            "postgres_cpu_s": sum(v for p, v in cpu.items() if kinds[p] == "backend"),
            "autovacuum_cpu_s": sum(v for p, v in cpu.items() if kinds[p] == "autovacuum"),
            "backends_seen": sum(1 for k in kinds.values() if k == "backend"),
            "pgbench_cpu_s": (after.ru_utime + after.ru_stime) - (children.ru_utime + children.ru_stime),
            "machine_busy_cores": (busy1 - busy0) / max(1, total1 - total0) * (os.cpu_count() or 1),
            "load_1m_before": load0, "load_1m_after": os.getloadavg()[0]}


def find_pgbench(given: str | None) -> str | None:
    if given:
        return given if Path(given).is_file() else None
    found = shutil.which("pgbench")
    if found:
        return found
    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin/pgbench"))
    return str(candidates[-1]) if candidates else None


def store_limit(a: argparse.Namespace) -> dict[str, Any]:
    """--pgbench: the writer's lives replayed by pgbench at each client count, mode and durability, in rounds."""
    pgbench = find_pgbench(a.pgbench_path)
    if pgbench is None:
        sys.exit("pgbench not found: it comes with PostgreSQL's client programs (Debian: apt-get install "
                 "postgresql-client, or postgresql-contrib on older releases); or give --pgbench-path")
    clients = [int(c) for c in a.pgbench_clients.split(",")]
    modes = a.pgbench_modes.split(",")
    durabilities = a.durabilities.split(",")
    runs: list[dict[str, Any]] = []
    with postgres_database() as url, tempfile.TemporaryDirectory(prefix="peloton-pgbench-") as tmp:
        db.upgrade(url)
        txs = writer_transactions(url, a.gangs, a.members)
        scripts = {}
        for mode in modes:
            scripts[mode] = Path(tmp) / f"life-{mode}.sql"
            scripts[mode].write_text(pgbench_script(txs, a.gangs, mode == "prepared"))
        logs = Path(tmp) / "logs"
        logs.mkdir()
        for rnd in range(a.rounds):  # every setting once a round, so the machine's load falls on each alike
            for c in clients:
                for d in durabilities:
                    for mode in modes:
                        r = pgbench_once(pgbench, url, scripts[mode], c, a.pgbench_seconds, mode, d, logs)
                        r["round"] = rnd
                        runs.append(r)
                        print(f"  round {rnd} {c:>2} clients {d:>7} {mode:>8}: {r['lives_per_s'] * a.gangs:8.1f} "
                              f"gangs/s, life p50 {r['p50_ms']:.1f} ms, load {r['load_1m_after']:.1f}", flush=True)
    per_life = len(STEPS)
    for r in runs:
        r.update(derived(r, a.gangs, a.members, per_life))
    res: dict[str, Any] = {"gangs_per_batch": a.gangs, "members": a.members, "steps": list(STEPS),
                           "commits_per_life": per_life, "rounds": a.rounds, "pgbench": pgbench,
                           "statement_chars": {s: [len(q) for q in txs[s]] for s in STEPS}, "runs": runs}
    rows = []
    for c in clients:
        for d in durabilities:
            for mode in modes:
                rs = [r for r in runs if r["clients"] == c and r["durability"] == d and r["mode"] == mode]
                rows.append((f"{c:>2} clients, {d}, {mode}", _span(rs, "gangs_per_s", "{:.0f}") + " gangs/s ("
                             + _span(rs, "tasks_per_s", "{:.0f}") + " tasks/s, " + _span(rs, "commits_per_s", "{:.0f}")
                             + " commits/s); life p50 " + _span(rs, "p50_ms", "{:.1f}") + " / p99 "
                             + _span(rs, "p99_ms", "{:.1f}") + " ms; PostgreSQL "
                             + _span(rs, "pg_cpu_ms_per_commit", "{:.2f}") + " ms CPU a commit, "
                             + _span(rs, "postgres_cores", "{:.2f}") + " cores"))
    print(f"the writer's group commits replayed by pgbench ({a.gangs} gangs of {a.members} a batch; a life is "
          f"{per_life} commits: {', '.join(STEPS)}; {a.pgbench_seconds:.0f} s a run; min-max of {a.rounds} rounds)")
    print(table(rows))
    return res


def derived(r: dict[str, Any], gangs: int, members: int, commits_per_life: int) -> dict[str, float]:
    """Gangs, tasks and commits a second from pgbench's lives a second, and PostgreSQL's CPU per commit and gang."""
    commits = r["lives"] * commits_per_life
    return {"gangs_per_s": r["lives_per_s"] * gangs, "tasks_per_s": r["lives_per_s"] * gangs * members,
            "commits_per_s": r["lives_per_s"] * commits_per_life,
            "pg_cpu_ms_per_commit": 1000 * r["postgres_cpu_s"] / commits if commits else float("nan"),
            "pg_cpu_ms_per_gang": 1000 * r["postgres_cpu_s"] / (r["lives"] * gangs) if commits else float("nan"),
            "postgres_cores": r["postgres_cpu_s"] / r["seconds"]}


def _span(rs: list[dict[str, Any]], key: str, fmt: str) -> str:
    vals = [r[key] for r in rs]
    lo, hi = fmt.format(min(vals)), fmt.format(max(vals))
    return lo if lo == hi else f"{lo}-{hi}"


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
    ap.add_argument("--pgbench", action="store_true", help="only the store's limit: the writer's group commits "
                    "replayed by pgbench (writes durability_pgbench.json)")
    ap.add_argument("--pgbench-clients", default="1,2,4,8,16")
    ap.add_argument("--pgbench-seconds", type=float, default=10.0, help="each run's length")
    ap.add_argument("--pgbench-modes", default="simple,prepared", help="pgbench -M: simple is what psycopg2 sends")
    ap.add_argument("--durabilities", default="full,relaxed", help="--store-durability: synchronous_commit on, off")
    ap.add_argument("--members", type=int, default=8, help="members of each gang (--pgbench)")
    ap.add_argument("--pgbench-path", default=None, help="the pgbench program (default: on PATH, or PostgreSQL's)")
    a = ap.parse_args()
    if a.pgbench:
        print(f"wrote {write_results('durability_pgbench', store_limit(a), a.json)}")
        return
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
