"""`instances: auto`'s count (peloton/modelaware/autosize.py): the most samples/s among the counts at least
`min_efficiency` efficient that start now; when nothing fits now, the smallest count. Checked on made-up scaling
curves, on random ones against the rule's definition, and through the real job manager in a virtual-time replay."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest

from peloton.domain.model import ResourcePool
from peloton.domain.resources import Resources
from peloton.errors import InvalidArgument
from peloton.modelaware.autosize import DEFAULT_MIN_EFFICIENCY, CountOption, choose_count, upper_bound
from peloton.modelaware.document import parse_document
from peloton.modelaware.plan import FreeHost, exhaustive
from peloton.replay.driver import Cluster, Replay, Submission
from tests.unit.test_replay_scheduling import _bert, _model_aware


def amdahl(k: int, serial: float) -> float:
    """samples/s of k GPUs when `serial` of a step does not parallelize (1 GPU: 100 samples/s)."""
    return 100.0 / (serial + (1 - serial) / k)


def curve(counts: range, serial: float, free: int) -> list[CountOption]:
    """Each count's rate on the empty cluster, and now when it fits in `free` GPUs (the same rate)."""
    return [CountOption(k, amdahl(k, serial), amdahl(k, serial) if k <= free else 0.0) for k in counts]


def test_on_an_idle_cluster_auto_takes_the_largest_efficient_count() -> None:
    # 10% serial: E(K) relative to K=1 is 1 / (0.1 K + 0.9): >= 0.5 up to K = 11
    opts = curve(range(1, 33), 0.1, free=64)
    c = choose_count(opts)
    assert c is not None and c.fits_now and c.gpus == 11 and c.efficiency >= DEFAULT_MIN_EFFICIENCY
    assert c.samples_per_s == pytest.approx(amdahl(11, 0.1))
    # perfectly linear scaling: every count is efficient, so the upper bound
    lin = [CountOption(k, 10.0 * k, 10.0 * k) for k in range(2, 9)]
    assert [choose_count(lin, t).gpus for t in (0.5, 1.0)] == [8, 8]  # type: ignore[union-attr]


def test_on_a_busy_cluster_auto_takes_what_starts_now_and_not_the_upper_bound() -> None:
    c = choose_count(curve(range(4, 17), 0.02, free=6))
    assert c is not None and c.fits_now and c.gpus == 6
    # nothing fits now: the smallest count (starts soonest), though 16 would be fastest on an empty cluster
    opts = curve(range(4, 17), 0.02, free=3)
    assert max(opts, key=lambda o: o.best).gpus == 16
    c = choose_count(opts)
    assert c is not None and not c.fits_now and c.gpus == 4 and c.samples_per_s == amdahl(4, 0.02)


def test_the_threshold_trades_throughput_for_efficiency() -> None:
    opts = curve(range(1, 65), 0.05, free=64)  # E(K) = 1 / (0.05 K + 0.95); throughput grows to K = 64
    assert choose_count(opts, 0.0).gpus == 64  # type: ignore[union-attr]
    assert choose_count(opts, 0.5).gpus == 21  # type: ignore[union-attr]
    assert choose_count(opts, 0.8).gpus == 6  # type: ignore[union-attr]
    assert choose_count(opts, 1.0).gpus == 1  # type: ignore[union-attr]
    # a count past the knee, slower than a smaller one, is never chosen even at threshold 0
    knee = [CountOption(k, r, r) for k, r in ((2, 20.0), (4, 36.0), (8, 30.0))]
    assert choose_count(knee, 0.0).gpus == 4  # type: ignore[union-attr]


def test_efficiency_is_of_the_placement_free_now() -> None:
    # 8 GPUs fit now but only scattered (a third of their empty-cluster rate): under the threshold, so the 4 that
    # fit well are chosen
    opts = [CountOption(2, 20.0, 20.0), CountOption(4, 40.0, 40.0), CountOption(8, 80.0, 25.0)]
    c = choose_count(opts)
    assert c is not None and c.gpus == 4
    # the smallest count is always allowed, however it fits now
    assert choose_count([CountOption(2, 20.0, 2.0), CountOption(4, 40.0, 0.0)]).gpus == 2  # type: ignore[union-attr]


def test_the_bounds_are_the_options_and_unplaceable_counts_are_skipped() -> None:
    # 2 and 3 cannot be placed at all (say, a constraint): the smallest placeable count is the reference
    opts = [CountOption(2, 0.0), CountOption(3, 0.0), CountOption(4, 40.0), CountOption(5, 45.0)]
    c = choose_count(opts)
    assert c is not None and c.gpus == 4 and not c.fits_now
    assert choose_count([CountOption(2, 0.0), CountOption(3, 0.0)]) is None
    assert choose_count([]) is None


def test_the_upper_bound_is_the_least_of_max_instances_the_entitlement_and_the_reservation() -> None:
    assert upper_bound(16, 2, None, 0) == 16
    assert upper_bound(0, 2, None, 0) == 0  # no bound at all: every slot of the cluster
    assert upper_bound(0, 2, 40, 0) == 40
    assert upper_bound(64, 24, 64, 32) == 32  # beyond its pool's reservation a gang runs on loan
    assert upper_bound(16, 2, 8, 32) == 8
    # a cap below min_instances does not hold the job: it waits for admission as any other
    assert upper_bound(16, 4, 3, 2) == 16
    assert upper_bound(64, 24, 20, 32) == 32


@pytest.mark.parametrize("seed", range(40))
def test_random_curves_follow_the_rule(seed: int) -> None:
    rng = random.Random(seed)
    lo = rng.randint(1, 8)
    hi = lo + rng.randint(0, 24)
    free = rng.randint(0, hi + 2)
    threshold = rng.choice([0.0, 0.25, 0.5, 0.75, 1.0])
    opts = []
    for k in range(lo, hi + 1):
        best = 0.0 if rng.random() < 0.1 else amdahl(k, rng.uniform(0, 0.3)) * rng.uniform(0.9, 1.0)
        now = best * rng.uniform(0.3, 1.0) if best and k <= free else 0.0
        opts.append(CountOption(k, best, now))
    c = choose_count(opts, threshold)
    placeable = [o for o in opts if o.best > 0]
    if not placeable:
        assert c is None
        return
    assert c is not None and lo <= c.gpus <= hi
    ref = placeable[0]

    def eff(o: CountOption) -> float:
        return (o.now or o.best) / o.gpus / (ref.best / ref.gpus)

    ok = [o for o in placeable if o.now > 0 and (o is ref or eff(o) >= threshold)]
    if not ok:
        assert (c.gpus, c.fits_now) == (ref.gpus, False)
        return
    chosen = next(o for o in opts if o.gpus == c.gpus)
    assert c.fits_now and chosen in ok and all(o.now <= chosen.now for o in ok)


@pytest.mark.parametrize("bad, field", [
    ({"min_efficiency": -0.1}, "min_efficiency"), ({"min_efficiency": 1.5}, "min_efficiency"),
    ({"min_efficiency": float("nan")}, "min_efficiency"),
    ({"options": [CountOption(0, 1.0)]}, "options"), ({"options": [CountOption(2, -1.0)]}, "options"),
    ({"options": [CountOption(2, 1.0, float("inf"))]}, "options"),
])
def test_bad_input_names_the_field(bad: dict[str, object], field: str) -> None:
    kw: dict[str, object] = {"options": [CountOption(2, 1.0)], "min_efficiency": 0.5} | bad
    with pytest.raises(InvalidArgument) as e:
        choose_count(**kw)  # type: ignore[arg-type]
    assert e.value.field == field


# --- through the job manager ---------------------------------------------------------------------------------------
def _count(subs: list[Submission], name: str) -> int:
    r = Replay(Cluster(hosts=4, gpus=4), subs, lambda s, p: 100.0, models=[_bert()]).run()
    job = next(j for j in r.jobs if j.name == name)
    assert job.state == "SUCCEEDED" and job.placement is not None
    return job.placement.gpus


def test_the_daemon_sizes_auto_jobs_by_the_rule_on_an_idle_and_a_busy_cluster() -> None:
    """The job manager's planner (jobmgr/planning.py) on a sim cluster of 4 hosts x 4 T4s, bert at 8 per GPU,
    bounds 2..16. Idle: the count the rule gives on the exhaustive best placement of every count (with
    model.min_efficiency 0, the fastest); in a pool reserving fewer GPUs, no more than it reserves. Busy (a gang
    holds every GPU): the smallest count, not the upper bound."""
    params = parse_document(json.loads(_bert().document)).params
    assert params is not None
    hosts = [FreeHost(f"h{i}", 4) for i in range(4)]
    rates = {k: p.samples_per_s for k in range(2, 17) if (p := exhaustive(params, hosts, k, 8.0)) is not None}
    expected = choose_count([CountOption(k, r, r) for k, r in rates.items()])
    assert expected is not None and expected.gpus > 2  # bert scales: an idle cluster gives it more than the fewest
    assert max(rates, key=lambda k: rates[k]) > expected.gpus  # but not the most samples/s: past the threshold
    assert _count([Submission(0, "auto", _model_aware("auto", auto=(2, 16)))], "auto") == expected.gpus
    # model.min_efficiency 0: the most samples/s that starts now
    spec = _model_aware("auto", auto=(2, 16))
    assert spec.model is not None
    greedy = dataclasses.replace(spec, model=dataclasses.replace(spec.model, min_efficiency=0.0))
    assert _count([Submission(0, "auto", greedy)], "auto") == max(rates, key=lambda k: rates[k])

    # in a pool that reserves 3 GPUs of the 16: at most 3, though the other 13 are free to borrow
    pools = [ResourcePool("/p", reservation=Resources(cpu=12, mem=24 * 1024, gpu=3)),
             ResourcePool("/q", reservation=Resources(cpu=52, mem=104 * 1024, gpu=13))]
    r = Replay(Cluster(hosts=4, gpus=4), [Submission(0, "auto", _model_aware("auto", auto=(2, 16), pool="/p"))],
               lambda s, p: 100.0, pools=pools, preemption=True, models=[_bert()]).run()
    assert r.jobs[0].placement is not None and r.jobs[0].placement.gpus == 3

    hog = _model_aware("hog", instances=16)
    busy = [Submission(0, "hog", hog), Submission(10, "auto", _model_aware("auto", auto=(2, 16)))]
    assert _count(busy, "auto") == 2
