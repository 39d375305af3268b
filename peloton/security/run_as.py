"""Who a job's tasks run as on their hosts: one Unix identity per principal (docs/security.md, "Task identities").

Decided once, when the job is created, from the caller and the job's `task.user`, and kept with the job (its spec's
`run_as`), so a job runs as the same identity at every attempt and after every restart. The rules are pure
(`resolve`, `pick_uid`, `system_account`); the job manager allocates and stores the uids, the backends switch to the
identity.

What `run_as` holds (and LaunchSpec.user carries to the backend):
  ""        the backend's default user: authentication off (one trusted user), or the daemon's own user calling
            over its Unix socket (a root daemon: --default-task-user, `nobody`; Mesos: the framework's user)
  "alice"   the Unix user alice: the one the principals file maps the principal to, one it lists for it, or one an
            admin named (root only in a pool that allows it: checked at submit)
  "#65537"  uid 65537 (and gid 65537, no supplementary groups), allocated to the principal from --task-uid-range
            at its first job and kept for it; no account of the host has it (checked when allocated and at every
            launch)
A job created before identities existed has no `run_as` (None): it runs as its `task.user` as before, and the
backend refuses a system account for it (`system_account`), since nobody vetted that name.

The modes (`Mode`), chosen by the daemon at start:
  OFF    authentication is off, or tasks cannot run as other users (a daemon that is not root, the sim backend):
         task.user is passed on as given (still checked against what the principal may name)
  LOCAL  a root daemon's local backend: every principal has a Unix identity of its own (mapped, else allocated)
  MESOS  the Mesos backend: the agents know only named users, so a principal needs one mapped to it (or an admin
         names task.user); an allocated uid has no name an agent could switch to
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Collection
from dataclasses import dataclass

from peloton.domain.principal import Principal
from peloton.errors import FailedPrecondition, InvalidArgument, PermissionDenied

# Between the 16-bit uids and the subordinate ids useradd hands out from 100000 (rootless containers), and clear of
# systemd's DynamicUser range (61184-65519) and of nobody (65534): nothing allocates here by default.
DEFAULT_UID_RANGE = (65536, 99999)
# Accounts of services and of the system, refused by name wherever a name was not vetted (a job created before
# identities; a host whose accounts are numbered unusually; Mesos agents, whose uids the daemon cannot see).
SYSTEM_ACCOUNTS = frozenset({
    "root", "daemon", "bin", "sys", "sync", "games", "man", "lp", "mail", "news", "uucp", "proxy", "www-data",
    "backup", "list", "irc", "gnats", "_apt", "messagebus", "sshd", "systemd-network", "systemd-resolve",
    "systemd-timesync", "systemd-coredump", "polkitd", "avahi", "dnsmasq", "ntp", "chrony", "postfix", "exim",
    "postgres", "mysql", "mariadb", "redis", "rabbitmq", "mosquitto", "nats", "memcache", "mongodb", "elasticsearch",
    "munge", "slurm", "prometheus", "grafana", "nginx", "apache", "httpd", "docker", "containerd", "kubelet",
    "mesos", "zookeeper", "nvidia-persistenced", "peloton", "operator", "adm", "shutdown", "halt", "ftp", "tss",
})
SYSTEM_UID_MAX_DEFAULT = 999  # /etc/login.defs SYS_UID_MAX on Debian and most distributions


class Mode(enum.Enum):
    OFF = "off"
    LOCAL = "local"
    MESOS = "mesos"


@dataclass(frozen=True, slots=True)
class Policy:
    mode: Mode
    uid_range: tuple[int, int] = DEFAULT_UID_RANGE


@dataclass(frozen=True, slots=True)
class Allocate:
    """`resolve`'s answer when the principal's identity is a uid of the range: the caller allocates (or finds)
    the principal's uid and stores `dynamic(uid)`."""
    principal: str


def resolve(policy: Policy, who: Principal, requested: str, *, unix_socket_default: bool = False) -> str | Allocate:
    """The identity a job of `who` naming `task.user` `requested` ("" for none) runs as; Allocate when it is the
    principal's allocated uid. PermissionDenied for a user `who` may not name; FailedPrecondition when the
    principal has no identity the backend can run (Mesos, nothing mapped). `unix_socket_default`: `who` is the
    daemon's own user calling over its owner-only socket, whose jobs run as the backend's default user.

    Root is not decided here: a job naming it also needs a pool that allows it (the caller checks)."""
    if requested:
        if not who.may_run_as(requested):
            may = who.named_users()
            raise PermissionDenied(
                f"task.user: {who.name} may not run tasks as {requested!r}: "
                + (f"only as {', '.join(may)} (the principals file's user and users for {who.name})" if may else
                   f"the principals file maps no Unix user to {who.name}, whose tasks run as "
                   + ("a uid of their own" if policy.mode is Mode.LOCAL else "the backend's default user"))
                + "; a name alone is no permission, and an admin may name any user", field="task.user")
        return requested
    if policy.mode is Mode.OFF or unix_socket_default:
        return ""
    if who.user:
        return who.user
    if policy.mode is Mode.MESOS:
        raise FailedPrecondition(
            f"task.user: the principals file maps no Unix user to {who.name}, and on Mesos each principal's tasks "
            f"need one the agents know (an admin adds \"user\" to principals.{who.name}, e.g. `peloton token "
            f"create {who.name} --user NAME`), or the job names one it may use", field="task.user")
    return Allocate(who.name)


def pick_uid(uid_range: tuple[int, int], taken: Collection[int], in_use: Callable[[int], bool]) -> int | None:
    """The lowest uid of `uid_range` that is neither allocated (`taken`) nor an account or group of this host
    (`in_use`); None when the range is full."""
    lo, hi = uid_range
    taken_set = set(taken)
    for uid in range(lo, hi + 1):
        if uid not in taken_set and not in_use(uid):
            return uid
    return None


def parse_uid_range(text: str, flag: str = "--task-uid-range") -> tuple[int, int]:
    """`LO-HI`, both within 1000..2^31-2 (never a system uid, nor one that tools treat as -1 or negative)."""
    m = re.fullmatch(r"\s*(\d+)\s*-\s*(\d+)\s*", text)
    if not m:
        raise InvalidArgument(f"{flag}: expected LO-HI, e.g. 65536-99999, got {text!r}", field=flag)
    lo, hi = int(m.group(1)), int(m.group(2))
    if lo < 1000 or hi > 2**31 - 2 or lo > hi:
        raise InvalidArgument(f"{flag}: {lo}-{hi} must lie within 1000-{2**31 - 2}, low end first", field=flag)
    if lo <= 65534 <= hi:
        raise InvalidArgument(f"{flag}: {lo}-{hi} holds 65534, nobody's uid", field=flag)
    return lo, hi


def overlapping_subids(uid_range: tuple[int, int], subid_text: str) -> list[str]:
    """Lines of /etc/subuid or /etc/subgid (`name:start:count`) whose ids overlap `uid_range`: a rootless
    container of that user could run as one of the tenants' uids."""
    lo, hi = uid_range
    out = []
    for line in subid_text.splitlines():
        parts = line.strip().split(":")
        if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
            continue
        start, count = int(parts[1]), int(parts[2])
        if start <= hi and start + count - 1 >= lo:
            out.append(line.strip())
    return out


def system_account(name: str, uid: int | None, sys_uid_max: int = SYSTEM_UID_MAX_DEFAULT) -> bool:
    """Whether `name` (uid `uid` on this host, None where unknown) is an account of the system or of a service:
    by name (SYSTEM_ACCOUNTS, systemd's `systemd-*`, Debian's `_*`) or by uid (1..sys_uid_max). Root has its own
    rule (a pool that allows it) and is not counted here."""
    if name == "root" or uid == 0:
        return False
    if name in SYSTEM_ACCOUNTS or name.startswith(("systemd-", "_")):
        return True
    return uid is not None and 0 < uid <= sys_uid_max


def sys_uid_max(login_defs: str) -> int:
    """SYS_UID_MAX of /etc/login.defs (else UID_MIN - 1, else 999)."""
    values: dict[str, int] = {}
    for line in login_defs.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] in ("SYS_UID_MAX", "UID_MIN") and parts[1].isdigit():
            values[parts[0]] = int(parts[1])
    if "SYS_UID_MAX" in values:
        return values["SYS_UID_MAX"]
    if "UID_MIN" in values:
        return values["UID_MIN"] - 1
    return SYSTEM_UID_MAX_DEFAULT
