"""The replay's metrics (peloton/replay/metrics.py): small cases computed by hand, and invariants over random valid
schedules (hypothesis)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from peloton.errors import InvalidArgument
from peloton.replay.metrics import (
    Cluster,
    JobRecord,
    Replay,
    Sample,
    makespan_lower_bound,
    percentile,
    private_fifo_jct,
    size_bucket,
    summarize,
)


def job(name: str, gpus: int, submit: float, start: float | None, end: float | None, pool: str = "p",
        hosts: dict[str, int] | None = None, racks: frozenset[str] = frozenset(), preempted: int = 0,
        first_start: float | None = None) -> JobRecord:
    return JobRecord(name=name, pool=pool, gpus=gpus, submit=submit, start=start, end=end,
                     gpus_per_host=hosts or {}, racks=racks, preempted=preempted, first_start=first_start)


# Three jobs on 2 hosts x 4 GPUs, run first-come first-served without backfill: a (4 GPUs) 0-10, b (8) 10-20, c (1,
# submitted at 5) 20-25.
HAND = Replay(
    cluster=Cluster(hosts=2, gpus_per_host=4, racks=1),
    jobs=[job("a", 4, 0, 0, 10, hosts={"h1": 4}, racks=frozenset({"r1"})),
          job("b", 8, 0, 10, 20, hosts={"h1": 4, "h2": 4}, racks=frozenset({"r1"}), preempted=1),
          job("c", 1, 5, 20, 25, pool="q", hosts={"h2": 1}, racks=frozenset({"r1"}))],
    timeline=[Sample(0, 4, 1), Sample(5, 4, 2), Sample(10, 8, 1), Sample(20, 1, 0), Sample(25, 0, 0)],
    reservations={"p": 8, "q": 2},
)


def test_a_hand_computed_replay() -> None:
    m = summarize(HAND)
    assert (m["jobs"], m["finished"], m["unfinished"], m["preemptions"]) == (3, 3, 0, 1)
    assert m["jct_mean_s"] == pytest.approx(50 / 3)  # JCTs 10, 20, 20
    assert (m["jct_p50_s"], m["jct_p99_s"]) == (20, 20)
    assert m["queue_mean_s"] == pytest.approx(25 / 3)  # waits 0, 10, 15
    assert (m["queue_p50_s"], m["queue_p99_s"]) == (10, 15)
    assert m["makespan_s"] == 25
    # 4x5 + 4x5 + 8x10 + 1x5 GPU-seconds over 8 GPUs x 25 s
    assert (m["alloc_gpu_s"], m["work_gpu_s"]) == (125, 125)
    assert m["gpu_alloc_frac"] == m["gpu_busy_frac"] == pytest.approx(0.625)
    # the area bound from t=0: 125 GPU-s / 8 GPUs = 15.625 s, longer than any job's submit + run (10 s)
    assert m["makespan_lower_bound_s"] == pytest.approx(15.625)
    assert m["gpu_alloc_bound"] == pytest.approx(1.0) and m["gpu_alloc_of_bound"] == pytest.approx(0.625)
    assert m["partial_gang_gpu_s"] == 0
    assert (m["hosts_per_gang_mean"], m["racks_per_gang_mean"]) == (pytest.approx(4 / 3), 1)
    assert (m["largest_gang_gpus"], m["largest_gang_wait_s"]) == (8, 10)
    assert m["by_size"]["1"]["jct_mean_s"] == 20 and m["by_size"]["2-4"]["jct_mean_s"] == 10
    assert m["by_size"]["5-8"] == {"jobs": 1, "jct_mean_s": 20, "jct_p50_s": 20, "jct_p99_s": 20,
                                   "queue_mean_s": 10, "hosts_mean": 2, "hosts_min_mean": 2, "racks_mean": 1}
    assert m["by_size"]["17+"]["jobs"] == 0 and m["by_size"]["17+"]["jct_mean_s"] is None
    # p alone on 8 GPUs: a 0-10, b 10-20: JCTs 10 and 20, as shared. q alone on 2 GPUs: c 5-10, JCT 5 against 20.
    assert m["pools"]["p"] == {"jobs": 2, "reserved_gpus": 8, "jct_mean_s": 15, "private_jct_mean_s": 15, "ftf": 1}
    assert m["pools"]["q"]["private_jct_mean_s"] == 5 and m["pools"]["q"]["ftf"] == 4
    assert m["ftf_max"] == 4
    for key in ("jobs", "jct_mean_s", "jct_p99_s", "makespan_s", "gpu_alloc_frac", "partial_gang_gpu_s"):
        assert key in m


def test_partial_gang_gpu_seconds_are_measured_not_assumed() -> None:
    timeline = [Sample(0, 4, 1), Sample(3, 6, 1, partial_gang_gpus=2), Sample(7, 4, 1), Sample(25, 0, 0)]
    m = summarize(Replay(HAND.cluster, HAND.jobs, timeline, HAND.reservations))
    assert m["partial_gang_gpu_s"] == 8  # 2 GPUs for 4 s


def test_a_pool_without_a_reservation_has_no_fairness_figure() -> None:
    m = summarize(Replay(HAND.cluster, HAND.jobs, HAND.timeline, {"p": 8}))
    assert m["pools"]["q"]["reserved_gpus"] == 0 and m["pools"]["q"]["ftf"] is None
    assert m["ftf_max"] == 1


def test_an_unfinished_job_counts_but_has_no_jct_and_the_makespan_runs_to_the_last_sample() -> None:
    jobs = [job("a", 4, 0, 0, 10), job("z", 8, 1, None, None)]
    m = summarize(Replay(Cluster(2, 4), jobs, [Sample(0, 4, 1), Sample(10, 0, 1), Sample(40, 0, 1)]))
    assert (m["jobs"], m["finished"], m["unfinished"]) == (2, 1, 1)
    assert m["jct_mean_s"] == 10 and m["makespan_s"] == 40
    assert m["largest_gang_gpus"] == 8 and m["largest_gang_wait_s"] is None


def test_the_bound_is_reached_by_a_schedule_that_packs_perfectly() -> None:
    # two gangs wider than half the cluster cannot overlap: 20 s at best, whatever the area says (15 s)
    jobs = [job("a", 6, 0, 0, 10), job("b", 6, 0, 10, 20)]
    m = summarize(Replay(Cluster(2, 4), jobs, [Sample(0, 6, 1), Sample(10, 6, 0), Sample(20, 0, 0)]))
    assert m["makespan_lower_bound_s"] == 20
    assert m["gpu_alloc_frac"] == m["gpu_alloc_bound"] == pytest.approx(0.75)
    assert m["gpu_alloc_of_bound"] == pytest.approx(1)


def test_the_bound_counts_idle_time_that_submissions_force() -> None:
    # the second job is submitted at 20: no schedule ends before 30, the GPUs idle for 10 s whatever it does
    on_time = [job("a", 8, 0, 0, 10), job("b", 8, 20, 20, 30)]
    late = [job("a", 8, 0, 0, 10), job("b", 8, 20, 25, 35)]
    m1 = summarize(Replay(Cluster(2, 4), on_time, [Sample(0, 8, 0), Sample(10, 0, 0), Sample(20, 8, 0),
                                                     Sample(30, 0, 0)]))
    m2 = summarize(Replay(Cluster(2, 4), late, [Sample(0, 8, 0), Sample(10, 0, 0), Sample(20, 0, 1),
                                                  Sample(25, 8, 0), Sample(35, 0, 0)]))
    assert m1["gpu_alloc_frac"] == m1["gpu_alloc_bound"] == pytest.approx(2 / 3)
    assert m2["gpu_alloc_bound"] == pytest.approx(2 / 3) and m2["gpu_alloc_frac"] == pytest.approx(160 / 280)
    assert m2["gpu_alloc_of_bound"] == pytest.approx(30 / 35)  # the shortest makespan over this one's


def test_gpus_held_before_a_run_count_as_allocated_and_stay_under_the_bound() -> None:
    # docs/scheduling-quality.md's example: each job held 5 s before it runs; W / (G M_lb) = 20/30 would be exceeded
    jobs = [job("a", 8, 0, 5, 15), job("b", 8, 20, 25, 35)]
    m = summarize(Replay(Cluster(2, 4), jobs, [Sample(0, 8, 0), Sample(15, 0, 0), Sample(20, 8, 0),
                                                 Sample(35, 0, 0)]))
    assert (m["alloc_gpu_s"], m["work_gpu_s"], m["makespan_lower_bound_s"]) == (240, 160, 30)
    assert m["gpu_alloc_frac"] == pytest.approx(30 / 35) and m["gpu_busy_frac"] == pytest.approx(20 / 35)
    assert m["gpu_alloc_bound"] == 1 and m["work_gpu_s"] / (8 * 30) == pytest.approx(20 / 30)


def test_queueing_delay_runs_to_the_first_start_and_the_bound_uses_the_run_that_finished() -> None:
    # preempted at 4 after starting at 2; started again at 6, done at 16 (a 10 s run)
    m = summarize(Replay(Cluster(1, 4), [job("a", 4, 0, 6, 16, preempted=1, first_start=2)],
                         [Sample(0, 0, 1), Sample(2, 4, 0), Sample(4, 0, 1), Sample(6, 4, 0), Sample(16, 0, 0)]))
    assert (m["queue_mean_s"], m["largest_gang_wait_s"], m["jct_mean_s"], m["preemptions"]) == (2, 2, 16, 1)
    assert (m["makespan_lower_bound_s"], m["work_gpu_s"], m["alloc_gpu_s"]) == (10, 40, 48)
    assert m["gpu_busy_frac"] == pytest.approx(40 / 64) and m["gpu_alloc_frac"] == pytest.approx(48 / 64)


def test_private_fifo_runs_in_submission_order_without_backfill() -> None:
    # 4 GPUs: x 0-10; y (2 GPUs, submitted at 1) waits for x: 10-15; z (1 GPU, at 2) fits at 2 but not before y
    # starts: 10-11
    jobs = [job("x", 4, 0, 0, 10), job("y", 2, 1, 0, 5), job("z", 1, 2, 0, 1)]
    assert private_fifo_jct(jobs, 4) == [10, 14, 9]
    # a job wider than the reservation runs alone on a private cluster its own width
    assert private_fifo_jct([job("w", 8, 0, 0, 3)], 2) == [3]


def test_nearest_rank_percentiles_and_size_buckets() -> None:
    assert percentile([], 50) is None
    assert percentile([3, 1, 2, 4], 50) == 2 and percentile([3, 1, 2, 4], 99) == 4
    assert percentile([5], 1) == 5
    assert [size_bucket(g) for g in (1, 2, 4, 5, 8, 9, 16, 17, 512)] == [
        "1", "2-4", "2-4", "5-8", "5-8", "9-16", "9-16", "17+", "17+"]
    with pytest.raises(InvalidArgument):
        size_bucket(0)


@pytest.mark.parametrize(("replay", "field", "words"), [
    (Replay(Cluster(2, 4), [job("a", 9, 0, 0, 1)], []), "gpus", "job 'a': gpus 9"),
    (Replay(Cluster(2, 4), [job("a", 1, 5, 4, 6)], []), "start", "start 4 before submit 5"),
    (Replay(Cluster(2, 4), [job("a", 1, 0, 4, 3)], []), "end", "end 3 before start 4"),
    (Replay(Cluster(2, 4), [job("a", 1, 0, 4, None)], []), "end", "both set or both None"),
    (Replay(Cluster(2, 4), [job("a", 1, 2, 4, 5, first_start=1)], []), "first_start", "first_start 1"),
    (Replay(Cluster(2, 4), [job("a", 1, 0, 0, 1), job("a", 1, 0, 0, 1)], []), "name", "recorded twice"),
    (Replay(Cluster(2, 4), [job("a", 2, 0, 0, 1, hosts={"h": 1})], []), "gpus_per_host", "holds 1 GPUs"),
    (Replay(Cluster(2, 4), [], [Sample(1, 0, 0), Sample(0, 0, 0)]), "time", "timeline[1]"),
    (Replay(Cluster(2, 4), [], [Sample(0, 9, 0)]), "gpus_allocated", "gpus_allocated 9"),
    (Replay(Cluster(2, 4), [], [], {"p": -1}), "reservations", "reservations['p']"),
    (Replay(Cluster(0, 4), [], []), "cluster", "cluster"),
])
def test_bad_input_names_the_record_and_the_field(replay: Replay, field: str, words: str) -> None:
    with pytest.raises(InvalidArgument, match=words.replace("[", r"\[").replace("]", r"\]")) as e:
        summarize(replay)
    assert e.value.field == field


def test_no_jobs_no_timeline() -> None:
    m = summarize(Replay(Cluster(1, 1), [], []))
    assert (m["jobs"], m["makespan_s"], m["gpu_alloc_frac"], m["gpu_alloc_bound"]) == (0, 0, 0, 0)
    assert m["jct_mean_s"] is None and m["largest_gang_wait_s"] is None


# --- invariants over random valid schedules ------------------------------------------------------------------------

@st.composite
def schedules(draw: st.DrawFn) -> Replay:
    """Jobs placed one by one, in a random order, at the earliest time from their submission plus a random delay
    at which their GPUs are free for their whole run: any valid schedule (never more GPUs than the cluster's)."""
    hosts, per = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    gpus = hosts * per
    n = draw(st.integers(1, 8))
    specs = [(draw(st.integers(1, gpus)), draw(st.integers(0, 50)), draw(st.integers(0, 30)),
              draw(st.integers(0, 20)), draw(st.sampled_from(["p", "q"]))) for _ in range(n)]
    order = draw(st.permutations(range(n)))
    runs: list[tuple[int, int, int]] = []  # (start, end, gpus)

    def used(t: float) -> int:
        return sum(g for s, e, g in runs if s <= t < e)

    jobs: dict[int, JobRecord] = {}
    for i in order:
        g, submit, run, delay, pool = specs[i]
        t = submit + delay
        for c in sorted({t} | {e for _, e, _ in runs if e > t}):
            points = {c} | {s for s, _, _ in runs if c < s < c + run}
            if all(used(p) + g <= gpus for p in points):
                t = c
                break
        runs.append((t, t + run, g))
        first = draw(st.one_of(st.none(), st.integers(submit, t)))  # a run before, preempted
        jobs[i] = job(f"j{i}", g, submit, t, t + run, pool=pool, hosts=_spread(g, per), first_start=first)
    times = sorted({0} | {s for s, _, _ in runs} | {e for _, e, _ in runs} | {j.submit for j in jobs.values()})
    timeline = [Sample(t, used(t), sum(1 for j in jobs.values() if j.submit <= t < (j.start or 0)))
                for t in times]
    reservations = {"p": draw(st.integers(0, gpus)), "q": draw(st.integers(0, gpus))}
    return Replay(Cluster(hosts, per), [jobs[i] for i in range(n)], timeline, reservations)


def _spread(g: int, per: int) -> dict[str, int]:
    out, h = {}, 0
    while g:
        out[f"h{h}"], g, h = min(g, per), g - min(g, per), h + 1
    return out


@settings(max_examples=300, deadline=None)
@given(schedules())
def test_invariants_of_any_valid_schedule(replay: Replay) -> None:
    m = summarize(replay)
    eps = 1e-9
    assert 0 <= m["gpu_busy_frac"] <= m["gpu_alloc_frac"] + eps
    assert m["gpu_alloc_frac"] <= m["gpu_alloc_bound"] + eps <= 1 + 2 * eps
    assert m["makespan_lower_bound_s"] <= m["makespan_s"] + eps
    assert m["partial_gang_gpu_s"] == 0
    runs = [j.run_s for j in replay.jobs]
    assert m["jct_mean_s"] >= sum(runs) / len(runs) - eps  # each JCT >= its run time
    assert m["queue_mean_s"] <= m["jct_mean_s"] - sum(runs) / len(runs) + eps  # a wait ends by the last start
    assert m["queue_mean_s"] >= 0 and m["queue_p50_s"] <= m["queue_p99_s"] and m["jct_p50_s"] <= m["jct_p99_s"]
    assert sum(b["jobs"] for b in m["by_size"].values()) == m["jobs"]
    for pool in m["pools"].values():
        assert pool["ftf"] is None or pool["ftf"] > 0
    for j in replay.jobs:
        assert m["by_size"][size_bucket(j.gpus)]["hosts_min_mean"] <= m["by_size"][size_bucket(j.gpus)][
            "hosts_mean"] + eps


@settings(max_examples=200, deadline=None)
@given(schedules())
def test_private_fifo_jct_is_at_least_the_run_time_and_exactly_it_with_room_for_all(replay: Replay) -> None:
    jobs = list(replay.jobs)
    order = sorted(jobs, key=lambda j: (j.submit, j.name))
    for cap in (1, replay.cluster.gpus):
        assert all(t >= j.run_s for t, j in zip(private_fifo_jct(jobs, cap), order, strict=True))
    assert private_fifo_jct(jobs, sum(j.gpus for j in jobs)) == [j.run_s for j in order]


@settings(max_examples=200, deadline=None)
@given(schedules())
def test_the_lower_bound_never_exceeds_a_list_schedules_makespan(replay: Replay) -> None:
    # FIFO on the whole cluster is a valid schedule too: the bound holds for it
    jobs = list(replay.jobs)
    t0 = min(j.submit for j in jobs)
    end = max(j.submit + t for j, t in zip(sorted(jobs, key=lambda j: (j.submit, j.name)),
                                            private_fifo_jct(jobs, replay.cluster.gpus), strict=True))
    assert makespan_lower_bound(jobs, replay.cluster.gpus) <= end - t0 + 1e-9


def test_the_makespan_counts_from_the_first_submission_not_from_an_earlier_sample() -> None:
    # the replay driver samples the empty cluster at virtual second 0; the trace's first job comes at 100 (Pollux's
    # workloads start at 16 to 791 s). t0 is the first submission (docs/scheduling-quality.md, "Metrics"): a lone
    # job that runs as soon as it is submitted has the shortest makespan there is, and reaches the bound
    jobs = [job("a", 8, 100, 100, 110)]
    m = summarize(Replay(Cluster(2, 4), jobs, [Sample(0, 0, 0), Sample(100, 8, 0), Sample(110, 0, 0)]))
    assert (m["makespan_s"], m["makespan_lower_bound_s"], m["alloc_gpu_s"]) == (10, 10, 80)
    assert m["gpu_alloc_frac"] == m["gpu_alloc_bound"] == m["gpu_alloc_of_bound"] == 1
