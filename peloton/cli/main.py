"""The `peloton` command line. Client commands talk only gRPC to the daemon (--address / PELOTON_ADDRESS)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from peloton import __version__, config
from peloton.cli.exits import (
    EXIT_BROKEN_PIPE,
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_TIMEOUT,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
)
from peloton.errors import FailedPrecondition, InvalidArgument, PelotonError

# Start-up time: parsing the arguments imports nothing heavy; a command imports what it uses when it runs (the
# generated code of its service, yaml for `job create`; `-o json` is render.to_dict's, not json_format; never grpc, see
# transport.py). The names below are what the `server` command uses: imported when first used.
TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    import logging
    from collections.abc import Callable
    from pathlib import Path
    from typing import Any, NoReturn

    from google.protobuf.message import Message

    from peloton.cli.client import Client
    from peloton.domain.hostgroups import HostGroup
    from peloton.domain.resources import Resources
    from peloton.hostmgr.sim.backend import SimSettings
else:
    class _Lazy:
        """A module imported on first attribute access."""

        def __init__(self, name: str) -> None:
            self._name = name

        def __getattr__(self, attr: str) -> object:
            import importlib

            return getattr(importlib.import_module(self._name), attr)

    logging = _Lazy("logging")

    def Path(*parts):  # noqa: N802 - pathlib.Path, imported when first called
        from pathlib import Path

        return Path(*parts)

__all__ = ["EXIT_ERROR", "EXIT_TIMEOUT", "EXIT_UNAVAILABLE", "EXIT_USAGE", "build_parser", "main"]


def cmd_sim_fail_host(c: Client, a: argparse.Namespace) -> int:
    from google.protobuf import duration_pb2

    from peloton.api.v1 import sim_pb2

    req = sim_pb2.FailHostRequest(hostname=a.hostname)
    after = ""
    if a.recover_after is not None:
        from peloton.hostmgr.sim.durations import format_duration, parse_duration

        seconds = parse_duration(a.recover_after, "--recover-after")
        if seconds <= 0:
            raise InvalidArgument("--recover-after: must be greater than 0")
        d = duration_pb2.Duration()
        d.FromNanoseconds(round(seconds * 1e9))
        req.recover_after.CopyFrom(d)
        after = f"; it recovers in {format_duration(seconds)}"
    r = c.call(_sim_method(c, "FailHost"), req)
    print(f"failed host {a.hostname}: {r.tasks_lost} task(s) lost{after}", file=sys.stderr)
    return 0


def cmd_sim_recover_host(c: Client, a: argparse.Namespace) -> int:
    from peloton.api.v1 import sim_pb2

    r = c.call(_sim_method(c, "RecoverHost"), sim_pb2.RecoverHostRequest(hostname=a.hostname))
    print(f"recovered host {a.hostname}" if r.was_down else f"host {a.hostname} was not down", file=sys.stderr)
    return 0


def _sim_method(c: Client, name: str) -> Callable[..., Any]:
    """A SimService method whose UNIMPLEMENTED (a daemon without the sim backend) reads as such."""
    from peloton.api.v1 import sim_pb2
    from peloton.cli.client import Stub
    from peloton.cli.transport import RpcError, StatusCode

    method = getattr(Stub(c.channel, sim_pb2, "SimService"), name)

    def call(request: Message, timeout: float) -> Any:
        try:
            return method(request, timeout=timeout)
        except RpcError as e:
            if e.code() == StatusCode.UNIMPLEMENTED:
                raise FailedPrecondition("the daemon does not run the sim backend") from None
            raise

    return call


def _sim_settings(a: argparse.Namespace) -> SimSettings | None:
    """The SimSettings of `server --backend sim`, checked (errors name the flag); None for another backend."""
    from peloton.domain.hostgroups import parse_host_groups
    from peloton.domain.hostlabels import check_for_hosts, parse_labels
    from peloton.domain.resources import parse_resources_flag
    from peloton.hostmgr.sim.backend import SimSettings

    flags = {"--sim-hosts": a.sim_hosts, "--sim-host-resources": a.sim_host_resources, "--sim-racks": a.sim_racks,
             "--sim-seed": a.sim_seed, "--sim-ports-per-host": a.sim_ports_per_host,
             "--sim-host-labels": a.sim_host_labels, "--sim-host-group": a.sim_host_group}
    if a.backend != "sim":
        for flag, value in flags.items():
            if value is not None:
                raise InvalidArgument(f"{flag}: only with --backend sim", field=flag)
        return None
    for flag, value in (("--local-hosts", a.local_hosts), ("--local-host-resources", a.local_host_resources),
                        ("--local-host-labels", a.local_host_labels), ("--local-host-group", a.local_host_group)):
        if value is not None:
            raise InvalidArgument(f"{flag}: only with --backend local", field=flag)
    groups = parse_host_groups(a.sim_host_group, "--sim-host-group")
    if groups:
        _plain_or_groups("--sim-host-group", {"--sim-hosts": a.sim_hosts, "--sim-host-resources":
                                              a.sim_host_resources, "--sim-host-labels": a.sim_host_labels})
    d = SimSettings()
    resources = (parse_resources_flag(a.sim_host_resources, "--sim-host-resources") if a.sim_host_resources
                 else d.resources)
    labels = parse_labels(a.sim_host_labels or "", "--sim-host-labels")
    check_for_hosts(labels, resources.gpu > 0, "--sim-host-labels")
    hosts = sum(g.count for g in groups) if groups else d.hosts if a.sim_hosts is None else a.sim_hosts
    settings = SimSettings(
        hosts=hosts,
        resources=resources,
        racks=(min(d.racks, max(hosts, 1)) if a.sim_racks is None else a.sim_racks),
        seed=d.seed if a.sim_seed is None else a.sim_seed,
        ports_per_host=d.ports_per_host if a.sim_ports_per_host is None else a.sim_ports_per_host,
        labels=tuple(sorted(labels.items())),
        groups=groups,
    )
    settings.check()
    return settings


def _plain_or_groups(group_flag: str, plain: dict[str, object]) -> None:
    """The hosts are either the plain form's (a count, one size, one set of labels) or the groups': not both, so
    that no host is made that the command line does not show (a config file's `sim-hosts` beside a group's)."""
    given = [flag for flag, value in plain.items() if value is not None]
    if given:
        raise InvalidArgument(f"{group_flag}: not with {', '.join(given)}: the hosts are the groups' (make those "
                              f"hosts a group of their own: {group_flag} COUNT:RESOURCES[:LABELS])", field=group_flag)


def _local_hosts(a: argparse.Namespace) -> tuple[int | None, Resources | None, dict[str, str], tuple[HostGroup, ...]]:
    """`--local-hosts`, `--local-host-resources`, `--local-host-labels`, `--local-host-group`, checked (errors
    name the flag)."""
    from peloton.domain.hostgroups import parse_host_groups
    from peloton.domain.hostlabels import check_for_hosts, parse_labels
    from peloton.domain.resources import parse_resources_flag

    if a.backend == "mesos":
        for flag, value in (("--local-hosts", a.local_hosts), ("--local-host-resources", a.local_host_resources),
                            ("--local-host-labels", a.local_host_labels), ("--local-host-group", a.local_host_group)):
            if value is not None:
                raise InvalidArgument(f"{flag}: only with --backend local", field=flag)
    if a.local_hosts is not None and a.local_hosts < 1:
        raise InvalidArgument("--local-hosts: must be at least 1", field="--local-hosts")
    groups = parse_host_groups(a.local_host_group, "--local-host-group")
    if groups:
        _plain_or_groups("--local-host-group", {"--local-hosts": a.local_hosts, "--local-host-resources":
                                                a.local_host_resources, "--local-host-labels": a.local_host_labels})
    res = parse_resources_flag(a.local_host_resources) if a.local_host_resources else None
    labels = parse_labels(a.local_host_labels or "", "--local-host-labels")
    if res is not None:
        check_for_hosts(labels, res.gpu > 0, "--local-host-labels")
    n = a.local_hosts if a.local_hosts is not None or res is None else 1
    return n, res, labels, groups


def _add_sim_server_flags(s: argparse.ArgumentParser) -> None:
    s.add_argument("--sim-hosts", type=int, default=None,
                   help="--backend sim: number of simulated hosts sim-00000.. (default 100)")
    s.add_argument("--sim-host-resources", default=None,
                   help="--backend sim: size of each host, cpu=64,mem=256Gi,gpu=8[,disk=Q] (the default)")
    s.add_argument("--sim-racks", type=int, default=None,
                   help="--backend sim: racks the hosts are spread over, label rack=r0.. (default 10, at most the "
                        "number of hosts)")
    s.add_argument("--sim-seed", type=int, default=None,
                   help="--backend sim: seed of the rack assignment and of task durations drawn from ranges "
                        "(default 0)")
    s.add_argument("--sim-ports-per-host", type=int, default=None,
                   help="--backend sim: ports 31000.. of each host (default 1000)")
    s.add_argument("--sim-host-labels", default=None, metavar="K=V[,K=V]",
                   help="--backend sim: labels of the --sim-hosts hosts, e.g. gpu_model=t4,nic_gbps=50,gpu_link=pcie "
                        "(beside host and rack; GPU hosts have gpu_model=sim-gpu unless it is given)")
    s.add_argument("--sim-host-group", action="append", default=None, metavar="COUNT:RESOURCES[:LABELS]",
                   help="--backend sim: COUNT hosts of RESOURCES with LABELS, e.g. 8:cpu=48,mem=192Gi,gpu=4:"
                        "gpu_model=t4,nic_gbps=50 (repeatable: a heterogeneous cluster, the groups' hosts numbered "
                        "in order; instead of --sim-hosts, --sim-host-resources and --sim-host-labels)")


def _add_sim_parsers(sub: Any) -> None:
    sm = sub.add_parser("sim", help="failure injection into a daemon that runs the sim backend").add_subparsers(
        dest="cmd", required=True)
    x = sm.add_parser("fail-host", help="fail a simulated host: its tasks end LOST and it offers nothing until it "
                                        "recovers")
    x.add_argument("hostname", metavar="HOST", help="e.g. sim-00042")
    x.add_argument("--recover-after", default=None, metavar="DURATION",
                   help="bring the host back by itself after this long (30s, 2m, 500ms, 1.5); default: it stays "
                        "down until `peloton sim recover-host`")
    x.set_defaults(fn=cmd_sim_fail_host)
    x = sm.add_parser("recover-host", help="bring a failed simulated host back, empty")
    x.add_argument("hostname", metavar="HOST")
    x.set_defaults(fn=cmd_sim_recover_host)


def cmd_server(a: argparse.Namespace) -> int:
    from peloton import logs, run_as
    from peloton.domain.resources import parse_mib
    from peloton.hostmgr.local.task_env import parse_allow
    from peloton.server import MesosSettings, ServerConfig, run_server

    logs.configure(a.log_level, a.log_format)
    sim = _sim_settings(a)
    local_hosts, res, local_labels, local_groups = _local_hosts(a)
    mesos = None
    if a.backend == "mesos":
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
        local_hosts=local_hosts, local_host_resources=res, local_host_labels=local_labels,
        local_host_groups=local_groups, local_port_base=a.local_port_base,
        metrics_listen=a.metrics_listen, backend=a.backend, mesos=mesos,
        roles=frozenset(r.strip() for r in a.role.split(",") if r.strip()),
        resmgr_address=a.resmgr, hostmgr_address=a.hostmgr, standby=a.standby, sim=sim,
        advertise_address=a.advertise_address, leader_lease_s=a.leader_lease,
        jobmgr_writers=a.jobmgr_writers, internal_listen=a.internal_listen,
        internal_secret_file=Path(a.internal_secret_file) if a.internal_secret_file else None, insecure=a.insecure,
        task_env_allow=parse_allow(a.task_env_allow), default_task_user=a.default_task_user,
        task_uid_range=run_as.parse_uid_range(a.task_uid_range),
        unix_socket=a.unix_socket, tls_cert=Path(a.tls_cert) if a.tls_cert else None, tls_key=Path(a.tls_key) if a.tls_key else None,
        tls_client_ca=Path(a.tls_client_ca) if a.tls_client_ca else None, metrics_tls=a.metrics_tls,
        principals_file=Path(a.principals_file) if a.principals_file else None, rate_limit=a.rate_limit,
        max_waiting_jobs=a.max_waiting_jobs, gpu_table=Path(a.gpu_table) if a.gpu_table else None,
        preemption_settle_s=a.preemption_settle, preemption=not a.no_preemption,
        job_retention_s=_retention(a.job_retention, "--job-retention"),
        audit_retention_s=_retention(a.audit_retention, "--audit-retention"),
        sandbox_retention_s=_retention(a.sandbox_retention, "--sandbox-retention"),
        sandbox_max_count=a.sandbox_max_count,
        sandbox_max_bytes=int(parse_mib(a.sandbox_max_size, "--sandbox-max-size") * (1 << 20)),
        metrics_host_limit=a.metrics_host_limit,
        task_log_max_bytes=int(parse_mib(a.task_log_max, "--task-log-max") * (1 << 20)),
        task_log_keep=a.task_log_keep, task_cgroups=a.task_cgroups,
    )
    if a.print_config:  # what it would run with, once every value has been checked
        from peloton.cli import server_config

        cfg.check()
        sys.stdout.write(server_config.render(a.server_parser, a))
        return 0
    run_server(cfg)
    return 0


def cmd_certs_init(a: argparse.Namespace) -> int:
    from peloton import certs

    w = certs.init(Path(a.dir), [n for v in a.name for n in v.split(",") if n], a.client, force=a.force)
    d = w.directory
    print(f"""wrote {d}/ca.pem (the CA), server.pem + server-key.pem ({", ".join(w.server_names)}),
client.pem + client-key.pem (client {w.client_name!r}); keys are mode 0600.

serve:   peloton server --tls-cert {d}/server.pem --tls-key {d}/server-key.pem --tls-client-ca {d}/ca.pem
connect: peloton --tls-ca {d}/ca.pem --client-cert {d}/client.pem --client-key {d}/client-key.pem job list
         (or the same in a context of ~/.config/peloton/config.toml: tls-ca, client-cert, client-key)""")
    return 0


def cmd_token_create(a: argparse.Namespace) -> int:
    from peloton.identity import add_token

    path = Path(a.principals_file) if a.principals_file else \
        (Path(a.data_dir) if a.data_dir else config.default_data_dir()) / "principals.json"
    token = add_token(path, a.name, a.role, a.user)
    print(token)
    print(f"peloton: token for {a.name} added to {path} (only its hash is kept: this is the one time it is shown; "
          "a running daemon picks it up within a second)", file=sys.stderr)
    return 0


def cmd_db_upgrade(a: argparse.Namespace) -> int:
    from peloton.store import db

    data_dir = Path(a.data_dir) if a.data_dir else config.default_data_dir()
    url = a.db or db.default_sqlite_url(data_dir)
    db.upgrade(url)
    print(f"database at revision {db.current_revision(url)}")
    return 0


# --- parser ---------------------------------------------------------------------------------------------------
def _retention(text: str, flag: str) -> float:
    """A retention period: 0 (keep), or a duration with s, m, h or d (30d, 12h)."""
    from peloton.hostmgr.sim.durations import parse_duration

    t = text.strip()
    seconds = float(t[:-1]) * 86400 if t.endswith("d") and t[:-1].replace(".", "", 1).isdigit() \
        else parse_duration(t, flag)
    if seconds < 0:
        raise InvalidArgument(f"{flag}: must not be negative, got {text!r}", field=flag)
    return seconds


def _seconds_arg(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 <= v <= 86400:
        raise argparse.ArgumentTypeError(f"{text} is not between 0 and 86400 seconds")
    return v


class _Parser(argparse.ArgumentParser):
    """argparse with the CLI's errors: one line, `peloton: error: COMMAND: FLAG: why`, and a "did you mean" for a
    mistyped command, choice or flag (Python 3.11's argparse suggests nothing)."""

    def error(self, message: str) -> NoReturn:  # type: ignore[override]
        message = message.removeprefix("argument ")  # "argument --limit: ..." -> "--limit: ..."
        if message.startswith("the following arguments are required: "):
            missing = message.removeprefix("the following arguments are required: ")
            message = f"missing {missing}"
            subs = [a for a in self._actions if isinstance(a, argparse._SubParsersAction)]
            if subs and missing.split(",")[0] == subs[0].metavar:
                message += f" (one of {', '.join(subs[0].choices)})"
        where = self.prog.removeprefix("peloton").strip()
        if "did you mean" not in message and "one of" not in message:  # else the line says what to type already
            message += f" (see `{self.prog} --help`)"
        self.exit(EXIT_USAGE, f"peloton: error: {where + ': ' if where else ''}{message}\n")

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        if action.choices is None or value in action.choices:
            return
        import difflib

        choices = [str(c) for c in action.choices]
        close = difflib.get_close_matches(str(value), choices, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}?" if close else f"one of {', '.join(choices)}"
        if isinstance(action, argparse._SubParsersAction):
            raise argparse.ArgumentError(None, f"unknown command {value!r} ({hint})")
        name = "/".join(action.option_strings) or str(action.metavar or action.dest)
        raise argparse.ArgumentError(None, f"{name}: invalid choice {value!r} ({hint})")

    def parse_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                   namespace: argparse.Namespace | None = None) -> argparse.Namespace:
        ns, extra = self.parse_known_args(args, namespace)
        if extra:
            leaf = _leaf(self, ns)
            flag = extra[0].split("=", 1)[0]
            if flag.startswith("-") and flag != "-":
                import difflib

                options = [o for a in leaf._actions for o in a.option_strings if a.help != argparse.SUPPRESS]
                close = difflib.get_close_matches(flag, options, n=1, cutoff=0.6)
                leaf.error(f"unknown flag {flag}" + (f" (did you mean {close[0]}?)" if close else ""))
            leaf.error(f"unexpected argument{'s' if len(extra) > 1 else ''} {' '.join(map(repr, extra))}")
        return ns


def _leaf(p: argparse.ArgumentParser, ns: argparse.Namespace) -> argparse.ArgumentParser:
    """The (sub)parser of the command `ns` was parsed for: `peloton job list` -> the parser of `list`."""
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen = getattr(ns, action.dest, None)
            if chosen in action.choices:
                return _leaf(action.choices[chosen], ns)
    return p


def _subparsers(p: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    return [sp for a in p._actions if isinstance(a, argparse._SubParsersAction) for sp in a.choices.values()]


def _client_flags(p: argparse.ArgumentParser | argparse._ArgumentGroup, default: object) -> None:
    """Which daemon and how: before the command (`default` None) and again after it on every client command
    (`default` SUPPRESS: absent unless given, so a value after the command wins over one before it)."""
    p.add_argument("--address", default=default,
                   help="daemon HOST:PORT or unix:PATH, or several comma-separated (a leader and its standbys; "
                        "default: $PELOTON_ADDRESS, the config's context, the local socket, or 127.0.0.1:5391)")
    p.add_argument("--context", default=default, metavar="NAME",
                   help="context of ~/.config/peloton/config.toml to use (default: $PELOTON_CONTEXT, or its "
                        "current-context)")
    p.add_argument("--tls-ca", default=default, metavar="FILE",
                   help="talk TLS, trusting the CA in FILE for the daemon's certificate ($PELOTON_TLS_CA)")
    p.add_argument("--client-cert", default=default, metavar="FILE",
                   help="client certificate for mutual TLS ($PELOTON_CLIENT_CERT; with --client-key)")
    p.add_argument("--client-key", default=default, metavar="FILE",
                   help="the client certificate's key ($PELOTON_CLIENT_KEY)")
    p.add_argument("--token", default=default, metavar="TOKEN",
                   help="bearer token of a principal (`peloton token create`; $PELOTON_TOKEN; prefer the environment "
                        "or a context: a flag shows in the process list)")
    p.add_argument("--rpc-timeout", type=float, default=30.0 if default is None else default, help=argparse.SUPPRESS)


# help and metavar of arguments many commands share, where their definition gives none
COMMON_HELP = {
    "job_id": ("JOB_ID", "the job's id, as `job create` printed it (`job list` lists them)"),
    "instance": ("INSTANCE", "the task's instance number in the job (0, 1, ...; `task list` lists them)"),
    "path": ("PATH", "the pool's path, e.g. /research/vision"),
    "hostname": ("HOST", "the host's name, as `host list` shows it"),
}


def _finish(p: argparse.ArgumentParser) -> None:
    """Once every command is defined: the client flags after each client command too, the shared arguments'
    help, and `COMMAND` for the subcommand slot (errors then read "missing COMMAND")."""
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            action.metavar = "GROUP" if p.prog == "peloton" else "COMMAND"
        elif action.help is None and action.dest in COMMON_HELP:
            if not action.option_strings:
                action.metavar = action.metavar or COMMON_HELP[action.dest][0]
            action.help = COMMON_HELP[action.dest][1]
    if "fn" in p._defaults:
        _client_flags(p.add_argument_group("connection (also accepted before the group; given in both places, "
                                           "the one after the command wins)"), argparse.SUPPRESS)
    for sp in _subparsers(p):
        _finish(sp)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="peloton", description="Gang-scheduling workload manager for GPU clusters",
                allow_abbrev=False)  # `certs init --client` is not a prefix of --client-cert
    p.add_argument("--version", action="version", version=f"peloton {__version__}")
    _client_flags(p, None)
    sub = p.add_subparsers(dest="group", required=True)

    # -o before the group too (`peloton -o json job list`); after the command it wins (SUPPRESS: absent unless given)
    p.add_argument("-o", "--output", choices=["table", "json"], default=None,
                   help="output of the commands that print records: table (default) or json (also after the command)")

    def out(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("-o", "--output", choices=["table", "json"], default=argparse.SUPPRESS,
                        help="table (default) or json: a stable record of every field (docs/cli.md, JSON output)")
        sp.set_defaults(prints_records=True)

    s = sub.add_parser("server", help="run the daemon")
    p.set_defaults(server_parser=s)  # (main layers the config file and the environment under its flags)
    s.add_argument("--config", default=None, metavar="FILE",
                   help="a TOML file of settings: keys are these flags' names (metrics-listen = \"...\"); "
                        "PELOTON_<FLAG> variables override it, flags override both (default: $PELOTON_SERVER_CONFIG)")
    s.add_argument("--print-config", action="store_true",
                   help="print the effective settings (file, environment, flags) as TOML and exit")
    s.add_argument("--listen", default=config.DEFAULT_LISTEN, help="gRPC HOST:PORT (default %(default)s)")
    s.add_argument("--db", default=None, help="database URL (default: SQLite in the data dir)")
    s.add_argument("--data-dir", default=None,
                   help="default: $PELOTON_DATA_DIR, else $XDG_DATA_HOME/peloton, else ~/.local/share/peloton "
                        "(/var/lib/peloton for root)")
    s.add_argument("--local-hosts", type=int, default=None, help="simulate N hosts on this machine")
    s.add_argument("--local-host-resources", default=None, help="size of each simulated host: cpu=8,mem=16Gi,gpu=2")
    s.add_argument("--local-host-labels", default=None, metavar="K=V[,K=V]",
                   help="labels of the local hosts (the simulated ones of --local-hosts, or this machine), e.g. "
                        "gpu_model=a100,nic_gbps=100,gpu_link=nvlink")
    s.add_argument("--local-host-group", action="append", default=None, metavar="COUNT:RESOURCES[:LABELS]",
                   help="COUNT simulated hosts of RESOURCES with LABELS, e.g. 2:cpu=4,mem=8Gi,gpu=2:gpu_model=t4 "
                        "(repeatable: a heterogeneous cluster, local-0.. in the groups' order; instead of "
                        "--local-hosts, --local-host-resources and --local-host-labels)")
    s.add_argument("--local-port-base", type=int, default=31000, help="first port of host 0's range (1000 per host)")
    s.add_argument("--metrics-listen", default=config.DEFAULT_METRICS_LISTEN,
                   help="Prometheus HOST:PORT ('' to disable; default %(default)s)")
    s.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"],
                   help="the least severe log lines written (default %(default)s)")
    s.add_argument("--log-format", default="text", choices=["text", "json"],
                   help="log lines as text (default) or one JSON object each (time, level, logger, message, ids)")
    s.add_argument("--role", default="jobmgr,resmgr,placement,hostmgr",
                   help="components this process runs (comma-separated; default: all four in one daemon)")
    s.add_argument("--resmgr", default="", help="HOST:PORT of the resmgr process when this one does not run it")
    s.add_argument("--hostmgr", default="", help="HOST:PORT of the hostmgr process when this one does not run it")
    s.add_argument("--internal-listen", default="", metavar="ADDRESS",
                   help="where the internal services of this process's resmgr/hostmgr are served for the other "
                        "processes of a split deployment (default with --role: unix:<data-dir>/internal.sock); never "
                        "on --listen")
    s.add_argument("--internal-secret-file", default=None, metavar="FILE",
                   help="the secret every component of a split deployment presents to the others (default "
                        "<data-dir>/internal.secret, created owner-only when missing by a process that serves the "
                        "internal services); give all processes the same file")
    s.add_argument("--insecure", action="store_true",
                   help="serve --listen / --internal-listen on an address other machines can reach although there "
                        "is no TLS or authentication (refused without it)")
    s.add_argument("--task-env-allow", default="", metavar="NAME[,PREFIX*]",
                   help="local backend: variables of the daemon's environment tasks inherit besides PATH, HOME, "
                        "USER, LOGNAME, SHELL, LANG, LANGUAGE, LC_*, TZ, TMPDIR, TERM (e.g. LD_LIBRARY_PATH,NCCL_*)")
    s.add_argument("--default-task-user", default=None, metavar="USER",
                   help="local backend: the user that runs tasks whose job names no task.user (default: nobody "
                        "when the daemon runs as root, else the daemon's own user; root here is logged)")
    s.add_argument("--task-uid-range", default="65536-99999", metavar="LO-HI",
                   help="a root daemon's local backend with authentication: the uids allocated, one each and for "
                        "good, to principals the principals file maps no Unix user to (their tasks run as it); "
                        "must not hold this host's users, groups or subordinate ids (default %(default)s)")
    s.add_argument("--preemption-settle", type=_seconds_arg, default=10.0, metavar="SECONDS",
                   help="how long a gang waits (within its pool's entitlement with no hosts free, or behind "
                        "lower-priority gangs of its pool) before it may preempt others (default: 10)")
    s.add_argument("--no-preemption", action="store_true",
                   help="never preempt: gangs wait for capacity to free up on its own (hosts are still reserved "
                        "for a pool's first gang that no hosts fit)")
    s.add_argument("--job-retention", default="30d", metavar="DURATION",
                   help="finished jobs, their history and their sandboxes are deleted this long after they ended "
                        "(30d, 12h, 90m; 0: kept until `job delete`; default %(default)s)")
    s.add_argument("--metrics-host-limit", type=int, default=1000, metavar="N",
                   help="export the per-host series (peloton_host_capacity/_allocated, 8 a host) while the cluster "
                        "has at most N hosts; 0: never (default %(default)s; the cluster's totals always)")
    s.add_argument("--sandbox-retention", default="7d", metavar="DURATION",
                   help="local backend: the sandbox (logs and files) of a task that ended is removed this long "
                        "after it ended, even while its job is kept (earlier attempts of a long-lived job); 0: kept "
                        "until its job is deleted (default %(default)s)")
    s.add_argument("--sandbox-max-count", type=int, default=1000, metavar="N",
                   help="local backend: at most N sandboxes of ended tasks are kept, whatever their age: past it the "
                        "oldest go, failed tasks' last (0: no bound; default %(default)s)")
    s.add_argument("--sandbox-max-size", default="10Gi", metavar="SIZE",
                   help="local backend: the sandboxes of ended tasks kept hold at most this much disk: past it the "
                        "oldest go, failed tasks' last (0: no bound; default %(default)s)")
    s.add_argument("--task-cgroups", choices=["auto", "off"], default="auto",
                   help="local backend: auto puts each task into a cgroup (v2) of its own, so that nothing it starts "
                        "(setsid, double fork, another process group) outlives its stop or its end, where this "
                        "daemon can make cgroups (root, cgroup v2 mounted); otherwise, and with off, each task's "
                        "wrapper is a child subreaper that catches less (docs/running.md) (default %(default)s)")
    s.add_argument("--task-log-max", default="100Mi", metavar="SIZE",
                   help="local backend: a running task's stdout or stderr larger than this is rotated (moved to "
                        "stdout.1, ...; checked every 10 s); 0: never (default %(default)s)")
    s.add_argument("--task-log-keep", type=int, default=2, metavar="N",
                   help="local backend: rotated files kept per stream, 1 to 100 (default %(default)s)")
    s.add_argument("--audit-retention", default="90d", metavar="DURATION",
                   help="audit records are deleted after this long (0: kept; default %(default)s)")
    s.add_argument("--jobmgr-writers", type=int, default=None, metavar="N",
                   help="shards of jobs, each committed by its own writer thread and connection (default: 1 on "
                        "SQLite, which allows no more, 2 on PostgreSQL)")
    s.add_argument("--standby", action="store_true",
                   help="when another daemon acts on the same store, wait for it to go and take over instead of "
                        "refusing to start; meanwhile answer every call with the leader's address")
    s.add_argument("--advertise-address", default="", metavar="HOST:PORT",
                   help="where other machines reach this daemon's API: what standbys tell clients when this one "
                        "leads (default: --listen, with this machine's name for a wildcard host)")
    s.add_argument("--leader-lease", type=_seconds_arg, default=6.0, metavar="SECONDS",
                   help="PostgreSQL: a leader that has not renewed its lease for this long (paused, or cut off) is "
                        "replaced by a standby; it stops acting itself after half of it (default: 6)")
    s.add_argument("--backend", default="local", choices=["local", "mesos", "sim"],
                   help="local: run tasks on this machine (default); mesos: register as a Mesos framework; "
                        "sim: simulated hosts in memory, no processes (scale tests, see --sim-*)")
    s.add_argument("--mesos-master", default="", help="comma-separated master URLs: http://m1:5050,http://m2:5050")
    s.add_argument("--mesos-role", default="*", help="framework role (default %(default)s)")
    s.add_argument("--mesos-principal", default="", help="principal for HTTP basic authentication")
    s.add_argument("--mesos-secret-file", default="", help="file holding the principal's secret")
    s.add_argument("--mesos-failover-timeout", type=float, default=7 * 24 * 3600.0,
                   help="seconds Mesos keeps our tasks while the framework is disconnected (default: one week)")
    s.add_argument("--mesos-framework-name", default="peloton",
                   help="the name the framework registers with (default %(default)s)")
    s.add_argument("--mesos-user", default="nobody",
                   help="the framework's user: tasks whose job names no task.user run as it on the agents (root "
                        "here is logged: such tasks then run as root whatever their pool allows)")
    s.add_argument("--unix-socket", default=None, metavar="PATH",
                   help="serve the API on this Unix socket too, owner-only (default <data-dir>/peloton.sock, which "
                        "the CLI of the same user uses by default; '' for none)")
    s.add_argument("--tls-cert", default=None, metavar="FILE",
                   help="serve the API over TLS with this certificate (PEM; with --tls-key)")
    s.add_argument("--tls-key", default=None, metavar="FILE", help="its private key (PEM, mode 0600)")
    s.add_argument("--principals-file", default=None, metavar="FILE",
                   help="principals, roles and token hashes (default <data-dir>/principals.json when it exists); "
                        "with it, every call must be authenticated (docs/security.md)")
    s.add_argument("--rate-limit", type=float, default=50.0, metavar="N",
                   help="with authentication: changing calls (create, stop, delete, pools) a principal may make a "
                        "second, in bursts of 4 s worth; beyond, RESOURCE_EXHAUSTED (default %(default)g; 0: none)")
    s.add_argument("--max-waiting-jobs", type=int, default=10_000, metavar="N",
                   help="with authentication: jobs a principal may have waiting to start (default %(default)d; 0: "
                        "none)")
    s.add_argument("--gpu-table", default=None, metavar="FILE",
                   help="model-aware plans: a JSON object of GPU models' relative throughputs (a T4 is 1) that replace "
                        "or extend the built-in table, e.g. {\"v100\": {\"relative\": 2.1}} (docs/model-aware.md)")
    s.add_argument("--tls-client-ca", default=None, metavar="FILE",
                   help="mutual TLS: serve only clients with a certificate of this CA (their subject names them)")
    s.add_argument("--metrics-tls", action="store_true",
                   help="serve the metrics endpoint over TLS too (same certificate; and client CA if given)")
    _add_sim_server_flags(s)
    s.set_defaults(server_fn=cmd_server)

    c = sub.add_parser("certs", help="certificates for TLS").add_subparsers(dest="cmd", required=True)
    ci = c.add_parser("init", help="write a private CA, a server and a client certificate into DIR")
    ci.add_argument("dir", metavar="DIR", help="where to write them (created if missing)")
    ci.add_argument("--name", action="append", default=[], metavar="HOST",
                    help="a name or IP address clients use for the daemon (repeatable; localhost, 127.0.0.1 "
                         "and ::1 are always included)")
    ci.add_argument("--client", default="admin", metavar="NAME",
                    help="the client certificate's subject: who its holder is (default %(default)s)")
    ci.add_argument("--force", action="store_true", help="replace certificates already in DIR")
    ci.set_defaults(server_fn=cmd_certs_init)

    t = sub.add_parser("token", help="bearer tokens of principals").add_subparsers(dest="cmd", required=True)
    tc = t.add_parser("create", help="add a token for a principal to the principals file and print it (once)")
    tc.add_argument("name", metavar="NAME", help="the principal, e.g. alice or ci-bot")
    tc.add_argument("--role", action="append", default=[], choices=["admin", "operator", "submitter", "viewer"],
                    help="its role (repeatable); required for a new principal, replaces an existing one's roles")
    tc.add_argument("--user", default=None, metavar="USER",
                    help="map the principal to this Unix user of the hosts: its tasks run as it (a root daemon's "
                         "local backend, Mesos); without one a root daemon runs them as a uid of the principal's own; "
                         "one user belongs to one principal; \"\" removes the mapping")
    tc.add_argument("--principals-file", default=None, metavar="FILE",
                    help="default <data-dir>/principals.json, which a daemon with that data dir reads")
    tc.add_argument("--data-dir", default=None, metavar="DIR",
                    help="the daemon's data dir, whose principals.json is meant (default: the default data dir)")
    tc.set_defaults(server_fn=cmd_token_create)

    d = sub.add_parser("db", help="database maintenance").add_subparsers(dest="cmd", required=True)
    up = d.add_parser("upgrade", help="apply migrations")
    up.add_argument("--db", default=None, metavar="URL", help="database URL (default: SQLite in the data dir)")
    up.add_argument("--data-dir", default=None, metavar="DIR",
                    help="the data dir of the SQLite store (default: the default data dir)")
    up.set_defaults(server_fn=cmd_db_upgrade)

    def grace(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--reconnect-grace", type=float, default=60.0, metavar="SECONDS",
                        help="how long the daemon may stay unreachable (a restart) before giving up with exit code "
                             "69 (default %(default)g)")

    def logs_flags(sp: argparse.ArgumentParser, whose: str, follow: str) -> None:
        sp.add_argument("--stderr", action="store_true", help="the stderr log instead of stdout")
        sp.add_argument("--tail", type=int, default=None, metavar="LINES",
                        help=f"only the last LINES lines of {whose}'s log (default: the whole log)")
        sp.add_argument("-f", "--follow", action="store_true", help=follow)

    j = sub.add_parser("job", help="jobs").add_subparsers(dest="cmd", required=True)
    x = j.add_parser("create", help="submit a job spec (YAML); prints the job id")
    x.add_argument("-f", "--file", required=True, help="spec file, or - for stdin")
    x.set_defaults(fn="jobs:cmd_job_create")
    x = j.add_parser("plan", help="a model-aware spec's best plans on the cluster now (nothing is created)")
    x.add_argument("-f", "--file", required=True, help="spec file, or - for stdin")
    x.add_argument("--top", type=int, default=5, help="how many plans (default 5)")
    out(x)
    x.set_defaults(fn="jobs:cmd_job_plan")
    x = j.add_parser("get", help="state, gangs (and why pending), tasks")
    x.add_argument("job_id")
    out(x)
    x.add_argument("-w", "--watch", action="store_true",
                   help="print the view again whenever the job or a task changes, until the job ends")
    x.add_argument("--all", action="store_true", dest="every_row",
                   help="a row per task and a line per gang (by default, past 20 they are grouped by state)")
    grace(x)
    x.set_defaults(fn="jobs:cmd_job_get")
    x = j.add_parser("list", help="list jobs, newest first")
    x.add_argument("--state", action="append", metavar="STATE",
                   help="only jobs in this state (repeatable, or comma-separated; case-insensitive): INITIALIZED, "
                        "PENDING, RUNNING, SUCCEEDED, FAILED, FAILING, KILLING, KILLED")
    x.add_argument("--owner", metavar="OWNER", help="only jobs of this owner (spec field owner)")
    x.add_argument("--respool", "--pool", dest="respool", metavar="POOL",
                   help="only jobs submitted to this pool (its path, e.g. /research; not its subtree)")
    x.add_argument("--limit", type=int, default=100, metavar="N",
                   help="at most this many (default %(default)s; 0: every job)")
    x.add_argument("-q", "--quiet", action="store_true",
                   help="print only the job ids, one a line (for scripts: peloton job stop $(peloton job list -q))")
    out(x)
    x.set_defaults(fn="jobs:cmd_job_list")
    x = j.add_parser("stop", help="kill every task of the jobs named, or of the unfinished jobs a selection matches "
                                  "(after a confirmation)")
    x.add_argument("job_ids", nargs="*", metavar="JOB_ID", help="the jobs to stop (any number)")
    x.add_argument("--owner", metavar="OWNER", help="select the unfinished jobs of this owner")
    x.add_argument("--state", action="append", metavar="STATE",
                   help="select the jobs in this state (repeatable, or comma-separated; default: every unfinished "
                        "state)")
    x.add_argument("--pool", metavar="POOL", help="select the unfinished jobs of this pool (its path)")
    x.add_argument("-y", "--yes", action="store_true",
                   help="stop the jobs a selection matches without asking (needed when stdin is not a terminal)")
    x.set_defaults(fn="jobs:cmd_job_stop")
    x = j.add_parser("delete", help="delete a finished job and its history")
    x.add_argument("job_id")
    x.set_defaults(fn="jobs:cmd_job_delete")
    x = j.add_parser("wait", help="wait for the job to end; exit 0 only if it SUCCEEDED")
    x.add_argument("job_id")
    x.add_argument("--timeout", dest="wait_timeout", type=float, default=0, metavar="SECONDS",
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

    t = sub.add_parser("task", help="tasks").add_subparsers(dest="cmd", required=True)
    x = t.add_parser("list", help="every task of a job: state, host, ports, GPUs, exit code")
    x.add_argument("job_id")
    out(x)
    x.set_defaults(fn="tasks:cmd_task_list")
    x = t.add_parser("get", help="a task with its event history")
    x.add_argument("job_id")
    x.add_argument("instance", type=int)
    out(x)
    x.set_defaults(fn="tasks:cmd_task_get")
    x = t.add_parser("logs", help="a task's stdout (or --stderr)")
    x.add_argument("job_id")
    x.add_argument("instance", type=int)
    x.add_argument("--attempt", type=int, default=0, metavar="N",
                   help="the attempt (the last number of a task id; default: the current attempt)")
    logs_flags(x, "the attempt", "then print what the task writes, until its attempt ends")
    grace(x)
    x.set_defaults(fn="tasks:cmd_task_logs")

    rp = sub.add_parser("pool", help="resource pools").add_subparsers(dest="cmd", required=True)
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
    x = rp.add_parser("list", help="every pool: reservation, limit, share, allocation, demand, entitlement, queue")
    out(x)
    x.set_defaults(fn="admin:cmd_pool_list")
    x = rp.add_parser("get", help="one pool, per resource")
    x.add_argument("path", metavar="PATH")
    out(x)
    x.set_defaults(fn="admin:cmd_pool_get")
    x = rp.add_parser("delete", help="delete a pool without children, jobs or queued gangs")
    x.add_argument("path", metavar="PATH")
    x.set_defaults(fn="admin:cmd_pool_delete")

    from peloton.cli import model, model_offline

    models = sub.add_parser("model", help="model documents of model-aware plans: stored in the daemon (create, get, "
                                          "list, refit, delete), and offline (fit a profile, predict, plan)"
                            ).add_subparsers(dest="cmd", required=True)
    model.register_stored(models, out)
    model_offline.register(models)  # no daemon: model_offline.py

    x = sub.add_parser("queue", help="the gangs waiting for admission or placement, in queue order, and why")
    x.add_argument("pool", nargs="?", metavar="POOL", help="this pool and its subtree (default: every pool)")
    x.add_argument("--limit", type=int, default=1000, metavar="N", help="at most N gangs (default 1000)")
    out(x)
    x.set_defaults(fn="admin:cmd_queue")

    cl = sub.add_parser("cluster", help="the daemon itself").add_subparsers(dest="cmd", required=True)
    x = cl.add_parser("info", help="version, roles, store, backend, uptime, how it is secured, and who you are")
    out(x)
    x.set_defaults(fn="admin:cmd_cluster_info")

    h = sub.add_parser("host", help="hosts").add_subparsers(dest="cmd", required=True)
    x = h.add_parser("list", help="every host: capacity, allocation, tasks, and whether it is draining")
    out(x)
    x.set_defaults(fn="admin:cmd_host_list")
    x = h.add_parser("get", help="one host: capacity, allocation, tasks, drain, and the GPU model, GPU link and "
                                 "network bandwidth the model-aware cost model assumes of it")
    x.add_argument("hostname", metavar="HOST")
    out(x)
    x.set_defaults(fn="admin:cmd_host_get")
    x = h.add_parser("drain", help="take a host out of service: no new gangs on it; at --deadline the gangs still "
                                   "there are preempted whole (back to their queue, no attempt lost)")
    x.add_argument("hostname", metavar="HOST")
    x.add_argument("--deadline", default=None, metavar="DURATION",
                   help="how long the gangs on the host may run on (30m, 2h); default: until they end")
    out(x)
    x.set_defaults(fn="admin:cmd_host_drain")
    x = h.add_parser("undrain", help="put a drained host back in service")
    x.add_argument("hostname", metavar="HOST")
    out(x)
    x.set_defaults(fn="admin:cmd_host_undrain")

    x = sub.add_parser("audit", help="the audit log: changing and refused calls, newest first (admin, operator)")
    x.add_argument("--principal", default=None, help="only this principal's calls")
    x.add_argument("--object", default=None, metavar="ID", help="only calls about this job id, pool path, host or model")
    x.add_argument("--since", default=None, metavar="DURATION", help="only the last DURATION (30s, 15m, 2h)")
    x.add_argument("--denied", action="store_true", help="only refused calls")
    x.add_argument("--limit", type=int, default=100, help="at most this many (1-1000, default %(default)s)")
    out(x)
    x.set_defaults(fn="admin:cmd_audit")
    _add_sim_parsers(sub)
    x = sub.add_parser("completion", help="print a shell completion script: "
                                          "source <(peloton completion bash), or zsh")
    x.add_argument("shell", choices=["bash", "zsh"], help="the shell the script is for")
    x.set_defaults(server_fn=_cmd_completion)
    _finish(p)
    return p


def _cmd_completion(a: argparse.Namespace) -> int:
    from peloton.cli.completion import script

    sys.stdout.write(script(build_parser(), a.shell))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """The `peloton` command: its exit code. Run as the program (`argv` None), a client command ends the process
    itself once its output is flushed (os._exit): tearing down the interpreter takes milliseconds that a
    command has no use for. Given `argv`, it returns."""
    import os

    args: argparse.Namespace | None = None
    try:
        parser = build_parser()
        raw = list(sys.argv[1:] if argv is None else argv)
        args = parser.parse_args(raw)
        if args.output is None:
            args.output = "table"
        elif not getattr(args, "prints_records", False):
            command = " ".join(str(w) for w in (args.group, getattr(args, "cmd", None)) if w)
            parser.exit(EXIT_USAGE, f"peloton: error: -o/--output: `peloton {command}` has no output format to "
                                    "choose\n")
        if getattr(args, "server_fn", None) is cmd_server:
            args = _with_config(parser, raw, args)
        code = _run(args)
        sys.stdout.flush()  # here, where a closed pipe can still be handled
    except KeyboardInterrupt:
        code = EXIT_INTERRUPTED
    except BrokenPipeError:
        # the reader went away (`peloton job list | head -3`): stop quietly; stdout to /dev/null so that the
        # interpreter's last flush does not complain either
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        code = EXIT_BROKEN_PIPE
    if argv is None and args is not None and not hasattr(args, "server_fn"):
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except OSError:  # a closed pipe: nothing more can be said
            pass
        os._exit(code)
    return code


def _with_config(parser: argparse.ArgumentParser, raw: list[str], args: argparse.Namespace) -> argparse.Namespace:
    """`peloton server`'s arguments again, with the config file's and the environment's settings under the flags."""
    from peloton.cli import server_config

    at = raw.index("server")
    try:
        layered = server_config.layered(args.server_parser, raw[at + 1:])
    except InvalidArgument as e:
        parser.exit(2, f"peloton: error: {e.message}\n")
    return parser.parse_args([*raw[:at + 1], *layered])


def _run(args: argparse.Namespace) -> int:
    try:
        if hasattr(args, "server_fn"):
            return int(args.server_fn(args))
        from peloton.cli.client import Client
        from peloton.cli.connection import resolve

        client = Client(resolve(args), timeout=args.rpc_timeout)
        client.command = " ".join(str(w) for w in (args.group, getattr(args, "cmd", None)) if w)
        return int(_command(args.fn)(client, args))
    except InvalidArgument as e:
        print(f"peloton: error: {e.message}", file=sys.stderr)
        return EXIT_USAGE
    except PelotonError as e:
        from peloton.cli.reconnect import DaemonUnreachable

        print(f"peloton: error: {e.message}", file=sys.stderr)
        return EXIT_UNAVAILABLE if isinstance(e, DaemonUnreachable) else EXIT_ERROR


def _command(fn: Callable[[Client, argparse.Namespace], int] | str) -> Callable[[Client, argparse.Namespace], int]:
    """A command given as "module:function" (of peloton.cli) is imported only when it runs."""
    if not isinstance(fn, str):
        return fn
    import importlib

    module, _, name = fn.partition(":")
    return getattr(importlib.import_module(f"peloton.cli.{module}"), name)  # type: ignore[no-any-return]


if __name__ == "__main__":
    sys.exit(main())
