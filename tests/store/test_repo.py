"""Contract tests of peloton.store.repo, run on SQLite and PostgreSQL."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.orm import Session, sessionmaker

from peloton.domain.model import Gang, Job, ResourcePool, Task, TaskEvent
from peloton.domain.resources import Resources
from peloton.domain.spec import Constraint, JobSpec, Role, gang_partition, spec_from_dict, spec_to_dict
from peloton.domain.states import GangState, JobState, TaskState
from peloton.errors import AlreadyExists, Conflict, FailedPrecondition, NotFound
from peloton.store import db, repo
from peloton.store.models import GangRow, JobRow, TaskEventRow, TaskRow

Sessions = sessionmaker[Session]


def make_spec(name: str = "train", instances: int = 3, **kw: Any) -> JobSpec:
    base: dict[str, object] = {
        "name": name,
        "instances": instances,
        "command": "python train.py --lr 0.1",
        "resources": Resources(cpu=2.5, mem=4096.0, disk=100.0, gpu=1, ports=2),
        "owner": "alice",
        "respool": "/",
        "env": {"A": "1", "B": "two"},
        "container_image": "img:1",
        "min_available": 2,
        "priority": 5,
        "preemptible": True,
        "max_runtime_s": 3600.0,
        "constraints": (Constraint("zone", "eq", "us-1"), Constraint("gpu_type", "in", "a100,h100")),
    }
    base.update(kw)
    return JobSpec(**base)  # type: ignore[arg-type]


def make_job(job_id: str, *, created_at: float = 100.0, **spec_kw: Any) -> tuple[Job, list[Gang], list[Task]]:
    spec = make_spec(**spec_kw)
    job = Job(id=job_id, spec=spec, state=JobState.PENDING, created_at=created_at, updated_at=created_at)
    gangs = [Gang(job_id=job_id, index=gi, instances=members, updated_at=created_at)
             for gi, members in enumerate(gang_partition(spec))]
    tasks = [Task(job_id=job_id, instance=i, gang_index=g.index, updated_at=created_at)
             for g in gangs for i in g.instances]
    return job, gangs, tasks


def add_job(sessions: Sessions, job_id: str, **kw: Any) -> tuple[Job, list[Gang], list[Task]]:
    job, gangs, tasks = make_job(job_id, **kw)
    with db.transaction(sessions) as s:
        repo.insert_job(s, job, gangs, tasks)
    return job, gangs, tasks


# --- jobs -------------------------------------------------------------------------------------------------
def test_job_round_trip(sessions: Sessions) -> None:
    job, gangs, tasks = add_job(sessions, "j1")
    with db.transaction(sessions) as s:
        got = repo.get_job(s, "j1")
        assert got == job
        assert spec_from_dict(spec_to_dict(got.spec)) == job.spec
        assert got.spec.constraints == job.spec.constraints
        assert repo.get_gangs(s, "j1") == gangs
        assert repo.get_tasks(s, "j1") == tasks
        row = s.execute(select(JobRow.name, JobRow.owner, JobRow.respool, JobRow.priority)).one()
        assert tuple(row) == ("train", "alice", "/", 5)


def test_a_job_with_roles_round_trips(sessions: Sessions) -> None:
    """Each role's task as given, unicode and all; a task's role comes from the spec and its instance."""
    roles = (Role("ps", 2, "python ps.py", Resources(cpu=4, mem=8192.5, ports=1), env={"É": "ü"},
                  env_files={"TOKEN": "/etc/tök"}, container_image="tf:2"),
             Role("worker-gpu", 3, "python w.py --x 'y'", Resources(cpu=2, gpu=1, ports=1)))
    job, gangs, tasks = add_job(sessions, "jr", instances=5, command="", resources=Resources(), env={},
                                container_image="", min_available=0, roles=roles)
    assert len(gangs) == 1 and gangs[0].instances == [0, 1, 2, 3, 4]
    with db.transaction(sessions) as s:
        got = repo.get_job(s, "jr")
    assert got.spec == job.spec and got.spec.roles == roles
    assert got.spec.role_at(4) == (roles[1], 2)


def test_insert_job_duplicate(sessions: Sessions) -> None:
    add_job(sessions, "j1")
    with pytest.raises(AlreadyExists, match="j1"), db.transaction(sessions) as s:
        repo.insert_job(s, *make_job("j1"))


def test_get_job_not_found(sessions: Sessions) -> None:
    with db.transaction(sessions) as s, pytest.raises(NotFound, match="nope"):
        repo.get_job(s, "nope")


def test_get_jobs_batch(sessions: Sessions) -> None:
    for j in ("a", "b", "c"):
        add_job(sessions, j)
    with db.transaction(sessions) as s:
        got = repo.get_jobs(s, ["a", "c", "missing", "a"])
        assert set(got) == {"a", "c"}
        assert got["c"].id == "c"
        assert repo.get_jobs(s, []) == {}


def test_list_jobs_filters_order_limit(sessions: Sessions) -> None:
    add_job(sessions, "j1", created_at=1.0, name="alpha", owner="alice")
    add_job(sessions, "j2", created_at=2.0, name="Beta_run", owner="bob")
    add_job(sessions, "j3", created_at=3.0, name="gamma%", owner="alice")
    with db.transaction(sessions) as s:
        repo.ensure_root_pool(s, 0.0)
        repo.create_pool(s, ResourcePool(path="/team"))
    add_job(sessions, "j4", created_at=4.0, name="delta", owner="bob", respool="/team")
    with db.transaction(sessions) as s:
        j2 = repo.get_job(s, "j2")
        j2.state = JobState.RUNNING
        repo.update_jobs(s, [j2])

    def ids(**kw: object) -> list[str]:
        with db.transaction(sessions) as s:
            return [j.id for j in repo.list_jobs(s, **kw)]  # type: ignore[arg-type]

    assert ids() == ["j4", "j3", "j2", "j1"]
    assert ids(limit=2) == ["j4", "j3"]
    assert ids(owner="alice") == ["j3", "j1"]
    assert ids(respool="/team") == ["j4"]
    assert ids(states=[JobState.RUNNING]) == ["j2"]
    assert ids(states=[JobState.RUNNING, JobState.PENDING], owner="bob") == ["j4", "j2"]
    assert ids(states=[]) == []
    assert ids(name_contains="beta") == ["j2"]  # case-insensitive on both backends
    assert ids(name_contains="_") == ["j2"]  # LIKE wildcards are escaped
    assert ids(name_contains="%") == ["j3"]
    assert ids(name_contains="zzz") == []
    assert ids(id_prefix="j") == ["j4", "j3", "j2", "j1"] and ids(id_prefix="j3") == ["j3"]
    assert ids(id_prefix="j", owner="alice", limit=1) == ["j3"] and ids(id_prefix="k") == []


def test_update_jobs(sessions: Sessions) -> None:
    job, _, _ = add_job(sessions, "j1")
    job.state, job.desired, job.reason = JobState.KILLED, "KILLED", "user asked"
    job.updated_at, job.completed_at = 200.5, 201.25
    with db.transaction(sessions) as s:
        repo.update_jobs(s, [job])
    with db.transaction(sessions) as s:
        assert repo.get_job(s, "j1") == job
        ghost = dataclasses.replace(job, id="ghost")
        with pytest.raises(NotFound, match="ghost"):
            repo.update_jobs(s, [ghost])


def test_delete_job_cascades(sessions: Sessions) -> None:
    add_job(sessions, "j1")
    add_job(sessions, "j2")
    with db.transaction(sessions) as s:
        repo.append_task_events(s, [TaskEvent("j1", 0, 1, TaskState.PENDING, 1.0),
                                    TaskEvent("j2", 0, 1, TaskState.PENDING, 1.0)])
    with db.transaction(sessions) as s:
        repo.delete_job(s, "j1")
    with db.transaction(sessions) as s:
        with pytest.raises(NotFound):
            repo.get_job(s, "j1")
        assert repo.get_gangs(s, "j1") == []
        assert repo.get_tasks(s, "j1") == []
        assert repo.get_task_events(s, "j1", 0) == []
        for model in (GangRow, TaskRow, TaskEventRow):
            assert s.execute(select(func.count()).select_from(model).where(model.job_id == "j1")).scalar() == 0
        # the other job is untouched
        assert repo.get_job(s, "j2").id == "j2"
        assert len(repo.get_tasks(s, "j2")) == 3
        assert len(repo.get_task_events(s, "j2", 0)) == 1
        with pytest.raises(NotFound, match="j1"):
            repo.delete_job(s, "j1")


# --- gangs ------------------------------------------------------------------------------------------------
def test_gangs_update_and_states(sessions: Sessions) -> None:
    _, gangs1, _ = add_job(sessions, "j1", instances=4, min_available=2)  # gangs [0,1], [2], [3]
    _, gangs2, _ = add_job(sessions, "j0", instances=2, min_available=0)  # one gang [0,1]
    assert [g.instances for g in gangs1] == [[0, 1], [2], [3]]
    gangs1[0].state, gangs1[0].attempt, gangs1[0].reason = GangState.PLACED, 2, "placed on h1"
    gangs1[0].launch_deadline, gangs1[0].updated_at = 999.5, 500.0
    gangs1[2].state = GangState.RUNNING
    gangs1[2].plan = '{"gpus_per_host": [2, 2], "step_time": 1.5, "samples_per_s": 21.3}'  # a model-aware run's
    gangs2[0].state = GangState.PLACED
    with db.transaction(sessions) as s:
        repo.update_gangs(s, [gangs1[0], gangs1[2], gangs2[0]])
        repo.update_gangs(s, [])
    with db.transaction(sessions) as s:
        assert repo.get_gangs(s, "j1") == gangs1
        placed = repo.gangs_in_states(s, [GangState.PLACED])
        assert [(g.job_id, g.index) for g in placed] == [("j0", 0), ("j1", 0)]
        both = repo.gangs_in_states(s, [GangState.PLACED, GangState.RUNNING, GangState.QUEUED])
        assert [(g.job_id, g.index) for g in both] == [("j0", 0), ("j1", 0), ("j1", 1), ("j1", 2)]
        assert repo.gangs_in_states(s, []) == []
        assert repo.get_gangs(s, "unknown") == []


# --- tasks ------------------------------------------------------------------------------------------------
def test_tasks_update_batch_and_lookup(sessions: Sessions) -> None:
    _, _, tasks = add_job(sessions, "j1", instances=3)
    add_job(sessions, "j2", instances=2)
    t0, t2 = tasks[0], tasks[2]
    t0.attempt, t0.state, t0.host, t0.address = 2, TaskState.RUNNING, "h1", "10.0.0.1"
    t0.ports, t0.gpu_ids, t0.started_at, t0.updated_at = [31000, 31001], [0, 3], 10.5, 11.0
    t2.state, t2.exit_code, t2.reason, t2.message = TaskState.FAILED, 137, "oom", "killed: out of memory"
    t2.finished_at = 12.25
    with db.transaction(sessions) as s:
        repo.update_tasks(s, [t0, t2])
        repo.update_tasks(s, [])
        assert repo.get_tasks(s, "j1") == tasks  # visible inside the same transaction
    with db.transaction(sessions) as s:
        assert repo.get_tasks(s, "j1") == tasks
        assert repo.get_tasks(s, "j1", [2, 0]) == [t0, t2]
        assert repo.get_tasks(s, "j1", []) == []
        assert repo.get_tasks(s, "nope") == []
        # then back to None / empty lists
        t0.exit_code, t0.ports, t0.gpu_ids = None, [], []
        repo.update_tasks(s, [t0])
        assert repo.get_tasks(s, "j1", [0]) == [t0]


def test_update_tasks_many(sessions: Sessions) -> None:
    add_job(sessions, "big", instances=2500, min_available=1)
    with db.transaction(sessions) as s:
        tasks = repo.get_tasks(s, "big")
        assert len(tasks) == 2500
        for t in tasks:
            t.state = TaskState.PENDING
        repo.update_tasks(s, tasks)
        assert repo.task_state_counts(s, ["big"]) == {"big": {"PENDING": 2500}}


def test_update_missing_rows_not_found(sessions: Sessions) -> None:
    _, gangs, tasks = add_job(sessions, "j1", instances=2)
    with pytest.raises(NotFound, match="tasks"), db.transaction(sessions) as s:
        repo.update_tasks(s, [tasks[0], Task(job_id="j1", instance=7, gang_index=0)])
    with pytest.raises(NotFound, match="gangs"), db.transaction(sessions) as s:
        repo.update_gangs(s, [Gang(job_id="ghost", index=0, instances=[0])])


def test_task_state_counts(sessions: Sessions) -> None:
    _, _, tasks = add_job(sessions, "j1", instances=3)
    add_job(sessions, "j2", instances=2)
    tasks[0].state = TaskState.RUNNING
    tasks[1].state = TaskState.RUNNING
    with db.transaction(sessions) as s:
        repo.update_tasks(s, tasks)
        counts = repo.task_state_counts(s, ["j1", "j2", "none"])
    assert counts == {"j1": {"RUNNING": 2, "INITIALIZED": 1}, "j2": {"INITIALIZED": 2}, "none": {}}
    with db.transaction(sessions) as s:
        assert repo.task_state_counts(s, []) == {}


# Text a store must keep as it is, whatever the way a batch is sent (bulk.pg_array on PostgreSQL: array literals)
AWKWARD_TEXT = ["", "NULL", "null", 'say "hi"', "back\\slash", "\\", '\\"', "{braces}", "a,b", " lead and trail ",
                "tab\tnew\nline", "ünïcødé ✓", "'single'", "}{", "x" * 256]  # (host and address hold 256)


def test_updated_tasks_keep_awkward_text_and_numbers_on_every_way_a_batch_goes(sessions: Sessions) -> None:
    """The updates of tasks through a one-statement group commit (repo.Writes; PostgreSQL: bulk.write_batch) and
    through the per-table update (repo.update_tasks; chunked) store each value as given: quotes, backslashes, braces,
    commas, the word NULL, blanks, line breaks and other scripts in text; None; large and fractional numbers."""
    n = len(AWKWARD_TEXT)
    _, _, tasks = add_job(sessions, "j1", instances=n)
    _, _, more = add_job(sessions, "j2", instances=n)

    def changed(ts: list[Task], flip: bool) -> list[Task]:
        return [dataclasses.replace(t, state=TaskState.RUNNING, host=text_, address=AWKWARD_TEXT[-1 - i],
                                    reason=text_, message=text_ + "!", exit_code=None if i % 2 else -(2 ** 31) + i,
                                    started_at=1_790_000_000.123456 + i, finished_at=0.0 if flip else 1e-7,
                                    updated_at=float(i), attempt=2 ** 31 - 1 - i)
                for i, (t, text_) in enumerate(zip(ts, AWKWARD_TEXT, strict=True))]

    first, second = changed(tasks, False), changed(more, True)
    with db.transaction(sessions) as s:
        w = repo.Writes()
        w.send(s, tasks=first)  # a group commit's one statement (PostgreSQL)
    with db.transaction(sessions) as s:
        repo.update_tasks(s, second)  # the per-table way
    with db.transaction(sessions) as s:
        got = repo.get_tasks(s, "j1") + repo.get_tasks(s, "j2")
    assert [{k: v for k, v in dataclasses.asdict(g).items() if v != getattr(w, k)}
            for g, w in zip(got, first + second, strict=True) if g != w] == []


def test_text_longer_than_its_column_is_never_cut_short(sessions: Sessions) -> None:
    """A host name or address longer than its column (256): PostgreSQL refuses it on every way a batch goes, as
    it refuses such an insert, and the transaction writes nothing; SQLite, which does not bound text, keeps it
    whole. Never stored cut short (a cast of the update's array to VARCHAR(256)[] did that, without a word)."""
    _, _, tasks = add_job(sessions, "j1", instances=2)
    long = "h" * 300
    with sessions() as probe:
        postgres = probe.get_bind().dialect.name == "postgresql"
    for send in (lambda s, ts: repo.Writes().send(s, tasks=ts), repo.update_tasks):
        changed = [dataclasses.replace(tasks[0], host="ok", address=long), dataclasses.replace(tasks[1], host=long)]
        if postgres:
            with pytest.raises(Exception, match="too long"), db.transaction(sessions) as s:
                send(s, changed)
            with db.transaction(sessions) as s:
                assert [(t.host, t.address) for t in repo.get_tasks(s, "j1")] == [(t.host, t.address) for t in tasks]
        else:
            with db.transaction(sessions) as s:
                send(s, changed)
            with db.transaction(sessions) as s:
                assert [(t.host, t.address) for t in repo.get_tasks(s, "j1")] == [("ok", long), (long, "")]


# --- events -----------------------------------------------------------------------------------------------
def test_task_events(sessions: Sessions) -> None:
    add_job(sessions, "j1")
    evs = [
        TaskEvent("j1", 0, 1, TaskState.PENDING, 1.0),
        TaskEvent("j1", 0, 1, TaskState.RUNNING, 2.0, host="h1", reason="launched", message="ok"),
        TaskEvent("j1", 0, 1, TaskState.FAILED, 3.0, host="h1", reason="exit", message="boom", exit_code=2),
        TaskEvent("j1", 1, 1, TaskState.PENDING, 1.5),
    ]
    with db.transaction(sessions) as s:
        repo.append_task_events(s, [evs[2], evs[0]])  # out of time order
        repo.append_task_events(s, [evs[1], evs[3]])
        repo.append_task_events(s, [])
    with db.transaction(sessions) as s:
        assert repo.get_task_events(s, "j1", 0) == evs[:3]
        assert repo.get_task_events(s, "j1", 1) == [evs[3]]
        assert repo.get_task_events(s, "j1", 2) == []


def test_a_jobs_events_across_its_members_come_in_one_read_newest_first_cut(sessions: Sessions) -> None:
    """ListTaskEvents' read: the job's newest events of the members asked for (consecutive ones as a range,
    scattered ones as a list), oldest first, and how many match beyond the cut."""
    add_job(sessions, "j1", instances=6)
    add_job(sessions, "j2")
    evs = [TaskEvent("j1", i, 1, st, 10.0 * i + k) for i in range(6)
           for k, st in enumerate((TaskState.PENDING, TaskState.RUNNING))]
    with db.transaction(sessions) as s:
        repo.append_task_events(s, list(reversed(evs)) + [TaskEvent("j2", 0, 1, TaskState.PENDING, 0.5)])
    with db.transaction(sessions) as s:
        assert repo.list_task_events(s, "j1") == (evs, 12)
        assert repo.list_task_events(s, "j1", newest=3) == (evs[-3:], 12)  # the newest, still oldest first
        assert repo.list_task_events(s, "j1", [1, 2, 3]) == (evs[2:8], 6)  # a range
        assert repo.list_task_events(s, "j1", [5, 0], newest=3) == ([evs[1], evs[10], evs[11]], 4)  # scattered
        assert repo.list_task_events(s, "j1", list(range(0, 6, 2)) * 40) == ([e for e in evs if e.instance % 2 == 0],
                                                                            6)
        many = list(range(0, 400, 2))  # more runs than are asked for as ranges: a list
        assert repo.list_task_events(s, "j1", many) == ([e for e in evs if e.instance % 2 == 0], 6)
        assert repo.list_task_events(s, "j1", []) == ([], 0)
        assert repo.list_task_events(s, "nope") == ([], 0)


def test_a_gangs_transition_is_one_row_and_reads_back_as_an_event_per_member(sessions: Sessions) -> None:
    """Consecutive members' same transition is stored as one row (a run), at most EVENT_SPAN_MAX + 1 members long,
    and every read gives one event per member as if each had its own row: one task's history, a job's across its
    members (ranges cut from a run, scattered members, the newest cut inside a run) and the counts."""
    n = repo.EVENT_SPAN_MAX + 45  # one run is too long for a row: two rows
    add_job(sessions, "j1", instances=n)
    add_job(sessions, "j2", instances=2)
    created = [TaskEvent("j1", i, 1, TaskState.PENDING, 1.0, reason="job created") for i in range(n)]
    # members 0-7 on h1, 8-9 on h2, then 11 (10 not in this batch), all at 2.0; j2's two right after
    running = ([TaskEvent("j1", i, 1, TaskState.RUNNING, 2.0, host="h1") for i in range(8)]
               + [TaskEvent("j1", i, 1, TaskState.RUNNING, 2.0, host="h2") for i in (8, 9, 11)]
               + [TaskEvent("j2", i, 1, TaskState.RUNNING, 2.0, host="h2") for i in (0, 1)])
    ended = [TaskEvent("j1", i, 1, TaskState.FAILED, 3.0, host="h1", message="boom", exit_code=2) for i in range(8)]
    with db.transaction(sessions) as s:
        repo.append_task_events(s, created)
    with db.transaction(sessions) as s:
        w = repo.Writes()  # the writer's path
        w.append_task_events(running + ended)
        w.send(s)
    with db.transaction(sessions) as s:
        rows = s.execute(text("SELECT job_id, instance, span FROM task_events ORDER BY id")).all()
    assert [tuple(r) for r in rows] == [("j1", 0, repo.EVENT_SPAN_MAX), ("j1", repo.EVENT_SPAN_MAX + 1, 43),
                                        ("j1", 0, 7), ("j1", 8, 1), ("j1", 11, 0), ("j2", 0, 1), ("j1", 0, 7)]
    every = [e for i in range(n) for e in created[i:i + 1] + [e for e in running + ended
                                                                if e.job_id == "j1" and e.instance == i]]
    by_time = sorted(every, key=lambda e: (e.time, e.instance))  # each transition's members in order
    with db.transaction(sessions) as s:
        assert repo.get_task_events(s, "j1", 3) == [created[3], running[3], ended[3]]
        assert repo.get_task_events(s, "j1", 3, newest=2) == [running[3], ended[3]]
        assert repo.get_task_events(s, "j1", 10) == [created[10]]
        assert repo.get_task_events(s, "j1", n - 1) == [created[n - 1]]
        assert repo.get_task_events(s, "j1", n) == []
        assert repo.get_task_events(s, "j2", 1) == [running[-1]]
        assert [repo.count_task_events(s, "j1", i) for i in (0, 8, 10, 11, n - 1, n)] == [3, 2, 1, 2, 1, 0]
        assert repo.list_task_events(s, "j1") == (by_time, len(every))
        assert repo.list_task_events(s, "j1", newest=3) == (by_time[-3:], len(every))  # inside a run
        assert repo.list_task_events(s, "j1", [6, 7, 8]) == ([created[6], created[7], created[8], running[6],
                                                             running[7], running[8], ended[6], ended[7]], 8)
        assert repo.list_task_events(s, "j1", [6, 7, 8], newest=4) == ([running[7], running[8], ended[6],
                                                                        ended[7]], 8)
        scattered = list(range(0, n, 3))  # more runs than go as ranges
        want = [e for e in by_time if e.instance % 3 == 0]
        assert repo.list_task_events(s, "j1", scattered) == (want, len(want))
        assert repo.list_task_events(s, "j1", scattered, newest=5) == (want[-5:], len(want))
        assert repo.list_task_events(s, "j1", [n - 2, n + 5]) == ([created[n - 2]], 1)
        assert repo.list_task_events(s, "j1", newest=0) == ([], len(every))


# --- pools ------------------------------------------------------------------------------------------------
def test_pools(sessions: Sessions) -> None:
    with db.transaction(sessions) as s:
        repo.ensure_root_pool(s, 5.0)
        repo.ensure_root_pool(s, 6.0)  # idempotent
        root = repo.get_pool(s, "/")
        assert root == ResourcePool(path="/", created_at=5.0)
        assert root.limit is None
    team = ResourcePool("/team", Resources(8, 1024, 10, 2, 4), Resources(16, 2048.5, 20, 4, 8), 2.5, 7.0)
    sub = ResourcePool("/team/sub", Resources(1, 1, 1, 0, 0), None, 1.0, 8.0)
    with db.transaction(sessions) as s:
        repo.create_pool(s, team)
        repo.create_pool(s, sub)
    with db.transaction(sessions) as s:
        assert repo.get_pool(s, "/team") == team
        assert repo.get_pool(s, "/team/sub") == sub
        assert [p.path for p in repo.list_pools(s)] == ["/", "/team", "/team/sub"]
        with pytest.raises(AlreadyExists, match="/team"):
            repo.create_pool(s, team)
        with pytest.raises(NotFound, match="/missing") as ei:
            repo.create_pool(s, ResourcePool("/missing/child"))
        assert ei.value.field == "path"
        with pytest.raises(NotFound, match="/nope"):
            repo.get_pool(s, "/nope")


def test_a_pool_created_between_the_check_and_the_insert_is_a_conflict(sessions: Sessions,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """On PostgreSQL another transaction can create the pool after create_pool's check: the primary key refuses the
    insert, and the caller gets Conflict (retry), not a bare IntegrityError. Simulated by a check that misses it."""
    with db.transaction(sessions) as s:
        repo.ensure_root_pool(s, 1.0)
        repo.create_pool(s, ResourcePool("/team"))
    real = repo._pool_exists
    monkeypatch.setattr(repo, "_pool_exists", lambda s, path: path != "/team" and real(s, path))
    with pytest.raises(Conflict, match="/team") as ei, db.transaction(sessions) as s:
        repo.create_pool(s, ResourcePool("/team"))
    assert ei.value.field == "path"


def test_delete_pool_rules(sessions: Sessions) -> None:
    with db.transaction(sessions) as s:
        repo.ensure_root_pool(s, 1.0)
        repo.create_pool(s, ResourcePool("/a"))
        repo.create_pool(s, ResourcePool("/a/b"))
    with db.transaction(sessions) as s:
        with pytest.raises(FailedPrecondition, match="root"):
            repo.delete_pool(s, "/")
        with pytest.raises(FailedPrecondition, match="child"):
            repo.delete_pool(s, "/a")
        with pytest.raises(NotFound, match="/zzz"):
            repo.delete_pool(s, "/zzz")
    job, _, _ = add_job(sessions, "j1", respool="/a/b")
    with db.transaction(sessions) as s, pytest.raises(FailedPrecondition, match="unfinished"):
        repo.delete_pool(s, "/a/b")
    job.state = JobState.SUCCEEDED
    with db.transaction(sessions) as s:
        repo.update_jobs(s, [job])
    with db.transaction(sessions) as s:
        repo.delete_pool(s, "/a/b")
        repo.delete_pool(s, "/a")
        assert [p.path for p in repo.list_pools(s)] == ["/"]


def test_update_pool_replaces_all_but_the_path(sessions: Sessions) -> None:
    with db.transaction(sessions) as s:
        repo.ensure_root_pool(s, 1.0)
        repo.create_pool(s, ResourcePool("/a", created_at=2.0))
    changed = ResourcePool("/a", Resources(4, 512, 0, 2, 0), Resources(8, 1024, 0, 4, 0), 3.0, 2.0,
                           submitters=("alice",), allow_root=True, reservation_type="static")
    with db.transaction(sessions) as s:
        repo.update_pool(s, changed)
    with db.transaction(sessions) as s:
        assert repo.get_pool(s, "/a") == changed
        repo.update_pool(s, ResourcePool("/a", created_at=99.0))  # back to the defaults; created_at is kept
    with db.transaction(sessions) as s:
        assert repo.get_pool(s, "/a") == ResourcePool("/a", created_at=2.0)
        with pytest.raises(NotFound, match="/nope"):
            repo.update_pool(s, ResourcePool("/nope"))
    add_job(sessions, "j1", respool="/a")
    with db.transaction(sessions) as s:
        assert repo.unfinished_jobs_in(s, "/a") == 1 and repo.unfinished_jobs_in(s, "/") == 0


# --- meta -------------------------------------------------------------------------------------------------
def test_meta(sessions: Sessions) -> None:
    with db.transaction(sessions) as s:
        assert repo.get_meta(s, "framework_id") is None
        repo.set_meta(s, "framework_id", "abc")
        assert repo.get_meta(s, "framework_id") == "abc"
    with db.transaction(sessions) as s:
        repo.set_meta(s, "framework_id", "def")
        repo.set_meta(s, "other", "")
    with db.transaction(sessions) as s:
        assert repo.get_meta(s, "framework_id") == "def"
        assert repo.get_meta(s, "other") == ""


# --- transactions -----------------------------------------------------------------------------------------
def test_transaction_rolls_back_on_error(sessions: Sessions) -> None:
    with pytest.raises(RuntimeError, match="boom"), db.transaction(sessions) as s:
        repo.insert_job(s, *make_job("j1"))
        repo.set_meta(s, "k", "v")
        raise RuntimeError("boom")
    with db.transaction(sessions) as s:
        with pytest.raises(NotFound):
            repo.get_job(s, "j1")
        assert repo.get_tasks(s, "j1") == []
        assert repo.get_meta(s, "k") is None


def test_transaction_commits(sessions: Sessions) -> None:
    with db.transaction(sessions) as s:
        repo.set_meta(s, "k", "v")
    s2 = sessions()
    try:
        assert repo.get_meta(s2, "k") == "v"
    finally:
        s2.close()


def test_a_big_batch_round_trips_every_character(sessions: Sessions) -> None:
    """Batches above a few hundred rows go another way on PostgreSQL (COPY): the same values come back."""
    job = Job("big", JobSpec(name="big", instances=1, command="true", resources=Resources(cpu=1)),
              JobState.PENDING, created_at=1.0, updated_at=1.0)
    awkward = ["tab\there", "line\nbreak", "back\\slash", "\\N", "quote\"'", "uni\u00e9\u4e2d\U0001f600", "", "\r"]
    events = [TaskEvent("big", i, 1, TaskState.RUNNING, 1.5 + i / 3, f"h{i}", awkward[i % len(awkward)],
                        awkward[(i + 3) % len(awkward)], None if i % 2 else i) for i in range(700)]
    with db.transaction(sessions) as s:
        repo.insert_job(s, job, [], [])
        repo.append_task_events(s, events)
    with db.transaction(sessions) as s:
        back = [e for i in range(700) for e in repo.get_task_events(s, "big", i)]
    assert back == events


# --- retention ----------------------------------------------------------------------------------------------
def test_finished_jobs_are_found_oldest_first_and_audit_records_deleted_in_batches(sessions: Sessions) -> None:
    from peloton.domain.model import AuditEvent

    for jid, state, done in [("a", JobState.SUCCEEDED, 50.0), ("b", JobState.FAILED, 10.0),
                             ("c", JobState.KILLED, 200.0), ("d", JobState.RUNNING, 0.0), ("e", JobState.PENDING, 0.0)]:
        job, _, _ = add_job(sessions, jid)
        with db.transaction(sessions) as s:
            repo.update_jobs(s, [dataclasses.replace(job, state=state, completed_at=done)])
    with db.transaction(sessions) as s:
        assert repo.finished_before(s, 100.0, 10) == ["b", "a"]  # ended before 100, oldest first; running never
        assert repo.finished_before(s, 1000.0, 2) == ["b", "a"]
        repo.append_audit_events(s, [AuditEvent(float(t), "p", "token", "/m", "o", True, "OK") for t in range(10)])
    with db.transaction(sessions) as s:
        assert repo.delete_audit_before(s, 7.0, 5) == 5  # the 5 oldest of the 7 older than 7
    with db.transaction(sessions) as s:
        assert repo.delete_audit_before(s, 7.0, 5) == 2
        assert sorted(e.at for e in repo.list_audit_events(s, limit=100)) == [7.0, 8.0, 9.0]


def test_every_store_function_states_its_contract() -> None:
    """repo.py's docstrings are the store's contract (what each function promises, raises, and where the stores
    differ): a public function without one is an interface nobody wrote down."""
    import inspect

    public = [name for name, fn in inspect.getmembers(repo, inspect.isfunction)
              if not name.startswith("_") and fn.__module__ == repo.__name__]
    assert len(public) > 40
    assert [name for name in public if not (getattr(repo, name).__doc__ or "").strip()] == []
