"""Everything the daemon creates is owner-only from the moment it exists, whatever the umask: the real daemon started
under umask 022 (its default SQLite store, a split deployment's internal socket and secret, a task run on the local
backend), every file and directory under its data dir and the missing directories above it, the Unix sockets while
it serves; a second start finds nothing of its own to tighten. And what `peloton token create` and `peloton certs
init` write."""

from __future__ import annotations

import os
import re
import signal
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.asroot import AS_ROOT_FLAGS
from tests.e2e.harness import PELOTON, kill_sandboxed_processes

pytestmark = pytest.mark.e2e

UMASK = 0o022  # the usual one: it would give 0644 files and 0755 directories
ROOT = os.geteuid() == 0
# a root daemon's directories on the way to the sandboxes are traversable (0711) for the tasks of other users
# (files.py, docs/security.md); a task's own sandbox is 0700, every file 0600
DIR_MODES = {0o700, 0o711} if ROOT else {0o700}


def run(*args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*PELOTON, *args], capture_output=True, text=True, timeout=60, umask=UMASK,
                          **kwargs)


def start(data: Path, log: Path) -> tuple[subprocess.Popen[str], str]:
    """`peloton server` under UMASK on its defaults (SQLite in the data dir), serving the internal services on a
    socket too; (process, address). Its log goes outside the data dir."""
    with open(log, "a") as err:
        proc = subprocess.Popen(
            [*PELOTON, "server", "--listen", "127.0.0.1:0", "--data-dir", str(data), "--metrics-listen", "",
             "--local-hosts", "1", "--local-host-resources", "cpu=2,mem=1Gi", "--log-level", "info",
             "--internal-listen", f"unix:{data}/internal.sock", *AS_ROOT_FLAGS],
            stdout=subprocess.PIPE, stderr=err, text=True, umask=UMASK)
    assert proc.stdout is not None
    for line in proc.stdout:
        m = re.search(r"serving on (\S+)", line)
        if m:
            return proc, m.group(1)
    raise AssertionError(f"the daemon did not start:\n{log.read_text()[-3000:]}")


def stop(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGTERM)
    proc.wait(30)


def modes(top: Path) -> dict[str, int]:
    """Every path under `top` (not following links), with its permission bits; sockets marked."""
    out: dict[str, int] = {}
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            out[str(p.relative_to(top)) + ("=" if stat.S_ISSOCK(st.st_mode) else "")] = st.st_mode
    return out


def loose(entries: dict[str, int]) -> dict[str, str]:
    bad = {}
    for path, mode in entries.items():
        perm = stat.S_IMODE(mode)
        ok = perm in DIR_MODES if stat.S_ISDIR(mode) else perm == 0o600
        if not ok:
            bad[path] = f"{perm:o}"
    return bad


def test_everything_the_daemon_creates_is_owner_only(tmp_path: Path) -> None:
    data = tmp_path / "a" / "b" / "data"  # a and b do not exist yet either
    log = tmp_path / "daemon.log"
    proc, address = start(data, log)
    try:
        spec = tmp_path / "job.yaml"
        spec.write_text("name: modes\ninstances: 1\ntask: {command: 'echo out; echo err >&2; touch made-by-task', "
                        "resources: {cpu: 1, mem: 64Mi}}\n")
        job = run("--address", address, "job", "create", "-f", str(spec)).stdout.strip()
        assert job, log.read_text()[-2000:]
        assert run("--address", address, "job", "wait", job, "--timeout", "60").returncode == 0
        seen = modes(data)
        assert {"daemon.addr", "daemon.lock", "peloton.db", "peloton.db.lock", "internal.secret", "peloton.sock=",
                "internal.sock=", "local/journal"} <= set(seen), sorted(seen)
        sandbox = [p for p in seen if p.startswith("local/sandboxes/") and p.count("/") == 2]
        assert sandbox and {f"{sandbox[0]}/{f}" for f in ("stdout", "stderr", "pids", "exit", "work")} <= set(seen)
        task_file = f"{sandbox[0]}/work/made-by-task"
        assert stat.S_IMODE(seen.pop(task_file)) == 0o644  # the task's own file: the command keeps its umask
        assert loose(seen) == {}
        for d in (tmp_path / "a", tmp_path / "a" / "b", data):
            assert stat.S_IMODE(d.stat().st_mode) in DIR_MODES, d
    finally:
        stop(proc)
        kill_sandboxed_processes(data)
    first = log.read_text()
    proc, _ = start(data, log)  # a second start: nothing of its own to tighten
    stop(proc)
    second = log.read_text()[len(first):]
    assert "serving" in second or "leading" in second, second[-2000:]
    assert "tightened" not in first + second, [ln for ln in (first + second).splitlines() if "tightened" in ln]


def test_token_create_and_certs_init_write_owner_only(tmp_path: Path) -> None:
    principals = tmp_path / "x" / "y" / "principals.json"
    r = run("token", "create", "alice", "--role", "submitter", "--principals-file", str(principals))
    assert r.returncode == 0, r.stderr
    assert stat.S_IMODE(principals.stat().st_mode) == 0o600
    for d in (tmp_path / "x", tmp_path / "x" / "y"):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
    pki = tmp_path / "p" / "q" / "pki"
    r = run("certs", "init", str(pki), "--name", "node-a.example.com")
    assert r.returncode == 0, r.stderr
    for d in (tmp_path / "p", tmp_path / "p" / "q", pki):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
    got = {p.name: stat.S_IMODE(p.stat().st_mode) for p in pki.iterdir()}
    # certificates are public (handed to clients), in a directory only its owner can enter; keys are owner-only
    assert got == {"ca.pem": 0o644, "server.pem": 0o644, "client.pem": 0o644, "ca-key.pem": 0o600,
                   "server-key.pem": 0o600, "client-key.pem": 0o600}
