"""A trace through every piece: policies, the work model as the driver's duration_of, the driver, the adapter to the
metrics (peloton/replay/run.py)."""

from __future__ import annotations

import functools
import os
import random
import threading
from pathlib import Path

import pytest

from peloton.domain.model import ResourcePool
from peloton.domain.resources import Resources
from peloton.errors import InvalidArgument
from peloton.replay import policies, run
from peloton.replay.driver import Placement, Run, Submission
from peloton.replay.policies import POLICIES
from peloton.replay.work import hosts_of, speed, work_samples
from tests.public_data import require

PUBLIC = require()
HEADER = "name,submit_s,gpus,application,work,unit,batch_size,pool,priority,min_gpus,max_gpus\n"


def _trace(tmp_path: Path, rows: str, name: str = "t.csv") -> str:
    path = tmp_path / name
    path.write_text(HEADER + rows)
    return str(path)


def _borrow_then_reclaim(tmp_path: Path) -> run.Setup:
    """Pool /a's two gangs fill the cluster, one on /b's share; /b's gang comes and takes its share back."""
    return run.setup(_trace(tmp_path, "a1,0,4,resnet50,1000,seconds,,a,,,\n"
                                      "a2,0,4,resnet50,1000,seconds,,a,,,\n"
                                      "b1,100,4,resnet50,200,seconds,,b,,,\n"), "peloton", cluster="2x4")


def test_a_preempted_job_keeps_its_work_and_finishes_what_is_left(tmp_path: Path) -> None:
    s = _borrow_then_reclaim(tmp_path)
    assert [(p.path, p.reservation.gpu) for p in s.pools] == [("/a", 4), ("/b", 4)]
    o = run.replay_one(s, POLICIES["default"], preemption=True)
    jobs = {r.name: r for r in o.result.jobs}
    assert all(r.state == "SUCCEEDED" for r in jobs.values())
    victim = next(r for r in jobs.values() if r.preemptions)
    assert victim.name in ("a1", "a2") and len(victim.history) == 2 == victim.runs
    first, second = victim.history
    assert first.start_s == pytest.approx(0, abs=1e-3) and first.end_s is not None
    assert 100 < first.end_s < 200  # after the settling window
    b1 = jobs["b1"]
    assert b1.end_s is not None and b1.running_s == first.end_s and b1.end_s == pytest.approx(first.end_s + 200)
    assert second.start_s == pytest.approx(b1.end_s)  # the victim's GPUs back once b1 is done
    # every sample of its work done once: a run of 1000 s at the reference placement, in two parts
    job = next(j for j in s.jobs if j.name == victim.name)
    m = s.models["resnet50"]
    done = sum((r.end_s - r.start_s) * speed(m, hosts_of([n for _, n in r.placement.hosts], s.cluster), None)
               for r in victim.history if r.end_s is not None)
    assert done == pytest.approx(work_samples(job, m, s.cluster), rel=1e-9)
    assert victim.end_s == pytest.approx(1000 + b1.end_s - first.end_s)
    assert run.over_max_runtime(o) == [] and o.specs[victim.name].max_runtime_s > 0
    summary = run.results([o])["default"]
    assert summary["partial_gang_gpu_s"] == 0 and summary["preemptions"] == 1
    assert max(x.partial_gpus for x in o.result.timeline) == 0


def test_the_victims_among_gangs_started_together_are_the_same_on_every_run(tmp_path: Path) -> None:
    """Four gangs of /a start at one instant; /b's gang takes two of them back. The resource manager breaks the tie
    by gang id: the replay numbers its jobs (not random ids), so the same two are preempted every time."""
    rows = "".join(f"a{i},0,2,resnet50,1000,seconds,,a,,,\n" for i in range(4)) + "b1,100,4,resnet50,200,seconds,,b,,,\n"
    s = run.setup(_trace(tmp_path, rows), "peloton", cluster="2x4")
    outcomes = [run.replay_one(s, POLICIES["default"], preemption=True) for _ in range(3)]
    victims = [sorted(r.name for r in o.result.jobs if r.preemptions) for o in outcomes]
    assert len(victims[0]) == 2 and victims == [victims[0]] * 3
    assert run.completion_times(outcomes[:1]) == run.completion_times(outcomes[1:2]) == run.completion_times(
        outcomes[2:])
    assert [r.job_id for r in outcomes[0].result.jobs] == [f"{i:012x}" for i in range(1, 6)]


def test_without_preemption_the_pool_waits_for_its_borrowed_share(tmp_path: Path) -> None:
    o = run.replay_one(_borrow_then_reclaim(tmp_path), POLICIES["default"], preemption=False)
    jobs = {r.name: r for r in o.result.jobs}
    assert [r.preemptions for r in jobs.values()] == [0, 0, 0]
    assert (jobs["b1"].running_s, jobs["b1"].end_s) == (pytest.approx(1000), pytest.approx(1200))


def test_the_adapter_maps_the_drivers_record_onto_the_metrics(tmp_path: Path) -> None:
    s = _borrow_then_reclaim(tmp_path)
    o = run.replay_one(s, POLICIES["default"], preemption=True)
    r = o.replay
    assert (r.cluster.hosts, r.cluster.gpus_per_host, r.cluster.racks) == (2, 4, 1)
    assert r.reservations == {"/a": 4, "/b": 4}
    for job, rec in zip(o.result.jobs, r.jobs, strict=True):
        assert job.placement is not None
        assert (rec.name, rec.submit, rec.first_start, rec.start, rec.end) == (
            job.name, job.submitted_s, job.running_s, job.last_start_s, job.end_s)
        assert (rec.gpus, dict(rec.gpus_per_host), rec.racks) == (4, dict(job.placement.hosts),
                                                                   frozenset(job.placement.racks))
        assert rec.pool == s.pool_of[job.name] and rec.preempted == job.preemptions
    assert [(x.time, x.gpus_allocated, x.queue_length, x.partial_gang_gpus) for x in r.timeline] == [
        (x.t, x.gpus_allocated, x.queued, x.partial_gpus) for x in o.result.timeline]


def test_progress_is_the_work_left_at_the_speed_of_this_placement(tmp_path: Path) -> None:
    s = run.setup(_trace(tmp_path, "j,0,4,bert,1000000,samples,96,,,,\n"), "peloton", cluster="4x4")
    packed, spread = Placement((("h0", 4),), ("r0",)), Placement((("h0", 2), ("h1", 1), ("h2", 1)), ("r0",))
    runs: list[Run] = []
    progress = run.Progress(s, lambda name: runs)
    sub = Submission(0, "j", policies.job_spec(s.jobs[0], POLICIES["default"], s.cluster, s.models["bert"]))
    m = s.models["bert"]
    v_packed, v_spread = (speed(m, hosts_of(h, s.cluster), 96) for h in ((4,), (2, 1, 1)))
    assert progress(sub, packed) == pytest.approx(1e6 / v_packed)
    runs.extend([Run(0, 100, packed), Run(150, 170, spread)])
    assert progress(sub, spread) == pytest.approx((1e6 - 100 * v_packed - 20 * v_spread) / v_spread)
    runs.append(Run(200, 200 + 1e7, packed))  # all of it done: the driver still wants a run longer than 0
    assert progress(sub, packed) == run.MIN_RUN_S


def _random_trace(tmp_path: Path, n: int, seed: int) -> str:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        gpus = rng.choice([1, 1, 2, 4, 4, 6, 8])  # within a pool's share (see test_replay_cli's stall)
        app = rng.choice(["resnet50", "vgg16", "bert", "cifar10", "alexnet"])
        rows.append(f"j{i},{rng.uniform(0, 3600):.0f},{gpus},{app},{rng.uniform(60, 1800):.0f},seconds,,,,,\n")
    return _trace(tmp_path, "".join(rows))


def test_two_replays_of_one_seed_give_the_same_completion_times(tmp_path: Path) -> None:
    s = run.setup(_random_trace(tmp_path, 30, 3), "peloton", cluster="4x4", racks=2, seed=5)
    chosen = list(POLICIES.values())
    a, b = run.replay_all(s, chosen, [True]), run.replay_all(s, chosen, [True])
    assert run.completion_times(a) == run.completion_times(b)
    assert [o.result.timeline for o in a] == [o.result.timeline for o in b]
    for o in a:
        assert all(r.state == "SUCCEEDED" for r in o.result.jobs), o.label
        assert run.over_max_runtime(o) == [], o.label
        assert run.results([o])[o.label]["partial_gang_gpu_s"] == 0


@functools.cache
def _tiresias() -> run.Setup:
    return run.setup(str(PUBLIC / "tiresias" / "60_job.csv"), "tiresias",
                     cluster_file=str(PUBLIC / "tiresias" / "cluster_spec.csv"))  # no bert or cifar10 in it


@pytest.mark.parametrize("policy", list(POLICIES))
def test_the_tiresias_trace_runs_whole_under_every_policy_none_past_its_max_runtime(policy: str) -> None:
    s = _tiresias()
    o = run.replay_one(s, POLICIES[policy], preemption=True)
    assert len(o.result.jobs) == 60 and all(r.state == "SUCCEEDED" for r in o.result.jobs)
    assert run.over_max_runtime(o) == []
    m = run.results([o])[policy]
    assert m["partial_gang_gpu_s"] == 0 and m["finished"] == 60
    if policy == "auto":
        sizes = {r.name: r.placement.gpus for r in o.result.jobs if r.placement is not None}
        for j in s.jobs:
            lo, hi = policies.auto_bounds(j, s.cluster)
            assert lo <= sizes[j.name] <= hi
    else:
        assert all(r.placement is not None and r.placement.gpus == j.gpus
                   for r, j in zip(o.result.jobs, s.jobs, strict=True))


def test_setup_refuses_what_it_cannot_replay_naming_the_flag(tmp_path: Path) -> None:
    trace = _trace(tmp_path, "j,0,4,resnet50,10,seconds,,,,,\n")
    with pytest.raises(InvalidArgument, match="--cluster: give --cluster HxG or --cluster-file FILE"):
        run.setup(trace, "peloton")
    with pytest.raises(InvalidArgument, match="--racks: a cluster file says its racks"):
        run.setup(trace, "peloton", cluster_file=str(PUBLIC / "tiresias" / "cluster_spec.csv"), racks=2)
    with pytest.raises(InvalidArgument, match="racks: 3 is not within 1..2"):
        run.setup(trace, "peloton", cluster="2x4", racks=3)
    with pytest.raises(InvalidArgument, match=r"t\.csv: row 1, job j: 4 GPUs, more than the cluster's 2"):
        run.setup(trace, "peloton", cluster="1x2")
    with pytest.raises(InvalidArgument, match="TRACE: cannot read .*nope.csv"):
        run.setup(str(tmp_path / "nope.csv"), "peloton", cluster="2x4")
    with pytest.raises(InvalidArgument, match="--profiles: no bert/placements.csv or cifar10/placements.csv"):
        run.setup(trace, "peloton", cluster="2x4", profiles=str(tmp_path))
    # work in samples whose run would outlast a trace's times (the replay's clock loses its microseconds past them)
    with pytest.raises(InvalidArgument, match=r"t\.csv: row 1, job j: its work takes [\d.e+]+ s at its slowest "
                                              "placement, more than the 1000000000"):
        run.setup(_trace(tmp_path, "j,0,4,resnet50,1e15,samples,,,,,\n"), "peloton", cluster="2x4")
    with pytest.raises(InvalidArgument, match="row 1, column pool: 'x' is not a pool"):
        run.setup(_trace(tmp_path, "j,0,4,resnet50,10,seconds,,x,,,\n", "p.csv"), "peloton", cluster="2x4",
                  pools=[ResourcePool("/y", reservation=Resources(gpu=8))])


def test_a_file_is_read_up_to_the_limit_and_no_further(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the limit was checked against the file's stat() size, which is 0 for a pipe or /dev/zero: those were read
    # without end (`peloton replay /dev/zero` took memory until there was none)
    monkeypatch.setattr(run, "MAX_FILE_BYTES", 1024)
    fifo = tmp_path / "trace.fifo"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_bytes(HEADER.encode() * 100), daemon=True)
    writer.start()
    with pytest.raises(InvalidArgument, match=r"TRACE: .*trace\.fifo: larger than the 1024 bytes \(1 KiB\) a "
                                              "replay's input file may have") as e:
        run.read_text(str(fifo), "TRACE")
    assert e.value.field == "TRACE"
    with pytest.raises(InvalidArgument, match="--cluster-file: /dev/zero: larger than the 1024 bytes"):
        run.read_text("/dev/zero", "--cluster-file")
    exact = tmp_path / "t.csv"
    exact.write_text("x" * 1024)
    assert run.read_text(str(exact), "TRACE") == "x" * 1024
