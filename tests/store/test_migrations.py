"""Alembic chain: one head, upgrade/downgrade round trip, and models == migrations (both backends)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect, text

from peloton.domain.model import Gang, Job, ResourcePool, Task, TaskEvent
from peloton.domain.resources import Resources
from peloton.domain.spec import JobSpec
from peloton.domain.states import TaskState
from peloton.errors import InvalidArgument
from peloton.jobmgr import gang_policy as policy
from peloton.store import db, repo
from peloton.store.models import Base

TABLES = {"jobs", "gangs", "tasks", "task_events", "resource_pools", "meta", "audit_events", "task_uids", "models"}


def _script() -> ScriptDirectory:
    return ScriptDirectory(str(db.MIGRATIONS_DIR))


def _head() -> str:
    head = _script().get_current_head()
    assert head is not None
    return head


def _tables(url: str) -> set[str]:
    engine = db.make_engine(url)
    try:
        return set(inspect(engine).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()


def test_single_head() -> None:
    heads = _script().get_heads()
    assert len(heads) == 1, f"migrations must have exactly one head, got {heads}"
    assert heads[0] == "0013"


def test_the_head_read_from_the_scripts_names_is_alembics() -> None:
    """db.head_revision (which spares a store at head Alembic's import) reads the head from the file names: each
    script's revision is its name's first four digits, each the one before plus one."""
    revisions = sorted(_script().walk_revisions(), key=lambda r: r.revision)
    for i, r in enumerate(revisions, 1):
        assert r.revision == f"{i:04d}" == Path(r.path).name[:4], r.path
        assert r.down_revision == (None if i == 1 else f"{i - 1:04d}"), r.path
    assert db.head_revision() == _head()


def test_a_store_at_head_is_not_handed_to_alembic_and_any_other_is(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    upgrades: list[str] = []
    real = command.upgrade

    def counted(cfg: Any, rev: str) -> None:
        upgrades.append(rev)
        real(cfg, rev)

    monkeypatch.setattr(command, "upgrade", counted)
    db.upgrade(db_url, "0010")
    db.upgrade(db_url)  # 0010 -> head: Alembic's
    assert upgrades == ["0010", "head"] and db.current_revision(db_url) == _head()
    db.upgrade(db_url)  # at head: nothing for Alembic
    assert upgrades == ["0010", "head"]
    db.upgrade(db_url, _head())  # a revision named: Alembic's, as before
    assert upgrades == ["0010", "head", _head()]


def test_a_daemon_on_a_store_at_head_imports_no_alembic(db_url: str) -> None:
    """A restart's store check loads neither Alembic nor (on SQLite) SQLAlchemy's PostgreSQL dialect."""
    db.upgrade(db_url)
    code = ("import json, sys\n"
            "from peloton import server\n"
            "from peloton.store import db\n"
            f"db.upgrade({db_url!r})\n"
            "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules if m.startswith(('alembic', 'mako'))}"
            " | {m for m in sys.modules if m == 'sqlalchemy.dialects.postgresql'})))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    loaded = json.loads(r.stdout.strip().splitlines()[-1])
    assert loaded == ([] if db.sqlite_path(db_url) else ["sqlalchemy.dialects.postgresql"])


def test_upgrade_downgrade_upgrade(db_url: str) -> None:
    assert db.current_revision(db_url) is None
    db.upgrade(db_url)
    db.upgrade(db_url)  # idempotent
    assert db.current_revision(db_url) == _head()
    assert _tables(db_url) == TABLES

    engine = db.make_engine(db_url)
    sessions = db.make_sessions(engine)
    try:
        with db.transaction(sessions) as s:
            repo.ensure_root_pool(s, 1.0)
            repo.set_meta(s, "k", "v")
    finally:
        engine.dispose()

    db.downgrade(db_url, "base")
    assert db.current_revision(db_url) is None
    assert _tables(db_url) == set()

    db.upgrade(db_url)
    assert db.current_revision(db_url) == _head()
    assert _tables(db_url) == TABLES
    engine = db.make_engine(db_url)
    sessions = db.make_sessions(engine)
    try:
        with db.transaction(sessions) as s:
            assert repo.list_pools(s) == []
            assert repo.get_meta(s, "k") is None
    finally:
        engine.dispose()


def test_models_match_migrations(db_url: str) -> None:
    db.upgrade(db_url)
    engine = db.make_engine(db_url)
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"compare_type": True})
            diff = compare_metadata(ctx, Base.metadata)
        assert diff == []
    finally:
        engine.dispose()


def _job_states(url: str) -> dict[str, str]:
    engine = db.make_engine(url)
    try:
        with engine.connect() as conn:
            return {r[0]: r[1] for r in conn.execute(text("SELECT id, state FROM jobs"))}
    finally:
        engine.dispose()


def test_0008_marks_failing_jobs_and_its_downgrade_gives_back_a_state_0007_knows(db_url: str) -> None:
    """A job failing when the release before FAILING stopped (RUNNING desired, a gang ABORTING) is FAILING after the
    upgrade; a stopped job (KILLING) and a restarting one (its gang QUEUED) are left alone; the downgrade turns
    FAILING into PENDING, which that release reads (and derives again at start)."""
    db.upgrade(db_url, "0007")
    engine = db.make_engine(db_url)
    jobs = [("failing", "PENDING", "RUNNING", "ABORTING"), ("running-failing", "RUNNING", "RUNNING", "ABORTING"),
            ("stopped", "KILLING", "KILLED", "ABORTING"), ("restarting", "PENDING", "RUNNING", "QUEUED"),
            ("done", "FAILED", "RUNNING", "DONE")]
    try:
        with engine.begin() as conn:
            for jid, state, desired, gang in jobs:
                conn.execute(text(
                    "INSERT INTO jobs (id, name, owner, respool, spec, state, desired, reason, priority, created_at, "
                    "updated_at, completed_at) VALUES (:id, 'j', '', '/', '{}', :state, :desired, '', 0, 1, 1, 0)"),
                    {"id": jid, "state": state, "desired": desired})
                conn.execute(text(
                    "INSERT INTO gangs (job_id, idx, instances, state, attempt, reason, launch_deadline, updated_at) "
                    "VALUES (:id, 0, '[0]', :gang, 1, '', 0, 1)"), {"id": jid, "gang": gang})
    finally:
        engine.dispose()
    db.upgrade(db_url)
    assert _job_states(db_url) == {"failing": "FAILING", "running-failing": "FAILING", "stopped": "KILLING",
                                   "restarting": "PENDING", "done": "FAILED"}
    db.downgrade(db_url, "0007")
    assert _job_states(db_url) == {"failing": "PENDING", "running-failing": "PENDING", "stopped": "KILLING",
                                   "restarting": "PENDING", "done": "FAILED"}


def _event_rows(url: str) -> list[tuple[object, ...]]:
    engine = db.make_engine(url)
    try:
        with engine.connect() as conn:
            return [tuple(r) for r in conn.execute(text(
                "SELECT job_id, instance, attempt, state, time, host, reason, message, exit_code FROM task_events "
                "ORDER BY id"))]
    finally:
        engine.dispose()


def test_0012_keeps_every_event_and_its_downgrade_writes_a_row_per_task(db_url: str) -> None:
    """Rows written before 0012 are one task's each and read so after it; runs written after it (one row for a
    gang's transition) are written back as one row per task by the downgrade, so the release before reads every
    event."""
    db.upgrade(db_url, "0011")
    engine = db.make_engine(db_url)
    try:
        with engine.begin() as conn:
            conn.execute(text(
                "INSERT INTO jobs (id, name, owner, respool, spec, state, desired, reason, priority, created_at, "
                "updated_at, completed_at) VALUES ('j', 'j', '', '/', '{}', 'RUNNING', 'RUNNING', '', 0, 1, 1, 0)"))
            conn.execute(text(
                "INSERT INTO task_events (job_id, instance, attempt, state, time, host, reason, message, exit_code) "
                "VALUES ('j', 0, 1, 'PENDING', 1.0, '', 'job created', '', NULL), "
                "('j', 1, 1, 'PENDING', 1.0, '', 'job created', '', NULL)"))
    finally:
        engine.dispose()
    db.upgrade(db_url)
    engine = db.make_engine(db_url)
    try:
        with db.transaction(db.make_sessions(engine)) as s:
            assert [(e.instance, e.state.value) for e in repo.list_task_events(s, "j")[0]] == \
                [(0, "PENDING"), (1, "PENDING")]
            repo.append_task_events(s, [TaskEvent("j", i, 1, TaskState.RUNNING, 2.0, "h1", "", "up", None)
                                        for i in range(3)] + [TaskEvent("j", 1, 1, TaskState.FAILED, 3.0, "h1", "",
                                                                        "", 2)])
        with engine.connect() as conn:  # the three RUNNING events are one row
            assert conn.execute(text("SELECT count(*) FROM task_events")).scalar_one() == 4
    finally:
        engine.dispose()
    expected = sorted(_listed(db_url))
    assert len(expected) == 6
    db.downgrade(db_url, "0011")
    assert sorted(_event_rows(db_url)) == expected  # a row per task again, the same values
    db.upgrade(db_url)
    assert sorted(_listed(db_url)) == expected


def _listed(url: str) -> list[tuple[object, ...]]:
    engine = db.make_engine(url)
    try:
        with db.transaction(db.make_read_sessions(engine)) as s:
            return [(e.job_id, e.instance, e.attempt, e.state.value, e.time, e.host, e.reason, e.message, e.exit_code)
                    for e in repo.list_task_events(s, "j")[0]]
    finally:
        engine.dispose()


def _pool_children(url: str) -> dict[str, int]:
    engine = db.make_engine(url)
    try:
        with engine.connect() as conn:
            return {r[0]: r[1] for r in conn.execute(text("SELECT path, children FROM resource_pools"))}
    finally:
        engine.dispose()


def test_0013_counts_the_children_each_existing_pool_has(db_url: str) -> None:
    """A store made before 0013 has its pools' children counted into each parent's row, which a new job's commit
    reads (a job in a pool that already has children is refused), and which CreatePool and DeletePool keep after."""
    db.upgrade(db_url, "0012")
    engine = db.make_engine(db_url)
    try:
        with engine.begin() as conn:
            for path, parent in (("/", None), ("/a", "/"), ("/a/x", "/a"), ("/a/y", "/a"), ("/a/x/deep", "/a/x"),
                                 ("/b", "/")):
                conn.execute(text("INSERT INTO resource_pools (path, parent, reservation, share, created_at) "
                                  "VALUES (:path, :parent, '{}', 1, 1)"), {"path": path, "parent": parent})
    finally:
        engine.dispose()
    db.upgrade(db_url)
    assert _pool_children(db_url) == {"/": 2, "/a": 2, "/a/x": 1, "/a/y": 0, "/a/x/deep": 0, "/b": 0}
    engine = db.make_engine(db_url)
    try:
        sessions = db.make_sessions(engine)
        with pytest.raises(InvalidArgument, match=r"^respool: /a/x has child pools"), db.transaction(sessions) as s:
            repo.insert_job(s, *_job("j", "/a/x"))
        with db.transaction(sessions) as s:
            repo.insert_job(s, *_job("j", "/a/y"))
            repo.delete_pool(s, "/a/x/deep")
            repo.create_pool(s, ResourcePool(path="/b/c"))
    finally:
        engine.dispose()
    assert _pool_children(db_url) == {"/": 2, "/a": 2, "/a/x": 0, "/a/y": 0, "/b": 1, "/b/c": 0}
    db.downgrade(db_url, "0012")
    assert "children" not in {c["name"] for c in _columns(db_url, "resource_pools")}
    db.upgrade(db_url)
    assert _pool_children(db_url) == {"/": 2, "/a": 2, "/a/x": 0, "/a/y": 0, "/b": 1, "/b/c": 0}


def test_every_downgrade_and_upgrade_keeps_the_pool_tree_and_the_jobs(db_url: str) -> None:
    """An operator who rolls a release back downgrades a store with child pools and jobs, and upgrades it again
    later. On SQLite a migration that drops a column copies the table into a new one and drops the old one: with
    foreign keys on, that drop failed for a child pool's row (its `parent` refers to the old table: 0004-0006's
    downgrades and upgrades, 0013's downgrade), and a drop of `jobs` (0002's downgrade) would delete every gang,
    task and event with it (ON DELETE CASCADE). Every step down to 0001 and back keeps them all."""
    db.upgrade(db_url)
    tree = {"/": None, "/a": "/", "/a/x": "/a", "/a/x/deep": "/a/x", "/b": "/"}
    engine = db.make_engine(db_url)
    try:
        sessions = db.make_sessions(engine)
        with db.transaction(sessions) as s:
            repo.ensure_root_pool(s, 1.0)
            for path in ("/a", "/a/x", "/a/x/deep", "/b"):
                repo.create_pool(s, ResourcePool(path=path))
            repo.insert_job(s, *_job("j", "/b"))
    finally:
        engine.dispose()
    rows = _job_rows(db_url)
    assert rows["jobs"] == rows["gangs"] == rows["tasks"] == 1
    revisions = [f"{n:04d}" for n in range(int(_head()) - 1, 0, -1)]
    for rev in revisions:
        db.downgrade(db_url, rev)
        assert db.current_revision(db_url) == rev
        assert _pool_parents(db_url) == tree, rev
        assert _job_rows(db_url) == rows, rev
    for rev in [*revisions[::-1][1:], _head()]:
        db.upgrade(db_url, rev)
        assert _pool_parents(db_url) == tree, rev
        assert _job_rows(db_url) == rows, rev
    assert _pool_children(db_url) == {"/": 2, "/a": 1, "/a/x": 1, "/a/x/deep": 0, "/b": 0}


def _job_rows(url: str) -> dict[str, int]:
    engine = db.make_engine(url)
    try:
        with engine.connect() as conn:
            return {t: int(conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one())
                    for t in ("jobs", "gangs", "tasks", "task_events")}
    finally:
        engine.dispose()


def _pool_parents(url: str) -> dict[str, str | None]:
    engine = db.make_engine(url)
    try:
        with engine.connect() as conn:
            return {r[0]: r[1] for r in conn.execute(text("SELECT path, parent FROM resource_pools"))}
    finally:
        engine.dispose()


def _job(job_id: str, pool: str) -> tuple[Job, list[Gang], list[Task]]:
    return policy.new_job_records(job_id, JobSpec(name=job_id, respool=pool, instances=1, command="true",
                                                  resources=Resources(cpu=1)), 10.0)


def _columns(url: str, table: str) -> list[dict[str, Any]]:
    engine = db.make_engine(url)
    try:
        return list(inspect(engine).get_columns(table))  # type: ignore[arg-type]
    finally:
        engine.dispose()
