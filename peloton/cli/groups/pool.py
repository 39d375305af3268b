"""`peloton pool ...` and `peloton queue`: the parsers (the commands are in peloton/cli/admin.py)."""

from __future__ import annotations

import argparse

from peloton.cli.parser import add_command, int32


def register(name: str, g: argparse.ArgumentParser) -> None:
    if name == "queue":
        _queue(g)
        return
    rp = g.add_subparsers(dest="cmd", required=True)
    for verb in ("create", "update"):
        x = rp.add_parser(verb, help="create a pool" if verb == "create" else
                          "change a pool: what a flag names is replaced, the rest kept")
        x.add_argument("path", metavar="PATH", help="e.g. /research/vision")
        x.add_argument("--reservation", metavar="R",
                       help="guaranteed to the pool: cpu=N,mem=Q,disk=Q,gpu=N (default none)")
        x.add_argument("--limit", metavar="R", help="never exceeded: cpu=N,mem=Q,disk=Q,gpu=N (0 or absent: "
                                                    "unlimited in that dimension" + ("; none: no limit)" if
                                                                                    verb == "update" else ")"))
        x.add_argument("--share", type=float, default=None, metavar="W",
                       help="weight for what is left once reservations are met (default 1)")
        kind = x.add_mutually_exclusive_group()
        kind.add_argument("--static", dest="reservation_type", action="store_const", const="static",
                          default=None, help="the reservation is held for the pool even when it is idle")
        kind.add_argument("--elastic", dest="reservation_type", action="store_const", const="elastic",
                          help="what the pool does not use of its reservation is lent to others (the default)")
        x.add_argument("--submitters", default=None, metavar="P[,P]",
                       help="principals who may submit jobs to this pool and its subtree (default: as the parent; "
                            "operators and admins always may; '' clears the list)")
        root = x.add_mutually_exclusive_group()
        root.add_argument("--allow-root", dest="allow_root", action="store_const", const=True, default=None,
                          help="jobs in this pool and its subtree may run tasks as root (task.user: root)")
        root.add_argument("--no-allow-root", dest="allow_root", action="store_const", const=False,
                          help="they may not (the default)")
        x.set_defaults(fn=f"admin:cmd_pool_{verb}")
    x = add_command(rp, "list", help="every pool: reservation, limit, share, allocation, demand, entitlement, queue")
    x.set_defaults(fn="admin:cmd_pool_list")
    x = add_command(rp, "get", help="one pool, per resource")
    x.add_argument("path", metavar="PATH")
    x.set_defaults(fn="admin:cmd_pool_get")
    x = add_command(rp, "delete", help="delete a pool without child pools, unfinished jobs or queued gangs")
    x.add_argument("path", metavar="PATH")
    x.set_defaults(fn="admin:cmd_pool_delete")


def _queue(x: argparse.ArgumentParser) -> None:
    # `queue list` and `queue ls` read as `queue`, as in the other groups: a pool path starts with /
    x.add_argument("pool", nargs="*", metavar="POOL",
                   help="this pool and its subtree (default: every pool); `peloton queue list [POOL]` is the same")
    x.add_argument("--limit", type=int32, default=1000, metavar="N", help="at most N gangs (default 1000)")
    x.set_defaults(fn="admin:cmd_queue")
