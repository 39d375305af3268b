"""A standby that could not adopt the leader's tasks refuses to start, naming why (the real daemons, the local
backend, on both stores): a local-backend leader's tasks are processes of its machine recorded in its data dir, so
a `--standby` with a data dir of its own would, once it took over from a paused leader, run their gangs again while
the leader's processes still ran. One sharing the leader's data dir still stands by and takes over, adopting the
running tasks. And a standby checks again before it takes over (PostgreSQL): if a leader it could not adopt from
has taken the lock meanwhile, it refuses then."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from peloton.leadership.lock import ROLE_KEYS, heartbeat_key, owner_key
from peloton.leadership.owner import Owner
from peloton.leadership.standby import data_dir_id, machine_id
from peloton.store import db
from tests.asroot import AS_ROOT_FLAGS
from tests.dbutil import postgres_database
from tests.e2e.harness import PELOTON, Daemon, kill_sandboxed_processes, wait_until

pytestmark = pytest.mark.e2e

SPEC = """
name: {name}
instances: 2
task: {{command: "sleep 600", resources: {{cpu: 1, mem: 64Mi}}}}
"""


@pytest.fixture
def leader(db_url: str, tmp_path: Path) -> Iterator[Daemon]:
    d = Daemon(tmp_path / "a", db_url)
    try:
        d.start()
        yield d
    finally:
        d.stop()
        kill_sandboxed_processes(tmp_path)


def _tasks(d: Daemon, job: str) -> list[tuple[str, int, str]]:
    return sorted((t["task_id"], t["attempt"], t["state"]) for t in d.tasks(job))


def _refused_standby(d: Daemon) -> str:
    """Start `d` with --standby: it must exit 1 at once, with one line saying why."""
    d.data_dir.mkdir(parents=True, exist_ok=True)
    r = subprocess.run([*PELOTON, "server", "--listen", "127.0.0.1:0", "--db", d.db_url, "--data-dir", str(d.data_dir),
                        "--metrics-listen", "", *AS_ROOT_FLAGS, *d.server_args(), "--standby"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, (r.stdout, r.stderr[-3000:])
    assert "standing by" not in r.stdout and "serving on" not in r.stdout, r.stdout
    errors = [line for line in r.stderr.splitlines() if line.startswith("peloton: error:")]
    assert len(errors) == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    return errors[0]


def test_a_standby_with_a_data_dir_of_its_own_refuses_to_start_naming_why(
        leader: Daemon, db_url: str, tmp_path: Path) -> None:
    job = leader.create(SPEC.format(name="running"), tmp_path)
    leader.wait_state(job, "RUNNING")
    before = _tasks(leader, job)
    other = Daemon(tmp_path / "b", db_url, port_base=leader.port_base)  # the leader's flags, its own data dir
    line = _refused_standby(other)
    assert line.startswith("peloton: error: --standby: this daemon could not adopt the leader's tasks"), line
    assert f"the leader's data dir {leader.data_dir.resolve()}" in line, line
    assert f"--data-dir {other.data_dir.resolve()} is another" in line, line
    assert leader.proc is not None and f"pid {leader.proc.pid}" in line, line
    assert f"Start it with --data-dir {leader.data_dir.resolve()}" in line, line
    # the leader goes on as if nothing happened: the same tasks, their first attempt, still running
    assert _tasks(leader, job) == before and {s for _, _, s in before} == {"RUNNING"}
    after = leader.create(SPEC.format(name="after"), tmp_path)
    leader.wait_state(after, "RUNNING")


def test_a_standby_sharing_the_leaders_data_dir_stands_by_and_takes_over_adopting_the_tasks(
        leader: Daemon, db_url: str, tmp_path: Path) -> None:
    job = leader.create(SPEC.format(name="adopted"), tmp_path)
    leader.wait_state(job, "RUNNING")
    before = _tasks(leader, job)
    standby = Daemon(leader.data_dir, db_url, port_base=leader.port_base)  # same machine, data dir and flags
    try:
        standby.start(standby=True)
        assert standby.proc is not None and standby.proc.poll() is None
        assert leader.proc is not None and f"pid {leader.proc.pid}" in standby.standing_by
        leader.kill9()
        standby.wait_serving()
        assert "took over the store lock" in standby.log()
        j = standby.wait_state(job, "RUNNING")
        assert j["status"]["task_states"] == {"RUNNING": 2}
        assert _tasks(standby, job) == before  # adopted: the same tasks, their first attempt, still running
        new = standby.create(SPEC.format(name="new"), tmp_path)
        standby.wait_state(new, "RUNNING")
    finally:
        standby.stop()


def test_a_standby_checks_again_before_it_takes_over(tmp_path: Path) -> None:
    """PostgreSQL: every role's lock held here, by a leader recorded as this machine with the standby's data dir
    (one it could adopt from); then another leader, with another data dir, is recorded in its place: the standby
    refuses to take over from it, and exits naming why."""
    data = tmp_path / "a"
    data.mkdir()
    with postgres_database() as url:
        db.upgrade(url)
        engine = create_engine(url, poolclass=NullPool, isolation_level="AUTOCOMMIT")
        with engine.connect() as conn:
            for key in ROLE_KEYS.values():
                assert conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": key}).scalar()

            def record(o: Owner) -> None:
                for role in ROLE_KEYS:
                    conn.execute(text("DELETE FROM meta WHERE key IN (:k, :h)"),
                                 {"k": owner_key(role), "h": heartbeat_key(role)})
                    conn.execute(text("INSERT INTO meta (key, value) VALUES (:k, :v), (:h, :t)"),
                                 {"k": owner_key(role), "v": o.to_json(), "h": heartbeat_key(role),
                                  "t": str(time.time() + 3600)})  # (never silent: no standby ends it)

            record(Owner.me("127.0.0.1:1", backend="local", machine=machine_id(), data_dir=str(data.resolve()),
                            data_dir_id=data_dir_id(data)))
            standby = Daemon(data, url)
            try:
                standby.start(standby=True)  # it could adopt from this one: it stands by
                other = tmp_path / "c"
                other.mkdir()
                record(Owner.me("127.0.0.1:2", backend="local", machine=machine_id(), data_dir=str(other.resolve()),
                                data_dir_id=data_dir_id(other)))
                assert standby.proc is not None
                wait_until(lambda: standby.proc.poll() is not None, 30, 0.1, "the standby to refuse")  # type: ignore[union-attr]
                assert standby.proc.returncode == 1
                errors = [line for line in standby.log().splitlines() if line.startswith("peloton: error:")]
                assert len(errors) == 1, standby.log()[-3000:]
                assert f"the leader's data dir {other.resolve()}" in errors[0], errors[0]
                assert f"--data-dir {data.resolve()} is another" in errors[0], errors[0]
            finally:
                standby.stop()
        engine.dispose()
