"""One daemon acts on a store, and on a port, at a time (SQLite and PostgreSQL, the real daemon):
- a second daemon on the same store refuses to start, naming the first, and changes nothing;
- with --standby it waits, and takes over (recovering the first one's jobs) when the first dies;
- a port already taken refuses the start with one line naming the address (gRPC and metrics);
- (PostgreSQL) a daemon whose store lock is taken from it stops acting at once (UNAVAILABLE, NOT_SERVING) and
  recovers by itself when it holds the lock again."""

from __future__ import annotations

import re
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from sqlalchemy import Connection, create_engine, text
from sqlalchemy.orm import sessionmaker
from sqlalchemy.pool import NullPool

from peloton.api.v1 import host_pb2, host_pb2_grpc, job_pb2, job_pb2_grpc, respool_pb2, respool_pb2_grpc
from peloton.domain.resources import Resources
from peloton.leadership.lock import LOCK_KEY
from peloton.store import db, repo
from tests.dbutil import postgres_database
from tests.e2e.harness import PELOTON, wait_until
from tests.e2e.test_sim_e2e import SimDaemon

pytestmark = pytest.mark.e2e

JOB = """
name: {name}
instances: 2
task:
  command: train.py
  resources: {{cpu: 1, mem: 1Gi, gpu: 1}}
"""


@pytest.fixture
def first(db_url: str, tmp_path: Path) -> Iterator[SimDaemon]:
    d = SimDaemon(tmp_path / "first", db_url, sim_hosts=20)
    try:
        d.start()
        yield d
    finally:
        d.stop()


def server(data_dir: Path, db_url: str, *extra: str, listen: str = "127.0.0.1:0", metrics: str = "") -> list[str]:
    return [*PELOTON, "server", "--listen", listen, "--db", db_url, "--data-dir", str(data_dir), "--metrics-listen",
            metrics, "--backend", "sim", "--sim-hosts", "20", *extra]


def refused(cmd: list[str]) -> str:
    """Run a daemon that must refuse to start: its one-line error."""
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0, (r.stdout, r.stderr)
    assert "serving on" not in r.stdout
    errors = [line for line in r.stderr.splitlines() if line.startswith("peloton: error:")]
    assert len(errors) == 1, r.stderr
    assert "Traceback" not in r.stderr
    return errors[0]


def test_a_second_daemon_on_the_same_store_refuses_to_start_naming_the_first(
        first: SimDaemon, db_url: str, tmp_path: Path) -> None:
    job = first.create(JOB.format(name="before"), tmp_path)
    line = refused(server(tmp_path / "second", db_url))
    assert "another peloton daemon acts on" in line
    assert first.proc is not None and f"pid {first.proc.pid} on host {socket.gethostname()}" in line
    assert f"serving {first.address}" in line and re.search(r"since \d{4}-\d\d-\d\d \d\d:\d\d:\d\d", line)
    assert "--standby" in line
    # the first daemon goes on as if nothing happened
    assert first.wait_state(job, "RUNNING")["status"]["state"] == "RUNNING"
    assert first.create(JOB.format(name="after"), tmp_path)


def test_a_standby_takes_over_when_the_active_daemon_dies(first: SimDaemon, db_url: str, tmp_path: Path) -> None:
    job = first.create(JOB.format(name="survivor"), tmp_path)
    first.wait_state(job, "RUNNING")
    second = SimDaemon(tmp_path / "second", db_url, sim_hosts=20)
    second.data_dir.mkdir(parents=True)
    log = open(second.log_path, "w")  # noqa: SIM115 - the child keeps its own descriptor
    proc = subprocess.Popen(server(second.data_dir, db_url, "--standby", "--log-level", "info"),
                            stdout=subprocess.PIPE, stderr=log, text=True)
    second.proc = proc
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("peloton: standing by:") and f"pid {first.proc.pid}" in line, line  # type: ignore[union-attr]
        time.sleep(1.5)
        assert proc.poll() is None  # waiting, not acting: the first still serves alone
        assert first.state(job) == "RUNNING"
        first.kill9()
        line = proc.stdout.readline()
        m = re.search(r"serving on (\S+)", line)
        assert m, (line, second.log()[-3000:])
        second.address = m.group(1)
        # the first daemon's sim tasks died with it: recovery finds the gang partial and runs it again, whole
        j = wait_until(lambda: (lambda j: j if j["status"]["state"] == "RUNNING" and
                                all(t["attempt"] == 2 for t in second.tasks(job)) else None)(second.job(job)),
                       timeout=60, interval=0.5, what="the job to run again under the new daemon")
        assert j["status"]["task_states"] == {"RUNNING": 2}
        assert "took over the store lock" in second.log()
        assert second.create(JOB.format(name="new"), tmp_path)
    finally:
        second.stop()
        log.close()


def test_a_port_already_taken_refuses_the_start(first: SimDaemon, db_url: str, tmp_path: Path) -> None:
    own_db = f"sqlite:///{tmp_path}/other.db"  # another store, so only the port is in the way
    line = refused(server(tmp_path / "other", own_db, listen=first.address))
    assert line == f"peloton: error: --listen: cannot listen on {first.address} (address in use, or not ours)"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken = f"127.0.0.1:{s.getsockname()[1]}"
        line = refused(server(tmp_path / "other", own_db, metrics=taken))
    assert line.startswith(f"peloton: error: --metrics-listen: cannot listen on {taken}: "), line
    # the first daemon still answers alone on its address
    assert first.create(JOB.format(name="still-mine"), tmp_path)


def steal(conn: Connection, within_s: float = 0.5) -> bool:
    """Take the daemon's lock as soon as it is free; False if the daemon took it back first."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": LOCK_KEY}).scalar():
            return True
        time.sleep(0.005)
    return False


def test_losing_the_store_lock_stops_acting_until_it_is_held_again(tmp_path: Path) -> None:
    """PostgreSQL only: SQLite's lock is a flock the kernel holds for the process; it cannot be taken away. What
    another leader changed meanwhile is read back: a pool's limit, which the next create is judged by, and the
    hosts' drains, which placement follows (and the next drain would otherwise have written back over). A watch
    open when the lock goes ends UNAVAILABLE (it would see none of the other's changes), and one resumed afterwards
    gets a snapshot, not the history from before."""
    with postgres_database() as url:
        d = SimDaemon(tmp_path / "data", url, sim_hosts=20)
        d.start()
        thief = create_engine(url, poolclass=NullPool, isolation_level="AUTOCOMMIT")
        try:
            job = d.create(JOB.format(name="before"), tmp_path)
            d.wait_state(job, "RUNNING")
            ch = grpc.insecure_channel(d.address)
            jobs = job_pb2_grpc.JobServiceStub(ch)
            health = health_pb2_grpc.HealthStub(ch)
            capped = respool_pb2.ResourcePool(path="/capped")
            capped.limit.cpu = 2
            respool_pb2_grpc.ResourcePoolServiceStub(ch).CreatePool(respool_pb2.CreatePoolRequest(pool=capped),
                                                                    timeout=10)
            hosts = host_pb2_grpc.HostServiceStub(ch)
            names = sorted(h.hostname for h in hosts.ListHosts(host_pb2.ListHostsRequest(), timeout=10).hosts)
            hosts.DrainHost(host_pb2.DrainHostRequest(hostname=names[0]), timeout=10)
            watch = jobs.WatchJobs(job_pb2.WatchJobsRequest(job_ids=[job]), timeout=60)
            first = next(watch)
            assert first.snapshot and first.stream_id
            with thief.connect() as conn:
                # cut the connection that holds the daemon's lock, and take the lock before the daemon takes it back
                for _ in range(5):
                    # (pg_locks is the whole server's: this database's lock only, not another test's daemon's)
                    conn.execute(text("SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' "
                                      "AND objid = :lo AND pid <> pg_backend_pid() AND database = "
                                      "(SELECT oid FROM pg_database WHERE datname = current_database())"),
                                 {"lo": LOCK_KEY & 0xFFFFFFFF})
                    if steal(conn):
                        break
                else:
                    pytest.fail("the daemon took its lock back every time")
                spec = job_pb2.JobSpec(name="while-not-acting", instances=1)
                spec.task.command = "train.py"
                spec.task.resources.cpu = 1

                def refused_unavailable() -> str | None:
                    try:
                        jobs.CreateJob(job_pb2.CreateJobRequest(spec=spec), timeout=10)
                    except grpc.RpcError as e:
                        if e.code() == grpc.StatusCode.UNAVAILABLE:
                            return str(e.details())
                    return None

                why = wait_until(refused_unavailable, timeout=10, interval=0.2, what="creates to be refused")
                assert "lost its hold on the store" in why
                wait_until(lambda: health.Check(health_pb2.HealthCheckRequest(service="peloton")).status
                           == health_pb2.HealthCheckResponse.NOT_SERVING, timeout=10, what="NOT_SERVING")
                # per role: a daemon leads all its roles or none (one lock each, on one connection): placement
                # stops with the job manager
                for role in ("jobmgr", "resmgr", "placement", "hostmgr"):
                    assert health.Check(health_pb2.HealthCheckRequest(service=f"peloton.{role}")).status \
                        == health_pb2.HealthCheckResponse.NOT_SERVING, role
                assert d.state(job) == "RUNNING"  # reads go on
                with pytest.raises(grpc.RpcError) as ended:
                    for _ in watch:  # (heartbeats until the stream ends)
                        pass
                assert ended.value.code() == grpc.StatusCode.UNAVAILABLE, ended.value.details()
                assert "lost its hold on the store" in str(ended.value.details())
                with pytest.raises(grpc.RpcError) as refused_watch:
                    next(jobs.WatchJobs(job_pb2.WatchJobsRequest(job_ids=[job]), timeout=10))
                assert refused_watch.value.code() == grpc.StatusCode.UNAVAILABLE
                with db.transaction(sessionmaker(bind=thief)) as s:  # as another daemon leading meanwhile would
                    repo.update_pool(s, replace(repo.get_pool(s, "/capped"), limit=Resources(cpu=1)))
                    repo.set_drains(s, {names[-1]: 0.0})  # the other leader undrained one host, drained another
                conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": LOCK_KEY})
            wait_until(lambda: health.Check(health_pb2.HealthCheckRequest(service="peloton")).status
                       == health_pb2.HealthCheckResponse.SERVING, timeout=20, what="SERVING again")
            assert "holds the store lock again: recovered, acting" in d.log()
            two = job_pb2.JobSpec(name="over-the-new-limit", instances=2, respool="/capped")
            two.task.command = "train.py"
            two.task.resources.cpu = 1
            with pytest.raises(grpc.RpcError) as refused:
                jobs.CreateJob(job_pb2.CreateJobRequest(spec=two), timeout=10)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, refused.value.details()
            assert "/capped" in str(refused.value.details()) and "limit" in str(refused.value.details())
            resumed = next(jobs.WatchJobs(job_pb2.WatchJobsRequest(job_ids=[job], stream_id=first.stream_id,
                                                                   after_revision=first.revision), timeout=10))
            assert resumed.snapshot and [c.job_id for c in resumed.changes] == [job]
            drains = {h.hostname: h.drain for h in hosts.ListHosts(host_pb2.ListHostsRequest(), timeout=10).hosts}
            assert drains[names[0]] == "" and drains[names[-1]] in ("draining", "drained"), drains
            after = jobs.CreateJob(job_pb2.CreateJobRequest(spec=spec), timeout=10).job_id
            d.wait_state(after, "RUNNING")
            # the job from before was adopted whole by the recovery, not run twice
            assert [t["attempt"] for t in d.tasks(job)] == [1, 1]
            assert d.state(job) == "RUNNING"
            ch.close()
        finally:
            thief.dispose()
            d.stop()
