"""`peloton pool ...`, `peloton host ...` and `peloton audit`."""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING, Any

from peloton.cli import render
from peloton.errors import InvalidArgument

if TYPE_CHECKING:
    from collections.abc import Sequence

    from peloton.api.v1 import host_pb2, job_pb2, respool_pb2
    from peloton.cli.client import Client


def _set_res(out: job_pb2.Resources, text: str, field: str) -> None:
    """`cpu=N,mem=Q,disk=Q,gpu=N` (any subset) onto `out`: the dimensions named are replaced, the others kept."""
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


def _apply_pool_flags(pool: respool_pb2.ResourcePool, a: argparse.Namespace) -> None:
    """The flags given (None: not given, keep what the pool has) onto `pool`."""
    if a.share is not None:
        pool.share = a.share
    if a.submitters is not None:
        del pool.submitters[:]
        pool.submitters.extend(p.strip() for p in a.submitters.split(",") if p.strip())
    if a.allow_root is not None:
        pool.allow_root = a.allow_root
    if a.reservation_type is not None:
        pool.reservation_type = a.reservation_type
    if a.reservation:
        _set_res(pool.reservation, a.reservation, "--reservation")
    if a.limit == "none":
        pool.ClearField("limit")
    elif a.limit:
        _set_res(pool.limit, a.limit, "--limit")


def _warn(warnings: Sequence[str]) -> None:
    for w in warnings:
        print(f"peloton: warning: {w}", file=sys.stderr)


def cmd_pool_create(c: Client, a: argparse.Namespace) -> int:
    from peloton.api.v1 import respool_pb2

    pool = respool_pb2.ResourcePool(path=a.path)
    _apply_pool_flags(pool, a)
    r = c.call(c.pools.CreatePool, respool_pb2.CreatePoolRequest(pool=pool))
    _warn(r.warnings)
    render.done(a, {"path": a.path, "created": True, "warnings": list(r.warnings)}, a.path)
    return 0


def cmd_pool_update(c: Client, a: argparse.Namespace) -> int:
    """Read the pool, change what the flags say, write it back whole."""
    from peloton.api.v1 import respool_pb2

    pool = c.call(c.pools.GetPool, respool_pb2.GetPoolRequest(path=a.path)).pool
    for output_only in ("allocated", "demand", "entitlement", "queued_gangs"):
        pool.ClearField(output_only)
    _apply_pool_flags(pool, a)
    r = c.call(c.pools.UpdatePool, respool_pb2.UpdatePoolRequest(pool=pool))
    _warn(r.warnings)
    render.done(a, {"path": a.path, "updated": True, "warnings": list(r.warnings)}, a.path)
    return 0


def cmd_pool_list(c: Client, a: argparse.Namespace) -> int:
    from peloton.api.v1 import respool_pb2

    r = c.call(c.pools.ListPools, respool_pb2.ListPoolsRequest())
    if a.output in render.DOCUMENTS:
        print(render.json_message(r))
        return 0
    rows = [[p.path, _compact(p.reservation) + (" static" if p.reservation_type == "static" else ""),
             _compact(p.limit) if p.HasField("limit") else "-", f"{p.share:g}", _compact(p.allocated),
             _compact(p.demand), _ent(p) if p.HasField("entitlement") else "?", p.queued_gangs] for p in r.pools]
    print(render.table(rows, ["PATH", "RESERVATION", "LIMIT", "SHARE", "ALLOCATED", "DEMAND", "ENTITLEMENT",
                              "QUEUED"]))
    return 0


def cmd_pool_get(c: Client, a: argparse.Namespace) -> int:
    from peloton.api.v1 import respool_pb2

    p = c.call(c.pools.GetPool, respool_pb2.GetPoolRequest(path=a.path)).pool
    if a.output in render.DOCUMENTS:
        print(render.json_message(p))
        return 0
    print(f"pool {p.path}: share {p.share:g}, reservation {p.reservation_type or 'elastic'}, "
          f"{p.queued_gangs} gang(s) queued; submitters {','.join(p.submitters) or '(as the parent)'}; tasks as "
          f"root {'allowed' if p.allow_root else 'not allowed'}")
    e = p.entitlement if p.HasField("entitlement") else None
    rows = []
    for dim, field, ent in (("cpu", "cpu", e.cpu if e else None), ("mem", "mem", e.mem_mib if e else None),
                            ("disk", "disk", e.disk_mib if e else None), ("gpu", "gpu", e.gpu if e else None)):
        def q(r: job_pb2.Resources, f: str = field) -> str:
            v = getattr(r, f)
            return render.quantity(v) if f in ("mem", "disk") else f"{v:g}"

        limit = q(p.limit) if p.HasField("limit") and not _zero(getattr(p.limit, field)) else "-"
        shown = "-" if ent is None else (render.mib(ent) if dim in ("mem", "disk") else f"{ent:.4g}")
        rows.append([dim, q(p.reservation), limit, q(p.demand), q(p.allocated), shown])
    print(render.table(rows, ["RESOURCE", "RESERVATION", "LIMIT", "DEMAND", "ALLOCATED", "ENTITLEMENT"]))
    return 0


def _zero(v: float | str) -> bool:
    return v in (0, "", "0", "0Mi")


def _compact(r: job_pb2.Resources) -> str:
    """Only the dimensions that are set: `cpu=32,gpu=16`; `-` for none."""
    parts = [f"{k}={v}" for k, v in (("cpu", f"{r.cpu:g}"), ("mem", r.mem and render.quantity(r.mem)),
                                      ("disk", r.disk and render.quantity(r.disk)), ("gpu", str(r.gpu)))
             if not _zero(v)]
    return ",".join(parts) or "-"


def _ent(p: respool_pb2.ResourcePool) -> str:
    e = p.entitlement
    parts = [f"{k}={v}" for k, v, raw in (("cpu", f"{e.cpu:.4g}", e.cpu), ("mem", render.mib(e.mem_mib), e.mem_mib),
                                           ("disk", render.mib(e.disk_mib), e.disk_mib), ("gpu", f"{e.gpu:.4g}", e.gpu))
             if raw]
    return ",".join(parts) or "0"


def cmd_queue(c: Client, a: argparse.Namespace) -> int:
    """The gangs waiting for admission or placement, in queue order, like squeue."""
    from peloton.api.v1 import respool_pb2

    r = c.call(c.pools.ListQueue, respool_pb2.ListQueueRequest(pool=queue_pool(a.pool), limit=a.limit))
    if a.output in render.DOCUMENTS:
        print(render.json_message(r))
        return 0
    now = time.time()
    rows = [[g.pool, g.position, g.job_id, g.gang_id.rsplit("/", 1)[-1], g.priority, g.members,
             _compact(g.resources), _waited(now - g.enqueued_at), g.state, _hosts(list(g.reserved_hosts)),
             expected_start(g.expected_start, g.expected_start_basis, now), g.reason or "-"] for g in r.gangs]
    print(render.table(rows, ["POOL", "POS", "JOB", "GANG", "PRIO", "SIZE", "RESOURCES", "WAITING", "STATE",
                              "RESERVED", "STARTS", "REASON"]))
    if r.total > len(r.gangs):
        print(f"({r.total - len(r.gangs)} more; --limit)", file=sys.stderr)
    return 0


def _hosts(names: list[str]) -> str:
    """A reservation's hosts on one short cell: the first two and how many more."""
    if not names:
        return "-"
    return ",".join(names[:2]) + (f"+{len(names) - 2}" if len(names) > 2 else "")


def expected_start(at: float, basis: str, now: float) -> str:
    """When a reserved gang is expected to start: `in 42s` (the max_runtime ends of the gangs on its hosts),
    `unknown` (nothing bounds it: a gang there has no max_runtime, or victims are being preempted); `-` without a
    reservation."""
    if not basis:
        return "-"
    if not at:
        return "unknown"
    return f"in {_waited(at - now)}"


def queue_pool(words: list[str] | str | None) -> str:
    """The pool of `peloton queue [list|ls] [POOL]`: the verb the other groups have is taken as said, not as a
    pool path (`peloton queue list` once said "'list' is not a pool path")."""
    if isinstance(words, str) or words is None:
        return words or ""
    if words and words[0] in ("list", "ls"):
        words = words[1:]
    if len(words) > 1:
        raise InvalidArgument(f"pool: one pool path at most, got {' '.join(words)}", field="pool")
    return words[0] if words else ""


def _waited(s: float) -> str:
    s = max(0.0, s)
    return f"{s:.0f}s" if s < 120 else f"{s / 60:.0f}m" if s < 7200 else f"{s / 3600:.1f}h"


def cmd_pool_delete(c: Client, a: argparse.Namespace) -> int:
    from peloton.api.v1 import respool_pb2

    c.call(c.pools.DeletePool, respool_pb2.DeletePoolRequest(path=a.path))
    render.done(a, {"path": a.path, "deleted": True})
    return 0


def cmd_host_list(c: Client, a: argparse.Namespace) -> int:
    from peloton.api.v1 import host_pb2

    if a.limit is not None and not 1 <= a.limit <= 1000:
        raise InvalidArgument(f"--limit: between 1 and 1000 hosts, got {a.limit}", field="--limit")
    r = c.call(c.hosts.ListHosts, host_pb2.ListHostsRequest(
        states=a.state or [], rack=a.rack or "", labels=a.label or [], min_free_gpus=a.free_gpus or 0,
        name_contains=a.name or "", page_size=a.limit or 0))
    if a.output in render.DOCUMENTS:
        print(render.json_message(r))
        return 0
    if r.total > len(r.hosts):
        print(f"({r.total - len(r.hosts)} more; --limit)", file=sys.stderr)
    rows = [[h.hostname, h.address, h.state + (" (unhealthy)" if h.health else ""), _drain(h),
             render.resources(h.capacity, disk=True), render.resources(h.allocated, disk=True, gpu=h.capacity.gpu > 0), len(h.task_ids),
             "yes" if h.offer_held else "no", _hardware(h.hardware),
             ",".join(f"{k}={v}" for k, v in sorted(h.labels.items()))] for h in r.hosts]
    print(render.table(rows, ["HOST", "ADDRESS", "STATE", "DRAIN", "CAPACITY", "ALLOCATED", "TASKS", "OFFER HELD",
                              "HARDWARE", "LABELS"]))
    for h in r.hosts:
        if h.health:
            print(f"{h.hostname}: {h.health}")
        for why in h.hardware.invalid:
            print(f"{h.hostname}: {why} (its default is assumed)")
    return 0


def _gbps(v: float) -> str:
    return f"{v:g}G"


def _hardware(hw: host_pb2.HostHardware) -> str:
    """What the cost model assumes of a host, compact: `a100 nvlink 400G` (`25G` for a host without GPUs)."""
    return " ".join(x for x in (hw.gpu_model, hw.gpu_link, _gbps(hw.nic_gbps)) if x)


def cmd_host_get(c: Client, a: argparse.Namespace) -> int:
    from peloton.api.v1 import host_pb2
    from peloton.errors import NotFound

    h = next((x for x in c.call(c.hosts.ListHosts, host_pb2.ListHostsRequest(name_contains=a.hostname,
                                                                               with_gpus=True)).hosts
              if x.hostname == a.hostname), None)
    if h is None:
        names = sorted(x.hostname for x in c.call(c.hosts.ListHosts, host_pb2.ListHostsRequest()).hosts)
        raise NotFound(f"hostname: no host {a.hostname} (hosts: {', '.join(names[:10])}"
                       f"{' ...' if len(names) > 10 else ''})")
    if a.output in render.DOCUMENTS:
        print(render.json_message(h))
        return 0
    hw = h.hardware

    def defaulted(label: str, shown: str) -> str:
        return f"{shown} (default)" if label in hw.defaulted else shown

    rows = [["host", h.hostname], ["address", h.address], ["state", h.state + (" (unhealthy)" if h.health else "")],
            ["drain", _drain(h)], ["capacity", render.resources(h.capacity, disk=True)],
            ["allocated", render.resources(h.allocated, disk=True, gpu=h.capacity.gpu > 0)],
            ["tasks", ", ".join(h.task_ids) or "-"], ["gpus", _gpus(h) or "-"],
            ["kept for", h.reserved_for or "-"], ["offer held", "yes" if h.offer_held else "no"],
            ["gpu model", defaulted("gpu_model", hw.gpu_model) if hw.gpu_model else "- (no GPUs)"],
            ["gpu link", defaulted("gpu_link", hw.gpu_link) if hw.gpu_link else "- (no GPUs)"],
            ["nic", defaulted("nic_gbps", f"{hw.nic_gbps:g} Gbit/s")],
            ["labels", ",".join(f"{k}={v}" for k, v in sorted(h.labels.items())) or "-"]]
    print("\n".join(f"{k + ':':<12}{v}" for k, v in rows))
    if h.health:
        print(f"{h.hostname}: {h.health}")
    for why in hw.invalid:
        print(f"{h.hostname}: {why} (its default is assumed)")
    return 0


def _gpus(h: host_pb2.Host) -> str:
    """Each GPU and what it is: `0 used (JOB-0-1), 1 stranded`."""
    return ", ".join(f"{g.id} {g.state}" + (f" ({g.task_id})" if g.task_id else "") for g in h.gpus)


def _drain(h: host_pb2.Host) -> str:
    if not h.drain:
        return "-"
    why = " for maintenance" if h.maintenance else ""
    if h.drain == "draining" and h.drain_deadline:
        left = h.drain_deadline - time.time()
        return (f"draining{why} (preempts in {max(0, round(left))}s)" if left > 0
                else f"draining{why} (deadline passed)")
    return f"{h.drain}{why}"


def cmd_host_drain(c: Client, a: argparse.Namespace) -> int:
    from peloton.api.v1 import host_pb2
    from peloton.hostmgr.sim.durations import parse_duration

    req = host_pb2.DrainHostRequest(hostname=a.hostname)
    if a.deadline is not None:
        req.deadline.FromNanoseconds(round(parse_duration(a.deadline, "--deadline") * 1e9))
    h = c.call(c.hosts.DrainHost, req).host
    return _show_host(h, a, f"{h.hostname}: {_drain(h)}, {len(h.task_ids)} task(s) on it")


def cmd_host_undrain(c: Client, a: argparse.Namespace) -> int:
    from peloton.api.v1 import host_pb2

    h = c.call(c.hosts.UndrainHost, host_pb2.UndrainHostRequest(hostname=a.hostname)).host
    return _show_host(h, a, f"{h.hostname}: {_drain(h)} (the cluster manager's maintenance window stays until "
                            "it is lifted)" if h.maintenance else f"{h.hostname}: in service")


def _show_host(h: host_pb2.Host, a: argparse.Namespace, line: str) -> int:
    print(render.json_message(h) if a.output in render.DOCUMENTS else line)
    return 0


def cmd_audit(c: Client, a: argparse.Namespace) -> int:
    import time

    from peloton.api.v1 import audit_pb2
    from peloton.cli.client import Stub
    from peloton.hostmgr.sim.durations import parse_duration

    since = time.time() - parse_duration(a.since, "--since") if a.since else 0.0
    r = c.call(Stub(c.channel, audit_pb2, "AuditService").ListAuditEvents, audit_pb2.ListAuditEventsRequest(
        principal=a.principal or "", object=a.object or "", since=since, denied_only=a.denied, limit=a.limit))
    if a.output in render.DOCUMENTS:
        print(render.json_message(r))
        return 0
    rows = [[time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e.at)), e.principal, e.via, e.method, e.object or "-",
             "allowed" if e.allowed else "DENIED", e.code, e.message[:80]] for e in r.events]
    print(render.table(rows, ["TIME", "PRINCIPAL", "VIA", "CALL", "OBJECT", "DECISION", "RESULT", "MESSAGE"]))
    return 0
def _leadership_rows(lead: Any) -> list[tuple[str, str]]:
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(lead.leading_since))
    leader = (f"{lead.leader} (pid {lead.leader_pid} on {lead.leader_host}, since {since}"
              + (f", epoch {lead.epoch}, lease {lead.lease_seconds:g}s)" if lead.epoch else ")")) if lead.leader else "-"
    rows = [("leader", leader)]
    # a split deployment (--role): each role's leader, when they are not all the job manager's process
    if any((r.pid, r.host) != (lead.leader_pid, lead.leader_host) for r in lead.roles):
        for r in lead.roles:
            silent = (f"silent for {r.silent_seconds:.0f}s, past its lease" if r.silent_seconds > lead.lease_seconds > 0
                      else f"renewed {r.silent_seconds:.1f}s ago")
            rows.append((f"leader of {r.role}", f"{r.address or '-'} (pid {r.pid} on {r.host}, {silent})"))
    waiting = [f"{sb.address} ({'/'.join(sb.roles) + ', ' if sb.roles else ''}standing by since "
               f"{render.ago(sb.waiting_since)})" for sb in lead.standbys]
    return [*rows, ("standbys", ", ".join(waiting) or "none")]


def _task_users(mode: str, uid_range: str) -> str:
    if mode == "per principal":
        return f"one per principal: its mapped user, else a uid of its own ({uid_range})"
    if mode == "mapped users":
        return "one per principal: the user the principals file maps it to"
    return "not isolated: the backend's default user, or the job's task.user"


def cmd_cluster_ui_login(c: Client, a: argparse.Namespace) -> int:
    """The daemon answers only its own user over its owner-only socket; the link's code is in its fragment."""
    from peloton.api.v1 import cluster_pb2
    from peloton.cli.client import Stub

    r = c.call(Stub(c.channel, cluster_pb2, "ClusterService").CreateConsoleLogin,
               cluster_pb2.CreateConsoleLoginRequest())
    if a.output in render.DOCUMENTS:
        print(render.json_message(r))
        return 0
    print(r.url)
    if r.no_login_needed:
        print("(authentication is off: the console asks no login)", file=sys.stderr)
    else:
        print(f"(opens the console once, within {r.ttl_seconds}s, as the daemon's own user; login {r.login_id})",
              file=sys.stderr)
    return 0


def cmd_cluster_info(c: Client, a: argparse.Namespace) -> int:
    from peloton.api.v1 import cluster_pb2
    from peloton.cli.client import Stub

    r = c.call(Stub(c.channel, cluster_pb2, "ClusterService").GetClusterInfo, cluster_pb2.GetClusterInfoRequest())
    if a.output in render.DOCUMENTS:
        print(render.json_message(r))
        return 0
    s = r.security
    auth = ", ".join(w for w, on in (("tokens", s.tokens), ("client certificates", s.mutual_tls)) if on)
    rows = [
        ("version", r.version),
        ("serving", ", ".join(r.addresses) or "-"),
        ("roles", ", ".join(r.roles)),
        ("store", r.store or "- (no store in this process)"),
        ("backend", f"{r.backend} ({r.hosts} host{'' if r.hosts == 1 else 's'})" if r.backend else "- (no host manager in this process)"),
        ("up", f"{render.ago(r.started_at)} (since {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(r.started_at))})"),
        ("TLS", ("mutual" if s.mutual_tls else "on") if s.tls else "off"),
        ("authentication", auth or "off: every caller is an admin"),
        ("you", f"{s.caller} ({', '.join(s.caller_roles) or 'no role'}; by {s.caller_via})"),
        ("task users", _task_users(s.task_identities, s.uid_range)),
    ]
    if r.HasField("leadership"):
        rows += _leadership_rows(r.leadership)
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k + ':':<{width + 1}}  {v}")
    for w in s.warnings:
        print(w)
    return 0
