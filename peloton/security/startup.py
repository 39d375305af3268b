"""What the daemon's security settings mean, decided once at start: how tasks' Unix identities are chosen
(run_as.py), whether a root daemon without authentication locks itself to root, and the public port's TLS."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Protocol

import grpc

from peloton.errors import FailedPrecondition, InvalidArgument
from peloton.files import tasks_run_as_others
from peloton.security import run_as, unix_accounts

log = logging.getLogger("peloton.server")  # (the daemon's start-up story, in one logger)


class Settings(Protocol):
    """What of the daemon's settings (settings.ServerConfig) these read."""

    backend: str
    roles: frozenset[str]
    data_dir: Path
    insecure: bool
    task_uid_range: tuple[int, int]
    tls_cert: Path | None
    tls_key: Path | None
    tls_client_ca: Path | None


def identity_policy(cfg: Settings, authenticated: bool) -> run_as.Policy:
    """How tasks' Unix identities are chosen (run_as.py), said once at start; a uid range that others' rootless
    containers use is refused (their processes would be a tenant's)."""
    lo, hi = cfg.task_uid_range
    if not authenticated:
        policy = run_as.Policy(run_as.Mode.OFF, cfg.task_uid_range)
        if cfg.backend == "local" and tasks_run_as_others():
            log.warning("authentication is off (--insecure): every caller is an admin, and tasks naming no "
                        "task.user share one Unix user (--default-task-user); nothing isolates them")
    elif cfg.backend == "mesos":
        policy = run_as.Policy(run_as.Mode.MESOS, cfg.task_uid_range)
        log.info("task identities: each principal's tasks run as the Unix user the principals file maps it "
                 "to (\"user\"); a principal with none must name task.user")
    elif cfg.backend == "local" and tasks_run_as_others():
        policy = run_as.Policy(run_as.Mode.LOCAL, cfg.task_uid_range)
        overlaps = unix_accounts.subid_overlaps(cfg.task_uid_range)
        if overlaps:
            raise InvalidArgument(f"--task-uid-range: {lo}-{hi} overlaps subordinate ids of this host ("
                                  f"{'; '.join(overlaps[:3])}): a user's rootless container could run as a "
                                  "tenant's uid; choose a range clear of them", field="--task-uid-range")
        log.info("task identities: each principal's tasks run as the Unix user the principals file maps it "
                 "to, else as a uid of its own from --task-uid-range %d-%d", lo, hi)
    else:
        policy = run_as.Policy(run_as.Mode.OFF, cfg.task_uid_range)
        if cfg.backend == "local":
            log.warning("task identities: this daemon is not root, so the tasks of every principal run as its "
                        "own user and can reach each other; run it as root for one Unix identity per "
                        "principal (docs/security.md)")
    return policy

def root_runs_tasks(cfg: Settings) -> bool:
    """A root daemon running tasks on this machine, with no authentication of its own: any local user who
    reaches its loopback port would be an admin, and could run commands as any user (root included, in a pool
    it allows root in)."""
    return (cfg.backend == "local" and "hostmgr" in cfg.roles and tasks_run_as_others()
            and cfg.tls_client_ca is None)

def lock_to_root(cfg: Settings, warnings: list[str]) -> Path | None:
    """Turn authentication on with an empty principals file (so only root, through the owner-only Unix socket,
    may call until tokens are made), unless --insecure."""
    if cfg.insecure:
        warnings.append("INSECURE (--insecure): this daemon runs as root without authentication: any "
                              "local user who reaches its TCP port can run commands as any user "
                              "(docs/security.md)")
        return None
    path = cfg.data_dir / "principals.json"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # made meanwhile: use it
        return path
    with os.fdopen(fd, "w") as f:
        f.write('{"principals": {}}\n')
    log.warning("running as root: authentication is on, with no principals yet (%s): only root, through the "
                "Unix socket, may call this daemon until tokens are made (peloton token create NAME --role "
                "ROLE; docs/security.md)", path)
    return path


def tls_credentials(cfg: Settings) -> grpc.ServerCredentials:
    assert cfg.tls_cert is not None and cfg.tls_key is not None
    try:
        pair = (cfg.tls_key.read_bytes(), cfg.tls_cert.read_bytes())
        ca = cfg.tls_client_ca.read_bytes() if cfg.tls_client_ca is not None else None
    except OSError as e:
        raise FailedPrecondition(f"--tls-cert: cannot read the TLS files: {e}", field="--tls-cert") from None
    return grpc.ssl_server_credentials([pair], root_certificates=ca, require_client_auth=ca is not None)
