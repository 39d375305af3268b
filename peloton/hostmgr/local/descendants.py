"""The local backend's fallback where a task cannot have a cgroup of its own (cgroup v2 missing or not writable, a
daemon that is not root, or `--task-cgroups off`): the task's wrapper is a child subreaper (spawner.py sets
PR_SET_CHILD_SUBREAPER before it executes the wrapper), so a process of the command that setsid()s, double-forks or
changes its process group and loses its parent is reparented to the wrapper, not to init, and stays in the
wrapper's tree of descendants. This module walks that tree (/proc/<pid>/task/*/children) to signal it: SIGTERM to
every descendant, or SIGSTOP top-down (a stopped process forks nothing more) then SIGKILL, repeated until the tree
is empty.

What it cannot catch: a descendant that escaped while no subreaper held it, i.e. once the wrapper is gone (it was
SIGKILLed by someone else, or the command killed its own wrapper: they run as the same user) its orphans go to init
and are out of reach; and processes that reach no ancestor in the tree (started through another service: at, a
systemd user unit, a daemon the command asked over a socket). cgroups (cgroups.py) catch everything but the last.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import time


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, pgid) of a process; None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            rest = f.read().rsplit(")", 1)[1].split()
        return rest[0], int(rest[1]), int(rest[2])
    except (OSError, IndexError, ValueError):
        return None


def children(pid: int) -> list[int]:
    """The children of every thread of process `pid` (zombies included)."""
    out: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", encoding="ascii") as f:
                out += [int(x) for x in f.read().split()]
        except (OSError, ValueError):
            continue
    return out


def _child_fd(pid: int, parent: int) -> tuple[int, int] | None:
    """(a pidfd of `pid`, its pgid) if it is alive and still a child of `parent`: opened before the check, so a pid
    reused by another process is never signalled."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return None
    st = _stat(pid)
    if st is None or st[0] in ("Z", "X") or st[1] != parent:
        os.close(fd)
        return None
    return fd, st[2]


def _send(fd: int, sig: int) -> None:
    with contextlib.suppress(OSError):
        signal.pidfd_send_signal(fd, sig)


def signal_tree(root: int, sig: int, skip_pgid: int = 0) -> int:
    """Send `sig` to every live descendant of `root` (not `root`), but those of process group `skip_pgid` (the
    caller signals that group as a whole). How many were signalled."""
    n = 0
    queue = [root]
    while queue:
        parent = queue.pop()
        for pid in children(parent):
            got = _child_fd(pid, parent)
            if got is None:
                continue
            fd, pgid = got
            if not skip_pgid or pgid != skip_pgid:
                _send(fd, sig)
                n += 1
            os.close(fd)
            queue.append(pid)
    return n


def kill_tree(root: int, rounds: int = 50, wait_s: float = 0.5) -> bool:
    """SIGKILL every descendant of `root` (not `root`): each round stops the tree top-down (SIGSTOP), SIGKILLs what
    it stopped and waits (on pidfds, not polling) until those are dead, so that their orphans have been reparented
    to the subreaper for the next round. True once no live descendant is left; False when a round finds only what
    the one before it killed (a process that cannot die yet: uninterruptible sleep), so the caller (the monitor's
    thread) waits `wait_s` or so for it, not `rounds` times as long."""
    before: set[int] = set()
    for _ in range(rounds):
        fds: list[int] = []
        found: set[int] = set()
        queue = [root]
        while queue:
            parent = queue.pop(0)
            for pid in children(parent):
                got = _child_fd(pid, parent)
                if got is None:
                    continue
                _send(got[0], signal.SIGSTOP)
                fds.append(got[0])
                found.add(pid)
                queue.append(pid)
        try:
            if not fds:
                return True
            if found <= before:
                return False
            for fd in fds:
                _send(fd, signal.SIGKILL)
            _wait_all(fds, wait_s)
        finally:
            for fd in fds:
                os.close(fd)
        before = found
    return False


def _wait_all(fds: list[int], timeout: float) -> None:
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    left = len(fds)
    deadline = time.monotonic() + timeout
    while left > 0:
        ms = int(max(0.0, deadline - time.monotonic()) * 1000)
        ready = poller.poll(ms)
        if not ready:
            return
        for fd, _ in ready:
            poller.unregister(fd)
            left -= 1
