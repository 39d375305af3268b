"""The local commands, which talk to no daemon: `server` (run the daemon), `certs init`, `token create`,
`db upgrade`; their parsers and what they run."""

from __future__ import annotations

import argparse
import sys

from peloton import config
from peloton.errors import FailedPrecondition, InvalidArgument

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up time: see parser.py)
if TYPE_CHECKING:
    from pathlib import Path

    from peloton.domain.hostgroups import HostGroup
    from peloton.domain.resources import Resources
    from peloton.hostmgr.sim.backend import SimSettings
else:
    def Path(*parts):  # noqa: N802 - pathlib.Path, imported when first called
        from pathlib import Path

        return Path(*parts)

# store/db.py DURABILITIES, the default first (not imported from there: the parser must not load SQLAlchemy)
STORE_DURABILITIES = ("full", "relaxed")


def _sim_settings(a: argparse.Namespace) -> SimSettings | None:
    """The SimSettings of `server --backend sim`, checked (errors name the flag); None for another backend."""
    from peloton.domain.hostgroups import parse_host_groups
    from peloton.domain.resources import parse_resources_flag
    from peloton.hostmgr.sim.backend import SimSettings
    from peloton.modelaware.hostlabels import check_for_hosts, parse_labels

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
    from peloton.domain.resources import parse_resources_flag
    from peloton.modelaware.hostlabels import check_for_hosts, parse_labels

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



def cmd_server(a: argparse.Namespace) -> int:
    # The daemon's imports (about 600 modules, 100,000 objects that live as long as the process) with the cyclic
    # garbage collector off, then those objects frozen (gc.freeze: never examined again). With it on, collection
    # after collection went over a heap that only grows (60-170 ms of a start on 2 loaded cores), and every full
    # collection while serving went over them all again (60-80 ms each). The cyclic garbage the imports leave
    # (~750 objects) is frozen with them. docs/performance.md, "Starting and stopping the daemon".
    import gc

    gc.disable()
    try:
        from peloton.domain.resources import parse_mib
        from peloton.hostmgr.local.task_env import parse_allow
        from peloton.observability import logs
        from peloton.security import run_as
        from peloton.server import run_server
        from peloton.settings import MesosSettings, ServerConfig
    finally:
        gc.freeze()
        gc.enable()

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
        listen=a.listen, db_url=a.db, store_durability=a.store_durability, data_dir=Path(a.data_dir) if a.data_dir else config.default_data_dir(),
        local_hosts=local_hosts, local_host_resources=res, local_host_labels=local_labels,
        local_host_groups=local_groups, local_port_base=a.local_port_base,
        metrics_listen=a.metrics_listen, ui_listen=a.ui_listen, ui_login_ttl_s=a.ui_login_ttl, backend=a.backend, mesos=mesos,
        roles=frozenset(r.strip() for r in a.role.split(",") if r.strip()),
        resmgr_address=a.resmgr, hostmgr_address=a.hostmgr, standby=a.standby, sim=sim,
        advertise_address=a.advertise_address, leader_lease_s=a.leader_lease,
        jobmgr_writers=a.jobmgr_writers, workers=a.grpc_workers, launchers=a.launchers,
        internal_listen=a.internal_listen,
        internal_secret_file=Path(a.internal_secret_file) if a.internal_secret_file else None, insecure=a.insecure,
        task_env_allow=parse_allow(a.task_env_allow), default_task_user=a.default_task_user,
        task_uid_range=run_as.parse_uid_range(a.task_uid_range),
        unix_socket=a.unix_socket, tls_cert=Path(a.tls_cert) if a.tls_cert else None, tls_key=Path(a.tls_key) if a.tls_key else None,
        tls_client_ca=Path(a.tls_client_ca) if a.tls_client_ca else None, metrics_tls=a.metrics_tls,
        principals_file=Path(a.principals_file) if a.principals_file else None, rate_limit=a.rate_limit,
        max_waiting_jobs=a.max_waiting_jobs, gpu_table=Path(a.gpu_table) if a.gpu_table else None,
        preemption_settle_s=a.preemption_settle, preemption=not a.no_preemption, placement_order=a.placement_order,
        placement_engines=a.placement_engines, placement_engine_lease_s=a.placement_engine_lease,
        queue_order=a.queue_order, queue_promote_after_s=_promote_after(a.queue_promote_after),
        job_retention_s=_retention(a.job_retention, "--job-retention"),
        audit_retention_s=_retention(a.audit_retention, "--audit-retention"),
        sandbox_retention_s=_retention(a.sandbox_retention, "--sandbox-retention"),
        sandbox_max_count=a.sandbox_max_count,
        sandbox_max_bytes=int(parse_mib(a.sandbox_max_size, "--sandbox-max-size") * (1 << 20)),
        metrics_host_limit=a.metrics_host_limit,
        task_log_max_bytes=int(parse_mib(a.task_log_max, "--task-log-max") * (1 << 20)),
        task_log_keep=a.task_log_keep, task_cgroups=a.task_cgroups, warm_wrappers=a.warm_wrappers,
    )
    if a.print_config:  # what it would run with, once every value has been checked
        from peloton.cli import server_config

        cfg.check()
        sys.stdout.write(server_config.render(a.server_parser, a))
        return 0
    run_server(cfg)
    return 0


def cmd_certs_init(a: argparse.Namespace) -> int:
    from peloton.security import certs

    w = certs.init(Path(a.dir), [n for v in a.name for n in v.split(",") if n], a.client, force=a.force)
    d = w.directory
    print(f"""wrote {d}/ca.pem (the CA), server.pem + server-key.pem ({", ".join(w.server_names)}),
client.pem + client-key.pem (client {w.client_name!r}); keys are mode 0600.

serve:   peloton server --tls-cert {d}/server.pem --tls-key {d}/server-key.pem --tls-client-ca {d}/ca.pem
connect: peloton --tls-ca {d}/ca.pem --client-cert {d}/client.pem --client-key {d}/client-key.pem job list
         (or the same in a context of ~/.config/peloton/config.toml: tls-ca, client-cert, client-key)""")
    return 0


def cmd_token_create(a: argparse.Namespace) -> int:
    from peloton.security.identity import add_token, hash_token, token_id

    path = _principals_path(a)
    token = add_token(path, a.name, a.role, a.user)
    print(token)
    print(f"peloton: token {token_id(hash_token(token))} for {a.name} added to {path} (only its hash is kept: this is "
          "the one time it is shown; a running daemon picks it up within a second)", file=sys.stderr)
    return 0


def _principals_path(a: argparse.Namespace) -> Path:
    return Path(a.principals_file) if a.principals_file else \
        (Path(a.data_dir) if a.data_dir else config.default_data_dir()) / "principals.json"


def cmd_token_list(a: argparse.Namespace) -> int:
    from peloton.security.identity import list_principals, token_id

    rows = [("NAME", "ROLES", "USER", "TOKENS")]
    for name, e in sorted(list_principals(_principals_path(a)).items()):
        rows.append((name, ",".join(sorted(e.roles)) or "-", e.user or "-",
                     " ".join(token_id(h) for h in e.tokens) or "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[3])
    return 0


def cmd_token_revoke(a: argparse.Namespace) -> int:
    from peloton.security.identity import revoke_tokens

    path = _principals_path(a)
    gone = revoke_tokens(path, a.name, a.id, a.all)
    print(f"peloton: revoked {len(gone)} token(s) of {a.name} in {path}: {' '.join(gone) or 'none'} (a running "
          "daemon refuses them within a second; streams open with them end within 6 s)", file=sys.stderr)
    return 0


def cmd_db_upgrade(a: argparse.Namespace) -> int:
    from peloton.store import db

    data_dir = Path(a.data_dir) if a.data_dir else config.default_data_dir()
    url = a.db or db.default_sqlite_url(data_dir)
    db.upgrade(url)
    print(f"database at revision {db.current_revision(url)}")
    return 0


def cmd_db_downgrade(a: argparse.Namespace) -> int:
    """Undo migrations down to REVISION, for going back to an older release (docs/running.md, "Rolling back a
    release"). Holds the store lock as a daemon of every role would, so it refuses while a daemon (or a standby
    that took over) acts on the store, naming it."""
    from peloton.leadership.lock import ROLE_KEYS, session_name, store_lock
    from peloton.leadership.owner import Owner
    from peloton.store import db

    data_dir = Path(a.data_dir) if a.data_dir else config.default_data_dir()
    url = a.db or db.default_sqlite_url(data_dir)
    known = db.known_revisions()
    if a.revision not in known:
        raise InvalidArgument(f"REVISION: one of {known[0]} to {known[-1]} (this release's), got {a.revision!r}; "
                              "to remove the whole schema, drop the database (or delete the SQLite file)",
                              field="REVISION")
    file = db.sqlite_path(url)
    if file is not None and not file.exists():  # (SQLite would make an empty one)
        raise FailedPrecondition(f"--db: {db.describe(url)} does not exist", field="--db")
    lock = store_lock(url, session_name(), tuple(ROLE_KEYS))
    if not lock.try_acquire(Owner.me("peloton db downgrade")):
        holder = lock.holder()
        lock.release()
        raise FailedPrecondition(f"another peloton daemon acts on {db.describe(url)}: "
                                 f"{holder.describe() if holder is not None else 'another daemon'}; stop it (and its "
                                 "standbys, which would upgrade the store again) first", field="--db")
    try:
        current = db.current_revision(url)
        if current is None:
            raise FailedPrecondition(f"--db: {db.describe(url)} has no schema to downgrade", field="--db")
        if current in known and current < a.revision:
            raise FailedPrecondition(f"REVISION: {db.describe(url)} is at {current}, older than {a.revision}: "
                                     "`peloton db upgrade` goes forward", field="REVISION")
        db.downgrade(url, a.revision)
    finally:
        lock.release()
    print(f"database at revision {db.current_revision(url)}")
    return 0



def _retention(text: str, flag: str) -> float:
    """A retention period: 0 (keep), or a duration with s, m, h or d (30d, 12h)."""
    from peloton.hostmgr.sim.durations import parse_duration

    t = text.strip()
    seconds = float(t[:-1]) * 86400 if t.endswith("d") and t[:-1].replace(".", "", 1).isdigit() \
        else parse_duration(t, flag)
    if seconds < 0:
        raise InvalidArgument(f"{flag}: must not be negative, got {text!r}", field=flag)
    return seconds


def _promote_after(text: str) -> float:
    """--queue-promote-after: a duration (90m, 4h, or seconds); ServerConfig.check refuses one not positive."""
    from peloton.hostmgr.sim.durations import parse_duration

    return parse_duration(text.strip(), "--queue-promote-after")


def _seconds_arg(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 <= v <= 86400:
        raise argparse.ArgumentTypeError(f"{text} is not between 0 and 86400 seconds")
    return v



def register(name: str, g: argparse.ArgumentParser) -> None:
    """The group `name` (server, certs, token, db) on its parser `g`."""
    if name == "server":
        _server(g)
    elif name == "certs":
        c = g.add_subparsers(dest="cmd", required=True)
        ci = c.add_parser("init", help="write a private CA, a server and a client certificate into DIR")
        ci.add_argument("dir", metavar="DIR", help="where to write them (created if missing)")
        ci.add_argument("--name", action="append", default=[], metavar="HOST",
                        help="a name or IP address clients use for the daemon (repeatable; localhost, 127.0.0.1 "
                             "and ::1 are always included)")
        ci.add_argument("--client", default="admin", metavar="NAME",
                        help="the client certificate's subject: who its holder is (default %(default)s)")
        ci.add_argument("--force", action="store_true", help="replace certificates already in DIR")
        ci.set_defaults(server_fn=cmd_certs_init)
    elif name == "token":
        t = g.add_subparsers(dest="cmd", required=True)
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
        tl = t.add_parser("list", help="the principals in the principals file: roles, Unix user, token ids")
        tr = t.add_parser("revoke", help="remove a principal's tokens from the principals file (by id, or --all)")
        tr.add_argument("name", metavar="NAME", help="the principal")
        tr.add_argument("--id", action="append", default=[], metavar="ID",
                        help="a token's id as `token list` shows it (or a prefix of 6 or more of its digits); "
                             "repeatable")
        tr.add_argument("--all", action="store_true", help="every token of the principal")
        for p in (tl, tr):
            p.add_argument("--principals-file", default=None, metavar="FILE",
                           help="default <data-dir>/principals.json, which a daemon with that data dir reads")
            p.add_argument("--data-dir", default=None, metavar="DIR",
                           help="the daemon's data dir, whose principals.json is meant (default: the default data dir)")
        tl.set_defaults(server_fn=cmd_token_list)
        tr.set_defaults(server_fn=cmd_token_revoke)
    elif name == "db":
        d = g.add_subparsers(dest="cmd", required=True)
        up = d.add_parser("upgrade", help="apply migrations")
        up.add_argument("--db", default=None, metavar="URL", help="database URL (default: SQLite in the data dir)")
        up.add_argument("--data-dir", default=None, metavar="DIR",
                        help="the data dir of the SQLite store (default: the default data dir)")
        up.set_defaults(server_fn=cmd_db_upgrade)
        down = d.add_parser("downgrade", help="undo migrations down to REVISION (before going back to an older release)")
        down.add_argument("revision", metavar="REVISION",
                          help="the schema revision the older release runs on (its `peloton db upgrade` prints it)")
        down.add_argument("--db", default=None, metavar="URL", help="database URL (default: SQLite in the data dir)")
        down.add_argument("--data-dir", default=None, metavar="DIR",
                          help="the data dir of the SQLite store (default: the default data dir)")
        down.set_defaults(server_fn=cmd_db_downgrade)


def _server(s: argparse.ArgumentParser) -> None:
    """`peloton server`'s flags, in the order its help lists them."""
    s.set_defaults(server_parser=s)  # (main layers the config file and the environment under its flags)
    _store_flags(s)
    _local_flags(s)
    _log_flags(s)
    _role_flags(s)
    _task_flags(s)
    _ha_flags(s)
    _backend_flags(s)
    _security_flags(s)
    _add_sim_server_flags(s)
    s.set_defaults(server_fn=cmd_server)


def _store_flags(s: argparse.ArgumentParser) -> None:
    """Where the daemon listens and keeps its state."""
    s.add_argument("--config", default=None, metavar="FILE",
                   help="a TOML file of settings: keys are these flags' names (metrics-listen = \"...\"); "
                        "PELOTON_<FLAG> variables override it, flags override both (default: $PELOTON_SERVER_CONFIG)")
    s.add_argument("--print-config", action="store_true",
                   help="print the effective settings (file, environment, flags) as TOML and exit")
    s.add_argument("--listen", default=config.DEFAULT_LISTEN, help="gRPC HOST:PORT (default %(default)s)")
    s.add_argument("--db", default=None, help="database URL (default: SQLite in the data dir)")
    s.add_argument("--store-durability", choices=STORE_DURABILITIES, default=STORE_DURABILITIES[0],
                   help="full: a change reported to a client survives a power loss (every commit synced); relaxed: "
                        "it survives the daemon's crash, a power loss may take back the last commits (faster, "
                        "above all on PostgreSQL) (default %(default)s)")
    s.add_argument("--data-dir", default=None,
                   help="default: $PELOTON_DATA_DIR, else $XDG_DATA_HOME/peloton, else ~/.local/share/peloton "
                        "(/var/lib/peloton for root)")


def _local_flags(s: argparse.ArgumentParser) -> None:
    """The local backend's hosts."""
    s.add_argument("--local-hosts", type=int, default=None, help="simulate N hosts on this machine")
    s.add_argument("--local-host-resources", default=None,
                   help="size of each simulated host: cpu=8,mem=16Gi,disk=100Gi,gpu=2 (a dimension left out is 0: "
                        "without disk=, a job that asks for disk never fits)")
    s.add_argument("--local-host-labels", default=None, metavar="K=V[,K=V]",
                   help="labels of the local hosts (the simulated ones of --local-hosts, or this machine), e.g. "
                        "gpu_model=a100,nic_gbps=100,gpu_link=nvlink")
    s.add_argument("--local-host-group", action="append", default=None, metavar="COUNT:RESOURCES[:LABELS]",
                   help="COUNT simulated hosts of RESOURCES with LABELS, e.g. 2:cpu=4,mem=8Gi,gpu=2:gpu_model=t4 "
                        "(repeatable: a heterogeneous cluster, local-0.. in the groups' order; instead of "
                        "--local-hosts, --local-host-resources and --local-host-labels)")
    s.add_argument("--local-port-base", type=int, default=31000, help="first port of host 0's range (1000 per host)")


def _log_flags(s: argparse.ArgumentParser) -> None:
    """Metrics and logs."""
    s.add_argument("--metrics-listen", default=config.DEFAULT_METRICS_LISTEN,
                   help="Prometheus HOST:PORT ('' to disable; default %(default)s)")
    s.add_argument("--ui-listen", default=config.DEFAULT_UI_LISTEN,
                   help="the web console's HOST:PORT: HTTPS with the API's certificate when it has TLS, else plain "
                        "HTTP ('' to disable; default %(default)s; docs/ui.md)")
    s.add_argument("--ui-login-ttl", type=int, default=60, metavar="SECONDS",
                   help="how long a one-time console link of `peloton cluster ui-login` lasts (1-3600, default "
                        "%(default)s)")
    s.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"],
                   help="the least severe log lines written (default %(default)s)")
    s.add_argument("--log-format", default="text", choices=["text", "json"],
                   help="log lines as text (default) or one JSON object each (time, level, logger, message, ids)")


def _role_flags(s: argparse.ArgumentParser) -> None:
    """Which components this process runs, and how the others reach them."""
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
                        "is no TLS or authentication (refused without it); as root with the local backend, serve "
                        "without authentication instead of turning it on (any local user may then run tasks as "
                        "any user; docs/security.md)")


def _task_flags(s: argparse.ArgumentParser) -> None:
    """Tasks, scheduling and retention."""
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
    s.add_argument("--placement-order", choices=["backfill", "fifo"], default="backfill",
                   help="backfill: a pool's first gang that no hosts fit gets hosts reserved, and gangs behind it "
                        "run around them when they end in time; fifo: in the order gangs are admitted, nothing "
                        "behind a gang that does not fit is placed until it is (default %(default)s)")
    s.add_argument("--placement-engines", choices=["leader", "shared"], default="leader",
                   help="leader: one placement engine acts at a time, the others stand by for its lock; shared: "
                        "several --role placement processes act at once, each on the gangs it dequeues (give it to "
                        "the resource manager's process and to each placement engine's; docs/running.md) "
                        "(default %(default)s)")
    s.add_argument("--placement-engine-lease", type=_seconds_arg, default=10.0, metavar="SECONDS",
                   help="--placement-engines shared, the resource manager's process: an engine silent this long "
                        "(dead, paused, cut off; a long poll counts as heard from while it lasts) is gone and the "
                        "gangs it was placing go back to the queue; an engine's round longer than this is taken "
                        "for gone too (1 to 600, default 10)")
    s.add_argument("--queue-order", choices=["arrival", "gpu-time"], default="arrival",
                   help="the order of each pool's waiting gangs, after sla.priority: arrival (submission time) or "
                        "gpu-time (least expected GPU-time first: GPUs x sla.max_runtime in queues of 1, 4, 16, 64, "
                        "256 GPU-hours and more, a gang without max_runtime last; promoted to the first queue after "
                        "--queue-promote-after; docs/pools.md) (default %(default)s)")
    s.add_argument("--queue-promote-after", default="4h", metavar="DURATION",
                   help="queue order gpu-time: a gang that has waited this long (30m, 4h) goes to the first queue, "
                        "among the others there by submission, so that no gang waits behind later ones for longer "
                        "(default %(default)s)")
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
                        "daemon can make cgroups (cgroup v2 mounted and writable by it: usually a root daemon); otherwise, and with off, each task's "
                        "wrapper is a child subreaper that catches less (docs/running.md) (default %(default)s)")
    s.add_argument("--warm-wrappers", type=int, default=8, metavar="N",
                   help="local backend: task wrappers each of the 4 spawners starts ahead of launches, per user "
                        "that launched lately, up to N (0 to 64; 0: none): a member with a cgroup of its own is "
                        "handed one instead of waiting for its wrapper to start (default %(default)s)")
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
    # (the defaults and bounds are settings.py's: a test holds these to them)
    s.add_argument("--grpc-workers", type=int, default=32, metavar="N",
                   help="threads serving calls on --listen, 1 to 1024; with the 256 watch streams' own, the most "
                        "calls in flight at once, past which one is refused with RESOURCE_EXHAUSTED (default "
                        "%(default)s)")
    s.add_argument("--launchers", type=int, default=4, metavar="N",
                   help="launcher loops, each launching a batch of placed gangs at once, 1 to 64 (default "
                        "%(default)s)")


def _ha_flags(s: argparse.ArgumentParser) -> None:
    """High availability."""
    s.add_argument("--standby", action="store_true",
                   help="when another daemon acts on the same store, wait for it to go and take over instead of "
                        "refusing to start; meanwhile answer every call with the leader's address")
    s.add_argument("--advertise-address", default="", metavar="HOST:PORT",
                   help="where other machines reach this daemon's API: what standbys tell clients when this one "
                        "leads (default: --listen, with this machine's name for a wildcard host)")
    s.add_argument("--leader-lease", type=_seconds_arg, default=6.0, metavar="SECONDS",
                   help="PostgreSQL: a leader that has not renewed its lease for this long (paused, or cut off) is "
                        "replaced by a standby; it stops acting itself after half of it (default: 6)")


def _backend_flags(s: argparse.ArgumentParser) -> None:
    """The cluster backend (local, mesos, sim)."""
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


def _security_flags(s: argparse.ArgumentParser) -> None:
    """The API's security and limits."""
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
