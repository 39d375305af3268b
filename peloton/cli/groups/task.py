"""`peloton task ...`: the parser (the commands are in peloton/cli/tasks.py, imported when they run)."""

from __future__ import annotations

import argparse

from peloton.cli.groups.job import logs_flags
from peloton.cli.parser import add_command, grace, int32


def register(name: str, g: argparse.ArgumentParser) -> None:
    t = g.add_subparsers(dest="cmd", required=True)
    x = add_command(t, "list", help="every task of a job: state, host, ports, GPUs, exit code")
    x.add_argument("job_id")
    x.set_defaults(fn="tasks:cmd_task_list")
    x = add_command(t, "get", help="a task with its event history")
    x.add_argument("job_id")
    x.add_argument("instance", type=int32)
    x.set_defaults(fn="tasks:cmd_task_get")
    x = t.add_parser("logs", help="a task's stdout (or --stderr)")
    x.add_argument("job_id")
    x.add_argument("instance", type=int32)
    x.add_argument("--attempt", type=int32, default=0, metavar="N",
                   help="the attempt (the last number of a task id; default: the current attempt)")
    logs_flags(x, "the attempt", "then print what the task writes, until its attempt ends")
    grace(x)
    x.set_defaults(fn="tasks:cmd_task_logs")
