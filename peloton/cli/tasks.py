"""`peloton task ...`: list, get, logs (-f)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from peloton.api.v1 import task_pb2
from peloton.cli import render
from peloton.errors import FailedPrecondition, InvalidArgument, NotFound, Unavailable

if TYPE_CHECKING:
    from peloton.cli.client import Client
    from peloton.cli.reconnect import Reconnect

FOLLOW_INTERVAL_S = 0.5  # between reads of a log that did not grow
# states of an attempt whose process has not started (yet): no log to read, or no sandbox to read it from
NOT_STARTED = frozenset({"INITIALIZED", "PENDING", "READY", "PLACING", "PLACED", "LAUNCHING", "LAUNCHED", "STARTING"})


def all_tasks(c: Client, job_id: str) -> list[task_pb2.TaskInfo]:
    """Every task of a job, following the pages."""
    out: list[task_pb2.TaskInfo] = []
    token = ""
    while True:
        r = c.call(c.tasks.ListTasks, task_pb2.ListTasksRequest(job_id=job_id, page_token=token))
        out += r.tasks
        token = r.next_page_token
        if not token:
            return out


def cmd_task_list(c: Client, a: argparse.Namespace) -> int:
    tasks = all_tasks(c, a.job_id)
    if a.output in render.DOCUMENTS:
        print(render.json_list("tasks", tasks))
        return 0
    with_roles = any(t.role for t in tasks)  # a job with roles: ROLE is the role and the rank in it (worker/3)
    wide = a.output == "wide"  # and: the gang, the address, when it started and finished
    rows = [[t.instance, *([render.role_cell(t)] if with_roles else []), t.task_id, t.state, t.host or "-",
             ",".join(map(str, t.ports)) or "-", ",".join(map(str, t.gpus)) or "-",
             t.exit_code if t.HasField("exit_code") else "-",
             *([t.gang_index, t.address or "-", render.ago(t.started_at), render.ago(t.finished_at)] if wide else []),
             t.message or t.reason] for t in tasks]
    print(render.table(rows, ["INSTANCE", *(["ROLE"] if with_roles else []), "TASK ID", "STATE", "HOST", "PORTS",
                              "GPUS", "EXIT", *(["GANG", "ADDRESS", "STARTED", "FINISHED"] if wide else []),
                              "MESSAGE"]))
    return 0


def cmd_task_get(c: Client, a: argparse.Namespace) -> int:
    t = c.call(c.tasks.GetTask, task_pb2.GetTaskRequest(job_id=a.job_id, instance=a.instance)).task
    if a.output in render.DOCUMENTS:
        print(render.json_message(t))
        return 0
    print(f"Task:   {t.task_id}  state {t.state}  host {t.host or '-'}  attempt {t.attempt}")
    rows = [[e.attempt, e.state, time.strftime("%H:%M:%S", time.localtime(e.time)), e.host or "-",
             e.exit_code if e.HasField("exit_code") else "-", render.detail(e.reason, e.message)] for e in t.events]
    print(render.table(rows, ["ATTEMPT", "STATE", "TIME", "HOST", "EXIT", "DETAIL"]))
    if t.events_total > len(t.events):
        print(f"(the newest {len(t.events)} of {t.events_total} events)")
    return 0


Read = Callable[[task_pb2.GetTaskLogsRequest], task_pb2.GetTaskLogsResponse]
LOG_PAGE = 1 << 20  # the most the daemon returns a call (jobmgr.service.MAX_LOG_TAIL)
TAIL_CHUNK = 64 << 10  # --tail: the first read back from a log's end; then more, doubling, until it has the lines


def cmd_task_logs(c: Client, a: argparse.Namespace) -> int:
    _check_tail(a.tail)
    req = task_pb2.GetTaskLogsRequest(job_id=a.job_id, instance=a.instance, attempt=a.attempt,
                                      stream="stderr" if a.stderr else "stdout")
    if not a.follow:
        write_log(lambda r: c.call(c.tasks.GetTaskLogs, r), req, a.tail, _write)
        return 0
    from peloton.cli.reconnect import Reconnect

    follow_log(lambda r: c.call(c.tasks.GetTaskLogs, r), req, Reconnect(c.address, a.reconnect_grace),
               lambda: c.call(c.tasks.GetTask, task_pb2.GetTaskRequest(job_id=a.job_id, instance=a.instance)).task,
               tail=a.tail)
    return 0


def _check_tail(tail: int | None) -> None:
    if tail is not None and tail < 1:
        raise InvalidArgument(f"--tail: must be at least 1 line, got {tail}", field="--tail")


def _write(data: bytes) -> None:
    if data:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()


def last_lines(data: bytes, n: int, whole: bool) -> bytes | None:
    """The last `n` lines of `data` (an unfinished last line counts as one), never part of a line; None when
    `data` does not reach back far enough to tell (more must be read from before it), unless `whole` (it is all
    there is: then fewer lines are all of it)."""
    body = data[:-1] if data.endswith(b"\n") else data
    cut = len(body)
    for _ in range(n):
        cut = body.rfind(b"\n", 0, cut)
        if cut < 0:
            return data if whole else None
    return data[cut + 1:]


def write_log(read: Read, req: task_pb2.GetTaskLogsRequest, tail: int | None, write: Callable[[bytes], None],
              first: Read | None = None) -> tuple[int, str]:
    """Write the log as it is now: all of it that is kept (`tail` None), or its last `tail` lines, read back from
    the end in growing pieces (the API reads bytes). Pins `req.attempt` to the attempt read. Returns the offset
    where the log goes on and the attempt's state at the first read (`first` makes that read: -f waits there for a
    task to start)."""
    req.ClearField("offset")
    req.tail_bytes = LOG_PAGE if tail is None else TAIL_CHUNK
    r = (first or read)(req)
    req.attempt = int(r.task_id.rsplit("-", 1)[1])  # the attempt read, even once a newer one starts
    end = r.next_offset
    start = end - len(r.content)  # of what we hold; the log's kept bytes may begin later than 0 (rotation)
    at_start = start == 0 or len(r.content) < req.tail_bytes
    if tail is None:
        off = 0
        while not at_start and off < start:  # a log longer than a page: from its oldest kept byte, page by page
            req.offset, req.tail_bytes = off, min(LOG_PAGE, start - off)
            p = read(req)
            got = p.next_offset - len(p.content)
            piece = p.content[:max(0, start - got)]
            if not piece:
                break
            write(piece)
            off = got + len(piece)
        write(r.content)
        return end, r.task_state
    data = r.content
    while (lines := last_lines(data, tail, at_start)) is None:
        want = min(LOG_PAGE, max(TAIL_CHUNK, len(data)))  # twice what is held each time: few calls for long lines
        off = max(0, start - want)
        req.offset, req.tail_bytes = off, start - off
        p = read(req)
        got = p.next_offset - len(p.content)  # later than `off` when the older bytes were rotated away
        piece = p.content[:max(0, start - got)]
        at_start = off == 0 or got > off or not piece
        data = piece + data
        start -= len(piece)
    write(lines)
    return end, r.task_state


def follow_log(read: Read, req: task_pb2.GetTaskLogsRequest, reconnect: Reconnect,
               get_task: Callable[[], task_pb2.TaskInfo], write: Callable[[bytes], None] = _write,
               sleep: Callable[[float], None] = time.sleep, tail: int | None = None) -> None:
    """`task logs -f`: the log so far (all of it, or the last `tail` lines), then what is appended, read from the
    offset reached every FOLLOW_INTERVAL_S (at once while it grows), until the attempt has ended and its log is
    read to the end. Follows the attempt it started on (a gang restart starts another). An attempt not launched
    yet is waited for; a daemon away for a while (a restart) is waited for up to the grace period of
    `reconnect`."""
    again = _retrying(read, reconnect)
    offset, state = write_log(again, req, tail, write,
                              first=lambda r: _first_read(read, r, reconnect, get_task, sleep))
    req.offset, req.tail_bytes = offset, 0
    ended = state in render.TASK_TERMINAL  # the state is read before the content: the content is all
    while not ended:
        r = again(req)
        write(r.content)
        req.offset = r.next_offset
        ended = r.task_state in render.TASK_TERMINAL and not r.content
        if not r.content and not ended:
            sleep(FOLLOW_INTERVAL_S)


def _retrying(read: Read, reconnect: Reconnect) -> Read:
    """`read`, tried again (backing off) while the daemon is unavailable, up to the grace period."""
    def again(req: task_pb2.GetTaskLogsRequest) -> task_pb2.GetTaskLogsResponse:
        while True:
            try:
                r = read(req)
            except Unavailable as e:
                reconnect.failed(e.message)
                continue
            reconnect.ok()
            return r

    return again


def _first_read(read: Callable[[task_pb2.GetTaskLogsRequest], task_pb2.GetTaskLogsResponse],
                req: task_pb2.GetTaskLogsRequest, reconnect: Reconnect, get_task: Callable[[], task_pb2.TaskInfo],
                sleep: Callable[[float], None]) -> task_pb2.GetTaskLogsResponse:
    told = False
    while True:
        try:
            r = read(req)
            reconnect.ok()
            return r
        except Unavailable as e:
            reconnect.failed(e.message)
            continue
        except (FailedPrecondition, NotFound) as e:
            # not launched yet (or its sandbox not there yet)? Then wait for it, unless it never will be
            err = e
        try:
            t = get_task()  # a job or instance that does not exist: NotFound from here
        except Unavailable as e:
            reconnect.failed(e.message)
            continue
        # the daemon answered: an absence before this one is over (a later one gets the whole grace period)
        reconnect.ok()
        if t.state not in NOT_STARTED or (req.attempt and req.attempt != t.attempt):
            raise err
        if not told:
            print(f"peloton: waiting for {t.task_id} to start (state {t.state})", file=sys.stderr, flush=True)
            told = True
        sleep(FOLLOW_INTERVAL_S)


class _Prefixed:
    """A member's log, each line prefixed with its instance (`[3] ...`); a line is written once it is whole (or at
    the end of its attempt), so that members' lines never mix within a line."""

    def __init__(self, instance: int, write: Callable[[bytes], None]) -> None:
        self.prefix = f"[{instance}] ".encode()
        self._write = write
        self.partial = b""

    def write(self, data: bytes) -> None:
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()
        if lines:
            self._write(b"".join(self.prefix + line + b"\n" for line in lines))

    def end(self) -> None:
        """The attempt's log is over: its last line, if it had no newline."""
        if self.partial:
            self._write(self.prefix + self.partial + b"\n")
            self.partial = b""


class _Member:
    """`job logs -f`: where the log of one member is followed."""

    def __init__(self, instance: int, attempt: int, out: _Prefixed) -> None:
        self.instance, self.attempt, self.out = instance, attempt, out
        self.offset: int | None = None  # None: not read yet (not started, or a new attempt)
        self.done = False  # its attempt ended and its log is read to the end


def cmd_job_logs(c: Client, a: argparse.Namespace) -> int:
    """Every member's log with its instance before each line: member after member, or with -f as the lines come,
    until the job ends."""
    _check_tail(a.tail)
    stream = "stderr" if a.stderr else "stdout"
    if a.follow:
        return _follow_job_logs(c, a, stream)
    for t in all_tasks(c, a.job_id):
        out = _Prefixed(t.instance, _write)
        req = task_pb2.GetTaskLogsRequest(job_id=a.job_id, instance=t.instance, stream=stream)
        try:
            write_log(lambda r: c.call(c.tasks.GetTaskLogs, r), req, a.tail, out.write)
        except (FailedPrecondition, NotFound) as e:  # not started, or its sandbox gone: the others still
            print(f"peloton: [{t.instance}] no log: {e.message}", file=sys.stderr)
        out.end()
    return 0


def _read_to_end(read: Read, req: task_pb2.GetTaskLogsRequest, m: _Member) -> None:
    """The rest of the log of `m`'s attempt (one that has ended: a gang restart started the next), from where it
    got to."""
    assert m.offset is not None
    while True:
        req.offset, req.tail_bytes = m.offset, 0
        r = read(req)
        m.out.write(r.content)
        m.offset = r.next_offset
        if not r.content:
            m.done = True
            return


def _follow_job_logs(c: Client, a: argparse.Namespace, stream: str, sleep: Callable[[float], None] = time.sleep,
                     refresh_s: float = 2.0) -> int:
    """`job logs -f`: reads each member's log in turn from where it got to; between rounds that found nothing new
    (and every `refresh_s`), asks for the job's state and tasks: a member's new attempt (a gang restart) is
    followed from its start, and the job's end ends the command once every log is read to its end."""
    from peloton.api.v1 import job_pb2
    from peloton.cli.reconnect import Reconnect

    reconnect = Reconnect(c.address, a.reconnect_grace)
    read = _retrying(lambda r: c.call(c.tasks.GetTaskLogs, r), reconnect)

    def refresh() -> tuple[str, list[task_pb2.TaskInfo]]:
        while True:
            try:
                state = c.call(c.jobs.GetJob, job_pb2.GetJobRequest(job_id=a.job_id)).job.status.state
                tasks = all_tasks(c, a.job_id)
            except Unavailable as e:
                reconnect.failed(e.message)
                continue
            reconnect.ok()
            return state, tasks

    state, tasks = refresh()
    members = {t.instance: _Member(t.instance, t.attempt, _Prefixed(t.instance, _write)) for t in tasks}
    first = set(members)  # members whose first attempt read gets --tail; a later attempt is shown whole
    refreshed = time.monotonic()
    while True:
        ended = state in render.JOB_TERMINAL
        progressed = False
        for m in members.values():
            if m.done:
                continue
            req = task_pb2.GetTaskLogsRequest(job_id=a.job_id, instance=m.instance, attempt=m.attempt, stream=stream)
            if m.offset is None:
                try:
                    m.offset, _ = write_log(read, req, a.tail if m.instance in first else None, m.out.write)
                except (FailedPrecondition, NotFound):
                    if ended:  # never started, and never will
                        m.done = True
                    continue  # not launched yet: tried again next round
                first.discard(m.instance)
                progressed = True
            # from where it got to; once the job has ended, to the end of every log
            while True:
                req.offset, req.tail_bytes = m.offset, 0
                r = read(req)
                m.out.write(r.content)
                m.offset = r.next_offset
                progressed = progressed or bool(r.content)
                if not r.content and r.task_state in render.TASK_TERMINAL:
                    m.done = True
                    m.out.end()
                if not (ended and r.content):
                    break
        if ended:
            return 0
        if not progressed or time.monotonic() - refreshed > refresh_s:
            state, tasks = refresh()
            refreshed = time.monotonic()
            for t in tasks:
                m = members[t.instance]
                if t.attempt > m.attempt:  # a gang restart: the new attempt, from its start
                    if m.offset is not None and not m.done:  # what the old one wrote since the last read, first
                        try:
                            _read_to_end(read, task_pb2.GetTaskLogsRequest(
                                job_id=a.job_id, instance=m.instance, attempt=m.attempt, stream=stream), m)
                        except (FailedPrecondition, NotFound):  # its sandbox gone already: the new one still
                            pass
                    m.out.end()
                    print(f"peloton: [{t.instance}] attempt {t.attempt} ({t.task_id})", file=sys.stderr, flush=True)
                    members[t.instance] = _Member(t.instance, t.attempt, m.out)
            if not progressed and state not in render.JOB_TERMINAL:
                sleep(FOLLOW_INTERVAL_S)
