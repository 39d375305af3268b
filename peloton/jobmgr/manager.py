"""Job manager shell: the job API's logic, recovery, and the loops that launch placements, apply status
updates and reconcile. Decisions come from gang_policy (pure); this module loads, commits and calls out.

Every mutation follows one pattern: under the job manager's lock, in one transaction, load the affected jobs
whole, apply pure rules, write back in batches, commit; then perform the side effects (kill, release, enqueue).
A crash between commit and side effects is repaired by recovery at the next start.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence

import grpc
from prometheus_client import Counter
from sqlalchemy.orm import Session, sessionmaker

from peloton.api import convert
from peloton.api.status import from_rpc_error
from peloton.api.v1 import internal_pb2, internal_pb2_grpc
from peloton.domain.model import Job, Task, TaskEvent, gang_id_for, split_gang_id
from peloton.domain.placement import GangPlacement, GangRequest, MemberRequest, PlacementFailure
from peloton.domain.spec import JobSpec, validate
from peloton.domain.states import GangState, JobState, TaskState
from peloton.errors import Conflict, FailedPrecondition, InvalidArgument, NotFound
from peloton.hostmgr.backend import LaunchSpec
from peloton.jobmgr import gang_policy as policy
from peloton.jobmgr.training_env import hostfile, training_env
from peloton.placement.placer import can_ever_fit
from peloton.resmgr.admission import exceeds_limit_forever
from peloton.store import repo
from peloton.store.db import transaction

log = logging.getLogger(__name__)

JOBS_CREATED = Counter("peloton_jobs_created_total", "Jobs accepted")
GANG_LAUNCHES = Counter("peloton_jobmgr_gang_launches_total", "Gang launch attempts", ["result"])
GANG_RESTARTS = Counter("peloton_jobmgr_gang_restarts_total", "Gangs re-queued as a new attempt")

ACTIVE = (GangState.PLACED, GangState.LAUNCHING, GangState.RUNNING, GangState.ABORTING)
RECONCILE_MIN_AGE_S = 10.0


class JobManager:
    def __init__(
        self,
        sessions: sessionmaker[Session],
        resmgr: internal_pb2_grpc.ResourceManagerInternalStub,
        hostmgr: internal_pb2_grpc.HostManagerInternalStub,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.sessions = sessions
        self.resmgr = resmgr
        self.hostmgr = hostmgr
        self.clock = clock
        self._mutex = threading.RLock()
        self._after_seq = 0
        self._stream_id = ""

    # --- loading ----------------------------------------------------------------------------------------------
    def _load(self, s: Session, job_ids: Iterable[str]) -> dict[str, policy.JobView]:
        jobs = repo.get_jobs(s, set(job_ids))
        out: dict[str, policy.JobView] = {}
        for jid, job in jobs.items():
            tasks = {t.instance: t for t in repo.get_tasks(s, jid)}
            gangs = {g.index: policy.GangView(g, {i: tasks[i] for i in g.instances}) for g in repo.get_gangs(s, jid)}
            out[jid] = policy.JobView(job, gangs)
        return out

    def _save(self, s: Session, views: Iterable[policy.JobView], events: Sequence[TaskEvent]) -> None:
        views = list(views)
        for jv in views:
            repo.update_job(s, jv.job)
        repo.update_gangs(s, [gv.gang for jv in views for gv in jv.gangs.values()])
        repo.update_tasks(s, [t for jv in views for gv in jv.gangs.values() for t in gv.tasks.values()])
        if events:
            repo.append_task_events(s, events)

    def _gang_request(self, jv: policy.JobView, index: int) -> GangRequest:
        gv = jv.gangs[index]
        spec = jv.spec
        return GangRequest(
            gang_id=gv.gang.gang_id,
            job_id=jv.job.id,
            attempt=gv.gang.attempt,
            members=tuple(MemberRequest(t.instance, t.task_id, spec.resources) for t in gv.members()),
            priority=spec.priority,
            respool=spec.respool,
            strategy=spec.strategy,
            constraints=spec.constraints,
            enqueued_at=gv.gang.updated_at,
        )

    def _perform(self, eff: policy.Effects, views: dict[str, policy.JobView]) -> None:
        """Side effects after commit. Failures are logged: recovery and reconciliation repair them."""
        try:
            if eff.kill:
                self.hostmgr.KillTasks(internal_pb2.KillTasksRequest(task_ids=eff.kill), timeout=30)
            if eff.release:
                self.resmgr.RemoveGangs(
                    internal_pb2.RemoveGangsRequest(
                        gangs=[internal_pb2.GangKey(gang_id=g, attempt=a) for g, a in eff.release]
                    ),
                    timeout=30,
                )
            reqs = [convert.gang_request_to_proto(self._gang_request(views[j], i)) for j, i in eff.enqueue]
            for j, i in eff.adopt:
                p = convert.gang_request_to_proto(self._gang_request(views[j], i))
                p.running = True
                reqs.append(p)
            if reqs:
                self.resmgr.EnqueueGangs(internal_pb2.EnqueueGangsRequest(gangs=reqs), timeout=30)
        except grpc.RpcError as e:
            log.error("side effects failed (recovery will repair): %s", from_rpc_error(e).message)

    def _mutate(self, job_ids: Iterable[str], fn: Callable[[dict[str, policy.JobView], float], policy.Effects]) -> None:
        with self._mutex:
            now = self.clock()
            with transaction(self.sessions) as s:
                views = self._load(s, job_ids)
                eff = fn(views, now)
                self._save(s, views.values(), eff.events)
            if eff.restarts:
                GANG_RESTARTS.inc(eff.restarts)
            self._perform(eff, views)

    # --- public API -----------------------------------------------------------------------------------------
    def create_job(self, spec: JobSpec) -> str:
        validate(spec)
        with transaction(self.sessions) as s:
            pools = {p.path: p for p in repo.list_pools(s)}
        if spec.respool not in pools:
            raise InvalidArgument(f"respool: resource pool {spec.respool} does not exist", field="respool")
        gang_total = spec.resources.scale(spec.gang_size)
        why = exceeds_limit_forever(gang_total, spec.respool, pools)
        if why:
            raise InvalidArgument(f"instances: {why}", field="instances")
        self._check_fits_cluster(spec)
        job_id = uuid.uuid4().hex[:12]
        now = self.clock()
        job, gangs, tasks = policy.new_job_records(job_id, spec, now)
        events = [TaskEvent(job_id, t.instance, 1, TaskState.PENDING, now, reason="job created") for t in tasks]
        with self._mutex:
            with transaction(self.sessions) as s:
                repo.insert_job(s, job, gangs, tasks)
                repo.append_task_events(s, events)
            view = policy.JobView(job, {g.index: policy.GangView(g, {t.instance: t for t in tasks
                                                                      if t.gang_index == g.index}) for g in gangs})
            self._perform(policy.Effects(enqueue=[(job_id, g.index) for g in gangs]), {job_id: view})
        JOBS_CREATED.inc()
        log.info("job %s created: %s, %d instances in %d gangs", job_id, spec.name, spec.instances, len(gangs))
        return job_id

    def _check_fits_cluster(self, spec: JobSpec) -> None:
        try:
            cap = self.hostmgr.ClusterCapacity(internal_pb2.ClusterCapacityRequest(), timeout=10)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        hosts = [convert.offer_from_proto(o) for o in cap.hosts]
        if not hosts:
            return  # no host known yet (a cluster backend still connecting): cannot judge
        probe = GangRequest(
            gang_id="probe/0", job_id="probe", attempt=1,
            members=tuple(MemberRequest(i, f"probe-{i}-1", spec.resources) for i in range(spec.gang_size)),
            strategy=spec.strategy, constraints=spec.constraints,
        )
        failure = can_ever_fit(probe, hosts)
        if failure is not None:
            raise InvalidArgument(
                f"instances: the gang can never fit this cluster even when it is empty: {failure.reason}",
                field="instances",
            )

    def get_job(self, job_id: str) -> tuple[Job, list, dict[str, int]]:  # type: ignore[type-arg]
        with transaction(self.sessions) as s:
            job = repo.get_job(s, job_id)
            gangs = repo.get_gangs(s, job_id)
            counts = repo.task_state_counts(s, [job_id]).get(job_id, {})
        return job, gangs, counts

    def list_jobs(self, states: Sequence[str], owner: str, respool: str, name_contains: str, limit: int
                  ) -> list[tuple[Job, list, dict[str, int]]]:  # type: ignore[type-arg]
        try:
            st = [JobState(x.upper()) for x in states] or None
        except ValueError:
            raise InvalidArgument(f"states: unknown job state in {list(states)}", field="states") from None
        with transaction(self.sessions) as s:
            jobs = repo.list_jobs(s, states=st, owner=owner or None, respool=respool or None,
                                  name_contains=name_contains or None, limit=limit or 100)
            counts = repo.task_state_counts(s, [j.id for j in jobs])
        return [(j, [], counts.get(j.id, {})) for j in jobs]

    def stop_job(self, job_id: str) -> None:
        with transaction(self.sessions) as s:
            repo.get_job(s, job_id)  # NotFound

        def fn(views: dict[str, policy.JobView], now: float) -> policy.Effects:
            return policy.stop_job(views[job_id], now)

        self._mutate([job_id], fn)

    def delete_job(self, job_id: str) -> None:
        with self._mutex, transaction(self.sessions) as s:
            job = repo.get_job(s, job_id)
            if not job.state.terminal:
                raise FailedPrecondition(f"job {job_id} is {job.state.value}; stop it before deleting it")
            repo.delete_job(s, job_id)

    def list_tasks(self, job_id: str) -> list[Task]:
        with transaction(self.sessions) as s:
            repo.get_job(s, job_id)
            return repo.get_tasks(s, job_id)

    def get_task(self, job_id: str, instance: int) -> tuple[Task, list[TaskEvent]]:
        with transaction(self.sessions) as s:
            tasks = repo.get_tasks(s, job_id, [instance])
            if not tasks:
                repo.get_job(s, job_id)
                raise NotFound(f"job {job_id} has no instance {instance}")
            return tasks[0], repo.get_task_events(s, job_id, instance)

    def task_log(self, job_id: str, instance: int, attempt: int, stream: str, tail: int) -> tuple[str, bytes]:
        if stream not in ("", "stdout", "stderr"):
            raise InvalidArgument("stream: must be stdout or stderr", field="stream")
        task, events = self.get_task(job_id, instance)
        attempt = attempt or task.attempt
        ran = {e.attempt for e in events if e.state in (TaskState.LAUNCHING, TaskState.RUNNING)}
        if attempt not in ran:
            raise FailedPrecondition(f"task {job_id}-{instance}-{attempt} has not been launched; no logs yet")
        task_id = policy.task_id_for(job_id, instance, attempt)
        try:
            r = self.hostmgr.ReadTaskLog(
                internal_pb2.ReadTaskLogRequest(task_id=task_id, stream=stream or "stdout", tail_bytes=tail),
                timeout=30,
            )
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        return task_id, r.content

    # --- recovery ---------------------------------------------------------------------------------------------
    def recover(self) -> None:
        """At start: re-queue queued gangs, adopt whole running gangs, tear down partial ones."""
        with transaction(self.sessions) as s:
            open_gangs = repo.gangs_in_states(s, [st for st in GangState if st != GangState.DONE])
        job_ids = sorted({g.job_id for g in open_gangs})
        if not job_ids:
            self._reconcile_backend([])
            return
        with transaction(self.sessions) as s:
            views = self._load(s, job_ids)
        live = [t.task_id for jv in views.values() for gv in jv.gangs.values() if gv.gang.state in ACTIVE
                for t in gv.members() if not t.state.terminal]
        statuses = self._reconcile_backend(live)

        def fn(vs: dict[str, policy.JobView], now: float) -> policy.Effects:
            eff = policy.Effects()
            for jv in vs.values():
                eff.merge(policy.recover(jv, statuses, now))
            return eff

        self._mutate(job_ids, fn)
        log.info("recovery: %d jobs with open gangs, %d live tasks reconciled", len(job_ids), len(live))

    def _reconcile_backend(self, task_ids: list[str]) -> dict:  # type: ignore[type-arg]
        r = self.hostmgr.ReconcileTasks(
            internal_pb2.ReconcileTasksRequest(task_ids=task_ids, kill_unknown=True), timeout=60
        )
        return {p.task_id: convert.status_from_proto(p) for p in r.statuses}

    # --- loop: placements -> write-ahead intent -> launch --------------------------------------------------------
    def launch_once(self, timeout_ms: int = 1000) -> bool:
        resp = self.resmgr.GetPlacements(internal_pb2.GetPlacementsRequest(max=100, timeout_ms=timeout_ms),
                                         timeout=timeout_ms / 1000 + 10)
        if resp.pending:
            self._record_pending([convert.failure_from_proto(f) for f in resp.pending])
        placements = [convert.placement_from_proto(p) for p in resp.placements]
        if not placements:
            return bool(resp.pending)
        accepted: list[tuple[GangPlacement, policy.JobView]] = []

        def intent(views: dict[str, policy.JobView], now: float) -> policy.Effects:
            eff = policy.Effects()
            for p in placements:
                jv = views.get(p.job_id)
                _, idx = split_gang_id(p.gang_id)
                gv = jv.gangs.get(idx) if jv else None
                if (jv is None or gv is None or jv.job.desired != "RUNNING" or gv.gang.attempt != p.attempt
                        or gv.gang.state not in (GangState.QUEUED, GangState.ADMITTED)):
                    continue  # stale placement; its lease expires on its own
                g = gv.gang
                g.state, g.reason, g.updated_at = GangState.LAUNCHING, "", now
                g.launch_deadline = now + jv.spec.launch_timeout_s
                for m in p.members:
                    t = gv.tasks[m.instance]
                    t.host, t.address, t.ports, t.gpu_ids = m.hostname, m.address, list(m.ports), list(m.gpu_ids)
                    t.state, t.updated_at = TaskState.LAUNCHING, now
                    eff.events.append(TaskEvent(t.job_id, t.instance, t.attempt, TaskState.LAUNCHING, now,
                                                m.hostname, "placed"))
                policy.derive_job_state(jv, now)
                accepted.append((p, jv))
            return eff

        self._mutate({p.job_id for p in placements}, intent)
        for p, jv in accepted:
            self._launch(p, jv)
        return True

    def _launch(self, p: GangPlacement, jv: policy.JobView) -> None:
        envs = training_env(jv.job.id, p.attempt, p.members)
        files = {"hostfile": hostfile(p.members)}
        tasks = [
            LaunchSpec(
                task_id=m.task_id, job_id=jv.job.id, instance=m.instance, attempt=p.attempt, hostname=m.hostname,
                command=jv.spec.command, env={**jv.spec.env, **envs[m.instance]}, resources=m.resources,
                gpu_ids=m.gpu_ids, ports=m.ports, files=files, container_image=jv.spec.container_image,
            )
            for m in p.members
        ]
        message = ""
        try:
            r = self.hostmgr.LaunchGang(
                internal_pb2.LaunchGangRequest(lease_id=p.lease_id, tasks=[convert.launch_to_proto(t) for t in tasks]),
                timeout=60,
            )
            if r.ok:
                GANG_LAUNCHES.labels("ok").inc()
                return
            message = f"{r.failed_task_id}: {r.message}"
        except grpc.RpcError as e:
            err = from_rpc_error(e)
            message = err.message
            if not isinstance(err, Conflict):
                log.error("launch of gang %s failed: %s", p.gang_id, message)
        GANG_LAUNCHES.labels("failed").inc()
        _, idx = split_gang_id(p.gang_id)

        def fn(views: dict[str, policy.JobView], now: float) -> policy.Effects:
            v = views[jv.job.id]
            if v.gangs[idx].gang.attempt != p.attempt:
                return policy.Effects()
            return policy.launch_failed(v, v.gangs[idx], now, message)

        self._mutate([jv.job.id], fn)

    def _record_pending(self, pending: Sequence[PlacementFailure]) -> None:
        with self._mutex, transaction(self.sessions) as s:
            changed = []
            by_job: dict[str, list] = {}  # type: ignore[type-arg]
            for f in pending:
                by_job.setdefault(f.job_id, []).append(f)
            for jid, fs in by_job.items():
                gangs = {g.gang_id: g for g in repo.get_gangs(s, jid)}
                for f in fs:
                    g = gangs.get(f.gang_id)
                    if g and g.attempt == f.attempt and g.state in (GangState.QUEUED, GangState.ADMITTED):
                        g.reason = f.reason
                        g.updated_at = self.clock()
                        changed.append(g)
            repo.update_gangs(s, changed)

    # --- loop: status updates ------------------------------------------------------------------------------------
    def events_once(self, timeout_ms: int = 1000) -> bool:
        r = self.hostmgr.WaitTaskEvents(
            internal_pb2.WaitTaskEventsRequest(after_seq=self._after_seq, max_events=2000, timeout_ms=timeout_ms),
            timeout=timeout_ms / 1000 + 10,
        )
        if r.stream_id != self._stream_id:
            if self._stream_id:
                log.warning("host manager restarted: reconciling")
            self._stream_id = r.stream_id
            if self._after_seq and not r.events:
                self._after_seq = 0
                return True
        if not r.events:
            return False
        self.apply_statuses([convert.status_from_proto(e) for e in r.events])
        self._after_seq = r.events[-1].seq
        # only now, with the updates committed, may the backend acknowledge them upstream
        self.hostmgr.AckTaskEvents(internal_pb2.AckTaskEventsRequest(up_to_seq=self._after_seq), timeout=30)
        return True

    def apply_statuses(self, statuses: Sequence) -> None:  # type: ignore[type-arg]
        by_job: dict[str, list] = {}  # type: ignore[type-arg]
        for st in statuses:
            try:
                jid, _, _ = policy.parse_task_id(st.task_id)
            except ValueError:
                log.warning("status for a task id that is not ours: %s", st.task_id)
                continue
            by_job.setdefault(jid, []).append(st)

        def fn(views: dict[str, policy.JobView], now: float) -> policy.Effects:
            eff = policy.Effects()
            for jid, sts in by_job.items():
                jv = views.get(jid)
                if jv is None:  # job deleted: nothing of it may run
                    eff.kill += [st.task_id for st in sts if st.state == TaskState.RUNNING]
                    continue
                for st in sts:
                    eff.merge(policy.apply_status(jv, st, now))
            return eff

        self._mutate(by_job, fn)

    # --- loop: reconciliation and launch deadlines --------------------------------------------------------------
    def reconcile_once(self) -> bool:
        now = self.clock()
        with transaction(self.sessions) as s:
            gangs = repo.gangs_in_states(s, list(ACTIVE))
            views = self._load(s, {g.job_id for g in gangs})
        stale = [t for jv in views.values() for gv in jv.gangs.values() if gv.gang.state in ACTIVE
                 for t in gv.members() if not t.state.terminal and now - t.updated_at > RECONCILE_MIN_AGE_S]
        late = [(jv.job.id, gv.gang.index) for jv in views.values() for gv in jv.gangs.values()
                if gv.gang.state in (GangState.PLACED, GangState.LAUNCHING) and gv.gang.launch_deadline
                and now >= gv.gang.launch_deadline]
        if late:
            def fn(vs: dict[str, policy.JobView], t: float) -> policy.Effects:
                eff = policy.Effects()
                for jid, idx in late:
                    eff.merge(policy.check_launch_deadline(vs[jid], vs[jid].gangs[idx], t))
                return eff

            self._mutate({j for j, _ in late}, fn)
        if not stale:
            return False
        statuses = self._reconcile_backend_only([t.task_id for t in stale])
        by_id = {t.task_id: t for t in stale}
        drift = [st for tid, st in statuses.items()
                 if by_id.get(tid) is not None and st.state != by_id[tid].state
                 and not (st.state == TaskState.RUNNING and by_id[tid].state == TaskState.KILLING)]
        again = [tid for tid, st in statuses.items()
                 if st.state == TaskState.RUNNING and by_id.get(tid) is not None
                 and by_id[tid].state == TaskState.KILLING]
        if again:  # a kill that did not take (or was lost): ask again
            self.hostmgr.KillTasks(internal_pb2.KillTasksRequest(task_ids=again), timeout=30)
        if drift:
            log.warning("reconciliation found %d tasks whose state drifted", len(drift))
            self.apply_statuses(drift)
        return False

    def _reconcile_backend_only(self, task_ids: list[str]) -> dict:  # type: ignore[type-arg]
        r = self.hostmgr.ReconcileTasks(internal_pb2.ReconcileTasksRequest(task_ids=task_ids), timeout=60)
        return {p.task_id: convert.status_from_proto(p) for p in r.statuses}


__all__ = ["JobManager", "gang_id_for"]
