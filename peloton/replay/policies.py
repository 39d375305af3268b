"""The policies a replay compares, and a trace's jobs as the job specs each policy submits
(docs/scheduling-quality.md, "Policies"). Pure: plain data in, plain data out; no clock, no I/O.

A trace job of G GPUs is one gang of G members of one GPU each (a data-parallel job, one worker per GPU), with
its host's share of CPUs and memory per GPU, so that GPUs are what runs out.

- `fifo`: the plain gang, without `sla.max_runtime`, under the strict first-in, first-out placement order
  (`--placement-order fifo`: nothing behind the first waiting gang starts before it).
- `default`: the plain gang with `sla.max_runtime` (max_runtime_s), so that it may backfill as a user's job that
  declares its run time does (docs/pools.md, "Head-of-line reservation and backfill").
- `model-aware`: the same gang, placed by the cost model of its application: `placement.strategy: model-aware`
  and a `model:` naming the application's stored model (model_documents), the trace's global batch or the
  application's per-GPU batch.
- `auto`: model-aware with `instances: auto`: the daemon chooses the gang size when the job is created, within
  the trace's bounds (min_gpus..max_gpus) or, for a trace without them, auto_bounds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from peloton.domain import limits
from peloton.domain.model import ResourcePool
from peloton.domain.resources import Resources
from peloton.domain.spec import MODEL_AWARE, JobSpec, ModelRef
from peloton.errors import InvalidArgument
from peloton.modelaware.cost import RING
from peloton.modelaware.document import KIND
from peloton.replay.traces import ClusterShape, TraceJob
from peloton.replay.work import APPLICATIONS, SpeedModel, speed_of_runs, work_samples


@dataclass(frozen=True, slots=True)
class Policy:
    name: str
    max_runtime: bool  # the gang declares sla.max_runtime (and so may backfill)
    model_aware: bool  # placed by its application's cost model
    auto: bool  # gang size chosen by the daemon within bounds
    order: str  # the daemon's --placement-order (Replay(order=)): "fifo" (strict) or "backfill" (its default)


POLICIES: dict[str, Policy] = {p.name: p for p in (
    Policy("fifo", max_runtime=False, model_aware=False, auto=False, order="fifo"),
    Policy("default", max_runtime=True, model_aware=False, auto=False, order="backfill"),
    Policy("model-aware", max_runtime=True, model_aware=True, auto=False, order="backfill"),
    Policy("auto", max_runtime=True, model_aware=True, auto=True, order="backfill"),
)}

# sla.max_runtime: this much over the job's run on the slowest placement its gang could get (below)
MAX_RUNTIME_MARGIN = 1.1
COMMAND = "train"  # the sim backend runs nothing: the work model decides how long a member runs
TWO_POOLS = ("/a", "/b")


def parse_policies(values: Sequence[str]) -> list[Policy]:
    """`--policy P` given any number of times, each a name or a comma list; none: every policy. In the order
    given, each once."""
    names: list[str] = []
    for v in values:
        for name in (n.strip() for n in v.split(",")):
            if not name:
                continue
            if name not in POLICIES:
                raise InvalidArgument(f"--policy: unknown policy {name!r} (one of {', '.join(POLICIES)})",
                                      field="policy")
            if name not in names:
                names.append(name)
    return [POLICIES[n] for n in (names or list(POLICIES))]


# --- hosts and members ---------------------------------------------------------------------------------------------

def host_labels(cluster: ClusterShape) -> dict[str, str]:
    """What the daemon's planner reads of a host's hardware (docs/model-aware.md): the cluster shape's."""
    return {"gpu_model": cluster.gpu_model, "nic_gbps": f"{cluster.nic_gbps:g}", "gpu_link": cluster.gpu_link}


def member_resources(cluster: ClusterShape) -> Resources:
    """One member: one GPU and its host's share of CPUs and memory per GPU (rounded down), so a host takes as many
    members as it has GPUs."""
    cpu = math.floor(cluster.cpus_per_host / cluster.gpus_per_host / limits.MIN_CPU) * limits.MIN_CPU
    mem = float(math.floor(cluster.mem_gb_per_host * 1024 / cluster.gpus_per_host))
    return Resources(cpu=max(cpu, limits.MIN_CPU), mem=max(mem, 1.0), gpu=1)


# --- sla.max_runtime -----------------------------------------------------------------------------------------------

def even_split(gpus: int, hosts: int) -> tuple[tuple[int, int], ...]:
    """`gpus` over `hosts` hosts as evenly as they go, as runs (GPUs on a host, hosts): `extra` hosts one larger."""
    size, extra = divmod(gpus, hosts)
    return (size + 1, extra), (size, hosts - extra)


def crowded_split(gpus: int, hosts: int, per_host: int) -> tuple[tuple[int, int], ...]:
    """`gpus` (at least `hosts`, at most `hosts` x `per_host`) over `hosts` hosts as unevenly as they go, as runs:
    each host, in turn, as full as it can be while every later one keeps at least one GPU. A host is full while
    the GPUs left after it cover the later hosts, one each: the first (gpus - hosts) // (per_host - 1) are, the
    next takes what the rest leave it, the rest one each."""
    if per_host == 1:
        return ((1, hosts),)
    full = min(hosts, (gpus - hosts) // (per_host - 1))
    if full == hosts:
        return ((per_host, hosts),)
    return (per_host, full), (gpus - full * per_host - (hosts - full - 1), 1), (1, hosts - full - 1)


def slowest_speed(model: SpeedModel, gpus: int, batch_size: int | None, cluster: ClusterShape) -> float:
    """The samples/s of the slowest placement a gang of `gpus` one-GPU members can get on the cluster. On hosts
    alike, the cost model (peloton/modelaware/cost.py) charges the all-reduce by the gang's GPUs and the number of
    hosts it spans, and compute by the GPUs busy on the busiest host (contention, kappa): so for each host count,
    from the fewest hosts that hold the gang to one GPU per host (at most every host), the slowest placement is the
    even one or the most crowded one."""
    fewest = -(-gpus // cluster.gpus_per_host)
    most = min(gpus, cluster.hosts)
    if fewest > most:
        raise InvalidArgument(f"{gpus} GPUs do not fit {cluster.hosts} hosts of {cluster.gpus_per_host}",
                              field="gpus")
    return min(speed_of_runs(model, split, cluster, batch_size) for n in range(fewest, most + 1)
               for split in {even_split(gpus, n), crowded_split(gpus, n, cluster.gpus_per_host)})


def max_runtime_s(job: TraceJob, model: SpeedModel, cluster: ClusterShape, sizes: Sequence[int]) -> float:
    """MAX_RUNTIME_MARGIN x the job's whole work at the slowest placement of any gang size it may get (`sizes`),
    whole seconds, at most the spec's limit (365 days). A run never lasts longer: a preempted gang's later run has
    less work left, and the limit counts from each run's start."""
    work = work_samples(job, model, cluster)
    longest = max(work / slowest_speed(model, g, job.batch_size, cluster) for g in sizes)
    return float(min(math.ceil(MAX_RUNTIME_MARGIN * longest), limits.MAX_RUNTIME_S))


# --- instances: auto -----------------------------------------------------------------------------------------------

def auto_bounds(job: TraceJob, cluster: ClusterShape) -> tuple[int, int]:
    """The gang sizes `auto` may choose: the trace's min_gpus..max_gpus where it gives them (the missing one: the
    job's own size); otherwise half the job's size (rounded up) to twice it, at most the cluster's GPUs and a
    gang's most members (model.max_instances)."""
    if job.min_gpus is not None or job.max_gpus is not None:
        lo, hi = job.min_gpus or job.gpus, job.max_gpus or job.gpus
    else:
        lo, hi = -(-job.gpus // 2), 2 * job.gpus
    hi = min(hi, cluster.gpus, limits.MAX_GANG_SIZE)
    return min(lo, hi), hi


# --- the job spec --------------------------------------------------------------------------------------------------

def pool_path(name: str) -> str:
    """A trace's pool as a pool path: `research` is `/research`."""
    return name if name.startswith("/") else f"/{name}"


def job_spec(job: TraceJob, policy: Policy, cluster: ClusterShape, model: SpeedModel, pool: str = "/") -> JobSpec:
    """The spec `policy` submits for `job` into `pool` (module docstring)."""
    sizes = list(range(*_inclusive(auto_bounds(job, cluster)))) if policy.auto else [job.gpus]
    spec = JobSpec(name=job.name, instances=job.gpus, command=COMMAND, resources=member_resources(cluster),
                   respool=pool, priority=job.priority or 0,
                   max_runtime_s=max_runtime_s(job, model, cluster, sizes) if policy.max_runtime else 0.0)
    if not policy.model_aware:
        return spec
    if job.batch_size is not None:
        ref = ModelRef(name=job.application, global_bsz=float(job.batch_size))
    else:
        ref = ModelRef(name=job.application, local_bsz=float(APPLICATIONS[job.application].local_bsz))
    if policy.auto:  # the count stands at the fewest until the daemon chooses it
        ref = replace(ref, auto_instances=True, min_instances=sizes[0], max_instances=sizes[-1])
        spec = replace(spec, instances=sizes[0])
    return replace(spec, strategy=MODEL_AWARE, model=ref)


def _inclusive(bounds: tuple[int, int]) -> tuple[int, int]:
    return bounds[0], bounds[1] + 1


def model_documents(models: Mapping[str, SpeedModel], applications: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The stored model of each application (name -> a peloton.model/v1 document): its description and the very
    cost parameters the work model runs it at, so the daemon's planner and the replay's clock agree."""
    out: dict[str, dict[str, Any]] = {}
    for name in sorted(set(applications)):
        app, m = APPLICATIONS[name], models[name]
        out[name] = {"kind": KIND, "name": name,
                     "description": {"parameters": int(app.parameters), "flops_per_sample": app.flops_per_sample,
                                     "sync": RING, "local_bsz": app.local_bsz},
                     "params": m.params.as_dict()}
    return out


# --- pools ---------------------------------------------------------------------------------------------------------

def split_pools(paths: Sequence[str], cluster: ClusterShape) -> list[ResourcePool]:
    """Pools `paths` whose elastic reservations share the cluster out evenly (GPUs, CPUs and memory; the first
    pools one GPU more while they do not divide)."""
    n = len(paths)
    per, extra = divmod(cluster.gpus, n)
    member = member_resources(cluster)
    out = []
    for i, path in enumerate(paths):
        gpus = per + (1 if i < extra else 0)
        out.append(ResourcePool(path=path, reservation=Resources(cpu=member.cpu * gpus, mem=member.mem * gpus,
                                                                 gpu=gpus)))
    return out


def assign_pools(jobs: Sequence[TraceJob], cluster: ClusterShape, pools: Sequence[ResourcePool] | None = None,
                 source: str = "") -> tuple[list[ResourcePool], dict[str, str]]:
    """The pools of a replay and each job's pool (job name -> pool path).

    `pools` given (`--pools FILE`): those; a job whose trace names a pool goes there (it must be one of them,
    and jobs go only to pools without children); the others are dealt to the leaf pools in turn, in submission
    order. Not given: the pools the trace names, or, when it names none, two pools `/a` and `/b`; their
    reservations split the cluster evenly (split_pools), and the jobs without a pool are dealt to them in turn
    (the 1st, 3rd, 5th job submitted to `/a`, the others to `/b`). Errors name the row (of `source`)."""
    at = f"{source}: " if source else ""
    if pools is None:
        for j in jobs:  # the trace's names become flat pools: one inside another needs its parent given
            if j.pool is not None and "/" in pool_path(j.pool)[1:]:
                raise InvalidArgument(f"{at}row {j.row}, column pool: {j.pool!r} is a pool inside another: give the "
                                      "pools (--pools)", field="pool")
        named = sorted({pool_path(j.pool) for j in jobs if j.pool is not None})
        pools = split_pools(named or TWO_POOLS, cluster)
    parents = {p.parent for p in pools}
    leaves = [p.path for p in pools if p.path not in parents]
    if not leaves:
        raise InvalidArgument("pools: no pool to submit to (every pool has children)", field="pools")
    out: dict[str, str] = {}
    turn = 0
    for j in jobs:
        if j.pool is not None:
            path = pool_path(j.pool)
            if path not in leaves:
                raise InvalidArgument(f"{at}row {j.row}, column pool: {j.pool!r} is not a pool to submit to (the "
                                      f"pools: {', '.join(leaves)})", field="pool")
            out[j.name] = path
        else:
            out[j.name] = leaves[turn % len(leaves)]
            turn += 1
    return list(pools), out


def reservations(pools: Sequence[ResourcePool]) -> dict[str, int]:
    """Each leaf pool's reserved GPUs (what finish-time fairness compares with)."""
    parents = {p.parent for p in pools}
    return {p.path: p.reservation.gpu for p in pools if p.path not in parents}
