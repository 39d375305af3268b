"""`peloton sim replay`'s shell: a trace's jobs as each policy submits them, replayed by the production components
in virtual time (driver.py), measured (metrics.py) and reported (report.py). docs/scheduling-quality.md,
"Running a replay".

How long a run lasts (Progress): a job's work in samples (work.py), done at the speed of the placement each run
got; a run cut short by preemption keeps the samples it did (the job checkpoints: its next run starts from there,
at no cost), so its next run lasts what is left at the speed of its next placement.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from peloton.domain.model import ResourcePool, StoredModel
from peloton.domain.spec import JobSpec
from peloton.errors import FailedPrecondition, InvalidArgument
from peloton.files import read_bounded
from peloton.modelaware.document import document_to_dict, parse_document
from peloton.replay import metrics, policies, report
from peloton.replay.driver import Cluster, Placement, Replay, ReplayResult, Run, Stalled, Submission
from peloton.replay.traces import (
    MAX_TRACE_SECONDS,
    ClusterShape,
    TraceJob,
    check_fits,
    parse_cluster,
    read_cluster_file,
    read_trace,
)
from peloton.replay.work import KNOWN, SpeedModel, hosts_of, speed, speed_models, work_samples
from peloton.resmgr.ordering import ARRIVAL, QueueOrder

MIN_RUN_S = 1e-3  # a run whose work was all done before (a preemption at its very end) still lasts this long
PROFILED = ("bert", "cifar10")  # the applications with a public profile: DIR/<application>/placements.csv
MAX_FILE_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Setup:
    """What every policy's replay of one trace shares."""

    source: str
    jobs: list[TraceJob]
    cluster: ClusterShape
    models: dict[str, SpeedModel]
    pools: list[ResourcePool]
    pool_of: dict[str, str]  # job name -> pool path
    seed: int = 0
    queue_order: QueueOrder = ARRIVAL  # the daemon's --queue-order (and --queue-promote-after), every policy's


@dataclass(slots=True)
class Outcome:
    """One replay: its policy's label, what the driver recorded, the metrics' view of it, and the specs."""

    label: str
    result: ReplayResult
    replay: metrics.Replay
    specs: dict[str, JobSpec] = field(default_factory=dict)


# --- reading -------------------------------------------------------------------------------------------------------

def read_text(path: str, what: str) -> str:
    """A file's text; an error naming the flag and the file when it cannot be read. Read up to MAX_FILE_BYTES and no
    further (files.read_bounded): a pipe or /dev/zero, whose size stat() says is 0, is refused once that much has
    come."""
    try:
        raw = read_bounded(path, MAX_FILE_BYTES, f"{what}: {path}", "a replay's input file", field=what)
    except OSError as e:
        raise InvalidArgument(f"{what}: cannot read {path}: {e.strerror or e}", field=what) from None
    try:
        return io.TextIOWrapper(io.BytesIO(raw), encoding="utf-8").read()  # newlines read as Path.read_text did
    except UnicodeDecodeError:
        raise InvalidArgument(f"{what}: {path}: not UTF-8 text", field=what) from None


def read_profiles(directory: str | None) -> dict[str, tuple[str, str]]:
    """{application: (profile text, source)} of the profiled applications found in `directory`."""
    if directory is None:
        return {}
    root = Path(directory)
    if not root.is_dir():
        raise InvalidArgument(f"--profiles: {directory} is not a directory", field="profiles")
    out = {}
    for app in PROFILED:
        path = root / app / "placements.csv"
        if path.is_file():
            out[app] = (read_text(str(path), "--profiles"), f"{app}/placements.csv")
    if not out:
        raise InvalidArgument(f"--profiles: no {' or '.join(f'{a}/placements.csv' for a in PROFILED)} in "
                              f"{directory}", field="profiles")
    return out


def setup(trace_path: str, fmt: str, *, cluster: str | None = None, cluster_file: str | None = None, racks: int = 1,
          profiles: str | None = None, pools: Sequence[ResourcePool] | None = None, seed: int = 0,
          queue_order: QueueOrder = ARRIVAL) -> Setup:
    """Everything a replay needs from the files named (nothing is started; every error names its file, row and
    column, or its flag)."""
    if (cluster is None) == (cluster_file is None):
        raise InvalidArgument("--cluster: give --cluster HxG or --cluster-file FILE (one of them)", field="cluster")
    if cluster_file is not None:
        if racks != 1:
            raise InvalidArgument("--racks: a cluster file says its racks (switches)", field="racks")
        shape = read_cluster_file(read_text(cluster_file, "--cluster-file"), Path(cluster_file).name)
    else:
        assert cluster is not None
        shape = parse_cluster(cluster, racks, field="--cluster")
    source = Path(trace_path).name
    jobs = read_trace(read_text(trace_path, "TRACE"), fmt, source, KNOWN)
    check_fits(jobs, shape, source)
    models = speed_models(read_profiles(profiles))
    for j in jobs:  # the work is known (a Pollux job's application has a data set and epochs), and lasts no longer
        longest = work_samples(j, models[j.application], shape) / policies.slowest_speed(  # than a trace's times
            models[j.application], j.gpus, j.batch_size, shape)
        if longest > MAX_TRACE_SECONDS:
            raise InvalidArgument(f"{source}: row {j.row}, job {j.name}: its work takes {longest:.3g} s at its "
                                  f"slowest placement, more than the {MAX_TRACE_SECONDS:.0f} (about 31.7 years) a "
                                  "trace's times may have", field="work")
    all_pools, pool_of = policies.assign_pools(jobs, shape, pools, source)
    return Setup(source, jobs, shape, models, all_pools, pool_of, seed, queue_order)


# --- the work model ------------------------------------------------------------------------------------------------

class Progress:
    """The driver's `duration_of`: a run lasts the job's work left at the speed of the placement it got (module
    docstring). `history(name)`: the job's earlier runs (Replay.history)."""

    def __init__(self, s: Setup, history: Callable[[str], Sequence[Run]]) -> None:
        self._jobs = {j.name: j for j in s.jobs}
        self._cluster = s.cluster
        self._models = s.models
        self._work = {j.name: work_samples(j, s.models[j.application], s.cluster) for j in s.jobs}
        self._history = history

    def speed(self, name: str, placement: Placement) -> float:
        job = self._jobs[name]
        return speed(self._models[job.application], hosts_of([n for _, n in placement.hosts], self._cluster),
                     job.batch_size)

    def done(self, name: str, runs: Sequence[Run]) -> float:
        """Samples done by the job's ended runs."""
        return sum((r.end_s - r.start_s) * self.speed(name, r.placement) for r in runs if r.end_s is not None)

    def __call__(self, sub: Submission, placement: Placement) -> float:
        left = self._work[sub.name] - self.done(sub.name, self._history(sub.name))
        return max(left / self.speed(sub.name, placement), MIN_RUN_S)


# --- one replay ----------------------------------------------------------------------------------------------------

def label(policy: policies.Policy, preemption: bool, both: bool) -> str:
    """A report column: the policy's name, with the preemption setting when both are compared."""
    return f"{policy.name}/{'preempt' if preemption else 'no-preempt'}" if both else policy.name


def specs(s: Setup, policy: policies.Policy) -> dict[str, JobSpec]:
    return {j.name: policies.job_spec(j, policy, s.cluster, s.models[j.application], s.pool_of[j.name])
            for j in s.jobs}


def stored_models(s: Setup) -> list[StoredModel]:
    """The model documents of the trace's applications, as `peloton model create` stores them (model-aware jobs
    name them)."""
    return [StoredModel(name=name, owner="replay", document=json.dumps(document_to_dict(parse_document(doc)),
                                                                      sort_keys=True))
            for name, doc in policies.model_documents(s.models, [j.application for j in s.jobs]).items()]


def replay_one(s: Setup, policy: policies.Policy, preemption: bool, name: str | None = None) -> Outcome:
    """`policy`'s replay of the trace (preemption on or off): deterministic for a seed. FailedPrecondition when
    the scheduler stalls (gangs wait that nothing will ever start: driver.Stalled)."""
    by_name = specs(s, policy)
    subs = [Submission(j.submit_s, j.name, by_name[j.name]) for j in s.jobs]
    c = s.cluster
    cluster = Cluster(hosts=c.hosts, gpus=c.gpus_per_host, racks=c.racks, cpu=float(c.cpus_per_host),
                      mem_mb=c.mem_gb_per_host * 1024, seed=s.seed,
                      labels=tuple(sorted(policies.host_labels(c).items())))
    holder: list[Replay] = []
    progress = Progress(s, lambda n: holder[0].history(n))
    rp = Replay(cluster, subs, progress, pools=s.pools, preemption=preemption, seed=s.seed, order=policy.order,
                queue_order=s.queue_order, models=stored_models(s))
    holder.append(rp)
    try:
        result = rp.run()
    except Stalled as e:
        raise FailedPrecondition(f"{name or policy.name}: {e}") from None
    return Outcome(name or policy.name, result, to_metrics(result, s), by_name)


def to_metrics(result: ReplayResult, s: Setup) -> metrics.Replay:
    """The driver's record as the metrics read it. A job that did not succeed has no start or end (it is counted
    unfinished); a job's GPUs are those of its last placement (with `auto`, the size chosen), or the trace's when
    it never ran."""
    asked = {j.name: j.gpus for j in s.jobs}
    jobs = []
    for r in result.jobs:
        ok = r.state == "SUCCEEDED" and r.end_s is not None and r.last_start_s is not None
        p = r.placement
        jobs.append(metrics.JobRecord(
            name=r.name, pool=s.pool_of.get(r.name, "/"), gpus=p.gpus if p is not None else asked[r.name],
            submit=r.submitted_s, start=r.last_start_s if ok else None, end=r.end_s if ok else None,
            gpus_per_host=dict(p.hosts) if p is not None else {}, racks=frozenset(p.racks) if p is not None else
            frozenset(), preempted=r.preemptions, first_start=r.running_s if ok else None))
    timeline = [metrics.Sample(x.t, x.gpus_allocated, x.queued, x.partial_gpus) for x in result.timeline]
    c = s.cluster
    return metrics.Replay(metrics.Cluster(c.hosts, c.gpus_per_host, c.racks), jobs, timeline,
                          policies.reservations(s.pools))


def over_max_runtime(o: Outcome) -> list[str]:
    """The jobs one of whose runs lasted longer than its sla.max_runtime (a daemon would have killed it)."""
    out = []
    for r in o.result.jobs:
        limit = o.specs[r.name].max_runtime_s
        if limit and any(x.end_s is not None and x.end_s - x.start_s > limit for x in r.history):
            out.append(r.name)
    return out


# --- every policy, and the report ----------------------------------------------------------------------------------

def replay_all(s: Setup, chosen: Sequence[policies.Policy], preemption: Sequence[bool],
               progress: Callable[[Outcome], None] | None = None) -> list[Outcome]:
    both = len(set(preemption)) > 1
    out = []
    for p in chosen:
        for pre in preemption:
            o = replay_one(s, p, pre, label(p, pre, both))
            out.append(o)
            if progress is not None:
                progress(o)
    return out


def results(outcomes: Sequence[Outcome]) -> dict[str, dict[str, Any]]:
    """Each replay's metrics (report.compare) with how the replay went: its wall time, virtual instants and the
    runs longer than their sla.max_runtime (0 in every replay, or the backfill it allowed was not earned)."""
    out = report.compare({o.label: o.replay for o in outcomes})
    for o in outcomes:
        out[o.label].update({"runs_over_max_runtime": len(over_max_runtime(o)), "instants": o.result.instants,
                             "wall_s": o.result.wall_s})
    return out


def document(s: Setup, outcomes: Sequence[Outcome]) -> dict[str, Any]:
    """`-o json`: report.document's, with what was replayed on what."""
    c = s.cluster
    return {"trace": s.source, "jobs": len(s.jobs), "seed": s.seed,
            "queue_order": {"order": s.queue_order.kind, "promote_after_s": s.queue_order.promote_after_s},
            "cluster": {"hosts": c.hosts, "gpus_per_host": c.gpus_per_host, "racks": c.racks},
            "pools": {p.path: p.reservation.gpu for p in s.pools}, **report.document(results(outcomes))}


def write_plots(outcomes: Sequence[Outcome], directory: str) -> list[Path]:
    return report.write_plots({o.label: o.replay for o in outcomes}, Path(directory))


def completion_times(outcomes: Sequence[Outcome]) -> Mapping[str, list[tuple[str, float | None]]]:
    """Each replay's jobs and their end (what two runs of one seed agree on)."""
    return {o.label: [(r.name, r.end_s) for r in o.result.jobs] for o in outcomes}
