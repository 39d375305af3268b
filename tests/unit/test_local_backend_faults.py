"""The local backend when things go wrong, shown with real files and processes (each test failed before its fix):
a write the disk cut short (a full disk, a file size limit) is not taken for a whole one, neither by the journal
nor by log rotation; a restart after a crash mid-launch waits for the unspawned members' pids once, not once per
member; a relative data dir gives tasks paths they can use, and its tasks are adopted across the upgrade; a task
killed past its grace keeps its sandbox for the retention after its end."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from peloton import loop as loop_module
from peloton.domain.launch import LaunchOutcome
from peloton.domain.resources import Resources
from peloton.domain.states import TaskState
from peloton.hostmgr.local import backend as local_backend_module
from peloton.hostmgr.local import logrotate
from peloton.hostmgr.local.backend import LocalBackend, make_local_hosts
from peloton.hostmgr.local.journal import Journal
from tests.unit.test_local_backend import (  # noqa: F401 - make_backend: a fixture
    TEST_TASK_USER,
    Recorder,
    _start_with_pid,
    gang,
    kill_leftovers,
    launch,
    make_backend,
    spec,
    wait_for,
)

ROOT = Path(__file__).resolve().parents[2]

# What a full disk does to a write, made real without filling one: under RLIMIT_FSIZE a write that would take a
# file past the limit writes what fits (a short count) and the next one fails (EFBIG); Python ignores SIGXFSZ. Run
# in a child process: the limit would hit every file this test process writes meanwhile.
_LIMIT = """
import os, resource
_soft, _hard = resource.getrlimit(resource.RLIMIT_FSIZE)
def limit(n):
    resource.setrlimit(resource.RLIMIT_FSIZE, (n, _hard))
def unlimit():
    resource.setrlimit(resource.RLIMIT_FSIZE, (_soft, _hard))
"""


def _child(code: str, *args: str) -> list[str]:
    """Run `code` (after _LIMIT) in a child Python; its stdout lines."""
    out = subprocess.run([sys.executable, "-c", _LIMIT + code, *args], cwd=ROOT, capture_output=True, text=True,
                         timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


# ------------------------------------------------------------------------------------------------ journal


def test_a_journal_append_cut_short_is_not_durable_and_tears_no_later_record(tmp_path: Path) -> None:
    """A durable append that the disk cut short used to return as if it were on disk, and leave half a line that
    the next record was glued to: both lost at replay (a `start` lost so: the running task is not adopted, its
    cgroup killed as no task's)."""
    lines = _child("""
import json, sys
from pathlib import Path
from peloton.hostmgr.local.journal import Journal
path = Path(sys.argv[1])
j = Journal(path, lambda: [])
j.start()
j.append([{"op": "start", "task": "a"}], durable=True)
limit(os.path.getsize(path) + 20)
try:
    j.append([{"op": "start", "task": "b", "pad": "x" * 200}], durable=True)
    print("durable")
except OSError:
    print("refused")
unlimit()
j.append([{"op": "start", "task": "c"}], durable=True)
j.append([{"op": "pid", "task": "c", "pid": 7}])
j.stop()
print(json.dumps(Journal(path, lambda: []).replay()))
""", str(tmp_path / "journal"))
    assert lines[0] == "refused"
    assert json.loads(lines[1]) == {"a": {"task": "a"}, "c": {"task": "c", "pid": 7}}
    assert (tmp_path / "journal").read_text().endswith("}\n")


def test_a_compaction_the_disk_cut_short_keeps_the_journal_it_would_replace(tmp_path: Path) -> None:
    """The rewrite through journal.tmp used to rename a tmp file the disk had cut short over the journal: the
    tasks past the cut were forgotten (not adopted at the next start, their cgroups killed)."""
    path = tmp_path / "journal"
    records = [{"op": "start", "task": f"t-{i}-1", "pad": "x" * 100} for i in range(10)]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    lines = _child("""
import json, sys
from pathlib import Path
from peloton.hostmgr.local.journal import Journal
path = Path(sys.argv[1])
j = Journal(path, lambda: [json.loads(x) for x in path.read_text().splitlines()])
limit(300)
try:
    j.start()
    print("compacted")
except OSError:
    print("refused")
unlimit()
""", str(path))
    assert lines == ["refused"]
    assert set(Journal(path, lambda: []).replay()) == {r["task"] for r in records}
    assert not (tmp_path / "journal.tmp").exists()


# ------------------------------------------------------------------------------------------------ log rotation


def test_a_rotation_the_disk_cuts_short_changes_nothing(tmp_path: Path) -> None:
    """A rotation whose copy failed (a full disk: the logs are the data dir's biggest files) used to have shifted
    the rotated files first and left its partial copy as `stdout.1`: each try dropped the oldest kept file, and
    reads served the current log's first bytes again where the older ones had been."""
    sb = tmp_path / "sb"
    sb.mkdir()
    (sb / "stdout.2").write_bytes(b"two\n" * 1000)
    (sb / "stdout.1").write_bytes(b"one\n" * 1000)
    (sb / "stdout.offset").write_text("8000\n")
    current = b"".join(b"line %06d\n" % i for i in range(30_000))  # 360 kB
    (sb / "stdout").write_bytes(current)
    before = logrotate.read(sb, "stdout", 0, 1 << 30, 2)
    assert before == (b"two\n" * 1000 + b"one\n" * 1000 + current, 8000 + len(current))
    files = {p.name: p.read_bytes() for p in sb.iterdir()}
    lines = _child("""
import sys
from pathlib import Path
from peloton import loop as loop_module
from peloton.hostmgr.local import logrotate
limit(100_000)
print(logrotate.rotate(Path(sys.argv[1]), "stdout", 1000, 2))
""", str(sb))
    assert lines == ["0"]
    assert {p.name: p.read_bytes() for p in sb.iterdir()} == files
    assert logrotate.read(sb, "stdout", 0, 1 << 30, 2) == before
    # once the disk has room again, the rotation goes through, and no byte of the stream moved
    assert logrotate.rotate(sb, "stdout", 1000, 2) == len(current)
    assert logrotate.read(sb, "stdout", 4000, 1 << 30, 2) == (before[0][4000:], before[1])


# ------------------------------------------------------------------------------------------------ adoption


def test_a_restart_after_a_crash_mid_launch_waits_for_the_unspawned_members_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Members recorded and given a sandbox, whose wrappers never started (the daemon died in the launch): the
    restart waited PID_WAIT_S for each one's pid in turn (2 s a member: a 1,000-member gang held the start for
    half an hour)."""
    monkeypatch.setattr(local_backend_module, "PID_WAIT_S", 0.5)
    hosts = make_local_hosts(1, Resources(cpu=8, mem=4096))
    data = tmp_path / "local"
    (data / "sandboxes").mkdir(parents=True)
    ids = [f"j-{i}-1" for i in range(6)]
    with open(data / "journal", "w") as f:
        for tid in ids:
            (data / "sandboxes" / tid / "work").mkdir(parents=True)
            f.write(json.dumps({"op": "start", "task": tid, "job": "j", "instance": 0, "attempt": 1,
                                "host": hosts[0].hostname, "sandbox": str(data / "sandboxes" / tid),
                                "res": [1, 64, 0, 0, 0], "gpus": [], "ports": []}) + "\n")
    b = LocalBackend(data, hosts)
    deadlines: list[float] = []
    real_wait = b._wait_for_pid

    def wait_for_pid(sandbox: Path, deadline: float) -> int:
        deadlines.append(deadline)
        return real_wait(sandbox, deadline)

    monkeypatch.setattr(b, "_wait_for_pid", wait_for_pid)
    rec = Recorder()
    b.start(rec)
    try:
        for tid in ids:
            st = rec.wait_terminal(tid)
            assert st.state == TaskState.LOST and "never started" in st.message
        assert len(deadlines) == len(ids) and len(set(deadlines)) == 1  # one wait for them all, not one each
    finally:
        b.stop()


def test_the_members_of_a_gang_whose_launch_failed_leave_the_journal_as_ended(
        tmp_path: Path, make_backend: Callable[..., tuple[LocalBackend, Recorder]]) -> None:  # noqa: F811
    """A gang whose member could not start is stopped whole, and nothing of it is reported (its launch FAILED says
    it): but its members' `start` records had no `end`, so a restart before the next compaction took each for a
    task that ended while no daemon watched, or never started, reported it LOST to a job manager that had moved on
    (a new attempt), and waited for the pid of one whose sandbox was made (PID_WAIT_S)."""
    a, _ = make_backend(n=1)
    r = launch(a, spec("g0", "sleep 30"), spec("g1", "sleep 30\0"), spec("g2", "sleep 30"))
    assert r.outcome == LaunchOutcome.FAILED and r.task_id == "g1"
    wait_for(lambda: not a._tasks)  # the started member seen ended (its end handled by the monitor)
    a.stop()
    ended = Journal(tmp_path / "journal", list).replay()
    assert {tid for tid, e in ended.items() if "final" not in e} == set(), ended

    b, rec_b = make_backend(n=1)
    assert rec_b.statuses == [] and not b._tasks
    # and the same task ids start again, as a launch refused after them would have them
    assert launch(b, spec("g0", "true"), spec("g1", "true"), spec("g2", "true")).outcome == LaunchOutcome.OK
    for tid in ("g0", "g1", "g2"):
        assert rec_b.wait_terminal(tid).state == TaskState.SUCCEEDED


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a process a chosen pid (ns_last_pid) needs root")
def test_a_signal_for_a_task_whose_wrapper_just_ended_reaches_no_process_that_took_its_pid(
        tmp_path: Path, make_backend: Callable[..., tuple[LocalBackend, Recorder]]) -> None:  # noqa: F811
    """From a wrapper's end until the monitor has handled it, the backend still had the task as not exited, and a
    kill then signalled the wrapper's process group by its number, free again the moment the wrapper ended (it is
    reaped at once): a process that took the number and leads a group of it (another task's wrapper, a daemon)
    got the task's SIGTERM or SIGKILL. Now the group is signalled only while the task's pidfd says its wrapper
    lives."""
    b, _ = make_backend(n=1)
    go = tmp_path / "go"
    assert launch(b, spec("t", f"while [ ! -e {go} ]; do sleep 0.05; done")).outcome == LaunchOutcome.OK
    t = b._tasks["t"]
    pid = t.pid
    with b._lock:  # the monitor sees the end, then waits here to mark the task exited: the window, held open
        go.touch()
        wait_for(lambda: not _alive(pid))
        stranger = _start_with_pid(pid)
        assert stranger is not None, f"pid {pid} could not be had (another process of this machine took it)"
        try:
            assert not t.exited
            b._signal(t, signal.SIGTERM)
            b._signal(t, signal.SIGKILL)
            with pytest.raises(subprocess.TimeoutExpired):  # (a killed one is dead in milliseconds)
                stranger.wait(2)
        finally:
            stranger.kill()
            stranger.wait()


def test_the_sweep_leaves_the_sandbox_of_a_task_whose_end_is_being_read(
        tmp_path: Path, make_backend: Callable[..., tuple[LocalBackend, Recorder]]) -> None:  # noqa: F811
    """The monitor marks a task exited, then reads how it ended from its sandbox; the sweep took every exited task's
    sandbox for an ended one meanwhile, and past the count bound (failed tasks' sandboxes kept longest, so a task
    that just succeeded goes first) removed it in between: the task was reported LOST ("ended without a result")
    instead of SUCCEEDED. The sweep runs as ends come in (every tenth of the count), so in a gang that ends
    together it ran between two members' handling. The window is held open here: the monitor is kept from
    handling the end (its lock) while the book is put as the monitor puts it first (exited, not yet read)."""
    b, rec = make_backend(n=1, sandbox_max_count=1, sandbox_sweep_s=3600.0)
    launch(b, spec("f", "exit 3"))
    assert rec.wait_terminal("f").state == TaskState.FAILED
    go = tmp_path / "go"
    launch(b, spec("s", f"while [ ! -e {go} ]; do sleep 0.05; done"))
    t = b._tasks["s"]
    with b._monitor._lock:  # the monitor cannot take the end yet
        go.touch()
        wait_for(lambda: (tmp_path / "sandboxes" / "s" / "exit").exists() and not _alive(t.pid))
        with b._lock:
            t.exited = True  # what the monitor's exit handling does first
        b.expire_sandboxes(time.time())
        with b._lock:
            t.exited = False  # (the monitor, let go, now handles the end from its start)
    assert (tmp_path / "sandboxes" / "s").is_dir()
    assert rec.wait_terminal("s").state == TaskState.SUCCEEDED


def test_the_sweep_leaves_the_sandbox_of_a_task_id_launched_again_after_it_was_listed(
        tmp_path: Path, make_backend: Callable[..., tuple[LocalBackend, Recorder]],  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The sweep lists the ended sandboxes, measures each (seconds for thousands), then removes those past a bound:
    a task id launched again in between (a launch refused after its spawn began is placed again as the same
    attempt) had its new sandbox removed under it, its end then unreadable (LOST). The launch is made here at
    the sweep's first step of the removals (the loop's progress() beat, which the sweep gives at each)."""
    b, rec = make_backend(n=1, sandbox_max_count=0, sandbox_max_bytes=1, sandbox_sweep_s=3600.0)  # every one goes
    launch(b, spec("f", "exit 3"))
    assert rec.wait_terminal("f").state == TaskState.FAILED
    launch(b, spec("x", "true"))
    assert rec.wait_terminal("x").state == TaskState.SUCCEEDED
    rec.statuses.clear()
    go = tmp_path / "go"
    beats: list[int] = []

    class Sweep:  # the loop the sweep's thread belongs to (peloton.loop: progress() beats it)
        def progressed(self) -> None:
            beats.append(1)
            if len(beats) == 3:  # two sandboxes measured: the removals begin
                assert launch(b, spec("x", f"while [ ! -e {go} ]; do sleep 0.05; done; echo again")).outcome \
                    == LaunchOutcome.OK

    monkeypatch.setattr(loop_module._current, "loop", Sweep(), raising=False)
    b.expire_sandboxes(time.time())
    monkeypatch.undo()
    assert len(beats) >= 3
    assert (tmp_path / "sandboxes" / "x" / "work").is_dir()
    go.touch()
    assert rec.wait_terminal("x").state == TaskState.SUCCEEDED
    assert b.read_log("x", "stdout", 0, 100)[0] == b"again\n"


# ------------------------------------------------------------------------------------------------ paths


def test_a_relative_data_dir_still_gives_tasks_paths_they_can_use(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """`peloton server --data-dir ./data` handed each task $PELOTON_SANDBOX, $PELOTON_HOSTFILE and
    $PELOTON_METRICS_FILE relative to the daemon's working directory, while the task runs in its sandbox's work/:
    a gang's hostfile could not be found."""
    monkeypatch.chdir(tmp_path)
    b = LocalBackend(Path("data") / "local", make_local_hosts(1, Resources(cpu=2, mem=1024)),
                     default_user=TEST_TASK_USER)
    rec = Recorder()
    b.start(rec)
    try:
        launch(b, spec("t-0-1", 'cat "$PELOTON_HOSTFILE" && ls "$PELOTON_SANDBOX/work" && '
                                'echo 1 > "$PELOTON_METRICS_FILE"', files={"hostfile": "local-0 slots=1\n"}))
        st = rec.wait_terminal("t-0-1")
        assert st.state == TaskState.SUCCEEDED, b.read_log("t-0-1", "stderr", 0, 1000)
        assert b.read_log("t-0-1", "stdout", 0, 1000)[0].startswith(b"local-0 slots=1\n")
    finally:
        b.stop()
        kill_leftovers(tmp_path)


def test_a_task_started_by_a_release_that_kept_a_relative_data_dir_is_still_adopted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A release before kept `--data-dir ./data` relative: its tasks' wrappers name their sandboxes so. Restarted on
    this one from the same directory, they are adopted, not reported LOST and killed."""
    monkeypatch.chdir(tmp_path)
    hosts = make_local_hosts(1, Resources(cpu=2, mem=1024))
    a = LocalBackend(Path("data") / "local", hosts, default_user=TEST_TASK_USER)
    a._sandboxes = Path("data") / "local" / "sandboxes"  # (the earlier release's: as given)
    a.start(Recorder())
    launch(a, spec("old-0-1", "sleep 30"))
    a.stop()  # the daemon is upgraded: nothing is killed
    b = LocalBackend(Path("data") / "local", hosts, default_user=TEST_TASK_USER)
    rec = Recorder()
    b.start(rec)
    try:
        assert b.reconcile(["old-0-1"])["old-0-1"].state == TaskState.RUNNING
        b.kill(["old-0-1"])
        assert rec.wait_terminal("old-0-1").state == TaskState.KILLED
    finally:
        b.stop()
        kill_leftovers(tmp_path)


# ------------------------------------------------------------------------------------------------ sandboxes


def test_a_task_killed_past_its_grace_keeps_its_sandbox_for_the_retention_after_its_end(
        make_backend: Callable[..., tuple[LocalBackend, Recorder]], tmp_path: Path) -> None:  # noqa: F811
    """A task that ignores SIGTERM and is SIGKILLed at the end of its grace (or whose wrapper died: LOST) leaves
    no `exit`; its sandbox's age was its directory's last change, i.e. when the task started: one that had run
    longer than --sandbox-retention lost its logs at the next sweep, minutes after it ended."""
    b, rec = make_backend(grace=0.2, sandbox_retention_s=3600.0)
    launch(b, spec("job1-0-1", "trap '' TERM; echo ready; sleep 100 & wait"))
    wait_for(lambda: b.read_log("job1-0-1", "stdout", 0, 100)[0] == b"ready\n")
    sandbox = tmp_path / "sandboxes" / "job1-0-1"
    started = sandbox.stat().st_mtime
    time.sleep(2.0)  # it runs for a while...
    b.kill(["job1-0-1"])
    assert rec.wait_terminal("job1-0-1").state == TaskState.KILLED
    assert not (sandbox / "exit").exists()
    # ...and the retention is counted from its end, not from its start
    assert b.expire_sandboxes(started + 3600 + 1) == 0
    assert b.read_log("job1-0-1", "stdout", 0, 100)[0] == b"ready\n"
    assert b.expire_sandboxes(time.time() + 3600 + 1) == 1


# ------------------------------------------------------------------------------------------------ task ends


def test_an_end_whose_handling_raises_is_still_reported_and_the_others_with_it(
        make_backend: Callable[..., tuple[LocalBackend, Recorder]],  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Handling a wrapper's exit that raised something unforeseen (reading its exit record, here) left the task
    marked exited but in the book, never reported: the backend said RUNNING for it for ever and its gang held its
    resources; and the other exits of that batch were dropped with it. The task is reported LOST (the backend
    could not tell how it ended), the others as they ended, and the error is counted."""
    from prometheus_client import REGISTRY

    from peloton.hostmgr.local import wrapper

    def errors() -> float:
        return REGISTRY.get_sample_value("peloton_loop_errors_total", {"loop": "local-monitor"}) or 0.0

    real = wrapper.read_exit

    def read_exit(sandbox: Path) -> object:
        if Path(sandbox).name.startswith("doomed"):
            raise ValueError("a bug reading the exit record")
        return real(sandbox)

    monkeypatch.setattr(wrapper, "read_exit", read_exit)
    b, rec = make_backend(n=1)
    before = errors()
    r = b.launch([gang(spec("doomed", "true"), spec("fine", "true"))])[0]
    assert r.outcome.name == "OK", r
    wait_for(lambda: rec.terminal("doomed") is not None and rec.terminal("fine") is not None, timeout=20)
    doomed, fine = rec.terminal("doomed"), rec.terminal("fine")
    assert doomed is not None and doomed.state == TaskState.LOST and "a bug reading the exit record" in doomed.message
    assert fine is not None and fine.state == TaskState.SUCCEEDED
    assert b.reconcile(["doomed"])["doomed"].state == TaskState.LOST
    assert errors() - before >= 1
