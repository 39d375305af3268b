"""The `peloton` command line. Client commands talk only gRPC to the daemon (--address / PELOTON_ADDRESS)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import json_format
from google.protobuf.message import Message

from peloton import __version__, config
from peloton.api.specfile import parse_spec
from peloton.api.status import from_rpc_error
from peloton.api.v1 import (
    host_pb2,
    host_pb2_grpc,
    job_pb2,
    job_pb2_grpc,
    respool_pb2,
    respool_pb2_grpc,
    task_pb2,
    task_pb2_grpc,
)
from peloton.domain.resources import format_mib, parse_mib
from peloton.errors import InvalidArgument, PelotonError

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_TIMEOUT = 124


class Client:
    def __init__(self, address: str, timeout: float = 30.0) -> None:
        self.address = address
        self.timeout = timeout
        self.channel = grpc.insecure_channel(address)
        self.jobs = job_pb2_grpc.JobServiceStub(self.channel)
        self.tasks = task_pb2_grpc.TaskServiceStub(self.channel)
        self.pools = respool_pb2_grpc.ResourcePoolServiceStub(self.channel)
        self.hosts = host_pb2_grpc.HostServiceStub(self.channel)

    def call(self, method: Callable[..., Any], request: Message) -> Any:
        try:
            return method(request, timeout=self.timeout)
        except grpc.RpcError as e:
            err = from_rpc_error(e)
            if e.code() == grpc.StatusCode.UNAVAILABLE:  # type: ignore[attr-defined]
                err.message = f"cannot reach the peloton daemon at {self.address} (is it running? see --address)"
            raise err from None


# --- output helpers -------------------------------------------------------------------------------------------
def _table(rows: Sequence[Sequence[object]], headers: Sequence[str]) -> str:
    cells = [list(map(str, headers))] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells)


def _json(msg: Message) -> str:
    return json.dumps(json_format.MessageToDict(msg, preserving_proto_field_name=True, always_print_fields_with_no_presence=True), indent=2, sort_keys=True)


def _ago(ts: float) -> str:
    if not ts:
        return "-"
    d = max(0, time.time() - ts)
    return f"{d:.0f}s ago" if d < 120 else f"{d / 60:.0f}m ago" if d < 7200 else f"{d / 3600:.1f}h ago"


def _res(r: job_pb2.Resources) -> str:
    parts = [f"cpu={r.cpu:g}", f"mem={format_mib(parse_mib(r.mem or '0', 'mem'))}"]
    if r.gpu:
        parts.append(f"gpu={r.gpu}")
    return ",".join(parts)


# --- commands -------------------------------------------------------------------------------------------------
def cmd_job_create(c: Client, a: argparse.Namespace) -> int:
    path = Path(a.file)
    try:
        text = sys.stdin.read() if a.file == "-" else path.read_text()
    except OSError as e:
        raise InvalidArgument(f"-f: cannot read {a.file}: {e.strerror}") from None
    spec = parse_spec(text, source=a.file)
    r = c.call(c.jobs.CreateJob, job_pb2.CreateJobRequest(spec=spec))
    print(r.job_id)
    return 0


def cmd_job_get(c: Client, a: argparse.Namespace) -> int:
    job = c.call(c.jobs.GetJob, job_pb2.GetJobRequest(job_id=a.job_id)).job
    tasks = c.call(c.tasks.ListTasks, task_pb2.ListTasksRequest(job_id=a.job_id)).tasks
    if a.output == "json":
        out = json_format.MessageToDict(job, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
        out["tasks"] = [json_format.MessageToDict(t, preserving_proto_field_name=True, always_print_fields_with_no_presence=True) for t in tasks]
        print(json.dumps(out, indent=2, sort_keys=True))
        return 0
    st, spec = job.status, job.spec
    print(f"Job:       {job.id}  {spec.name}")
    print(f"State:     {st.state}" + (f"  (desired {st.desired_state})" if st.desired_state != "RUNNING" else ""))
    if st.reason:
        print(f"Reason:    {st.reason}")
    print(f"Owner:     {spec.owner or '-'}   Pool: {spec.respool}   Priority: {spec.sla.priority}")
    print(f"Instances: {spec.instances}  each {_res(spec.task.resources)}   created {_ago(st.created_at)}")
    print("Gangs:")
    for g in st.gangs:
        members = f"{g.instances[0]}-{g.instances[-1]}" if len(g.instances) > 1 else str(g.instances[0])
        line = f"  gang {g.index} (instances {members}): {g.state}, attempt {g.attempt}"
        if g.reason and g.state not in ("RUNNING",):
            line += f"\n    why: {g.reason}" if st.state == "PENDING" or g.state == "QUEUED" else f" - {g.reason}"
        print(line)
    print("Tasks:")
    rows = [[t.instance, t.state, t.host or "-", t.attempt, ",".join(map(str, t.gpus)) or "-",
             t.exit_code if t.HasField("exit_code") else "-", t.message or t.reason or ""] for t in tasks]
    print(_table(rows, ["INSTANCE", "STATE", "HOST", "ATTEMPT", "GPUS", "EXIT", "MESSAGE"]))
    return 0


def cmd_job_list(c: Client, a: argparse.Namespace) -> int:
    r = c.call(c.jobs.ListJobs, job_pb2.ListJobsRequest(states=a.state or [], owner=a.owner or "",
                                                        respool=a.respool or "", limit=a.limit))
    if a.output == "json":
        print(_json(r))
        return 0
    rows = []
    for j in r.jobs:
        counts = ", ".join(f"{k.lower()}={v}" for k, v in sorted(j.status.task_states.items()))
        rows.append([j.id, j.spec.name, j.status.state, j.spec.instances, j.spec.owner or "-", j.spec.respool,
                     _ago(j.status.created_at), counts])
    print(_table(rows, ["ID", "NAME", "STATE", "INSTANCES", "OWNER", "POOL", "CREATED", "TASKS"]))
    return 0


def cmd_job_stop(c: Client, a: argparse.Namespace) -> int:
    c.call(c.jobs.StopJob, job_pb2.StopJobRequest(job_id=a.job_id))
    print(f"stopping job {a.job_id}", file=sys.stderr)
    return 0


def cmd_job_delete(c: Client, a: argparse.Namespace) -> int:
    c.call(c.jobs.DeleteJob, job_pb2.DeleteJobRequest(job_id=a.job_id))
    print(f"deleted job {a.job_id}", file=sys.stderr)
    return 0


def cmd_job_wait(c: Client, a: argparse.Namespace) -> int:
    """Exit 0 only when the job SUCCEEDED; 1 when it ended otherwise; 124 on timeout."""
    deadline = time.monotonic() + a.wait_timeout if a.wait_timeout else None
    last = ""
    while True:
        job = c.call(c.jobs.GetJob, job_pb2.GetJobRequest(job_id=a.job_id)).job
        state = job.status.state
        if state != last:
            print(f"{a.job_id}: {state}", file=sys.stderr)
            last = state
        if state in ("SUCCEEDED", "FAILED", "KILLED"):
            if state != "SUCCEEDED" and job.status.reason:
                print(f"{a.job_id}: {job.status.reason}", file=sys.stderr)
            return 0 if state == "SUCCEEDED" else EXIT_ERROR
        if deadline is not None and time.monotonic() >= deadline:
            print(f"peloton: timed out after {a.wait_timeout:g}s waiting for job {a.job_id} (state {state})",
                  file=sys.stderr)
            return EXIT_TIMEOUT
        time.sleep(0.5)


def cmd_task_list(c: Client, a: argparse.Namespace) -> int:
    r = c.call(c.tasks.ListTasks, task_pb2.ListTasksRequest(job_id=a.job_id))
    if a.output == "json":
        print(_json(r))
        return 0
    rows = [[t.instance, t.task_id, t.state, t.host or "-", ",".join(map(str, t.ports)) or "-",
             ",".join(map(str, t.gpus)) or "-", t.exit_code if t.HasField("exit_code") else "-",
             t.message or t.reason] for t in r.tasks]
    print(_table(rows, ["INSTANCE", "TASK ID", "STATE", "HOST", "PORTS", "GPUS", "EXIT", "MESSAGE"]))
    return 0


def cmd_task_get(c: Client, a: argparse.Namespace) -> int:
    t = c.call(c.tasks.GetTask, task_pb2.GetTaskRequest(job_id=a.job_id, instance=a.instance)).task
    if a.output == "json":
        print(_json(t))
        return 0
    print(f"Task:   {t.task_id}  state {t.state}  host {t.host or '-'}  attempt {t.attempt}")
    rows = [[e.attempt, e.state, time.strftime("%H:%M:%S", time.localtime(e.time)), e.host or "-",
             e.exit_code if e.HasField("exit_code") else "-", (e.reason + (": " if e.reason and e.message else "")
                                                            + e.message)] for e in t.events]
    print(_table(rows, ["ATTEMPT", "STATE", "TIME", "HOST", "EXIT", "DETAIL"]))
    return 0


def cmd_task_logs(c: Client, a: argparse.Namespace) -> int:
    r = c.call(c.tasks.GetTaskLogs, task_pb2.GetTaskLogsRequest(
        job_id=a.job_id, instance=a.instance, attempt=a.attempt, stream="stderr" if a.stderr else "stdout",
        tail_bytes=a.tail))
    sys.stdout.buffer.write(r.content)
    sys.stdout.flush()
    return 0


def _parse_res_flag(text: str | None, field: str) -> job_pb2.Resources | None:
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
    pool = respool_pb2.ResourcePool(path=a.path, share=a.share)
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
    r = c.call(c.pools.ListPools, respool_pb2.ListPoolsRequest())
    if a.output == "json":
        print(_json(r))
        return 0
    rows = [[p.path, _res(p.limit) if p.HasField("limit") else "-", _res(p.allocated)] for p in r.pools]
    print(_table(rows, ["PATH", "LIMIT", "ALLOCATED"]))
    return 0


def cmd_pool_get(c: Client, a: argparse.Namespace) -> int:
    print(_json(c.call(c.pools.GetPool, respool_pb2.GetPoolRequest(path=a.path)).pool))
    return 0


def cmd_pool_delete(c: Client, a: argparse.Namespace) -> int:
    c.call(c.pools.DeletePool, respool_pb2.DeletePoolRequest(path=a.path))
    return 0


def cmd_host_list(c: Client, a: argparse.Namespace) -> int:
    r = c.call(c.hosts.ListHosts, host_pb2.ListHostsRequest())
    if a.output == "json":
        print(_json(r))
        return 0
    rows = [[h.hostname, h.address, h.state, _res(h.capacity), _res(h.allocated), len(h.task_ids),
             "yes" if h.offer_held else "no", ",".join(f"{k}={v}" for k, v in sorted(h.labels.items()))]
            for h in r.hosts]
    print(_table(rows, ["HOST", "ADDRESS", "STATE", "CAPACITY", "ALLOCATED", "TASKS", "OFFER HELD", "LABELS"]))
    return 0


def cmd_server(a: argparse.Namespace) -> int:
    from peloton.domain.resources import parse_resources_flag
    from peloton.server import MesosSettings, ServerConfig, run_server

    logging.basicConfig(level=getattr(logging, a.log_level.upper()),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if a.local_hosts is not None and a.local_hosts < 1:
        raise InvalidArgument("--local-hosts: must be at least 1")
    res = parse_resources_flag(a.local_host_resources) if a.local_host_resources else None
    if res is not None and a.local_hosts is None:
        a.local_hosts = 1
    mesos = None
    if a.backend == "mesos":
        if a.local_hosts is not None:
            raise InvalidArgument("--local-hosts: only with --backend local")
        if not a.mesos_master:
            raise InvalidArgument("--mesos-master: required with --backend mesos (e.g. http://m1:5050,http://m2:5050)")
        masters = [m.strip() for m in a.mesos_master.split(",") if m.strip()]
        for m in masters:
            if not m.startswith(("http://", "https://")):
                raise InvalidArgument(f"--mesos-master: {m!r} must start with http:// or https://")
        if a.mesos_secret_file and not Path(a.mesos_secret_file).is_file():
            raise InvalidArgument(f"--mesos-secret-file: {a.mesos_secret_file} is not a readable file")
        if a.mesos_failover_timeout <= 0:
            raise InvalidArgument("--mesos-failover-timeout: must be greater than 0")
        mesos = MesosSettings(masters=masters, role=a.mesos_role, principal=a.mesos_principal or "",
                              secret_file=a.mesos_secret_file or "", failover_timeout_s=a.mesos_failover_timeout,
                              framework_name=a.mesos_framework_name, user=a.mesos_user)
    elif a.mesos_master:
        raise InvalidArgument("--mesos-master: only with --backend mesos")
    cfg = ServerConfig(
        listen=a.listen, db_url=a.db, data_dir=Path(a.data_dir) if a.data_dir else config.default_data_dir(),
        local_hosts=a.local_hosts, local_host_resources=res, local_port_base=a.local_port_base,
        metrics_listen=a.metrics_listen, backend=a.backend, mesos=mesos,
        roles=frozenset(r.strip() for r in a.role.split(",") if r.strip()),
        resmgr_address=a.resmgr, hostmgr_address=a.hostmgr,
    )
    run_server(cfg)
    return 0


def cmd_db_upgrade(a: argparse.Namespace) -> int:
    from peloton.store import db

    data_dir = Path(a.data_dir) if a.data_dir else config.default_data_dir()
    url = a.db or db.default_sqlite_url(data_dir)
    db.upgrade(url)
    print(f"database at revision {db.current_revision(url)}")
    return 0


# --- parser ---------------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="peloton", description="Gang-scheduling workload manager for GPU clusters")
    p.add_argument("--version", action="version", version=f"peloton {__version__}")
    p.add_argument("--address", default=None, help="daemon HOST:PORT (default: $PELOTON_ADDRESS or 127.0.0.1:5391)")
    p.add_argument("--rpc-timeout", type=float, default=30.0, help=argparse.SUPPRESS)
    sub = p.add_subparsers(dest="group", required=True)

    def out(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("-o", "--output", choices=["table", "json"], default="table")

    s = sub.add_parser("server", help="run the daemon")
    s.add_argument("--listen", default=config.DEFAULT_LISTEN, help="gRPC HOST:PORT (default %(default)s)")
    s.add_argument("--db", default=None, help="database URL (default: SQLite in the data dir)")
    s.add_argument("--data-dir", default=None, help="default: $PELOTON_DATA_DIR or ~/.local/share/peloton")
    s.add_argument("--local-hosts", type=int, default=None, help="simulate N hosts on this machine")
    s.add_argument("--local-host-resources", default=None, help="size of each simulated host: cpu=8,mem=16Gi,gpu=2")
    s.add_argument("--local-port-base", type=int, default=31000, help="first port of host 0's range (1000 per host)")
    s.add_argument("--metrics-listen", default=config.DEFAULT_METRICS_LISTEN,
                   help="Prometheus HOST:PORT ('' to disable; default %(default)s)")
    s.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    s.add_argument("--role", default="jobmgr,resmgr,placement,hostmgr",
                   help="components this process runs (comma-separated; default: all four in one daemon)")
    s.add_argument("--resmgr", default="", help="HOST:PORT of the resmgr process when this one does not run it")
    s.add_argument("--hostmgr", default="", help="HOST:PORT of the hostmgr process when this one does not run it")
    s.add_argument("--backend", default="local", choices=["local", "mesos"],
                   help="local: run tasks on this machine (default); mesos: register as a Mesos framework")
    s.add_argument("--mesos-master", default="", help="comma-separated master URLs: http://m1:5050,http://m2:5050")
    s.add_argument("--mesos-role", default="*", help="framework role (default %(default)s)")
    s.add_argument("--mesos-principal", default="", help="principal for HTTP basic authentication")
    s.add_argument("--mesos-secret-file", default="", help="file holding the principal's secret")
    s.add_argument("--mesos-failover-timeout", type=float, default=7 * 24 * 3600.0,
                   help="seconds Mesos keeps our tasks while the framework is disconnected (default: one week)")
    s.add_argument("--mesos-framework-name", default="peloton")
    s.add_argument("--mesos-user", default="root", help="user tasks run as on the agents")
    s.set_defaults(server_fn=cmd_server)

    d = sub.add_parser("db", help="database maintenance").add_subparsers(dest="cmd", required=True)
    up = d.add_parser("upgrade", help="apply migrations")
    up.add_argument("--db", default=None)
    up.add_argument("--data-dir", default=None)
    up.set_defaults(server_fn=cmd_db_upgrade)

    j = sub.add_parser("job", help="jobs").add_subparsers(dest="cmd", required=True)
    x = j.add_parser("create", help="submit a job spec (YAML); prints the job id")
    x.add_argument("-f", "--file", required=True, help="spec file, or - for stdin")
    x.set_defaults(fn=cmd_job_create)
    x = j.add_parser("get", help="state, gangs (and why pending), tasks")
    x.add_argument("job_id")
    out(x)
    x.set_defaults(fn=cmd_job_get)
    x = j.add_parser("list", help="list jobs, newest first")
    x.add_argument("--state", action="append", help="filter by state (repeatable)")
    x.add_argument("--owner")
    x.add_argument("--respool")
    x.add_argument("--limit", type=int, default=100)
    out(x)
    x.set_defaults(fn=cmd_job_list)
    x = j.add_parser("stop", help="kill every task of the job")
    x.add_argument("job_id")
    x.set_defaults(fn=cmd_job_stop)
    x = j.add_parser("delete", help="delete a finished job and its history")
    x.add_argument("job_id")
    x.set_defaults(fn=cmd_job_delete)
    x = j.add_parser("wait", help="wait for the job to end; exit 0 only if it SUCCEEDED")
    x.add_argument("job_id")
    x.add_argument("--timeout", dest="wait_timeout", type=float, default=0,
                   help="seconds (0: forever); exit 124 on timeout")
    x.set_defaults(fn=cmd_job_wait)

    t = sub.add_parser("task", help="tasks").add_subparsers(dest="cmd", required=True)
    x = t.add_parser("list")
    x.add_argument("job_id")
    out(x)
    x.set_defaults(fn=cmd_task_list)
    x = t.add_parser("get", help="a task with its event history")
    x.add_argument("job_id")
    x.add_argument("instance", type=int)
    out(x)
    x.set_defaults(fn=cmd_task_get)
    x = t.add_parser("logs", help="a task's stdout (or --stderr)")
    x.add_argument("job_id")
    x.add_argument("instance", type=int)
    x.add_argument("--stderr", action="store_true")
    x.add_argument("--attempt", type=int, default=0, help="default: the current attempt")
    x.add_argument("--tail", type=int, default=0, help="last N bytes (default 1 MiB)")
    x.set_defaults(fn=cmd_task_logs)

    rp = sub.add_parser("pool", help="resource pools").add_subparsers(dest="cmd", required=True)
    x = rp.add_parser("create")
    x.add_argument("path")
    x.add_argument("--limit", help="cpu=N,mem=Q,gpu=N (0 or absent: unlimited in that dimension)")
    x.add_argument("--reservation")
    x.add_argument("--share", type=float, default=1.0)
    x.set_defaults(fn=cmd_pool_create)
    x = rp.add_parser("list")
    out(x)
    x.set_defaults(fn=cmd_pool_list)
    x = rp.add_parser("get")
    x.add_argument("path")
    x.set_defaults(fn=cmd_pool_get)
    x = rp.add_parser("delete")
    x.add_argument("path")
    x.set_defaults(fn=cmd_pool_delete)

    h = sub.add_parser("host", help="hosts").add_subparsers(dest="cmd", required=True)
    x = h.add_parser("list")
    out(x)
    x.set_defaults(fn=cmd_host_list)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if hasattr(args, "server_fn"):
            return int(args.server_fn(args))
        client = Client(args.address or config.default_address(), timeout=args.rpc_timeout)
        return int(args.fn(client, args))
    except InvalidArgument as e:
        print(f"peloton: error: {e.message}", file=sys.stderr)
        return EXIT_USAGE
    except PelotonError as e:
        print(f"peloton: error: {e.message}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
