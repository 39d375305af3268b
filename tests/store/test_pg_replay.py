"""benchmarks/pg_replay.py on a real server: the job manager writer's own batches, recorded from the real Writer
(benchmarks/durability_bench.py), read back from log lines and replayed on a fresh database."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, text

from benchmarks.durability_bench import writer_transactions
from benchmarks.pg_replay import fence_keys, jobs_created, replay, writer_batches
from peloton.store import db
from tests.dbutil import postgres_database


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)  # a replay of PostgreSQL's log, on PostgreSQL
def test_the_writer_batches_of_a_log_replay_on_a_fresh_database(db_url: str) -> None:
    db.upgrade(db_url)
    sent = writer_transactions(db_url, 2, 4, job_ids=["job-a", "job-b"])
    log = [f"2026-11-27 22:12:03.958 UTC [42] postgres@run LOG:  duration: 1.0 ms  statement: {q}\n"
           for step in sent.values() for q in step]
    by_backend = writer_batches(log, "run")
    batches = by_backend[42]
    assert len(batches) == 4  # create, intent, running, end: one statement each
    assert jobs_created(batches) == 2 and fence_keys(batches)
    with postgres_database() as url:
        db.upgrade(url)
        cpu, commits = replay(url, by_backend, each=True, pace_s=0.0)
        assert commits == 4 and cpu >= 0.0
        engine = create_engine(url)
        try:
            with engine.connect() as conn:
                states = {str(i): str(st) for i, st in conn.execute(text("SELECT id, state FROM jobs"))}
                rows, events = conn.execute(text("SELECT count(*), sum(span + 1) FROM task_events")).one()
        finally:
            engine.dispose()
    assert states == {"job-a": "SUCCEEDED", "job-b": "SUCCEEDED"} and events == 2 * 4 * 4
    # a job's members were created together (one row a job); each then ran on a host of its own: a row each
    assert rows == 2 + 3 * 2 * 4
