"""`peloton pool ...`, `peloton host list` and `peloton audit`."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from peloton.cli import render
from peloton.errors import InvalidArgument

if TYPE_CHECKING:
    from peloton.api.v1 import job_pb2
    from peloton.cli.client import Client


def _parse_res_flag(text: str | None, field: str) -> job_pb2.Resources | None:
    from peloton.api.v1 import job_pb2

    if not text:
        return None
    out = job_pb2.Resources()
    for part in text.split(","):
        k, sep, v = part.partition("=")
        if not sep or k.strip() not in ("cpu", "mem", "disk", "gpu"):
            raise InvalidArgument(f"{field}: expected cpu=N,mem=Q,disk=Q,gpu=N, got {part!r}")
        k, v = k.strip(), v.strip()
        try:
            if k == "cpu":
                out.cpu = float(v)
            elif k == "gpu":
                out.gpu = int(v)
            else:
                setattr(out, k, v)
        except ValueError:
            raise InvalidArgument(f"{field}.{k}: not a number: {v!r}") from None
    return out


def cmd_pool_create(c: Client, a: argparse.Namespace) -> int:
    from peloton.api.v1 import respool_pb2

    pool = respool_pb2.ResourcePool(path=a.path, share=a.share, allow_root=a.allow_root,
                                    submitters=[p.strip() for p in a.submitters.split(",") if p.strip()])
    lim = _parse_res_flag(a.limit, "--limit")
    res = _parse_res_flag(a.reservation, "--reservation")
    if lim is not None:
        pool.limit.CopyFrom(lim)
    if res is not None:
        pool.reservation.CopyFrom(res)
    c.call(c.pools.CreatePool, respool_pb2.CreatePoolRequest(pool=pool))
    print(a.path)
    return 0


def cmd_pool_list(c: Client, a: argparse.Namespace) -> int:
    from peloton.api.v1 import respool_pb2

    r = c.call(c.pools.ListPools, respool_pb2.ListPoolsRequest())
    if a.output == "json":
        print(render.json_message(r))
        return 0
    rows = [[p.path, render.resources(p.limit) if p.HasField("limit") else "-", render.resources(p.allocated),
             ",".join(p.submitters) or "-"] for p in r.pools]
    print(render.table(rows, ["PATH", "LIMIT", "ALLOCATED", "SUBMITTERS"]))
    return 0


def cmd_pool_get(c: Client, a: argparse.Namespace) -> int:
    from peloton.api.v1 import respool_pb2

    print(render.json_message(c.call(c.pools.GetPool, respool_pb2.GetPoolRequest(path=a.path)).pool))
    return 0


def cmd_pool_delete(c: Client, a: argparse.Namespace) -> int:
    from peloton.api.v1 import respool_pb2

    c.call(c.pools.DeletePool, respool_pb2.DeletePoolRequest(path=a.path))
    return 0


def cmd_host_list(c: Client, a: argparse.Namespace) -> int:
    from peloton.api.v1 import host_pb2

    r = c.call(c.hosts.ListHosts, host_pb2.ListHostsRequest())
    if a.output == "json":
        print(render.json_message(r))
        return 0
    rows = [[h.hostname, h.address, h.state, render.resources(h.capacity), render.resources(h.allocated),
             len(h.task_ids), "yes" if h.offer_held else "no",
             ",".join(f"{k}={v}" for k, v in sorted(h.labels.items()))] for h in r.hosts]
    print(render.table(rows, ["HOST", "ADDRESS", "STATE", "CAPACITY", "ALLOCATED", "TASKS", "OFFER HELD",
                              "LABELS"]))
    return 0


def cmd_audit(c: Client, a: argparse.Namespace) -> int:
    import time

    from peloton.api.v1 import audit_pb2
    from peloton.cli.client import Stub
    from peloton.hostmgr.sim.durations import parse_duration

    since = time.time() - parse_duration(a.since, "--since") if a.since else 0.0
    r = c.call(Stub(c.channel, audit_pb2, "AuditService").ListAuditEvents, audit_pb2.ListAuditEventsRequest(
        principal=a.principal or "", object=a.object or "", since=since, denied_only=a.denied, limit=a.limit))
    if a.output == "json":
        print(render.json_message(r))
        return 0
    rows = [[time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e.at)), e.principal, e.via, e.method, e.object or "-",
             "allowed" if e.allowed else "DENIED", e.code, e.message[:80]] for e in r.events]
    print(render.table(rows, ["TIME", "PRINCIPAL", "VIA", "CALL", "OBJECT", "DECISION", "RESULT", "MESSAGE"]))
    return 0
