"""`peloton task ...`: list, get, logs (-f)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from peloton.api.v1 import task_pb2
from peloton.cli import render
from peloton.errors import FailedPrecondition, NotFound, Unavailable

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
    if a.output == "json":
        print(render.json_list("tasks", tasks))
        return 0
    rows = [[t.instance, t.task_id, t.state, t.host or "-", ",".join(map(str, t.ports)) or "-",
             ",".join(map(str, t.gpus)) or "-", t.exit_code if t.HasField("exit_code") else "-",
             t.message or t.reason] for t in tasks]
    print(render.table(rows, ["INSTANCE", "TASK ID", "STATE", "HOST", "PORTS", "GPUS", "EXIT", "MESSAGE"]))
    return 0


def cmd_task_get(c: Client, a: argparse.Namespace) -> int:
    t = c.call(c.tasks.GetTask, task_pb2.GetTaskRequest(job_id=a.job_id, instance=a.instance)).task
    if a.output == "json":
        print(render.json_message(t))
        return 0
    print(f"Task:   {t.task_id}  state {t.state}  host {t.host or '-'}  attempt {t.attempt}")
    rows = [[e.attempt, e.state, time.strftime("%H:%M:%S", time.localtime(e.time)), e.host or "-",
             e.exit_code if e.HasField("exit_code") else "-", (e.reason + (": " if e.reason and e.message else "")
                                                            + e.message)] for e in t.events]
    print(render.table(rows, ["ATTEMPT", "STATE", "TIME", "HOST", "EXIT", "DETAIL"]))
    if t.events_total > len(t.events):
        print(f"(the newest {len(t.events)} of {t.events_total} events)")
    return 0


def cmd_task_logs(c: Client, a: argparse.Namespace) -> int:
    req = task_pb2.GetTaskLogsRequest(job_id=a.job_id, instance=a.instance, attempt=a.attempt,
                                      stream="stderr" if a.stderr else "stdout", tail_bytes=a.tail)
    if not a.follow:
        _write(c.call(c.tasks.GetTaskLogs, req).content)
        return 0
    from peloton.cli.reconnect import Reconnect

    follow_log(lambda r: c.call(c.tasks.GetTaskLogs, r), req, Reconnect(c.address, a.reconnect_grace),
               lambda: c.call(c.tasks.GetTask, task_pb2.GetTaskRequest(job_id=a.job_id, instance=a.instance)).task)
    return 0


def _write(data: bytes) -> None:
    if data:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()


def follow_log(read: Callable[[task_pb2.GetTaskLogsRequest], task_pb2.GetTaskLogsResponse],
               req: task_pb2.GetTaskLogsRequest, reconnect: Reconnect, get_task: Callable[[], task_pb2.TaskInfo],
               write: Callable[[bytes], None] = _write, sleep: Callable[[float], None] = time.sleep) -> None:
    """`task logs -f`: the log so far (the last `tail_bytes`), then what is appended, read from the offset reached
    every FOLLOW_INTERVAL_S (at once while it grows), until the attempt has ended and its log is read to the end.
    Follows the attempt it started on (a gang restart starts another). An attempt not launched yet is waited for;
    a daemon away for a while (a restart) is waited for up to the grace period of `reconnect`."""
    r = _first_read(read, req, reconnect, get_task, sleep)
    write(r.content)
    req.attempt = int(r.task_id.rsplit("-", 1)[1])  # the attempt now followed, even once a newer one starts
    req.offset = r.next_offset
    ended = r.task_state in render.TASK_TERMINAL  # the state is read before the content: the content is all
    while not ended:
        try:
            r = read(req)
        except Unavailable as e:
            reconnect.failed(e.message)
            continue
        reconnect.ok()
        write(r.content)
        req.offset = r.next_offset
        ended = r.task_state in render.TASK_TERMINAL and not r.content
        if not r.content and not ended:
            sleep(FOLLOW_INTERVAL_S)


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
        if t.state not in NOT_STARTED or (req.attempt and req.attempt != t.attempt):
            raise err
        if not told:
            print(f"peloton: waiting for {t.task_id} to start (state {t.state})", file=sys.stderr, flush=True)
            told = True
        sleep(FOLLOW_INTERVAL_S)
