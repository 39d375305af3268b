"""The local backend's launch path (issue 24): a command without shell syntax is executed by the wrapper directly
(no `/bin/sh -c` between), a gang's members start in parallel over the spawner pool, a task as another user is
started by posix_spawn through setpriv, a launch's statuses are handed over as one batch, the wrapper writes its
files with no subshell, and gated wrappers go into their cgroups only once the launch is answered. Real
processes."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from peloton.domain.launch import GangLaunch, LaunchOutcome, TaskStatus
from peloton.domain.states import TaskState
from peloton.hostmgr.local import cgroups, spawner, wrapper
from peloton.hostmgr.local.backend import LocalBackend
from peloton.hostmgr.local.spawn import NotStarted, SpawnerPool, Started
from peloton.hostmgr.local.task_env import inherited
from tests.unit.test_local_backend import (  # noqa: F401 - make_backend is a fixture
    Recorder,
    group_gone,
    launch,
    make_backend,
    running_ids,
    spec,
    wait_for,
    wrapper_pgid,
)

PY = sys.executable
AS_ROOT = os.geteuid() == 0
ROOT = Path(__file__).resolve().parents[2]


def _out(b: LocalBackend, task_id: str, stream: str = "stdout") -> str:
    return b.read_log(task_id, stream, 0, 100_000)[0].decode()


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def _cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]


def _ppid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


# ------------------------------------------------------------------------------------------------ the rule


@pytest.mark.parametrize(("command", "words"), [
    ("sleep 30", ["sleep", "30"]),
    ("  sleep\t30  ", ["sleep", "30"]),
    ("prog 'a b' \"c d\" '' x", ["prog", "a b", "c d", "", "x"]),
    ("prog '$HOME; *' \"a|b>c\" 'it''s'", ["prog", "$HOME; *", "a|b>c", "its"]),  # quoted: literal
    ("prog --opt=1 a=b -x, user@host:/p%2 +1", ["prog", "--opt=1", "a=b", "-x,", "user@host:/p%2", "+1"]),
    ("/bin/echo hi", ["/bin/echo", "hi"]),  # a path: not the shell's builtin
    ("./run.sh a", ["./run.sh", "a"]),
    ("prog 'two\nlines'", ["prog", "two\nlines"]),
])
def test_a_command_without_shell_syntax_is_split_into_its_words(command: str, words: list[str]) -> None:
    assert spawner.split_plain(command) == words


@pytest.mark.parametrize("command", [
    "", "   ", "a | b", "a; b", "a && b", "a || b", "a & ", "a > f", "a < f", "a 2>&1", "(a)", "{ a; }",
    "a $HOME", 'a "$HOME"', "a ${X}", "a `b`", 'a "`b`"', "a $(b)", "a ~/x", "a ~", "ls *.txt", "ls a?", "ls [ab]",
    "a # comment", "a\\ b", 'a "b\\"c"', "FOO=1 prog", "a 'unterminated", 'a "unterminated', "a\nb", "a !b",
    # the shell's words: reserved words and builtins (`echo` is the shell's, not /bin/echo)
    "echo hi", "exec sleep 1", "cd /tmp", "exit 3", "export A=1", "set -e", "true", "false", "test -f x", "[ 1 ]",
    "kill 1", "printf x", "if", "while", ". ./env", "source x", "'echo' hi", "umask 0", "ulimit -n 1", "wait",
])
def test_a_command_with_shell_syntax_or_a_shell_word_first_keeps_the_shell(command: str) -> None:
    assert spawner.split_plain(command) is None


def test_the_first_word_must_be_a_program_of_the_tasks_path(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "tool").write_text("#!/bin/sh\n")
    (tmp_path / "b" / "tool").chmod(0o755)
    (tmp_path / "a" / "tool").write_text("not executable")  # skipped, as the shell skips it
    (tmp_path / "a" / "tool").chmod(0o644 if not AS_ROOT else 0o600)  # (root may execute anything with an x bit)
    path = f"{tmp_path}/a:{tmp_path}/b/"
    assert spawner.argv_of("tool x 'y z'", {"PATH": path}) == ["tool", "x", "y z"]  # argv[0] as the shell passes it
    assert spawner.argv_of("no-such-tool x", {"PATH": path}) is None  # the shell says "not found" (127)
    assert spawner.argv_of("tool", {"PATH": f"{path}:relative"}) is None  # a PATH with the work dir in it
    assert spawner.argv_of("tool", {"PATH": f"{path}:"}) is None
    assert spawner.argv_of("tool", {}) is None  # the shell's own default PATH
    assert spawner.argv_of("/no/such x", {}) == ["/no/such", "x"]  # a path is the shell's to execute as it is
    assert spawner.argv_of("tool | cat", {"PATH": path}) is None


# ------------------------------------------------------------------------------------------------ real tasks


def test_a_plain_command_runs_as_the_wrappers_own_child_and_a_shell_command_under_sh(
        make_backend: Callable[..., tuple[LocalBackend, Recorder]]) -> None:  # noqa: F811
    b, rec = make_backend(n=1)
    assert launch(b, spec("direct", "sleep 30"), spec("shell", "sleep 30; true")).outcome == LaunchOutcome.OK
    for tid in ("direct", "shell"):
        pid = b._tasks[tid].pid
        mine = _cmdline(pid)

        def commands(pid: int = pid, mine: list[str] = mine) -> list[list[str]]:
            """What the wrapper's children run, once executed (not the wrapper's own forks)."""
            return [c for c in map(_cmdline, _children(pid)) if c not in ([], mine)]

        wait_for(lambda: bool(commands()))
        (got,) = commands()
        if tid == "direct":
            assert got == ["sleep", "30"], got  # no shell between, argv[0] as a shell would pass it
        else:
            assert got == ["/bin/sh", "-c", "sleep 30; true"], got
        assert wrapper.is_wrapper(pid, b._tasks[tid].sandbox)  # the sandbox is still in the wrapper's argv
    b.kill(["direct", "shell"], grace_s=5.0)
    for tid in ("direct", "shell"):
        assert rec.wait_terminal(tid).state == TaskState.KILLED  # SIGTERM to the group reaches both


def test_quoting_expansion_pipes_and_exit_codes_with_and_without_a_shell(
        make_backend: Callable[..., tuple[LocalBackend, Recorder]]) -> None:  # noqa: F811
    b, rec = make_backend(n=1)
    cases = {
        "argv": (f"{PY} -c 'import sys; print(sys.argv[1:])' 'a b' \"c;d\" '' '$FOO'", TaskState.SUCCEEDED,
                 "['a b', 'c;d', '', '$FOO']\n"),
        "expand": ('/bin/echo "$FOO" $FOO', TaskState.SUCCEEDED, "x y x y\n"),
        "pipe": ("/bin/echo abc | tr a-z A-Z", TaskState.SUCCEEDED, "ABC\n"),
        "cwd": ("pwd", TaskState.SUCCEEDED, None),  # a builtin: the shell's
        "exit3": (f"{PY} -c 'import sys; sys.exit(3)'", TaskState.FAILED, ""),
        "sh-exit3": ("exit 3", TaskState.FAILED, ""),
        "missing": ("./no-such-program", TaskState.FAILED, ""),
        "not-found": ("no-such-command-anywhere", TaskState.FAILED, ""),
        "not-exec": ("/etc/passwd", TaskState.FAILED, ""),
        "self-term": (f"{PY} -c 'import os, signal; os.kill(os.getpid(), signal.SIGTERM)'", TaskState.FAILED, ""),
    }
    for tid, (command, _, _) in cases.items():
        assert launch(b, spec(tid, command, env={"FOO": "x y"}, cpu=0.1, mem=1)).outcome == LaunchOutcome.OK
    got = {tid: rec.wait_terminal(tid) for tid in cases}
    for tid, (_, state, stdout) in cases.items():
        assert got[tid].state == state, (tid, got[tid], _out(b, tid, "stderr"))
        if stdout is not None:
            assert _out(b, tid) == stdout, tid
    assert _out(b, "cwd") == f"{b._sandboxes / 'cwd' / 'work'}\n"
    assert got["exit3"].exit_code == 3 and got["sh-exit3"].exit_code == 3
    for tid in ("missing", "not-found"):
        assert got[tid].exit_code == 127 and "command not found" in got[tid].message
    assert got["not-exec"].exit_code == 126 and "not executable" in got["not-exec"].message
    assert got["self-term"].exit_code is None and got["self-term"].message == f"killed by signal {int(signal.SIGTERM)}"


def test_the_members_of_a_gang_start_in_parallel_over_the_spawners(
        make_backend: Callable[..., tuple[LocalBackend, Recorder]]) -> None:  # noqa: F811
    b, rec = make_backend(n=2, spawners=4)
    members = [spec(f"p{i}", "sleep 30", f"local-{i % 2}") for i in range(8)]
    assert launch(b, *members).outcome == LaunchOutcome.OK
    spawners = {_ppid(b._tasks[m.task_id].pid) for m in members}  # a wrapper's parent is its spawner
    assert len(spawners) == 4, spawners  # two members each (spawn_many's per_spawner)
    assert [s.task_id for s in rec.statuses] == [m.task_id for m in members]  # RUNNING, in order
    assert all(s.state == TaskState.RUNNING for s in rec.statuses)
    b.kill([m.task_id for m in members], grace_s=5.0)
    for m in members:
        assert rec.wait_terminal(m.task_id).state == TaskState.KILLED


def test_a_member_that_cannot_start_stops_the_members_other_spawners_started(
        make_backend: Callable[..., tuple[LocalBackend, Recorder]],  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    b, rec = make_backend(n=2, spawners=4)
    members = [spec(f"f{i}", "sleep 30", f"local-{i % 2}") for i in range(8)]
    members[5] = spec("f5", "sleep 30\0", "local-1")  # cannot be started (a NUL byte): its share's second
    real = b._spawners.spawn_many
    started: list[object] = []

    def spawn_many(tasks: list[dict[str, object]]) -> list[object]:
        out = real(tasks)
        started.extend(out)
        return out  # type: ignore[return-value]

    monkeypatch.setattr(b._spawners, "spawn_many", spawn_many)
    r = launch(b, *members)
    assert r.outcome == LaunchOutcome.FAILED and r.task_id == "f5" and r.permanent
    pgids = [x.pid for x in started if isinstance(x, Started)]
    assert len(pgids) == 7  # the other shares were started before the failure was known ...
    wait_for(lambda: running_ids(b) == set())
    wait_for(lambda: all(group_gone(p) for p in pgids))  # ... and stopped: all or nothing
    assert rec.statuses == []
    monkeypatch.undo()
    # the same task ids again once the backend has seen every stopped wrapper end (its monitor, a moment after the
    # processes are gone)
    wait_for(lambda: not any(f"f{i}" in b._tasks for i in range(8)))
    assert launch(b, *(spec(f"f{i}", "true", f"local-{i % 2}") for i in range(8))).outcome == LaunchOutcome.OK


def test_a_spawner_skips_the_rest_of_a_group_after_a_failure_and_starts_the_other_groups(tmp_path: Path) -> None:
    pool = SpawnerPool(1, inherited(os.environ))
    fds: list[int] = []
    try:
        tasks: list[dict[str, object]] = [
            {"sandbox": str(tmp_path / name), "command": command, "env": {}, "files": {}, "group": group}
            for name, command, group in (("a0", "true", 0), ("a1", "true\0", 0), ("a2", "true", 0),
                                         ("b0", "true", 1), ("b1", "true", 1))]
        out = pool.spawn_many(tasks, per_spawner=10)
        fds += [r.pidfd for r in out if isinstance(r, Started) and r.pidfd is not None]
        assert [type(r).__name__ for r in out] == ["Started", "NotStarted", "NoneType", "Started", "Started"]
        assert isinstance(out[1], NotStarted) and out[1].permanent
        # no group: the first failure ends the request (the spawner's old contract, spawn())
        plain = pool.spawn([{k: v for k, v in t.items() if k != "group"} | {"sandbox": f"{t['sandbox']}-2"}
                            for t in tasks])
        fds += [r.pidfd for r in plain if isinstance(r, Started) and r.pidfd is not None]
        assert [type(r).__name__ for r in plain] == ["Started", "NotStarted"]
    finally:
        pool.close()
        for fd in fds:
            os.close(fd)


def test_a_launchs_statuses_are_handed_over_as_one_batch(tmp_path: Path) -> None:
    from peloton.hostmgr.local.backend import make_local_hosts
    from tests.unit.test_local_backend import HOST_RES, TEST_TASK_USER, kill_leftovers

    b = LocalBackend(tmp_path, make_local_hosts(1, HOST_RES), default_user=TEST_TASK_USER)
    one, batches = Recorder(), list[Sequence[TaskStatus]]()
    b.start(one, None, batches.append)
    try:
        (r,) = b.launch([GangLaunch("g/0", 1, tuple(spec(f"s{i}", "sleep 30") for i in range(4)))])
        assert r.outcome == LaunchOutcome.OK
        assert [[(s.task_id, s.state) for s in batch] for batch in batches] == [
            [(f"s{i}", TaskState.RUNNING) for i in range(4)]]
        assert one.statuses == []
        b.kill([f"s{i}" for i in range(4)], grace_s=5.0)
        wait_for(lambda: sum(map(len, batches)) + len(one.statuses) == 8)  # the ends: by poll, batched
        ends: list[TaskStatus] = [s for batch in batches[1:] for s in batch] + one.statuses
        assert sorted(s.task_id for s in ends) == [f"s{i}" for i in range(4)]
        assert all(s.state == TaskState.KILLED for s in ends)
    finally:
        b.stop()
        kill_leftovers(tmp_path)


# ------------------------------------------------------------------------------------------------ other users


@pytest.mark.skipif(not AS_ROOT, reason="switching a task's user needs root")
@pytest.mark.parametrize("setpriv", [True, False])
def test_a_task_as_another_user_has_only_that_users_ids_groups_and_no_capabilities(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, setpriv: bool) -> None:
    """spawn_as by posix_spawn through setpriv, and by subprocess's fork where there is no setpriv: the same."""
    if not setpriv:
        monkeypatch.setattr(spawner, "SETPRIV", None)
    elif spawner.SETPRIV is None:
        pytest.skip("no setpriv on this machine")
    who = pwd.getpwnam("daemon")
    os.chmod(tmp_path, 0o700)  # the user needs no permission above its sandbox: it is entered as root
    env = {"PATH": "/usr/bin:/bin"}
    groups = sorted(os.getgrouplist(who.pw_name, who.pw_gid))
    cwd = os.getcwd()
    for name, command in (("direct", "cat /proc/self/status"), ("shell", "cat /proc/self/status; pwd")):
        assert (spawner.argv_of(command, env) is None) == (name == "shell")
        sandbox = str(tmp_path / name)
        spawner.prepare(sandbox, {}, who)
        pid = spawner.spawn_as(sandbox, command, env, who)
        assert os.getcwd() == cwd  # the spawner's own working directory is as it was
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
        text = (Path(sandbox) / "stdout").read_text()
        lines = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
        assert lines["Uid"].split() == [str(who.pw_uid)] * 4, (name, text, (Path(sandbox) / "stderr").read_text())
        assert lines["Gid"].split() == [str(who.pw_gid)] * 4
        assert sorted(int(g) for g in lines["Groups"].split()) == groups
        assert int(lines["CapEff"], 16) == 0 and int(lines["CapPrm"], 16) == 0
        ended = wrapper.read_exit(Path(sandbox))
        assert ended is not None and ended.exit_code == 0
        if name == "shell":
            assert text.splitlines()[-1] == f"{sandbox}/work"


# ------------------------------------------------------------------------ the wrapper's own writes, the cgroup moves


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o002])
def test_the_wrapper_writes_pids_and_exit_owner_only_without_a_subshell_and_the_command_keeps_its_umask(
        tmp_path: Path, umask: int) -> None:
    for gate, subreaper, direct in ((False, False, True), (True, False, False), (False, True, True)):
        text = spawner.wrapper_of(gate, subreaper, direct, umask)
        assert spawner.UMASK_MARK not in text and f"umask {umask:04o}" in text
        # dash forks for a `( ... )` subshell: no line of the wrapper opens one
        assert not any(line.lstrip().startswith("(") or "&& (" in line or "; (" in line
                       for line in text.splitlines())
    pool = SpawnerPool(1, inherited(os.environ))
    sandbox = tmp_path / "t"
    old = os.umask(umask)  # the spawner (started at the first spawn) inherits it, as it inherits the daemon's
    try:
        (r,) = pool.spawn([{"sandbox": str(sandbox), "command": "umask; touch made", "env": {}, "files": {}}])
    finally:
        os.umask(old)
    try:
        assert isinstance(r, Started) and r.pidfd is not None
        wait_for(lambda: wrapper.read_exit(sandbox) is not None)
        os.close(r.pidfd)
    finally:
        pool.close()
    assert (sandbox / "stdout").read_text().strip() == f"{umask:04o}"  # the command's own umask ...
    assert (sandbox / "work" / "made").stat().st_mode & 0o777 == 0o666 & ~umask
    for name in ("pids", "exit"):  # ... and the wrapper's files owner-only whatever it is
        assert (sandbox / name).stat().st_mode & 0o777 == 0o600, name
    assert wrapper.read_pid(sandbox) == r.pid
    rec = wrapper.read_exit(sandbox)
    assert rec is not None and rec.exit_code == 0


def test_current_umask_reads_the_umask_without_changing_it() -> None:
    old = os.umask(0o037)
    try:
        assert spawner.current_umask() == 0o037
        assert os.umask(0o037) == 0o037  # unchanged by the reading
    finally:
        os.umask(old)


_GATE_DATA_DIR = Path("/nonexistent/peloton-launch-gate-probe")  # only names the test's cgroup subtree
_CGROUPS, _WHY_NOT = cgroups.probe(_GATE_DATA_DIR)
needs_cgroups = pytest.mark.skipif(_CGROUPS is None, reason=f"cgroup v2 cannot be used here: {_WHY_NOT}")


def _cgroup_of(pid: int) -> str:
    return next(line[3:] for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines() if line.startswith("0::"))


@needs_cgroups
@pytest.mark.parametrize("ending", ["go", "close", "nothing"])
def test_a_gated_wrapper_is_moved_and_let_go_only_when_the_daemon_says_go_or_goes(tmp_path: Path, ending: str) -> None:
    """spawn_many's order (spawn.py): every spawner of a launch replies first; only then are the wrappers moved into
    their cgroups (a move stalls every fork on the machine), on `go`, or when the daemon's socket closes, or, with
    neither, after spawner.GO_WAIT_S."""
    from peloton.hostmgr.local.spawn import _Spawner

    assert _CGROUPS is not None
    os.makedirs(_CGROUPS.subtree, 0o755, exist_ok=True)  # (the last test's cleanup removed it)
    cg = _CGROUPS.new_path("gate-test")
    sp = _Spawner(inherited(os.environ))
    sandbox = tmp_path / "t"
    try:
        sent = time.monotonic()
        sp.send([{"sandbox": str(sandbox), "command": "touch ran", "env": {}, "files": {}, "cgroup": cg}])
        (r,) = sp.receive()
        assert isinstance(r, Started) and r.pidfd is not None
        wait_for(lambda: wrapper.read_pid(sandbox) == r.pid)  # the wrapper is past its first lines ...
        waiting = not (sandbox / "work" / "ran").exists()  # ... and waits at its gate,
        try:
            outside = _cgroup_of(r.pid) != cg[len(_CGROUPS.mount):]  # outside its cgroup
        except FileNotFoundError:  # over already
            outside = False
        # unless this test was held up past GO_WAIT_S (a loaded machine): then the spawner let it go, as it should
        assert (waiting and outside) or time.monotonic() - sent >= spawner.GO_WAIT_S, (waiting, outside)
        if ending == "go":
            sp.let_go()
        elif ending == "close":
            sp.close()
        wait_for(lambda: (sandbox / "work" / "ran").exists())
        wait_for(lambda: wrapper.read_exit(sandbox) is not None)
        rec = wrapper.read_exit(sandbox)
        assert rec is not None and rec.exit_code == 0  # moved, then let go: not 125
        os.close(r.pidfd)
    finally:
        sp.close()
        cgroups.kill_and_remove_subtree(_GATE_DATA_DIR)


def _status(pid: int) -> dict[str, str]:
    text = Path(f"/proc/{pid}/status").read_text()
    return {k: v.strip() for k, v in (line.split(":", 1) for line in text.splitlines() if ":" in line)}


@needs_cgroups
@pytest.mark.skipif(not AS_ROOT, reason="switching a task's user needs root")
def test_a_gated_task_of_another_user_is_started_by_that_users_launcher_with_no_program_more(tmp_path: Path) -> None:
    """The spawner forks a launcher per user (spawner.launch_all): the wrapper is the user's shell from the start
    (no setpriv before it), a child of a process of the user's ids that is not dumpable (/proc shows it as root's),
    kept for the user's next task; the task has the user's ids and groups and no capabilities."""
    from peloton.hostmgr.local.spawn import _Spawner

    assert _CGROUPS is not None
    os.makedirs(_CGROUPS.subtree, 0o755, exist_ok=True)
    who = pwd.getpwnam("daemon")
    groups = sorted(os.getgrouplist(who.pw_name, who.pw_gid))
    os.chmod(tmp_path, 0o700)  # the user needs no permission above its sandbox
    sp = _Spawner(inherited(os.environ))
    launchers = []
    try:
        for i in range(2):
            sandbox = tmp_path / f"t{i}"
            sp.send([{"sandbox": str(sandbox), "command": "cat /proc/self/status", "env": {"PATH": "/usr/bin:/bin"},
                      "files": {}, "cgroup": _CGROUPS.new_path(f"user-{i}"), "user": "daemon"}])
            (r,) = sp.receive()
            assert isinstance(r, Started) and r.pidfd is not None
            assert _settled_cmdline(r.pid)[0] == spawner.SHELL  # at its gate: the shell, no setpriv before it
            launcher = _ppid(r.pid)
            launchers.append(launcher)
            assert _ppid(launcher) == sp.proc.pid
            ids = _status(launcher)
            assert ids["Uid"].split() == [str(who.pw_uid)] * 4 and ids["Gid"].split() == [str(who.pw_gid)] * 4
            assert sorted(int(g) for g in ids["Groups"].split()) == groups
            assert int(ids["CapEff"], 16) == 0
            assert os.stat(f"/proc/{launcher}/environ").st_uid == 0  # not dumpable: the user cannot ptrace it
            sp.let_go()
            wait_for(lambda sandbox=sandbox: wrapper.read_exit(sandbox) is not None)  # type: ignore[misc]
            rec = wrapper.read_exit(sandbox)
            assert rec is not None and rec.exit_code == 0, (sandbox / "stderr").read_text()
            task = _status_text((sandbox / "stdout").read_text())
            assert task["Uid"].split() == [str(who.pw_uid)] * 4 and task["Gid"].split() == [str(who.pw_gid)] * 4
            assert sorted(int(g) for g in task["Groups"].split()) == groups
            assert int(task["CapEff"], 16) == 0 and int(task["CapPrm"], 16) == 0
            os.close(r.pidfd)
        assert launchers[0] == launchers[1]  # kept for the user's next task
    finally:
        sp.close()
        cgroups.kill_and_remove_subtree(_GATE_DATA_DIR)
    wait_for(lambda: not Path(f"/proc/{launchers[0]}").exists())  # it ends with its spawner


@needs_cgroups
@pytest.mark.skipif(not AS_ROOT, reason="switching a task's user needs root")
def test_a_users_members_go_to_its_launcher_together_with_the_spawners_rule_for_failures(tmp_path: Path) -> None:
    """A request's consecutive members of one user go to its launcher in one request, which keeps the spawner's
    rule: a member that cannot start makes the rest of its gang skipped (another gang's members start), and a
    failed task of no gang ends the request (no entry after it). A NUL byte in the environment fails posix_spawn."""
    from peloton.hostmgr.local.spawn import _Spawner

    assert _CGROUPS is not None
    os.makedirs(_CGROUPS.subtree, 0o755, exist_ok=True)
    os.chmod(tmp_path, 0o700)

    def task(name: str, group: int | None, env: dict[str, str] | None = None) -> dict[str, object]:
        t: dict[str, object] = {"sandbox": str(tmp_path / name), "command": "true", "files": {}, "user": "daemon",
                                "env": {"PATH": "/usr/bin:/bin", **(env or {})}, "cgroup": _CGROUPS.new_path(name)}
        return t if group is None else {**t, "group": group}

    sp = _Spawner(inherited(os.environ))
    try:
        sp.send([task("a0", 0), task("a1", 0, {"BAD": "x\0y"}), task("a2", 0), task("b0", 1), task("b1", 1)])
        a0, a1, a2, b0, b1 = sp.receive()
        assert isinstance(a0, Started) and isinstance(b0, Started) and isinstance(b1, Started)
        assert isinstance(a1, NotStarted) and a1.permanent and "null" in a1.message
        assert a2 is None  # skipped: the rest of the failed member's gang
        assert {_ppid(r.pid) for r in (a0, b0, b1)} == {_ppid(a0.pid)} != {sp.proc.pid}  # the one launcher
        assert not (tmp_path / "a2").exists() or not (tmp_path / "a2" / "pids").exists()  # a2 never ran
        sp.let_go()
        sp.send([task("c0", None), task("c1", None, {"BAD": "x\0y"}), task("c2", None)])
        out = sp.receive()
        assert len(out) == 2 and isinstance(out[0], Started) and isinstance(out[1], NotStarted)  # c2: no entry
        sp.let_go()
        for r in (a0, b0, b1, out[0]):
            assert isinstance(r, Started) and r.pidfd is not None
            os.close(r.pidfd)
        for name in ("a0", "b0", "b1", "c0"):
            wait_for(lambda name=name: wrapper.read_exit(tmp_path / name) is not None)  # type: ignore[misc]
        assert not (tmp_path / "c2" / "pids").exists()
    finally:
        sp.close()
        cgroups.kill_and_remove_subtree(_GATE_DATA_DIR)


@needs_cgroups
@pytest.mark.skipif(not AS_ROOT, reason="switching a task's user needs root")
def test_a_member_started_by_a_launcher_holds_no_descriptor_of_its_request(tmp_path: Path) -> None:
    """The launcher receives every member's gate, logs and sandbox of a request at once; none of them may reach a
    member (CPython 3.11's socket.recv_fds ignores MSG_CMSG_CLOEXEC: they did, so a member could read another's
    `go` or write into its logs). Each member's command has its stdin, stdout and stderr, and nothing more."""
    from peloton.hostmgr.local.spawn import _Spawner

    assert _CGROUPS is not None
    os.makedirs(_CGROUPS.subtree, 0o755, exist_ok=True)
    os.chmod(tmp_path, 0o700)
    sp = _Spawner(inherited(os.environ))
    try:
        names = [f"m{i}" for i in range(3)]
        # (ls opens /proc/self/fd itself: 3, the lowest free)
        sp.send([{"sandbox": str(tmp_path / n), "command": "ls /proc/self/fd", "files": {}, "user": "daemon",
                  "env": {"PATH": "/usr/bin:/bin"}, "cgroup": _CGROUPS.new_path(n), "group": 0} for n in names])
        started = sp.receive()
        assert all(isinstance(r, Started) for r in started)
        assert len({_ppid(r.pid) for r in started if isinstance(r, Started)}) == 1  # one launcher took them all
        sp.let_go()
        for r in started:
            assert isinstance(r, Started) and r.pidfd is not None
            os.close(r.pidfd)
        for n in names:
            wait_for(lambda n=n: wrapper.read_exit(tmp_path / n) is not None)  # type: ignore[misc]
            assert (tmp_path / n / "stdout").read_text().split() == ["0", "1", "2", "3"], n
    finally:
        sp.close()
        cgroups.kill_and_remove_subtree(_GATE_DATA_DIR)


def _status_text(text: str) -> dict[str, str]:
    return {k: v.strip() for k, v in (line.split(":", 1) for line in text.splitlines() if ":" in line)}


_LAUNCHER_FAULTS = r"""
import json, os, signal, sys, time
from peloton.hostmgr.local import spawner
spawner.LAUNCHER_WAIT_S = 0.5
spawner._LAUNCHERS_ON.append(True)
base, cgroups_at = sys.argv[1], sys.argv[2]
out = []

def start(name):  # as the spawner's loop starts a request of one task; then no `go`: it ends at its gate
    sandbox = os.path.join(base, name)
    task = {"sandbox": sandbox, "command": "sleep 30", "env": {"PATH": "/usr/bin:/bin"}, "files": {},
            "user": "daemon", "cgroup": os.path.join(cgroups_at, name)}
    (entry,), fds = spawner.start_all([task], {})
    for g in spawner._gated:
        os.close(g.gate)
        os.close(g.pidfd)
    spawner._gated.clear()
    for fd in fds:
        os.close(fd)
    if "error" in entry:
        return {"error": entry["error"]}
    pid = entry["pid"]
    parent = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
    return {"pid": pid, "parent": parent, "by_setpriv": parent == os.getpid()}

first = start("a")
os.kill(first["parent"], signal.SIGKILL)  # the user's processes may kill their launcher (same uid) ...
time.sleep(0.1)
second = start("b")  # ... a launcher found dead is replaced, the task started all the same
os.kill(second["parent"], signal.SIGSTOP)  # ... or stop it
third = start("c")  # no answer: killed, the task not started, and setpriv for a while
fourth = start("d")
stopped_gone = not os.path.exists(f"/proc/{second['parent']}") or     open(f"/proc/{second['parent']}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"
spawner._launcher_backoff.clear()
fifth = start("e")
spawner.LAUNCHER_IDLE_S = 0.2
time.sleep(0.3)
spawner._close_idle_launchers()  # what the spawner's loop does between requests
time.sleep(0.1)
idle_gone = not os.path.exists(f"/proc/{fifth['parent']}") or \
    open(f"/proc/{fifth['parent']}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"
sixth = start("f")
print(json.dumps({"first": first, "second": second, "third": third, "fourth": fourth, "killed": stopped_gone,
                  "fifth": fifth, "idle_gone": idle_gone, "sixth": sixth}))
"""


@needs_cgroups
@pytest.mark.skipif(not AS_ROOT, reason="switching a task's user needs root")
def test_a_users_launcher_killed_or_stopped_by_the_users_processes_is_replaced_or_given_up(tmp_path: Path) -> None:
    """A launcher runs as its user, whose processes may signal it. Killed while idle: found dead at the next task
    and replaced (the task starts). Stopped: the request gets no answer within LAUNCHER_WAIT_S, the launcher is
    killed, the task is reported not started (its gate closes: nothing of it runs), and the user's next tasks go
    through setpriv. Idle LAUNCHER_IDLE_S: closed, and the next task gets a new one. A real spawner module in its
    own one-thread process (the launcher is forked)."""
    import json
    import subprocess

    assert _CGROUPS is not None
    os.makedirs(_CGROUPS.subtree, 0o755, exist_ok=True)
    os.chmod(tmp_path, 0o700)
    try:
        done = subprocess.run([sys.executable, "-c", _LAUNCHER_FAULTS, str(tmp_path), _CGROUPS.subtree],
                              capture_output=True, text=True, timeout=60, cwd=Path(__file__).resolve().parents[2])
    finally:
        cgroups.kill_and_remove_subtree(_GATE_DATA_DIR)
    assert done.returncode == 0, done.stderr
    r = json.loads(done.stdout.splitlines()[-1])
    assert not r["first"]["by_setpriv"] and not r["second"]["by_setpriv"]
    assert r["first"]["parent"] != r["second"]["parent"]  # a new launcher
    assert "did not answer within 0.5 s" in r["third"]["error"] and "the task did not run" in r["third"]["error"]
    assert r["fourth"]["by_setpriv"]
    assert r["killed"]
    assert not r["fifth"]["by_setpriv"] and r["idle_gone"]  # after the backoff a launcher again; idle, closed
    assert not r["sixth"]["by_setpriv"] and r["sixth"]["parent"] != r["fifth"]["parent"]
    for name in ("a", "b", "d", "e", "f"):  # each started, and each ended at its gate without running its command
        wait_for(lambda name=name: wrapper.read_exit(tmp_path / name) is not None  # type: ignore[misc]
                 or (tmp_path / name / "stderr").read_text() != "")
        assert "could not be put into its cgroup" in (tmp_path / name / "stderr").read_text()


# ------------------------------------------------------------------------------------------------ warm wrappers


def _settled_cmdline(pid: int) -> list[str]:
    """_cmdline, once it is there: for a moment after posix_spawn returns it is empty (the kernel releases the
    parent of a vfork before the new program's arguments are set up; wrapper.is_wrapper looks again too)."""
    wait_for(lambda: bool(_cmdline(pid)))
    return _cmdline(pid)


def _ended(pid: int) -> bool:
    try:
        return _status(pid)["State"].startswith("Z")
    except FileNotFoundError:
        return True


def _one_idle_warm_wrapper(sp: Any, sandboxes: Path) -> int:
    """The pid of the warm wrapper of user `daemon` that `sp` (warm=1) starts after a first member of that user."""
    sp.send(_gang(sandboxes, ["first"], ["true"], "daemon"))
    (r,) = sp.receive()
    assert isinstance(r, Started) and r.pidfd is not None
    os.close(r.pidfd)
    sp.let_go()
    wait_for(lambda: len(_warm_below(sp.proc.pid)) == 1)
    (idle,) = _warm_below(sp.proc.pid)
    return int(idle)


def _as_the_backend_makes_it(sandboxes: Path) -> None:
    """The sandboxes directory and the one above it (the data directory, where another user's warm wrappers find
    spawner.WARM_SHELL) searchable by anyone, as the local backend makes them when tasks run as other users."""
    os.chmod(sandboxes, 0o711)
    os.chmod(sandboxes.parent, 0o711)


def _warm_below(ancestor: int) -> set[int]:
    """The warm wrappers (spawner.WARM_MARK, not handed a task yet) among the descendants of `ancestor` (a
    spawner's own, or its launchers')."""
    out = set()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            args = _cmdline(int(d.name))
            parent = _ppid(int(d.name))
            if args[3:4] == [spawner.WARM_MARK] and ancestor in (parent, _ppid(parent)):
                out.add(int(d.name))
        except (OSError, IndexError, ValueError):
            continue
    return out


def _gang(base: Path, names: Sequence[str], commands: Sequence[str], user: str | None,
          env: dict[str, str] | None = None) -> list[dict[str, object]]:
    assert _CGROUPS is not None
    return [{"sandbox": str(base / n), "command": c, "env": {"PATH": "/usr/bin:/bin", "ODD": "it's \"$x\"\nz",
                                                              **(env or {})},
             "files": {"f.txt": "x"}, "cgroup": _CGROUPS.new_path(n), "group": 0, **({"user": user} if user else {})}
            for n, c in zip(names, commands, strict=True)]


# a program run directly (env, sh), one under the wrapper's `sh -c` (shell syntax), and one to look at while it runs
_SHOW = ["env", "sh -c 'umask; id; pwd; echo \"$0\" \"$#\"; ls /proc/$$/fd; cat ../f.txt'",
         "printf '%s|' \"$ODD\" \"$PWD\" \"$0\"; umask; exit 3", "sleep 30"]


@needs_cgroups
@pytest.mark.parametrize("user", [None, "daemon"])
def test_a_member_handed_a_warm_wrapper_runs_as_it_would_have_cold(tmp_path: Path, user: str | None) -> None:
    """After a launch, each spawner starts as many wrappers ahead of the next (per user) as that launch asked of it:
    shells waiting at their gate with nothing of any task. The next launch's members are handed them (no process
    started on its way); on `go` each becomes its member's own wrapper, from an exec on indistinguishable from a
    cold start: the same environment (quotes and newlines kept), ids, umask, working directory, descriptors,
    files, owner-only logs, `pids` and `exit`, and a command line naming the sandbox (is_wrapper)."""
    if user and not AS_ROOT:
        pytest.skip("switching a task's user needs root")
    from peloton.hostmgr.local.spawn import _Spawner

    assert _CGROUPS is not None
    os.makedirs(_CGROUPS.subtree, 0o755, exist_ok=True)
    _as_the_backend_makes_it(tmp_path)
    sp = _Spawner(inherited(os.environ), warm=4)
    try:
        runs: list[list[Started]] = []
        for attempt in ("cold", "warm"):
            names = [f"{attempt}{i}" for i in range(4)]
            if attempt == "warm":
                wait_for(lambda: len(_warm_below(sp.proc.pid)) == 4)  # refilled after the first launch
                waiting = _warm_below(sp.proc.pid)
            tasks = _gang(tmp_path, names, _SHOW, user)
            sp.send(tasks)
            started = sp.receive()
            assert all(isinstance(r, Started) and r.pidfd is not None for r in started)
            run = [r for r in started if isinstance(r, Started)]
            runs.append(run)
            marks = {_settled_cmdline(r.pid)[3] for r in run}
            if attempt == "warm":
                assert {r.pid for r in run} == waiting and marks == {spawner.WARM_MARK}
                assert not wrapper.is_wrapper(run[0].pid, tmp_path / names[0], attempts=2)  # not its task's yet
                assert not (tmp_path / names[0] / "stdout").exists()  # nothing of the task has run
            else:
                assert marks == {"peloton-task"}
            sp.let_go()
            for n in names[:3]:
                wait_for(lambda n=n: wrapper.read_exit(tmp_path / n) is not None)  # type: ignore[misc]
            sleeper, sleeping = run[3], tmp_path / names[3]
            wait_for(lambda p=sleeper.pid, at=sleeping: wrapper.is_wrapper(p, at, attempts=1))  # type: ignore[misc]
            assert wrapper.read_pid(sleeping) == sleeper.pid
            assert _cgroup_of(sleeper.pid) == str(tasks[3]["cgroup"])[len(_CGROUPS.mount):]  # moved in
            os.killpg(sleeper.pid, signal.SIGKILL)
            for r in run:
                assert r.pidfd is not None
                os.close(r.pidfd)
        outputs = []
        for attempt in ("cold", "warm"):
            names = [f"{attempt}{i}" for i in range(4)]
            text = [(tmp_path / n / "stdout").read_text().replace(n, "<name>") for n in names[:3]]
            for i, n in enumerate(names[:3]):
                rec = wrapper.read_exit(tmp_path / n)
                assert rec is not None and rec.exit_code == (3 if i == 2 else 0), (tmp_path / n / "stderr").read_text()
                assert (tmp_path / n / "stderr").read_text() == ""
                for log in ("stdout", "stderr", "pids", "exit"):
                    st = (tmp_path / n / log).stat()
                    assert st.st_mode & 0o777 == 0o600
                    assert st.st_uid == (pwd.getpwnam(user).pw_uid if user else os.geteuid())
            outputs.append((sorted(text[0].splitlines()), text[1], text[2]))
        assert outputs[0] == outputs[1]
        assert outputs[1][2] == f"it's \"$x\"\nz|{tmp_path}/<name>/work|/bin/sh|{spawner.current_umask():04o}\n"
        assert "ODD=it's \"$x\"" in outputs[1][0] and "z" in outputs[1][0]
        lines = outputs[1][1].splitlines()
        assert lines[0] == f"{spawner.current_umask():04o}" and lines[3:] == ["sh 0", "0", "1", "2", "x"]
    finally:
        sp.close()
        cgroups.kill_and_remove_subtree(_GATE_DATA_DIR)


@needs_cgroups
def test_a_member_that_does_not_fit_a_warm_wrapper_starts_cold_and_one_left_without_go_runs_nothing(
        tmp_path: Path) -> None:
    """A member whose environment the shell cannot export (a name with a dot), or whose script would not fit its
    gate's pipe, starts cold beside the warm pool; a warm wrapper killed while it waited is passed over; and one
    handed a member whose spawner dies before `go` ends at its gate (125) without having run anything of it."""
    from peloton.hostmgr.local.spawn import _Spawner

    assert _CGROUPS is not None
    os.makedirs(_CGROUPS.subtree, 0o755, exist_ok=True)
    sp = _Spawner(inherited(os.environ), warm=2)
    pidfds: list[int] = []

    def start(name: str, env: dict[str, str] | None = None, go: bool = True) -> tuple[Started, str]:
        sp.send(_gang(tmp_path, [name], ["true"], None, env))
        (r,) = sp.receive()
        assert isinstance(r, Started) and r.pidfd is not None, r
        pidfds.append(r.pidfd)
        mark = _settled_cmdline(r.pid)[3]
        if go:
            sp.let_go()
            wait_for(lambda: wrapper.read_exit(tmp_path / name) is not None)
        return r, mark

    try:
        start("first")
        wait_for(lambda: len(_warm_below(sp.proc.pid)) == 1)  # it asked for one
        assert start("dotted", {"A.B": "1"})[1] == "peloton-task"
        assert start("big", {"BIG": "x" * 70_000})[1] == "peloton-task"  # more than a pipe holds
        (idle,) = _warm_below(sp.proc.pid)
        os.kill(idle, signal.SIGKILL)  # as another of the user's processes may
        wait_for(lambda: idle not in _warm_below(sp.proc.pid))
        r, mark = start("after-kill")
        assert mark == "peloton-task" and r.pid != idle
        wait_for(lambda: len(_warm_below(sp.proc.pid)) == 1)
        (handed,) = _warm_below(sp.proc.pid)
        r, mark = start("no-go", go=False)
        assert (r.pid, mark) == (handed, spawner.WARM_MARK)
        os.kill(sp.proc.pid, signal.SIGKILL)  # the spawner dies before `go`: the gate closes
        sp.proc.wait(10)
        wait_for(lambda: _ended(handed))
        assert sorted(p.name for p in (tmp_path / "no-go").iterdir()) == ["f.txt", "work"]  # nothing ran there
        for name in ("first", "dotted", "big", "after-kill"):
            rec = wrapper.read_exit(tmp_path / name)
            assert rec is not None and rec.exit_code == 0, name
    finally:
        for fd in pidfds:
            os.close(fd)
        sp.close()
        cgroups.kill_and_remove_subtree(_GATE_DATA_DIR)


_WARM_POOL = r"""
import json, os, sys, time
from peloton.hostmgr.local import spawner
spawner._WARM_MAX.append(3)
base = sys.argv[1]
r = spawner.Ready(os.path.join(base, "t"), "true", {}, None, False, "cg", os.pipe2(os.O_CLOEXEC))
key = spawner.warm_key(r, None)
spawner.want_warm({key: 5})  # a request of 5 members for the pool: it keeps 3
while (missing := spawner.warm_missing()) is not None:
    spawner.refill_warm(missing)
pool = list(spawner._pools[key].wrappers)
kept = [w.pid for w in pool]
def args_of(pid):  # (empty for a moment after posix_spawn returns: the exec is still setting the process up)
    for _ in range(1000):
        args = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
        if len(args) > 1:
            return args
        time.sleep(0.001)
    return args
args = [args_of(w.pid)[3].decode() for w in pool]
cwds = {os.readlink(f"/proc/{w.pid}/cwd") for w in pool}
spawner.drop_idle_warm(time.monotonic() + spawner.WARM_IDLE_S - 1)  # not idle long enough
still = len(spawner._pools[key].wrappers)
spawner.drop_idle_warm(time.monotonic() + spawner.WARM_IDLE_S)
keys = []
for i in range(6):  # six users' (here: directories') pools of 3: all the pools together keep at most 4 x 3
    os.mkdir(os.path.join(base, f"d{i}"))
    keys.append(spawner.warm_key(spawner.Ready(os.path.join(base, f"d{i}", "t"), "true", {}, None, False, "cg",
                                               os.pipe2(os.O_CLOEXEC)), None))
    spawner.want_warm({keys[-1]: 3})
    if i == 2:
        spawner.want_warm({keys[0]: 1})  # used again: the least recently used is d1 now
gone = key not in spawner._pools
pools = [os.path.basename(k[1]) for k in spawner._pools]
wanted = sum(p.want for p in spawner._pools.values())
many = {}
for i in range(6):  # one request with members of six more users: the bound holds within a request too
    os.mkdir(os.path.join(base, f"e{i}"))
    many[spawner.warm_key(spawner.Ready(os.path.join(base, f"e{i}", "t"), "true", {}, None, False, "cg",
                                        os.pipe2(os.O_CLOEXEC)), None)] = 3
spawner.want_warm(many)
print(json.dumps({"key": [key[0], key[1]], "gone": gone, "kept": kept, "args": args,
                  "cwds": sorted(cwds), "still": still, "after": 0 if gone else len(spawner._pools[key].wrappers),
                  "pools": pools, "wanted": wanted,
                  "one_request": [os.path.basename(k[1]) for k in spawner._pools],
                  "one_request_wanted": sum(p.want for p in spawner._pools.values())}))
"""


def test_a_warm_pool_keeps_what_a_request_asked_up_to_its_bound_and_goes_when_idle(tmp_path: Path) -> None:
    """The pool of a user (here the spawner's own) and sandboxes directory keeps as many warm wrappers as a request
    had members for it, up to the spawner's bound (--warm-wrappers), waiting in that directory; a pool whose user
    had no member for WARM_IDLE_S is dropped, and its wrappers end; and all the pools of a spawner together keep at
    most WARM_POOLS_MAX times the bound (each tenant's uid has a pool), the least recently used dropped beyond."""
    import subprocess

    out = subprocess.run([PY, "-c", _WARM_POOL, str(tmp_path)], capture_output=True, text=True, timeout=60,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["key"] == [None, str(tmp_path)] and got["gone"]
    assert len(got["kept"]) == 3 and got["args"] == [spawner.WARM_MARK] * 3 and got["cwds"] == [str(tmp_path)]
    assert (got["still"], got["after"]) == (3, 0)
    assert got["pools"] == ["d0", "d3", "d4", "d5"] and got["wanted"] == 12  # the least recently used went
    # one request of six users' members (3 each): the pools it used last are kept, within the bound
    assert got["one_request"] == ["e2", "e3", "e4", "e5"] and got["one_request_wanted"] == 12
    for pid in got["kept"]:  # their gates closed with the pool (and with the process): they ended
        wait_for(lambda pid=pid: _ended(pid))  # type: ignore[misc]


@needs_cgroups
def test_a_member_started_in_a_warm_wrapper_is_adopted_by_a_restarted_backend(
        tmp_path: Path, make_backend: Callable[..., tuple[LocalBackend, Recorder]]) -> None:  # noqa: F811
    """The local backend hands its second launch's member a warm wrapper; once let go, that wrapper is the member's
    own (its command line names the sandbox), so a backend restarted over the same data dir adopts the member, and
    stops it, as it does a cold one. The warm wrappers end with the backend's spawners."""
    from prometheus_client import REGISTRY

    def starts(how: str) -> float:
        return REGISTRY.get_sample_value("peloton_local_member_starts_total", {"how": how}) or 0.0

    before = starts("warm"), starts("cold")
    a, _ = make_backend(n=1, grace=1.0)
    assert a._cgroups is not None
    launch(a, spec("first", "true"))
    spawners = [sp.proc.pid for sp in a._spawners._all]
    wait_for(lambda: bool(set().union(*(_warm_below(p) for p in spawners))))
    waiting = set().union(*(_warm_below(p) for p in spawners))
    r = launch(a, spec("long", "sleep 30"))
    assert r.outcome == LaunchOutcome.OK, r
    pgid = wrapper_pgid(a, "long")
    assert pgid in waiting  # handed a warm wrapper
    assert (starts("warm") - before[0], starts("cold") - before[1]) == (1, 1)  # and counted as such
    wait_for(lambda: wrapper.is_wrapper(pgid, tmp_path / "sandboxes" / "long", attempts=1))
    a.stop()  # the daemon "dies": nothing is killed
    wait_for(lambda: all(_ended(w) for w in waiting - {pgid}))  # the idle ones ended with their spawners
    b, rec_b = make_backend(n=1, grace=1.0)
    assert running_ids(b) == {"long"}
    b.kill(["long"])
    assert rec_b.wait_terminal("long").state == TaskState.KILLED
    wait_for(lambda: group_gone(pgid))


@needs_cgroups
@pytest.mark.skipif(not AS_ROOT, reason="switching a task's user needs root")
def test_a_user_who_may_not_search_the_sandboxes_directory_is_handed_no_warm_wrapper(tmp_path: Path) -> None:
    """A warm wrapper enters its sandbox by name from the sandboxes directory, as its user. Where the mode no longer
    lets the user search that directory (0700 here; the local backend makes it 0711 when tasks run as others), the
    user's members start cold, and run, though warm wrappers of the user wait there; none is started anew (its
    launcher cannot enter the directory)."""
    from peloton.hostmgr.local.spawn import _Spawner

    assert _CGROUPS is not None
    os.makedirs(_CGROUPS.subtree, 0o755, exist_ok=True)
    _as_the_backend_makes_it(tmp_path)
    sp = _Spawner(inherited(os.environ), warm=2)
    waiting: set[int] = set()
    try:
        for attempt in range(3):
            names = [f"m{attempt}-{i}" for i in range(2)]
            sp.send(_gang(tmp_path, names, ["true", "true"], "daemon"))
            started = sp.receive()
            assert all(isinstance(r, Started) for r in started)
            assert {_settled_cmdline(r.pid)[3] for r in started if isinstance(r, Started)} == {"peloton-task"}
            sp.let_go()
            for r, n in zip(started, names, strict=True):
                assert isinstance(r, Started) and r.pidfd is not None
                os.close(r.pidfd)
                wait_for(lambda n=n: wrapper.read_exit(tmp_path / n) is not None)  # type: ignore[misc]
                rec = wrapper.read_exit(tmp_path / n)
                assert rec is not None and rec.exit_code == 0, (attempt, (tmp_path / n / "stderr").read_text())
            if attempt == 0:
                wait_for(lambda: len(_warm_below(sp.proc.pid)) == 2)
                waiting = _warm_below(sp.proc.pid)
                os.chmod(tmp_path, 0o700)
            else:
                time.sleep(0.2)  # (time enough for a refill, were there one to make)
                assert _warm_below(sp.proc.pid) == waiting
    finally:
        sp.close()
        cgroups.kill_and_remove_subtree(_GATE_DATA_DIR)


_WARM_NOT_MOVED = r"""
import json, os, select, sys, time
from peloton.hostmgr.local import spawner
spawner._WARM_MAX.append(1)
base = sys.argv[1]
cg = os.path.join(base, "cg")
os.makedirs(os.path.join(cg, "cgroup.procs"))  # a directory: the move (a write to it) fails, EISDIR
task = {"sandbox": os.path.join(base, "t"), "command": "touch ran", "env": {"PATH": "/usr/bin:/bin"}, "files": {},
        "cgroup": cg}
key = spawner.warm_key(spawner.Ready(task["sandbox"], "true", {}, None, False, cg, os.pipe2(os.O_CLOEXEC)), None)
spawner.want_warm({key: 1})
spawner.refill_warm(key)
(entry,), fds = spawner.start_all([task], {})
for _ in range(1000):  # (empty for a moment after its posix_spawn returned)
    args = open(f"/proc/{entry['pid']}/cmdline", "rb").read().split(b"\0")
    if len(args) > 3:
        break
    time.sleep(0.001)
warm = args[3].decode()
spawner._let_go()
ended = bool(select.select(fds, [], [], 10)[0])
print(json.dumps({"warm": warm, "ended": ended, "files": sorted(os.listdir(task["sandbox"])),
                  "stderr": open(os.path.join(task["sandbox"], "stderr")).read()}))
"""


def test_a_warm_wrapper_that_cannot_be_moved_says_so_in_the_tasks_stderr_and_runs_nothing(tmp_path: Path) -> None:
    """A cold wrapper that is not let go (its move into the task's cgroup failed) says why in the task's stderr and
    ends 125 having run nothing; a warm one handed the task does the same (it has no logs of the task before)."""
    import subprocess

    out = subprocess.run([PY, "-c", _WARM_NOT_MOVED, str(tmp_path)], capture_output=True, text=True, timeout=60,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr
    assert "cannot move" in out.stderr  # the spawner's own log
    got = json.loads(out.stdout)
    assert got["warm"] == spawner.WARM_MARK and got["ended"]
    assert got["files"] == ["stderr", "stdout", "work"]  # no pids, no exit, nothing of the command ("ran")
    assert got["stderr"] == "peloton: the task could not be put into its cgroup\n"


@needs_cgroups
@pytest.mark.skipif(not AS_ROOT, reason="switching a task's user needs root")
def test_a_users_processes_cannot_write_into_the_gate_of_its_idle_warm_wrapper(tmp_path: Path) -> None:
    """A warm wrapper of another user waits, for minutes, outside any task's cgroup (in its spawner's), and runs
    whatever follows a `go` line in its gate. The gate was given to the user (so that the wrapper's `. /dev/stdin`
    could open it again): any process of the user (a running task) could open /proc/PID/fd/0 of the wrapper for
    writing and have it run a script of its own outside the task's cgroup (its limits, its kill), or fill the pipe
    so that the spawner's write at `go` blocked for good. The user may read its gate, and nothing more."""
    from peloton.hostmgr.local.spawn import _Spawner

    assert _CGROUPS is not None
    os.makedirs(_CGROUPS.subtree, 0o755, exist_ok=True)
    _as_the_backend_makes_it(tmp_path)
    sp = _Spawner(inherited(os.environ), warm=1)
    try:
        idle = _one_idle_warm_wrapper(sp, tmp_path)
        script = "go\nexit 0\n"  # (it would have run it, and ended)
        as_user = subprocess.run(
            ["/bin/sh", "-c", f"printf '%s' \"$1\" > /proc/{idle}/fd/0 || exit 9; chmod 666 /proc/{idle}/fd/0",
             "sh", script],
            user=1, group=1, extra_groups=[], capture_output=True, text=True, timeout=30)
        assert as_user.returncode == 9, as_user  # could not open it for writing
        time.sleep(0.2)
        assert idle in _warm_below(sp.proc.pid)  # still waiting, unharmed ...
        sp.send(_gang(tmp_path, ["second"], ["id -u"], "daemon"))
        (r,) = sp.receive()
        assert isinstance(r, Started) and r.pidfd is not None and r.pid == idle  # ... and handed the next member
        os.close(r.pidfd)
        sp.let_go()
        wait_for(lambda: wrapper.read_exit(tmp_path / "second") is not None)
        rec = wrapper.read_exit(tmp_path / "second")
        assert rec is not None and rec.exit_code == 0, (tmp_path / "second" / "stderr").read_text()
        assert (tmp_path / "second" / "stdout").read_text() == "1\n"
    finally:
        sp.close()
        cgroups.kill_and_remove_subtree(_GATE_DATA_DIR)


_TAKE_OVER = r"""
import ctypes, os, sys
pid = int(sys.argv[1])
out = []
try:
    open(f"/proc/{pid}/environ", "rb").read()
    out.append("environ")
except OSError:
    pass
try:
    os.listdir(f"/proc/{pid}/fd")
    out.append("fd")
except OSError:
    pass
libc = ctypes.CDLL(None, use_errno=True)
if libc.ptrace(16, pid, None, None) == 0:  # PTRACE_ATTACH
    out.append("ptrace")
    libc.ptrace(17, pid, None, None)  # PTRACE_DETACH
print(" ".join(out))
"""


@needs_cgroups
@pytest.mark.skipif(not AS_ROOT, reason="switching a task's user needs root")
def test_a_users_processes_cannot_take_over_its_idle_warm_wrapper(tmp_path: Path) -> None:
    """A warm wrapper of another user waits outside any task's cgroup. Were it dumpable, as a shell the user
    started is, any process of the user (a running task) could ptrace it, or read its memory, and run what it
    likes there, free of every task's limits and kill. It executes spawner.WARM_SHELL, which its user may not read:
    not dumpable, like the launcher. Once handed its member it is that member's wrapper, dumpable as a cold one."""
    from peloton.hostmgr.local.spawn import _Spawner

    assert _CGROUPS is not None
    os.makedirs(_CGROUPS.subtree, 0o755, exist_ok=True)
    _as_the_backend_makes_it(tmp_path)
    sp = _Spawner(inherited(os.environ), warm=1)
    try:
        idle = _one_idle_warm_wrapper(sp, tmp_path)
        assert os.stat(f"/proc/{idle}/environ").st_uid == 0  # (/proc's files of a process that is not dumpable)
        copy = tmp_path.parent / spawner.WARM_SHELL
        assert copy.stat().st_uid == 0 and copy.stat().st_mode & 0o777 == 0o111
        system_python = shutil.which("python3", path="/usr/bin:/bin")  # (the user may not execute this venv's)
        assert system_python is not None
        as_user = subprocess.run([system_python, "-c", _TAKE_OVER, str(idle)], user=1, group=1, extra_groups=[],
                                 capture_output=True, text=True, timeout=30)
        assert as_user.returncode == 0 and as_user.stdout.strip() == "", as_user
        sp.send(_gang(tmp_path, ["second"], ["sleep 30"], "daemon"))
        (r,) = sp.receive()
        assert isinstance(r, Started) and r.pidfd is not None and r.pid == idle  # handed the next member
        sp.let_go()
        wait_for(lambda: wrapper.read_pid(tmp_path / "second") == idle)
        wait_for(lambda: os.stat(f"/proc/{idle}/environ").st_uid == 1)  # its wrapper now, as a cold start's
        os.killpg(idle, signal.SIGKILL)
        os.close(r.pidfd)
    finally:
        sp.close()
        cgroups.kill_and_remove_subtree(_GATE_DATA_DIR)


@pytest.mark.skipif(not AS_ROOT, reason="a copy of the shell that its users may not read: root's")
def test_the_warm_shell_is_an_execute_only_copy_of_the_shell_kept_up_to_date_where_no_one_else_may_write(
        tmp_path: Path) -> None:
    data = tmp_path / "data"
    where = data / "sandboxes"
    where.mkdir(parents=True)
    os.chmod(data, 0o711)
    assert spawner.warm_shell(str(where)) == "../" + spawner.WARM_SHELL
    copy = data / spawner.WARM_SHELL
    st, src = copy.stat(), os.stat(spawner.SHELL)
    assert (st.st_uid, st.st_mode & 0o7777, st.st_size) == (0, 0o111, src.st_size)
    assert copy.read_bytes() == Path(spawner.SHELL).read_bytes()
    os.utime(copy, ns=(0, 0))  # (the shell was upgraded since: made again)
    assert spawner.warm_shell(str(where)) is not None and copy.stat().st_mtime_ns == src.st_mtime_ns
    os.chmod(copy, 0o755)  # (not as made: made again)
    assert spawner.warm_shell(str(where)) is not None and copy.stat().st_mode & 0o7777 == 0o111
    os.chmod(data, 0o733)  # others may write there: they could replace an out-of-date copy
    os.utime(copy, ns=(0, 0))
    assert spawner.warm_shell(str(where)) is None
    os.chmod(data, 0o711)
    os.chown(data, 1, 1)  # another user's directory
    assert spawner.warm_shell(str(where)) is None
    assert sorted(os.listdir(data)) == ["sandboxes", spawner.WARM_SHELL]  # no copy left half made


_RECEIVE_SHORT = r"""
import json, os, resource, socket, sys
from peloton.hostmgr.local import spawner
sock = socket.socket(fileno=int(sys.argv[1]))
resource.setrlimit(resource.RLIMIT_NOFILE, (16, 16))  # room for a few of the 24 descriptors coming
before = sorted(int(n) for n in os.listdir("/proc/self/fd"))
try:
    spawner.recv_fds_cloexec(sock, 16, 64)
    print(json.dumps({"raised": None}))
except ConnectionError as e:
    after = sorted(int(n) for n in os.listdir("/proc/self/fd"))
    print(json.dumps({"raised": str(e), "leaked": len(after) - len(before)}))
"""


def test_descriptors_lost_on_their_way_end_the_channel_instead_of_being_matched_to_the_wrong_tasks() -> None:
    """A process out of descriptors is passed fewer than were sent (MSG_CTRUNC). The daemon matched a spawner's
    pidfds to its replies in order: one lost would have given later tasks other tasks' pidfds (signals to the wrong
    process). recv_fds_cloexec says so instead, having closed what did arrive; the daemon takes it as a spawner
    gone wrong (SpawnerDied), the launcher as its channel's end."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        child = subprocess.Popen([PY, "-c", _RECEIVE_SHORT, str(theirs.fileno())], pass_fds=[theirs.fileno()],
                                 stdout=subprocess.PIPE, text=True, cwd=ROOT)
        theirs.close()
        null = [os.open(os.devnull, os.O_RDONLY) for _ in range(24)]
        try:
            socket.send_fds(ours, [b"x"], null)
        finally:
            for fd in null:
                os.close(fd)
        out, _ = child.communicate(timeout=30)
    finally:
        ours.close()
    got = json.loads(out)
    assert got["raised"] and "MSG_CTRUNC" in got["raised"] and got["leaked"] == 0, got


def test_a_wrapper_whose_command_has_the_warm_mark_as_a_word_is_still_its_tasks_wrapper(tmp_path: Path) -> None:
    """is_wrapper took any process with `peloton-task-warm` anywhere in its command line for a warm wrapper not
    handed its task yet: a command run directly with that word as an argument made its own wrapper unrecognisable
    (a restarted daemon reported the task LOST and killed its cgroup). Only a warm wrapper's $0 is the mark."""
    sandbox = tmp_path / "t"
    spawner.prepare(str(sandbox), {})
    command = f"/bin/sh -c 'sleep 30' {spawner.WARM_MARK}"
    assert spawner.argv_of(command, {}) is not None  # run directly: the word is an argument of the wrapper
    pid = spawner.spawn(str(sandbox), command, {"PATH": "/usr/bin:/bin"})
    fd = os.pidfd_open(pid)
    try:
        wait_for(lambda: wrapper.read_pid(sandbox) == pid)
        assert wrapper.is_wrapper(pid, sandbox)
    finally:
        os.killpg(pid, signal.SIGKILL)
        os.close(fd)


_LAUNCHER_PID_REUSED = r"""
import json, os, select, signal, subprocess, time
from peloton.hostmgr.local import spawner
signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # as the spawner's main(): its children are reaped as they end
spawner._LAUNCHERS_ON.append(True)
launcher = spawner.Launcher(1, 1, [])
pid = launcher.pid
os.kill(pid, signal.SIGKILL)  # the user's processes may kill their launcher (`kill -9 -1`)
select.select([launcher.pidfd], [], [], 10)
while os.path.exists(f"/proc/{pid}"):
    time.sleep(0.01)
with open("/proc/sys/kernel/ns_last_pid", "w") as f:  # (a pid namespace of this test's own)
    f.write(str(pid - 1))
stranger = subprocess.Popen(["sleep", "30"])  # what the pid is given to next
reused = stranger.pid == pid
launcher.close()  # as the spawner closes a launcher idle 10 minutes, or one found dead at a launch
time.sleep(0.2)
print(json.dumps({"reused": reused, "stranger_alive": stranger.poll() is None}))
stranger.kill()
"""


@pytest.mark.skipif(not AS_ROOT, reason="a launcher of another user, a pid namespace: root")
def test_closing_a_launcher_that_ended_long_ago_signals_no_process_that_has_its_pid_now() -> None:
    """A launcher runs as its user, who may kill it; the spawner reaps it at once (SIGCHLD ignored), so its pid is
    free for any process. Launcher.close SIGKILLed the pid (as root) whatever the launcher's state: closing a launcher
    idle for 10 minutes, or one found dead at a launch, killed whatever process had the pid by then (on a host
    with 32768 pids, any). It signals through its pidfd."""
    out = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", PY, "-c", _LAUNCHER_PID_REUSED],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    if out.returncode != 0 and "unshare" in out.stderr:
        pytest.skip(f"no pid namespace here: {out.stderr.strip()}")
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    if not got["reused"]:
        pytest.skip("the pid was not given to the stranger")
    assert got["stranger_alive"]


def test_a_spawner_at_its_descriptor_limit_leaks_no_gate_when_it_cannot_refill_a_warm_pool(tmp_path: Path) -> None:
    """refill_warm opened the gates of a batch in one list comprehension: a pipe2 that failed (EMFILE) lost the
    pipes made before it, never closed."""
    script = r"""
import json, os, resource, sys
from peloton.hostmgr.local import spawner
spawner._WARM_MAX.append(4)
base = sys.argv[1]
r = spawner.Ready(os.path.join(base, "t"), "true", {}, None, False, "cg", os.pipe2(os.O_CLOEXEC))
key = spawner.warm_key(r, None)
spawner.want_warm({key: 4})
def used():
    return len(os.listdir("/proc/self/fd")) - 1  # (the listing's own)
before = used()
resource.setrlimit(resource.RLIMIT_NOFILE, (before + 5, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
spawner.refill_warm(key)  # room for two pipes of the four (and what listing /proc/self/fd takes)
print(json.dumps({"before": before, "after": used(), "pool": len(spawner._pools[key].wrappers),
                  "want": spawner._pools[key].want}))
"""
    out = subprocess.run([PY, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["pool"] == 0 and got["want"] == 0  # none started: it wants no more than it has
    assert got["after"] == got["before"], got


def test_warm_wrappers_end_with_their_spawner(tmp_path: Path) -> None:
    """(A check, not a defect: the warm wrappers of a spawner that is killed end at their gate, 125.)"""
    from peloton.hostmgr.local.spawn import _Spawner

    if _CGROUPS is None:
        pytest.skip("cgroup v2 cannot be used here")
    os.makedirs(_CGROUPS.subtree, 0o755, exist_ok=True)
    sp = _Spawner(inherited(os.environ), warm=3)
    try:
        sp.send(_gang(tmp_path, ["a", "b", "c"], ["true"] * 3, None))
        for r in sp.receive():
            assert isinstance(r, Started) and r.pidfd is not None
            os.close(r.pidfd)
        sp.let_go()
        wait_for(lambda: len(_warm_below(sp.proc.pid)) == 3)
        waiting = _warm_below(sp.proc.pid)
        os.kill(sp.proc.pid, signal.SIGKILL)
        sp.proc.wait(10)
        wait_for(lambda: all(_ended(p) for p in waiting))
    finally:
        sp.close()
        cgroups.kill_and_remove_subtree(_GATE_DATA_DIR)
