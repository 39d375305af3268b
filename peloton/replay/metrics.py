"""What a replay's users felt, from what the replay recorded: job completion time, queueing delay, makespan, GPU
allocation against its offline bound, GPU-seconds in partial gangs, hosts and racks per gang, finish-time fairness
per pool. A pure core over plain data: no clock, no I/O. Every definition: docs/scheduling-quality.md, "Metrics"."""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from peloton.errors import InvalidArgument

# Gang sizes by GPUs asked: (label, smallest, largest); every size falls in exactly one.
SIZE_BUCKETS: tuple[tuple[str, int, int], ...] = (
    ("1", 1, 1), ("2-4", 2, 4), ("5-8", 5, 8), ("9-16", 9, 16), ("17+", 17, 1 << 62))


def size_bucket(gpus: int) -> str:
    for label, lo, hi in SIZE_BUCKETS:
        if lo <= gpus <= hi:
            return label
    raise InvalidArgument(f"gpus: a gang asks for at least 1 GPU, not {gpus}", field="gpus")


@dataclass(frozen=True)
class Cluster:
    hosts: int
    gpus_per_host: int
    racks: int = 1

    @property
    def gpus(self) -> int:
        return self.hosts * self.gpus_per_host


@dataclass(frozen=True)
class JobRecord:
    """One job as the replay saw it. `start` is when all its members were running in the run that finished (a job
    preempted and started again: the last start), `first_start` when they first all ran (None: `start`); `start` and
    `end` are None for a job that never finished."""
    name: str
    pool: str
    gpus: int
    submit: float
    start: float | None
    end: float | None
    gpus_per_host: Mapping[str, int] = field(default_factory=dict)  # the finishing run's placement
    racks: frozenset[str] = frozenset()
    preempted: int = 0
    first_start: float | None = None

    @property
    def waited_s(self) -> float:
        """Queueing delay: from submission until all members first ran."""
        first = self.start if self.first_start is None else self.first_start
        assert first is not None
        return first - self.submit

    @property
    def finished(self) -> bool:
        return self.end is not None

    @property
    def run_s(self) -> float:
        assert self.start is not None and self.end is not None
        return self.end - self.start


@dataclass(frozen=True)
class Sample:
    """The cluster from `time` until the next sample's time: GPUs allocated to tasks, gangs waiting, and GPUs held by
    gangs some of whose members hold none (a partial gang: the scheduler's invariant says there is none)."""
    time: float
    gpus_allocated: int
    queue_length: int
    partial_gang_gpus: int = 0


@dataclass(frozen=True)
class Replay:
    cluster: Cluster
    jobs: Sequence[JobRecord]
    timeline: Sequence[Sample]
    reservations: Mapping[str, int] = field(default_factory=dict)  # pool -> GPUs reserved


def percentile(values: Sequence[float], p: float) -> float | None:
    """Nearest rank: the smallest value that at least p% of the values are at or below; None for no values."""
    if not values:
        return None
    s = sorted(values)
    return s[max(0, math.ceil(p / 100 * len(s)) - 1)]


def mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def check(replay: Replay) -> None:
    """Raises InvalidArgument naming the job or sample and the field at fault."""
    c = replay.cluster
    if c.hosts < 1 or c.gpus_per_host < 1 or c.racks < 1:
        raise InvalidArgument(f"cluster: hosts, gpus_per_host and racks must be >= 1, not {c}", field="cluster")
    names: set[str] = set()
    for j in replay.jobs:
        where = f"job {j.name!r}"
        if j.name in names:
            raise InvalidArgument(f"{where}: recorded twice", field="name")
        names.add(j.name)
        if not 1 <= j.gpus <= c.gpus:
            raise InvalidArgument(f"{where}: gpus {j.gpus} not in 1..{c.gpus} (the cluster)", field="gpus")
        if (j.start is None) != (j.end is None):
            raise InvalidArgument(f"{where}: start and end are both set or both None", field="end")
        if j.start is not None and j.end is not None:
            if j.start < j.submit:
                raise InvalidArgument(f"{where}: start {j.start} before submit {j.submit}", field="start")
            if j.first_start is not None and not j.submit <= j.first_start <= j.start:
                raise InvalidArgument(f"{where}: first_start {j.first_start} not between submit {j.submit} and "
                                      f"start {j.start}", field="first_start")
            if j.end < j.start:
                raise InvalidArgument(f"{where}: end {j.end} before start {j.start}", field="end")
            if j.gpus_per_host and sum(j.gpus_per_host.values()) != j.gpus:
                raise InvalidArgument(f"{where}: placement holds {sum(j.gpus_per_host.values())} GPUs, "
                                      f"the job asks {j.gpus}", field="gpus_per_host")
        if j.preempted < 0:
            raise InvalidArgument(f"{where}: preempted {j.preempted} < 0", field="preempted")
    last = -math.inf
    for i, s in enumerate(replay.timeline):
        if s.time < last:
            raise InvalidArgument(f"timeline[{i}]: time {s.time} before the previous sample's", field="time")
        last = s.time
        if not 0 <= s.gpus_allocated <= c.gpus:
            raise InvalidArgument(f"timeline[{i}]: gpus_allocated {s.gpus_allocated} not in 0..{c.gpus}",
                                  field="gpus_allocated")
        if s.queue_length < 0 or s.partial_gang_gpus < 0:
            raise InvalidArgument(f"timeline[{i}]: a negative count", field="queue_length")
    for pool, gpus in replay.reservations.items():
        if gpus < 0:
            raise InvalidArgument(f"reservations[{pool!r}]: {gpus} GPUs < 0", field="reservations")


def integral(timeline: Sequence[Sample], attr: str, t0: float, t1: float) -> float:
    """The step function `attr` of the samples (0 before the first; each value held until the next sample, the last
    until t1) integrated over [t0, t1]."""
    total = 0.0
    for i, s in enumerate(timeline):
        a = max(s.time, t0)
        b = min(timeline[i + 1].time if i + 1 < len(timeline) else t1, t1)
        if b > a:
            total += getattr(s, attr) * (b - a)
    return total


def makespan_lower_bound(jobs: Iterable[JobRecord], gpus: int) -> float:
    """The shortest time, from the first submission, in which any schedule could run these finished jobs, each for its
    recorded run time on its GPUs, none before its submission, at most `gpus` GPUs at once. The largest of: a job's
    submission plus its run time; for each submission time r, r plus the GPU-seconds of the jobs submitted at or
    after r over the cluster's GPUs (that work is done after r, at most `gpus` wide); for each r, r plus the run
    times of the jobs submitted at or after r that ask more than half the cluster (no two of them run at once)."""
    done = sorted((j for j in jobs if j.finished), key=lambda j: j.submit)
    if not done:
        return 0.0
    t0 = done[0].submit
    best = max(j.submit + j.run_s for j in done)
    area = wide = 0.0
    for j in reversed(done):  # suffixes by submission time: the jobs submitted at or after j.submit
        area += j.gpus * j.run_s
        if 2 * j.gpus > gpus:
            wide += j.run_s
        best = max(best, j.submit + area / gpus, j.submit + wide)
    return best - t0


def private_fifo_jct(jobs: Sequence[JobRecord], gpus: int) -> list[float]:
    """Each job's completion time on a private cluster of `gpus` GPUs (at least the widest job's), run in submission
    order without backfill: a job starts at its submission, not before the one before it started, once enough GPUs
    are free; it runs its recorded run time. Hosts are not modelled: any free GPUs will do."""
    order = sorted(jobs, key=lambda j: (j.submit, j.name))
    cap = max([gpus] + [j.gpus for j in order])
    free, t, out = cap, -math.inf, []
    running: list[tuple[float, int]] = []  # a heap of (end, GPUs)
    for j in order:
        t = max(t, j.submit)
        while running and running[0][0] <= t:
            free += heapq.heappop(running)[1]
        while free < j.gpus:
            end, g = heapq.heappop(running)
            t, free = max(t, end), free + g
        free -= j.gpus
        heapq.heappush(running, (t + j.run_s, j.gpus))
        out.append(t + j.run_s - j.submit)
    return out


def _stats(prefix: str, values: Sequence[float]) -> dict[str, float | None]:
    return {f"{prefix}_mean_s": mean(values), f"{prefix}_p50_s": percentile(values, 50),
            f"{prefix}_p99_s": percentile(values, 99)}


def summarize(replay: Replay) -> dict[str, Any]:
    """The metrics of one replay as a JSON-ready document (keys: docs/scheduling-quality.md, "Metrics")."""
    check(replay)
    c, jobs = replay.cluster, list(replay.jobs)
    done = [j for j in jobs if j.finished]
    # t0: the first submission. Not an earlier sample (the driver samples the empty cluster at virtual second 0,
    # before a trace's first job): idle time no schedule could avoid is not the replay's makespan.
    starts = [j.submit for j in jobs] or [s.time for s in replay.timeline[:1]]
    t0 = min(starts) if starts else 0.0
    ends = [j.end for j in done if j.end is not None]
    t1 = max(ends) if ends else t0
    if len(done) < len(jobs) and replay.timeline:  # a job left unfinished: the replay ran until its last sample
        t1 = max(t1, replay.timeline[-1].time)
    makespan = t1 - t0
    lb = makespan_lower_bound(done, c.gpus)
    alloc = integral(replay.timeline, "gpus_allocated", t0, t1)
    work = sum(j.gpus * j.run_s for j in done)
    capacity = c.gpus * makespan

    def jct(j: JobRecord) -> float:
        assert j.end is not None
        return j.end - j.submit

    out: dict[str, Any] = {
        "jobs": len(jobs), "finished": len(done), "unfinished": len(jobs) - len(done),
        **_stats("jct", [jct(j) for j in done]), **_stats("queue", [j.waited_s for j in done]),
        "makespan_s": makespan, "makespan_lower_bound_s": lb,
        "alloc_gpu_s": alloc, "work_gpu_s": work,
        "gpu_alloc_frac": alloc / capacity if capacity else 0.0,
        "gpu_alloc_bound": min(1.0, alloc / (c.gpus * lb)) if lb else (1.0 if alloc else 0.0),
        "gpu_busy_frac": work / capacity if capacity else 0.0,
        "partial_gang_gpu_s": integral(replay.timeline, "partial_gang_gpus", t0, t1),
        "preemptions": sum(j.preempted for j in jobs),
        "hosts_per_gang_mean": mean([len(j.gpus_per_host) for j in done if j.gpus_per_host]),
        "racks_per_gang_mean": mean([len(j.racks) for j in done if j.racks]),
    }
    out["gpu_alloc_of_bound"] = out["gpu_alloc_frac"] / out["gpu_alloc_bound"] if out["gpu_alloc_bound"] else None
    widest = max((j.gpus for j in jobs), default=0)
    out["largest_gang_gpus"] = widest
    out["largest_gang_wait_s"] = max((j.waited_s for j in done if j.gpus == widest), default=None)
    by_size: dict[str, Any] = {}
    for label, _, _ in SIZE_BUCKETS:
        b = [j for j in done if size_bucket(j.gpus) == label]
        by_size[label] = {
            "jobs": len([j for j in jobs if size_bucket(j.gpus) == label]),
            **_stats("jct", [jct(j) for j in b]), "queue_mean_s": mean([j.waited_s for j in b]),
            "hosts_mean": mean([len(j.gpus_per_host) for j in b if j.gpus_per_host]),
            "hosts_min_mean": mean([math.ceil(j.gpus / c.gpus_per_host) for j in b]),
            "racks_mean": mean([len(j.racks) for j in b if j.racks]),
        }
    out["by_size"] = by_size
    pools: dict[str, Any] = {}
    for pool in sorted({j.pool for j in jobs} | set(replay.reservations)):
        pj = [j for j in done if j.pool == pool]
        reserved = replay.reservations.get(pool, 0)
        shared = mean([jct(j) for j in pj])
        private = mean(private_fifo_jct(pj, reserved)) if reserved and pj else None
        pools[pool] = {"jobs": len([j for j in jobs if j.pool == pool]), "reserved_gpus": reserved,
                       "jct_mean_s": shared, "private_jct_mean_s": private,
                       "ftf": shared / private if shared is not None and private else None}
    out["pools"] = pools
    ratios = [p["ftf"] for p in pools.values() if p["ftf"] is not None]
    out["ftf_max"] = max(ratios) if ratios else None
    return out
