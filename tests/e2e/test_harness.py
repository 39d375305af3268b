"""The e2e harness's own cleanup: leftover task processes are found by their PELOTON_SANDBOX and killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.e2e.harness import kill_sandboxed_processes, pid_alive, sandboxed_pids, wait_until


def _start(sandbox: Path, *argv: str) -> subprocess.Popen[str]:
    """A process in a session of its own (like a task of the local backend) with PELOTON_SANDBOX=sandbox."""
    env = dict(os.environ, PELOTON_SANDBOX=str(sandbox))
    return subprocess.Popen(list(argv), env=env, start_new_session=True, stdout=subprocess.PIPE, text=True)


def test_kills_the_process_group_of_every_task_inside_the_data_dir(tmp_path: Path) -> None:
    data = tmp_path / "data"
    task = _start(data / "x", "sleep", "60")
    # a shell whose child has no PELOTON_SANDBOX: it dies with the group
    group = _start(data / "sandboxes" / "t-1",
                   "/bin/sh", "-c", "env -u PELOTON_SANDBOX sleep 60 & echo $!; wait")
    assert group.stdout is not None
    grandchild = int(group.stdout.readline())
    wait_until(lambda: Path(f"/proc/{grandchild}/cmdline").read_bytes().startswith(b"sleep\0"), 10, 0.01,
               "the child to exec sleep without PELOTON_SANDBOX")
    # PELOTON_SANDBOX elsewhere (a sibling whose name merely starts the same way): left alone
    other = _start(tmp_path / "data-other" / "x", "sleep", "60")
    try:
        assert set(sandboxed_pids(data)) == {task.pid, group.pid}
        killed = kill_sandboxed_processes(data)
        assert set(killed) == {task.pid, group.pid}
        assert task.wait(10) == -signal.SIGKILL
        assert group.wait(10) == -signal.SIGKILL
        wait_until(lambda: not pid_alive(grandchild), 10, 0.05, "the task's child to die with its group")
        assert other.poll() is None and pid_alive(other.pid)
        assert sandboxed_pids(data) == []
        assert kill_sandboxed_processes(data) == []  # nothing left: nothing to do
    finally:
        for p in (task, group, other):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)
            if p.stdout is not None:
                p.stdout.close()


def test_never_kills_the_test_runners_own_group(tmp_path: Path) -> None:
    """A matching process in our own process group is killed alone, never the group (pytest is in it)."""
    env = dict(os.environ, PELOTON_SANDBOX=str(tmp_path / "x"))
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    try:
        assert os.getpgid(child.pid) == os.getpgid(0)
        assert kill_sandboxed_processes(tmp_path) == [child.pid]
        assert child.wait(10) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
        child.wait(10)
