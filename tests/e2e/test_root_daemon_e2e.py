"""A daemon started as root on its defaults (SQLite and PostgreSQL, the real daemon and CLI): it turns
authentication on by itself, so another local user reaching its loopback port can do nothing without a token;
root's CLI reaches it through the owner-only Unix socket; tasks naming no user run as nobody; root only in a pool
that allows it. (The issue this closes: `nobody` could create a job whose command ran as root.)"""

from __future__ import annotations

import json
import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.asroot import let_others_pass
from tests.e2e.harness import PELOTON, Daemon, serving

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(os.geteuid() != 0, reason="the defaults of a daemon started as root")]


@pytest.fixture
def root_daemon(db_url: str, tmp_path: Path) -> Iterator[Daemon]:
    d = Daemon(tmp_path / "data", db_url, secure_defaults=True)
    let_others_pass(tmp_path)  # as /var/lib is: tasks run as nobody, who enters its sandbox itself
    with serving(d):
        yield d


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("PELOTON_")}
    return subprocess.run([*PELOTON, *args], capture_output=True, text=True, timeout=60, env={**base, **(env or {})})


def test_a_root_daemon_locks_itself_to_root_until_tokens_are_made(root_daemon: Daemon, tmp_path: Path) -> None:
    d = root_daemon
    principals = d.data_dir / "principals.json"
    assert json.loads(principals.read_text()) == {"principals": {}}
    assert stat.S_IMODE(principals.stat().st_mode) == 0o600
    assert "running as root: authentication is on" in d.log()

    # anyone on the loopback port without a token: nothing
    r = cli("--address", d.address, "job", "list")
    assert r.returncode != 0 and "no credentials" in r.stderr, r.stderr

    # root, through the owner-only socket (the CLI's default when it can open it): an admin
    spec = tmp_path / "who.yaml"
    spec.write_text("name: who\ninstances: 1\ntask: {command: 'id -un', resources: {cpu: 1, mem: 64Mi}}\n")
    local = {"PELOTON_DATA_DIR": str(d.data_dir), "PELOTON_CONFIG": str(tmp_path / "none.toml")}
    job = cli("job", "create", "-f", str(spec), env=local).stdout.strip()
    assert job, "root could not create a job through the socket"
    assert cli("job", "wait", job, "--timeout", "60", env=local).returncode == 0
    assert cli("task", "logs", job, "0", env=local).stdout == "nobody\n"  # a task naming no user

    info = cli("cluster", "info", env=local).stdout
    assert "authentication:  tokens" in info and "(admin; by unix socket)" in info, info

    # a token for a submitter: it may submit, but not as root, nor as another user
    token = cli("token", "create", "alice", "--role", "submitter", "--data-dir", str(d.data_dir)).stdout.strip()
    alice = {"PELOTON_TOKEN": token}
    root_spec = tmp_path / "root.yaml"
    root_spec.write_text("name: r\ninstances: 1\ntask: {user: root, command: id, resources: {cpu: 1, mem: 64Mi}}\n")
    r = cli("--address", d.address, "job", "create", "-f", str(root_spec), env=alice)
    assert r.returncode != 0 and "task.user: alice may not run tasks as 'root'" in r.stderr, r.stderr
    r = cli("--address", d.address, "job", "create", "-f", str(spec), env=alice)
    assert r.returncode == 0, r.stderr
    # not even an admin runs tasks as root in a pool that does not allow it
    r = cli("job", "create", "-f", str(root_spec), env=local)
    assert r.returncode != 0 and "task.user: pool / does not allow tasks to run as root" in r.stderr, r.stderr
