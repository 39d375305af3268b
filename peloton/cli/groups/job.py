"""`peloton job ...`: the parser (the commands are in peloton/cli/jobs.py and tasks.py, imported when they run)."""

from __future__ import annotations

import argparse

from peloton.cli.parser import add_command, grace, int32, output_flag, seconds


def logs_flags(sp: argparse.ArgumentParser, whose: str, follow: str) -> None:
    sp.add_argument("--stderr", action="store_true", help="the stderr log instead of stdout")
    sp.add_argument("--tail", type=int, default=None, metavar="LINES",
                    help=f"only the last LINES lines of {whose}'s log (default: the whole log)")
    sp.add_argument("-f", "--follow", action="store_true", help=follow)
    output_flag(sp, "the log is printed as written: only table (the default) or wide, which print it the same "
                    "(json and yaml are refused: the log is not a record)")


def register(name: str, g: argparse.ArgumentParser) -> None:
    j = g.add_subparsers(dest="cmd", required=True)
    x = j.add_parser("create", help="submit a job spec (YAML); prints the job id")
    x.add_argument("-f", "--file", required=True, help="spec file, or - for stdin")
    x.add_argument("--dry-run", action="store_true",
                   help="have the daemon check and admit the spec and say where its gangs would be placed now; "
                        "nothing is created")
    x.set_defaults(fn="jobs:cmd_job_create")
    x = j.add_parser("plan", help="a model-aware spec's best plans on the cluster now (nothing is created)")
    x.add_argument("-f", "--file", required=True, help="spec file, or - for stdin")
    x.add_argument("--top", type=int32, default=5, help="how many plans (default 5)")
    x.set_defaults(fn="jobs:cmd_job_plan")
    x = add_command(j, "get", help="state, gangs (and why pending), tasks")
    x.add_argument("job_id")
    x.add_argument("-w", "--watch", action="store_true",
                   help="print the view again whenever the job or a task changes, until the job ends")
    x.add_argument("--all", action="store_true", dest="every_row",
                   help="a row per task and a line per gang (by default, past 20 they are grouped by state)")
    grace(x)
    x.set_defaults(fn="jobs:cmd_job_get")
    x = add_command(j, "list", help="list jobs, newest first")
    x.add_argument("--state", action="append", metavar="STATE",
                   help="only jobs in this state (repeatable, or comma-separated; case-insensitive): INITIALIZED, "
                        "PENDING, RUNNING, SUCCEEDED, FAILED, FAILING, KILLING, KILLED")
    x.add_argument("--owner", metavar="OWNER", help="only jobs of this owner (spec field owner)")
    x.add_argument("--respool", "--pool", dest="respool", metavar="POOL",
                   help="only jobs submitted to this pool (its path, e.g. /research; not its subtree)")
    x.add_argument("--limit", type=int, default=100, metavar="N",
                   help="at most this many (default %(default)s; 0: every job)")
    x.add_argument("-q", "--quiet", action="store_true",
                   help="print only the job ids, one a line (for scripts: peloton job stop $(peloton job list -q)); "
                        "an output of its own: not with -o")
    x.set_defaults(fn="jobs:cmd_job_list")
    x = j.add_parser("stop", help="kill every task of the jobs named, or of the unfinished jobs a selection matches "
                                  "(after a confirmation)")
    x.add_argument("job_ids", nargs="*", metavar="JOB_ID", help="the jobs to stop (any number; ids or unique "
                                                                "prefixes)")
    x.add_argument("--owner", metavar="OWNER", help="select the unfinished jobs of this owner")
    x.add_argument("--state", action="append", metavar="STATE",
                   help="select the jobs in this state (repeatable, or comma-separated; default: every unfinished "
                        "state)")
    x.add_argument("--pool", metavar="POOL", help="select the unfinished jobs of this pool (its path)")
    x.add_argument("-y", "--yes", action="store_true",
                   help="stop the jobs a selection matches without asking (needed when stdin is not a terminal)")
    x.set_defaults(fn="jobs:cmd_job_stop")
    x = add_command(j, "delete", help="delete a finished job and its history")
    x.add_argument("job_id")
    x.set_defaults(fn="jobs:cmd_job_delete")
    x = j.add_parser("wait", help="wait for the job to end; exit 0 only if it SUCCEEDED")
    x.add_argument("job_id")
    x.add_argument("--timeout", dest="wait_timeout", type=seconds, default=0, metavar="SECONDS",
                   help="give up after this many seconds with exit code 124 (default 0: wait as long as it runs)")
    grace(x)
    x.set_defaults(fn="jobs:cmd_job_wait")
    x = j.add_parser("logs", help="the logs of every member of the job, each line prefixed with its instance ([0] "
                                  "...)")
    x.add_argument("job_id")
    logs_flags(x, "each member's current attempt", "follow every member (a gang restart's new attempt too) until "
                                                   "the job ends")
    grace(x)
    x.set_defaults(fn="tasks:cmd_job_logs")
