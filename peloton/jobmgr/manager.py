"""Job manager shell: the job API's logic, recovery, and the loops that apply status updates and reconcile.
Decisions come from gang_policy (pure); changes go through the writer (group commit, see writer.py); placements
are launched by the launcher pool (launcher.py); side effects are sent by SideEffects (effects.py).

Who owns what:
- the writer thread owns the cache of active jobs and is the only one to change job, gang and task records;
- reads (GetJob, ListJobs, ...) use their own read sessions and never wait for the writer;
- request threads and loops hand the writer functions and wait for the commit; none holds a lock across I/O.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TypeVar

from prometheus_client import Counter
from sqlalchemy.orm import Session, sessionmaker

from peloton.api.clients import HostManagerClient, ResourceManagerClient
from peloton.domain.allocation import GangAsk
from peloton.domain.launch import TaskStatus
from peloton.domain.model import Gang, Job, ResourcePool, Task, TaskEvent, gang_id_for, split_gang_id
from peloton.domain.placement import GangRequest, MemberRequest
from peloton.domain.pools import check_job_pool
from peloton.domain.spec import JobSpec, validate, validate_submitted, with_workers
from peloton.domain.states import GANG_ACTIVE, GangState, JobState, TaskState
from peloton.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound, PelotonError
from peloton.jobmgr import gang_policy as policy
from peloton.jobmgr.effects import Outbox, Refusal, SideEffects
from peloton.jobmgr.launcher import Launcher
from peloton.jobmgr.planning import Planner, PlanOutcome
from peloton.jobmgr.watch import JobChange, WatchHub, in_parts
from peloton.jobmgr.writer import Kind, Mutation, Views, Writers
from peloton.loop import progress
from peloton.modelaware import metrics
from peloton.modelaware import plan as plans
from peloton.modelaware.gpus import DEFAULT_TABLE, GpuTable
from peloton.observability.gang_metrics import STAGE
from peloton.placement.index import HostIndex
from peloton.placement.placer import can_ever_fit, place
from peloton.resmgr.admission import exceeds_limit_forever
from peloton.security import run_as
from peloton.security.unix_accounts import host_has_id
from peloton.store import repo
from peloton.store.db import transaction

log = logging.getLogger(__name__)
UID_ALLOCATION_TRIES = 20  # concurrent first jobs of new principals race for the lowest free uid

JOBS_CREATED = Counter("peloton_jobs_created_total", "Jobs accepted")
GANG_RESTARTS = Counter("peloton_jobmgr_gang_restarts_total", "Gangs re-queued as a new attempt")

ACTIVE = GANG_ACTIVE
STOPPING = (TaskState.KILLING, TaskState.PREEMPTING)  # a kill was sent
TRANSITIONAL = (TaskState.LAUNCHING, TaskState.LAUNCHED, TaskState.STARTING, TaskState.KILLING,
                TaskState.PREEMPTING)
RECONCILE_MIN_AGE_S = 10.0  # a member in a transitional state this long is asked about
FULL_RECONCILE_S = 600.0  # every live member is asked about this often
RETENTION_BATCH = 100  # jobs the retention loop deletes in one pass (each its own commit)
QUEUE_CHECK_S = 30.0  # QUEUED gangs resmgr does not know are re-enqueued this often
BIG_JOB_ROWS = 5_000  # a job with more rows is inserted in chunks, each its own transaction
INSERT_CHUNK = 5_000
STOP_CHUNK = 500  # gangs stopped per commit: stopping a 100,000-gang job does not hold other writes up
RPC_CHUNK = 5_000
SENT_WAIT_S = 2.0  # the queue check waits this long, at most, for the enqueues it may ask about to be sent
STOP_SEND_GRACE_S = 2.0  # a graceful stop waits this long, at most, for the side effects not yet sent
CAPACITY_TTL_S = 1.0
CAPACITY_WAIT_S = 12.0  # a create with no capacity index yet waits this long (at most) for the refresh under way
POOLS_TTL_S = 1.0  # resmgr in another process: a pool's new limit applies to creates at most this much later
DEFAULT_PAGE = 100
MAX_PAGE = 1000
DEFAULT_TASK_PAGE = 1000
MAX_TASK_PAGE = 10_000
LOG_READ_MAX = 1024 * 1024
MEASURED_MEMBERS = 8  # members of a model-aware gang whose reports `job get` reads (one RPC each)
MAX_GANGS_SHOWN = 1000  # gangs in a GetJob answer (a 100,000-instance elastic job has 100,000 gangs)
MAX_EVENTS_SHOWN = 1000  # newest events of a task in a GetTask answer
ATTEMPT_EVENTS_READ = 100  # newest events of one attempt that GetTaskLogs reads (an attempt has a handful)
MAX_PAGE_BYTES = 2 * 1024 * 1024  # a ListJobs page stops growing here (a job spec may be 1 MiB)


@dataclass(frozen=True, slots=True)
class JobRecord:
    job: Job
    gangs: list[Gang]  # GetJob: the first MAX_GANGS_SHOWN
    task_states: dict[str, int]
    gang_states: dict[str, int] = field(default_factory=dict)  # GetJob: every gang


def _token(obj: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(obj, separators=(",", ":")).encode()).decode()


def _untoken(token: str, field: str) -> object:
    try:
        return json.loads(base64.urlsafe_b64decode(token.encode()))
    except (ValueError, UnicodeError):
        raise InvalidArgument(f"{field}: not a page token of this API", field=field) from None


@dataclass(frozen=True, slots=True)
class GangPreview:
    """A gang of a dry run now: where it would go (a host per member, in the order of `instances`), or why it
    would wait for hosts; why its pool would not admit it ("": it would), and how many of the pool's waiting
    gangs are ahead of it."""

    index: int
    instances: tuple[int, ...]
    hosts: tuple[str, ...]
    waits: str
    admission_waits: str = ""
    queued_ahead: int = 0
    borrows: bool = False  # admitted beyond its pool's entitlement (AdmissionPreview.borrows)


def gang_request(jv: policy.JobView, index: int) -> GangRequest:
    """The gang as resmgr queues it: in its pool's queue by priority, then the job's submission time (a gang
    restarted or preempted keeps its place); a running one (adopted) with its hosts and start, for victim choice."""
    gv = jv.gangs[index]
    spec = jv.spec
    return GangRequest(
        gang_id=gv.gang.gang_id, job_id=jv.job.id, attempt=gv.gang.attempt,
        members=tuple(MemberRequest(t.instance, t.task_id, spec.member_resources(t.instance), t.host)
                      for t in gv.members()),
        priority=spec.priority, respool=spec.respool, strategy=spec.strategy, constraints=spec.constraints,
        enqueued_at=jv.job.created_at, preemptible=spec.preemptible, running_since=policy.running_since(gv),
        max_runtime_s=spec.max_runtime_s,
        goal=plans.goal_from_dict(json.loads(spec.model.goal_json)) if spec.model and spec.model.goal_json else None,
    )


def _random_job_id() -> str:
    return uuid.uuid4().hex[:12]


def _as_submitted(spec: JobSpec) -> JobSpec:
    """What the client sent, without what the daemon decided at create: the identity (the caller's, not the
    spec's), a model-aware job's goal, and the count `instances: auto` chose."""
    spec = replace(spec, run_as=None)
    m = spec.model
    if m is not None:
        spec = replace(spec, model=replace(m, goal_json=""))
        if m.auto_instances:
            spec = with_workers(spec, 0)
    return spec


class JobManager:
    def __init__(
        self,
        sessions: sessionmaker[Session],
        read_sessions: sessionmaker[Session],
        resmgr: ResourceManagerClient,
        hostmgr: HostManagerClient,
        clock: Callable[[], float] = time.time,
        writers: int = 1,
        gpu_table: GpuTable = DEFAULT_TABLE,
        job_ids: Callable[[], str] | None = None,
    ) -> None:
        """`writers`: shards of jobs, each committed by its own writer thread (one for SQLite). `job_ids`: makes
        a new job's id (default random, 12 hex digits; a replay numbers its jobs so that every tie broken by id,
        such as which of two gangs placed together is preempted, falls the same way on every run)."""
        self._new_job_id = job_ids or _random_job_id
        self.sessions = sessions
        self.read_sessions = read_sessions
        self.resmgr = resmgr
        self.hostmgr = hostmgr
        self.clock = clock
        self.hub = WatchHub()
        self.effects = SideEffects(resmgr, hostmgr)
        self.writer = Writers(writers, sessions, self.hub.publish, self._perform, clock)
        self.launcher = Launcher(self.writer, resmgr, hostmgr, self._resmgr_seen)
        self._after_seq = 0
        self._stream_id = ""
        self._unacked = 0  # updates committed, not yet acknowledged: the next WaitTaskEvents carries the ack
        self._full_reconcile_at = 0.0
        self._queue_check_at = 0.0
        self._resmgr_incarnation = ""
        self._check_every_gang = False  # the next queue check asks about every open gang, however recent
        self._cap_lock = threading.Lock()  # guards reads of the shared index (can_ever_fit leaves it as it was)
        self._cap_done = threading.Condition(self._cap_lock)  # a refresh ended (those with no index wait for it)
        self._cap_refreshing = False  # one capacity refresh at a time; it runs with no lock held
        self.planner = Planner(read_sessions, hostmgr, resmgr, self._capacity, gpu_table)
        self._cap: tuple[int, HostIndex | None, float] = (0, None, 0.0)  # (version, index, checked at)
        self._pool_cache: tuple[dict[str, ResourcePool], float] = ({}, 0.0)
        self._stopping: set[str] = set()  # jobs a StopJob call is stopping (the reconciler leaves them alone)
        self._stopping_lock = threading.Lock()
        self._uids: dict[str, int] = {}  # principal -> its allocated uid (never changes once stored)
        self._uids_lock = threading.Lock()

    def start(self) -> None:
        self.writer.start()
        self.effects.start()

    def stop(self) -> None:
        self.writer.stop()
        self.effects.stop(grace_s=STOP_SEND_GRACE_S)

    # --- side effects (writer thread) ---------------------------------------------------------------------
    def _perform(self, eff: policy.Effects, views: Views) -> None:
        out = Outbox(kill=list(eff.kill), preempt=list(eff.preempt), release=list(eff.release))
        enqueue, adopt = policy.to_send(views, eff)  # (not a gang a later rule of the commit ended)
        out.enqueue += [(gang_request(jv, i), False) for jv, i in enqueue]
        out.enqueue += [(gang_request(jv, i), True) for jv, i in adopt]
        if eff.restarts:
            GANG_RESTARTS.inc(eff.restarts)
        for launching, waited in eff.started:
            STAGE["launching"].observe(launching)
            STAGE["submitted_to_running"].observe(waited)
        for n in eff.notes:  # committed: the log tells what is durable
            log.log(logging.getLevelName(n.level.upper()), n.text,
                    extra={"job_id": n.job_id, **({"gang_id": n.gang_id} if n.gang_id else {})})
        self.effects.submit(out)

    # --- create -------------------------------------------------------------------------------------------
    def create_job(self, spec: JobSpec, request_id: str = "", run_as: Callable[[], str] | None = None) -> str:
        """The new job's id. With `request_id`, a repeat of a create that succeeded returns that job. `run_as`: the
        job's identity, asked for once the job is known to be valid (it may allocate the owner's uid)."""
        spec = self.planner.resolve(spec)  # a model-aware job's goal (and count, with instances: auto)
        validate(spec)
        if request_id:
            existing = self._created_for(request_id, spec)
            if existing is not None:
                return existing
        self._admit(spec)
        if run_as is not None:
            spec = replace(spec, run_as=run_as())
        job_id = self._new_job_id()
        now = self.clock()
        job, gangs, tasks = policy.new_job_records(job_id, spec, now)
        job.request_id = request_id
        jv = policy.new_job_view(job, gangs, tasks)
        events = policy.first_events(tasks, now)
        rows = 1 + len(gangs) + 2 * len(tasks)
        try:
            if rows <= BIG_JOB_ROWS:
                self.writer.run(Mutation(Kind.CREATE, view=jv, events=events, rows=rows))
            else:
                self._insert_in_chunks(jv, events)
                self.writer.run(Mutation(Kind.CREATE, view=jv, inserted=True, rows=1))
        except AlreadyExists:
            existing = self._created_for(request_id, spec) if request_id else None
            if existing is None:  # the same key, used by a concurrent create that is still being written
                raise
            return existing
        JOBS_CREATED.inc()
        log.info("job %s created: %s, %d instances in %d gangs", job_id, spec.name, spec.instances, len(gangs))
        return job_id

    def _admit(self, spec: JobSpec) -> None:
        """What a create checks of a valid spec against the pools and the cluster (raising as it refuses)."""
        pools = self._pools(spec.respool)
        check_job_pool(pools, spec.respool)
        why = exceeds_limit_forever(spec.gang_total(), spec.respool, pools)
        if why:
            f = "roles" if spec.roles else "instances"
            raise InvalidArgument(f"{f}: {why}", field=f)
        self._check_fits_cluster(spec)

    def dry_run(self, spec: JobSpec) -> list[GangPreview]:
        """`job create --dry-run`: the checks of create_job (each refusal the same), then whether the resource
        manager would admit each gang now (its pool's limits, entitlement and reservation; a what-if there) and
        where it would be placed on the hosts' free resources now, in the order placement takes them. Nothing is
        written, nothing queued."""
        spec = self.planner.resolve(spec)
        validate(spec)
        self._admit(spec)
        job, gangs, tasks = policy.new_job_records("dry-run", spec, self.clock())
        jv = policy.new_job_view(job, gangs, tasks)
        requests = [gang_request(jv, g.index) for g in gangs]
        admission = self.resmgr.preview_admission(spec.respool, [GangAsk(r.total, r.preemptible, r.priority)
                                                                 for r in requests])
        placed, failed = place(requests, self.planner.free_now())
        by_gang = {p.gang_id: p for p in placed}
        why = {f.gang_id: f.reason for f in failed}
        out = []
        for g, a in zip(gangs, admission, strict=True):
            instances = tuple(g.instances)
            p = by_gang.get(g.gang_id)
            if p is None:
                out.append(GangPreview(g.index, instances, (), why.get(g.gang_id, "no hosts free for it now"),
                                       a.reason, a.ahead, a.borrows))
            else:
                host = {m.instance: m.hostname for m in p.members}
                out.append(GangPreview(g.index, instances, tuple(host[i] for i in instances), "", a.reason, a.ahead,
                                       a.borrows))
        return out

    def _created_for(self, request_id: str, spec: JobSpec) -> str | None:
        """The job an earlier create with this key made (same spec), None if there is none; AlreadyExists when
        the key was used for another spec."""
        with transaction(self.read_sessions) as s:
            job_id = repo.job_id_for_request(s, request_id)
            if job_id is None:
                return None
            job = repo.get_job(s, job_id)
        if _as_submitted(job.spec) != _as_submitted(spec):
            raise AlreadyExists(f"request_id: {request_id!r} was already used to create job {job_id} with another "
                                "spec", field="request_id")
        log.info("job %s: a repeated create (request %s) answered with the existing job", job_id, request_id)
        return job_id

    def _insert_in_chunks(self, jv: policy.JobView, events: list[TaskEvent]) -> None:
        """A big job's rows in transactions of bounded size, so no other writer waits long for any of them. The
        job stays INITIALIZED (invisible to the scheduler) until the writer activates it; one left INITIALIZED
        by a crash is deleted at the next start."""
        gangs = [gv.gang for gv in jv.gangs.values()]
        tasks = list(jv.tasks.values())
        with transaction(self.sessions) as s:
            repo.insert_job(s, replace(jv.job, state=JobState.INITIALIZED), [], [])
        try:
            for start in range(0, len(gangs), INSERT_CHUNK):
                with transaction(self.sessions) as s:
                    repo.insert_job_rows(s, gangs[start:start + INSERT_CHUNK], [])
            for start in range(0, len(tasks), INSERT_CHUNK):
                with transaction(self.sessions) as s:
                    repo.insert_job_rows(s, [], tasks[start:start + INSERT_CHUNK])
            for start in range(0, len(events), INSERT_CHUNK):
                with transaction(self.sessions) as s:
                    repo.append_task_events(s, events[start:start + INSERT_CHUNK])
            with transaction(self.sessions) as s:
                repo.refresh_job_statistics(s)
        except BaseException:
            try:
                with transaction(self.sessions) as s:
                    repo.delete_job(s, jv.job.id)
            except Exception:  # noqa: BLE001 - the next start deletes it
                log.warning("could not remove the partial job %s; the next start does", jv.job.id)
            raise

    def task_uid(self, principal: str, uid_range: tuple[int, int]) -> int:
        """The uid allocated to `principal` (run_as.py), allocating the lowest free one of `uid_range` at its first
        job; kept for it for ever (never reused: files it left would be the next tenant's). A uid that this host's
        users or groups have is skipped. FailedPrecondition when the range is full; Unavailable, nothing allocated,
        while this host's user database cannot say whether an account has a uid (host_has_id: an LDAP or sssd
        outage would otherwise hand out an LDAP account's uid, kept for good, whose tasks the spawner then
        refuses)."""
        with self._uids_lock:
            known = self._uids.get(principal)
        if known is not None:
            return known
        for _ in range(UID_ALLOCATION_TRIES):
            with transaction(self.read_sessions) as s:
                uid = repo.get_task_uid(s, principal)
                taken = repo.task_uids_taken(s, *uid_range) if uid is None else set()
            if uid is None:
                uid = run_as.pick_uid(uid_range, taken, host_has_id)
                if uid is None:
                    raise FailedPrecondition(
                        f"task.user: no uid of --task-uid-range {uid_range[0]}-{uid_range[1]} is free for "
                        f"{principal} ({len(taken)} allocated; the others are this host's): widen the range, or map "
                        "the principal to a Unix user in the principals file", field="task.user")
                try:
                    with transaction(self.sessions) as s:
                        repo.insert_task_uid(s, principal, uid, self.clock())
                except AlreadyExists:  # another create allocated it (or this principal's) meanwhile: look again
                    continue
                log.info("principal %s: its tasks run as uid %d (allocated from --task-uid-range)", principal, uid)
            with self._uids_lock:
                self._uids[principal] = uid
            return uid
        raise FailedPrecondition(f"task.user: could not allocate a uid for {principal}: too many allocations at "
                                 "once; retry", field="task.user")

    def _pools(self, wanted: str) -> Mapping[str, ResourcePool]:
        """The pools a create judges by (every create needs them). Where resmgr runs in this process, those it
        holds, which it reads again after each pool write and when this process leads again: no read on the
        create's way. Otherwise (a split deployment, or `wanted` unknown to it: a pool being created, or none) read
        from the store at most every POOLS_TTL_S, and at once when `wanted` is not among those read."""
        held = self.resmgr.held_pools()
        if held is not None and wanted in held:
            return held
        pools, at = self._pool_cache
        if wanted not in pools or time.monotonic() - at > POOLS_TTL_S:
            with transaction(self.read_sessions) as s:
                pools = {p.path: p for p in repo.list_pools(s)}
            self._pool_cache = (pools, time.monotonic())
        return pools

    def access_list(self, pool: str) -> tuple[str, tuple[str, ...]]:
        """Who may submit to `pool`: (the pool whose list applies, the list), the nearest one up the tree with a
        non-empty list; ("", ()) when none has one (anyone with job.create). NotFound-free: an unknown pool has
        no list here (create_job refuses it, naming respool)."""
        pools = self._pools(pool)
        path: str | None = pool
        while path is not None and path in pools:
            if pools[path].submitters:
                return path, pools[path].submitters
            path = pools[path].parent
        return "", ()

    def root_allowed(self, pool: str) -> bool:
        """Whether jobs in `pool` may run tasks as root: the pool or one of its ancestors allows it."""
        pools = self._pools(pool)
        path: str | None = pool
        while path is not None and path in pools:
            if pools[path].allow_root:
                return True
            path = pools[path].parent
        return False

    def _capacity(self) -> HostIndex | None:
        """Every host's full capacity, asked of the host manager at most every CAPACITY_TTL_S and rebuilt only when
        it changed. One thread refreshes at a time, with no lock held across the call; the others meanwhile judge by
        the index they have (rebuilding 10,000 hosts takes ~0.2 s, and a herd of creates each doing it was most of
        their time), or, with none yet, wait for that refresh's answer (and refresh themselves if it failed)."""
        while True:
            version, index, checked = self._cap
            if index is not None and time.monotonic() - checked < CAPACITY_TTL_S:
                return index
            with self._cap_lock:
                if self._cap_refreshing:
                    if index is not None:
                        return index
                    self._cap_done.wait(CAPACITY_WAIT_S)
                    if self._cap[1] is not None:
                        return self._cap[1]
                    continue
                self._cap_refreshing = True
            try:
                return self._refresh_capacity()
            finally:
                with self._cap_lock:
                    self._cap_refreshing = False
                    self._cap_done.notify_all()

    def _refresh_capacity(self) -> HostIndex | None:
        version, index, checked = self._cap
        now = time.monotonic()
        if index is not None and now - checked < CAPACITY_TTL_S:
            return index  # another thread refreshed it meanwhile
        version, hosts = self.hostmgr.cluster_capacity(version)
        if hosts is not None:
            index = HostIndex(hosts)
        with self._cap_lock:
            self._cap = (version, index, now)
        return index

    def _check_fits_cluster(self, spec: JobSpec) -> None:
        index = self._capacity()
        if index is None or not len(index):
            return  # no host known yet (a cluster backend still connecting): cannot judge
        probe = GangRequest(
            gang_id="probe/0", job_id="probe", attempt=1,
            members=tuple(MemberRequest(i, f"probe-{i}-1", spec.member_resources(i)) for i in range(spec.gang_size)),
            strategy=spec.strategy, constraints=spec.constraints,
        )
        with self._cap_lock:
            failure = can_ever_fit(probe, index)
        if failure is not None:
            f = "roles" if spec.roles else "instances"
            raise InvalidArgument(f"{f}: the gang can never fit this cluster even when it is empty: {failure.reason}",
                                  field=f)

    # --- reads (own sessions; never wait for the writer) -----------------------------------------------------
    def get_job(self, job_id: str) -> JobRecord:
        with transaction(self.read_sessions) as s:
            job = repo.get_job(s, job_id)
            gangs = repo.get_gangs(s, job_id, limit=MAX_GANGS_SHOWN)
            counts = repo.task_state_counts(s, [job_id]).get(job_id, {})
            gang_states = repo.gang_state_counts(s, job_id)
        return JobRecord(job, gangs, counts, gang_states)

    def plan_job(self, spec: JobSpec, top: int) -> PlanOutcome:
        """`peloton job plan`: the best plans for a model-aware spec on the cluster as it is, nothing created."""
        validate_submitted(spec)
        return self.planner.plan(spec, top=top)

    def plan_measurements(self, job_id: str, gangs: Sequence[Gang]) -> dict[int, metrics.Measured]:
        """gang index -> what the running members of a model-aware gang report of their speed (read from the
        first MEASURED_MEMBERS GPU members' $PELOTON_METRICS_FILE through the host manager). A member that cannot
        be read counts as not reporting: `job get` must answer even when a host is slow or gone."""
        out: dict[int, metrics.Measured] = {}
        for g in gangs:
            if not g.plan or g.state != GangState.RUNNING:
                continue
            with transaction(self.read_sessions) as s:
                tasks = repo.get_tasks(s, job_id, g.instances)
            members = [t for t in tasks if t.gpu_ids and t.state == TaskState.RUNNING][:MEASURED_MEMBERS]
            reports = []
            for t in members:
                try:
                    content, _ = self.hostmgr.read_log(t.task_id, "metrics", -metrics.READ_BYTES, metrics.READ_BYTES,
                                                       timeout_s=5)
                except PelotonError:
                    continue
                rep = metrics.parse(content)
                if rep is not None:
                    reports.append(rep)
            plan = plans.choice_from_dict(json.loads(g.plan))
            m = metrics.combine(reports, sum(plan.gpus_per_host), plan.local_bsz)
            if m is not None:
                out[g.index] = m
        return out

    def list_jobs(self, states: Sequence[str], owner: str, respool: str, name_contains: str, page_size: int,
                  page_token: str, id_prefix: str = "") -> tuple[list[JobRecord], str]:
        try:
            st = [JobState(x.upper()) for x in states] or None
        except ValueError:
            raise InvalidArgument(f"states: unknown job state in {list(states)} (known: "
                                  f"{', '.join(s.value for s in JobState)})", field="states") from None
        size = min(page_size or DEFAULT_PAGE, MAX_PAGE)
        after = None
        if page_token:
            tok = _untoken(page_token, "page_token")
            if not (isinstance(tok, list) and len(tok) == 2 and isinstance(tok[0], (int, float))
                    and isinstance(tok[1], str)):
                raise InvalidArgument("page_token: not a page token of this API", field="page_token")
            after = (float(tok[0]), tok[1])
        # one snapshot for the jobs and their task counts: two commits apart, a job could show RUNNING with all
        # its tasks KILLING
        with transaction(self.read_sessions, snapshot=True) as s:
            jobs = repo.list_jobs(s, states=st, owner=owner or None, respool=respool or None,
                                  name_contains=name_contains or None, id_prefix=id_prefix or None,
                                  limit=size + 1, after=after)
            more = len(jobs) > size
            jobs = jobs[:size]
            counts = repo.task_state_counts(s, [j.id for j in jobs])
        nxt = self.page_token(jobs[-1]) if more and jobs else ""
        return [JobRecord(j, [], counts.get(j.id, {})) for j in jobs], nxt

    @staticmethod
    def page_token(last: Job) -> str:
        """The token of the ListJobs page that starts after `last`."""
        return _token([last.created_at, last.id])

    def list_tasks(self, job_id: str, page_size: int = 0, page_token: str = "") -> tuple[list[Task], str, JobSpec]:
        """A page of the job's tasks, the next page's token, and the job's spec (for the members' roles)."""
        size = min(page_size or DEFAULT_TASK_PAGE, MAX_TASK_PAGE)
        after = None
        if page_token:
            tok = _untoken(page_token, "page_token")
            if not isinstance(tok, int) or isinstance(tok, bool):
                raise InvalidArgument("page_token: not a page token of this API", field="page_token")
            after = tok
        with transaction(self.read_sessions) as s:
            spec = repo.get_job(s, job_id).spec
            tasks = repo.get_tasks(s, job_id, after=after, limit=size + 1)
        more = len(tasks) > size
        tasks = tasks[:size]
        return tasks, (_token(tasks[-1].instance) if more and tasks else ""), spec

    def get_task(self, job_id: str, instance: int) -> tuple[Task, list[TaskEvent]]:
        with transaction(self.read_sessions) as s:
            tasks = repo.get_tasks(s, job_id, [instance])
            if not tasks:
                repo.get_job(s, job_id)
                raise NotFound(f"job {job_id} has no instance {instance}")
            return tasks[0], repo.get_task_events(s, job_id, instance, newest=MAX_EVENTS_SHOWN)

    def list_task_events(self, job_id: str, instances: list[int] | None, newest: int) -> tuple[list[TaskEvent], int]:
        """The job's newest events across its members (or those named), oldest first, and how many in all;
        NotFound for an unknown job."""
        with transaction(self.read_sessions) as s:
            repo.get_job(s, job_id)
            return repo.list_task_events(s, job_id, instances, newest)

    def get_spec(self, job_id: str) -> JobSpec:
        with transaction(self.read_sessions) as s:
            return repo.get_job(s, job_id).spec

    def count_waiting(self, owner: str) -> int:
        """Jobs of `owner` not started yet (INITIALIZED or PENDING), from a read session."""
        with transaction(self.read_sessions) as s:
            return repo.count_jobs(s, owner=owner, states=[JobState.INITIALIZED, JobState.PENDING])

    def count_task_events(self, job_id: str, instance: int) -> int:
        with transaction(self.read_sessions) as s:
            return repo.count_task_events(s, job_id, instance)

    def task_log(self, job_id: str, instance: int, attempt: int, stream: str, tail: int, offset: int | None
                 ) -> tuple[str, bytes, int, str]:
        """(task id, content, offset after it, the attempt's state)."""
        if stream not in ("", "stdout", "stderr"):
            raise InvalidArgument("stream: must be stdout or stderr", field="stream")
        with transaction(self.read_sessions) as s:
            tasks = repo.get_tasks(s, job_id, [instance])
            if not tasks:
                repo.get_job(s, job_id)
                raise NotFound(f"job {job_id} has no instance {instance}")
            task = tasks[0]
            attempt = attempt or task.attempt
            if attempt > task.attempt:
                raise NotFound(f"task {job_id}-{instance} has no attempt {attempt} (attempts so far: "
                               f"{task.attempt})", field="attempt")
            # that attempt's own events, not the task's newest: an old attempt of a long history is past those
            events = repo.get_attempt_events(s, job_id, instance, attempt, newest=ATTEMPT_EVENTS_READ)
        if not any(e.state in (TaskState.LAUNCHING, TaskState.RUNNING) for e in events):
            raise FailedPrecondition(f"attempt {attempt} of task {job_id}-{instance} was never launched; no logs")
        state = task.state.value if attempt == task.attempt else events[-1].state.value
        task_id = policy.task_id_for(job_id, instance, attempt)
        start, size = (-tail, tail) if offset is None else (offset, LOG_READ_MAX)
        content, nxt = self.hostmgr.read_log(task_id, stream or "stdout", start, size)
        return task_id, content, nxt, state

    def snapshot(self, job_ids: Sequence[str], tasks: bool) -> list[JobChange]:
        """The current state of these jobs (and their tasks), for a watch that starts or cannot resume."""
        out = []
        with transaction(self.read_sessions) as s:
            jobs = repo.get_jobs(s, job_ids)
            for jid in job_ids:
                job = jobs.get(jid)
                if job is None:
                    out.append(JobChange(jid, "", "", "", deleted=True))
                    continue
                out.append(JobChange.of(job, repo.get_tasks(s, jid) if tasks else ()))
        return out

    # --- stop, delete ---------------------------------------------------------------------------------------
    def stop_job(self, job_id: str) -> bool:
        """Stop every gang of the job. False when it had already finished (nothing to do). The first commit makes
        KILLED the job's desired state and stops its first STOP_CHUNK gangs; each further commit stops the next
        STOP_CHUNK, so other requests get their turn in between. If this is cut short (the store went away), the
        reconciler finishes it, as recovery does after a crash."""
        def check(views: Views) -> None:
            if job_id not in views:
                raise NotFound(f"job {job_id!r} not found", field="id")

        seen: list[tuple[bool, int]] = []

        def apply(views: Views, now: float) -> policy.Effects:
            jv = views[job_id]
            seen.append((jv.job.state.terminal, max(jv.gangs, default=-1) + 1))
            return policy.stop_job(jv, now, range(STOP_CHUNK))

        with self._stopping_lock:
            self._stopping.add(job_id)
        try:
            self.writer.mutate([job_id], apply, check)
            was_terminal, end = seen[0]
            if not was_terminal:
                self._stop_gangs(job_id, STOP_CHUNK, end)
        finally:
            with self._stopping_lock:
                self._stopping.discard(job_id)
        return not was_terminal

    def _stop_gangs(self, job_id: str, start: int, end: int) -> None:
        """Stop the gangs with an index in [start, end) of a job whose desired state is KILLED, STOP_CHUNK a commit."""
        for lo in range(start, end, STOP_CHUNK):
            def apply(views: Views, now: float, gangs: range = range(lo, min(lo + STOP_CHUNK, end))) -> policy.Effects:
                jv = views.get(job_id)
                if jv is None or jv.job.desired != "KILLED":
                    return policy.Effects()  # deleted meanwhile (it had finished)
                return policy.stop_job(jv, now, gangs)

            self.writer.mutate([job_id], apply)

    def delete_job(self, job_id: str) -> None:
        def check(views: Views) -> None:
            jv = views.get(job_id)
            if jv is None:
                raise NotFound(f"job {job_id!r} not found", field="id")
            if not jv.job.state.terminal:
                raise FailedPrecondition(f"job {job_id} is {jv.job.state.value}; stop it before deleting it")

        self.writer.run(Mutation(Kind.DELETE, [job_id], check=check))
        self._remove_sandboxes([job_id])

    def purge_finished(self, before: float, limit: int = RETENTION_BATCH) -> int:
        """Delete up to `limit` jobs that ended before `before` (oldest first), each in its own short commit, and
        their sandboxes: the retention loop's work. How many went."""
        with transaction(self.read_sessions) as s:
            ids = repo.finished_before(s, before, limit)
        gone = []
        for job_id in ids:
            try:
                self.delete_job(job_id)
            except (NotFound, FailedPrecondition):
                continue  # deleted meanwhile, or (never) running again
            finally:
                progress()  # a pass of up to RETENTION_BATCH jobs moves job by job: the retention loop is not stuck
            gone.append(job_id)
        if gone:
            log.info("retention: deleted %d jobs that ended before %s", len(gone),
                     time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(before)))
        return len(ids)

    def _remove_sandboxes(self, job_ids: list[str]) -> None:
        try:
            self.hostmgr.remove_sandboxes(job_ids)
        except PelotonError as e:  # the records are gone; the files are left (they cost only disk)
            log.warning("removing the sandboxes of %d deleted jobs: %s", len(job_ids), e.message)

    # --- status updates ---------------------------------------------------------------------------------------
    def apply_statuses(self, statuses: Sequence[TaskStatus]) -> None:
        by_job: dict[str, list[TaskStatus]] = {}
        for st in statuses:
            try:
                jid, _, _ = policy.parse_task_id(st.task_id)
            except ValueError:
                log.warning("status for a task id that is not ours: %s", st.task_id)
                continue
            by_job.setdefault(jid, []).append(st)
        if not by_job:
            return

        def statuses_of(part: Mapping[str, list[TaskStatus]]) -> Callable[[Views, float], policy.Effects]:
            def apply(views: Views, now: float) -> policy.Effects:
                eff = policy.Effects()
                for jid, sts in part.items():
                    jv = views.get(jid)
                    if jv is None:  # job deleted: nothing of it may run
                        eff.kill += [st.task_id for st in sts if st.state == TaskState.RUNNING]
                        continue
                    for st in sts:
                        eff.merge(policy.apply_status(jv, st, now))
                return eff

            return apply

        self.writer.mutate_by_job(by_job, statuses_of)  # by shard: a job missing from a shard's views is deleted

    def events_once(self, timeout_ms: int = 1000) -> bool:
        # the ack of the last batch rides on this poll (a call that fails keeps it for the next: acks repeat safely)
        r = self.hostmgr.wait_events(self._after_seq, 2000, timeout_ms / 1000, self._unacked, self._stream_id)
        self._unacked = 0
        if r.stream_id != self._stream_id:
            if self._stream_id:
                log.warning("host manager restarted: reconciling every live task")
                self._full_reconcile_at = 0.0
            self._stream_id = r.stream_id
            if self._after_seq and not r.events:
                self._after_seq = 0
                return True
        if r.gap:
            log.error("status updates were lost (too many unacknowledged): reconciling every live task")
            self._full_reconcile_at = 0.0
        if not r.events:
            return False
        self.apply_statuses([st for _, st in r.events])
        self._after_seq = r.events[-1][0]
        # only now, with the updates committed, may the backend acknowledge them upstream: with the next poll,
        # which follows at once (the loop runs again without pausing after a pass that did something)
        self._unacked = self._after_seq
        return True

    # --- recovery -----------------------------------------------------------------------------------------------
    def recover(self) -> None:
        """At start (and when the daemon becomes the store's owner again): forget what is cached, load every
        job with an open gang, kill tasks no job claims, ask the backend about every live member, then adopt
        whole gangs, tear down partial ones and re-queue the queued."""
        with transaction(self.sessions) as s:
            for j in repo.list_jobs(s, states=[JobState.INITIALIZED], limit=1_000_000):
                log.warning("deleting job %s: its creation was interrupted", j.id)
                repo.delete_job(s, j.id)
        with transaction(self.read_sessions) as s:
            job_ids = sorted({g.job_id for g in repo.gangs_in_states(s, [st for st in GangState
                                                                        if st != GangState.DONE])})
        self.writer.clear()
        live: list[str] = [tid for part in self.writer.read_each(
            lambda views: [t.task_id for jv in views.values() for gv in jv.gangs.values() if gv.gang.state in ACTIVE
                           for t in gv.members() if not t.state.terminal], job_ids) for tid in part]
        running = self._list_running()
        strays = sorted(set(running) - set(live))
        if strays:
            log.warning("killing %d tasks no job claims: %s", len(strays), ", ".join(strays[:10]))
            for i in range(0, len(strays), RPC_CHUNK):
                self.hostmgr.kill(strays[i:i + RPC_CHUNK])
                progress()  # (recovery after regaining the lock runs in the store loop's pass)
        statuses = self._reconcile(live)

        def apply(views: Views, now: float) -> policy.Effects:
            eff = policy.Effects()
            for jv in views.values():
                eff.merge(policy.recover(jv, statuses, now))
            return eff

        if job_ids:
            self.writer.mutate(job_ids, apply)
        self._full_reconcile_at = self.clock() + FULL_RECONCILE_S
        log.info("recovery: %d jobs with open gangs, %d live tasks reconciled, %d strays killed", len(job_ids),
                 len(live), len(strays))

    def _refuse_watch_if_not_acting(self) -> None:
        refusal = self.writer.refusal()
        if refusal is not None:
            raise refusal

    def stop_acting(self, why: str, leader: str = "") -> None:
        """The daemon does not hold the store lock (or another one took over): every change is refused with
        Unavailable(why), and every open watch ends so, its client moving to the daemon that acts."""
        self.writer.pause(why, leader)
        self.hub.wake_all()

    def act_again(self) -> None:
        """The lock is held again: changes are taken again, each on its jobs as the store has them now (the cache,
        which lacks whatever another daemon did meanwhile, is dropped before any is taken: a status or a stop that
        came before `recover` ran would otherwise be applied to a view from before and written over the other
        daemon's rows), and the watches' history is not resumed from (a stream that comes back gets a snapshot);
        `recover` reads the rest back."""
        self.writer.resume(clear=True)
        self.hub.forget()

    def _list_running(self) -> list[str]:
        return _every_page(self.hostmgr.running_tasks)

    def _check_gangs(self, gangs: Sequence[tuple[str, int]],
                     check: Callable[[policy.JobView, policy.GangView, float], policy.Effects]) -> None:
        """Apply a time rule (launch deadline, max runtime) to the gangs the scan found past it; the rule checks
        again inside the mutation, where the gang may have moved on."""
        if not gangs:
            return

        def apply(vs: Views, t: float) -> policy.Effects:
            eff = policy.Effects()
            for jid, idx in gangs:
                if jid in vs:
                    eff.merge(check(vs[jid], vs[jid].gangs[idx], t))
            return eff

        self.writer.mutate({j for j, _ in gangs}, apply)

    def _reconcile(self, task_ids: Sequence[str]) -> dict[str, TaskStatus]:
        out: dict[str, TaskStatus] = {}
        for i in range(0, len(task_ids), RPC_CHUNK):
            out.update({st.task_id: st for st in self.hostmgr.reconcile(task_ids[i:i + RPC_CHUNK])})
            progress()  # recovery and a full reconciliation ask about every live member, chunk by chunk
        return out

    # --- loop: reconciliation, launch deadlines, the queue check ------------------------------------------------
    def _evict_from_drained_hosts(self, now: float) -> None:
        """Gangs still on a host whose drain deadline has passed are preempted whole (they go back to their queue
        and lose no attempt). The drains are the host manager's."""
        drains = self.hostmgr.drains()
        due = frozenset(h for h, deadline in drains.items() if deadline and deadline <= now)
        if not due:
            return
        found: list[tuple[str, int]] = []
        for part in self.writer.read_each(lambda views: [
                (jv.job.id, gv.gang.index) for jv in views.values() for gv in jv.gangs.values()
                if policy.on_hosts(gv, due)]):
            found += part
        if found:
            log.info("host drain: preempting %d gangs still on %s", len(found), ", ".join(sorted(due)))
        self._check_gangs(found, lambda jv, gv, t: policy.evict_from_hosts(jv, gv, due, t))

    def _resmgr_seen(self, incarnation: str) -> None:
        """resmgr started afresh (a restart of its process, or its standby took over): it knows none of our gangs
        until they are enqueued and registered again, which the next queue check does (at once, for every gang)."""
        if not incarnation or incarnation == self._resmgr_incarnation:
            return
        if self._resmgr_incarnation:
            log.warning("the resource manager started afresh: queueing and registering every open gang again")
            self._check_every_gang = True
            self._queue_check_at = 0.0
        self._resmgr_incarnation = incarnation

    def next_deadline(self) -> float | None:
        """When the reconciler next has a deadline to act on (a gang's launch deadline, a running gang's
        sla.max_runtime: reconcile_once fails the gang from then on); None when no gang has one. A replay steps its
        virtual clock to it, so that what the daemon's loop enforces happens at the same virtual instant."""

        def scan(views: Views) -> float | None:
            due: float | None = None
            for jv in views.values():
                limit = jv.spec.max_runtime_s
                for gv in jv.gangs.values():
                    g = gv.gang
                    at: float | None = None
                    if g.state in (GangState.PLACED, GangState.LAUNCHING) and g.launch_deadline:
                        at = g.launch_deadline
                    elif limit and g.state == GangState.RUNNING and policy.running_since(gv) > 0:
                        at = policy.running_since(gv) + limit
                    if at is not None and (due is None or at < due):
                        due = at
            return due

        found = [t for t in self.writer.read_each(scan) if t is not None]
        return min(found) if found else None

    def _fail_refused(self) -> None:
        """The gangs whose enqueue (or adoption) resmgr refused for good (effects.py): their jobs fail, saying why.
        (Lost with a refused commit, such a gang is unknown to resmgr and the queue check queues it again: refused
        again, it is reported again.)"""
        refused = self.effects.take_refused()
        if not refused:
            return
        by_job: dict[str, list[Refusal]] = {}
        for r in refused:
            by_job.setdefault(split_gang_id(r.gang_id)[0], []).append(r)

        def refused_of(part: Mapping[str, list[Refusal]]) -> Callable[[Views, float], policy.Effects]:
            def apply(views: Views, now: float) -> policy.Effects:
                eff = policy.Effects()
                for jid, rs in part.items():
                    jv = views.get(jid)
                    if jv is None:  # deleted meanwhile
                        continue
                    for r in rs:
                        gv = jv.gangs.get(split_gang_id(r.gang_id)[1])
                        if gv is not None:
                            eff.merge(policy.refused_by_resmgr(jv, gv, r.attempt, now, r.message))
                return eff

            return apply

        self.writer.mutate_by_job(by_job, refused_of)

    def reconcile_once(self) -> bool:
        self._fail_refused()  # (first: the scan below would otherwise find them unknown to resmgr and queue them again)
        now = self.clock()
        # a due time further off than its period means the clock was set back: due now, not once it catches up
        full = now >= self._full_reconcile_at or self._full_reconcile_at - now > FULL_RECONCILE_S
        queue_check = now >= self._queue_check_at or self._queue_check_at - now > QUEUE_CHECK_S
        every_gang = queue_check and self._check_every_gang
        if every_gang:
            self._check_every_gang = False
        min_age = 0.0 if every_gang else QUEUE_CHECK_S

        with self._stopping_lock:
            stopping = set(self._stopping)

        def scan(views: Views) -> tuple[list[tuple[Task, tuple[str, int]]], list[tuple[str, int]],
                                        list[tuple[str, int]], dict[str, int], list[tuple[str, int]], dict[str, float]]:
            stale: list[tuple[Task, tuple[str, int]]] = []  # (member, its gang attempt)
            late, held, overdue = [], [], []
            unstopped: dict[str, int] = {}  # job -> gang index end
            graces: dict[str, float] = {}  # a stale PREEMPTING member -> its job's grace (a repeat keeps it)
            for jv in views.values():
                if jv.job.id not in stopping and policy.needs_stopping(jv):
                    unstopped[jv.job.id] = max(jv.gangs, default=-1) + 1
                for gv in jv.gangs.values():
                    g = gv.gang
                    if queue_check and (g.state.waiting or g.state in ACTIVE) and now - g.updated_at >= min_age:
                        held.append((g.gang_id, g.attempt))
                    if g.state in ACTIVE:
                        for t in gv.members():
                            if t.state.terminal:
                                continue
                            if full or (t.state in TRANSITIONAL and now - t.updated_at > RECONCILE_MIN_AGE_S):
                                stale.append((t, (g.gang_id, g.attempt)))
                                if t.state == TaskState.PREEMPTING:
                                    graces[t.task_id] = jv.spec.preemption_grace_s
                        if g.state in (GangState.PLACED, GangState.LAUNCHING) and g.launch_deadline \
                                and now >= g.launch_deadline:
                            late.append((jv.job.id, g.index))
                        limit = jv.spec.max_runtime_s
                        if limit and g.state == GangState.RUNNING and 0 < policy.running_since(gv) <= now - limit:
                            overdue.append((jv.job.id, g.index))
            return [(replace(t), k) for t, k in stale], late, held, unstopped, overdue, graces

        stale: list[Task] = []
        late, held, unstopped, overdue, graces = [], [], {}, [], {}
        parts = self.writer.read_each(scan)  # every shard's cache, each on its writer thread
        sent_mark = self.effects.mark()  # every enqueue of a gang the scan saw was submitted by now
        # read after the states: a gang the scan found LAUNCHING whose launch call has not returned yet is left out
        # (its backend may not know its members yet: "unknown" would fail a gang about to start)
        launching = self.launcher.launching()
        for part in parts:
            stale += [t for t, k in part[0] if k not in launching]
            late += part[1]
            held += part[2]
            unstopped.update(part[3])
            overdue += part[4]
            graces.update(part[5])
        for jid, end in unstopped.items():
            log.warning("job %s: finishing a stop that was cut short", jid)
            self._stop_gangs(jid, 0, end)
            progress()
        if full:
            self._full_reconcile_at = now + FULL_RECONCILE_S
        if queue_check:
            self._queue_check_at = now + QUEUE_CHECK_S
        self._check_gangs(late, policy.check_launch_deadline)
        self._check_gangs(overdue, policy.check_max_runtime)
        self._evict_from_drained_hosts(now)
        if queue_check:
            # asked only once the side effects the scan's commits submitted were sent: a gang created a moment ago is
            # not lost while its enqueue is on its way, nor one that ended a moment ago held in vain
            if self.effects.wait_sent(sent_mark, SENT_WAIT_S):
                self._requeue_unknown(held)
                self._release_held_in_vain()
            else:  # they are still on their way (resmgr unreachable): the next pass
                self._queue_check_at = now
                self._check_every_gang = every_gang
        if not stale:
            return False
        statuses = self._reconcile([t.task_id for t in stale])
        by_id = {t.task_id: t for t in stale}
        drift = [st for tid, st in statuses.items()
                 if tid in by_id and st.state != by_id[tid].state
                 and not (st.state == TaskState.RUNNING and by_id[tid].state in STOPPING)]
        again = [tid for tid, st in statuses.items()
                 if st.state == TaskState.RUNNING and tid in by_id and by_id[tid].state in STOPPING]
        if again:  # a kill that did not take (or was lost): ask again
            # a preemption's with its grace: the Mesos backend repeats a KILL with the grace of the last one asked
            by_grace: dict[float | None, list[str]] = {}
            for tid in again:
                by_grace.setdefault(graces.get(tid), []).append(tid)
            for grace, ids in by_grace.items():
                self.hostmgr.kill(ids, grace)
        if drift:
            log.warning("reconciliation found %d tasks whose state drifted", len(drift))
            self.apply_statuses(drift)
        return False

    def _requeue_unknown(self, keys: list[tuple[str, int]]) -> None:
        """Gangs resmgr should hold (queued: in its queue; launching or running: their allocation) and does not
        (an enqueue was lost, or resmgr restarted on its own): queue them again, or register their allocation
        again, as recovery would."""
        unknown: list[tuple[str, int]] = []
        for i in range(0, len(keys), RPC_CHUNK):
            unknown += self.resmgr.unknown_gangs(keys[i:i + RPC_CHUNK])
            progress()
        if not unknown:
            return

        def apply(views: Views, now: float) -> policy.Effects:
            eff = policy.Effects()
            for gid, attempt in unknown:
                jid, _, idx = gid.rpartition("/")
                jv = views.get(jid)
                gv = jv.gangs.get(int(idx)) if jv is not None else None
                if gv is None or gv.gang.attempt != attempt:
                    continue  # moved on since the scan
                if gv.gang.state.waiting and jv is not None and jv.job.desired == "RUNNING":
                    eff.enqueue.append((jid, gv.gang.index))
                elif gv.gang.state in ACTIVE:
                    eff.adopt.append((jid, gv.gang.index))
            if eff.enqueue or eff.adopt:
                log.warning("the resource manager did not know %d queued and %d running gangs (lost enqueues, or "
                            "it restarted): queued again / allocations registered again: %s", len(eff.enqueue),
                            len(eff.adopt), ", ".join(f"{j}/{i}" for j, i in (eff.enqueue + eff.adopt)[:10]))
            return eff

        self.writer.mutate({g.rpartition("/")[0] for g, _ in unknown}, apply)

    def _release_held_in_vain(self) -> None:
        """The reverse of `_requeue_unknown`: gangs resmgr holds (queued, or their allocation counted) that are over
        in the store (DONE, on a later attempt, their job deleted) for QUEUE_CHECK_S: their release was lost with
        a job manager that died before sending it (resmgr, in a process of its own, lived on). Released again, or
        their pool's share stays counted for ever."""
        held = _every_page(self.resmgr.held_gangs)
        if not held:
            return

        def live(views: Views) -> set[tuple[str, int]]:  # (most are: decided on the caches, no store read)
            out = set()
            for gid, attempt in held:
                jv = views.get(gid.rpartition("/")[0])
                gv = jv.gangs.get(int(gid.rpartition("/")[2])) if jv is not None else None
                if gv is not None and gv.gang.attempt == attempt and gv.gang.state != GangState.DONE:
                    out.add((gid, attempt))
            return out

        fine = set().union(*self.writer.read_each(live))
        suspects: dict[str, list[tuple[str, int]]] = {}  # job id -> its gangs resmgr holds, not live as held
        for k in held:
            if k not in fine:
                suspects.setdefault(k[0].rpartition("/")[0], []).append(k)
        if not suspects:
            return

        def held_of(part: Mapping[str, list[tuple[str, int]]]) -> Callable[[Views, float], policy.Effects]:
            def apply(views: Views, t: float) -> policy.Effects:  # (a job of `part` not in views is not in the store)
                eff = policy.Effects()
                for jid, keys in part.items():
                    eff.release += [(gid, attempt) for gid, attempt in keys
                                    if policy.holds_in_vain(views.get(jid), gid, attempt, t, QUEUE_CHECK_S)]
                if eff.release:
                    log.warning("the resource manager held %d gangs that are over (their release was lost): "
                                "released now: %s", len(eff.release),
                                ", ".join(f"{g} attempt {a}" for g, a in eff.release[:10]))
                return eff

            return apply

        self.writer.mutate_by_job(suspects, held_of)

    def watch(self, job_ids: Sequence[str], tasks: bool, stream_id: str, after: int,
              alive: Callable[[], bool], heartbeat_s: float = 5.0
              ) -> Iterator[tuple[list[JobChange], int, bool, bool, bool]]:
        """(changes, revision, snapshot?, resync?, more?) for a WatchJobs stream, until `alive()` is false. A
        revision too large for one message comes in several, each but the last with `more`. Unavailable (naming the
        daemon that acts, when known) while this one does not act: it sees none of the changes then, so its
        watchers are sent to the one that does (`stop_acting` ends the open streams so)."""
        ids = list(dict.fromkeys(job_ids))

        def messages(changes: list[JobChange], rev: int, snapshot: bool = False, resync: bool = False
                     ) -> Iterator[tuple[list[JobChange], int, bool, bool, bool]]:
            parts = in_parts(changes)
            for i, part in enumerate(parts):
                yield part, rev, snapshot, resync, i < len(parts) - 1

        self._refuse_watch_if_not_acting()
        if not self.hub.can_resume(stream_id, after) or not stream_id:
            rev = self.hub.revision
            if ids:
                yield from messages(self.snapshot(ids, tasks), rev, snapshot=True)
            else:
                yield from messages([], rev, resync=bool(stream_id))
            after = rev
        wanted = set(ids)
        while alive() and not self.hub.closed:
            changes, rev, lost = self.hub.wait(after, heartbeat_s, wanted, tasks)
            self._refuse_watch_if_not_acting()
            if lost:
                if ids:
                    rev = self.hub.revision
                    yield from messages(self.snapshot(ids, tasks), rev, snapshot=True)
                else:
                    yield from messages([], rev, resync=True)
            else:
                yield from messages(changes, rev)
            after = rev


T = TypeVar("T")


def _every_page(fetch: Callable[[str], tuple[list[T], str]]) -> list[T]:
    """Every item of a paged listing (`fetch(token)` -> (page, next token; "" after the last)), saying progress
    after each page (a long listing in a loop's pass is not a stuck loop)."""
    out: list[T] = []
    token = ""
    while True:
        page, token = fetch(token)
        out += page
        progress()
        if not token:
            return out


__all__ = ["JobManager", "JobRecord", "gang_id_for", "gang_request"]
