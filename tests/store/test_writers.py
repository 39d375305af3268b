"""The job manager's writers, one per shard of jobs, on a real store: a job's changes always go through the same
writer (serialized per job), mutations over several shards are split and their results merged, a shard that fails
or is slow does not hold up the others (PostgreSQL: SQLite runs one shard)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import grpc
import pytest
from sqlalchemy.orm import Session, sessionmaker

from peloton.api.v1 import job_pb2, job_pb2_grpc
from peloton.domain.launch import TaskStatus
from peloton.domain.model import task_id_for
from peloton.domain.resources import Resources
from peloton.domain.states import JobState, TaskState
from peloton.errors import NotFound
from peloton.hostmgr.sim.backend import SimSettings
from peloton.jobmgr import gang_policy as policy
from peloton.jobmgr.writer import Kind, Mutation, Views, Writers, shard_of
from peloton.server import Daemon
from peloton.settings import ServerConfig
from peloton.store import db, repo
from tests.dbutil import postgres_database
from tests.store.test_writer import Recorded, create, stop

SHARDS = 3


def jobs_in_every_shard(n_per_shard: int = 2) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {i: [] for i in range(SHARDS)}
    i = 0
    while min(len(v) for v in out.values()) < n_per_shard:
        jid = f"job{i}"
        if len(out[shard_of(jid, SHARDS)]) < n_per_shard:
            out[shard_of(jid, SHARDS)].append(jid)
        i += 1
    return out


@pytest.fixture
def writers(sessions: sessionmaker[Session]) -> Iterator[tuple[Writers, Recorded]]:
    rec = Recorded()
    w = Writers(SHARDS, sessions, rec.publish, rec.perform, clock=lambda: 50.0)
    w.start()
    yield w, rec
    w.stop()


def test_a_job_always_goes_through_the_writer_of_its_shard(writers: tuple[Writers, Recorded]) -> None:
    w, _ = writers
    by_shard = jobs_in_every_shard()
    threads: dict[str, set[str]] = {}

    def note(views: Views, now: float) -> policy.Effects:
        for jid in views:
            threads.setdefault(jid, set()).add(threading.current_thread().name)
        return policy.Effects()

    for ids in by_shard.values():
        for jid in ids:
            create(w, jid)  # type: ignore[arg-type]
    for _ in range(3):
        for ids in by_shard.values():
            for jid in ids:
                w.mutate([jid], note)
    assert all(len(names) == 1 for names in threads.values())
    assert {next(iter(threads[ids[0]])) for ids in by_shard.values()} == {
        f"jobmgr-writer-{i}" for i in range(SHARDS)}


def test_a_mutation_over_several_shards_is_split_and_merged(writers: tuple[Writers, Recorded],
                                                            sessions: sessionmaker[Session]) -> None:
    w, _ = writers
    ids = [jid for part in jobs_in_every_shard().values() for jid in part]
    for jid in ids:
        create(w, jid)  # type: ignore[arg-type]
    seen: list[tuple[str, list[str]]] = []

    def stop_all(views: Views, now: float) -> policy.Effects:
        seen.append((threading.current_thread().name, sorted(views)))
        eff = policy.Effects()
        for jv in views.values():
            eff.merge(policy.stop_job(jv, now))
        return eff

    eff = w.mutate(ids, stop_all)
    assert len(seen) == SHARDS  # each shard ran it on its own jobs only
    assert sorted(j for _, part in seen for j in part) == sorted(ids)
    assert all(shard_of(j, SHARDS) == int(name.rsplit("-", 1)[1]) for name, part in seen for j in part)
    assert set(eff.jobs) == set(ids)  # the merged effects
    with db.transaction(sessions) as s:
        assert {j.state for j in repo.get_jobs(s, ids).values()} == {JobState.KILLED}
    counts = w.read_each(lambda views: len(views), ids)
    assert len(counts) == SHARDS  # a query: one answer per shard asked


def test_a_failing_part_fails_the_call_and_the_other_shards_commit(writers: tuple[Writers, Recorded],
                                                                   sessions: sessionmaker[Session]) -> None:
    """Split parts are not atomic with each other (every multi-job change is a set of per-job changes)."""
    w, _ = writers
    by_shard = jobs_in_every_shard(1)
    ids = [part[0] for part in by_shard.values()]
    for jid in ids:
        create(w, jid)  # type: ignore[arg-type]
    bad = ids[0]

    def check(views: Views) -> None:
        if bad in views:
            raise NotFound(f"job {bad}: refused by the test")

    def stop_all(views: Views, now: float) -> policy.Effects:
        eff = policy.Effects()
        for jv in views.values():
            eff.merge(policy.stop_job(jv, now))
        return eff

    with pytest.raises(NotFound, match="refused by the test"):
        w.mutate(ids, stop_all, check)
    with db.transaction(sessions) as s:
        states = {j.id: j.state for j in repo.get_jobs(s, ids).values()}
    assert states[bad] != JobState.KILLED
    assert all(states[j] == JobState.KILLED for j in ids[1:])
    assert w.mutate([bad], stop_all).jobs  # the shard that refused goes on


def test_clear_and_pause_reach_every_shard(writers: tuple[Writers, Recorded]) -> None:
    w, _ = writers
    ids = [part[0] for part in jobs_in_every_shard(1).values()]
    for jid in ids:
        create(w, jid)  # type: ignore[arg-type]
    assert sum(w.read_each(lambda views: len(views))) == SHARDS  # every shard's cache, no job named
    w.clear()
    assert sum(w.read_each(lambda views: len(views))) == 0
    w.pause("the test paused it")
    for jid in ids:
        with pytest.raises(Exception, match="the test paused it"):
            w.run(stop(jid))
    w.resume()
    for jid in ids:
        w.run(stop(jid))


def test_a_slow_shard_does_not_hold_up_the_others() -> None:
    """PostgreSQL only: SQLite takes one write transaction at a time, so the daemon runs a single writer there
    (`--jobmgr-writers` refuses more)."""
    with postgres_database() as url:
        db.upgrade(url)
        engine = db.make_engine(url)
        rec = Recorded()
        w = Writers(2, db.make_sessions(engine), rec.publish, rec.perform, clock=lambda: 50.0)
        w.start()
        try:
            slow, fast = jobs_in_every_shard(1)[0][0], jobs_in_every_shard(1)[1][0]
            for jid in (slow, fast):
                create(w, jid)  # type: ignore[arg-type]
            release = threading.Event()
            entered = threading.Event()

            def held(views: Views, now: float) -> policy.Effects:
                entered.set()
                release.wait(10)  # inside its transaction
                return policy.stop_job(views[slow], now)

            pending = w.submit(Mutation(Kind.APPLY, [slow], apply=held))
            assert entered.wait(5)
            w.run(stop(fast), timeout=5)  # committed while the other shard is busy
            assert not pending.done()
            release.set()
            pending.result(10)
        finally:
            release.set()
            w.stop()
            engine.dispose()


def test_mutate_by_job_hands_each_shard_only_its_items(writers: tuple[Writers, Recorded]) -> None:
    w, _ = writers
    ids = [jid for part in jobs_in_every_shard().values() for jid in part]
    for jid in ids[1:]:
        create(w, jid)  # type: ignore[arg-type]  # ids[0] does not exist: "deleted"
    calls: list[tuple[list[str], list[str]]] = []

    def make(part: Mapping[str, int]) -> Callable[[Views, float], policy.Effects]:
        def apply(views: Views, now: float) -> policy.Effects:
            calls.append((sorted(part), sorted(views)))
            return policy.Effects()
        return apply

    w.mutate_by_job({jid: i for i, jid in enumerate(ids)}, make)
    assert len(calls) == SHARDS
    assert sorted(j for part, _ in calls for j in part) == sorted(ids)
    for part, views in calls:
        assert {shard_of(j, SHARDS) for j in part} == {shard_of(part[0], SHARDS)}  # one shard's items
        assert views == [j for j in part if j != ids[0]]  # absent: only the job that does not exist


def test_status_updates_of_every_shard_at_once_through_the_daemon(db_url: str, tmp_path: Path) -> None:
    """One batch of status updates for jobs of every shard: each shard applies its own jobs' updates and takes no
    other shard's job for a deleted one (whose running tasks it would kill). SQLite: one shard, as the daemon
    allows."""
    writers = 1 if db_url.startswith("sqlite") else SHARDS
    d = Daemon(ServerConfig(listen="127.0.0.1:0", db_url=db_url, data_dir=tmp_path / "data", metrics_listen="",
                            backend="sim", jobmgr_writers=writers,
                            sim=SimSettings(hosts=8, resources=Resources(cpu=16, mem=16384), racks=1)))
    d.start()
    try:
        assert d.jobmgr is not None and len(d.jobmgr.writer.shards) == writers
        with grpc.insecure_channel(d.address) as ch:
            jobs = job_pb2_grpc.JobServiceStub(ch)

            def states() -> dict[str, str]:
                return {j: jobs.GetJob(job_pb2.GetJobRequest(job_id=j), timeout=10).job.status.state for j in ids}

            ids: list[str] = []
            # job ids are random: create until every shard has some (12 jobs miss one of 3 shards 2% of the time)
            for i in range(60):
                if len(ids) >= 12 and len({shard_of(j, writers) for j in ids}) == writers:
                    break
                spec = job_pb2.JobSpec(name=f"j{i}", instances=2)
                spec.task.command = "train.py"
                spec.task.env["PELOTON_SIM_DURATION"] = "3s"
                spec.task.resources.cpu = 1
                spec.task.resources.mem = "64Mi"
                spec.retry.max_attempts = 1
                ids.append(jobs.CreateJob(job_pb2.CreateJobRequest(spec=spec), timeout=10).job_id)
            assert len({shard_of(j, writers) for j in ids}) == writers
            deadline = time.monotonic() + 30
            while set(states().values()) != {"RUNNING"}:
                assert time.monotonic() < deadline, states()
                time.sleep(0.1)
            # what the task-events loop hands over when updates of many jobs arrive together (a repeat: no change)
            d.jobmgr.apply_statuses([TaskStatus(task_id_for(j, i, 1), TaskState.RUNNING, time.time())
                                     for j in ids for i in range(2)])
            d.jobmgr.effects.drain(10)
            assert set(states().values()) == {"RUNNING"}
            deadline = time.monotonic() + 30
            while not all(s in ("SUCCEEDED", "FAILED", "KILLED") for s in states().values()):
                assert time.monotonic() < deadline, states()
                time.sleep(0.2)
            assert set(states().values()) == {"SUCCEEDED"}, states()
    finally:
        d.stop()
