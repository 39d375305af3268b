"""What tells "no such user (or group)" from "this host's user database could not answer": the one rule for the
local spawner (a task's user, an allocated uid: hostmgr/local/spawner.py) and for the job manager's uid allocation
(unix_accounts.host_has_id). Standard library only, and importing nothing of peloton: the spawner runs as a script
(`python -I -S spawner.py`), with no peloton on its path, and loads this file by its path.

Python's pwd and grp raise KeyError for both, so getpwnam_r's (getpwuid_r's, getgrgid_r's) own answer is read again
(nss_error) when they do. glibc's returns 0 and no entry when every source of nsswitch.conf answered NOTFOUND: that
alone is a definite absence. Any other answer is a source that could not look (UNAVAIL or TRYAGAIN: /etc/passwd not
opened, EMFILE; LDAP or sssd not reached, EIO, ETIMEDOUT, ECONNREFUSED, EAGAIN; a service named in nsswitch.conf and
not running, ENOENT, which getpwnam(3) counts as "not found" but which is as likely an sssd restarting): not known,
so nothing that depends on the answer may be decided (a task is not started, a uid is not allocated) for now."""

from __future__ import annotations

import errno

KEYS = {"getpwnam_r": "name", "getpwuid_r": "uid", "getgrgid_r": "gid"}  # what each function looks up by

LIBC: list[object] = []  # ctypes' libc (3 ms to import), once loaded (load_libc)


def load_libc() -> None:
    """Load libc now (the spawner's main does, so that a lookup that failed out of descriptors can tell why)."""
    if not LIBC:
        import ctypes

        LIBC.append(ctypes.CDLL(None, use_errno=True))


def nss_error(fn: str, key: str | int) -> int:
    """The answer of glibc's `fn` (getpwnam_r, getpwuid_r or getgrgid_r) for `key`, which pwd or grp just gave as
    KeyError: 0, there is no such entry for certain; else the errno of a source that could not answer, EAGAIN when
    the entry is there after all (an outage just ended: the look is to be tried again) or when this cannot be
    looked at (ctypes not loaded: out of descriptors)."""
    try:
        load_libc()
        import ctypes

        call = getattr(LIBC[0], fn)
        arg = ctypes.c_char_p(key.encode()) if isinstance(key, str) else ctypes.c_uint(key)
        size = 4096
        while True:
            entry = ctypes.create_string_buffer(256)  # a struct passwd or group (< 64 bytes)
            buf = ctypes.create_string_buffer(size)
            found = ctypes.c_void_p()
            rc = int(call(arg, entry, buf, ctypes.c_size_t(size), ctypes.byref(found)))
            if rc != errno.ERANGE or size >= 1 << 24:
                break
            size *= 4
    except Exception:  # noqa: BLE001 - ctypes could not be had (its import opens files): not known, so transient
        return errno.EAGAIN
    if rc == 0 and found.value:
        return errno.EAGAIN
    return rc
