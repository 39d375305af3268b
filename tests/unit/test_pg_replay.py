"""benchmarks/pg_replay.py's reading of a PostgreSQL log, and the --pg-set settings of the benchmarks' databases."""

from __future__ import annotations

import pytest

from benchmarks.harness import database_settings
from benchmarks.pg_replay import fence_keys, jobs_created, writer_batches

BATCH = ('WITH i0 AS (INSERT INTO "jobs" ("id", "name") VALUES (\'job-1\', \'a\'), (\'job-2\', \'b\') RETURNING 1), '
         "f AS (SELECT key, value FROM meta WHERE key = ANY(ARRAY['daemon.epoch','jobmgr.epoch']) ORDER BY key "
         "FOR KEY SHARE) SELECT 1")
UPDATE = ('WITH i0 AS (INSERT INTO "task_events" ("job_id") VALUES (\'job-1\') RETURNING 1), '
          "f AS (SELECT key, value FROM meta WHERE key = ANY(ARRAY['daemon.epoch']) ORDER BY key FOR KEY SHARE) "
          "SELECT 1")


def line(pid: int, db: str, statement: str) -> str:
    return f"2026-11-27 22:12:03.958 UTC [{pid}] postgres@{db} LOG:  duration: 3.834 ms  statement: {statement}\n"


def test_the_batches_of_one_database_by_backend_in_order() -> None:
    log = [line(7, "run", "BEGIN"), line(7, "run", BATCH), line(8, "other", BATCH), line(9, "run", UPDATE),
           line(7, "run", "COMMIT"), "2026-11-27 22:12:04 UTC [7] LOG:  checkpoint starting: time\n",
           line(7, "run", UPDATE), line(7, "run_2", UPDATE)]
    assert writer_batches(log, "run") == {7: [BATCH, UPDATE], 9: [UPDATE]}
    assert writer_batches(log, "none") == {}


def test_jobs_created_counts_each_inserted_job_once() -> None:
    again = BATCH.replace("'job-2'", "'job-3'")  # job-1 twice: one job
    assert jobs_created([BATCH, UPDATE]) == 2
    assert jobs_created([BATCH, again]) == 3
    assert jobs_created([UPDATE]) == 0
    quoted = BATCH.replace("'job-2'", "'it''s'")
    assert jobs_created([quoted]) == 2


def test_fence_keys_are_the_epochs_read() -> None:
    assert fence_keys([BATCH, UPDATE]) == {"daemon.epoch", "jobmgr.epoch"}
    assert fence_keys(["WITH x AS (SELECT 1) SELECT 1"]) == set()


def test_database_settings_are_key_value() -> None:
    assert database_settings(("log_min_duration_statement=0", "auto_explain.log_analyze=on", "x=a=b")) == [
        ("log_min_duration_statement", "0"), ("auto_explain.log_analyze", "on"), ("x", "a=b")]
    assert database_settings(()) == []
    for bad in ("log_min_duration_statement", "=0", "Bad Key=1", "a;DROP=1"):
        with pytest.raises(ValueError, match="KEY=VALUE"):
            database_settings((bad,))
