"""The replay driver: the real components in virtual time (peloton/replay/driver.py)."""

from __future__ import annotations

import dataclasses
import random
import time

from peloton.domain.resources import Resources
from peloton.domain.spec import JobSpec
from peloton.replay.driver import Cluster, Placement, Replay, ReplayResult, Run, Submission


def _spec(name: str, members: int, gpus: int) -> JobSpec:
    return JobSpec(name=name, instances=members, command="train", resources=Resources(cpu=1, mem=1024, gpu=gpus))


def _trace(n: int, seed: int) -> tuple[list[Submission], dict[str, float]]:
    rng = random.Random(seed)
    subs, work = [], {}
    for i in range(n):
        members = rng.choice([1, 1, 2, 4, 8])
        gpus = rng.choice([1, 2, 4]) if members == 1 else 4
        subs.append(Submission(rng.uniform(0, 8 * 3600), f"j{i}", _spec(f"j{i}", members, gpus)))
        work[f"j{i}"] = rng.uniform(300, 3600)
    return subs, work


def _run(n: int, seed: int) -> ReplayResult:
    subs, work = _trace(n, seed)

    def duration(s: Submission, p: Placement) -> float:
        return work[s.name] * (1.0 if len(p.racks) == 1 else 1.2)  # a worse placement runs longer

    return Replay(Cluster(hosts=16, gpus=4, racks=4), subs, duration).run()


def _outcome(r: ReplayResult) -> list[tuple[object, ...]]:
    return [(j.name, j.state, j.running_s, j.end_s, j.placement, j.preemptions) for j in r.jobs]


def test_a_later_job_starts_exactly_when_the_earlier_one_ends() -> None:
    subs = [Submission(0, "first", _spec("first", 2, 4)), Submission(10, "second", _spec("second", 2, 4))]
    r = Replay(Cluster(hosts=2, gpus=4), subs, lambda s, p: 100.0).run()
    first, second = r.jobs
    assert (first.running_s, first.end_s) == (0.0, 100.0)
    assert (second.submitted_s, second.running_s, second.end_s) == (10.0, 100.0, 200.0)
    assert first.state == second.state == "SUCCEEDED"
    assert first.placement is not None and first.placement.hosts == (("sim-00000", 4), ("sim-00001", 4))
    assert [(s.t, s.gpus_allocated, s.queued) for s in r.timeline] == [
        (0.0, 8, 0), (10.0, 8, 1), (100.0, 8, 0), (200.0, 0, 0)]


def test_duration_follows_the_placement() -> None:
    subs = [Submission(0, "a", _spec("a", 1, 4))]
    r = Replay(Cluster(hosts=1, gpus=4), subs, lambda s, p: 50.0 * p.gpus).run()
    assert r.jobs[0].end_s == 200.0


def test_two_runs_give_the_same_result_gangs_whole() -> None:
    start = time.perf_counter()
    a, b = _run(200, 7), _run(200, 7)
    wall = time.perf_counter() - start
    assert _outcome(a) == _outcome(b)
    assert a.timeline == b.timeline
    assert all(j.state == "SUCCEEDED" for j in a.jobs)
    subs, _ = _trace(200, 7)
    size = {s.name: s.spec.instances * s.spec.resources.gpu for s in subs}
    for j in a.jobs:
        assert j.placement is not None and j.placement.gpus == size[j.name]  # never partial
        assert j.running_s is not None and j.end_s is not None and j.submitted_s <= j.running_s < j.end_s
        assert j.last_start_s == j.running_s and j.runs == 1 and j.preemptions == 0  # one pool: nothing preempted
    assert max(s.gpus_allocated for s in a.timeline) <= a.total_gpus
    assert 0 < a.wall_s < wall  # measured (how long it takes: benchmarks/replay_bench.py)


def test_jobs_submitted_together_start_in_the_traces_order_on_every_run() -> None:
    def run() -> list[tuple[str, float | None]]:
        subs = [Submission(0, "hold", _spec("hold", 1, 4))] + [
            Submission(5, f"s{i}", _spec(f"s{i}", 1, 4)) for i in range(6)]
        r = Replay(Cluster(hosts=1, gpus=4), subs, lambda s, p: 10.0).run()
        return [(j.name, j.running_s) for j in r.jobs]

    first = run()
    assert first == run()
    starts = [t for name, t in first if name != "hold" and t is not None]
    assert starts == sorted(starts) and len(set(starts)) == 6  # one at a time, in the trace's order


def test_jobs_submitted_together_go_in_the_order_given_not_by_name() -> None:
    # the trace's order is the file's (traces.read_trace keeps ties in it, and the pools are dealt in it): "zeta",
    # then "alpha", each the whole cluster, at the same second; strict fifo runs zeta first
    subs = [Submission(0, "zeta", _spec("zeta", 1, 4)), Submission(0, "alpha", _spec("alpha", 1, 4))]
    r = Replay(Cluster(hosts=1, gpus=4), subs, lambda s, p: 10.0, order="fifo").run()
    assert [(j.name, round(j.running_s or -1, 3)) for j in r.jobs] == [("zeta", 0.0), ("alpha", 10.0)]
    assert [j.job_id for j in r.jobs] == ["000000000001", "000000000002"]


def test_each_run_is_recorded_and_the_earlier_ones_are_there_at_a_launch() -> None:
    subs = [Submission(0, "a", _spec("a", 2, 4)), Submission(5, "b", _spec("b", 1, 4))]
    seen: dict[str, tuple[Run, ...]] = {}
    holder: list[Replay] = []

    def duration(s: Submission, p: Placement) -> float:
        seen[s.name] = holder[0].history(s.name)
        return 100.0

    rp = Replay(Cluster(hosts=2, gpus=4, labels=(("gpu_model", "t4"),)), subs, duration)
    holder.append(rp)
    r = rp.run()
    assert seen == {"a": (), "b": ()}  # a first run: nothing before it
    a, b = r.jobs
    assert a.placement is not None and b.placement is not None
    assert a.history == [Run(0.0, 100.0, a.placement)] and b.history == [Run(100.0, 200.0, b.placement)]
    assert rp.history("a") == tuple(a.history) and rp.history("nobody") == ()
    assert all(s.partial_gpus == 0 for s in r.timeline)
    assert {h.labels["gpu_model"] for h in rp.sim.hosts()} == {"t4"}  # the cluster's labels on every host


def test_a_run_past_its_max_runtime_is_ended_by_the_reconciler_at_that_virtual_instant() -> None:
    # the daemon's reconciler loop enforces sla.max_runtime; in a replay it is stepped, and the clock stops at the
    # deadline: the gang is killed whole at 60 s (its work would take 100), its job fails, the next one starts
    over = dataclasses.replace(_spec("over", 2, 2), max_runtime_s=60.0)
    subs = [Submission(0, "over", over), Submission(10, "next", _spec("next", 1, 4))]
    r = Replay(Cluster(hosts=1, gpus=4), subs, lambda s, p: 100.0).run()
    first, second = r.jobs
    assert first.state == "FAILED" and second.state == "SUCCEEDED"
    assert second.running_s is not None and second.end_s is not None
    assert abs(second.running_s - 60.0) < 0.01 and abs(second.end_s - 160.0) < 0.01, (second.running_s, second.end_s)
    assert all(s.partial_gpus == 0 for s in r.timeline)


def test_times_past_what_the_clock_keeps_to_the_microsecond_are_refused() -> None:
    """The virtual clock is EPOCH + seconds in a float: near 1e15 its step is 1/8 s, and a run of 0.3 s lasted
    0.25 s (and jobs submitted together, a microsecond apart, fell on one instant). Refused beyond 1e9 s."""
    import pytest

    with pytest.raises(ValueError, match=r"submissions\[late\]\.at_s: must be within 0\.\.1000000000, got 1000000000000000\.0"):
        Replay(Cluster(hosts=1, gpus=4), [Submission(1e15, "late", _spec("late", 1, 1))], lambda s, p: 0.3)
    ok = Replay(Cluster(hosts=1, gpus=4), [Submission(1e9, "a", _spec("a", 1, 1))], lambda s, p: 0.3).run()
    end, start = ok.jobs[0].end_s, ok.jobs[0].running_s
    assert end is not None and start is not None and abs(end - start - 0.3) < 1e-6
