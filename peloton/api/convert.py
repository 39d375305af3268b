"""Protobuf <-> domain conversion. Protobuf stops here: nothing past this module sees a message."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from fractions import Fraction
from typing import TYPE_CHECKING

from google.protobuf import duration_pb2

from peloton.api.clients import Probe, Victim
from peloton.api.v1 import host_pb2, internal_pb2, job_pb2, model_pb2, respool_pb2, task_pb2
from peloton.domain import checks, task_identity
from peloton.domain.allocation import GangAsk
from peloton.domain.checks import duration_seconds
from peloton.domain.launch import GangLaunch, HostInfo, LaunchOutcome, LaunchResult, LaunchSpec, TaskStatus
from peloton.domain.limits import PROTO_DURATION_MAX_NANOS, PROTO_DURATION_MAX_SECONDS
from peloton.domain.model import Gang, Job, ResourcePool, StoredModel, Task, TaskEvent
from peloton.domain.placement import (
    GangPlacement,
    GangRequest,
    HostOffer,
    MemberAssignment,
    MemberRequest,
    PlacementFailure,
)
from peloton.domain.resources import Resources, format_mib, parse_mib
from peloton.domain.spec import (
    DEFAULT_LAUNCH_TIMEOUT_S,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_PREEMPTION_GRACE_S,
    Constraint,
    JobSpec,
    ModelRef,
    Role,
)
from peloton.domain.states import TaskState
from peloton.errors import InvalidArgument
from peloton.modelaware import hostlabels
from peloton.modelaware import plan as plans

if TYPE_CHECKING:
    from peloton.domain.allocation import Holding, PoolUsage


# --- public resources ---------------------------------------------------------------------------------------
def resources_from_proto(r: job_pb2.Resources, field: str) -> Resources:
    """Quantities parsed, and every number finite; the limits are the validator's (spec.validate, validate_pool)."""
    if not math.isfinite(r.cpu):
        raise InvalidArgument(f"{field}.cpu: must be a finite number, got {r.cpu}", field=f"{field}.cpu")
    return Resources(
        cpu=r.cpu,
        mem=parse_mib(r.mem, f"{field}.mem"),
        disk=parse_mib(r.disk, f"{field}.disk"),
        gpu=r.gpu,
        ports=r.ports,
    )


def resources_to_proto(r: Resources) -> job_pb2.Resources:
    """Every quantity written, none as "" (no disk is `0Mi`): what the daemon holds, as `-o json` shows it."""
    return job_pb2.Resources(cpu=r.cpu, mem=format_mib(r.mem), disk=format_mib(r.disk), gpu=r.gpu, ports=r.ports)


# --- job spec -----------------------------------------------------------------------------------------------
def _roles_from_proto(p: job_pb2.JobSpec) -> tuple[tuple[Role, ...], str]:
    """The roles, and the user they all run as (a job has one identity, decided at CreateJob)."""
    if p.HasField("task"):
        raise InvalidArgument("roles: give either roles or instances and task, not both", field="roles")
    roles = []
    for i, r in enumerate(p.roles):
        f = f"roles[{i}].task"
        if r.task.user != p.roles[0].task.user:
            first = checks.show(p.roles[0].task.user) if p.roles[0].task.user else "none"
            raise InvalidArgument(f"{f}.user: every role must run as the same user (a job has one identity); "
                                  f"roles[0] gives {first}", field=f"{f}.user")
        roles.append(Role(name=r.name, instances=r.instances, command=r.task.command, env=dict(r.task.env),
                          env_files=dict(r.task.env_files), resources=resources_from_proto(r.task.resources,
                                                                                           f"{f}.resources"),
                          container_image=r.task.container.image))
    return tuple(roles), p.roles[0].task.user


def spec_from_proto(p: job_pb2.JobSpec) -> JobSpec:
    """Field-by-field; quantities are parsed here so errors name the field. Call spec.validate() after."""
    roles, user = _roles_from_proto(p) if p.roles else ((), p.task.user)
    return JobSpec(
        name=p.name,
        owner=p.owner,
        respool=p.respool or "/",
        # with roles their sum: `instances` may be absent, or the same sum (a job's spec as `-o json` shows it)
        instances=p.instances or sum(r.instances for r in roles),
        command=p.task.command,
        env=dict(p.task.env),
        env_files=dict(p.task.env_files),
        resources=resources_from_proto(p.task.resources, "task.resources"),
        container_image=p.task.container.image,
        user=user,
        roles=roles,
        min_available=p.gang.min_available,
        on_member_failure=p.gang.on_member_failure or "restart_gang",
        launch_timeout_s=(
            _seconds(p.gang.launch_timeout, "gang.launch_timeout")
            if p.gang.HasField("launch_timeout")
            else DEFAULT_LAUNCH_TIMEOUT_S
        ),
        priority=p.sla.priority,
        preemptible=p.sla.preemptible if p.sla.HasField("preemptible") else True,
        max_runtime_s=_seconds(p.sla.max_runtime, "sla.max_runtime") if p.sla.HasField("max_runtime") else 0.0,
        preemption_grace_s=(_seconds(p.sla.preemption_grace, "sla.preemption_grace")
                            if p.sla.HasField("preemption_grace") else DEFAULT_PREEMPTION_GRACE_S),
        max_attempts=p.retry.max_attempts if p.HasField("retry") and p.retry.max_attempts else DEFAULT_MAX_ATTEMPTS,
        strategy=p.placement.strategy or "pack",
        constraints=tuple(Constraint(c.attribute, c.op or "eq", c.value) for c in p.placement.constraints),
        model=_model_ref(p.model) if p.HasField("model") else None,
    )


def _model_ref(m: job_pb2.ModelSpec) -> ModelRef:
    return ModelRef(name=m.name, local_bsz=m.local_bsz, global_bsz=m.global_bsz, objective=m.objective or "throughput",
                    auto_instances=m.auto_instances, min_instances=m.min_instances or 1,
                    max_instances=m.max_instances,
                    min_efficiency=m.min_efficiency if m.HasField("min_efficiency") else None)


def _seconds(d: duration_pb2.Duration, field: str) -> float:
    """Checked before any conversion (ToTimedelta overflows, and drops nanoseconds)."""
    return duration_seconds(d.seconds, d.nanos, field)


_MAX_NANOS = PROTO_DURATION_MAX_SECONDS * 1_000_000_000 + PROTO_DURATION_MAX_NANOS


def _nanos(seconds: float) -> int:
    """The nearest nanosecond, so that _seconds gives back the same float; clamped to the Duration range (a spec
    stored before the limits existed may be out of it)."""
    if not math.isfinite(seconds):
        return _MAX_NANOS if seconds > 0 else 0
    return max(-_MAX_NANOS, min(_MAX_NANOS, round(Fraction(seconds) * 1_000_000_000)))


def _task_to_proto(t: job_pb2.TaskSpec, command: str, env: dict[str, str], env_files: dict[str, str],
                   resources: Resources, container_image: str, user: str) -> None:
    t.command = command
    t.env.update(env)
    t.env_files.update(env_files)
    t.resources.CopyFrom(resources_to_proto(resources))
    t.container.SetInParent()  # present even without an image: each section of the spec is there
    t.container.image = container_image
    t.user = user


def spec_to_proto(s: JobSpec) -> job_pb2.JobSpec:
    """With roles, no task (each role has its own) and `instances` their sum."""
    p = job_pb2.JobSpec(name=s.name, owner=s.owner, respool=s.respool, instances=s.instances)
    if s.roles:
        for r in s.roles:
            rp = p.roles.add(name=r.name, instances=r.instances)
            _task_to_proto(rp.task, r.command, r.env, r.env_files, r.resources, r.container_image, s.user)
    else:
        _task_to_proto(p.task, s.command, s.env, s.env_files, s.resources, s.container_image, s.user)
    # The effective values, as the daemon acts on them: the gang size (0 in a spec means every instance), and the
    # defaults above and below filled in. Only a max_runtime that is not set (no limit) stays absent.
    p.gang.min_available = s.gang_size
    p.gang.on_member_failure = s.on_member_failure
    p.gang.launch_timeout.FromNanoseconds(_nanos(s.launch_timeout_s))
    p.sla.priority = s.priority
    p.sla.preemptible = s.preemptible
    if s.max_runtime_s:
        p.sla.max_runtime.FromNanoseconds(_nanos(s.max_runtime_s))
    p.sla.preemption_grace.FromNanoseconds(_nanos(s.preemption_grace_s))
    p.retry.max_attempts = s.max_attempts
    p.placement.strategy = s.strategy
    for c in s.constraints:
        p.placement.constraints.add(attribute=c.attribute, op=c.op, value=c.value)
    if s.model is not None:
        m = s.model
        p.model.name, p.model.local_bsz, p.model.global_bsz = m.name, m.local_bsz, m.global_bsz
        p.model.objective, p.model.auto_instances = m.objective, m.auto_instances
        p.model.min_instances, p.model.max_instances = m.min_instances, m.max_instances
        if m.min_efficiency is not None:
            p.model.min_efficiency = m.min_efficiency
    return p


def job_to_proto(job: Job, gangs: Sequence[Gang], task_states: dict[str, int],
                 gang_states: dict[str, int] | None = None) -> job_pb2.Job:
    """`gangs`: those to list (GetJob: the first ones); `gang_states`: the count of every gang by state."""
    status = job_pb2.JobStatus(
        state=job.state.value,
        desired_state=job.desired,
        reason=job.reason,
        created_at=job.created_at,
        updated_at=job.updated_at,
        completed_at=job.completed_at,
        run_as=task_identity.describe(job.spec.run_as) if job.spec.run_as is not None else job.spec.user,
    )
    status.task_states.update(task_states)
    if gang_states is not None:
        status.gang_states.update(gang_states)
        status.gang_count = sum(gang_states.values())
    for g in gangs:
        gs = status.gangs.add(index=g.index, instances=g.instances, state=g.state.value,
                              attempt=g.attempt - g.preemptions, reason=g.reason, preemptions=g.preemptions,
                              run=g.attempt)
        if g.plan:
            plan_to_proto(plans.choice_from_dict(json.loads(g.plan)), gs.plan)
    return job_pb2.Job(id=job.id, spec=spec_to_proto(job.spec), status=status)


def plan_to_proto(c: plans.PlanChoice, out: job_pb2.PlanInfo) -> None:
    out.gpus_per_host.extend(c.gpus_per_host)
    out.step_time, out.samples_per_s, out.local_bsz = c.step_time, c.samples_per_s, c.local_bsz
    for gph, step, sps in c.alternatives:
        out.alternatives.add(gpus_per_host=gph, step_time=step, samples_per_s=sps)
    for h in c.hosts:
        out.hosts.append(h.name)
        out.hardware.add(gpu_model=h.gpu_model, nic_gbps=h.nic_gbps, gpu_link=h.gpu_link)


def search_plan_to_proto(p: plans.Plan, out: job_pb2.PlanInfo) -> None:
    """A plan of `peloton job plan`: its hosts, and what the cost model predicts of it."""
    out.gpus_per_host.extend(p.gpus_per_host)
    out.hosts.extend(name for name, _ in p.hosts)
    out.servers.extend(p.servers)
    out.step_time, out.samples_per_s = p.prediction.step_time, p.samples_per_s
    out.local_bsz = p.prediction.local_bsz


def task_to_proto(t: Task, events: Sequence[TaskEvent] = (), spec: JobSpec | None = None) -> task_pb2.TaskInfo:
    """`spec`: its job's, for the member's role (a job with roles)."""
    p = task_pb2.TaskInfo(
        job_id=t.job_id,
        instance=t.instance,
        task_id=t.task_id,
        attempt=t.attempt,
        gang_index=t.gang_index,
        state=t.state.value,
        host=t.host,
        address=t.address,
        ports=t.ports,
        gpus=t.gpu_ids,
        reason=t.reason,
        message=t.message,
        started_at=t.started_at,
        finished_at=t.finished_at,
    )
    if t.exit_code is not None:
        p.exit_code = t.exit_code
    if spec is not None and spec.roles and t.instance < spec.instances:
        role, p.role_rank = spec.role_at(t.instance)
        p.role = role.name
    p.events.extend(task_event_to_proto(e) for e in events)
    return p


def task_event_to_proto(e: TaskEvent) -> task_pb2.TaskEvent:
    pe = task_pb2.TaskEvent(attempt=e.attempt, state=e.state.value, time=e.time, host=e.host, reason=e.reason,
                            message=e.message, instance=e.instance)
    if e.exit_code is not None:
        pe.exit_code = e.exit_code
    return pe


def pool_from_proto(p: respool_pb2.ResourcePool) -> ResourcePool:
    return ResourcePool(
        path=p.path,
        reservation=resources_from_proto(p.reservation, "pool.reservation"),
        limit=resources_from_proto(p.limit, "pool.limit") if p.HasField("limit") else None,
        share=p.share or 1.0,
        submitters=tuple(p.submitters),
        allow_root=p.allow_root,
        reservation_type=p.reservation_type or "elastic",
    )


def pool_to_proto(p: ResourcePool, usage: PoolUsage | None = None) -> respool_pb2.ResourcePool:
    out = respool_pb2.ResourcePool(path=p.path, reservation=resources_to_proto(p.reservation), share=p.share,
                                   submitters=list(p.submitters), allow_root=p.allow_root,
                                   reservation_type=p.reservation_type)
    if p.limit is not None:
        out.limit.CopyFrom(resources_to_proto(p.limit))
    if usage is not None:
        out.allocated.CopyFrom(resources_to_proto(usage.allocated))
        out.demand.CopyFrom(resources_to_proto(usage.demand))
        out.queued_gangs = usage.queued
        if usage.entitlement is not None:
            e = usage.entitlement
            out.entitlement.CopyFrom(respool_pb2.Entitlement(cpu=e.cpu, mem_mib=e.mem, disk_mib=e.disk, gpu=e.gpu))
    return out


def host_to_proto(h: HostInfo, offer_held: bool, drain_deadline: float | None = None,
                  health: str = "", maintenance: bool = False) -> host_pb2.Host:
    """`drain_deadline`: None when the host is in service, else its drain's deadline (0: none); `health`: why it is
    skipped for now ("": it is not); `maintenance`: drained by the cluster manager's maintenance window."""
    p = host_pb2.Host(
        hostname=h.hostname,
        address=h.address,
        capacity=resources_to_proto(h.capacity),
        allocated=resources_to_proto(h.allocated),
        state=h.state,
        offer_held=offer_held,
        task_ids=list(h.task_ids),
        drain="" if drain_deadline is None else ("draining" if h.task_ids else "drained"),
        drain_deadline=drain_deadline or 0.0,
        health=health,
        maintenance=maintenance,
    )
    p.labels.update(h.labels)
    hw, invalid = hostlabels.hardware_lenient(h.labels, has_gpus=h.capacity.gpu > 0)
    p.hardware.CopyFrom(host_pb2.HostHardware(gpu_model=hw.gpu_model, nic_gbps=hw.nic_gbps, gpu_link=hw.gpu_link,
                                              defaulted=list(hw.defaulted), invalid=invalid))
    return p


def stored_model_to_proto(m: StoredModel) -> model_pb2.Model:
    return model_pb2.Model(name=m.name, owner=m.owner, version=m.version, created_at=m.created_at,
                           updated_at=m.updated_at, document_json=m.document)


# --- internal: resource vectors, gangs, placements, offers, launches, statuses ---------------------------------
def vec_to_proto(r: Resources) -> internal_pb2.ResourceVector:
    return internal_pb2.ResourceVector(cpu=r.cpu, mem_mib=r.mem, disk_mib=r.disk, gpu=r.gpu, ports=r.ports)


def vec_from_proto(v: internal_pb2.ResourceVector) -> Resources:
    return Resources(cpu=v.cpu, mem=v.mem_mib, disk=v.disk_mib, gpu=v.gpu, ports=v.ports)


def gang_ask_to_proto(g: GangAsk) -> internal_pb2.GangAsk:
    return internal_pb2.GangAsk(total=vec_to_proto(g.total), preemptible=g.preemptible, priority=g.priority)


def gang_ask_from_proto(g: internal_pb2.GangAsk) -> GangAsk:
    return GangAsk(vec_from_proto(g.total), g.preemptible, g.priority)


def gang_request_to_proto(g: GangRequest) -> internal_pb2.GangRequest:
    return internal_pb2.GangRequest(
        gang_id=g.gang_id,
        job_id=g.job_id,
        attempt=g.attempt,
        members=[
            internal_pb2.Member(instance=m.instance, task_id=m.task_id, resources=vec_to_proto(m.resources),
                                hostname=m.hostname)
            for m in g.members
        ],
        priority=g.priority,
        respool=g.respool,
        strategy=g.strategy,
        constraints=[internal_pb2.InternalConstraint(attribute=c.attribute, op=c.op, value=c.value)
                     for c in g.constraints],
        enqueued_at=g.enqueued_at,
        preemptible=g.preemptible,
        running_since=g.running_since,
        max_runtime_s=g.max_runtime_s,
        goal_json=json.dumps(plans.goal_to_dict(g.goal)) if g.goal is not None else "",
    )


def gang_request_from_proto(p: internal_pb2.GangRequest) -> GangRequest:
    return GangRequest(
        gang_id=p.gang_id,
        job_id=p.job_id,
        attempt=p.attempt,
        members=tuple(MemberRequest(m.instance, m.task_id, vec_from_proto(m.resources), m.hostname)
                      for m in p.members),
        priority=p.priority,
        respool=p.respool,
        strategy=p.strategy,
        constraints=tuple(Constraint(c.attribute, c.op, c.value) for c in p.constraints),
        enqueued_at=p.enqueued_at,
        preemptible=p.preemptible,
        running_since=p.running_since,
        max_runtime_s=p.max_runtime_s,
        goal=plans.goal_from_dict(json.loads(p.goal_json)) if p.goal_json else None,
    )


def placement_to_proto(p: GangPlacement) -> internal_pb2.Placement:
    return internal_pb2.Placement(
        gang_id=p.gang_id,
        job_id=p.job_id,
        attempt=p.attempt,
        members=[
            internal_pb2.Assignment(
                instance=m.instance,
                task_id=m.task_id,
                hostname=m.hostname,
                address=m.address,
                resources=vec_to_proto(m.resources),
                gpu_ids=m.gpu_ids,
                ports=m.ports,
            )
            for m in p.members
        ],
        plan_json=json.dumps(plans.choice_to_dict(p.plan)) if p.plan is not None else "",
    )


def placement_from_proto(p: internal_pb2.Placement) -> GangPlacement:
    return GangPlacement(
        gang_id=p.gang_id,
        job_id=p.job_id,
        attempt=p.attempt,
        members=tuple(
            MemberAssignment(
                instance=m.instance,
                task_id=m.task_id,
                hostname=m.hostname,
                address=m.address,
                resources=vec_from_proto(m.resources),
                gpu_ids=tuple(m.gpu_ids),
                ports=tuple(m.ports),
            )
            for m in p.members
        ),
        plan=plans.choice_from_dict(json.loads(p.plan_json)) if p.plan_json else None,
    )


def failure_to_proto(f: PlacementFailure, stale: bool = False) -> internal_pb2.Failure:
    out = internal_pb2.Failure(gang_id=f.gang_id, job_id=f.job_id, attempt=f.attempt, reason=f.reason, stale=stale)
    out.short_hosts.update(f.short_hosts)
    return out


def failure_from_proto(p: internal_pb2.Failure) -> PlacementFailure:
    return PlacementFailure(p.gang_id, p.job_id, p.attempt, p.reason, dict(p.short_hosts))


def gang_launch_to_proto(g: GangLaunch, shared: bool = False) -> internal_pb2.GangLaunch:
    """`shared`: what every member has the same (the job, command, resources, user; the env entries and files: the
    hostfile, the training variables common to all) once for the gang, each member with only the rest (`members`);
    else each member whole (`tasks`), what a host manager of an earlier release reads."""
    if not shared:
        return internal_pb2.GangLaunch(gang_id=g.gang_id, attempt=g.attempt, tasks=[launch_to_proto(t) for t in g.tasks])
    ts = g.tasks
    same = {f: getattr(ts[0], f) for f in _SHAREABLE if ts and all(getattr(t, f) == getattr(ts[0], f) for t in ts)}
    env, files = _common(t.env for t in ts), _common(t.files for t in ts)
    p = internal_pb2.GangLaunch(gang_id=g.gang_id, attempt=g.attempt)
    for t in ts:
        m = p.members.add(task_id=t.task_id, instance=t.instance, attempt=t.attempt, hostname=t.hostname,
                          gpu_ids=t.gpu_ids, ports=t.ports,
                          **{f: getattr(t, f) for f in _SHAREABLE if f not in same and f != "resources"})
        if "resources" not in same:
            m.resources.CopyFrom(vec_to_proto(t.resources))
        m.env.update(_own(t.env, env))
        m.files.update(_own(t.files, files))
    s = p.shared
    for f, v in same.items():
        if f == "resources":
            s.resources.CopyFrom(vec_to_proto(v))
        else:
            setattr(s, f, v)
    s.env.update(env)
    s.files.update(files)
    return p


# the LaunchSpec fields the shared form sends once when every member has the same (each empty where not: a member's
# empty value then reads as the shared one, which is empty too)
_SHAREABLE = ("job_id", "command", "resources", "container_image", "user", "legacy_user")


def _common(maps: Iterable[dict[str, str]]) -> dict[str, str]:
    """The entries every map has, with the same value."""
    it = iter(maps)
    first = next(it, {})
    out = dict(first)
    for m in it:
        if not out:
            break
        if m is not first:  # (members often share the very dict: the launcher's files)
            out = {k: v for k, v in out.items() if m.get(k) == v}
    return out


def _own(m: dict[str, str], common: dict[str, str]) -> dict[str, str]:
    """`m`'s entries that `common` does not give (so `{**common, **own}` is `m` again)."""
    return m if not common else {k: v for k, v in m.items() if k not in common}


def _str_map(m: Mapping[str, str]) -> dict[str, str]:
    """A protobuf map as a dict: an empty one without building its views, a comprehension (a quarter faster than
    dict(m), which goes through the Mapping mixins' keys view on upb's maps)."""
    return {k: m[k] for k in m} if m else {}


def gang_launch_from_proto(p: internal_pb2.GangLaunch) -> GangLaunch:
    if not p.members:
        return GangLaunch(p.gang_id, p.attempt, tuple(launch_from_proto(t) for t in p.tasks))
    s = p.shared  # read once a gang, not once a member
    job_id, command, image, user, legacy = s.job_id, s.command, s.container_image, s.user, s.legacy_user
    res = vec_from_proto(s.resources) if s.HasField("resources") else None
    env, files = _str_map(s.env), _str_map(s.files)
    out = []
    for m in p.members:
        own_env, own_files = _str_map(m.env), _str_map(m.files)
        out.append(LaunchSpec(
            task_id=m.task_id, job_id=m.job_id or job_id, instance=m.instance, attempt=m.attempt, hostname=m.hostname,
            command=m.command or command,
            # members with no entries of their own share the gang's dict (nothing changes a LaunchSpec's maps: the
            # in-process launcher shares its files dict too)
            env={**env, **own_env} if own_env else env,
            resources=res if res is not None else vec_from_proto(m.resources),
            gpu_ids=tuple(m.gpu_ids), ports=tuple(m.ports),
            files={**files, **own_files} if own_files else files,
            container_image=m.container_image or image, user=m.user or user, legacy_user=m.legacy_user or legacy))
    return GangLaunch(p.gang_id, p.attempt, tuple(out))


def launch_result_to_proto(r: LaunchResult) -> internal_pb2.LaunchResult:
    return internal_pb2.LaunchResult(gang_id=r.gang_id, attempt=r.attempt, outcome=r.outcome.value,
                                     task_id=r.task_id, message=r.message, permanent=r.permanent)


def launch_result_from_proto(p: internal_pb2.LaunchResult) -> LaunchResult:
    return LaunchResult(p.gang_id, p.attempt, LaunchOutcome(p.outcome), p.task_id, p.message, p.permanent)


def offer_to_proto(o: HostOffer) -> internal_pb2.HostOffer:
    p = internal_pb2.HostOffer(
        hostname=o.hostname,
        address=o.address,
        free=vec_to_proto(o.free),
        gpu_ids=o.gpu_ids,
        ports=o.ports,
        capacity=vec_to_proto(o.capacity),
        has_gpus=o.has_gpus,
    )
    p.labels.update(o.labels)
    return p


def offer_from_proto(p: internal_pb2.HostOffer) -> HostOffer:
    return HostOffer(
        hostname=p.hostname,
        address=p.address,
        free=vec_from_proto(p.free),
        gpu_ids=tuple(p.gpu_ids),
        ports=tuple(p.ports),
        labels=dict(p.labels),
        capacity=vec_from_proto(p.capacity),
        has_gpus=p.has_gpus,
    )


def launch_to_proto(t: LaunchSpec) -> internal_pb2.LaunchTask:
    p = internal_pb2.LaunchTask(
        task_id=t.task_id,
        job_id=t.job_id,
        instance=t.instance,
        attempt=t.attempt,
        hostname=t.hostname,
        command=t.command,
        resources=vec_to_proto(t.resources),
        gpu_ids=t.gpu_ids,
        ports=t.ports,
        container_image=t.container_image,
        user=t.user,
        legacy_user=t.legacy_user,
    )
    p.env.update(t.env)
    p.files.update(t.files)
    return p


def launch_from_proto(p: internal_pb2.LaunchTask) -> LaunchSpec:
    return LaunchSpec(
        task_id=p.task_id,
        job_id=p.job_id,
        instance=p.instance,
        attempt=p.attempt,
        hostname=p.hostname,
        command=p.command,
        env=_str_map(p.env),
        resources=vec_from_proto(p.resources),
        gpu_ids=tuple(p.gpu_ids),
        ports=tuple(p.ports),
        files=_str_map(p.files),
        container_image=p.container_image,
        user=p.user,
        legacy_user=p.legacy_user,
    )


def status_to_proto(s: TaskStatus, seq: int = 0) -> internal_pb2.TaskStatusEvent:
    p = internal_pb2.TaskStatusEvent(
        seq=seq,
        task_id=s.task_id,
        state=s.state.value,
        time=s.time,
        hostname=s.hostname,
        reason=s.reason,
        message=s.message,
        permanent=s.permanent,
    )
    if s.exit_code is not None:
        p.exit_code = s.exit_code
    return p


def status_from_proto(p: internal_pb2.TaskStatusEvent) -> TaskStatus:
    return TaskStatus(
        task_id=p.task_id,
        state=TaskState(p.state),
        time=p.time,
        hostname=p.hostname,
        exit_code=p.exit_code if p.HasField("exit_code") else None,
        reason=p.reason,
        message=p.message,
        permanent=p.permanent,
    )


def probe_to_proto(gang: GangRequest, candidates: Sequence[tuple[str, Holding]], need: Resources,
                   ending: Sequence[tuple[str, Holding]] = ()) -> internal_pb2.PreemptionProbe:
    return internal_pb2.PreemptionProbe(
        gang=gang_request_to_proto(gang), need=vec_to_proto(need),
        candidates=[_victim_to_proto(gid, h) for gid, h in candidates],
        ending=[_victim_to_proto(gid, h) for gid, h in ending])


def _victim_to_proto(gid: str, h: Holding) -> internal_pb2.Victim:
    return internal_pb2.Victim(gang_id=gid, attempt=h.attempt, ends_at=h.ends_at or 0.0, members=[
        internal_pb2.Assignment(hostname=host, resources=vec_to_proto(r)) for host, r in h.usage])



def probe_from_proto(p: internal_pb2.PreemptionProbe) -> Probe:
    return Probe(gang=gang_request_from_proto(p.gang), need=vec_from_proto(p.need),
                 candidates=tuple(_victim_from_proto(v) for v in p.candidates),
                 ending=tuple(_victim_from_proto(v) for v in p.ending))


def _victim_from_proto(v: internal_pb2.Victim) -> Victim:
    return Victim(v.gang_id, v.attempt, tuple((m.hostname, vec_from_proto(m.resources)) for m in v.members),
                  v.ends_at)
