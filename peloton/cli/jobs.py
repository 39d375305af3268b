"""`peloton job ...`: create, get (--watch), list, stop, delete, wait."""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING, Any

from peloton.api.v1 import job_pb2
from peloton.cli import render
from peloton.cli.exits import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_TIMEOUT, EXIT_UNAVAILABLE
from peloton.errors import InvalidArgument, NotFound, PelotonError, Unavailable
from peloton.retry import Backoff
from peloton.retry.sleeping import retry_call

if TYPE_CHECKING:
    from peloton.api.v1 import task_pb2
    from peloton.cli.client import Client
    from peloton.cli.reconnect import Reconnect

CLEAR_SCREEN = "\x1b[H\x1b[2J"


CREATE_RETRY_S = 30.0  # how long `job create` keeps trying a daemon that answers UNAVAILABLE
CREATE_BACKOFF = Backoff(0.25, 5.0)


def cmd_job_create(c: Client, a: argparse.Namespace) -> int:
    spec = _read_spec(a.file)
    # One key for every try of this command: a retry after UNAVAILABLE (the daemon restarting, its store away)
    # returns the job a first try may have created instead of creating another.
    import uuid

    request = job_pb2.CreateJobRequest(spec=spec, request_id=uuid.uuid4().hex, dry_run=a.dry_run)
    r = retry_call(lambda: c.call(c.jobs.CreateJob, request), retry_if=lambda e: isinstance(e, Unavailable),
                   backoff=CREATE_BACKOFF, budget_s=CREATE_RETRY_S,
                   on_retry=lambda e, _: print(f"peloton: {getattr(e, 'message', e)}; trying again", file=sys.stderr))
    for w in r.warnings:  # settings this daemon accepted but will not act on: created, but said so
        print(f"peloton: warning: {w}", file=sys.stderr)
    if a.dry_run:
        return _dry_run(a, r)
    if a.output in render.DOCUMENTS:
        print(render.dumps({"job_id": r.job_id, "warnings": list(r.warnings)}))
    else:
        print(r.job_id)
    return 0


def _dry_run(a: argparse.Namespace, r: job_pb2.CreateJobResponse) -> int:
    """What `job create --dry-run` prints: the spec was accepted (else the call failed as a create would), and
    for each gang whether its pool would admit it now and where it would go. Exit 0 either way: a gang that would
    wait is not an error."""
    if a.output in render.DOCUMENTS:
        print(render.dumps({"admitted": True, "warnings": list(r.warnings),
                            "gangs": [render.to_dict(g) for g in r.dry_run]}))
        return 0
    n = len(r.dry_run)
    admitted = sum(1 for g in r.dry_run if not g.admission_waits and not g.queued_ahead)
    unplaced = sum(1 for g in r.dry_run if g.waits)
    print(f"dry run: the spec is valid; nothing was created. {admitted} of {n} gang(s) would be admitted by "
          f"the pool now, {n - unplaced} of {n} would find hosts free now")
    stuck = [g.index for g in r.dry_run if g.admission_waits and not g.waits]
    if stuck:  # free hosts are not enough: created now, these would wait in the queue all the same
        print(f"gang(s) {', '.join(map(str, stuck))} would find hosts free but wait for admission (see ADMISSION)")
    rows = [[g.index, _instances(g.instances), ",".join(dict.fromkeys(g.hosts)) if g.hosts else "-",
             _admission(g), "placed" if not g.waits else f"waits: {g.waits}"] for g in r.dry_run]
    print(render.table(rows, ["GANG", "INSTANCES", "HOSTS", "ADMISSION", "PLACEMENT"]))
    return 0


def _admission(g: job_pb2.GangPreview) -> str:
    """Whether its pool would admit the gang now; the reason without the prefix the column already says."""
    if g.admission_waits:
        behind = f" (behind {g.queued_ahead} waiting gang(s))" if g.queued_ahead else ""
        return "would wait: " + g.admission_waits.removeprefix("waiting for admission: ") + behind
    if g.queued_ahead:  # the pool's limits and entitlement admit it, but gangs queued before it go first
        return f"would queue behind {g.queued_ahead} waiting gang(s) of its pool, within its limits and entitlement"
    if g.borrows:
        return "would be admitted now, borrowing beyond its pool's entitlement (taken back by preemption if needed)"
    return "would be admitted now"


def _instances(xs: Any) -> str:
    xs = list(xs)
    if len(xs) > 2 and xs == list(range(xs[0], xs[-1] + 1)):
        return f"{xs[0]}-{xs[-1]}"
    return ",".join(map(str, xs))


def _read_spec(path: str) -> job_pb2.JobSpec:
    """The spec in `path` (`-`: stdin), read up to limits.MAX_SPEC_FILE_BYTES and no further: /dev/zero or a pipe
    without end is refused once that much has come, naming the file."""
    from peloton.api.specfile import parse_spec
    from peloton.domain import limits
    from peloton.files import read_bounded, refuse_larger

    most = limits.MAX_SPEC_FILE_BYTES
    try:
        if path == "-":  # bytes where there are (a test's stdin may be text): decoded as a file is
            stdin = getattr(sys.stdin, "buffer", None)
            raw: bytes | str = stdin.read(most + 1) if stdin is not None else sys.stdin.read(most + 1)
            refuse_larger(raw, most, path, "a spec file")
        else:
            raw = read_bounded(path, most, path, "a spec file")
    except OSError as e:
        raise InvalidArgument(f"-f: cannot read {path}: {e.strerror}") from None
    try:
        text = raw if isinstance(raw, str) else raw.decode("utf-8")
    except UnicodeDecodeError as e:  # once a traceback (a file) or "not valid YAML: syntax error" (stdin)
        raise InvalidArgument(f"{path}: not UTF-8 text (at byte {e.start + 1})", field=path) from None
    return parse_spec(text, source=path)


def cmd_job_plan(c: Client, a: argparse.Namespace) -> int:
    """The plans the cost model rates best for a model-aware spec on the cluster now; nothing is created."""
    spec = _read_spec(a.file)
    r = c.call(c.jobs.PlanJob, job_pb2.PlanJobRequest(spec=spec, top=a.top))
    if a.output in render.DOCUMENTS:
        print(render.dumps(render.to_dict(r)))
        return 0
    if not r.plans:
        print("no plan fits this cluster, even with every host free")
        return 1
    where = "on the hosts' free GPUs now" if r.on_free_hosts else "nothing fits now: on every host as if free"
    what = (f"Plans (instances: auto chooses {r.instances} workers)" if spec.model.auto_instances
            else f"Plans for {r.instances} workers")
    print(f"{what}, best first ({where}):")
    rows = []
    for i, p in enumerate(r.plans, 1):
        hosts = ", ".join(f"{h}:{g}" for h, g in zip(p.hosts, p.gpus_per_host, strict=False))
        rows.append([i, ",".join(map(str, p.gpus_per_host)), f"{p.step_time:.3f}", f"{p.samples_per_s:.1f}",
                     f"{p.local_bsz:g}", hosts + (f"; servers {','.join(p.servers)}" if p.servers else "")])
    print(render.table(rows, ["#", "GPUS/HOST", "STEP_S", "SAMPLES/S", "LOCAL_BSZ", "HOSTS"]))
    return 0


def fetch_job(c: Client, job_id: str) -> tuple[job_pb2.Job, list[task_pb2.TaskInfo]]:
    """The job and every task of it (following the pages). The two calls go out together, so the daemon may answer
    the tasks from before a commit and the job from after it: a job that has ended with a task still shown running
    (the last view of `job get --watch`) has its tasks read again, after the job, which they then are not older than."""
    from peloton.api.v1 import task_pb2

    pending = c.jobs.GetJob.future(job_pb2.GetJobRequest(job_id=job_id), timeout=c.timeout)
    first = c.tasks.ListTasks.future(task_pb2.ListTasksRequest(job_id=job_id), timeout=c.timeout)
    try:
        job = _result(c, pending).job
        page = _result(c, first)
    finally:
        pending.cancel()
        first.cancel()
    tasks = _all_tasks(c, job_id, page)
    if job.status.state in render.JOB_TERMINAL and any(t.state not in render.TASK_TERMINAL for t in tasks):
        tasks = _all_tasks(c, job_id, c.call(c.tasks.ListTasks, task_pb2.ListTasksRequest(job_id=job_id)))
    return job, tasks


def _all_tasks(c: Client, job_id: str, page: Any) -> list[task_pb2.TaskInfo]:
    """The tasks of `page` and of the pages after it."""
    from peloton.api.v1 import task_pb2

    tasks = list(page.tasks)
    while page.next_page_token:
        page = c.call(c.tasks.ListTasks, task_pb2.ListTasksRequest(job_id=job_id, page_token=page.next_page_token))
        tasks += page.tasks
    return tasks


def _result(c: Client, future: Any) -> Any:
    from peloton.cli.transport import RpcError

    try:
        return future.result()
    except RpcError as e:
        raise c.error(e) from None


def cmd_job_get(c: Client, a: argparse.Namespace) -> int:
    if a.watch:
        return _watch_job(c, a)
    job, tasks = fetch_job(c, a.job_id)
    _show(a, job, tasks, None)
    return 0


def _show(a: argparse.Namespace, job: job_pb2.Job, tasks: list[task_pb2.TaskInfo], previous: bytes | None
          ) -> bytes:
    """Print the view (once more, under --watch: after a clear-screen on a terminal, else after a blank line), unless
    nothing in it changed since `previous`. Returns what it showed, for the next comparison."""
    key = b"\0".join([job.SerializeToString(deterministic=True)]
                     + [t.SerializeToString(deterministic=True) for t in tasks])
    if key == previous:
        return key
    if a.output in render.DOCUMENTS:
        doc = render.job_json(job, tasks)
        print(render.dumps(doc, compact=True) if a.watch else render.dumps(doc), flush=True)
        return key
    view = render.job_view(job, tasks, every_row=a.every_row)  # --all: a row per task
    if a.watch and sys.stdout.isatty():
        print(CLEAR_SCREEN + view + f"\n\n(watching; updated {time.strftime('%H:%M:%S')}; Ctrl-C to stop)",
              flush=True)
    else:
        print(("\n" if previous is not None else "") + view, flush=True)
    return key


def _watch_job(c: Client, a: argparse.Namespace) -> int:
    """`job get --watch`: the view again whenever the job or one of its tasks changes, until the job ends. Each
    change (a burst of them comes in one message) makes it fetch the whole view again: simple, and right however
    much changed. A daemon away (a restart) is waited for, as `job wait` does."""
    from peloton.cli.reconnect import Reconnect

    reconnect = Reconnect(c.address, a.reconnect_grace)
    while True:
        try:
            job, tasks = fetch_job(c, a.job_id)
            break
        except Unavailable as e:
            reconnect.failed(e.message)
    reconnect.ok()
    shown = _show(a, job, tasks, None)
    if job.status.state in render.JOB_TERMINAL:
        return 0
    stale = False
    for resp in c.watch_jobs([a.job_id], True, reconnect):
        if any(ch.job_id == a.job_id and ch.deleted for ch in resp.changes):
            print(f"peloton: job {a.job_id} was deleted", file=sys.stderr)
            return EXIT_ERROR
        if resp.more:
            continue  # the rest of this revision follows: the view is fetched again once it is whole
        if not (resp.changes or resp.snapshot or stale):
            continue  # a heartbeat
        try:
            job, tasks = fetch_job(c, a.job_id)
        except Unavailable:  # the stream is back but the daemon is not ready: again at the next message
            stale = True
            continue
        except NotFound:
            print(f"peloton: job {a.job_id} was deleted", file=sys.stderr)
            return EXIT_ERROR
        stale = False
        shown = _show(a, job, tasks, shown)
        if job.status.state in render.JOB_TERMINAL:
            return 0
    return 0  # not reached: the watch ends only by raising


def job_states(values: list[str] | None, flag: str = "--state") -> list[str]:
    """`--state` values (repeated or comma-separated, any case) as the daemon's state names; an unknown one is a
    usage error naming the flag and listing the states."""
    from peloton.domain.states import JobState

    known = [s.value for s in JobState]
    out: list[str] = []
    for value in values or []:
        for part in value.split(","):
            state = part.strip().upper()
            if state not in known:
                raise InvalidArgument(f"{flag}: unknown job state {part.strip()!r} (valid: {', '.join(known)})",
                                      field=flag)
            if state not in out:
                out.append(state)
    return out


def list_jobs(c: Client, states: list[str], owner: str, respool: str, limit: int) -> list[job_pb2.Job]:
    """The jobs matching the filters, newest first, at most `limit` (0: all), a page of up to 1000 at a time."""
    jobs: list[job_pb2.Job] = []
    token = ""
    while not limit or len(jobs) < limit:
        size = 1000 if not limit else min(1000, limit - len(jobs))
        page = c.call(c.jobs.ListJobs, job_pb2.ListJobsRequest(
            states=states, owner=owner, respool=respool, page_size=size, page_token=token))
        jobs.extend(page.jobs)
        token = page.next_page_token
        if not token:
            break
    return jobs


def cmd_job_list(c: Client, a: argparse.Namespace) -> int:
    if a.limit < 0:
        raise InvalidArgument(f"--limit: must not be negative, got {a.limit}")
    states = job_states(a.state)
    if a.respool:
        from peloton.domain.spec import validate_pool_path

        validate_pool_path(a.respool, "--respool")
    r = job_pb2.ListJobsResponse(jobs=list_jobs(c, states, a.owner or "", a.respool or "", a.limit))
    if a.quiet:
        print("\n".join(j.id for j in r.jobs) if r.jobs else "", end="\n" if r.jobs else "")
        return 0
    if a.output in render.DOCUMENTS:
        print(render.json_list("jobs", r.jobs))
        return 0
    wide = a.output == "wide"  # and: priority, when it last changed, the reason of its state, who it runs as
    rows = []
    for j in r.jobs:
        counts = ", ".join(f"{k.lower()}={v}" for k, v in sorted(j.status.task_states.items()))
        rows.append([j.id, j.spec.name, j.status.state, j.spec.instances, j.spec.owner or "-", j.spec.respool,
                     render.ago(j.status.created_at), counts,
                     *([j.spec.sla.priority, render.ago(j.status.updated_at), j.status.run_as or "-",
                        j.status.reason or "-"] if wide else [])])
    print(render.table(rows, ["ID", "NAME", "STATE", "INSTANCES", "OWNER", "POOL", "CREATED", "TASKS",
                              *(["PRIORITY", "UPDATED", "RUNS AS", "REASON"] if wide else [])]))
    return 0


def cmd_job_stop(c: Client, a: argparse.Namespace) -> int:
    """Stop the jobs named, or those a selection (--owner, --state, --pool) matches once confirmed. A job that has
    finished is left alone (said so). Exit 0 when every job is stopped or had finished; 1 when any could not be
    (unknown, refused: each said on its own line, the others still stopped); 2 for usage errors, before any."""
    selection = {flag: value for flag, value in (("--owner", a.owner), ("--state", a.state), ("--pool", a.pool))
                 if value}
    if a.job_ids and selection:
        raise InvalidArgument(f"{', '.join(selection)}: give job ids or a selection, not both", field="job_ids")
    if not a.job_ids and not selection:
        raise InvalidArgument("job_ids: give one or more job ids, or a selection: --owner, --state, --pool",
                              field="job_ids")
    if selection:
        return _stop_selected(c, a)
    failed = 0
    results: list[dict[str, Any]] = []  # `-o json|yaml`: what became of each job
    for job_id in dict.fromkeys(a.job_ids):  # each once, in the order given
        try:
            state = c.call(c.jobs.GetJob, job_pb2.GetJobRequest(job_id=job_id)).job.status.state
            if state in render.JOB_TERMINAL:
                print(f"job {job_id} has already finished ({state}); nothing to stop", file=sys.stderr)
                results.append({"job_id": job_id, "result": "finished", "state": state, "error": None})
                continue
            c.call(c.jobs.StopJob, job_pb2.StopJobRequest(job_id=job_id))
        except Unavailable:
            raise  # the daemon is away: the rest would fail the same way
        except PelotonError as e:
            print(f"peloton: error: {e.message}", file=sys.stderr)
            results.append({"job_id": job_id, "result": "failed", "state": None, "error": e.message})
            failed += 1
            continue
        print(f"stopping job {job_id}", file=sys.stderr)
        results.append({"job_id": job_id, "result": "stopping", "state": state, "error": None})
    render.done(a, {"jobs": results})
    return EXIT_ERROR if failed else 0


def _stop_selected(c: Client, a: argparse.Namespace) -> int:
    """`job stop --owner/--state/--pool`: list the matching jobs, ask (or --yes), stop them."""
    # without --state every job matching is listed and the finished ones are skipped below: naming the unfinished
    # states would fail against a daemon that knows fewer of them (an older release)
    states = job_states(a.state)
    if a.pool:
        from peloton.domain.spec import validate_pool_path

        validate_pool_path(a.pool, "--pool")
    jobs = list_jobs(c, states, a.owner or "", a.pool or "", 0)
    what = " ".join(f"{flag} {value if isinstance(value, str) else ','.join(value)}"
                    for flag, value in (("--owner", a.owner), ("--state", a.state), ("--pool", a.pool)) if value)
    finished = [j for j in jobs if j.status.state in render.JOB_TERMINAL]
    jobs = [j for j in jobs if j.status.state not in render.JOB_TERMINAL]
    if finished and a.state:  # asked for by state: say why they are left alone
        print(f"peloton: {len(finished)} job(s) matching {what} have already finished; nothing to stop in them",
              file=sys.stderr)
    if not jobs:
        print(f"peloton: no unfinished job matches {what}", file=sys.stderr)
        return 0
    rows = [[j.id, j.spec.name, j.status.state, j.spec.owner or "-", j.spec.respool, render.ago(j.status.created_at)]
            for j in jobs]
    print(render.table(rows, ["ID", "NAME", "STATE", "OWNER", "POOL", "CREATED"]), file=sys.stderr)
    if not a.yes:
        if not sys.stdin.isatty():
            raise InvalidArgument(f"--yes: {len(jobs)} job(s) match {what}; stdin is not a terminal to confirm "
                                  "on: add --yes (-y) to stop them", field="--yes")
        print(f"stop these {len(jobs)} job(s)? [y/N] ", end="", file=sys.stderr, flush=True)
        answer = sys.stdin.readline().strip().lower()
        if answer not in ("y", "yes"):
            print("peloton: nothing stopped", file=sys.stderr)
            return EXIT_ERROR
    failed = 0
    results: list[dict[str, Any]] = []
    for j in jobs:
        try:
            c.call(c.jobs.StopJob, job_pb2.StopJobRequest(job_id=j.id))
        except Unavailable:
            raise
        except PelotonError as e:
            print(f"peloton: error: {e.message}", file=sys.stderr)
            results.append({"job_id": j.id, "result": "failed", "state": j.status.state, "error": e.message})
            failed += 1
            continue
        print(f"stopping job {j.id}", file=sys.stderr)
        results.append({"job_id": j.id, "result": "stopping", "state": j.status.state, "error": None})
    render.done(a, {"jobs": results})
    return EXIT_ERROR if failed else 0


def cmd_job_delete(c: Client, a: argparse.Namespace) -> int:
    c.call(c.jobs.DeleteJob, job_pb2.DeleteJobRequest(job_id=a.job_id))
    print(f"deleted job {a.job_id}", file=sys.stderr)
    render.done(a, {"job_id": a.job_id, "deleted": True})
    return 0


def cmd_job_wait(c: Client, a: argparse.Namespace) -> int:
    """Exit 0 only when the job SUCCEEDED; 1 when it ended otherwise; 124 on timeout; 69 when the daemon stayed
    unreachable for the grace period; 130 on Ctrl-C. Each of these prints the document (`-o json|yaml`)."""
    from peloton.cli.reconnect import DaemonUnreachable, Reconnect, WatchTimeout

    if a.wait_timeout < 0:
        raise InvalidArgument(f"--timeout: must not be negative, got {a.wait_timeout:g}")
    deadline = time.monotonic() + a.wait_timeout if a.wait_timeout else None
    seen: list[str] = []
    try:
        code = _wait(c, a.job_id, Reconnect(c.address, a.reconnect_grace, deadline), deadline, seen)
    except WatchTimeout:
        print(f"peloton: timed out after {a.wait_timeout:g}s waiting for job {a.job_id}"
              + (f" (state {seen[-1]})" if seen else ""), file=sys.stderr)
        code = EXIT_TIMEOUT
    except DaemonUnreachable as e:  # caught here, not in main, so that the document keeps the states seen
        print(f"peloton: error: {e.message}", file=sys.stderr)
        code = EXIT_UNAVAILABLE
    except KeyboardInterrupt:  # quietly, as main would, but with the document
        code = EXIT_INTERRUPTED
    render.done(a, {"job_id": a.job_id, "state": seen[-1] if seen else None, "states": seen,
                    "timed_out": code == EXIT_TIMEOUT, "unreachable": code == EXIT_UNAVAILABLE,
                    "interrupted": code == EXIT_INTERRUPTED, "succeeded": code == 0})
    return code


def _wait(c: Client, job_id: str, reconnect: Reconnect, deadline: float | None, seen: list[str]) -> int:
    """Print each state the job goes through (into `seen` too) until it ends; its exit code."""
    for resp in c.watch_jobs([job_id], False, reconnect, deadline):
        for ch in resp.changes:
            if ch.job_id != job_id:
                continue
            if ch.deleted:
                if not seen:
                    raise NotFound(f"job {job_id!r} not found")
                print(f"{job_id}: deleted before its end was seen (last state {seen[-1]})", file=sys.stderr)
                return EXIT_ERROR
            if not seen or ch.state != seen[-1]:
                print(f"{job_id}: {ch.state}", file=sys.stderr, flush=True)
                seen.append(ch.state)
            if ch.state in render.JOB_TERMINAL:
                if ch.state != "SUCCEEDED" and ch.reason:
                    print(f"{job_id}: {ch.reason}", file=sys.stderr)
                return 0 if ch.state == "SUCCEEDED" else EXIT_ERROR
    return EXIT_ERROR  # not reached: the watch ends only by raising
