"""The components as separate processes: the same gRPC contracts between them, only the addresses change."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.e2e.harness import Daemon, kill_sandboxed_processes

pytestmark = pytest.mark.e2e


class RoleDaemon(Daemon):
    """A daemon process running only some components (`extra` flags pick them and their peers)."""

    extra: list[str]

    def server_args(self) -> list[str]:
        return [*super().server_args(), *self.extra]


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_hostmgr_in_its_own_process(db_url: str, tmp_path: Path) -> None:
    hostmgr = RoleDaemon(tmp_path / "hostmgr", db_url)
    hostmgr.extra = ["--role", "hostmgr"]
    rest = RoleDaemon(tmp_path / "rest", db_url)
    try:
        hostmgr.start()
        rest.extra = ["--role", "jobmgr,resmgr,placement", "--hostmgr", hostmgr.address]
        rest.start()
        job = rest.create(f"""
name: split
instances: 2
task: {{command: "{sys.executable} -c 'import os; print(os.environ[\\"RANK\\"])'", resources: {{cpu: 1, mem: 64Mi}}}}
""", tmp_path)
        r = rest.cli("job", "wait", job, "--timeout", "60", check=False, timeout=90)
        assert r.returncode == 0, (r.stderr, rest.log()[-3000:], hostmgr.log()[-3000:])
        assert rest.cli("task", "logs", job, "1").stdout.strip() == "1"
        # hosts are served by the hostmgr process
        assert "local-1" in hostmgr.cli("host", "list").stdout
        # a process without a role it needs refuses to start, naming the flag
        bad = rest.cli("server", "--role", "jobmgr", "--resmgr", "", check=False)
        assert bad.returncode == 2 and "--resmgr" in bad.stderr
    finally:
        rest.stop()
        hostmgr.stop()
        kill_sandboxed_processes(tmp_path)  # the tasks the hostmgr process started, if the test failed early
