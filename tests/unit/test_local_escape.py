"""Nothing a task starts escapes its stop or its end (the local backend with real processes): processes that call
setsid, double-fork, `nohup setsid`, or move to a process group of their own die with the task, in a cgroup of
its own (`auto`, where cgroup v2 is writable: as root on CI) and with the fallback forced (`off`: the wrapper is a
child subreaper). The escapees are found by a marker in their environment (tests/escape.py)."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from peloton.domain.resources import Resources
from peloton.domain.states import TaskState
from peloton.errors import InvalidArgument
from peloton.hostmgr.local import cgroups, descendants, spawner
from peloton.hostmgr.local.backend import LocalBackend, make_local_hosts
from tests.escape import escape_command, kill_marked, marked, new_mark, wait_escaped, wait_gone
from tests.unit.test_local_backend import TEST_TASK_USER, Recorder, kill_leftovers, launch, spec, wait_for

CGROUPS, WHY_NOT = cgroups.probe(Path("/nonexistent/peloton-escape-probe"))
if CGROUPS is not None:
    cgroups.kill_and_remove_subtree(Path("/nonexistent/peloton-escape-probe"))
needs_cgroups = pytest.mark.skipif(CGROUPS is None, reason=f"cgroup v2 cannot be used here: {WHY_NOT}")
MODES = [pytest.param("auto", marks=needs_cgroups), "off"]
GRACE_S = 1.0
SLACK_S = 5.0  # how long after the grace the escapees may take to be gone (a loaded 2-core machine)

Make = Callable[..., tuple[LocalBackend, Recorder]]


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Make]:
    made: list[LocalBackend] = []

    def make(mode: str, grace: float = GRACE_S, **kw: Any) -> tuple[LocalBackend, Recorder]:
        b = LocalBackend(tmp_path, make_local_hosts(2, Resources(cpu=4, mem=4096)), kill_grace_s=grace,
                         default_user=TEST_TASK_USER, task_cgroups=mode, **kw)
        assert (b._cgroups is not None) == (mode == "auto")
        rec = Recorder()
        b.start(rec)
        made.append(b)
        return b, rec

    yield make
    for b in made:
        b.stop()
    kill_leftovers(tmp_path)


class Escape:
    """A marker for the escapees of one task."""

    def __init__(self) -> None:
        self.mark = new_mark()

    def command(self, then: str = "sleep 600", stubborn: bool = False) -> str:
        return escape_command(self.mark, then, stubborn=stubborn)

    def wait(self, b: LocalBackend, task_id: str) -> dict[int, str]:
        return wait_escaped(self.mark, b._sandboxes / task_id / "work")

    def alive(self) -> dict[int, str]:
        return marked(self.mark)

    def wait_gone(self, timeout: float) -> float:
        return wait_gone(self.mark, timeout)


@pytest.fixture
def escape() -> Iterator[Callable[[], Escape]]:
    made: list[Escape] = []

    def new() -> Escape:
        made.append(Escape())
        return made[-1]

    yield new
    for e in made:
        kill_marked(e.mark)


# ------------------------------------------------------------------------------------------------ pure parsing


def test_the_cgroup2_mount_and_the_own_cgroup_are_read_from_proc() -> None:
    hybrid = ("31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
              "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
              "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n")
    assert cgroups.cgroup2_mount(hybrid) == "/sys/fs/cgroup/unified"
    assert cgroups.cgroup2_mount("30 1 0:27 / /sys/fs/cgroup rw shared:4 - cgroup2 cgroup2 rw,nsdelegate\n") \
        == "/sys/fs/cgroup"
    assert cgroups.cgroup2_mount("40 1 0:27 / /my\\040cg rw - cgroup2 none rw\n") == "/my cg"
    assert cgroups.cgroup2_mount("40 1 0:27 /sub /elsewhere rw - cgroup2 none rw\n") is None  # a bind of a part
    assert cgroups.cgroup2_mount(hybrid.splitlines()[1]) is None
    assert cgroups.own_cgroup("9:name=systemd:/\n4:memory:/x\n0::/\n") == "/"
    assert cgroups.own_cgroup("0::/system.slice/peloton.service\n") == "/system.slice/peloton.service"
    assert cgroups.own_cgroup("4:memory:/x\n") is None


def test_the_setting_is_checked(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="task cgroups must be one of auto, off, got 'on'"):
        LocalBackend(tmp_path, make_local_hosts(1, Resources(cpu=1, mem=64)), task_cgroups="on")


# ------------------------------------------------------------------------------------------------ escapes


@pytest.mark.parametrize("mode", MODES)
def test_escapees_die_with_a_stop(mode: str, make: Make, escape: Callable[[], Escape]) -> None:
    b, rec = make(mode)
    m = escape()
    launch(b, spec("stopped", m.command()))
    m.wait(b, "stopped")
    b.kill(["stopped"])
    assert rec.wait_terminal("stopped").state == TaskState.KILLED
    m.wait_gone(GRACE_S + SLACK_S)


@pytest.mark.parametrize("mode", MODES)
def test_escapees_that_ignore_sigterm_die_at_the_end_of_the_grace(mode: str, make: Make,
                                                                 escape: Callable[[], Escape]) -> None:
    grace = 3.0
    b, rec = make(mode, grace=grace)
    m = escape()
    # the command itself ignores SIGTERM too, so the task lives until the SIGKILL at the end of its grace
    launch(b, spec("stubborn", m.command("trap '' TERM; while :; do sleep 1; done", True)))
    m.wait(b, "stubborn")
    b.kill(["stubborn"])
    time.sleep(0.3)  # the SIGTERM and its repeats (0.02 s) were sent: ignored
    assert len(m.alive()) == 4 and rec.terminal("stubborn") is None
    assert rec.wait_terminal("stubborn", grace + SLACK_S).state == TaskState.KILLED
    m.wait_gone(SLACK_S)


@pytest.mark.parametrize("mode", MODES)
def test_escapees_die_when_the_command_ends_by_itself(mode: str, make: Make, escape: Callable[[], Escape]) -> None:
    b, rec = make(mode)
    ok, failed = escape(), escape()
    launch(b, spec("ok", ok.command("sleep 1; exit 0")), spec("failed", failed.command("sleep 1; exit 3"), "local-1"))
    ok.wait(b, "ok")
    failed.wait(b, "failed")
    assert rec.wait_terminal("ok").state == TaskState.SUCCEEDED
    assert rec.wait_terminal("failed").exit_code == 3
    ok.wait_gone(SLACK_S)
    failed.wait_gone(SLACK_S)


@needs_cgroups
def test_a_command_runs_only_in_its_cgroup_which_goes_once_its_task_ended(make: Make,
                                                                          escape: Callable[[], Escape]) -> None:
    b, rec = make("auto")
    m = escape()
    # the first thing the command does: say which cgroup it is in (the wrapper waits until it has been moved)
    launch(b, spec("one", "cat /proc/$$/cgroup; " + m.command("sleep 0.5")))
    cg = b._tasks["one"].cgroup
    assert cg and cg.startswith(f"{b._cgroups.subtree}/one.")  # type: ignore[union-attr]
    assert json.loads((b._data_dir / "journal").read_text().splitlines()[0])["cg"] == cg  # known before it ran
    m.wait(b, "one")
    rel = cg[len(cgroups.mount() or ""):]
    assert cgroups.cgroup_of(b._tasks["one"].pid) == rel
    assert {cgroups.cgroup_of(pid) for pid in m.alive()} == {rel}
    for sp in b._spawners._all:  # the spawners stay where they were
        assert cgroups.cgroup_of(sp.proc.pid) == cgroups.cgroup_of("self")
    assert rec.wait_terminal("one").state == TaskState.SUCCEEDED
    assert f"0::{rel}\n".encode() in b.read_log("one", "stdout", 0, 10_000)[0]
    m.wait_gone(SLACK_S)
    wait_for(lambda: not os.path.exists(cg) and not b._releasing)


@needs_cgroups
def test_without_cgroup_kill_the_cgroup_is_frozen_and_its_processes_killed(
        make: Make, escape: Callable[[], Escape], monkeypatch: pytest.MonkeyPatch) -> None:
    """Linux before 5.14 has no cgroup.kill."""
    monkeypatch.setattr(cgroups, "KILL", "cgroup.kill-absent")
    b, rec = make("auto")
    m = escape()
    launch(b, spec("old-kernel", m.command("trap '' TERM; while :; do sleep 1; done", True)))
    m.wait(b, "old-kernel")
    b.kill(["old-kernel"])
    assert rec.wait_terminal("old-kernel").state == TaskState.KILLED
    m.wait_gone(GRACE_S + SLACK_S)
    wait_for(lambda: not b._releasing)


# ------------------------------------------------------------------------------------------------ restarts


@pytest.mark.parametrize("mode", MODES)
def test_an_adopted_task_is_stopped_with_its_escapees(mode: str, make: Make, escape: Callable[[], Escape]) -> None:
    a, _ = make(mode)
    m = escape()
    launch(a, spec("adopted", m.command()))
    m.wait(a, "adopted")
    a.stop()  # the daemon is gone (as after kill -9): the task runs on
    b, rec = make(mode)
    assert b._tasks["adopted"].cgroup == a._tasks["adopted"].cgroup
    assert len(m.alive()) == 4
    b.kill(["adopted"])
    assert rec.wait_terminal("adopted").state == TaskState.KILLED
    m.wait_gone(GRACE_S + SLACK_S)


@needs_cgroups
def test_what_a_task_left_while_no_daemon_watched_is_killed_at_the_restart(
        tmp_path: Path, make: Make, escape: Callable[[], Escape]) -> None:
    a, _ = make("auto")
    m = escape()
    launch(a, spec("ended", m.command("sleep 1")))
    m.wait(a, "ended")
    cg = a._tasks["ended"].cgroup
    a.stop()
    wait_for(lambda: (tmp_path / "sandboxes" / "ended" / "exit").exists())
    time.sleep(0.2)
    assert len(m.alive()) == 4  # the wrapper killed its group only: the escapees wait for a daemon
    b, rec = make("auto")
    assert rec.wait_terminal("ended").state == TaskState.SUCCEEDED
    m.wait_gone(SLACK_S)
    wait_for(lambda: not os.path.exists(str(cg)))


@needs_cgroups
def test_cgroups_of_tasks_no_longer_known_are_emptied_and_removed_at_start(make: Make) -> None:
    a, _ = make("auto")
    assert a._cgroups is not None
    stray = f"{a._cgroups.subtree}/gone-0-1.0123abcd"
    os.mkdir(stray)
    p = subprocess.Popen(["sleep", "600"])
    try:
        with open(f"{stray}/cgroup.procs", "w") as f:
            f.write(str(p.pid))
        other = Path(a._cgroups.subtree).parent / "0000000000000000"  # another data dir's: not ours to touch
        other.mkdir(exist_ok=True)
        a.stop()
        make("auto")
        assert p.wait(10) == -signal.SIGKILL
        wait_for(lambda: not os.path.exists(stray))
        assert other.is_dir()
        other.rmdir()
    finally:
        p.kill()
        p.wait()


# ------------------------------------------------------------------------------------------------ the fallback


def test_the_fallback_wrapper_is_a_child_subreaper(make: Make, escape: Callable[[], Escape]) -> None:
    b, rec = make("off")
    m = escape()
    launch(b, spec("reaper", m.command()))
    got = m.wait(b, "reaper")
    wrapper_pid = b._tasks["reaper"].pid
    # the double-forked daemon lost its parents: it was reparented to the wrapper, not to init
    (daemonized,) = [pid for pid, how in got.items() if how == "doublefork"]
    assert descendants._stat(daemonized)[1] == wrapper_pid  # type: ignore[index]
    assert daemonized in descendants.children(wrapper_pid)
    b.kill(["reaper"])
    rec.wait_terminal("reaper")
    m.wait_gone(GRACE_S + SLACK_S)


def test_kill_tree_waits_for_the_dead_and_leaves_the_root(tmp_path: Path) -> None:
    """A chain of processes, each the parent of the next, below a root that is not a subreaper (stopped, as the
    backend stops a wrapper first): what the walk stops and kills is gone when it returns, the root is left."""
    script = "sh -c 'sh -c \"sleep 600\" & wait' & wait"
    root = subprocess.Popen(["sh", "-c", script])
    try:
        deadline = time.monotonic() + 10
        while len(_tree(root.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        below = _tree(root.pid)
        assert len(below) >= 2
        fds = [os.pidfd_open(p) for p in below]
        os.kill(root.pid, signal.SIGSTOP)
        assert descendants.kill_tree(root.pid)
        assert all(select.select([fd], [], [], 0)[0] for fd in fds)  # each of them has exited
        assert root.poll() is None
        os.kill(root.pid, signal.SIGCONT)
        assert root.wait(10) == 0
        for fd in fds:
            os.close(fd)
    finally:
        root.kill()
        root.wait()


def _tree(pid: int) -> list[int]:
    out, queue = [], [pid]
    while queue:
        for c in descendants.children(queue.pop()):
            out.append(c)
            queue.append(c)
    return out


@pytest.mark.parametrize("go", [True, False])
def test_a_gated_wrapper_runs_its_command_only_when_let_go(tmp_path: Path, go: bool) -> None:
    """The wrapper of a task with a cgroup waits for `go`; without it (the spawner could not move it into its
    cgroup, or died) it runs nothing and says why."""
    sandbox = tmp_path / "gated"
    (sandbox / "work").mkdir(parents=True)
    r, w = os.pipe2(os.O_CLOEXEC)
    pid = spawner.spawn(str(sandbox), "echo ran", dict(os.environ), gate=r)
    os.close(r)
    try:
        time.sleep(0.2)
        assert not (sandbox / "stdout").read_bytes()  # waiting
        if go:
            os.write(w, b"go\n")
    finally:
        os.close(w)
    _, status = os.waitpid(pid, 0)
    if go:
        assert (sandbox / "stdout").read_bytes() == b"ran\n" and (sandbox / "exit").read_text() == "0\n"
    else:
        assert os.waitstatus_to_exitcode(status) == 125 and not (sandbox / "exit").exists()
        assert (sandbox / "stdout").read_bytes() == b""
        assert b"could not be put into its cgroup" in (sandbox / "stderr").read_bytes()


@pytest.mark.parametrize("proc_cgroup,why", [
    (None, "no cgroup2 file system is mounted"),
    ("4:memory:/x\n", "this process is in no cgroup v2"),
    ("0::/not-there-at-all\n", "the daemon's own cgroup /not-there-at-all is not visible under"),
])
def test_auto_falls_back_to_the_subreaper_and_says_why(
        tmp_path: Path, escape: Callable[[], Escape], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture, proc_cgroup: str | None, why: str) -> None:
    """Where cgroups cannot be used (no cgroup2 mount, a daemon in no cgroup v2 or outside the mount's view, as in
    a container), `auto` runs tasks under a child subreaper, and the start's log line says which and why."""
    if proc_cgroup is None:
        monkeypatch.setattr(cgroups, "mount", lambda: None)
    else:
        real = cgroups._read
        monkeypatch.setattr(cgroups, "mount", lambda: "/sys/fs/cgroup/unified")
        monkeypatch.setattr(cgroups, "_read", lambda p: proc_cgroup if p == "/proc/self/cgroup" else real(p))
    caplog.set_level("INFO", logger="peloton.hostmgr.local.backend")
    b = LocalBackend(tmp_path, make_local_hosts(1, Resources(cpu=4, mem=4096)), kill_grace_s=GRACE_S,
                     default_user=TEST_TASK_USER)
    assert b._cgroups is None
    monkeypatch.undo()
    rec = Recorder()
    b.start(rec)
    try:
        assert f"contained by a child subreaper per task: cgroup v2 cannot be used ({why}" in caplog.text
        m = escape()
        launch(b, spec("fell-back", m.command()))
        m.wait(b, "fell-back")
        b.kill(["fell-back"])
        assert rec.wait_terminal("fell-back").state == TaskState.KILLED
        m.wait_gone(GRACE_S + SLACK_S)
    finally:
        b.stop()
        kill_leftovers(tmp_path)
