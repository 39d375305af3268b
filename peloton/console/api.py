"""The console's calls to the daemon's own public gRPC API, each with the browser's credentials (its token), so
that what a page shows and what an action may do are exactly what the API allows that caller, redacted and
audited as the API does. Answers are shaped into plain JSON-ready dicts here: protobuf stays at this edge."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import grpc

from peloton import errors
from peloton.api.status import from_rpc_error
from peloton.api.v1 import (
    audit_pb2,
    audit_pb2_grpc,
    cluster_pb2,
    cluster_pb2_grpc,
    host_pb2,
    host_pb2_grpc,
    job_pb2,
    job_pb2_grpc,
    respool_pb2,
    respool_pb2_grpc,
    task_pb2,
    task_pb2_grpc,
)
from peloton.console import lending, timeline
from peloton.console.params import LOG_TAIL, AuditQuery, HostQuery, JobQuery, LogQuery, QueueQuery
from peloton.domain import principal
from peloton.domain.resources import parse_mib
from peloton.security.auth import CONSOLE_SECRET, ON_BEHALF

CALL_TIMEOUT_S = 10.0
MAX_QUEUE_SHOWN = 1000  # queued gangs read for a page of the job list (the API's default bound)
MAX_MEMBERS = 1000  # members listed on a job's page (the API pages them; the rest are counted)
MAX_TIMELINE_MEMBERS = 256  # a gang's members drawn side by side (the first by instance; the rest are counted)
MAX_TIMELINE_EVENTS = 5000  # their newest state changes, together: every member's bar covers the same window
ENDED_TASK = frozenset({"SUCCEEDED", "FAILED", "KILLED", "LOST"})  # a log that grows no more (PREEMPTED restarts)
RESOURCES = ("cpu", "mem_mib", "disk_mib", "gpu")


def _res(r: job_pb2.Resources) -> dict[str, float]:
    """A Resources message in plain numbers (memory and disk in MiB)."""
    return {"cpu": round(r.cpu, 3), "mem_mib": round(parse_mib(r.mem or 0, "mem"), 3),
            "disk_mib": round(parse_mib(r.disk or 0, "disk"), 3), "gpu": float(r.gpu)}


class Api:
    """One channel to the daemon's API, on the console's own owner-only Unix socket (whatever the API's TLS); every
    call carries the console's secret and says for whom it is (security/auth.py): `token`, the caller's credential,
    is an API token (checked by the API as any), "certificate:<name>" (a client certificate the console's HTTPS
    verified: the API gives it the roles it gives that certificate), "local:<name>" (a one-time login of the
    daemon's user), or "" when the daemon authenticates nobody (every caller is then the API's `anonymous` admin,
    as on its own port)."""

    def __init__(self, address: str, secret: str) -> None:
        self.secret = secret
        self.channel = grpc.insecure_channel(address)
        self.cluster = cluster_pb2_grpc.ClusterServiceStub(self.channel)
        self.jobs = job_pb2_grpc.JobServiceStub(self.channel)
        self.tasks = task_pb2_grpc.TaskServiceStub(self.channel)
        self.pools = respool_pb2_grpc.ResourcePoolServiceStub(self.channel)
        self.hosts = host_pb2_grpc.HostServiceStub(self.channel)
        self.audits = audit_pb2_grpc.AuditServiceStub(self.channel)

    def close(self) -> None:
        self.channel.close()  # ends the open watches too

    def _md(self, token: str) -> list[tuple[str, str]]:
        md = [(CONSOLE_SECRET, self.secret)]
        kind, colon, name = token.partition(":")
        if not token:
            return md
        if not colon:
            return [*md, (ON_BEHALF, "token"), ("authorization", f"Bearer {token}")]
        if kind == "certificate":
            return [*md, (ON_BEHALF, f"certificate:{quote(name, safe='')}")]
        return [*md, (ON_BEHALF, "local")]

    def redeem_login(self, login_id: str, secret: str) -> str:
        """A one-time login spent (the API audits it, and refuses one unknown, used or expired); for whom it was."""
        r = self._call(self.cluster.RedeemConsoleLogin,
                       cluster_pb2.RedeemConsoleLoginRequest(login_id=login_id, secret=secret), "")
        return str(r.principal)

    def _call(self, fn: Any, request: Any, token: str) -> Any:
        try:
            return fn(request, metadata=self._md(token), timeout=CALL_TIMEOUT_S)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None

    def whoami(self, token: str) -> dict[str, Any]:
        """Who the token is (UNAUTHENTICATED when the daemon does not know it), with what the console needs to
        know of its rights: the pages hide what the API would refuse, the API refuses it anyway."""
        info = self._call(self.cluster.GetClusterInfo, cluster_pb2.GetClusterInfoRequest(), token)
        s = info.security
        p = principal.Principal(s.caller, frozenset(s.caller_roles), s.caller_via)
        return {"name": s.caller, "roles": sorted(s.caller_roles), "via": s.caller_via,
                "authenticated": s.tokens or s.mutual_tls, "permissions": sorted(p.permissions),
                "may_control_any": p.can(principal.JOB_CONTROL_ANY),
                "may_control_own": p.can(principal.JOB_CONTROL_OWN)}

    def cluster_summary(self, token: str) -> dict[str, Any]:
        """The cluster view: the daemon, GetClusterSummary (sums of every host without a host list, gangs by state,
        stage latencies) and the pools."""
        info = self._call(self.cluster.GetClusterInfo, cluster_pb2.GetClusterInfoRequest(), token)
        c = self._call(self.cluster.GetClusterSummary, cluster_pb2.GetClusterSummaryRequest(), token)
        pools = self._call(self.pools.ListPools, respool_pb2.ListPoolsRequest(), token).pools
        return {
            "version": info.version, "backend": info.backend, "started_at": info.started_at,
            "roles": list(info.roles), "sources": list(c.sources), "hosts": c.hosts,
            "host_states": dict(c.host_states), "racks": c.racks,
            "capacity": _res(c.capacity), "allocated": _res(c.allocated), "gpus": dict(c.gpus),
            "queued_gangs": c.queued_gangs, "gang_states": dict(c.gang_states),
            "stages": [{"stage": g.stage, "count": g.count, "mean_s": round(g.mean_seconds, 4),
                        "p50_s": round(g.p50_seconds, 4), "p95_s": round(g.p95_seconds, 4),
                        "p99_s": round(g.p99_seconds, 4)} for g in c.stages],
            "pools": [{"path": p.path, "allocated": _res(p.allocated), "demand": _res(p.demand),
                       "queued_gangs": p.queued_gangs} for p in sorted(pools, key=lambda p: p.path)],
        }

    def list_pools(self, token: str) -> dict[str, Any]:
        """Every pool, parents before children (the tree by path), with what it is given and what it uses."""
        pools = self._call(self.pools.ListPools, respool_pb2.ListPoolsRequest(), token).pools
        lent = lending.lending([lending.PoolHolding(p.path, p.reservation.gpu, p.allocated.gpu,
                                                    p.reservation_type == "static") for p in pools])
        out = []
        for p in sorted(pools, key=lambda p: [x for x in p.path.split("/") if x]):
            e = p.entitlement
            loans = lent[p.path]
            out.append({
                "path": p.path, "parent": _parent(p.path), "depth": p.path.count("/") if p.path != "/" else 0,
                "reservation": _res(p.reservation), "limit": _res(p.limit) if p.HasField("limit") else None,
                "share": p.share, "reservation_type": p.reservation_type or "elastic",
                "allocated": _res(p.allocated), "demand": _res(p.demand),
                "entitlement": {"cpu": round(e.cpu, 3), "mem_mib": round(e.mem_mib, 3), "gpu": round(e.gpu, 3)},
                "queued_gangs": p.queued_gangs, "submitters": list(p.submitters),
                # who lends GPUs to whom: an attribution among siblings (lending.py), biggest first
                "lends_to": _loans(loans.lends_to), "borrows_from": _loans(loans.borrows_from),
                "borrows_unreserved": round(loans.unreserved, 3)})
        return {"pools": out}

    def queue(self, q: QueueQuery, token: str) -> dict[str, Any]:
        """The gangs waiting for admission or placement, first in queue order first, as `peloton queue`."""
        r = self._call(self.pools.ListQueue, respool_pb2.ListQueueRequest(pool=q.pool, limit=q.limit), token)
        return {"total": r.total, "gangs": [
            {"gang": g.gang_id, "job_id": g.job_id, "attempt": g.attempt, "pool": g.pool, "priority": g.priority,
             "members": g.members, "resources": _res(g.resources), "enqueued_at": g.enqueued_at, "state": g.state,
             "reason": g.reason, "position": g.position, "preemptible": g.preemptible,
             "reserved_hosts": list(g.reserved_hosts), "expected_start": g.expected_start or None,
             "expected_start_basis": g.expected_start_basis or None} for g in r.gangs]}

    def audit(self, q: AuditQuery, token: str) -> dict[str, Any]:
        """The audit log, newest first (audit.read: operators and admins; the API refuses the others)."""
        r = self._call(self.audits.ListAuditEvents, audit_pb2.ListAuditEventsRequest(
            principal=q.principal, object=q.object, denied_only=q.denied, limit=q.limit, before_id=q.before_id),
            token)
        events = [{"id": e.id, "at": e.at, "principal": e.principal, "via": e.via, "method": e.method,
                   "object": e.object, "allowed": e.allowed, "code": e.code, "message": e.message} for e in r.events]
        return {"events": events, "before": events[-1]["id"] if len(events) == q.limit else None}

    def list_hosts(self, q: HostQuery, token: str) -> dict[str, Any]:
        """A page of the hosts, by rack then name, filtered and paged by ListHosts: each with its GPUs (used by
        which job, free, stranded, reserved, out of service), its drain and health, and the jobs on it."""
        r = self._call(self.hosts.ListHosts, host_pb2.ListHostsRequest(
            page_size=q.page_size, page_token=q.page_token, states=[q.status] if q.status else [], rack=q.rack,
            labels=[q.label] if q.label else [], min_free_gpus=q.min_free_gpus, name_contains=q.name_contains,
            with_gpus=True), token)
        rows = []
        for h in r.hosts:
            cap, alloc = _res(h.capacity), _res(h.allocated)
            rows.append({"hostname": h.hostname, "rack": h.labels.get("rack", ""), "status": h.status,
                         "health": h.health, "drain_deadline": h.drain_deadline, "maintenance": h.maintenance,
                         "reserved_for": h.reserved_for, "gpu_model": h.hardware.gpu_model,
                         "gpus": [{"id": g.id, "state": g.state, "job": _job_of(g.task_id)} for g in h.gpus],
                         "gpus_used": int(alloc["gpu"]), "cpu": cap["cpu"], "cpu_used": alloc["cpu"],
                         "jobs": sorted({_job_of(t) for t in h.task_ids})})
        return {"hosts": rows, "total": r.total, "next_page_token": r.next_page_token, "racks": list(r.racks)}

    def drain_host(self, hostname: str, token: str, undrain: bool = False,
                   deadline_s: float | None = None) -> dict[str, Any]:
        """Drain (with a deadline in seconds from now, or none) or undrain a host."""
        if undrain:
            h = self._call(self.hosts.UndrainHost, host_pb2.UndrainHostRequest(hostname=hostname), token).host
        else:
            req = host_pb2.DrainHostRequest(hostname=hostname)
            if deadline_s is not None:
                req.deadline.FromNanoseconds(round(deadline_s * 1e9))
            h = self._call(self.hosts.DrainHost, req, token).host
        return {"hostname": h.hostname, "drain": h.drain, "drain_deadline": h.drain_deadline or None}

    def list_jobs(self, q: JobQuery, token: str) -> dict[str, Any]:
        r = self._call(self.jobs.ListJobs, job_pb2.ListJobsRequest(
            states=list(q.states), owner=q.owner, respool=q.pool, name_contains=q.name_contains,
            page_size=q.page_size, page_token=q.page_token), token)
        rows = [_job_row(j) for j in r.jobs]
        if any(row["state"] == "PENDING" for row in rows):
            waiting = self._waiting(token)
            for row in rows:
                row["waiting"] = waiting.get(row["id"])
        return {"jobs": rows, "next_page_token": r.next_page_token}

    def _waiting(self, token: str) -> dict[str, dict[str, Any]]:
        """Why each queued job waits: its first gang in the queue (position in its pool, since when, the reason),
        from one ListQueue call for the page (the first MAX_QUEUE_SHOWN gangs in queue order: a job further back
        shows its reason on its own page). Nothing for a caller the API does not let read the queue."""
        try:
            q = self._call(self.pools.ListQueue, respool_pb2.ListQueueRequest(limit=MAX_QUEUE_SHOWN), token)
        except errors.PermissionDenied:
            return {}
        out: dict[str, dict[str, Any]] = {}
        for g in q.gangs:
            if g.job_id not in out:
                out[g.job_id] = {"pool": g.pool, "position": g.position, "since": g.enqueued_at,
                                 "state": g.state, "reason": g.reason, "gang": g.gang_id}
        return out

    def get_job(self, job_id: str, token: str) -> dict[str, Any]:
        job = self._call(self.jobs.GetJob, job_pb2.GetJobRequest(job_id=job_id), token).job
        tasks = self._call(self.tasks.ListTasks, task_pb2.ListTasksRequest(job_id=job_id, page_size=MAX_MEMBERS),
                           token)
        st = job.status
        return {
            **_job_row(job),
            "desired_state": st.desired_state, "updated_at": st.updated_at, "completed_at": st.completed_at,
            "run_as": st.run_as, "gang_count": st.gang_count, "gang_states": dict(st.gang_states),
            "instances": job.spec.instances,
            "gangs": [{"index": g.index, "instances": _ranges(list(g.instances)), "state": g.state,
                       "attempt": g.attempt, "run": g.run, "preemptions": g.preemptions, "reason": g.reason,
                       "plan": _plan(g.plan) if g.HasField("plan") else None} for g in st.gangs],
            "members": [{"instance": t.instance, "gang": t.gang_index, "task_id": t.task_id, "run": t.attempt,
                         "state": t.state, "host": t.host, "gpus": list(t.gpus), "role": t.role,
                         "exit_code": t.exit_code if t.HasField("exit_code") else None, "reason": t.reason,
                         "message": t.message, "started_at": t.started_at, "finished_at": t.finished_at}
                        for t in tasks.tasks],
            "members_more": bool(tasks.next_page_token),
        }

    def member(self, job_id: str, instance: int, token: str, now: float) -> dict[str, Any]:
        """One member's state events across its runs (the newest 1,000), as a timeline."""
        t = self._call(self.tasks.GetTask, task_pb2.GetTaskRequest(job_id=job_id, instance=instance), token).task
        events = [timeline.Event(e.attempt, e.state, e.time, e.host, e.reason or e.message) for e in t.events]
        segs = timeline.segments(events, now)
        return {"instance": t.instance, "task_id": t.task_id, "state": t.state, "run": t.attempt,
                "events_total": t.events_total, "now": now,
                "segments": [_segment(g) for g in segs]}

    def job_events(self, job_id: str, limit: int, token: str) -> dict[str, Any]:
        """The job's newest state changes across its members, newest first, in one ListTaskEvents call."""
        r = self._call(self.tasks.ListTaskEvents, task_pb2.ListTaskEventsRequest(job_id=job_id, limit=limit), token)
        return {"total": r.total, "events": [_event(e) for e in reversed(r.events)]}

    def gang_timeline(self, job_id: str, gang: int, token: str, now: float) -> dict[str, Any]:
        """Every member of a gang side by side (the first MAX_TIMELINE_MEMBERS): GetJob for its members, one
        ListTaskEvents for their newest MAX_TIMELINE_EVENTS state changes together (not a GetTask per member),
        cut into timeline segments per member. `since`: the oldest event read, when older ones were left out."""
        job = self._call(self.jobs.GetJob, job_pb2.GetJobRequest(job_id=job_id), token).job
        g = next((x for x in job.status.gangs if x.index == gang), None)
        if g is None:
            raise errors.NotFound(f"gang: job {job_id} has no gang {gang} (of the first 1,000)", field="gang")
        members = sorted(g.instances)[:MAX_TIMELINE_MEMBERS]
        r = self._call(self.tasks.ListTaskEvents, task_pb2.ListTaskEventsRequest(
            job_id=job_id, instances=members, limit=MAX_TIMELINE_EVENTS), token)
        by_member: dict[int, list[timeline.Event]] = {i: [] for i in members}
        for e in r.events:
            by_member.setdefault(e.instance, []).append(
                timeline.Event(e.attempt, e.state, e.time, e.host, e.reason or e.message))
        rows = [{"instance": i, "segments": [_segment(s) for s in timeline.segments(evs, now)]}
                for i, evs in sorted(by_member.items())]
        return {"gang": gang, "state": g.state, "run": g.run, "members": rows, "members_total": len(g.instances),
                "events_total": r.total, "now": now,
                "since": r.events[0].time if r.events and r.total > len(r.events) else None}

    def logs(self, job_id: str, instance: int, q: LogQuery, token: str) -> dict[str, Any]:
        """A piece of a member's log: its last LOG_TAIL bytes, or from `offset` on (following: the page asks again
        from next_offset until the run has ended and nothing more came)."""
        req = task_pb2.GetTaskLogsRequest(job_id=job_id, instance=instance, attempt=q.run, stream=q.stream)
        if q.offset is None:
            req.tail_bytes = LOG_TAIL
        else:
            req.offset = q.offset
        r = self._call(self.tasks.GetTaskLogs, req, token)
        return {"task_id": r.task_id, "content": r.content.decode("utf-8", "replace"), "next_offset": r.next_offset,
                "task_state": r.task_state, "ended": r.task_state in ENDED_TASK}

    def stop_job(self, job_id: str, token: str) -> None:
        self._call(self.jobs.StopJob, job_pb2.StopJobRequest(job_id=job_id), token)

    def delete_job(self, job_id: str, token: str) -> None:
        self._call(self.jobs.DeleteJob, job_pb2.DeleteJobRequest(job_id=job_id), token)

    def watch(self, job_ids: tuple[str, ...], stream_id: str, after: int, token: str) -> Watch:
        """WatchJobs, resumed after (stream_id, after) when given."""
        return Watch(self.jobs.WatchJobs(job_pb2.WatchJobsRequest(job_ids=list(job_ids), tasks=bool(job_ids),
                                                                  stream_id=stream_id, after_revision=after),
                                         metadata=self._md(token)))


class Watch:
    """A WatchJobs stream as plain dicts; it ends when the daemon ends it, the channel closes, or `cancel` is
    called (from any thread: the browser hung up). Heartbeats come through as messages without changes."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def cancel(self) -> None:
        self._stream.cancel()

    def __iter__(self) -> Iterator[dict[str, Any]]:
        try:
            for m in self._stream:
                yield {"stream_id": m.stream_id, "revision": m.revision, "snapshot": m.snapshot, "resync": m.resync,
                       "more": m.more,
                       "changes": [{"job_id": c.job_id, "state": c.state, "desired_state": c.desired_state,
                                    "reason": c.reason, "deleted": c.deleted,
                                    "tasks": [{"instance": t.instance, "state": t.state, "host": t.host,
                                               "run": t.attempt, "reason": t.reason} for t in c.tasks]}
                                   for c in m.changes]}
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.CANCELLED:
                raise from_rpc_error(e) from None
        finally:
            self._stream.cancel()


def _job_row(j: job_pb2.Job) -> dict[str, Any]:
    st = j.status
    return {"id": j.id, "name": j.spec.name, "owner": j.spec.owner, "pool": j.spec.respool or "/",
            "state": st.state, "reason": st.reason, "created_at": st.created_at,
            "task_states": dict(st.task_states)}


def _segment(g: timeline.Segment) -> dict[str, Any]:
    return {"run": g.run, "state": g.state, "start": g.start, "end": g.end, "host": g.host, "reason": g.reason}


def _event(e: task_pb2.TaskEvent) -> dict[str, Any]:
    return {"instance": e.instance, "run": e.attempt, "state": e.state, "time": e.time, "host": e.host,
            "reason": e.reason, "message": e.message, "exit_code": e.exit_code if e.HasField("exit_code") else None}


def _loans(by_pool: dict[str, float]) -> list[dict[str, Any]]:
    return [{"pool": k, "gpus": round(v, 3)} for k, v in sorted(by_pool.items(), key=lambda kv: (-kv[1], kv[0]))
            if round(v, 3) > 0]


def _job_of(task_id: str) -> str:
    """The job of a task id (`<job_id>-<instance>-<run>`); "" for none."""
    return task_id.split("-")[0] if task_id else ""


def _parent(path: str) -> str | None:
    if path == "/":
        return None
    head = path.rsplit("/", 1)[0]
    return head or "/"


def _plan(p: job_pb2.PlanInfo) -> dict[str, Any]:
    return {"gpus_per_host": list(p.gpus_per_host), "step_time": p.step_time, "samples_per_s": p.samples_per_s,
            "local_bsz": p.local_bsz, "measured_step_time": p.measured_step_time,
            "measured_samples_per_s": p.measured_samples_per_s, "measured_members": p.measured_members,
            "alternatives": [{"gpus_per_host": list(a.gpus_per_host), "step_time": a.step_time,
                              "samples_per_s": a.samples_per_s} for a in p.alternatives]}


def _ranges(xs: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2,5": a gang of 4,096 members is one short line."""
    out: list[str] = []
    i = 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        out.append(str(xs[i]) if i == j else f"{xs[i]}-{xs[j]}")
        i = j + 1
    return ",".join(out)
