"""The daemon's settings as one checked value (`peloton server`'s flags, config file and environment, layered by
cli/server_config.py): which components run and where, the store, the backend, security, retention and bounds.
`ServerConfig.check` refuses a setting that is wrong or unsafe, naming its flag, before the daemon takes a lock or
a port; peloton/server.py wires the components from it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from peloton.config import split_hostport
from peloton.domain import limits
from peloton.domain.hostgroups import HostGroup
from peloton.domain.resources import Resources
from peloton.errors import InvalidArgument
from peloton.files import read_bounded
from peloton.hostmgr.local.backend import (
    DEFAULT_LOG_KEEP,
    DEFAULT_LOG_MAX_BYTES,
    DEFAULT_SANDBOX_MAX_BYTES,
    DEFAULT_SANDBOX_MAX_COUNT,
    DEFAULT_SANDBOX_RETENTION_S,
    TASK_CGROUPS,
)
from peloton.hostmgr.sim.backend import SimSettings
from peloton.leadership.failover import split_addresses
from peloton.leadership.owner import LEASE_S
from peloton.modelaware.gpus import DEFAULT_TABLE, GpuTable, load_table
from peloton.observability import census
from peloton.resmgr.callers import ENGINE_LEASE_S
from peloton.resmgr.manager import DEFAULT_PREEMPTION_SETTLE_S
from peloton.resmgr.ordering import DEFAULT_PROMOTE_AFTER_S, QueueOrder
from peloton.security import run_as
from peloton.security.identity import check_principals_file

MIN_LEASE_S, MAX_LEASE_S = 3.0, 120.0
# --placement-engine-lease: engines call at least every round (a long poll counts while it lasts), so a lease of a
# second is already longer than an idle engine's silence; a round longer than the lease makes its engine gone
MIN_ENGINE_LEASE_S, MAX_ENGINE_LEASE_S = 1.0, 600.0
MIN_TASK_LOG_BYTES = 1 << 20
ROLE_ORDER = ("jobmgr", "resmgr", "placement", "hostmgr")
ROLES = frozenset(ROLE_ORDER)
WRITERS_PG = 2  # the job manager's writers on PostgreSQL (docs/performance.md: measured 1, 2 and 4)
MAX_WRITERS = 16  # each holds a connection of the pool (10 + 20 overflow) while it commits
MAX_GRPC_WORKERS = 1024  # --grpc-workers: a thread each
MAX_LAUNCHERS = 64  # --launchers: a thread each, and as many launches in flight
MAX_WARM_WRAPPERS = 64  # --warm-wrappers: idle shells, per spawner (4) and user
DEFAULT_RATE_LIMIT = 50.0
RATE_BURST_S = 4.0  # a bucket holds this many seconds' worth of calls (at least 10)
DEFAULT_MAX_WAITING_JOBS = 10_000


@dataclass
class ServerConfig:
    listen: str
    db_url: str | None
    data_dir: Path
    store_durability: str = "full"  # --store-durability: what a commit promises (store/db.py FULL, RELAXED)
    local_hosts: int | None = None
    local_host_resources: Resources | None = None
    local_host_labels: dict[str, str] = field(default_factory=dict)  # --local-host-labels: of the plain form's hosts
    local_host_groups: tuple[HostGroup, ...] = ()  # --local-host-group: these hosts instead of --local-hosts'
    local_port_base: int = 31000
    metrics_listen: str = ""
    ui_listen: str = ""  # the web console (peloton/console/, docs/ui.md): HTTPS when the API has TLS; "" none
    ui_login_ttl_s: int = 60  # how long a one-time console login (`peloton cluster ui-login`) lasts
    workers: int = 32  # gRPC threads for unary calls (watch streams get their own on top): --grpc-workers
    launchers: int = 4  # launcher loops: batches of placements launched concurrently: --launchers
    jobmgr_writers: int | None = None  # shards of jobs, one writer thread each; None: 1 on SQLite, WRITERS_PG on PG
    standby: bool = False  # another daemon acts on the store: wait for it to go instead of refusing to start
    # The address other machines reach this daemon's API at, which a standby names to clients as the leader's
    # ("" : --listen, with this machine's name instead of a wildcard host)
    advertise_address: str = ""
    leader_lease_s: float = LEASE_S  # PostgreSQL: a leader silent for longer is replaced by a standby
    backend: str = "local"  # local | mesos | sim
    mesos: MesosSettings | None = None
    # Which components this process runs; the others are reached over gRPC at the given addresses.
    roles: frozenset[str] = ROLES
    resmgr_address: str = ""
    hostmgr_address: str = ""
    sim: SimSettings | None = None  # --backend sim: its hosts (None: SimSettings' defaults)
    # The internal services, for the other processes of a split deployment (never on `listen`): where, and the
    # shared secret every component presents. Defaults: unix:<data-dir>/internal.sock, <data-dir>/internal.secret.
    internal_listen: str = ""
    internal_secret_file: Path | None = None
    insecure: bool = False  # serve on an address other machines can reach, without TLS or authentication
    task_env_allow: tuple[str, ...] = ()  # local backend: daemon variables tasks inherit besides task_env's defaults
    default_task_user: str | None = None  # local backend: who runs tasks naming no user (None: nobody as root)
    # uids allocated to principals without a mapped Unix user, one each (run_as.py; a root daemon's local backend)
    task_uid_range: tuple[int, int] = run_as.DEFAULT_UID_RANGE
    preemption_settle_s: float = DEFAULT_PREEMPTION_SETTLE_S  # a pool's first gang waits this long to preempt
    preemption: bool = True  # False: gangs never preempt (hosts are still reserved for them)
    placement_order: str = "backfill"  # backfill | fifo: nothing behind a gang that does not fit is placed
    # leader: one placement engine at a time (the others stand by for its lock); shared: several act at once, each
    # on the gangs it dequeues (resmgr/callers.py Engines)
    placement_engines: str = "leader"
    placement_engine_lease_s: float = ENGINE_LEASE_S  # shared: an engine silent this long is gone (its gangs go back)
    queue_order: str = "arrival"  # arrival | gpu-time: a pool's waiting gangs' order (resmgr/ordering.py)
    queue_promote_after_s: float = DEFAULT_PROMOTE_AFTER_S  # gpu-time: a gang waiting this long goes first in line
    job_retention_s: float = 30 * 24 * 3600.0  # finished jobs (and their sandboxes) are deleted after this; 0: kept
    audit_retention_s: float = 90 * 24 * 3600.0  # audit records are deleted after this; 0: kept
    task_log_max_bytes: int = DEFAULT_LOG_MAX_BYTES  # local backend: a stream past this is rotated; 0: never
    metrics_host_limit: int = census.DEFAULT_HOST_SERIES_LIMIT  # per-host series up to this many hosts; 0: none
    sandbox_retention_s: float = DEFAULT_SANDBOX_RETENTION_S  # local backend: an ended task's sandbox; 0: with its job
    sandbox_max_count: int = DEFAULT_SANDBOX_MAX_COUNT  # ...and at most this many kept (oldest go first); 0: no bound
    sandbox_max_bytes: int = DEFAULT_SANDBOX_MAX_BYTES  # ...holding at most this many bytes; 0: no bound
    task_log_keep: int = DEFAULT_LOG_KEEP  # rotated files kept per stream
    task_cgroups: str = "auto"  # local backend: a cgroup v2 per task where possible (auto), or never (off)
    warm_wrappers: int = 8  # local backend: wrappers a spawner starts ahead of launches, per user; 0: none
    # TLS on the public API (and, with metrics_tls, on the metrics endpoint); a client CA makes it mutual: only
    # clients with a certificate of that CA are served (their certificate's subject is who they are).
    # The public API on a Unix socket too, owner-only: None means <data-dir>/peloton.sock, "" none.
    unix_socket: str | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None
    metrics_tls: bool = False
    # Principals, their roles and token hashes (identity.py); None: <data-dir>/principals.json when it exists.
    principals_file: Path | None = None
    # Bounds per authenticated principal (off without authentication: one trusted user)
    rate_limit: float = DEFAULT_RATE_LIMIT  # changing calls a second, bursts of RATE_BURST_S of them; 0: none
    max_waiting_jobs: int = DEFAULT_MAX_WAITING_JOBS  # jobs not started yet; 0: no limit
    # A JSON file of GPU models' relative throughputs that replace or extend the built-in table (model-aware plans)
    gpu_table: Path | None = None

    def gpu_table_rows(self) -> GpuTable:
        """The GPU table model-aware plans use: the built-in one, with --gpu-table's rows. InvalidArgument naming
        the flag (and the row) when the file cannot be read or is wrong."""
        if self.gpu_table is None:
            return DEFAULT_TABLE
        try:
            raw = read_bounded(self.gpu_table, limits.MAX_GPU_TABLE_BYTES, f"--gpu-table: {self.gpu_table}",
                               "a GPU table", field="--gpu-table")
        except OSError as e:
            raise InvalidArgument(f"--gpu-table: cannot read {self.gpu_table}: {e.strerror}",
                                  field="--gpu-table") from None
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:  # (was a traceback)
            raise InvalidArgument(f"--gpu-table: {self.gpu_table}: not UTF-8 text (at byte {e.start + 1})",
                                  field="--gpu-table") from None
        return load_table(text, source="--gpu-table")

    def queue_order_value(self) -> QueueOrder:
        """--queue-order and --queue-promote-after as the resource manager takes them; InvalidArgument naming the
        flag when either is wrong."""
        return QueueOrder(self.queue_order, self.queue_promote_after_s)

    def principals_path(self) -> Path | None:
        if self.principals_file is not None:
            return self.principals_file
        default = self.data_dir / "principals.json"
        return default if default.exists() else None

    @property
    def authenticated(self) -> bool:
        """Every caller of the public API over the network proves who it is, over TLS: a client certificate of
        --tls-client-ca, or a token of the principals file."""
        return self.tls_cert is not None and (self.tls_client_ca is not None or self.principals_path() is not None)

    def unix_socket_path(self) -> Path | None:
        if self.unix_socket == "":
            return None
        return Path(self.unix_socket) if self.unix_socket else self.data_dir / "peloton.sock"

    @property
    def lockless_placement(self) -> bool:
        """A placement engine that acts beside others (--placement-engines shared, and no other role): it takes no
        lock of the store, only its data dir's."""
        return self.placement_engines == "shared" and self.roles == frozenset({"placement"})

    def serves_internal(self) -> bool:
        """Another process will call this one's resmgr or hostmgr (a split deployment), or the operator asked."""
        return bool(self.internal_listen) or (self.roles != ROLES and bool(self.roles & {"resmgr", "hostmgr"}))

    def internal_address(self) -> str:
        return self.internal_listen or f"unix:{self.data_dir / 'internal.sock'}"

    def secret_file(self) -> Path:
        return self.internal_secret_file or self.data_dir / "internal.secret"

    def writers(self) -> int:
        if self.jobmgr_writers is not None:
            return self.jobmgr_writers
        return 1 if self._sqlite else WRITERS_PG

    @property
    def _sqlite(self) -> bool:
        return self.db_url is None or self.db_url.startswith("sqlite")

    def check(self) -> None:
        if self.placement_order not in ("backfill", "fifo"):
            raise InvalidArgument(f"--placement-order: must be one of backfill, fifo, got {self.placement_order!r}",
                                  field="--placement-order")
        self.queue_order_value()  # an unknown order or a bad promotion time names its flag
        if self.placement_engines not in ("leader", "shared"):
            raise InvalidArgument(f"--placement-engines: must be one of leader, shared, got "
                                  f"{self.placement_engines!r}", field="--placement-engines")
        if self.lockless_placement and self.standby:
            raise InvalidArgument("--standby: a --role placement process with --placement-engines shared takes no "
                                  "lock, so there is nothing to stand by for: start it without --standby (it acts "
                                  "at once, beside the other engines)", field="--standby")
        if self.metrics_host_limit < 0:
            raise InvalidArgument(f"--metrics-host-limit: must be 0 (never) or more, got {self.metrics_host_limit}",
                                  field="--metrics-host-limit")
        if not 1 <= self.workers <= MAX_GRPC_WORKERS:
            raise InvalidArgument(f"--grpc-workers: must be between 1 and {MAX_GRPC_WORKERS}, got {self.workers}",
                                  field="--grpc-workers")
        if not 0 <= self.warm_wrappers <= MAX_WARM_WRAPPERS:
            raise InvalidArgument(f"--warm-wrappers: must be between 0 and {MAX_WARM_WRAPPERS}, got "
                                  f"{self.warm_wrappers}", field="--warm-wrappers")
        if not 1 <= self.launchers <= MAX_LAUNCHERS:
            raise InvalidArgument(f"--launchers: must be between 1 and {MAX_LAUNCHERS}, got {self.launchers}",
                                  field="--launchers")
        if self.jobmgr_writers is not None:
            if not 1 <= self.jobmgr_writers <= MAX_WRITERS:
                raise InvalidArgument(f"--jobmgr-writers: must be between 1 and {MAX_WRITERS}, got "
                                      f"{self.jobmgr_writers}", field="--jobmgr-writers")
            if self.jobmgr_writers > 1 and self._sqlite:
                raise InvalidArgument("--jobmgr-writers: SQLite commits one transaction at a time; more than one "
                                      "writer needs PostgreSQL (--db postgresql://...)", field="--jobmgr-writers")
        unknown = self.roles - ROLES
        if unknown or not self.roles:
            raise InvalidArgument(f"--role: unknown role(s) {sorted(unknown)}; known: {', '.join(sorted(ROLES))}",
                                  field="--role")
        needs_resmgr = self.roles & {"jobmgr", "placement"}
        if needs_resmgr and "resmgr" not in self.roles and not split_addresses(self.resmgr_address):
            raise InvalidArgument("--resmgr: the address of the resmgr process is required without --role resmgr",
                                  field="--resmgr")
        if needs_resmgr and "hostmgr" not in self.roles and not split_addresses(self.hostmgr_address):
            raise InvalidArgument("--hostmgr: the address of the hostmgr process is required without --role hostmgr",
                                  field="--hostmgr")
        self._check_tls()
        self._check_bounds()
        if self.listen:  # HOST:PORT only (a unix: socket is --unix-socket's), refused before anything starts
            split_hostport(self.listen, "--listen")
        if self.listen and not self.insecure and not self.authenticated and not local_only(self.listen):
            raise InvalidArgument(
                f"--listen: {self.listen} can be reached from other machines, and this daemon has no TLS with client "
                "certificates or tokens (--tls-cert, --tls-key, and --tls-client-ca or --principals-file; "
                "docs/security.md): anyone who reaches it could run commands as the daemon's user. Listen on "
                "127.0.0.1 (or ::1), set up TLS, or pass --insecure to serve it anyway", field="--listen")
        if self.ui_listen:
            split_hostport(self.ui_listen, "--ui-listen")
            # as the API: beyond loopback only over TLS (HTTPS with the daemon's certificate) and with callers
            # who prove who they are (a client certificate or a token)
            if not self.insecure and not self.authenticated and not local_only(self.ui_listen):
                raise InvalidArgument(
                    f"--ui-listen: {self.ui_listen} can be reached from other machines, and this daemon has no TLS "
                    "with client certificates or tokens: the console would be plain HTTP (the tokens its users log "
                    "in with would cross the network in clear) or open to anyone (docs/ui.md). Listen on 127.0.0.1 "
                    "(and reach it through an SSH tunnel), set up TLS (--tls-cert, --tls-key, and --tls-client-ca or "
                    "--principals-file), or pass --insecure", field="--ui-listen")
        if not 1 <= self.ui_login_ttl_s <= 3600:
            raise InvalidArgument(f"--ui-login-ttl: must be between 1 and 3600 seconds, got {self.ui_login_ttl_s}",
                                  field="--ui-login-ttl")
        if self.internal_listen and not self.insecure and not local_only(self.internal_listen):
            raise InvalidArgument(
                f"--internal-listen: {self.internal_listen} can be reached from other machines, and the internal "
                "services have no TLS yet, so the components' secret would cross the network in clear "
                "(docs/security.md). Use a unix: socket or 127.0.0.1, or pass --insecure", field="--internal-listen")

    def _check_bounds(self) -> None:
        import math

        lease = self.placement_engine_lease_s
        if not math.isfinite(lease) or not MIN_ENGINE_LEASE_S <= lease <= MAX_ENGINE_LEASE_S:
            raise InvalidArgument(f"--placement-engine-lease: must be between {MIN_ENGINE_LEASE_S:g} and "
                                  f"{MAX_ENGINE_LEASE_S:g} seconds, got {lease:g}", field="--placement-engine-lease")
        if not math.isfinite(self.rate_limit) or self.rate_limit < 0:
            raise InvalidArgument(f"--rate-limit: must be 0 (none) or a positive number of calls a second, got "
                                  f"{self.rate_limit}", field="--rate-limit")
        if self.max_waiting_jobs < 0:
            raise InvalidArgument(f"--max-waiting-jobs: must be 0 (none) or positive, got {self.max_waiting_jobs}",
                                  field="--max-waiting-jobs")
        self.gpu_table_rows()  # a file that cannot be read, or a wrong row, is said at start
        principals = self.principals_path()
        if principals is not None:  # one that cannot be read, too large or wrong: refused before anything starts
            check_principals_file(principals)  # (read again, and kept, once the daemon authenticates)
        if not math.isfinite(self.leader_lease_s) or not MIN_LEASE_S <= self.leader_lease_s <= MAX_LEASE_S:
            raise InvalidArgument(f"--leader-lease: must be between {MIN_LEASE_S:g} and {MAX_LEASE_S:g} seconds (it is "
                                  f"renewed every second), got {self.leader_lease_s:g}", field="--leader-lease")
        if self.advertise_address:
            split_hostport(self.advertise_address, "--advertise-address")
        if self.task_cgroups not in TASK_CGROUPS:
            raise InvalidArgument(f"--task-cgroups: must be one of {', '.join(TASK_CGROUPS)}, got "
                                  f"{self.task_cgroups!r}", field="--task-cgroups")
        if self.sandbox_max_count < 0:
            raise InvalidArgument(f"--sandbox-max-count: must not be negative, got {self.sandbox_max_count}",
                                  field="--sandbox-max-count")
        if not 1 <= self.task_log_keep <= 100:
            raise InvalidArgument(f"--task-log-keep: must be between 1 and 100, got {self.task_log_keep}",
                                  field="--task-log-keep")
        run_as.parse_uid_range(f"{self.task_uid_range[0]}-{self.task_uid_range[1]}")
        if self.task_log_max_bytes and self.task_log_max_bytes < MIN_TASK_LOG_BYTES:
            raise InvalidArgument(f"--task-log-max: must be 0 (never rotate) or at least 1Mi, got "
                                  f"{self.task_log_max_bytes} bytes", field="--task-log-max")

    def _check_tls(self) -> None:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise InvalidArgument("--tls-cert, --tls-key: give both or neither", field="--tls-cert")
        if self.tls_cert is None and self.tls_client_ca is not None:
            raise InvalidArgument("--tls-client-ca: needs --tls-cert and --tls-key (mutual TLS is TLS)",
                                  field="--tls-client-ca")
        if self.metrics_tls and self.tls_cert is None:
            raise InvalidArgument("--metrics-tls: needs --tls-cert and --tls-key", field="--metrics-tls")
        for flag, path in (("--tls-cert", self.tls_cert), ("--tls-key", self.tls_key),
                           ("--tls-client-ca", self.tls_client_ca)):
            if path is not None and not path.is_file():
                raise InvalidArgument(f"{flag}: {path} is not a readable file", field=flag)
        if self.tls_key is not None and self.tls_key.stat().st_mode & 0o077:
            raise InvalidArgument(f"--tls-key: {self.tls_key} is readable by others (mode "
                                  f"{self.tls_key.stat().st_mode & 0o777:o}); chmod 600 it", field="--tls-key")
        if self.tls_cert is not None:
            import ssl

            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            try:
                ctx.load_cert_chain(self.tls_cert, self.tls_key)
            except (ssl.SSLError, OSError) as e:
                raise InvalidArgument(f"--tls-cert: {self.tls_cert} and --tls-key {self.tls_key} are not a PEM "
                                      f"certificate and its key: {e}", field="--tls-cert") from None
            if self.tls_client_ca is not None:
                try:
                    ctx.load_verify_locations(self.tls_client_ca)
                except (ssl.SSLError, OSError) as e:
                    raise InvalidArgument(f"--tls-client-ca: {self.tls_client_ca} is not a PEM CA certificate: {e}",
                                          field="--tls-client-ca") from None


@dataclass
class MesosSettings:
    masters: list[str]
    role: str = "*"
    principal: str = ""
    secret_file: str = ""
    failover_timeout_s: float = 7 * 24 * 3600.0
    framework_name: str = "peloton"
    user: str = "nobody"  # the framework's user, which tasks naming no task.user run as


def local_only(address: str) -> bool:
    """A unix: socket, or an address only this machine can reach (loopback)."""
    if address.startswith("unix:"):
        return True
    host = address.rpartition(":")[0].strip("[]")
    return host in ("localhost", "::1") or host.startswith("127.")
