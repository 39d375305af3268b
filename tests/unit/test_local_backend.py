"""The local backend with real subprocesses (sandboxes under tmp_path)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from peloton.domain.hostgroups import HostGroup
from peloton.domain.launch import GangLaunch, LaunchOutcome, LaunchResult, LaunchSpec, TaskStatus
from peloton.domain.resources import Resources
from peloton.domain.states import TaskState
from peloton.errors import InvalidArgument, NotFound
from peloton.hostmgr.local import backend as local_backend_module
from peloton.hostmgr.local import cgroups, spawner, wrapper
from peloton.hostmgr.local import gpus as gpus_module
from peloton.hostmgr.local.backend import HostConfig, LocalBackend, make_local_hosts
from peloton.hostmgr.local.gpus import (
    detect_gpus,
    gpu_model_from_name,
    gpu_model_of,
    machine_resources,
    parse_meminfo_total_mib,
    parse_nvidia_smi_indices,
    parse_nvidia_smi_names,
)
from peloton.modelaware.hostlabels import parse_labels

DEADLINE_S = 10.0
TEST_TASK_USER = "root" if os.geteuid() == 0 else None  # as in tests/e2e/harness.py (AS_ROOT_FLAGS)
HOST_RES = Resources(cpu=4, mem=4096, disk=1024, gpu=2)


class Recorder:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.statuses: list[TaskStatus] = []

    def __call__(self, st: TaskStatus) -> None:
        with self.lock:
            self.statuses.append(st)

    def of(self, task_id: str) -> list[TaskStatus]:
        with self.lock:
            return [s for s in self.statuses if s.task_id == task_id]

    def terminal(self, task_id: str) -> TaskStatus | None:
        for s in self.of(task_id):
            if s.state.terminal:
                return s
        return None

    def wait_terminal(self, task_id: str, timeout: float = DEADLINE_S) -> TaskStatus:
        st = wait_for(lambda: self.terminal(task_id), timeout)
        assert st is not None
        return st


def wait_for(fn: Callable[[], TaskStatus | bool | None], timeout: float = DEADLINE_S) -> TaskStatus | None:
    deadline = time.monotonic() + timeout
    while True:
        v = fn()
        if v:
            return v if isinstance(v, TaskStatus) else None
        if time.monotonic() > deadline:
            raise AssertionError("condition not met within the deadline")
        time.sleep(0.02)


def _live_members(pgid: int) -> list[int]:
    """Pids in process group `pgid` that are not zombies (from /proc)."""
    out: list[int] = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            rest = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        # rest[0] is field 3 (state), rest[2] field 5 (pgrp)
        if int(rest[2]) == pgid and rest[0] not in ("Z", "X"):
            out.append(int(d.name))
    return out


def group_gone(pgid: int) -> bool:
    """No process of the group runs any more. Exited members may linger as zombies for a moment when they were
    reparented to a container init that reaps slowly, so only those count as gone as well."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return not _live_members(pgid)


def spec(task_id: str, command: str, host: str = "local-0", *, gpu_ids: tuple[int, ...] = (),
         ports: tuple[int, ...] = (), cpu: float = 1.0, mem: float = 128.0,
         files: dict[str, str] | None = None, env: dict[str, str] | None = None) -> LaunchSpec:
    return LaunchSpec(
        task_id=task_id, job_id="job1", instance=0, attempt=1, hostname=host, command=command,
        env=env or {}, resources=Resources(cpu=cpu, mem=mem, gpu=len(gpu_ids), ports=len(ports)),
        gpu_ids=gpu_ids, ports=ports, files=files or {},
    )


def gang(*specs: LaunchSpec, gang_id: str = "job1/0") -> GangLaunch:
    return GangLaunch(gang_id, 1, tuple(specs))


def launch(b: LocalBackend, *specs: LaunchSpec) -> LaunchResult:
    (r,) = b.launch([gang(*specs)])
    return r


def kill_leftovers(root: Path) -> None:
    """SIGKILL the process group of every wrapper whose pid a sandbox under `root` recorded, and everything in the
    task cgroups of a backend on `root` (removing them: they outlive a stopped backend, as its tasks do)."""
    for pids in root.glob("**/sandboxes/*/pids"):
        pid = wrapper.read_pid(pids.parent)
        if pid and not group_gone(pid):
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
    for journal in {root, *(p.parent for p in root.glob("**/journal"))}:
        cgroups.kill_and_remove_subtree(journal)


@pytest.fixture
def make_backend(tmp_path: Path) -> Iterator[Callable[..., tuple[LocalBackend, Recorder]]]:
    made: list[LocalBackend] = []

    def make(n: int = 2, resources: Resources = HOST_RES, grace: float = 5.0,
             hosts: list[HostConfig] | None = None, env_allow: tuple[str, ...] = (), **kw: Any
             ) -> tuple[LocalBackend, Recorder]:
        b = LocalBackend(tmp_path, hosts if hosts is not None else make_local_hosts(n, resources), kill_grace_s=grace,
                         env_allow=env_allow, default_user=TEST_TASK_USER, **kw)
        rec = Recorder()
        b.start(rec)
        made.append(b)
        return b, rec

    yield make
    for b in made:
        b.stop()
    kill_leftovers(tmp_path)
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:  # reap the wrappers this test process spawned
            pass


def wrapper_pgid(backend: LocalBackend, task_id: str) -> int:
    return backend._tasks[task_id].pid


def running_ids(b: LocalBackend) -> set[str]:
    return {t.task_id for t in b.running()}


# ------------------------------------------------------------------------------------------------ pure helpers


def test_parse_nvidia_smi_indices() -> None:
    assert parse_nvidia_smi_indices("0\n1\n2\n3\n") == [0, 1, 2, 3]
    assert parse_nvidia_smi_indices(" 1 \n0\n\n") == [0, 1]
    assert parse_nvidia_smi_indices("") == []
    assert parse_nvidia_smi_indices("NVIDIA-SMI has failed because it couldn't communicate\n") == []
    assert parse_nvidia_smi_indices("0, NVIDIA H100\n1, NVIDIA H100\n") == [0, 1]


def test_parse_meminfo() -> None:
    assert parse_meminfo_total_mib("MemTotal:       16384000 kB\nMemFree: 1 kB\n") == pytest.approx(16000.0)
    assert parse_meminfo_total_mib("nothing") == 0.0


def test_simulated_hosts_have_disjoint_port_ranges() -> None:
    hosts = make_local_hosts(5, HOST_RES, port_base=40000, ports_per_host=100)
    assert [h.hostname for h in hosts] == [f"local-{i}" for i in range(5)]
    ranges = [h.port_range for h in hosts]
    assert ranges[0] == (40000, 40099)
    for (lo1, hi1), (lo2, hi2) in zip(ranges, ranges[1:], strict=False):
        assert lo1 <= hi1 < lo2 <= hi2
    seen: set[int] = set()
    for lo, hi in ranges:
        r = set(range(lo, hi + 1))
        assert not (r & seen)
        seen |= r
    for h in hosts:
        assert h.gpu_ids == (0, 1)
        assert h.address == "127.0.0.1"
        assert h.labels == {"host": h.hostname, "rack": "local"}
        assert h.capacity.ports == 100 and h.capacity.gpu == 2
    with pytest.raises(InvalidArgument):
        make_local_hosts(0, HOST_RES)
    with pytest.raises(InvalidArgument):
        make_local_hosts(100, HOST_RES, port_base=60000, ports_per_host=1000)


def test_single_real_host() -> None:
    (h,) = make_local_hosts(None, Resources(cpu=2, mem=1024))
    assert h.capacity.cpu == 2 and h.labels["rack"] == "local" and h.address == "127.0.0.1"
    (h,) = make_local_hosts(None, Resources(cpu=2, mem=1024), labels={"nic_gbps": "100", "zone": "a"})
    assert h.labels == {"host": h.hostname, "rack": "local", "nic_gbps": "100", "zone": "a"}
    if not h.gpu_ids:  # GPU labels on a machine without GPUs are a mistake, said when its GPUs are known
        with pytest.raises(InvalidArgument, match="^--local-host-labels: labels.gpu_model: the hosts have no GPUs"):
            make_local_hosts(None, Resources(cpu=2, mem=1024), labels={"gpu_model": "t4"})


def test_simulated_host_groups_and_labels() -> None:
    hosts = make_local_hosts(2, HOST_RES, port_base=40000, ports_per_host=10, labels={"gpu_model": "t4"})
    assert [h.labels for h in hosts] == [{"host": f"local-{i}", "rack": "local", "gpu_model": "t4"} for i in (0, 1)]
    groups = [HostGroup(2, Resources(cpu=4, mem=4096, gpu=2), (("gpu_model", "t4"), ("nic_gbps", "50"))),
              HostGroup(1, Resources(cpu=8, mem=8192, gpu=4), (("gpu_link", "nvlink"), ("gpu_model", "a100")))]
    hosts = make_local_hosts(None, None, port_base=40000, ports_per_host=10, groups=groups)
    assert [h.hostname for h in hosts] == ["local-0", "local-1", "local-2"]
    assert [h.port_range for h in hosts] == [(40000, 40009), (40010, 40019), (40020, 40029)]
    assert [h.gpu_ids for h in hosts] == [(0, 1), (0, 1), (0, 1, 2, 3)]
    assert [h.capacity.cpu for h in hosts] == [4, 4, 8]
    assert hosts[1].labels == {"host": "local-1", "rack": "local", "gpu_model": "t4", "nic_gbps": "50"}
    assert hosts[2].labels == {"host": "local-2", "rack": "local", "gpu_link": "nvlink", "gpu_model": "a100"}
    with pytest.raises(InvalidArgument, match="port ranges 65520..65549 do not fit"):  # the groups' hosts count
        make_local_hosts(None, None, port_base=65520, ports_per_host=10, groups=groups)


def _local(*flags: str):  # type: ignore[no-untyped-def]
    from peloton.cli.groups.server import _local_hosts
    from peloton.cli.main import build_parser

    return _local_hosts(build_parser().parse_args(["server", *flags]))


def test_server_local_host_flags() -> None:
    assert _local() == (None, None, {}, ())
    assert _local("--local-host-labels", "gpu_model=H100,nic_gbps=200") == (
        None, None, {"gpu_model": "h100", "nic_gbps": "200"}, ())
    assert _local("--local-host-resources", "cpu=2,gpu=1", "--local-host-labels", "gpu_link=nvlink") == (
        1, Resources(cpu=2, gpu=1), {"gpu_link": "nvlink"}, ())
    n, res, labels, groups = _local("--local-host-group", "2:cpu=2,mem=1Gi,gpu=2:gpu_model=t4",
                                    "--local-host-group", "1:cpu=4")
    assert (n, res, labels) == (None, None, {})
    assert groups == (HostGroup(2, Resources(cpu=2, mem=1024, gpu=2), (("gpu_model", "t4"),)),
                      HostGroup(1, Resources(cpu=4)))


@pytest.mark.parametrize(("flags", "error"), [
    (["--local-hosts", "0"], "--local-hosts: must be at least 1"),
    (["--local-host-group", "1:cpu=1", "--local-hosts", "2"], "--local-host-group: not with --local-hosts"),
    (["--local-host-group", "1:cpu=1", "--local-host-labels", "a=b"],
     "--local-host-group: not with --local-host-labels"),
    (["--local-host-group", "1:cpu=1:nic_gbps=-1"], "--local-host-group: labels.nic_gbps: expected a positive"),
    (["--local-host-resources", "cpu=1", "--local-host-labels", "gpu_model=t4"],
     "--local-host-labels: labels.gpu_model: the hosts have no GPUs (gpu=0)"),
    (["--backend", "mesos", "--local-host-group", "1:cpu=1"], "--local-host-group: only with --backend local"),
    (["--backend", "mesos", "--local-host-labels", "a=b"], "--local-host-labels: only with --backend local"),
])
def test_server_local_host_flags_are_checked(flags: list[str], error: str) -> None:
    with pytest.raises(InvalidArgument) as e:
        _local(*flags)
    assert e.value.message.startswith(error)


# ------------------------------------------------------------------------------------------------ processes


def test_two_tasks_run_and_succeed_with_stdout(make_backend: Callable[..., tuple[LocalBackend, Recorder]]) -> None:
    b, rec = make_backend()
    r = launch(b,
               spec("t-a", "echo hello-a; cat $PELOTON_HOSTFILE", "local-0", files={"hostfile": "h1 slots=1\n"}),
               spec("t-b", "echo hello-b >&2; echo $MY_VAR; pwd", "local-1", env={"MY_VAR": "v1"}))
    assert r == LaunchResult("job1/0", 1, LaunchOutcome.OK)
    assert [s.state for s in rec.of("t-a")][:1] == [TaskState.RUNNING]
    assert rec.of("t-a")[0].hostname == "local-0"
    a = rec.wait_terminal("t-a")
    bb = rec.wait_terminal("t-b")
    assert a.state == TaskState.SUCCEEDED and a.exit_code == 0
    assert bb.state == TaskState.SUCCEEDED and bb.hostname == "local-1"
    assert b.read_log("t-a", "stdout", 0, 1 << 20) == (b"hello-a\nh1 slots=1\n", 19)
    assert b.read_log("t-b", "stderr", 0, 100)[0] == b"hello-b\n"
    out = b.read_log("t-b", "stdout", 0, 100)[0].decode().splitlines()
    assert out[0] == "v1"
    assert out[1].endswith("sandboxes/t-b/work")
    assert b.read_log("t-a", "stdout", -3, 100) == (b"=1\n", 19)  # the last 3 bytes
    assert b.read_log("t-a", "stdout", 8, 4) == (b"h1 s", 12)  # from an offset, bounded
    assert b.read_log("t-a", "stdout", 99, 4) == (b"", 19)
    assert running_ids(b) == set()
    with pytest.raises(NotFound):
        b.read_log("nope", "stdout", 0, 10)
    with pytest.raises(InvalidArgument):
        b.read_log("t-a", "stdin", 0, 10)
    rc = b.reconcile(["t-a", "nope"])
    assert rc["t-a"].state == TaskState.SUCCEEDED
    assert rc["nope"].state == TaskState.LOST and rc["nope"].reason == "unknown to the local backend"


def test_the_sandboxes_of_tasks_ended_past_the_retention_go_and_the_others_stay(
        make_backend: Callable[..., tuple[LocalBackend, Recorder]], tmp_path: Path) -> None:
    b, rec = make_backend(sandbox_retention_s=3600.0)
    launch(b, spec("job1-0-1", "echo first attempt"))
    ended = rec.wait_terminal("job1-0-1")
    launch(b, spec("job1-0-2", "sleep 60"))  # the job's next attempt, still running
    wait_for(lambda: "job1-0-2" in running_ids(b))
    orphan = tmp_path / "sandboxes" / "job9-0-1"  # no end recorded, no wrapper alive (a launch cut short)
    orphan.mkdir()
    os.utime(orphan, (ended.time - 1800, ended.time - 1800))

    assert b.expire_sandboxes(ended.time + 60) == 0  # ended a minute ago: kept
    assert b.read_log("job1-0-1", "stdout", 0, 100)[0] == b"first attempt\n"
    assert b.expire_sandboxes(ended.time + 3601) == 2  # the ended attempt's and the orphan's
    assert not (tmp_path / "sandboxes" / "job1-0-1").exists() and not orphan.exists()
    assert (tmp_path / "sandboxes" / "job1-0-2").is_dir()  # running: whatever its age
    with pytest.raises(NotFound, match="sandbox-retention"):
        b.read_log("job1-0-1", "stdout", 0, 100)
    assert b.expire_sandboxes(ended.time + 10 * 86400) == 0


def test_the_ended_sandboxes_kept_are_bounded_in_count_failed_ones_kept_longest_without_waiting_for_the_sweep(
        make_backend: Callable[..., tuple[LocalBackend, Recorder]], tmp_path: Path) -> None:
    """Past the count the oldest go at once (the sweep is woken by the ends, not left to its 10-minute period),
    a failed task's last."""
    b, rec = make_backend(sandbox_max_count=2)
    for tid, cmd in (("job1-0-1", "exit 3"), ("job1-1-1", "true"), ("job1-2-1", "true"), ("job1-3-1", "true")):
        launch(b, spec(tid, cmd))
        rec.wait_terminal(tid)
        time.sleep(0.02)  # distinct end times
    boxes = tmp_path / "sandboxes"
    wait_for(lambda: set(os.listdir(boxes)) == {"job1-0-1", "job1-3-1"})
    assert b.read_log("job1-0-1", "stdout", 0, 10) == (b"", 0)  # the failed one, oldest, kept


def test_the_ended_sandboxes_kept_are_bounded_in_bytes(make_backend: Callable[..., tuple[LocalBackend, Recorder]],
                                                       tmp_path: Path) -> None:
    b, rec = make_backend(sandbox_max_count=0, sandbox_max_bytes=5 << 20)
    for i in range(4):
        launch(b, spec(f"job1-{i}-1", "head -c 2097152 /dev/urandom > big"))  # 2 MiB on disk each
        rec.wait_terminal(f"job1-{i}-1")
        time.sleep(0.02)
    assert b.expire_sandboxes(time.time()) == 2
    assert sorted(os.listdir(tmp_path / "sandboxes")) == ["job1-2-1", "job1-3-1"]  # the newest that fit


def test_a_deleted_jobs_sandboxes_are_removed_by_the_sweep_not_by_the_caller(
        make_backend: Callable[..., tuple[LocalBackend, Recorder]], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    b, rec = make_backend()
    for tid in ("job1-0-1", "job1-1-1"):
        launch(b, spec(tid, "true"))
        rec.wait_terminal(tid)
    launch(b, dataclasses.replace(spec("job2-0-1", "true"), job_id="job2"))
    rec.wait_terminal("job2-0-1")
    threads: list[str] = []
    real = b._remove_job_sandboxes

    def remove(wanted: set[str]) -> int:
        threads.append(threading.current_thread().name)
        return real(wanted)

    monkeypatch.setattr(b, "_remove_job_sandboxes", remove)
    assert b.remove_sandboxes(["job1"]) == 2  # found, handed to the sweep
    wait_for(lambda: sorted(os.listdir(tmp_path / "sandboxes")) == ["job2-0-1"])
    assert threads == ["loop-local-sandboxes"]


def test_nonzero_exit_fails_and_says_why(make_backend: Callable[..., tuple[LocalBackend, Recorder]]) -> None:
    b, rec = make_backend()
    launch(b, spec("t-f", "exit 3"))
    st = rec.wait_terminal("t-f")
    assert st.state == TaskState.FAILED and st.exit_code == 3 and st.message == "exit code 3"
    launch(b, spec("t-nf", "no-such-command-here"))
    st = rec.wait_terminal("t-nf")
    assert st.state == TaskState.FAILED and st.exit_code == 127 and "command not found" in st.message
    assert b"no-such-command-here" in b.read_log("t-nf", "stderr", 0, 1000)[0]


def test_running_is_reported_once_the_command_was_executed(
    make_backend: Callable[..., tuple[LocalBackend, Recorder]]
) -> None:
    """RUNNING means exec succeeded: at that moment the task's process is already the shell running the command
    (not a wrapper interpreter still starting up)."""
    b, _ = make_backend(n=1)
    seen: list[str] = []

    def on_status(st: TaskStatus) -> None:
        if st.state == TaskState.RUNNING:
            seen.append(os.readlink(f"/proc/{b._tasks[st.task_id].pid}/exe"))

    b._on_status = on_status
    launch(b, spec("r", "sleep 30"))
    assert seen and os.path.realpath(wrapper.SHELL) == os.path.realpath(seen[0])
    b.kill(["r"])


def test_a_task_that_ends_at_once_reports_running_first(
    make_backend: Callable[..., tuple[LocalBackend, Recorder]]
) -> None:
    b, rec = make_backend(n=1)
    for i in range(5):
        launch(b, spec(f"q{i}", "true"))
    for i in range(5):
        rec.wait_terminal(f"q{i}")
        assert [s.state for s in rec.of(f"q{i}")] == [TaskState.RUNNING, TaskState.SUCCEEDED]


def test_cuda_visible_devices_per_task(make_backend: Callable[..., tuple[LocalBackend, Recorder]]) -> None:
    b, rec = make_backend(n=1)
    launch(b, spec("g0", "echo $CUDA_VISIBLE_DEVICES", gpu_ids=(0,)),
           spec("g1", "echo $CUDA_VISIBLE_DEVICES", gpu_ids=(1,)),
           spec("g-none", "echo x${CUDA_VISIBLE_DEVICES}x"))
    for tid in ("g0", "g1", "g-none"):
        assert rec.wait_terminal(tid).state == TaskState.SUCCEEDED
    assert b.read_log("g0", "stdout", 0, 100)[0] == b"0\n"
    assert b.read_log("g1", "stdout", 0, 100)[0] == b"1\n"
    assert b.read_log("g-none", "stdout", 0, 100)[0] == b"xx\n"


def test_tasks_start_with_default_signal_dispositions(
    make_backend: Callable[..., tuple[LocalBackend, Recorder]]
) -> None:
    """Python ignores SIGPIPE; a task must not inherit that (`producer | head` must end the producer)."""
    b, rec = make_backend(n=1)
    launch(b, spec("pipe", "kill -PIPE $$; echo survived"))
    st = rec.wait_terminal("pipe")
    assert st.state == TaskState.FAILED and st.message == "killed by signal 13"
    assert b.read_log("pipe", "stdout", 0, 100)[0] == b""


def test_a_spawner_that_died_is_replaced(make_backend: Callable[..., tuple[LocalBackend, Recorder]]) -> None:
    b, rec = make_backend(n=1)
    assert launch(b, spec("before", "true")).outcome == LaunchOutcome.OK
    for sp in list(b._spawners._all):
        sp.proc.kill()
        sp.proc.wait(5)
    assert launch(b, spec("after", "true")).outcome == LaunchOutcome.OK
    assert rec.wait_terminal("after").state == TaskState.SUCCEEDED


def test_tasks_inherit_only_the_allowed_part_of_the_daemons_environment(
        make_backend: Callable[..., tuple[LocalBackend, Recorder]], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DAEMON_DB_PASSWORD", "hunter2")
    monkeypatch.setenv("NCCL_DEBUG", "INFO")
    monkeypatch.setenv("LC_ALL", "C")
    show = 'echo "[$DAEMON_DB_PASSWORD] [$NCCL_DEBUG] [$LC_ALL] [$MINE] [$PATH]"'
    b, rec = make_backend(n=1)
    launch(b, spec("plain", show, env={"MINE": "m"}))
    assert rec.wait_terminal("plain").state == TaskState.SUCCEEDED
    assert b.read_log("plain", "stdout", 0, 10_000)[0] == f"[] [] [C] [m] [{os.environ['PATH']}]\n".encode()


def test_more_of_the_daemons_environment_can_be_allowed(
        make_backend: Callable[..., tuple[LocalBackend, Recorder]], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DAEMON_DB_PASSWORD", "hunter2")
    monkeypatch.setenv("NCCL_DEBUG", "INFO")
    b, rec = make_backend(n=1, env_allow=("NCCL_*",))
    launch(b, spec("allowed", 'echo "[$DAEMON_DB_PASSWORD] [$NCCL_DEBUG]"'))
    assert rec.wait_terminal("allowed").state == TaskState.SUCCEEDED
    assert b.read_log("allowed", "stdout", 0, 10_000)[0] == b"[] [INFO]\n"


def test_sandboxes_are_owner_only(make_backend: Callable[..., tuple[LocalBackend, Recorder]],
                                  tmp_path: Path) -> None:
    b, rec = make_backend(n=1)
    launch(b, spec("private", "echo secret output", files={"hostfile": "local-0 slots=1\n"}))
    assert rec.wait_terminal("private").state == TaskState.SUCCEEDED
    box = tmp_path / "sandboxes" / "private"
    way = 0o711 if os.geteuid() == 0 else 0o700  # traversable by the users a root daemon runs tasks as (files.py)
    for path, mode in ((tmp_path, way), (tmp_path / "sandboxes", way), (box, 0o700), (box / "work", 0o700),
                       (box / "stdout", 0o600), (box / "stderr", 0o600), (box / "hostfile", 0o600)):
        assert stat.S_IMODE(path.stat().st_mode) == mode, path


def test_tasks_inherit_no_descriptor_of_the_daemon(make_backend: Callable[..., tuple[LocalBackend, Recorder]]) -> None:
    b, rec = make_backend(n=1)
    launch(b, spec("fds", "ls /proc/$$/fd"))
    assert rec.wait_terminal("fds").state == TaskState.SUCCEEDED
    assert sorted(b.read_log("fds", "stdout", 0, 1000)[0].split()) == [b"0", b"1", b"2"]


def test_a_gang_that_cannot_be_accounted_for_is_refused_and_nothing_starts(
    make_backend: Callable[..., tuple[LocalBackend, Recorder]]
) -> None:
    b, rec = make_backend(n=2)
    good = spec("ok", "sleep 30", "local-0")
    bad_gangs = [
        [good, spec("big", "true", "local-1", cpu=100)],
        [good, spec("nohost", "true", "local-9")],
        [good, spec("gpu-dup", "true", "local-1", gpu_ids=(1,)), spec("gpu-dup2", "true", "local-1", gpu_ids=(1,))],
        [good, spec("nogpu", "true", "local-1", gpu_ids=(7,))],
        [good, spec("port-out", "true", "local-1", ports=(31000,))],  # local-1 owns 32000..32999
        [good, spec("ok", "true", "local-1")],
        [good, spec("bad/id", "true", "local-1")],
        [good, spec("file", "true", "local-1", files={"../escape": "x"})],
    ]
    for members in bad_gangs:
        r = launch(b, *members)
        assert r.outcome == LaunchOutcome.REFUSED and r.task_id == members[-1].task_id, r
        assert running_ids(b) == set()
        assert not (b._sandboxes / "ok").exists()
    assert rec.statuses == []
    # A GPU or port held by a running task is refused too, and nothing of the gang starts.
    assert launch(b, spec("holder", "sleep 30", "local-0", gpu_ids=(0,), ports=(31005,))).outcome == LaunchOutcome.OK
    for clash in (spec("c1", "true", "local-0", gpu_ids=(0,)), spec("c2", "true", "local-0", ports=(31005,))):
        assert launch(b, spec("fine", "true", "local-1"), clash).outcome == LaunchOutcome.REFUSED
        assert running_ids(b) == {"holder"}
    b.kill(["holder"])
    assert rec.wait_terminal("holder").state == TaskState.KILLED


def test_one_gang_refused_does_not_stop_the_others_of_a_batch(
    make_backend: Callable[..., tuple[LocalBackend, Recorder]]
) -> None:
    b, rec = make_backend(n=1)
    results = b.launch([gang(spec("a", "true"), gang_id="j/0"), gang(spec("b", "true", cpu=99), gang_id="j/1"),
                        gang(spec("c", "true"), gang_id="j/2")])
    assert [r.outcome for r in results] == [LaunchOutcome.OK, LaunchOutcome.REFUSED, LaunchOutcome.OK]
    assert rec.wait_terminal("a").state == rec.wait_terminal("c").state == TaskState.SUCCEEDED


def test_one_fsync_per_launch_batch(make_backend: Callable[..., tuple[LocalBackend, Recorder]]) -> None:
    b, rec = make_backend(n=2)
    before = b._journal.fsyncs
    results = b.launch([gang(*[spec(f"m{g}-{i}", "true", f"local-{i % 2}", cpu=0.1) for i in range(4)],
                             gang_id=f"j/{g}") for g in range(3)])
    assert all(r.outcome == LaunchOutcome.OK for r in results)
    assert b._journal.fsyncs - before == 1
    for g in range(3):
        for i in range(4):
            assert rec.wait_terminal(f"m{g}-{i}").state == TaskState.SUCCEEDED


def test_a_member_that_cannot_be_started_fails_the_gang_and_stops_the_rest(
    make_backend: Callable[..., tuple[LocalBackend, Recorder]]
) -> None:
    b, rec = make_backend(n=2)
    r = launch(b, spec("first", "sleep 30", "local-0"), spec("second", "echo a\0b", "local-1"))
    assert r.outcome == LaunchOutcome.FAILED and r.task_id == "second" and r.permanent
    assert "cannot be started" in r.message
    wait_for(lambda: running_ids(b) == set())
    time.sleep(0.2)
    assert rec.statuses == []  # nothing of a failed launch is reported: the launch result says it all
    huge = "x" * (200 * 1024)
    r = launch(b, spec("huge", "true", env={"BIG": huge}))
    assert r.outcome == LaunchOutcome.FAILED and r.permanent and "too large" in r.message
    # nothing is held: the same tasks launch fine afterwards
    assert launch(b, spec("first", "true", "local-0"), spec("second", "true", "local-1")).outcome == LaunchOutcome.OK
    assert rec.wait_terminal("first").state == TaskState.SUCCEEDED
    assert rec.wait_terminal("second").state == TaskState.SUCCEEDED


def test_a_member_killed_before_it_started_never_starts(
    make_backend: Callable[..., tuple[LocalBackend, Recorder]], monkeypatch: pytest.MonkeyPatch
) -> None:
    b, rec = make_backend(n=1)
    real_append = b._journal.append

    def append_then_kill(records: list[dict[str, object]], *, durable: bool = False) -> None:
        real_append(records, durable=durable)
        if durable:  # registered and recorded, not started yet: the job is stopped now
            b.kill(["k0", "k1"])

    monkeypatch.setattr(b._journal, "append", append_then_kill)
    r = launch(b, spec("k0", "sleep 30"), spec("k1", "sleep 30"))
    monkeypatch.undo()
    assert r.outcome == LaunchOutcome.REFUSED and "killed before" in r.message
    for tid in ("k0", "k1"):
        assert rec.wait_terminal(tid).state == TaskState.KILLED
        assert not (b._sandboxes / tid / "pids").exists()  # never started
    assert running_ids(b) == set()


def test_a_gang_killed_while_it_is_being_started_is_stopped_at_once(
    make_backend: Callable[..., tuple[LocalBackend, Recorder]], monkeypatch: pytest.MonkeyPatch
) -> None:
    b, rec = make_backend(n=1, grace=3600.0)  # a kill that waited for the grace would never end in the waits below
    real_spawn = b._spawners.spawn_many

    def spawn_then_kill(tasks: list[dict[str, object]]) -> list[object]:
        out = real_spawn(tasks)
        b.kill(["s0", "s1"])  # the job is stopped while its members are being started
        return out  # type: ignore[return-value]

    monkeypatch.setattr(b._spawners, "spawn_many", spawn_then_kill)
    r = launch(b, spec("s0", "sleep 3600"), spec("s1", "sleep 3600"))
    monkeypatch.undo()
    assert r.outcome == LaunchOutcome.REFUSED
    pgids = [wrapper.read_pid(b._sandboxes / t) for t in ("s0", "s1")]
    for tid in ("s0", "s1"):
        assert rec.wait_terminal(tid).state == TaskState.KILLED
    wait_for(lambda: all(group_gone(p) for p in pgids if p))
    wait_for(lambda: running_ids(b) == set())  # SIGKILLed at once, not after the hour's grace


def test_kill_stops_the_whole_process_group(make_backend: Callable[..., tuple[LocalBackend, Recorder]]) -> None:
    b, rec = make_backend(grace=2.0)
    launch(b, spec("k", "sleep 100 & sleep 100"))
    pgid = wrapper_pgid(b, "k")
    sandbox = b._sandboxes / "k"
    wait_for(lambda: (sandbox / "pids").exists())
    assert not group_gone(pgid)
    b.kill(["k", "unknown-id"])
    st = rec.wait_terminal("k")
    assert st.state == TaskState.KILLED
    wait_for(lambda: group_gone(pgid))
    assert running_ids(b) == set()


def test_a_sigterm_lost_at_an_exec_is_sent_again(
    make_backend: Callable[..., tuple[LocalBackend, Recorder]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SIGTERM that lands while a process is being replaced (the wrapper forking the command's shell; here the
    command itself) must not leave the task running until the SIGKILL escalation: it is sent again."""
    # here the window (the shell running its trap, then exec) is as long as the scheduler makes it, far wider than
    # the wrapper's fork-to-exec: give the repeat time enough that a loaded machine still lands it after the exec
    monkeypatch.setattr(local_backend_module, "TERM_AGAIN_S", 1.0)
    b, rec = make_backend(grace=3600.0)  # no SIGKILL escalation within the wait below: only the repeated SIGTERM
    launch(b, spec("slippery", "trap : TERM; echo ready; sleep 3600; exec sleep 3600"))
    wait_for(lambda: b.read_log("slippery", "stdout", 0, 100)[0] == b"ready\n")
    b.kill(["slippery"])
    assert rec.wait_terminal("slippery").state == TaskState.KILLED


def test_kill_escalates_to_sigkill(make_backend: Callable[..., tuple[LocalBackend, Recorder]]) -> None:
    b, rec = make_backend(grace=0.3)
    launch(b, spec("stubborn", "trap '' TERM; echo ready; sleep 100 & wait"))
    pgid = wrapper_pgid(b, "stubborn")
    wait_for(lambda: b.read_log("stubborn", "stdout", 0, 100)[0] == b"ready\n")
    b.kill(["stubborn"])
    st = rec.wait_terminal("stubborn")
    assert st.state == TaskState.KILLED
    wait_for(lambda: group_gone(pgid))


def test_a_task_that_finished_before_its_kill_succeeded(
    make_backend: Callable[..., tuple[LocalBackend, Recorder]]
) -> None:
    b, rec = make_backend(n=1)
    launch(b, spec("done", "true"))
    assert rec.wait_terminal("done").state == TaskState.SUCCEEDED
    b.kill(["done"])  # too late: nothing happens
    assert [s.state for s in rec.of("done")] == [TaskState.RUNNING, TaskState.SUCCEEDED]


def test_offers_reflect_allocations(make_backend: Callable[..., tuple[LocalBackend, Recorder]]) -> None:
    b, rec = make_backend(n=2)
    before = {o.hostname: o for o in b.offers(with_ids=True)}
    o0 = before["local-0"]
    assert o0.free.cpu == 4 and o0.free.gpu == 2 and o0.gpu_ids == (0, 1)
    assert o0.ports == tuple(range(31000, 32000)) and o0.free.ports == 1000
    assert o0.has_gpus and o0.capacity.ports == 1000 and o0.address == "127.0.0.1"
    counts = b.offers(["local-0"])
    assert [o.hostname for o in counts] == ["local-0"] and counts[0].gpu_ids == () and counts[0].free == o0.free
    launch(b, spec("a", "sleep 30", "local-0", cpu=3, mem=1000, gpu_ids=(1,), ports=(31000, 31002)))
    o0 = {o.hostname: o for o in b.offers(with_ids=True)}["local-0"]
    assert o0.free.cpu == 1 and o0.free.mem == 4096 - 1000
    assert o0.gpu_ids == (0,) and o0.free.gpu == 1
    assert 31000 not in o0.ports and 31002 not in o0.ports and 31001 in o0.ports and len(o0.ports) == 998
    assert {o.hostname: o for o in b.offers(with_ids=True)}["local-1"] == before["local-1"]
    (h0,) = [h for h in b.hosts() if h.hostname == "local-0"]
    assert h0.task_ids == ("a",) and h0.allocated.cpu == 3 and h0.allocated.gpu == 1
    b.kill(["a"])
    rec.wait_terminal("a")
    assert {o.hostname: o for o in b.offers(with_ids=True)} == before


# ------------------------------------------------------------------------------------------------ adoption


def test_restarted_backend_adopts_running_task(
    tmp_path: Path, make_backend: Callable[..., tuple[LocalBackend, Recorder]]
) -> None:
    a, rec_a = make_backend(n=1, grace=1.0)
    launch(a, spec("long", "sleep 30", gpu_ids=(0,), ports=(31001,)), spec("quick", "sleep 0.5; exit 4"))
    pgid = wrapper_pgid(a, "long")
    a.stop()  # the daemon "dies": nothing is killed
    wait_for(lambda: (tmp_path / "sandboxes" / "quick" / "exit").exists())
    assert not group_gone(pgid)

    b, rec_b = make_backend(n=1, grace=1.0)
    assert running_ids(b) == {"long"}
    rc = b.reconcile(["long", "quick"])
    assert rc["long"].state == TaskState.RUNNING
    assert rc["quick"].state == TaskState.FAILED and rc["quick"].exit_code == 4
    # The task that ended while the daemon was down is reported by the new backend.
    assert rec_b.wait_terminal("quick").state == TaskState.FAILED
    o0 = b.offers(with_ids=True)[0]
    assert o0.gpu_ids == (1,) and 31001 not in o0.ports
    b.kill(["long"])
    assert rec_b.wait_terminal("long").state == TaskState.KILLED
    wait_for(lambda: group_gone(pgid))
    assert rec_a.terminal("long") is None
    # the journal was compacted to the live tasks at the restart, then records what happened since
    lines = [json.loads(x) for x in (tmp_path / "journal").read_text().splitlines()]
    assert {r["task"] for r in lines} == {"long"}


def test_a_kill_requested_before_a_restart_is_carried_out_after_it(
    tmp_path: Path, make_backend: Callable[..., tuple[LocalBackend, Recorder]]
) -> None:
    a, _ = make_backend(n=1, grace=0.3)
    launch(a, spec("stubborn", "trap '' TERM; echo ready; sleep 100 & wait"))
    pgid = wrapper_pgid(a, "stubborn")
    wait_for(lambda: a.read_log("stubborn", "stdout", 0, 100)[0] == b"ready\n")
    a.kill(["stubborn"])
    a.stop()  # before the SIGKILL escalation
    b, rec_b = make_backend(n=1, grace=0.3)
    assert rec_b.wait_terminal("stubborn").state == TaskState.KILLED
    wait_for(lambda: group_gone(pgid))


def test_adopted_task_whose_process_vanished_is_lost(
    tmp_path: Path, make_backend: Callable[..., tuple[LocalBackend, Recorder]]
) -> None:
    a, _ = make_backend(n=1)
    launch(a, spec("gone", "sleep 30"))
    pid = wrapper_pgid(a, "gone")
    a.stop()
    os.killpg(pid, signal.SIGKILL)  # wrapper killed before it could record an exit
    wait_for(lambda: not wrapper.is_wrapper(pid, tmp_path / "sandboxes" / "gone"))
    b, rec_b = make_backend(n=1)
    st = rec_b.wait_terminal("gone")
    assert st.state == TaskState.LOST and st.reason == "process vanished"
    assert b.reconcile(["gone"])["gone"].state == TaskState.LOST


def test_adopted_task_on_a_removed_host_is_killed(
    tmp_path: Path, make_backend: Callable[..., tuple[LocalBackend, Recorder]]
) -> None:
    a, _ = make_backend(n=2)
    launch(a, spec("orphan", "sleep 30", "local-1"))
    pgid = wrapper_pgid(a, "orphan")
    a.stop()
    b, rec_b = make_backend(n=1)  # local-1 is gone from the configuration
    st = rec_b.wait_terminal("orphan")
    assert st.state == TaskState.KILLED and st.reason == "host removed"
    assert running_ids(b) == set()
    wait_for(lambda: group_gone(pgid))


def test_death_by_foreign_signal_fails(make_backend: Callable[..., tuple[LocalBackend, Recorder]]) -> None:
    b, rec = make_backend()
    launch(b, spec("sig", "kill -9 $$"))
    st = rec.wait_terminal("sig")
    assert st.state == TaskState.FAILED and st.message == "killed by signal 9"


def test_detect_gpus_with_a_fake_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert detect_gpus() == []  # no nvidia-smi at all
    fake = tmp_path / "nvidia-smi"
    fake.write_text(
        "#!/bin/sh\n"
        'case "$1" in\n'
        "  --query-gpu=index,name) printf '0, NVIDIA H100 80GB HBM3\\n1, NVIDIA H100 80GB HBM3\\n' ;;\n"
        "  *) exit 9 ;;\n"
        "esac\n"
    )
    fake.chmod(0o755)
    assert detect_gpus() == [0, 1]
    assert machine_resources(tmp_path).gpu == 2
    # the one real host is labelled with the model nvidia-smi names, unless the operator gave one
    (host,) = make_local_hosts(None, None, data_dir=tmp_path)
    assert host.gpu_ids == (0, 1) and host.labels["gpu_model"] == "h100"
    (host,) = make_local_hosts(None, None, data_dir=tmp_path, labels={"gpu_model": "a100"})
    assert host.labels["gpu_model"] == "a100"
    fake.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    assert detect_gpus() == []


FAILING_NVIDIA_SMI = [
    # (the script, the host's gpu_error label, what the warning says besides it)
    ("echo 'NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver.' >&2\nexit 9\n",
     "nvidia-smi exited with status 9", "NVIDIA-SMI has failed because it could not communicate"),
    ("echo 'Failed to initialize NVML: Driver/library version mismatch'\nexit 18\n",  # its errors go to stdout
     "nvidia-smi exited with status 18", "Driver/library version mismatch"),
    ("kill -SEGV $$\n", "nvidia-smi was killed by signal 11", "SIGSEGV; printed nothing"),
    ("sleep 3600\n", "nvidia-smi did not answer within 1 s", "killed"),  # sleep outlives the shell it was forked by
    ("printf '\\377\\376\\000garbage\\n'\n", "nvidia-smi listed no GPU", "garbage"),  # exit 0, nothing readable
    ("exit 0\n", "nvidia-smi listed no GPU", "printed nothing"),
]


@pytest.mark.parametrize(("script", "label", "detail"), FAILING_NVIDIA_SMI)
def test_an_nvidia_smi_that_fails_is_a_warning_and_a_label_not_silence(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, script: str, label: str,
        detail: str) -> None:
    # nvidia-smi there but failing (a broken driver) was the same as no nvidia-smi: a cluster of 0 GPUs, no reason
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    monkeypatch.setattr(gpus_module, "_NVIDIA_SMI_TIMEOUT_S", 1.0)
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\n" + script)
    fake.chmod(0o755)
    found: list[object] = []
    with caplog.at_level("WARNING", logger=gpus_module.__name__):
        # in a thread: a detection that did not cut a hung nvidia-smi (`sleep 3600`) would never end the join
        t = threading.Thread(target=lambda: found.extend(make_local_hosts(None, None, data_dir=tmp_path)))
        t.start()
        t.join(60)
    assert not t.is_alive(), "the detection waited for a hung nvidia-smi"
    (host,) = cast(list[HostConfig], found)
    assert host.gpu_ids == () and host.capacity.gpu == 0
    assert host.labels["gpu_error"] == label
    (warning,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert label in warning and detail in warning and str(fake) in warning, warning
    # simulated hosts the size of this machine say so too
    caplog.clear()
    with caplog.at_level("WARNING", logger=gpus_module.__name__):
        hosts = make_local_hosts(2, None, data_dir=tmp_path)
    assert [h.labels.get("gpu_error") for h in hosts] == [label, label]
    assert len([r for r in caplog.records if r.levelname == "WARNING"]) == 1
    # a GPU label for a host nvidia-smi gave none: the refusal says why it has none
    with pytest.raises(InvalidArgument, match=f"labels.gpu_model: the hosts have no GPUs .*{label}"):
        make_local_hosts(None, None, data_dir=tmp_path, labels={"gpu_model": "h100"})


def test_no_nvidia_smi_is_no_gpus_quietly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with caplog.at_level("DEBUG", logger=gpus_module.__name__):
        (host,) = make_local_hosts(None, None, data_dir=tmp_path)
        (sim,) = make_local_hosts(1, None, data_dir=tmp_path)
    assert host.gpu_ids == () and "gpu_error" not in host.labels and "gpu_error" not in sim.labels
    assert caplog.records == []


def test_a_label_the_backend_sets_is_refused_from_the_operator() -> None:
    with pytest.raises(InvalidArgument, match="label 'gpu_error' is set by the backend"):
        parse_labels("gpu_error=none", "--local-host-labels")


def test_gpu_model_from_the_names_nvidia_smi_prints() -> None:
    names = parse_nvidia_smi_names("0, NVIDIA H100 80GB HBM3\n1, Tesla V100-SXM2-32GB\nwarning: x\n\n")
    assert names == ["NVIDIA H100 80GB HBM3", "Tesla V100-SXM2-32GB"]
    assert [gpu_model_from_name(n) for n in names] == ["h100", "v100"]
    assert gpu_model_from_name("NVIDIA A10G") == "a10g"
    assert gpu_model_from_name("NVIDIA A100-SXM4-40GB") == "a100"  # not a10
    assert gpu_model_from_name("Tesla T4") == "t4"
    assert gpu_model_from_name("NVIDIA L4") == "l4"
    assert gpu_model_from_name("NVIDIA GeForce RTX 4090") is None  # not in the table: the default stays
    assert gpu_model_of(["Tesla T4", "Tesla T4"]) == "t4"
    assert gpu_model_of(["Tesla T4", "NVIDIA L4"]) is None  # mixed: a host has one model
    assert gpu_model_of(["Tesla T4", "NVIDIA GeForce RTX 4090"]) is None
    assert gpu_model_of([]) is None


def _journal_start(data: Path, task_id: str, host: str) -> None:
    data.mkdir(parents=True, exist_ok=True)
    with open(data / "journal", "a") as f:
        f.write(json.dumps({"op": "start", "task": task_id, "job": "j", "instance": 0, "attempt": 1, "host": host,
                            "sandbox": str(data / "sandboxes" / task_id), "res": [1, 64, 0, 0, 0], "gpus": [],
                            "ports": []}) + "\n")


def test_task_spawned_but_not_yet_journaled_with_its_pid_is_adopted_after_a_crash(tmp_path: Path) -> None:
    """A daemon killed between recording the launch and recording the spawned pid must not orphan the task: the
    wrapper wrote its pid into the sandbox."""
    hosts = make_local_hosts(1, Resources(cpu=2, mem=1024))
    data = tmp_path / "local"
    sandbox = data / "sandboxes" / "j-0-1"
    (sandbox / wrapper.WORK_DIR).mkdir(parents=True)
    _journal_start(data, "j-0-1", hosts[0].hostname)
    pid = spawner.spawn(str(sandbox), "sleep 30", dict(os.environ))
    try:
        b = LocalBackend(data, hosts)
        rec = Recorder()
        b.start(rec)
        try:
            assert b.reconcile(["j-0-1"])["j-0-1"].state == TaskState.RUNNING
            assert running_ids(b) == {"j-0-1"}
            b.kill(["j-0-1"])
            assert rec.wait_terminal("j-0-1").state == TaskState.KILLED
        finally:
            b.stop()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def test_a_launch_recorded_but_never_spawned_is_lost_with_a_clear_message(tmp_path: Path) -> None:
    hosts = make_local_hosts(1, Resources(cpu=2, mem=1024))
    data = tmp_path / "local"
    _journal_start(data, "j-0-1", hosts[0].hostname)
    b = LocalBackend(data, hosts)
    rec = Recorder()
    b.start(rec)
    try:
        st = rec.wait_terminal("j-0-1")
        assert st.state == TaskState.LOST and "never started" in st.message
    finally:
        b.stop()


def test_tasks_of_an_earlier_release_are_adopted(tmp_path: Path) -> None:
    """Upgrading the daemon while tasks run: the index and JSON files of the Python runner of earlier releases
    are read once."""
    hosts = make_local_hosts(1, Resources(cpu=2, mem=1024))
    data = tmp_path / "local"
    old = data / "sandboxes" / "old-0-1"
    (old / "work").mkdir(parents=True)
    # an earlier release's runner: `python -m peloton.hostmgr.local.runner <sandbox>` (its command line names it)
    proc = subprocess.Popen(["/bin/sh", "-c", "sleep 30; true", "runner", str(old)], start_new_session=True)
    done = data / "sandboxes" / "old-1-1"
    (done / "work").mkdir(parents=True)
    (done / "exit").write_text(json.dumps({"exit_code": 0, "signal": None, "finished_at": time.time()}))
    for sb in (old, done):
        (sb / "task.json").write_text(json.dumps({"task_id": sb.name, "job_id": "old", "instance": 0, "attempt": 1,
                                                  "hostname": hosts[0].hostname, "resources": {"cpu": 1, "mem": 64},
                                                  "gpu_ids": [], "ports": []}))
    (data / "local-running.json").write_text(json.dumps({"tasks": {
        "old-0-1": {"sandbox": str(old), "hostname": hosts[0].hostname, "pid": proc.pid, "start_time": None,
                    "kill_requested": None},
        "old-1-1": {"sandbox": str(done), "hostname": hosts[0].hostname, "pid": 999_999_999, "start_time": None,
                    "kill_requested": None},
    }}))
    b = LocalBackend(data, hosts)
    rec = Recorder()
    b.start(rec)
    try:
        assert running_ids(b) == {"old-0-1"}
        assert rec.wait_terminal("old-1-1").state == TaskState.SUCCEEDED
        assert not (data / "local-running.json").exists()
        b.kill(["old-0-1"])
        assert rec.wait_terminal("old-0-1").state == TaskState.KILLED
    finally:
        b.stop()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def test_the_journal_is_compacted_while_running(
    tmp_path: Path, make_backend: Callable[..., tuple[LocalBackend, Recorder]], monkeypatch: pytest.MonkeyPatch
) -> None:
    import peloton.hostmgr.local.journal as journal_mod

    monkeypatch.setattr(journal_mod, "COMPACT_AFTER", 10)
    b, rec = make_backend(n=1)
    launch(b, spec("keeper", "sleep 30"))
    for i in range(8):
        launch(b, spec(f"x{i}", "true"))
        rec.wait_terminal(f"x{i}")
    wait_for(lambda: len((tmp_path / "journal").read_text().splitlines()) < 10)
    replayed = b._journal.replay()
    assert "keeper" in replayed and "final" not in replayed["keeper"]
    b.kill(["keeper"])


def test_a_member_reports_its_speed_in_its_metrics_file_and_only_a_regular_file_is_read(
        make_backend: Callable[..., tuple[LocalBackend, Recorder]]) -> None:
    b, rec = make_backend()
    launch(b, spec("t-m", 'echo "step_time=0.9" >> "$PELOTON_METRICS_FILE"; '
                          'echo "step_time=0.52 local_bsz=32" >> "$PELOTON_METRICS_FILE"'),
           spec("t-s", 'ln -s /etc/passwd "$PELOTON_METRICS_FILE"', "local-1"))
    assert rec.wait_terminal("t-m").state == TaskState.SUCCEEDED
    assert rec.wait_terminal("t-s").state == TaskState.SUCCEEDED
    data, size = b.read_log("t-m", "metrics", 0, 4096)
    assert data == b"step_time=0.9\nstep_time=0.52 local_bsz=32\n" and size == len(data)
    assert b.read_log("t-m", "metrics", 0, 10) == (data[-10:], size)  # the tail: the last lines count
    assert b.read_log("t-s", "metrics", 0, 4096) == (b"", 0)  # a symlink is not followed
    assert b.read_log("unknown", "metrics", 0, 4096) == (b"", 0)


def test_parse_proc_net_reads_each_sockets_local_port() -> None:
    from peloton.hostmgr.local.sockets import parse_ports
    table = (
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
        "   0: 0100007F:7918 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1\n"
        "   1: 0100007F:D431 0100007F:1538 01 00000000:00000000 00:00000000 00000000     0        0 2\n"
        "   2: 00000000000000000000000001000000:0000 00000000000000000000000000000000:0000 07 0 0 0 0 0 0\n"
        "garbage\n")
    assert parse_ports(table) == {0x7918, 0xD431}  # 31000 (listening), 54321 (a connection); port 0 is unbound


def _held_port_with_two_free_after() -> socket.socket:
    """A listening socket on a port whose next two ports are free now (other tests' daemons and clients on this
    machine take ports too: the test's free port must not be one of theirs)."""
    for _ in range(50):
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        probe.listen()
        held = probe.getsockname()[1]
        free = True
        for port in (held + 1, held + 2):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    free = False
        if free:
            return probe
        probe.close()
    raise AssertionError("no port with two free ports after it")


def test_a_port_another_socket_holds_refuses_the_gang_and_is_not_offered_again(
        make_backend: Callable[..., tuple[LocalBackend, Recorder]]) -> None:
    # ports the machine's network shares with everything else: one held by a plain socket is not handed to a task
    probe = _held_port_with_two_free_after()
    held = probe.getsockname()[1]
    try:
        hosts = make_local_hosts(1, HOST_RES, port_base=held, ports_per_host=3)
        b, rec = make_backend(hosts=hosts)
        (offer,) = b.offers(with_ids=True)
        assert held in offer.ports  # (nothing tells the backend before a launch)
        r = launch(b, spec("t1", "true", ports=(held,)))
        assert r.outcome == LaunchOutcome.REFUSED, r
        assert f"port {held}" in r.message and "held by another socket" in r.message
        assert rec.of("t1") == [] and b.running() == []  # nothing started, nothing accounted
        (offer,) = b.offers(with_ids=True)
        assert held not in offer.ports and offer.ports == (held + 1, held + 2)
        assert offer.free.ports == 2
        r = launch(b, spec("t2", "true", ports=(held + 1,)))  # a port nobody holds: started
        assert r.outcome == LaunchOutcome.OK, r
        rec.wait_terminal("t2")
    finally:
        probe.close()


def _wrappers_alive(b: LocalBackend, task_ids: list[str]) -> list[str]:
    """The tasks whose wrapper (as its sandbox's `pids` names it) still runs."""
    out = []
    for tid in task_ids:
        pid = wrapper.read_pid(b._sandboxes / tid)
        if pid and wrapper.is_wrapper(pid, b._sandboxes / tid, attempts=1):
            out.append(tid)
    return out


def test_a_spawner_that_dies_mid_launch_leaves_no_member_running_and_frees_nothing_still_held(
    make_backend: Callable[..., tuple[LocalBackend, Recorder]]
) -> None:
    """The spawner starting a gang dies after it started some members (here killed by the first member's command,
    which runs at once: no cgroup, no gate). Whether it started the last one is unknown: a wrapper it started a
    moment before it died has not written its pid yet when the daemon looks. Every member it started is stopped,
    and a member's resources (its GPUs) are not offered again while its wrapper still runs."""
    b, rec = make_backend(n=1, spawners=1, task_cgroups="off", warm_wrappers=0)
    ids = [f"m{i}" for i in range(24)]
    # the command's $PPID is its wrapper, whose parent is the spawner (a child subreaper is forked by it)
    killer = "kill -KILL $(cut -d' ' -f4 /proc/$PPID/stat); sleep 30"
    specs = [spec(ids[0], killer, cpu=0.1, mem=1)] + [spec(t, "sleep 30", cpu=0.1, mem=1) for t in ids[1:]]
    r = launch(b, *specs)
    assert r.outcome == LaunchOutcome.FAILED and "died" in r.message
    started = [t for t in ids if (b._sandboxes / t).is_dir()]  # (the spawner made their sandboxes)
    # what it started is stopped, and held in the book until it is gone
    deadline = time.monotonic() + 3
    while True:
        (offer,) = b.offers()  # (read first: a wrapper alive after it was alive then)
        alive = _wrappers_alive(b, started)
        if not alive:
            break
        assert HOST_RES.cpu - offer.free.cpu >= 0.1 * len(alive) - 1e-6, f"{alive} run on, released by the book"
        assert time.monotonic() < deadline, f"{alive} still run"
        time.sleep(0.05)
    wait_for(lambda: b.offers()[0].free.cpu == HOST_RES.cpu)  # and released once gone
    assert rec.statuses == []


def test_a_member_that_makes_its_work_directory_a_link_reads_no_other_tasks_metrics(
        make_backend: Callable[..., tuple[LocalBackend, Recorder]]) -> None:
    """The daemon reads a member's metrics file as root: its `work/` is the task's own, and a link put there to
    another task's sandbox (or anywhere) must not be followed, or one tenant reads another's numbers."""
    b, rec = make_backend()
    launch(b, spec("victim", 'echo "step_time=0.25 local_bsz=64" >> "$PELOTON_METRICS_FILE"'))
    assert rec.wait_terminal("victim").state == TaskState.SUCCEEDED
    assert b.read_log("victim", "metrics", 0, 4096)[0] != b""
    launch(b, spec("snoop", f'cd .. && rm -rf work && ln -s {b._sandboxes / "victim" / "work"} work', "local-1"))
    assert rec.wait_terminal("snoop").state == TaskState.SUCCEEDED
    assert (b._sandboxes / "snoop" / "work").is_symlink()
    assert b.read_log("snoop", "metrics", 0, 4096) == (b"", 0)


def test_a_spawner_that_cannot_be_started_fails_the_launch_and_holds_nothing(
        make_backend: Callable[..., tuple[LocalBackend, Recorder]], monkeypatch: pytest.MonkeyPatch) -> None:
    """No spawner can be started (here its program is missing; in life a fork refused for want of memory or
    processes): the launch fails like one whose spawner died, registering nothing for good, so that the same gang
    is not refused as `already running` for ever, its resources lost, once spawners start again."""
    b, rec = make_backend(n=1)
    monkeypatch.setattr(sys, "executable", "/nonexistent/python")
    r = launch(b, spec("c0", "true", gpu_ids=(0,)), spec("c1", "true", gpu_ids=(1,)))
    monkeypatch.undo()
    assert r.outcome == LaunchOutcome.FAILED and not r.permanent, r
    assert b.offers()[0].free.gpu == HOST_RES.gpu
    assert launch(b, spec("c0", "true", gpu_ids=(0,)), spec("c1", "true", gpu_ids=(1,))).outcome == LaunchOutcome.OK
    assert rec.wait_terminal("c0").state == TaskState.SUCCEEDED


def test_a_spawners_share_of_more_members_than_one_message_passes_descriptors_for_starts(
        make_backend: Callable[..., tuple[LocalBackend, Recorder]]) -> None:
    """A spawner hands the daemon a pidfd per member it started, along its reply; the kernel passes at most 253
    descriptors a message (SCM_MAX_FD; more is EINVAL). A share of more members than that (one spawner free, a
    big gang) made the spawner die at its reply, and the gang fail at every attempt."""
    b, rec = make_backend(n=1, spawners=1)
    ids = [f"w{i}" for i in range(300)]
    assert launch(b, *(spec(t, "sleep 30", cpu=0.01, mem=1) for t in ids)).outcome == LaunchOutcome.OK
    assert running_ids(b) == set(ids)
    b.kill(ids, grace_s=0)
    for t in ids:
        assert rec.wait_terminal(t, timeout=30).state == TaskState.KILLED


_LOW_FD_LIMIT_LAUNCH = r"""
import json, resource, sys, tempfile
from pathlib import Path
from peloton.domain.launch import GangLaunch, LaunchSpec
from peloton.domain.resources import Resources
from peloton.hostmgr.local.backend import LocalBackend, make_local_hosts
data = Path(sys.argv[1])
b = LocalBackend(data, make_local_hosts(1, Resources(cpu=1000, mem=100000)), default_user=sys.argv[2] or None,
                 spawners=1)
b.start(lambda st: None)
specs = tuple(LaunchSpec(task_id=f"j-{i}-1", job_id="j", instance=i, attempt=1, hostname="local-0",
                         command="sleep 30", env={}, resources=Resources(cpu=1, mem=1), gpu_ids=(), ports=(),
                         files={}) for i in range(400))
(r,) = b.launch([GangLaunch("j/0", 1, specs)])
b.kill([s.task_id for s in specs], grace_s=0)
print(json.dumps({"outcome": r.outcome.value, "message": r.message, "permanent": r.permanent,
                  "limit": resource.getrlimit(resource.RLIMIT_NOFILE)[0]}))
b.stop()
"""


def test_a_gang_of_hundreds_of_members_starts_under_a_soft_descriptor_limit_of_1024(tmp_path: Path) -> None:
    """A daemon started by hand has a soft limit of 1024 open descriptors (the systemd unit gives 1048576); its
    spawner holds a few per member it starts (a pidfd, a gate), and ran out at a few hundred: the gang failed, and
    for good, as a user lookup that could not open /etc/passwd read as `there is no user`. The local backend raises
    the soft limit to the hard one (the spawners inherit it)."""
    import resource

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 4096:
        pytest.skip(f"the hard limit of open descriptors here is {hard}")

    def low() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))

    try:
        out = subprocess.run([sys.executable, "-c", _LOW_FD_LIMIT_LAUNCH, str(tmp_path), TEST_TASK_USER or ""],
                             capture_output=True, text=True, timeout=120, preexec_fn=low,
                             cwd=Path(__file__).resolve().parents[2])
    finally:
        kill_leftovers(tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["outcome"] == "OK", got
    assert got["limit"] > 1024


def _start_with_pid(pid: int) -> subprocess.Popen[bytes] | None:
    """A process of another session, given pid `pid` (ns_last_pid, root only), or None when that cannot be
    arranged (not root, the pid taken meanwhile by another process of this machine)."""
    for _ in range(20):
        try:
            Path("/proc/sys/kernel/ns_last_pid").write_text(str(pid - 1))
        except OSError:
            return None
        p = subprocess.Popen(["sleep", "30"], start_new_session=True)
        if p.pid == pid:
            return p
        p.kill()
        p.wait()
    return None


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a process a chosen pid needs root")
def test_the_end_of_a_task_signals_no_process_group_given_its_wrappers_pid_since(
        make_backend: Callable[..., tuple[LocalBackend, Recorder]]) -> None:
    """Once a wrapper has ended (and was reaped at once: its spawner ignores SIGCHLD), its pid may be any new
    process's, a session leader's too (another task's wrapper, a login), before the daemon handles the end. What
    the task left in its group is killed then only if the pid is not a live process of its own: a group of that
    number is then the stranger's (a pid is not given out again while a group has its number)."""
    b, rec = make_backend(n=1)
    assert launch(b, spec("short", "sleep 0.3")).outcome == LaunchOutcome.OK
    wait_for(lambda: wrapper.read_pid(b._sandboxes / "short") > 0)
    pid = wrapper.read_pid(b._sandboxes / "short")
    stranger = None
    with b._lock:  # the monitor sees the end and waits here: the pid is free meanwhile
        deadline = time.monotonic() + DEADLINE_S
        while Path(f"/proc/{pid}").exists():
            assert time.monotonic() < deadline
            time.sleep(0.01)
        stranger = _start_with_pid(pid)
    try:
        if stranger is None:
            pytest.skip(f"pid {pid} could not be given to another process")
        assert rec.wait_terminal("short").state == TaskState.SUCCEEDED
        time.sleep(0.2)
        assert stranger.poll() is None, "a process that was given the ended wrapper's pid was killed"
    finally:
        if stranger is not None:
            stranger.kill()
            stranger.wait()
