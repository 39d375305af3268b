"""The scheduler's policies in a replay (peloton/replay/driver.py, docs/architecture.md "Virtual time (replay)"):
placement order backfill and fifo, two pools with preemption on and off, model-aware and `instances: auto` jobs,
and a mixed replay that must come out the same in two processes."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from peloton.domain.model import ResourcePool, StoredModel
from peloton.domain.resources import Resources
from peloton.domain.spec import JobSpec, ModelRef
from peloton.replay.driver import Cluster, JobResult, Replay, ReplayResult, Submission
from peloton.resmgr.manager import PROBE_ROUND_EVERY_S
from peloton.resmgr.ordering import QueueOrder
from tests.unit.test_replay_driver import _outcome, _spec


def test_a_small_gang_behind_a_big_waiting_one_starts_earlier_under_backfill_than_under_fifo() -> None:
    """hold takes one of two hosts for 100 s; big (both hosts) waits for it; small (one host) comes after big.
    Backfill places small on the free host at once; fifo starts nothing behind big: small runs after big."""
    subs = [Submission(0, "hold", _spec("hold", 1, 4)), Submission(1, "big", _spec("big", 2, 4)),
            Submission(2, "small", _spec("small", 1, 4))]
    took = {"hold": 100.0, "big": 50.0, "small": 30.0}

    def starts(order: str) -> dict[str, tuple[float | None, float | None]]:
        r = Replay(Cluster(hosts=2, gpus=4), subs, lambda s, p: took[s.name], order=order).run()
        assert all(j.state == "SUCCEEDED" for j in r.jobs)
        return {j.name: (j.running_s, j.end_s) for j in r.jobs}

    backfill, fifo = starts("backfill"), starts("fifo")
    assert backfill == {"hold": (0.0, 100.0), "big": (100.0, 150.0), "small": (2.0, 32.0)}
    assert fifo == {"hold": (0.0, 100.0), "big": (100.0, 150.0), "small": (150.0, 180.0)}
    assert fifo == starts("fifo")  # deterministic


def test_a_replays_order_is_checked() -> None:
    with pytest.raises(ValueError, match="order: must be one of backfill, fifo, got 'lifo'"):
        Replay(Cluster(hosts=1, gpus=4), [], lambda s, p: 1.0, order="lifo")


# --- two pools and preemption ------------------------------------------------------------------------------------
HALF = Resources(cpu=128, mem=512 * 1024, gpu=8)  # half of a cluster of 4 hosts x 4 GPUs (64 cpu, 256 GiB each)


def _in(pool: str, name: str, members: int, gpus: int) -> JobSpec:
    return dataclasses.replace(_spec(name, members, gpus), respool=pool)


@pytest.mark.parametrize("preemption", [True, False])
def test_a_pool_takes_back_its_lent_gpus_by_preemption_or_waits_without(preemption: bool) -> None:
    """/a reserves half the cluster and is idle: /b's two gangs (2 members x 4 GPUs each) borrow it. /a's gang
    arrives at 30 s. With preemption, one of /b's gangs is preempted whole after the settling window (5 s here, in
    virtual time) and runs again, whole, once /a's gang ends; without, /a's gang waits for /b's to end."""
    settle = 5.0
    pools = [ResourcePool("/a", reservation=HALF), ResourcePool("/b", reservation=HALF)]
    subs = [Submission(0, "b1", _in("/b", "b1", 2, 4)), Submission(0, "b2", _in("/b", "b2", 2, 4)),
            Submission(30, "a1", _in("/a", "a1", 2, 4))]
    took = {"b1": 1000.0, "b2": 1000.0, "a1": 100.0}
    r = Replay(Cluster(hosts=4, gpus=4), subs, lambda s, p: took[s.name], pools=pools, preemption=preemption,
               preemption_settle_s=settle).run()
    b1, b2, a1 = r.jobs
    assert {j.state for j in r.jobs} == {"SUCCEEDED"}
    for j in r.jobs:  # every run whole: 2 hosts x 4 GPUs
        assert j.placement is not None and [n for _, n in j.placement.hosts] == [4, 4]
    # the cluster as sampled at every instant holds whole gangs of 8 GPUs only: never a gang half preempted
    assert {s.gpus_allocated % 8 for s in r.timeline} == {0} and max(s.gpus_allocated for s in r.timeline) == 16
    if not preemption:
        assert a1.running_s == max(b1.end_s or 0, b2.end_s or 0) == pytest.approx(1000.0, abs=1e-3)
        assert (b1.runs, b1.preemptions, b2.runs, b2.preemptions) == (1, 0, 1, 0)
        return
    # a1 starts once settled: its first probe round after the window (resmgr looks every PROBE_ROUND_EVERY_S)
    assert a1.running_s is not None and 30 + settle <= a1.running_s <= 30 + settle + 2 * PROBE_ROUND_EVERY_S
    assert a1.end_s == a1.running_s + 100.0
    # the victim: of two gangs alike, the one with the lower gang id (b1's job, created first) on every run
    assert (b2.runs, b2.preemptions, b2.end_s) == (1, 0, pytest.approx(1000.0, abs=1e-3))
    assert (b1.runs, b1.preemptions) == (2, 1)
    assert b1.running_s == pytest.approx(0.0, abs=1e-3) and b1.last_start_s == a1.end_s  # again when a1 ends
    assert b1.end_s == b1.last_start_s + 1000.0  # from the start (the work model here keeps no progress)


# --- the queue order (--queue-order) ------------------------------------------------------------------------------
def _declared(pool: str, name: str, members: int, max_runtime_s: float) -> JobSpec:
    return dataclasses.replace(_in(pool, name, members, 4), max_runtime_s=max_runtime_s)


def _queue_order_replay(order: QueueOrder) -> dict[str, tuple[float | None, float | None]]:
    """/a (8 of 16 GPUs) is full with a-hold; /b holds 4 GPUs with b-hold (both 1,000 s, no max_runtime). Then /b
    queues wide (12 GPUs, max_runtime 1 h: 12 GPU-hours), narrow (4 GPUs, 10 min: 2/3 GPU-hour) and, at 200 s,
    narrow2 (the same). Wide is over /b's entitlement and cannot borrow the 4 GPUs free; nothing can backfill
    behind it (the gangs in the way have no max_runtime, so when it could start is not known)."""
    pools = [ResourcePool("/a", reservation=HALF), ResourcePool("/b", reservation=HALF)]
    subs = [Submission(0, "a-hold", _in("/a", "a-hold", 2, 4)), Submission(0, "b-hold", _in("/b", "b-hold", 1, 4)),
            Submission(1, "wide", _declared("/b", "wide", 3, 3600)),
            Submission(2, "narrow", _declared("/b", "narrow", 1, 600)),
            Submission(200, "narrow2", _declared("/b", "narrow2", 1, 600))]
    took = {"a-hold": 1000.0, "b-hold": 1000.0, "wide": 50.0, "narrow": 300.0, "narrow2": 300.0}
    r = Replay(Cluster(hosts=4, gpus=4), subs, lambda s, p: took[s.name], pools=pools, preemption=False,
               queue_order=order).run()
    assert {j.state for j in r.jobs} == {"SUCCEEDED"}
    assert not [s for s in r.timeline if s.partial_gpus]  # whole gangs only, under every order
    return {j.name: (j.running_s, j.end_s) for j in r.jobs}


def test_the_queue_order_gpu_time_lets_narrow_short_gangs_pass_a_wide_one_until_it_is_promoted() -> None:
    arrival = _queue_order_replay(QueueOrder("arrival"))
    # first come, first served: both narrow gangs wait behind wide until the holds end
    assert arrival["wide"][0] == arrival["narrow"][0] == pytest.approx(1000.0, abs=1e-3)
    assert arrival["narrow2"][0] is not None and arrival["narrow2"][0] >= 1000.0
    never = _queue_order_replay(QueueOrder("gpu-time", promote_after_s=86400.0))
    # least expected GPU-time first: narrow starts at once in /b's room, narrow2 as soon as narrow ends
    assert never["narrow"] == (pytest.approx(2.0, abs=0.01), pytest.approx(302.0, abs=0.01))
    assert never["narrow2"][0] == pytest.approx(302.0, abs=0.01)
    assert never["wide"][0] == pytest.approx(1000.0, abs=1e-3)
    # aging: wide is promoted 100 s after it queued, before narrow2 comes, so narrow2 waits behind it again
    aged = _queue_order_replay(QueueOrder("gpu-time", promote_after_s=100.0))
    assert aged["narrow"][0] == pytest.approx(2.0, abs=0.01)
    assert aged["wide"][0] == pytest.approx(1000.0, abs=1e-3)
    assert aged["narrow2"][0] is not None and aged["narrow2"][0] >= 1000.0
    assert aged == _queue_order_replay(QueueOrder("gpu-time", promote_after_s=100.0))  # deterministic


# --- model-aware jobs and instances: auto ------------------------------------------------------------------------
def _bert() -> StoredModel:
    from peloton.modelaware.document import ModelDocument, document_to_dict
    from peloton.modelaware.fit import fit
    from peloton.modelaware.profile import select
    from tests.unit.modelaware_data import REFERENCE, SMALL, profile

    params = fit(select(profile("bert"), SMALL), REFERENCE).params
    return StoredModel("bert", "replay", json.dumps(document_to_dict(ModelDocument(name="bert", params=params))))


GPU1 = Resources(cpu=4, mem=8192, gpu=1)


def _model_aware(name: str, instances: int = 8, auto: tuple[int, int] | None = None, pool: str = "/") -> JobSpec:
    ref = ModelRef("bert", local_bsz=8)
    if auto is not None:
        ref = dataclasses.replace(ref, auto_instances=True, min_instances=auto[0], max_instances=auto[1])
    return JobSpec(name=name, instances=1 if auto else instances, command="train", resources=GPU1, respool=pool,
                   strategy="model-aware", model=ref)


def test_model_aware_and_auto_jobs_are_planned_and_run_in_virtual_time() -> None:
    """On an idle cluster of 4 hosts x 4 GPUs: a plain gang of 8 packs on two hosts; bert's cost model spreads the
    same gang over four (its two-host placements are its slowest, the public measurements: as `job plan` on the
    daemon says, tests/e2e/test_model_aware_e2e.py); `instances: auto` gets a count within its bounds."""
    plain = JobSpec(name="plain", instances=8, command="train", resources=GPU1)
    subs = [Submission(0, "plain", plain), Submission(100, "ma", _model_aware("ma")),
            Submission(200, "auto", _model_aware("auto", auto=(2, 8)))]

    def run() -> ReplayResult:
        return Replay(Cluster(hosts=4, gpus=4), subs, lambda s, p: 50.0, models=[_bert()]).run()

    r = run()
    by = {j.name: j for j in r.jobs}
    assert {j.state for j in r.jobs} == {"SUCCEEDED"}
    assert [(j.running_s, j.end_s) for j in r.jobs] == [(0.0, 50.0), (100.0, 150.0), (200.0, 250.0)]
    p_plain, p_ma, p_auto = (by[n].placement for n in ("plain", "ma", "auto"))
    assert p_plain is not None and p_ma is not None and p_auto is not None
    assert sorted(n for _, n in p_plain.hosts) == [4, 4]
    assert sorted(n for _, n in p_ma.hosts) == [2, 2, 2, 2]
    assert 2 <= p_auto.gpus <= 8
    assert _outcome(run()) == _outcome(r)


# --- determinism -------------------------------------------------------------------------------------------------
def _mixed(order: str = "arrival") -> list[tuple[object, ...]]:
    """A mixed replay: two pools with preemption on, plain and model-aware gangs, some `instances: auto`. Under
    queue order gpu-time (promotion after 10 minutes) the plain gangs declare a max_runtime (the others none)."""
    rng = random.Random(11)
    pools = [ResourcePool("/a", reservation=Resources(cpu=128, mem=512 * 1024, gpu=8)),
             ResourcePool("/b", reservation=Resources(cpu=128, mem=512 * 1024, gpu=8))]
    subs = []
    for i in range(40):
        pool, at = rng.choice(["/a", "/b"]), rng.uniform(0, 3600)
        kind = rng.choice(["plain", "plain", "model", "auto"])
        if kind == "plain":
            # at most a pool's reservation (8 GPUs): a bigger gang waits as long as the other pool wants its half
            members = rng.choice([1, 2])
            spec = _in(pool, f"j{i}", members, 4 if members > 1 else rng.choice([1, 2, 4]))
            if order == "gpu-time":  # (longer than any run below: 1,500 s x 1.3)
                spec = dataclasses.replace(spec, max_runtime_s=2000.0 * members)
        else:
            spec = _model_aware(f"j{i}", rng.choice([2, 4, 8]), (2, 8) if kind == "auto" else None, pool)
        subs.append(Submission(at, f"j{i}", spec))
    work = {s.name: rng.uniform(200, 1500) for s in subs}
    r = Replay(Cluster(hosts=4, gpus=4, racks=2), subs,
               lambda s, p: work[s.name] * (1.0 if len(p.racks) == 1 else 1.3), pools=pools, preemption=True,
               models=[_bert()], queue_order=QueueOrder(order, promote_after_s=600.0)).run()
    assert {j.state for j in r.jobs} == {"SUCCEEDED"}
    return [dataclasses.astuple(j) for j in r.jobs] + [dataclasses.astuple(s) for s in r.timeline]


@pytest.mark.parametrize("order", ["arrival", "gpu-time"])
def test_a_mixed_replay_gives_the_same_results_in_two_processes(order: str) -> None:
    """Two processes (different string hash seeds, so no set's order can pass for determinism): the same job
    results, ids included, and the same timeline, under either queue order."""
    code = f"import json; from {__name__} import {_mixed.__name__} as run; print(json.dumps(run({order!r})))"
    out = []
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300,
                           cwd=Path(__file__).resolve().parents[2])
        assert p.returncode == 0, p.stderr[-3000:]
        out.append(json.loads(p.stdout))
    assert out[0] == out[1]
    jobs = [row for row in out[0] if isinstance(row[0], str)]
    preemptions = [f.name for f in dataclasses.fields(JobResult)].index("preemptions")
    assert len(jobs) == 40 and any(row[preemptions] for row in jobs)  # preemptions happened
