"""The order of a pool's waiting gangs (peloton/resmgr/ordering.py, --queue-order): the pure core, and the queues
(queues.py) that key and promote by it."""

from __future__ import annotations

import dataclasses
import math

import pytest

from peloton.errors import InvalidArgument
from peloton.resmgr.ordering import (
    ARRIVAL,
    DEFAULT_PROMOTE_AFTER_S,
    FIRST_QUEUE_GPU_S,
    QUEUES,
    QueueOrder,
    promote_at,
    rank,
    service_queue,
)
from peloton.resmgr.queues import Queues
from tests.unit.test_resmgr import gang

GT = QueueOrder("gpu-time", promote_after_s=1000.0)
H = 3600.0


def test_arrival_puts_every_gang_in_one_queue_and_never_promotes() -> None:
    assert service_queue(ARRIVAL, 64, 30 * 86400) == 0 == service_queue(ARRIVAL, 1, 0)
    assert promote_at(ARRIVAL, 0, 5.0) is None
    assert ARRIVAL.promote_after_s == DEFAULT_PROMOTE_AFTER_S
    # priority first, then submission, then gang id: the order the resource manager always had
    assert rank(ARRIVAL, 0, 1, 60, 10.0, "b/0", 10.0, 11.0) < rank(ARRIVAL, 0, 64, 86400, 11.0, "a/0", 11.0, 11.0)
    assert rank(ARRIVAL, 1, 64, 0, 99.0, "z/0", 99.0, 99.0) < rank(ARRIVAL, 0, 1, 1, 0.0, "a/0", 0.0, 99.0)


@pytest.mark.parametrize("gpus,max_runtime_s,queue", [
    (1, FIRST_QUEUE_GPU_S, 0),  # one GPU-hour: the first queue, bound included
    (1, FIRST_QUEUE_GPU_S + 1, 1),
    (2, 2 * H, 1),  # 4 GPU-hours
    (2, 2 * H + 1, 2),
    (8, 2 * H, 2),  # 16 GPU-hours
    (16, 4 * H, 3),  # 64
    (64, 4 * H, 4),  # 256
    (64, 4 * H + 1, QUEUES - 1),  # beyond the last bound
    (64, 365 * 86400, QUEUES - 1),
    (4, 0, QUEUES - 1),  # no sla.max_runtime: not known, the last queue
    (0, 30 * 86400, 0),  # a gang without GPUs takes no GPU-time
    (0, 0, QUEUES - 1),  # ...but without sla.max_runtime it is not known either (docs/pools.md says so)
])
def test_gpu_time_queues_by_gpus_times_max_runtime(gpus: int, max_runtime_s: float, queue: int) -> None:
    assert service_queue(GT, gpus, max_runtime_s) == queue


def test_gpu_time_puts_a_narrow_short_gang_before_a_wide_long_one_but_never_before_a_higher_priority() -> None:
    wide = rank(GT, 0, 21, 4 * H, 10.0, "wide/0", 10.0, 20.0)  # 84 GPU-hours, queue 4
    narrow = rank(GT, 0, 2, 600, 20.0, "narrow/0", 20.0, 20.0)  # 1/3 GPU-hour, queue 0
    assert narrow < wide
    urgent_wide = rank(GT, 1, 21, 4 * H, 30.0, "u/0", 30.0, 30.0)
    assert urgent_wide < narrow
    # within a queue, arrival order
    assert rank(GT, 0, 1, 60, 5.0, "z/0", 5.0, 20.0) < narrow


def test_aging_promotes_a_waiting_gang_to_the_first_queue_after_promote_after() -> None:
    q = service_queue(GT, 21, 4 * H)
    assert q > 0 and promote_at(GT, q, 10.0) == 1010.0 and promote_at(GT, 0, 10.0) is None
    before = rank(GT, 0, 21, 4 * H, 10.0, "wide/0", 10.0, 1009.999)
    after = rank(GT, 0, 21, 4 * H, 10.0, "wide/0", 10.0, 1010.0)
    assert before[1] == q and after[1] == 0
    # promoted, it goes before a narrow gang submitted after it, but not before one submitted earlier
    assert after < rank(GT, 0, 1, 60, 500.0, "late/0", 500.0, 1010.0)
    assert rank(GT, 0, 1, 60, 5.0, "early/0", 5.0, 1010.0) < after
    # the wait counts from when this attempt was queued (a preempted gang queues again), not its submission
    assert rank(GT, 0, 21, 4 * H, 10.0, "wide/0", 900.0, 1010.0)[1] == q


@pytest.mark.parametrize("kind,promote,field,message", [
    ("lifo", 3600.0, "--queue-order", "--queue-order: must be one of arrival, gpu-time, got 'lifo'"),
    ("gpu-time", 0.0, "--queue-promote-after", "--queue-promote-after: must be a positive number of seconds, got 0.0"),
    ("gpu-time", -5.0, "--queue-promote-after", "got -5.0"),
    ("gpu-time", math.inf, "--queue-promote-after", "got inf"),
    ("gpu-time", math.nan, "--queue-promote-after", "got nan"),
])
def test_a_bad_queue_order_names_its_flag(kind: str, promote: float, field: str, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message.replace(".", r"\.")) as e:
        QueueOrder(kind, promote)
    assert e.value.field == field


# --- the queues --------------------------------------------------------------------------------------------------
def _g(job: str, gpus: int, max_runtime_s: float, at: float, priority: int = 0):  # type: ignore[no-untyped-def]
    return dataclasses.replace(gang(job, n=1, gpu=gpus, at=at, priority=priority), max_runtime_s=max_runtime_s)


def _heads(q: Queues, pool: str = "/") -> list[str]:
    """The pool's queue in order (taken off it)."""
    out = []
    while (e := q.head(pool)) is not None:
        out.append(e.req.job_id)
        q.pop_head(pool)
    return out


def test_under_arrival_the_queues_keep_submission_order() -> None:
    q = Queues()
    q.add(_g("wide", 21, 4 * H, at=1.0), 1.0)
    q.add(_g("narrow", 2, 600, at=2.0), 2.0)
    assert q.next_promotion() is None
    assert _heads(q) == ["wide", "narrow"]


def test_under_gpu_time_a_narrow_gang_passes_a_wide_one_until_the_wide_one_is_promoted() -> None:
    q = Queues(GT)
    q.add(_g("wide", 21, 4 * H, at=1.0), 1.0)
    q.add(_g("narrow", 2, 600, at=2.0), 2.0)
    assert q.next_promotion() == 1001.0  # the wide gang's; the narrow one is in the first queue already
    assert q.promote_due(1000.0) == 0
    assert (e := q.head("/")) is not None and e.req.job_id == "narrow"
    # no starvation: a stream of narrow gangs keeps coming; once promoted, the wide gang goes before every one of
    # them submitted after it (the first queue is in submission order)
    for i in range(5):
        q.add(_g(f"n{i}", 1, 60, at=500.0 + i), 500.0 + i)
    assert q.promote_due(1001.0) == 1 and q.next_promotion() is None
    assert _heads(q) == ["wide", "narrow", "n0", "n1", "n2", "n3", "n4"]


def test_a_gang_without_max_runtime_waits_behind_those_that_declare_one_until_promoted() -> None:
    q = Queues(GT)
    q.add(_g("unknown", 1, 0.0, at=1.0), 1.0)
    q.add(_g("declared", 8, 8 * H, at=2.0), 2.0)  # 64 GPU-hours, queue 3: still known, still before
    assert [e.req.job_id for e in [q.head("/")] if e] == ["declared"]
    q.promote_due(1001.0)
    assert _heads(q) == ["unknown", "declared"]


def test_a_parked_gang_is_promoted_when_it_comes_back_and_stale_promotions_are_dropped() -> None:
    q = Queues(GT)
    wide = q.add(_g("wide", 21, 4 * H, at=1.0), 1.0)
    q.add(_g("narrow", 2, 600, at=2.0), 2.0)
    q.pop_head("/")  # (narrow)
    assert q.head("/") is wide
    q.pop_head("/")
    q.admit(wide)  # placing: its promotion item goes stale
    assert q.next_promotion() is None
    wide.not_before = 2000.0
    q.push(wide, 10.0)  # unplaced: parked until 2000
    assert q.promote_due(1500.0) == 0 and q.head("/") is None  # parked: not queued by a promotion
    q.unpark_due(2000.0)  # back after its promotion time: queued in the first queue at once
    assert q.head("/") is wide and wide.order()[1] == 0


def test_a_gang_of_higher_priority_stays_first_whatever_its_size() -> None:
    q = Queues(GT)
    q.add(_g("small", 1, 60, at=1.0), 1.0)
    q.add(_g("urgent", 64, 30 * 86400, at=2.0, priority=3), 2.0)
    assert _heads(q) == ["urgent", "small"]


# --- through the resource manager ----------------------------------------------------------------------------------
@pytest.mark.parametrize("promote_after_s", [600.0, 86400.0])
def test_the_resource_manager_admits_in_the_queue_order_and_wakes_for_a_promotion(promote_after_s: float) -> None:
    from peloton.resmgr.manager import ResourceManager
    from tests.unit.test_resmgr import SHORT, Clock, Pools

    clock = Clock(1000.0)
    rm = ResourceManager(Pools(), clock=clock, queue_order=QueueOrder("gpu-time", promote_after_s))
    wide = dataclasses.replace(gang("wide", n=2, gpu=4, at=1000.0), max_runtime_s=4 * H)  # 32 GPU-hours: queue 3
    narrow = dataclasses.replace(gang("narrow", n=1, gpu=1, at=1001.0), max_runtime_s=600.0)  # queue 0
    rm.enqueue([wide, narrow])
    assert [g.job_id for g in rm.dequeue(1, SHORT)] == ["narrow"]  # submitted later, first in line
    assert rm.next_due(retries=False) == 1000.0 + promote_after_s  # the wide gang's promotion: a replay steps there
    clock.t = 1600.0
    narrow2 = dataclasses.replace(gang("narrow2", n=1, gpu=1, at=1500.0), max_runtime_s=600.0)
    rm.enqueue([narrow2])
    # promoted after 600 s, the wide gang goes before narrow2 (submitted after it); not yet promoted, after it
    first = "wide" if promote_after_s == 600.0 else "narrow2"
    assert [g.job_id for g in rm.dequeue(1, SHORT)] == [first]
    # and under the default order, first come, first served
    arrival = ResourceManager(Pools(), clock=Clock(1000.0))
    arrival.enqueue([wide, narrow])
    assert [g.job_id for g in arrival.dequeue(2, SHORT)] == ["wide", "narrow"]
    assert arrival.next_due(retries=False) is None
