"""This host's accounts, as its user database (NSS: /etc/passwd, LDAP, ...) says: the I/O side of run_as.py's
rules (which uids are free to allocate, which names are system accounts)."""

from __future__ import annotations

import functools
import grp
import os
import pwd
from pathlib import Path
from typing import TYPE_CHECKING

from peloton.errors import Unavailable
from peloton.security import nss, run_as

if TYPE_CHECKING:
    from peloton.domain.launch import LaunchSpec


def host_has_id(uid: int) -> bool:
    """Whether a user or a group of this host has the number `uid` (an allocated identity uses it as both).
    Unavailable when the user database could not say (LDAP or sssd unreachable, /etc/passwd not opened: nss.py):
    an account there may have it, so it is not free."""
    for lookup, fn in ((pwd.getpwuid, "getpwuid_r"), (grp.getgrgid, "getgrgid_r")):
        try:
            lookup(uid)
            return True
        except KeyError:
            code = nss.nss_error(fn, uid)
            if code:
                raise Unavailable(
                    f"task.user: this host's user database could not say whether {nss.KEYS[fn]} {uid} is an "
                    f"account's ({fn}: {os.strerror(code)}), so no uid is allocated now; retry once it answers "
                    "(LDAP or sssd back, descriptors free)", field="task.user") from None
    return False


def uid_of(name: str) -> int | None:
    try:
        return pwd.getpwnam(name).pw_uid
    except KeyError:
        return None


@functools.cache
def sys_uid_max() -> int:
    try:
        return run_as.sys_uid_max(Path("/etc/login.defs").read_text(errors="replace"))
    except OSError:
        return run_as.SYSTEM_UID_MAX_DEFAULT


def is_system_account(name: str) -> bool:
    """A service's or the system's account, by name or by its uid on this host (run_as.system_account)."""
    return run_as.system_account(name, uid_of(name), sys_uid_max())


def subid_overlaps(uid_range: tuple[int, int]) -> list[str]:
    """Lines of /etc/subuid and /etc/subgid whose ids overlap `uid_range`."""
    out = []
    for path in (Path("/etc/subuid"), Path("/etc/subgid")):
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        out += [f"{path}: {line}" for line in run_as.overlapping_subids(uid_range, text)]
    return out


def unvetted_system_account(spec: LaunchSpec) -> str:
    """Why a member of a job created before task identities must not start (its task.user is a system account
    nobody vetted, e.g. `postgres` named by a principal called postgres under the old same-name rule); "" if it
    may."""
    if not spec.legacy_user or not spec.user or spec.user == "root" or not is_system_account(spec.user):
        return ""
    return (f"task.user: {spec.user} is a system account, and this job was created before task identities, so no "
            "admin vetted it: an admin maps it to a principal in the principals file, or names it in a new job")
