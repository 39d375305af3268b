"""Tasks run as their job's user (task.user): a root daemon switches to it, gives it the sandbox and reads what the
task could have tampered with (its logs, pids, exit files) without following links. Switching users needs root:
these tests run as root (CI does) and are skipped otherwise, saying so."""

from __future__ import annotations

import dataclasses
import os
import pwd
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from peloton.domain.launch import LaunchOutcome, LaunchSpec
from peloton.domain.states import TaskState
from peloton.errors import FailedPrecondition
from peloton.hostmgr.local import spawner, wrapper
from peloton.hostmgr.local.backend import LocalBackend, make_local_hosts
from tests.asroot import let_others_pass
from tests.unit.test_local_backend import HOST_RES, Recorder, kill_leftovers, launch, spec

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="switching a task's user needs a daemon running as root")

NOBODY = pwd.getpwnam("nobody")
DAEMON = pwd.getpwnam("daemon")  # another unprivileged user every Debian has


@pytest.fixture
def backend(tmp_path: Path) -> Iterator[Callable[..., tuple[LocalBackend, Recorder]]]:
    made: list[LocalBackend] = []

    let_others_pass(tmp_path)  # task users enter their sandboxes themselves

    def make(default_user: str | None = None) -> tuple[LocalBackend, Recorder]:
        b = LocalBackend(tmp_path / "local", make_local_hosts(1, HOST_RES), default_user=default_user)
        rec = Recorder()
        b.start(rec)
        made.append(b)
        return b, rec

    yield make
    for b in made:
        b.stop()
    kill_leftovers(tmp_path)


def out(b: LocalBackend, task_id: str, stream: str = "stdout") -> str:
    return b.read_log(task_id, stream, 0, 100_000)[0].decode()


def test_a_task_naming_no_user_runs_as_nobody_in_a_sandbox_it_owns(
        backend: Callable[..., tuple[LocalBackend, Recorder]], tmp_path: Path) -> None:
    b, rec = backend()
    launch(b, spec("t1", 'id -un; echo "$HOME $USER $LOGNAME"; cat "$PELOTON_HOSTFILE"; touch made-here; pwd',
                   files={"hostfile": "local-0 slots=1\n"}))
    st = rec.wait_terminal("t1")
    assert st.state == TaskState.SUCCEEDED, (st, out(b, "t1", "stderr"))
    box = tmp_path / "local" / "sandboxes" / "t1"
    lines = out(b, "t1").splitlines()
    assert lines[0] == "nobody"
    assert lines[1] == f"{NOBODY.pw_dir} nobody nobody"
    assert lines[2] == "local-0 slots=1"
    assert lines[3] == str(box / "work")
    for path, mode in ((box, 0o700), (box / "work", 0o700), (box / "hostfile", 0o600), (box / "stdout", 0o600),
                       (box / "stderr", 0o600), (box / "work" / "made-here", None)):
        st_ = path.lstat()
        assert (st_.st_uid, st_.st_gid) == (NOBODY.pw_uid, NOBODY.pw_gid), path
        if mode is not None:
            assert stat.S_IMODE(st_.st_mode) == mode, path
    for d in (tmp_path / "local", tmp_path / "local" / "sandboxes"):  # passable, not listable, by others
        assert stat.S_IMODE(d.stat().st_mode) == 0o711, d


def test_a_task_runs_as_the_user_its_job_names_with_that_users_groups(
        backend: Callable[..., tuple[LocalBackend, Recorder]]) -> None:
    b, rec = backend()
    launch(b, _with_user(spec("t2", "id -u; id -g; id -G"), "daemon"))
    assert rec.wait_terminal("t2").state == TaskState.SUCCEEDED
    uid, gid, groups = out(b, "t2").splitlines()
    assert (int(uid), int(gid)) == (DAEMON.pw_uid, DAEMON.pw_gid)
    assert sorted(int(g) for g in groups.split()) == sorted(set(os.getgrouplist("daemon", DAEMON.pw_gid)))
    assert "0" not in groups.split()  # none of root's groups stayed


def test_an_unknown_user_fails_the_launch_for_good_naming_the_user(
        backend: Callable[..., tuple[LocalBackend, Recorder]]) -> None:
    b, _ = backend()
    r = launch(b, _with_user(spec("t3", "true"), "no-such-user-xyz"))
    assert r.outcome == LaunchOutcome.FAILED and r.permanent
    assert "task.user: there is no user 'no-such-user-xyz' on this host" in r.message


def test_root_only_when_the_job_names_it_or_the_operator_made_it_the_default(
        backend: Callable[..., tuple[LocalBackend, Recorder]]) -> None:
    b, rec = backend()
    launch(b, _with_user(spec("named", "id -u"), "root"))  # its pool allowed it at submit
    assert rec.wait_terminal("named").state == TaskState.SUCCEEDED and out(b, "named") == "0\n"
    with pytest.raises(spawner.Refused, match="uid 0"):
        spawner.run_as("root", root_allowed=False)  # e.g. another name for uid 0 as a default user
    b2, rec2 = backend(default_user="root")
    launch(b2, spec("default-root", "id -u"))
    assert rec2.wait_terminal("default-root").state == TaskState.SUCCEEDED and out(b2, "default-root") == "0\n"


def test_a_task_needs_no_permission_on_the_directories_above_its_sandbox(tmp_path: Path) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)  # nobody may not pass: the task is started inside its sandbox, before the switch
    b = LocalBackend(private / "local", make_local_hosts(1, HOST_RES))
    rec = Recorder()
    b.start(rec)
    try:
        launch(b, spec("t5", 'id -un; cat ../hostfile; cat "$PELOTON_HOSTFILE" 2>/dev/null || echo unreachable',
                       files={"hostfile": "local-0 slots=1\n"}))
        assert rec.wait_terminal("t5").state == TaskState.SUCCEEDED
        assert out(b, "t5") == "nobody\nlocal-0 slots=1\nunreachable\n"  # the absolute path needs o+x above
    finally:
        b.stop()


def test_a_daemon_that_is_not_root_refuses_another_user(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spawner.os, "geteuid", lambda: NOBODY.pw_uid)
    with pytest.raises(spawner.Refused, match="cannot run as daemon: the daemon runs as nobody, not root"):
        spawner.run_as("daemon", root_allowed=False)
    assert spawner.run_as("nobody", root_allowed=False) is None  # its own user: nothing to switch


def test_a_task_cannot_make_the_daemon_read_a_file_for_it_through_its_logs(
        backend: Callable[..., tuple[LocalBackend, Recorder]], tmp_path: Path) -> None:
    secret = tmp_path / "root-only"
    secret.write_text("root's secret\n")
    secret.chmod(0o600)
    b, rec = backend()
    launch(b, spec("t4", f"rm -f ../stdout && ln -s {secret} ../stdout && rm -f ../stderr && mkfifo ../stderr"))
    assert rec.wait_terminal("t4").state == TaskState.SUCCEEDED
    with pytest.raises(FailedPrecondition, match="the stdout of task t4 cannot be read"):
        b.read_log("t4", "stdout", 0, 1000)
    with pytest.raises(FailedPrecondition, match="the stderr of task t4 cannot be read"):  # a FIFO: no hang
        b.read_log("t4", "stderr", 0, 1000)


def test_a_forged_exit_or_pid_file_is_not_followed(tmp_path: Path) -> None:
    box = tmp_path / "box"
    box.mkdir()
    target = tmp_path / "target"
    target.write_text("0\n")
    (box / wrapper.EXIT_FILE).symlink_to(target)
    (box / wrapper.PIDS_FILE).symlink_to(target)
    assert wrapper.read_exit(box) is None and wrapper.read_pid(box) == 0
    (box / wrapper.EXIT_FILE).unlink()
    os.mkfifo(box / wrapper.EXIT_FILE)
    assert wrapper.read_exit(box) is None  # without blocking on the FIFO


def _with_user(s: LaunchSpec, user: str) -> LaunchSpec:
    return dataclasses.replace(s, user=user)


def test_an_allocated_uid_runs_with_its_own_group_no_others_and_its_work_dir_for_home(
        backend: Callable[..., tuple[LocalBackend, Recorder]], tmp_path: Path) -> None:
    b, rec = backend()
    launch(b, _with_user(spec("dyn", 'id -u; id -g; id -G; echo "$HOME"; touch made-here'), "#70001"))
    st = rec.wait_terminal("dyn")
    assert st.state == TaskState.SUCCEEDED, (st, out(b, "dyn", "stderr"))
    box = tmp_path / "local" / "sandboxes" / "dyn"
    assert out(b, "dyn").splitlines() == ["70001", "70001", "70001", str(box / "work")]
    for path in (box, box / "work", box / "stdout", box / "work" / "made-here"):
        assert (path.lstat().st_uid, path.lstat().st_gid) == (70001, 70001), path


def test_an_allocated_uid_an_account_took_meanwhile_or_a_system_uid_is_refused() -> None:
    with pytest.raises(spawner.Refused, match=f"uid {NOBODY.pw_uid}, allocated to this job's owner, is this host's "
                                              "user 'nobody' now"):
        spawner.run_as(f"#{NOBODY.pw_uid}", root_allowed=False)
    with pytest.raises(spawner.Refused, match="uid 0 is a system uid"):
        spawner.run_as("#0", root_allowed=True)
    with pytest.raises(spawner.Refused, match="'#x' is not a uid"):
        spawner.run_as("#x", root_allowed=False)


def test_a_job_from_before_identities_naming_a_system_account_does_not_start(
        backend: Callable[..., tuple[LocalBackend, Recorder]]) -> None:
    """Under the old rule a principal called postgres could name task.user postgres; such a job, still queued at
    the upgrade, must not run as the store's superuser now."""
    b, _ = backend()
    r = launch(b, dataclasses.replace(spec("old", "id"), user="daemon", legacy_user=True))
    assert r.outcome == LaunchOutcome.FAILED and r.permanent
    assert "task.user: daemon is a system account, and this job was created before task identities" in r.message
    # vetted at submit (mapped by an admin, or named by one): it runs
    b2, rec2 = backend()
    launch(b2, _with_user(spec("vetted", "id -un"), "daemon"))
    assert rec2.wait_terminal("vetted").state == TaskState.SUCCEEDED and out(b2, "vetted") == "daemon\n"
