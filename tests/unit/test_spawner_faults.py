"""The spawner under faults of its host: a user database that cannot answer (an LDAP or sssd outage; here, made
real, a process out of descriptors, which cannot open /etc/passwd) and a spawner out of descriptors. Each runs
the spawner's own functions in a child process (what its serve() loop calls), starved of descriptors there."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from peloton.hostmgr.local import spawner

ROOT = Path(__file__).resolve().parents[2]

# `starved()` takes every descriptor this process may still open (its soft limit lowered first, so that it is
# quick), `fed()` gives them back
_STARVE = r"""
import contextlib, json, os, resource, sys
from peloton.hostmgr.local import spawner
base = sys.argv[1]
_soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
_held = []
spawner._load_libc()  # as its main() does

def starved():
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, _hard))
    with contextlib.suppress(OSError):
        while True:
            _held.append(os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC))

def fed():
    while _held:
        os.close(_held.pop())
    resource.setrlimit(resource.RLIMIT_NOFILE, (_soft, _hard))

def task(name, **kw):
    return {"sandbox": os.path.join(base, name), "command": "sleep 30", "env": {"PATH": "/usr/bin:/bin"},
            "files": {}, **kw}
"""


def _run(script: str, tmp_path: Path) -> Any:
    p = subprocess.run([sys.executable, "-c", _STARVE + script, str(tmp_path)], capture_output=True, text=True,
                       timeout=60, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_a_user_database_that_cannot_answer_fails_the_launch_for_now_not_for_good(tmp_path: Path) -> None:
    """Python's pwd reads "could not look" (getpwnam_r's errno: EMFILE here, EIO or ETIMEDOUT from LDAP) as "no
    such user" (KeyError): the task's job failed for good during an outage. A lookup that could not answer is
    transient; only one every source answered (no entry) is the definite absence that fails it for good, and an
    allocated uid is let through only when no account has it for certain."""
    out = _run(r"""
starved()
named = spawner.ready(task("a", user="daemon"), {})
allocated = spawner.ready(task("b", user="#5000"), {})
fed()
absent = spawner.ready(task("c", user="no-such-user-xyz"), {})
print(json.dumps({"named": named, "allocated": allocated if isinstance(allocated, dict) else "ready",
                  "absent": absent}))
""", tmp_path)
    assert out["named"]["permanent"] is False, out
    assert "cannot look up user 'daemon'" in out["named"]["error"], out
    assert "Too many open files" in out["named"]["error"], out
    assert out["allocated"] != "ready" and out["allocated"]["permanent"] is False, out
    # a definite absence is still refused for good
    assert out["absent"] == {"error": "task.user: there is no user 'no-such-user-xyz' on this host",
                             "permanent": True}


def test_the_user_lookup_rule_tells_absent_from_not_answered() -> None:
    assert spawner.nss_error("getpwnam_r", "no-such-user-xyz") == 0
    assert spawner.nss_error("getpwuid_r", 4_000_000_000 - 7) == 0
    assert spawner.nss_error("getgrgid_r", 4_000_000_000 - 7) == 0
    # an entry there after all (the outage ended between pwd's look and this one): tried again, not refused
    assert spawner.nss_error("getpwnam_r", "root") == errno.EAGAIN
    assert spawner.nss_error("getpwuid_r", 0) == errno.EAGAIN


def test_a_spawner_out_of_descriptors_fails_the_task_instead_of_dying(tmp_path: Path) -> None:
    """The gate's pipe (a task with a cgroup) could not be made: start_all raised, and the spawner's loop with it
    (every task of its request lost, its launchers and warm wrappers too). Now that task is not started
    (transient), and the request goes on."""
    out = _run(r"""
starved()
try:
    replies, fds = spawner.start_all([task("a", cgroup=os.path.join(base, "cg-a"), group=0)], {})
except OSError as e:
    replies, fds = repr(e), []
fed()
print(json.dumps({"replies": replies, "fds": len(fds)}))
""", tmp_path)
    assert isinstance(out["replies"], list), out
    (entry,) = out["replies"]
    assert entry["permanent"] is False and "Too many open files" in entry["error"], out


def test_a_started_wrapper_that_cannot_be_watched_is_killed_and_reported_not_started(tmp_path: Path) -> None:
    """posix_spawn worked, but no pidfd could be opened for the wrapper (EMFILE): the spawner died with the task
    running and no one watching it. Now the wrapper's group is killed and the task reported not started."""
    out = _run(r"""
import errno
spawned = []
real_spawn = os.posix_spawn
def posix_spawn(*args, **kw):  # (only to learn the wrapper's pid)
    spawned.append(real_spawn(*args, **kw))
    return spawned[-1]
os.posix_spawn = posix_spawn
real = os.pidfd_open
def pidfd_open(pid, flags=0):  # the one descriptor that could not be had: the process's table just filled up
    raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
os.pidfd_open = pidfd_open
try:
    replies, fds = spawner.start_all([task("a", group=0)], {})
except OSError as e:
    replies, fds = repr(e), []
os.pidfd_open = real
print(json.dumps({"replies": replies, "spawned": spawned}))
""", tmp_path)
    assert isinstance(out["replies"], list), out
    (entry,) = out["replies"]
    assert entry["permanent"] is False and "Too many open files" in entry["error"], out
    (pid,) = out["spawned"]
    deadline = time.monotonic() + 30
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid), "the wrapper no one watches still runs"


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def test_launcher_backoffs_that_ran_out_are_forgotten() -> None:
    """_launcher_backoff has an entry per user whose launcher failed: a daemon that runs for months with many
    tenants kept every one for ever. Those past their time go whenever one is added."""
    spawner._launcher_backoff.clear()
    try:
        now = time.monotonic()
        for uid in range(3):
            spawner._launcher_backoff[(10_000 + uid, 10_000 + uid, ())] = now - 1.0  # ran out
        spawner.back_off_launcher((20_000, 20_000, ()), now)
        assert list(spawner._launcher_backoff) == [(20_000, 20_000, ())]
    finally:
        spawner._launcher_backoff.clear()
