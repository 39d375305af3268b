"""A cgroup (v2) per task of the local backend, so that nothing a command starts escapes its stop: a process that
calls setsid, double-forks or changes its process group stays in its task's cgroup, and killing the cgroup kills
it (cgroup.kill, Linux >= 5.14; before that, freezing the cgroup and SIGKILLing every process in it).

Where: `<the daemon's own cgroup>/peloton-tasks/<key>/<task id>.<8 hex>`, where the daemon's own cgroup is the
`0::` line of /proc/self/cgroup below the cgroup2 mount (/sys/fs/cgroup on a systemd machine, /sys/fs/cgroup/unified
on a hybrid one), `key` is 16 hex digits of the SHA-256 of the local backend's data dir (daemons with other data
dirs on one machine never touch each other's tasks, and a restarted daemon finds its own), and the suffix makes each
launch's cgroup new (a preempted gang runs again with the same task ids while the last run's cgroup may still be
emptying). The directories are created by the daemon's user (root) and stay its own: a task running as another user
cannot move itself out; a task running as root can. No controller is enabled: membership, `cgroup.procs`,
`cgroup.events` (populated), `cgroup.kill` and `cgroup.freeze` are all that is used.

The spawner puts each wrapper into its cgroup before the wrapper runs anything (spawner.py: the wrapper waits on a
gate until it has been moved). Moving a process into a cgroup waits for an RCU grace period when no process has
moved lately (the kernel's cgroup_threadgroup_rwsem, unless cgroup2 is mounted with favordynmods): 10-15 ms on the
development machine, once per burst of moves, which is why the spawner moves the wrappers after it has replied.
The functions on a path below work for any task cgroup, whatever the daemon's current setting (a task adopted from
a daemon that used cgroups keeps its own).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import secrets
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

SUBTREE = "peloton-tasks"
PROCS = "cgroup.procs"
EVENTS = "cgroup.events"
KILL = "cgroup.kill"
FREEZE = "cgroup.freeze"


# ------------------------------------------------------------------------------------------------ pure parsing


def _unescape(field: str) -> str:
    """A mountinfo path field: space, tab, newline and backslash are octal escapes."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 3 < len(field) and field[i + 1:i + 4].isdigit():
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def cgroup2_mount(mountinfo: str) -> str | None:
    """The mount point of the cgroup2 file system in /proc/self/mountinfo's text (the first one), None if none."""
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields = left.split()
        if len(fields) >= 5 and right.split(" ", 1)[0] == "cgroup2" and fields[3] == "/":
            return _unescape(fields[4])
    return None


def own_cgroup(proc_cgroup: str) -> str | None:
    """The cgroup v2 path in /proc/<pid>/cgroup's text (its `0::` line), None if there is none."""
    for line in proc_cgroup.splitlines():
        if line.startswith("0::"):
            path = line[3:]
            return path if path.startswith("/") else None
    return None


def subtree_key(data_dir: Path) -> str:
    return hashlib.sha256(str(Path(data_dir).resolve()).encode()).hexdigest()[:16]


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


# ------------------------------------------------------------------------------------------------ this machine


def _read(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


_MOUNT: list[str | None] = []  # cached: where cgroup2 is mounted does not change under a running daemon


def mount() -> str | None:
    if not _MOUNT:
        try:
            _MOUNT.append(cgroup2_mount(_read("/proc/self/mountinfo")))
        except OSError:
            _MOUNT.append(None)
    return _MOUNT[0]


def cgroup_of(pid: int | str) -> str | None:
    """The cgroup v2 path of a process (relative to the mount), None if it is gone."""
    try:
        return own_cgroup(_read(f"/proc/{pid}/cgroup"))
    except OSError:
        return None


def is_task_cgroup(path: str) -> bool:
    """`path` is a task cgroup as this module names them (a journal's record is checked before it is acted on)."""
    m = mount()
    p = Path(path)
    return (m is not None and p.is_absolute() and _inside(os.path.normpath(path), m) and ".." not in p.parts
            and p.parent.parent.name == SUBTREE and "." in p.name)


@dataclass(frozen=True, slots=True)
class TaskCgroups:
    """The daemon's subtree of task cgroups."""

    mount: str
    home: str  # the daemon's own cgroup directory
    subtree: str  # <home>/peloton-tasks/<key>
    has_kill: bool

    def new_path(self, task_id: str) -> str:
        return f"{self.subtree}/{task_id}.{secrets.token_hex(4)}"

    def existing(self) -> list[str]:
        """The task cgroups in the subtree now."""
        try:
            return [f"{self.subtree}/{e.name}" for e in os.scandir(self.subtree) if e.is_dir(follow_symlinks=False)]
        except OSError:
            return []

    def remove_subtree_if_empty(self) -> None:
        with contextlib.suppress(OSError):
            os.rmdir(self.subtree)


def probe(data_dir: Path) -> tuple[TaskCgroups | None, str]:
    """The task cgroups of a local backend whose data dir is `data_dir`, if cgroup v2 is there and this process
    may create cgroups below its own and move processes into them (tried with a short-lived child); else None and
    why not."""
    m = mount()
    if m is None:
        return None, "no cgroup2 file system is mounted"
    try:
        own = own_cgroup(_read("/proc/self/cgroup"))
    except OSError as e:
        return None, f"cannot read /proc/self/cgroup: {e.strerror}"
    if own is None:
        return None, "this process is in no cgroup v2 (no 0:: line in /proc/self/cgroup)"
    home = os.path.normpath(m + own)
    if not os.path.isfile(f"{home}/{PROCS}"):
        return None, f"the daemon's own cgroup {own} is not visible under {m}"
    subtree = f"{home}/{SUBTREE}/{subtree_key(data_dir)}"
    try:
        os.makedirs(subtree, 0o755, exist_ok=True)
    except OSError as e:
        return None, f"cannot create {subtree}: {e.strerror}"
    cg = TaskCgroups(m, home, subtree, os.path.exists(f"{subtree}/{KILL}"))
    why = _try_migration(cg)
    if why:
        return None, why
    return cg, ""


def _try_migration(cg: TaskCgroups) -> str:
    """'' if a process of ours can be moved into a new cgroup of the subtree, else why not."""
    path = f"{cg.subtree}/probe-{os.getpid()}.{secrets.token_hex(4)}"
    try:
        os.mkdir(path, 0o755)
    except OSError as e:
        return f"cannot create a cgroup in {cg.subtree}: {e.strerror}"
    try:
        child = subprocess.Popen(["/bin/sh", "-c", "read _"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL, close_fds=True)
    except OSError as e:
        os.rmdir(path)
        return f"cannot start a probe process: {e.strerror}"
    try:
        try:
            with open(f"{path}/{PROCS}", "w") as f:
                f.write(str(child.pid))
        except OSError as e:
            return f"cannot move a process into {path}: {e.strerror}"
        if cgroup_of(child.pid) != path[len(cg.mount):]:
            return f"a process written to {path}/{PROCS} did not move there"
        return ""
    finally:
        child.kill()
        child.wait()
        assert child.stdin is not None
        child.stdin.close()
        with contextlib.suppress(OSError):
            os.rmdir(path)


# ------------------------------------------------------------------------------------------------ one task cgroup


def procs(path: str) -> list[int]:
    """Every process in the cgroup `path` and the cgroups below it (a task running as root may make some)."""
    out: list[int] = []
    for top, _dirs, _files in os.walk(path):
        try:
            out += [int(x) for x in _read(f"{top}/{PROCS}").split()]
        except (OSError, ValueError):
            continue
    return out


def _pidfd_in(pid: int, path: str) -> int | None:
    """A pidfd of `pid` if it is (still) in cgroup `path` or below: opened before the check, so that a pid reused
    by a process elsewhere is never signalled."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return None
    m = mount()
    where = cgroup_of(pid)
    if m is not None and where is not None and _inside(os.path.normpath(m + where), path):
        return fd
    os.close(fd)
    return None


def _pgid(pid: int) -> int:
    try:
        return int(_read(f"/proc/{pid}/stat").rsplit(")", 1)[1].split()[2])
    except (OSError, IndexError, ValueError):
        return 0


def signal_all(path: str, sig: int, skip_pgid: int = 0) -> int:
    """Send `sig` to every process in the cgroup (but those of process group `skip_pgid`, which the caller signals
    as a group). How many were signalled."""
    n = 0
    for pid in procs(path):
        if skip_pgid and _pgid(pid) == skip_pgid:
            continue
        fd = _pidfd_in(pid, path)
        if fd is None:
            continue
        try:
            signal.pidfd_send_signal(fd, sig)
            n += 1
        except OSError:
            pass
        finally:
            os.close(fd)
    return n


def kill(path: str) -> None:
    """SIGKILL everything in the cgroup and below: cgroup.kill (atomic: nothing forks past it), else (Linux before
    5.14) freeze it, so nothing forks meanwhile, and SIGKILL every process in it (a frozen process dies of
    SIGKILL; it stays frozen: the cgroup is going away). Nothing if the cgroup is gone."""
    try:
        fd = os.open(f"{path}/{KILL}", os.O_WRONLY)
    except FileNotFoundError:
        if not os.path.isdir(path):
            return
        _freeze_and_kill(path)
        return
    except OSError as e:
        log.warning("cannot kill the processes of cgroup %s: %s", path, e.strerror)
        return
    try:
        os.write(fd, b"1")
    except OSError as e:
        if e.errno != errno.ENODEV:  # ENODEV: removed meanwhile
            log.warning("cannot kill the processes of cgroup %s: %s", path, e.strerror)
    finally:
        os.close(fd)


def _freeze_and_kill(path: str) -> None:
    try:
        with open(f"{path}/{FREEZE}", "w") as f:
            f.write("1")
    except OSError as e:
        log.warning("cannot freeze cgroup %s: %s (killing its processes as they are)", path, e.strerror)
    signal_all(path, signal.SIGKILL)


def populated(path: str) -> bool | None:
    """Whether a process runs in the cgroup or below; None if it is gone."""
    try:
        text = _read(f"{path}/{EVENTS}")
    except OSError:
        return None
    for line in text.splitlines():
        k, _, v = line.partition(" ")
        if k == "populated":
            return v.strip() == "1"
    return None


def events_fd(path: str) -> int | None:
    """A descriptor of the cgroup's cgroup.events, read once: from now on epoll reports EPOLLPRI on it when the
    cgroup's state changes (its last process exits, ...). None if the cgroup is gone."""
    try:
        fd = os.open(f"{path}/{EVENTS}", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    with contextlib.suppress(OSError):
        os.read(fd, 4096)  # arms the notification: it fires for changes after this read
    return fd


def remove(path: str) -> bool:
    """Remove the cgroup and the ones below it, deepest first. True if it is gone; False while processes are in it
    (EBUSY)."""
    for top, _dirs, _files in os.walk(path, topdown=False):
        try:
            os.rmdir(top)
        except FileNotFoundError:
            continue
        except OSError as e:
            if e.errno in (errno.EBUSY, errno.ENOTEMPTY):
                return False
            log.warning("cannot remove cgroup %s: %s", top, e.strerror)
            return False
    return not os.path.isdir(path)


def kill_and_remove_subtree(data_dir: Path) -> int:
    """Kill every task cgroup of the local backend on `data_dir` and remove them, waiting for each to empty (for
    tests and tooling; a running backend does this through its monitor). How many there were."""
    import time

    m = mount()
    own = cgroup_of("self")
    if m is None or own is None:
        return 0
    subtree = f"{os.path.normpath(m + own)}/{SUBTREE}/{subtree_key(data_dir)}"
    if not os.path.isdir(subtree):
        return 0
    paths = [f"{subtree}/{e.name}" for e in os.scandir(subtree) if e.is_dir(follow_symlinks=False)]
    for p in paths:
        kill(p)
    deadline = time.monotonic() + 10
    for p in paths:
        while not remove(p) and time.monotonic() < deadline:
            time.sleep(0.01)
    with contextlib.suppress(OSError):
        os.rmdir(subtree)
    return len(paths)
