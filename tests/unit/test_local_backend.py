"""The local backend with real subprocesses (sandboxes under tmp_path)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import peloton.hostmgr.local.backend as backend_mod
from peloton.domain.resources import Resources
from peloton.domain.states import TaskState
from peloton.errors import InvalidArgument, NotFound
from peloton.hostmgr.backend import LaunchError, LaunchSpec, TaskStatus
from peloton.hostmgr.local.backend import LocalBackend, LocalHostConfig, make_local_hosts
from peloton.hostmgr.local.gpus import (
    detect_gpu_model,
    detect_gpus,
    machine_resources,
    parse_meminfo_total_mib,
    parse_nvidia_smi_indices,
    parse_nvidia_smi_names,
)

DEADLINE_S = 10.0
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


@pytest.fixture
def make_backend(tmp_path: Path) -> Iterator[Callable[..., tuple[LocalBackend, Recorder]]]:
    made: list[LocalBackend] = []

    def make(n: int = 2, resources: Resources = HOST_RES, grace: float = 5.0,
             hosts: list[LocalHostConfig] | None = None) -> tuple[LocalBackend, Recorder]:
        b = LocalBackend(tmp_path, hosts if hosts is not None else make_local_hosts(n, resources),
                         kill_grace_s=grace, poll_interval_s=0.05)
        rec = Recorder()
        b.start(rec)
        made.append(b)
        return b, rec

    yield make
    # Kill every process group any backend of the test still knows of.
    for b in made:
        b.stop()
    for sandbox in (tmp_path / "sandboxes").glob("*"):
        pids = sandbox / "pids"
        if pids.exists():
            try:
                pgid = int(json.loads(pids.read_text())["wrapper_pid"])
            except (ValueError, KeyError):
                continue
            if not (sandbox / "exit").exists() or not group_gone(pgid):
                try:
                    os.killpg(pgid, signal.SIGKILL)
                except OSError:
                    pass
    for b in made:
        for rt in b._running.values():
            if rt.popen is not None:
                rt.popen.wait(timeout=5)


def wrapper_pgid(backend: LocalBackend, task_id: str) -> int:
    return backend._running[task_id].pid


# ------------------------------------------------------------------------------------------------ pure helpers


def test_parse_nvidia_smi_indices() -> None:
    assert parse_nvidia_smi_indices("0\n1\n2\n3\n") == [0, 1, 2, 3]
    assert parse_nvidia_smi_indices(" 1 \n0\n\n") == [0, 1]
    assert parse_nvidia_smi_indices("") == []
    assert parse_nvidia_smi_indices("NVIDIA-SMI has failed because it couldn't communicate\n") == []
    assert parse_nvidia_smi_indices("0, NVIDIA H100\n1, NVIDIA H100\n") == [0, 1]
    assert parse_nvidia_smi_names("NVIDIA H100 80GB HBM3\nNVIDIA H100 80GB HBM3\n") == ["NVIDIA H100 80GB HBM3"] * 2


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


# ------------------------------------------------------------------------------------------------ processes


def test_two_tasks_run_and_succeed_with_stdout(make_backend: Callable[..., tuple[LocalBackend, Recorder]]) -> None:
    b, rec = make_backend()
    b.launch([
        spec("t-a", "echo hello-a; cat $PELOTON_HOSTFILE", "local-0", files={"hostfile": "h1 slots=1\n"}),
        spec("t-b", "echo hello-b >&2; echo $MY_VAR; pwd", "local-1", env={"MY_VAR": "v1"}),
    ])
    assert [s.state for s in rec.of("t-a")][:1] == [TaskState.RUNNING]
    assert rec.of("t-a")[0].hostname == "local-0"
    a = rec.wait_terminal("t-a")
    bb = rec.wait_terminal("t-b")
    assert a.state == TaskState.SUCCEEDED and a.exit_code == 0
    assert bb.state == TaskState.SUCCEEDED and bb.hostname == "local-1"
    assert b.read_log("t-a", "stdout", 0) == b"hello-a\nh1 slots=1\n"
    assert b.read_log("t-b", "stderr", 0) == b"hello-b\n"
    out = b.read_log("t-b", "stdout", 0).decode().splitlines()
    assert out[0] == "v1"
    assert out[1].endswith("sandboxes/t-b/work")
    assert b.read_log("t-a", "stdout", 3) == b"=1\n"
    assert b.running_task_ids() == set()
    with pytest.raises(NotFound):
        b.read_log("nope", "stdout", 10)
    with pytest.raises(InvalidArgument):
        b.read_log("t-a", "stdin", 10)
    rc = b.reconcile(["t-a", "nope"])
    assert rc["t-a"].state == TaskState.SUCCEEDED
    assert rc["nope"].state == TaskState.LOST and rc["nope"].reason == "unknown to the local backend"


def test_nonzero_exit_fails(make_backend: Callable[..., tuple[LocalBackend, Recorder]]) -> None:
    b, rec = make_backend()
    b.launch([spec("t-f", "exit 3")])
    st = rec.wait_terminal("t-f")
    assert st.state == TaskState.FAILED and st.exit_code == 3 and "exit code 3" in st.message


def test_cuda_visible_devices_per_task(make_backend: Callable[..., tuple[LocalBackend, Recorder]]) -> None:
    b, rec = make_backend(n=1)
    b.launch([
        spec("g0", "echo $CUDA_VISIBLE_DEVICES", gpu_ids=(0,)),
        spec("g1", "echo $CUDA_VISIBLE_DEVICES", gpu_ids=(1,)),
        spec("g-none", "echo x${CUDA_VISIBLE_DEVICES}x"),
    ])
    for tid in ("g0", "g1", "g-none"):
        assert rec.wait_terminal(tid).state == TaskState.SUCCEEDED
    assert b.read_log("g0", "stdout", 0) == b"0\n"
    assert b.read_log("g1", "stdout", 0) == b"1\n"
    assert b.read_log("g-none", "stdout", 0) == b"xx\n"


def test_launch_is_all_or_none(make_backend: Callable[..., tuple[LocalBackend, Recorder]]) -> None:
    b, rec = make_backend(n=2)
    good = spec("ok", "sleep 30", "local-0")
    bad_batches = [
        [good, spec("big", "true", "local-1", cpu=100)],
        [good, spec("nohost", "true", "local-9")],
        [good, spec("gpu-dup", "true", "local-1", gpu_ids=(1,)), spec("gpu-dup2", "true", "local-1", gpu_ids=(1,))],
        [good, spec("nogpu", "true", "local-1", gpu_ids=(7,))],
        [good, spec("port-out", "true", "local-1", ports=(31000,))],  # local-1 owns 32000..32999
        [good, spec("ok", "true", "local-1")],
    ]
    for batch in bad_batches:
        with pytest.raises(LaunchError) as ei:
            b.launch(batch)
        assert ei.value.task_id == batch[-1].task_id
        assert b.running_task_ids() == set()
        assert not (b._sandboxes / "ok").exists()
    assert rec.statuses == []
    # A GPU or port already held by a running task is refused too, and nothing of the batch starts.
    b.launch([spec("holder", "sleep 30", "local-0", gpu_ids=(0,), ports=(31005,))])
    for clash in (spec("c1", "true", "local-0", gpu_ids=(0,)), spec("c2", "true", "local-0", ports=(31005,))):
        with pytest.raises(LaunchError):
            b.launch([spec("fine", "true", "local-1"), clash])
        assert b.running_task_ids() == {"holder"}
    b.kill(["holder"])
    assert rec.wait_terminal("holder").state == TaskState.KILLED


def test_kill_stops_the_whole_process_group(make_backend: Callable[..., tuple[LocalBackend, Recorder]]) -> None:
    b, rec = make_backend(grace=2.0)
    b.launch([spec("k", "sleep 100 & sleep 100")])
    pgid = wrapper_pgid(b, "k")
    sandbox = b._sandboxes / "k"
    wait_for(lambda: (sandbox / "pids").exists())
    assert not group_gone(pgid)
    b.kill(["k", "unknown-id"])
    st = rec.wait_terminal("k")
    assert st.state == TaskState.KILLED
    wait_for(lambda: group_gone(pgid))
    assert b.running_task_ids() == set()


def test_kill_escalates_to_sigkill(make_backend: Callable[..., tuple[LocalBackend, Recorder]]) -> None:
    b, rec = make_backend(grace=0.3)
    b.launch([spec("stubborn", "trap '' TERM; echo ready; sleep 100 & wait")])
    pgid = wrapper_pgid(b, "stubborn")
    wait_for(lambda: b.read_log("stubborn", "stdout", 0) == b"ready\n")
    b.kill(["stubborn"])
    st = rec.wait_terminal("stubborn")
    assert st.state == TaskState.KILLED
    wait_for(lambda: group_gone(pgid))


def test_offers_reflect_allocations(make_backend: Callable[..., tuple[LocalBackend, Recorder]]) -> None:
    b, rec = make_backend(n=2)
    before = {o.hostname: o for o in b.offers()}
    o0 = before["local-0"]
    assert o0.free.cpu == 4 and o0.free.gpu == 2 and o0.gpu_ids == (0, 1)
    assert o0.ports == tuple(range(31000, 32000)) and o0.free.ports == 1000
    assert o0.has_gpus and o0.capacity.ports == 1000 and o0.address == "127.0.0.1"
    b.launch([spec("a", "sleep 30", "local-0", cpu=3, mem=1000, gpu_ids=(1,), ports=(31000, 31002))])
    o0 = {o.hostname: o for o in b.offers()}["local-0"]
    assert o0.free.cpu == 1 and o0.free.mem == 4096 - 1000
    assert o0.gpu_ids == (0,) and o0.free.gpu == 1
    assert 31000 not in o0.ports and 31002 not in o0.ports and 31001 in o0.ports and len(o0.ports) == 998
    assert {o.hostname: o for o in b.offers()}["local-1"] == before["local-1"]
    (h0,) = [h for h in b.hosts() if h.hostname == "local-0"]
    assert h0.task_ids == ("a",) and h0.allocated.cpu == 3 and h0.allocated.gpu == 1
    b.kill(["a"])
    rec.wait_terminal("a")
    assert {o.hostname: o for o in b.offers()} == before


# ------------------------------------------------------------------------------------------------ adoption


def test_restarted_backend_adopts_running_task(
    tmp_path: Path, make_backend: Callable[..., tuple[LocalBackend, Recorder]]
) -> None:
    a, rec_a = make_backend(n=1, grace=1.0)
    a.launch([
        spec("long", "sleep 30", gpu_ids=(0,), ports=(31001,)),
        spec("quick", "sleep 0.5; exit 4"),
    ])
    pgid = wrapper_pgid(a, "long")
    a.stop()  # the daemon "dies": nothing is killed
    wait_for(lambda: (tmp_path / "sandboxes" / "quick" / "exit").exists())
    assert not group_gone(pgid)

    b, rec_b = make_backend(n=1, grace=1.0)
    assert b.running_task_ids() == {"long"}
    rc = b.reconcile(["long", "quick"])
    assert rc["long"].state == TaskState.RUNNING
    assert rc["quick"].state == TaskState.FAILED and rc["quick"].exit_code == 4
    # The task that ended while the daemon was down is reported by the new backend.
    assert rec_b.wait_terminal("quick").state == TaskState.FAILED
    o0 = b.offers()[0]
    assert o0.gpu_ids == (1,) and 31001 not in o0.ports
    b.kill(["long"])
    assert rec_b.wait_terminal("long").state == TaskState.KILLED
    # (The wrapper is a child of this test process via backend A, so it stays a zombie; group_gone allows that.)
    wait_for(lambda: group_gone(pgid))
    assert rec_a.terminal("long") is None


def test_adopted_task_whose_process_vanished_is_lost(
    tmp_path: Path, make_backend: Callable[..., tuple[LocalBackend, Recorder]]
) -> None:
    a, _ = make_backend(n=1)
    a.launch([spec("gone", "sleep 30")])
    rt = a._running["gone"]
    a.stop()
    os.killpg(rt.pid, signal.SIGKILL)  # wrapper killed before it could record an exit
    assert rt.popen is not None
    rt.popen.wait(timeout=5)
    b, rec_b = make_backend(n=1)
    st = rec_b.wait_terminal("gone")
    assert st.state == TaskState.LOST and st.reason == "process vanished"
    assert b.reconcile(["gone"])["gone"].state == TaskState.LOST


def test_adopted_task_on_a_removed_host_is_killed(
    tmp_path: Path, make_backend: Callable[..., tuple[LocalBackend, Recorder]]
) -> None:
    a, _ = make_backend(n=2)
    a.launch([spec("orphan", "sleep 30", "local-1")])
    pgid = wrapper_pgid(a, "orphan")
    a.stop()
    b, rec_b = make_backend(n=1)  # local-1 is gone from the configuration
    st = rec_b.wait_terminal("orphan")
    assert st.state == TaskState.KILLED and st.reason == "host removed"
    assert b.running_task_ids() == set()
    wait_for(lambda: group_gone(pgid))


def test_death_by_foreign_signal_fails(make_backend: Callable[..., tuple[LocalBackend, Recorder]]) -> None:
    b, rec = make_backend()
    b.launch([spec("sig", "kill -9 $$")])
    st = rec.wait_terminal("sig")
    assert st.state == TaskState.FAILED and st.message == "killed by signal 9"


def test_spawn_failure_kills_what_started(
    make_backend: Callable[..., tuple[LocalBackend, Recorder]], monkeypatch: pytest.MonkeyPatch
) -> None:
    b, rec = make_backend()
    real_popen = subprocess.Popen
    started: list[subprocess.Popen[bytes]] = []

    def flaky_popen(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        if started:
            raise OSError("no more processes")
        p = real_popen(*args, **kwargs)
        started.append(p)
        return p

    monkeypatch.setattr(backend_mod.subprocess, "Popen", flaky_popen)
    with pytest.raises(LaunchError) as ei:
        b.launch([spec("first", "sleep 30", "local-0"), spec("second", "sleep 30", "local-1")])
    monkeypatch.undo()
    assert ei.value.task_id == "second"
    assert b.running_task_ids() == set()
    assert len(started) == 1 and started[0].poll() is not None
    wait_for(lambda: group_gone(started[0].pid))
    assert rec.statuses == []
    assert b.reconcile(["first"])["first"].state == TaskState.LOST
    # Nothing is held: the same batch launches fine afterwards.
    b.launch([spec("first", "true", "local-0"), spec("second", "true", "local-1")])
    assert rec.wait_terminal("first").state == TaskState.SUCCEEDED
    assert rec.wait_terminal("second").state == TaskState.SUCCEEDED


def test_detect_gpus_with_a_fake_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert detect_gpus() == [] and detect_gpu_model() is None  # no nvidia-smi at all
    fake = tmp_path / "nvidia-smi"
    fake.write_text(
        "#!/bin/sh\n"
        'case "$1" in\n'
        "  --query-gpu=index) printf '0\\n1\\n' ;;\n"
        "  --query-gpu=name) printf 'NVIDIA H100 80GB HBM3\\nNVIDIA H100 80GB HBM3\\n' ;;\n"
        "  *) exit 9 ;;\n"
        "esac\n"
    )
    fake.chmod(0o755)
    assert detect_gpus() == [0, 1]
    assert detect_gpu_model() == "NVIDIA H100 80GB HBM3"
    assert machine_resources(tmp_path).gpu == 2
    fake.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    assert detect_gpus() == []


def test_task_spawned_but_not_yet_indexed_is_adopted_after_a_crash(tmp_path: Path) -> None:
    """A daemon killed between writing its launch intent and recording the spawned pid must not orphan the task."""
    import json

    from peloton.hostmgr.local import runner

    hosts = make_local_hosts(1, Resources(cpu=2, mem=1024))
    data = tmp_path / "local"
    sandbox = data / "sandboxes" / "j-0-1"
    (sandbox / runner.WORK_DIR).mkdir(parents=True)
    (sandbox / runner.TASK_FILE).write_text(json.dumps({
        "task_id": "j-0-1", "job_id": "j", "instance": 0, "attempt": 1, "hostname": hosts[0].hostname,
        "command": "sleep 30", "env": dict(os.environ), "resources": {"cpu": 1, "mem": 64, "disk": 0, "gpu": 0,
                                                                      "ports": 0},
        "gpu_ids": [], "ports": [],
    }))
    proc = subprocess.Popen([sys.executable, "-m", "peloton.hostmgr.local.runner", str(sandbox)],
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        (data / "local-running.json").write_text(json.dumps({"tasks": {"j-0-1": {
            "sandbox": str(sandbox), "hostname": hosts[0].hostname, "pid": 0, "start_time": None,
            "kill_requested": None}}}))
        b = LocalBackend(data, hosts, poll_interval_s=0.05)
        b.start(lambda st: None)
        try:
            assert b.reconcile(["j-0-1"])["j-0-1"].state == TaskState.RUNNING
            assert "j-0-1" in b.running_task_ids()
        finally:
            b.kill(["j-0-1"])
            b.stop()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
