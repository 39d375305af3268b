"""gRPC servicers of the job manager: the public JobService and TaskService. Thin: convert, call, convert."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator

import grpc
from prometheus_client import Gauge

from peloton.api import caller, convert, request_checks
from peloton.api.request_checks import job_id as _job_id
from peloton.api.status import grpc_errors, grpc_stream_errors
from peloton.api.v1 import job_pb2, job_pb2_grpc, task_pb2, task_pb2_grpc
from peloton.domain import principal, task_identity
from peloton.domain.spec import ignored_settings, validate_submitted
from peloton.errors import InvalidArgument, PermissionDenied, ResourceExhausted, Unavailable
from peloton.jobmgr.manager import MAX_EVENTS_SHOWN, MAX_PAGE_BYTES, JobManager
from peloton.jobmgr.watch import WATCHERS, JobChange
from peloton.security import identity, run_as

DEFAULT_LOG_TAIL = 1024 * 1024
MAX_LOG_TAIL = 1024 * 1024
MAX_PLANS = 100  # PlanJob's top
MAX_WATCHERS = 256  # open WatchJobs streams; each holds a server thread
MAX_WATCH_JOBS = 1000
REDACTED = "<redacted>"  # an environment value the caller may not see

OPEN_WATCHES = Gauge("peloton_jobmgr_watch_limit", "Most WatchJobs streams served at once")


def _change_to_proto(c: JobChange) -> job_pb2.JobChange:
    p = job_pb2.JobChange(job_id=c.job_id, state=c.state, desired_state=c.desired, reason=c.reason, deleted=c.deleted)
    for t in c.tasks:
        pt = p.tasks.add(instance=t.instance, task_id=t.task_id, attempt=t.attempt, state=t.state, host=t.host,
                         reason=t.reason, message=t.message)
        if t.exit_code is not None:
            pt.exit_code = t.exit_code
    return p


def _shown(job: job_pb2.Job) -> job_pb2.Job:
    """The job as the caller may see it: the environment's values only for its owner and for principals with
    job.secrets.any; others see the names, each value replaced by REDACTED."""
    who = caller.current()
    envs = [job.spec.task.env, *(r.task.env for r in job.spec.roles)]
    if not any(envs) or who.may_see_secrets(job.spec.owner):
        return job
    for env in envs:
        for name in list(env):  # not while iterating the map itself
            env[name] = REDACTED
    return job


class JobServicer(job_pb2_grpc.JobServiceServicer):
    def __init__(self, jm: JobManager, max_watchers: int = MAX_WATCHERS, max_waiting_jobs: int = 0,
                 backend: str = "", identities: run_as.Policy = run_as.Policy(run_as.Mode.OFF),
                 principals: identity.Principals | None = None) -> None:
        """`max_waiting_jobs`: jobs one authenticated principal may have waiting (not started); 0: no limit.
        `backend`: the cluster backend the host manager of this process runs (`local`, `sim`, `mesos`), for the
        warnings of CreateJob about settings it ignores; "" when this process does not run it (no warnings).
        `identities`: how a job's Unix identity is chosen (run_as.py); `principals`: the principals file, for the
        identity of a job an admin creates for another owner."""
        self.jm = jm
        self.identities = identities
        self.principals = principals
        self.max_waiting_jobs = max_waiting_jobs
        self.backend = backend
        self._watchers = threading.BoundedSemaphore(max_watchers)
        OPEN_WATCHES.set(max_watchers)

    @grpc_errors
    def CreateJob(self, request: job_pb2.CreateJobRequest, context: grpc.ServicerContext) -> job_pb2.CreateJobResponse:
        if not request.HasField("spec"):
            raise InvalidArgument("spec: required", field="spec")
        request_checks.spec_size(request.spec)
        request_id = request_checks.request_id(request.request_id)
        spec = convert.spec_from_proto(request.spec)
        validate_submitted(spec)  # bad input is named before any permission is judged
        who = caller.current()
        if who is not principal.OPEN:  # the owner is the caller (an admin may create a job for someone else)
            if spec.owner and spec.owner != who.name and "admin" not in who.roles:
                raise PermissionDenied(f"owner: {who.name} may not create a job owned by {spec.owner!r} (only an "
                                       "admin may; leave owner out, it is the caller)", field="owner")
            spec = dataclasses.replace(spec, owner=spec.owner or who.name)
            if not who.can(principal.JOB_CONTROL_ANY):  # operators and admins are never refused by a pool
                where, allowed = self.jm.access_list(spec.respool)
                if allowed and who.name not in allowed:
                    raise PermissionDenied(
                        f"respool: {who.name} may not submit to {spec.respool}: the access list of {where} allows "
                        f"{', '.join(allowed[:10])}{' ...' if len(allowed) > 10 else ''}", field="respool")
            if self.max_waiting_jobs and self.jm.count_waiting(spec.owner) >= self.max_waiting_jobs:
                raise ResourceExhausted(
                    f"jobs: {spec.owner} has {self.max_waiting_jobs} jobs waiting to start, the most one principal "
                    "may (--max-waiting-jobs); wait for some to start, or stop some", field="jobs",
                    retry_after_s=5.0)
        decided = self._run_as(who, spec.owner, spec.user)
        if spec.user == "root" and not self.jm.root_allowed(spec.respool):
            raise PermissionDenied(f"task.user: pool {spec.respool} does not allow tasks to run as root (an admin "
                                   "may allow it: peloton pool create --allow-root)", field="task.user")
        if request.dry_run:  # every check above, its admission and placements now; nothing written (no uid)
            resp = job_pb2.CreateJobResponse(warnings=ignored_settings(spec, self.backend))
            for g in self.jm.dry_run(spec):
                resp.dry_run.add(index=g.index, instances=g.instances, hosts=g.hosts, waits=g.waits,
                                 admission_waits=g.admission_waits, queued_ahead=g.queued_ahead,
                                 borrows=g.borrows)
            return resp
        if isinstance(decided, run_as.Allocate):  # once the job is known to be valid: a refused one writes nothing
            uid_range, name = self.identities.uid_range, decided.principal
            job_id = self.jm.create_job(spec, request_id,
                                        run_as=lambda: task_identity.dynamic(self.jm.task_uid(name, uid_range)))
        else:
            job_id = self.jm.create_job(dataclasses.replace(spec, run_as=decided), request_id)
        return job_pb2.CreateJobResponse(job_id=job_id, warnings=ignored_settings(spec, self.backend))

    def _run_as(self, who: principal.Principal, owner: str, requested: str) -> str | run_as.Allocate:
        """The job's Unix identity (run_as.py): the caller's, or, for a job an admin creates for another owner,
        the owner's (its tasks are the owner's, and run as the owner's own uid). PermissionDenied for a
        task.user the caller may not name."""
        subject, socket_default = who, who.via == "unix socket"
        if who is not principal.OPEN and owner and owner != who.name:
            entry = self.principals.entry_of(owner) if self.principals is not None else identity.Entry(frozenset(),
                                                                                                       ())
            subject, socket_default = principal.Principal(owner, entry.roles, "owner", entry.users, entry.user), False
        if requested:  # what the caller may name (an admin: anything)
            return str(run_as.resolve(self.identities, who, requested))
        return run_as.resolve(self.identities, subject, "", unix_socket_default=socket_default)

    @grpc_errors
    def GetJob(self, request: job_pb2.GetJobRequest, context: grpc.ServicerContext) -> job_pb2.GetJobResponse:
        r = self.jm.get_job(_job_id(request.job_id))
        job = _shown(convert.job_to_proto(r.job, r.gangs, r.task_states, r.gang_states))
        measured = self.jm.plan_measurements(r.job.id, r.gangs)
        for gs in job.status.gangs:
            m = measured.get(gs.index)
            if m is not None:
                gs.plan.measured_step_time, gs.plan.measured_samples_per_s = m.step_time, m.samples_per_s
                gs.plan.measured_members = m.members
        return job_pb2.GetJobResponse(job=job)

    @grpc_errors
    def PlanJob(self, request: job_pb2.PlanJobRequest, context: grpc.ServicerContext) -> job_pb2.PlanJobResponse:
        if not request.HasField("spec"):
            raise InvalidArgument("spec: required", field="spec")
        request_checks.spec_size(request.spec)
        if not 0 <= request.top <= MAX_PLANS:
            raise InvalidArgument(f"top: must be 0..{MAX_PLANS} (0: 5), got {request.top}", field="top")
        out = self.jm.plan_job(convert.spec_from_proto(request.spec), request.top or 5)
        resp = job_pb2.PlanJobResponse(on_free_hosts=out.on_free_hosts,
                                       instances=out.plans[0].gpus if out.plans else 0)
        for p in out.plans:
            convert.search_plan_to_proto(p, resp.plans.add())
        return resp

    @grpc_errors
    def ListJobs(self, request: job_pb2.ListJobsRequest, context: grpc.ServicerContext) -> job_pb2.ListJobsResponse:
        request_checks.list_jobs(request.states, request.owner, request.respool, request.name_contains,
                                 request.limit, request.id_prefix)
        request_checks.page(request.page_size, request.page_token)
        rows, nxt = self.jm.list_jobs(list(request.states), request.owner, request.respool, request.name_contains,
                                      request.page_size or request.limit, request.page_token, request.id_prefix)
        out = job_pb2.ListJobsResponse()
        size = 0
        for i, r in enumerate(rows):
            job = _shown(convert.job_to_proto(r.job, r.gangs, r.task_states))
            size += job.ByteSize()
            if i and size > MAX_PAGE_BYTES:  # large specs: the page ends here, the next starts with this job
                nxt = self.jm.page_token(rows[i - 1].job)
                break
            out.jobs.append(job)
        out.next_page_token = nxt
        return out

    @grpc_errors
    def StopJob(self, request: job_pb2.StopJobRequest, context: grpc.ServicerContext) -> job_pb2.StopJobResponse:
        job_id = _job_id(request.job_id)
        self._may_control(job_id, "stop")
        self.jm.stop_job(job_id)
        return job_pb2.StopJobResponse()

    @grpc_errors
    def DeleteJob(self, request: job_pb2.DeleteJobRequest, context: grpc.ServicerContext) -> job_pb2.DeleteJobResponse:
        job_id = _job_id(request.job_id)
        self._may_control(job_id, "delete")
        self.jm.delete_job(job_id)
        return job_pb2.DeleteJobResponse()

    def _may_control(self, job_id: str, what: str) -> None:
        who = caller.current()
        if who.can(principal.JOB_CONTROL_ANY):
            return
        owner = self.jm.get_job(job_id).job.spec.owner
        if not who.may_control(owner):
            raise PermissionDenied(f"{who.name} may not {what} job {job_id}, owned by {owner or 'nobody'}: that needs "
                                   f"the permission {principal.JOB_CONTROL_ANY} (role operator or admin)")

    @grpc_stream_errors
    def WatchJobs(self, request: job_pb2.WatchJobsRequest, context: grpc.ServicerContext
                  ) -> Iterator[job_pb2.WatchJobsResponse]:
        if len(request.job_ids) > MAX_WATCH_JOBS:
            raise InvalidArgument(f"job_ids: at most {MAX_WATCH_JOBS} jobs per watch", field="job_ids")
        for i, j in enumerate(request.job_ids):
            _job_id(j, f"job_ids[{i}]")
        request_checks.text_field(request.stream_id, "stream_id", 64)
        if request.after_revision < 0:
            raise InvalidArgument("after_revision: must not be negative", field="after_revision")
        if not self._watchers.acquire(blocking=False):
            raise Unavailable("too many open watches; retry later")
        WATCHERS.inc()
        try:
            for changes, rev, snapshot, resync, more in self.jm.watch(list(request.job_ids), request.tasks,
                                                                     request.stream_id, request.after_revision,
                                                                     context.is_active):
                # a part of a revision (`more`) carries no stream id: a watcher resumes only after a whole one
                yield job_pb2.WatchJobsResponse(stream_id="" if more else self.jm.hub.stream_id, revision=rev,
                                                snapshot=snapshot, resync=resync, more=more,
                                                changes=[_change_to_proto(c) for c in changes])
        finally:
            WATCHERS.dec()
            self._watchers.release()


MAX_EVENT_INSTANCES = 10_000  # members named in one ListTaskEvents
MAX_EVENTS_LISTED = 10_000  # events in one ListTaskEvents answer (and at most MAX_PAGE_BYTES of them)


def newest_within(events: list[task_pb2.TaskEvent], budget: int) -> list[task_pb2.TaskEvent]:
    """The newest of `events` (oldest first) whose encoding fits `budget` bytes: an answer stays under a client's
    default 4 MiB limit whatever the reasons and messages (free text) hold; the oldest are left out, as those
    beyond the request's limit are."""
    size, first = sum(e.ByteSize() + 4 for e in events), 0  # + a repeated field's tag and length, at most
    while size > budget and first < len(events):
        size -= events[first].ByteSize() + 4
        first += 1
    return events[first:]


class TaskServicer(task_pb2_grpc.TaskServiceServicer):
    def __init__(self, jm: JobManager) -> None:
        self.jm = jm

    @grpc_errors
    def ListTasks(self, request: task_pb2.ListTasksRequest, context: grpc.ServicerContext) -> task_pb2.ListTasksResponse:
        request_checks.page(request.page_size, request.page_token)
        tasks, nxt, spec = self.jm.list_tasks(_job_id(request.job_id), request.page_size, request.page_token)
        return task_pb2.ListTasksResponse(tasks=[convert.task_to_proto(t, spec=spec) for t in tasks],
                                          next_page_token=nxt)

    @grpc_errors
    def GetTask(self, request: task_pb2.GetTaskRequest, context: grpc.ServicerContext) -> task_pb2.GetTaskResponse:
        job_id, instance = _job_id(request.job_id), request_checks.instance(request.instance)
        task, events = self.jm.get_task(job_id, instance)
        p = convert.task_to_proto(task, events, self.jm.get_spec(job_id))
        p.events_total = len(events) if len(events) < MAX_EVENTS_SHOWN else self.jm.count_task_events(job_id, instance)
        return task_pb2.GetTaskResponse(task=p)

    @grpc_errors
    def ListTaskEvents(self, request: task_pb2.ListTaskEventsRequest, context: grpc.ServicerContext
                       ) -> task_pb2.ListTaskEventsResponse:
        job_id = _job_id(request.job_id)
        if len(request.instances) > MAX_EVENT_INSTANCES:
            raise InvalidArgument(f"instances: at most {MAX_EVENT_INSTANCES}, got {len(request.instances)}",
                                  field="instances")
        for i, n in enumerate(request.instances):
            request_checks.instance(n, f"instances[{i}]")
        if not 0 <= request.limit <= MAX_EVENTS_LISTED:
            raise InvalidArgument(f"limit: must be 0..{MAX_EVENTS_LISTED}, got {request.limit}", field="limit")
        events, total = self.jm.list_task_events(job_id, list(request.instances) or None,
                                                 request.limit or MAX_EVENTS_SHOWN)
        out = newest_within([convert.task_event_to_proto(e) for e in events], MAX_PAGE_BYTES)
        return task_pb2.ListTaskEventsResponse(events=out, total=total)

    @grpc_errors
    def GetTaskLogs(self, request: task_pb2.GetTaskLogsRequest, context: grpc.ServicerContext) -> task_pb2.GetTaskLogsResponse:
        if not 0 <= request.tail_bytes <= MAX_LOG_TAIL:
            # an answer must fit a client's default 4 MiB message: more is read in pages, with `offset`
            raise InvalidArgument(f"tail_bytes: must be 0..{MAX_LOG_TAIL} (read more with offset), got "
                                  f"{request.tail_bytes}", field="tail_bytes")
        offset = request.offset if request.HasField("offset") else None
        if offset is not None and offset < 0:
            raise InvalidArgument("offset: must not be negative", field="offset")
        who = caller.current()
        if not who.can(principal.JOB_SECRETS_ANY):
            owner = self.jm.get_job(_job_id(request.job_id)).job.spec.owner
            if not who.may_see_secrets(owner):
                raise PermissionDenied(f"{who.name} may not read the logs of job {request.job_id}, owned by {owner}: "
                                       f"that needs the permission {principal.JOB_SECRETS_ANY} (role operator or "
                                       "admin)")
        task_id, content, nxt, state = self.jm.task_log(
            _job_id(request.job_id), request_checks.instance(request.instance), request_checks.attempt(request.attempt),
            request.stream, request.tail_bytes or DEFAULT_LOG_TAIL, offset)
        return task_pb2.GetTaskLogsResponse(task_id=task_id, content=content, next_offset=nxt, task_state=state)
