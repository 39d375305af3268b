"""`peloton cluster info`, `peloton host ...`, `peloton audit`: the parsers (the commands are in
peloton/cli/admin.py)."""

from __future__ import annotations

import argparse

from peloton.cli.parser import add_command, int32


def register(name: str, g: argparse.ArgumentParser) -> None:
    if name == "cluster":
        cl = g.add_subparsers(dest="cmd", required=True)
        x = cl.add_parser("info", help="version, roles, store, backend, uptime, how it is secured, and who you are")
        x.set_defaults(fn="admin:cmd_cluster_info")
        x = cl.add_parser("ui-login", help="a one-time link that logs you in to the web console as the daemon's own "
                                           "user (on its machine, as its user: over the owner-only socket)")
        x.set_defaults(fn="admin:cmd_cluster_ui_login")
    elif name == "host":
        _host(g.add_subparsers(dest="cmd", required=True))
    elif name == "audit":
        _audit(g)


def _host(h: argparse._SubParsersAction) -> None:
    x = add_command(h, "list", help="every host (by rack, then name): capacity, allocation, tasks, and whether it "
                                   "is draining; filtered on the daemon")
    x.add_argument("--state", action="append", default=None, choices=["up", "draining", "drained", "unhealthy", "down"],
                   help="only hosts of this status (repeat for several)")
    x.add_argument("--rack", default=None, help="only the hosts of this rack (their label rack)")
    x.add_argument("--label", action="append", default=None, metavar="KEY[=VALUE]",
                   help="only hosts with this label (any value without =VALUE); repeat: every one")
    x.add_argument("--free-gpus", type=int32, default=None, metavar="N",
                   help="only hosts in service with at least N GPUs free")
    x.add_argument("--name", default=None, metavar="TEXT", help="only hosts whose name contains TEXT")
    x.add_argument("--limit", type=int32, default=None, metavar="N", help="at most N hosts (1-1000; default: all)")
    x.set_defaults(fn="admin:cmd_host_list")
    x = add_command(h, "get", help="one host: capacity, allocation, tasks, drain, and the GPU model, GPU link and "
                                   "network bandwidth the model-aware cost model assumes of it")
    x.add_argument("hostname", metavar="HOST")
    x.set_defaults(fn="admin:cmd_host_get")
    x = h.add_parser("drain", help="take a host out of service: no new gangs on it; at --deadline the gangs still "
                                   "there are preempted whole (back to their queue, no attempt lost)")
    x.add_argument("hostname", metavar="HOST")
    x.add_argument("--deadline", default=None, metavar="DURATION",
                   help="how long the gangs on the host may run on (30m, 2h); default: until they end")
    x.set_defaults(fn="admin:cmd_host_drain")
    x = h.add_parser("undrain", help="put a drained host back in service")
    x.add_argument("hostname", metavar="HOST")
    x.set_defaults(fn="admin:cmd_host_undrain")


def _audit(x: argparse.ArgumentParser) -> None:
    x.add_argument("--principal", default=None, help="only this principal's calls")
    x.add_argument("--object", default=None, metavar="ID",
                   help="only calls about this job id, pool path, host or model")
    x.add_argument("--since", default=None, metavar="DURATION", help="only the last DURATION (30s, 15m, 2h)")
    x.add_argument("--denied", action="store_true", help="only refused calls")
    x.add_argument("--limit", type=int32, default=100, help="at most this many (1-1000, default %(default)s)")
    x.set_defaults(fn="admin:cmd_audit")
