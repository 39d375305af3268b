"""The local backend: runs every task as a process group on this machine, split into one or more simulated hosts.

Files under `data_dir`:
  sandboxes/<task_id>/        one per task: task.json (spec, full env), pids, exit, stdout, stderr, runner.log,
                              final.json (the terminal status reported), spec.files, and work/ (the cwd)
  local-running.json          index of running tasks (pid, process start time, kill request), rewritten atomically;
                              a restarted daemon adopts the tasks listed in it.

A task's environment is the daemon's plus spec.env, CUDA_VISIBLE_DEVICES (its GPU ids; empty when it has none),
PELOTON_SANDBOX, and PELOTON_HOSTFILE when spec.files has a "hostfile"; its cwd is <sandbox>/work.

Each task runs under `python -m peloton.hostmgr.local.runner <sandbox>` started in a new session, so the wrapper
leads the task's process group (pgid == wrapper pid) and survives the daemon being killed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import peloton
from peloton.domain.placement import HostOffer
from peloton.domain.resources import Resources
from peloton.domain.states import TaskState
from peloton.errors import InvalidArgument, NotFound
from peloton.hostmgr.backend import HostInfo, LaunchError, LaunchSpec, StatusCallback, TaskStatus
from peloton.hostmgr.local import runner
from peloton.hostmgr.local.gpus import detect_gpus, machine_resources

log = logging.getLogger(__name__)

LOCAL_ADDRESS = "127.0.0.1"
INDEX_FILE = "local-running.json"
SANDBOXES_DIR = "sandboxes"
FINAL_FILE = "final.json"
RUNNER_LOG = "runner.log"
MAX_OFFER_PORTS = 1000  # a whole per-host range: a gang may need many ports on one host
_FINISHED_CACHE = 10_000
_STREAMS = ("stdout", "stderr")
_RESERVED_FILES = frozenset(
    {runner.TASK_FILE, runner.PIDS_FILE, runner.EXIT_FILE, runner.STDOUT_FILE, runner.STDERR_FILE, runner.WORK_DIR,
     FINAL_FILE, RUNNER_LOG}
)


@dataclass(frozen=True, slots=True)
class LocalHostConfig:
    """One (possibly simulated) host of the local backend. `port_range` is inclusive."""

    hostname: str
    resources: Resources
    gpu_ids: tuple[int, ...] = ()
    port_range: tuple[int, int] = (31000, 31999)
    labels: dict[str, str] = field(default_factory=dict)
    address: str = LOCAL_ADDRESS

    @property
    def capacity(self) -> Resources:
        lo, hi = self.port_range
        return replace(self.resources, gpu=len(self.gpu_ids), ports=max(0, hi - lo + 1))


def make_local_hosts(
    n: int | None,
    resources: Resources | None,
    port_base: int = 31000,
    ports_per_host: int = 1000,
    *,
    data_dir: Path | None = None,
) -> list[LocalHostConfig]:
    """The hosts of the local backend.

    n None: the one real host, named after this machine, with its resources (or `resources`) and detected GPUs.
    n given: simulated hosts local-0..local-{n-1}, each with `resources` (this machine's if None) and its own GPU
    index space 0..gpu-1, and non-overlapping port ranges of `ports_per_host` ports from `port_base`."""
    if n is not None and n < 1:
        raise InvalidArgument(f"number of local hosts must be at least 1, got {n}", field="local_hosts")
    if ports_per_host < 1:
        raise InvalidArgument(f"ports per host must be at least 1, got {ports_per_host}", field="ports_per_host")
    count = 1 if n is None else n
    if port_base < 1 or port_base + count * ports_per_host - 1 > 65535:
        raise InvalidArgument(
            f"port ranges {port_base}..{port_base + count * ports_per_host - 1} do not fit in 1..65535",
            field="port_base",
        )
    hosts: list[LocalHostConfig] = []
    if n is None:
        detected = detect_gpus()
        if resources is None:
            res = machine_resources(data_dir, gpu_count=len(detected))
            gpu_ids = tuple(detected)
        else:
            res = resources
            gpu_ids = tuple(detected[: res.gpu]) if len(detected) >= res.gpu else tuple(range(res.gpu))
        name = socket.gethostname() or "local-0"
        hosts.append(
            LocalHostConfig(
                hostname=name,
                resources=replace(res, gpu=len(gpu_ids), ports=0),
                gpu_ids=gpu_ids,
                port_range=(port_base, port_base + ports_per_host - 1),
                labels={"host": name, "rack": "local"},
            )
        )
        return hosts
    res = resources if resources is not None else machine_resources(data_dir)
    for i in range(n):
        name = f"local-{i}"
        lo = port_base + i * ports_per_host
        hosts.append(
            LocalHostConfig(
                hostname=name,
                resources=replace(res, ports=0),
                gpu_ids=tuple(range(res.gpu)),
                port_range=(lo, lo + ports_per_host - 1),
                labels={"host": name, "rack": "local"},
            )
        )
    return hosts


def proc_start_time(pid: int) -> int | None:
    """Field 22 (starttime) of /proc/<pid>/stat; None if the process does not exist or is a zombie."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    rest = text[text.rfind(")") + 2 :].split()
    # rest[0] is field 3 (state), so field 22 is rest[19].
    if len(rest) < 20 or rest[0] in ("Z", "X"):
        return None
    try:
        return int(rest[19])
    except ValueError:
        return None


def _pid_alive(pid: int, start_time: int | None) -> bool:
    """The process `pid` exists, is not a zombie, and (when known) started at `start_time` (not a reused pid)."""
    if pid <= 0:
        return False
    st = proc_start_time(pid)
    if st is not None:
        return start_time is None or st == start_time
    if os.path.exists("/proc/self/stat"):
        return False  # /proc works, so the process is gone (or a zombie)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _write_json_atomic(path: Path, data: object, mode: int = 0o644) -> None:
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}.{threading.get_ident()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _resources_to_json(r: Resources) -> dict[str, float | int]:
    return {"cpu": r.cpu, "mem": r.mem, "disk": r.disk, "gpu": r.gpu, "ports": r.ports}


def _resources_from_json(d: Any) -> Resources:
    if not isinstance(d, dict):
        return Resources()
    return Resources(
        cpu=float(d.get("cpu", 0.0)),
        mem=float(d.get("mem", 0.0)),
        disk=float(d.get("disk", 0.0)),
        gpu=int(d.get("gpu", 0)),
        ports=int(d.get("ports", 0)),
    )


@dataclass(slots=True)
class _Running:
    """The runtime record of one running task."""

    task_id: str
    job_id: str
    instance: int
    attempt: int
    hostname: str
    sandbox: Path
    resources: Resources  # as accounted: gpu == len(gpu_ids), ports == len(ports)
    gpu_ids: tuple[int, ...]
    ports: tuple[int, ...]
    pid: int  # the wrapper's pid == the task's process group id
    start_time: int | None  # /proc/<pid>/stat field 22, to detect pid reuse
    popen: subprocess.Popen[bytes] | None = None  # set when the wrapper is our child
    announced: bool = True  # RUNNING reported; terminal states wait for it
    kill_requested_wall: float | None = None  # time.time() of the kill request
    kill_requested_mono: float | None = None
    sigkill_sent: bool = False

    def index_entry(self) -> dict[str, Any]:
        return {
            "sandbox": str(self.sandbox),
            "hostname": self.hostname,
            "pid": self.pid,
            "start_time": self.start_time,
            "kill_requested": self.kill_requested_wall,
        }


class LocalBackend:
    """Backend running tasks as local process groups. Thread-safe; reports statuses from its monitor thread
    (and RUNNING from the thread calling launch)."""

    def __init__(
        self,
        data_dir: Path,
        hosts: list[LocalHostConfig],
        *,
        clock: Callable[[], float] = time.time,
        kill_grace_s: float = 5.0,
        poll_interval_s: float = 0.2,
    ) -> None:
        if not hosts:
            raise InvalidArgument("the local backend needs at least one host", field="hosts")
        self._hosts: dict[str, LocalHostConfig] = {}
        for h in hosts:
            if h.hostname in self._hosts:
                raise InvalidArgument(f"duplicate local host name {h.hostname!r}", field="hosts")
            self._hosts[h.hostname] = h
        self._data_dir = Path(data_dir)
        self._sandboxes = self._data_dir / SANDBOXES_DIR
        self._sandboxes.mkdir(parents=True, exist_ok=True)
        self._index_path = self._data_dir / INDEX_FILE
        self._clock = clock
        self._kill_grace_s = kill_grace_s
        self._poll_interval_s = poll_interval_s
        self._lock = threading.Lock()
        self._running: dict[str, _Running] = {}
        self._launching: dict[str, dict[str, Any]] = {}  # index entries written before spawning
        self._finished: OrderedDict[str, TaskStatus] = OrderedDict()
        self._pending: list[TaskStatus] = []  # statuses found at adoption, reported by the monitor
        self._reap: list[subprocess.Popen[bytes]] = []  # our wrappers still to be waited for
        self._on_status: StatusCallback | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ----------------------------------------------------------------------------------------------- lifecycle

    def start(self, on_status: StatusCallback) -> None:
        """Adopt the tasks a previous daemon left (statuses reported by the monitor thread), then start monitoring."""
        with self._lock:
            if self._thread is not None:
                raise RuntimeError("LocalBackend already started")
            self._on_status = on_status
            self._adopt_locked()
            self._stop.clear()
            self._thread = threading.Thread(target=self._monitor, name="local-backend-monitor", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop the monitor thread. Tasks keep running; a new LocalBackend on the same data_dir adopts them."""
        self._stop.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout=max(5.0, self._poll_interval_s * 5))
        with self._lock:
            self._thread = None

    # ----------------------------------------------------------------------------------------------- queries

    def offers(self) -> list[HostOffer]:
        with self._lock:
            out: list[HostOffer] = []
            usage = self._usage_all_locked()
            for h in self._hosts.values():
                allocated, used_gpus, used_ports = usage.get(h.hostname, (Resources(), set(), set()))
                cap = h.capacity
                free_gpus = tuple(g for g in h.gpu_ids if g not in used_gpus)
                free_ports: list[int] = []
                lo, hi = h.port_range
                for p in range(lo, hi + 1):
                    if p not in used_ports:
                        free_ports.append(p)
                        if len(free_ports) >= MAX_OFFER_PORTS:
                            break
                free = Resources(
                    cpu=max(0.0, cap.cpu - allocated.cpu),
                    mem=max(0.0, cap.mem - allocated.mem),
                    disk=max(0.0, cap.disk - allocated.disk),
                    gpu=len(free_gpus),
                    ports=len(free_ports),
                )
                out.append(
                    HostOffer(
                        hostname=h.hostname,
                        address=h.address,
                        free=free,
                        gpu_ids=free_gpus,
                        ports=tuple(free_ports),
                        labels=dict(h.labels),
                        capacity=cap,
                        has_gpus=bool(h.gpu_ids),
                    )
                )
            return out

    def hosts(self) -> list[HostInfo]:
        with self._lock:
            out: list[HostInfo] = []
            usage = self._usage_all_locked()
            for h in self._hosts.values():
                allocated, _, _ = usage.get(h.hostname, (Resources(), set(), set()))
                ids = tuple(sorted(t.task_id for t in self._running.values() if t.hostname == h.hostname))
                out.append(
                    HostInfo(
                        hostname=h.hostname,
                        address=h.address,
                        capacity=h.capacity,
                        allocated=allocated,
                        labels=dict(h.labels),
                        state="UP",
                        task_ids=ids,
                    )
                )
            return out

    def acknowledge(self, acks: Sequence[str]) -> None:
        """Nothing to acknowledge: local statuses are not resent."""

    def running_task_ids(self) -> set[str]:
        with self._lock:
            return set(self._running)

    def reconcile(self, task_ids: Sequence[str]) -> dict[str, TaskStatus]:
        now = self._clock()
        out: dict[str, TaskStatus] = {}
        with self._lock:
            for tid in task_ids:
                rt = self._running.get(tid)
                if rt is not None:
                    out[tid] = TaskStatus(tid, TaskState.RUNNING, now, rt.hostname)
                    continue
                done = self._finished.get(tid)
                if done is not None:
                    out[tid] = done
                    continue
                st = self._status_from_sandbox(tid, now)
                if st is not None:
                    out[tid] = st
                    continue
                out[tid] = TaskStatus(tid, TaskState.LOST, now, reason="unknown to the local backend")
        return out

    def read_log(self, task_id: str, stream: str, tail_bytes: int) -> bytes:
        if stream not in _STREAMS:
            raise InvalidArgument(f"stream must be one of {', '.join(_STREAMS)}, got {stream!r}", field="stream")
        sandbox = self._sandbox_path(task_id)
        if sandbox is None or not sandbox.is_dir():
            raise NotFound(f"no sandbox for task {task_id!r}")
        path = sandbox / stream
        try:
            with open(path, "rb") as f:
                if tail_bytes > 0:
                    f.seek(0, os.SEEK_END)
                    size = f.tell()
                    f.seek(max(0, size - tail_bytes))
                return f.read()
        except FileNotFoundError:
            return b""

    # ----------------------------------------------------------------------------------------------- launch / kill

    def launch(self, tasks: Sequence[LaunchSpec]) -> None:
        if not tasks:
            return
        started: list[_Running] = []
        with self._lock:
            self._validate_locked(tasks)
            # Record intent before spawning: a daemon killed mid-spawn finds these at its next start, reads the
            # wrapper's pid from the sandbox and adopts (or reports) the task instead of leaving an orphan.
            self._launching = {
                t.task_id: {"sandbox": str(self._sandboxes / t.task_id), "hostname": t.hostname, "pid": 0,
                            "start_time": None, "kill_requested": None}
                for t in tasks
            }
            self._write_index_locked()
            try:
                for spec in tasks:
                    started.append(self._spawn_locked(spec))
            except Exception as e:  # noqa: BLE001 - any spawn failure makes the whole batch fail
                self._abort_locked(started)
                for spec in tasks[: len(started) + 1]:
                    shutil.rmtree(self._sandboxes / spec.task_id, ignore_errors=True)
                failed = tasks[len(started)].task_id
                self._launching = {}
                self._write_index_locked()
                raise LaunchError(failed, f"could not start: {e}") from e
            self._launching = {}
            for rt in started:
                rt.announced = False
                self._running[rt.task_id] = rt
                self._finished.pop(rt.task_id, None)
            self._write_index_locked()
            cb = self._on_status
        now = self._clock()
        try:
            if cb is not None:
                for rt in started:
                    self._call(cb, TaskStatus(rt.task_id, TaskState.RUNNING, now, rt.hostname))
        finally:
            with self._lock:
                for rt in started:
                    rt.announced = True

    def kill(self, task_ids: Sequence[str]) -> None:
        with self._lock:
            changed = False
            for tid in task_ids:
                rt = self._running.get(tid)
                if rt is None or rt.kill_requested_wall is not None:
                    continue
                rt.kill_requested_wall = time.time()
                rt.kill_requested_mono = time.monotonic()
                changed = True
                self._signal_group_locked(rt, signal.SIGTERM)
            if changed:
                self._write_index_locked()

    def poll_once(self) -> None:
        """One monitoring pass (the monitor thread calls this every poll interval); reports what it finds."""
        with self._lock:
            statuses = self._pending
            self._pending = []
            statuses.extend(self._poll_locked())
            cb = self._on_status
        if cb is not None:
            for st in statuses:
                self._call(cb, st)

    # ----------------------------------------------------------------------------------------------- internals

    def _call(self, cb: StatusCallback, st: TaskStatus) -> None:
        try:
            cb(st)
        except Exception:  # noqa: BLE001 - a failing callback must not kill the monitor
            log.exception("local backend: status callback failed for %s", st.task_id)

    def _monitor(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll_once()
            except Exception:  # noqa: BLE001
                log.exception("local backend: monitor pass failed")
            self._stop.wait(self._poll_interval_s)

    def _sandbox_path(self, task_id: str) -> Path | None:
        if not task_id or "/" in task_id or "\\" in task_id or task_id in (".", "..") or "\0" in task_id:
            return None
        return self._sandboxes / task_id

    def _usage_all_locked(self) -> dict[str, tuple[Resources, set[int], set[int]]]:
        """hostname -> (allocated resources, GPU ids in use, ports in use), in one pass over the running tasks."""
        out: dict[str, tuple[Resources, set[int], set[int]]] = {}
        for rt in self._running.values():
            allocated, gpus, ports = out.get(rt.hostname, (Resources(), set(), set()))
            gpus.update(rt.gpu_ids)
            ports.update(rt.ports)
            out[rt.hostname] = (allocated + rt.resources, gpus, ports)
        return out

    def _validate_locked(self, tasks: Sequence[LaunchSpec]) -> None:
        batch_ids: set[str] = set()
        extra: dict[str, Resources] = {}
        batch_gpus: dict[str, set[int]] = {}
        batch_ports: dict[str, set[int]] = {}
        usage = self._usage_all_locked()
        for spec in tasks:
            tid = spec.task_id
            if self._sandbox_path(tid) is None:
                raise LaunchError(tid, "invalid task id for a sandbox directory name")
            if tid in batch_ids:
                raise LaunchError(tid, "task id appears twice in the launch")
            if tid in self._running:
                raise LaunchError(tid, "task is already running")
            batch_ids.add(tid)
            host = self._hosts.get(spec.hostname)
            if host is None:
                raise LaunchError(tid, f"unknown host {spec.hostname!r}")
            allocated, used_gpus, used_ports = usage.get(host.hostname, (Resources(), set(), set()))
            bg = batch_gpus.setdefault(host.hostname, set())
            bp = batch_ports.setdefault(host.hostname, set())
            if len(spec.gpu_ids) != spec.resources.gpu:
                raise LaunchError(
                    tid, f"asks for {spec.resources.gpu} GPUs but was given {len(spec.gpu_ids)} GPU ids"
                )
            if len(set(spec.gpu_ids)) != len(spec.gpu_ids):
                raise LaunchError(tid, f"duplicate GPU ids {list(spec.gpu_ids)}")
            for g in spec.gpu_ids:
                if g not in host.gpu_ids:
                    raise LaunchError(tid, f"host {host.hostname} has no GPU {g}")
                if g in used_gpus or g in bg:
                    raise LaunchError(tid, f"GPU {g} on host {host.hostname} is already in use")
            if len(set(spec.ports)) != len(spec.ports):
                raise LaunchError(tid, f"duplicate ports {list(spec.ports)}")
            if len(spec.ports) < spec.resources.ports:
                raise LaunchError(tid, f"asks for {spec.resources.ports} ports but was given {len(spec.ports)}")
            lo, hi = host.port_range
            for p in spec.ports:
                if not lo <= p <= hi:
                    raise LaunchError(tid, f"port {p} is outside the range {lo}-{hi} of host {host.hostname}")
                if p in used_ports or p in bp:
                    raise LaunchError(tid, f"port {p} on host {host.hostname} is already in use")
            for name in spec.files:
                if self._bad_file_name(name):
                    raise LaunchError(tid, f"invalid sandbox file name {name!r}")
            need = Resources(spec.resources.cpu, spec.resources.mem, spec.resources.disk)
            prior = extra.get(host.hostname, Resources())
            cap = host.capacity
            free = Resources(cap.cpu - allocated.cpu - prior.cpu, cap.mem - allocated.mem - prior.mem,
                             cap.disk - allocated.disk - prior.disk)
            if not need.fits_in(free):
                short = ",".join(need.short_of(free))
                raise LaunchError(
                    tid, f"needs {need.describe()} but host {host.hostname} has only {free.describe()} free ({short})"
                )
            extra[host.hostname] = prior + need
            bg.update(spec.gpu_ids)
            bp.update(spec.ports)

    @staticmethod
    def _bad_file_name(name: str) -> bool:
        if not name or name.startswith("/") or "\0" in name or "\\" in name:
            return True
        parts = name.split("/")
        if any(p in ("", ".", "..") for p in parts):
            return True
        return parts[0] in _RESERVED_FILES

    def _spawn_locked(self, spec: LaunchSpec) -> _Running:
        sandbox = self._sandboxes / spec.task_id
        if sandbox.exists():
            shutil.rmtree(sandbox)  # a previous try of the same task id; it is not running
        (sandbox / runner.WORK_DIR).mkdir(parents=True)
        for name, content in spec.files.items():
            p = sandbox / name
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(content, encoding="utf-8")
        env = dict(os.environ)
        env.update(spec.env)
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in spec.gpu_ids)
        env["PELOTON_SANDBOX"] = str(sandbox)
        if "hostfile" in spec.files and "PELOTON_HOSTFILE" not in spec.env:
            env["PELOTON_HOSTFILE"] = str(sandbox / "hostfile")
        accounted = replace(spec.resources, gpu=len(spec.gpu_ids), ports=len(spec.ports))
        task_doc = {
            "task_id": spec.task_id,
            "job_id": spec.job_id,
            "instance": spec.instance,
            "attempt": spec.attempt,
            "hostname": spec.hostname,
            "command": spec.command,
            "env": env,
            "resources": _resources_to_json(accounted),
            "gpu_ids": list(spec.gpu_ids),
            "ports": list(spec.ports),
        }
        # The env holds a copy of the daemon's environment: keep it private.
        _write_json_atomic(sandbox / runner.TASK_FILE, task_doc, mode=0o600)
        wrapper_env = dict(os.environ)
        pkg_root = str(Path(peloton.__file__).resolve().parent.parent)
        pp = wrapper_env.get("PYTHONPATH", "")
        wrapper_env["PYTHONPATH"] = pkg_root + (os.pathsep + pp if pp else "")
        with open(sandbox / RUNNER_LOG, "ab") as rlog:
            popen = subprocess.Popen(
                [sys.executable, "-m", "peloton.hostmgr.local.runner", str(sandbox)],
                start_new_session=True,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=rlog,
                close_fds=True,
                cwd=str(sandbox),
                env=wrapper_env,
            )
        return _Running(
            task_id=spec.task_id,
            job_id=spec.job_id,
            instance=spec.instance,
            attempt=spec.attempt,
            hostname=spec.hostname,
            sandbox=sandbox,
            resources=accounted,
            gpu_ids=tuple(spec.gpu_ids),
            ports=tuple(spec.ports),
            pid=popen.pid,
            start_time=proc_start_time(popen.pid),
            popen=popen,
        )

    def _abort_locked(self, started: list[_Running]) -> None:
        for rt in started:
            with contextlib.suppress(OSError):
                os.killpg(rt.pid, signal.SIGKILL)
            if rt.popen is not None:
                with contextlib.suppress(Exception):
                    rt.popen.wait(timeout=5)
                if rt.popen.returncode is None:
                    self._reap.append(rt.popen)

    def _alive_locked(self, rt: _Running) -> bool:
        if rt.popen is not None:
            return rt.popen.poll() is None
        return _pid_alive(rt.pid, rt.start_time)

    def _signal_group_locked(self, rt: _Running, sig: int) -> None:
        """Signal the task's process group, unless its wrapper is gone and its pid may have been reused."""
        # A dead wrapper's pid is not reused while its group has members; if another process holds it now, the
        # group is empty and signalling it would hit a stranger.
        wrapper_gone = rt.popen.poll() is not None if rt.popen is not None else not _pid_alive(rt.pid, rt.start_time)
        if wrapper_gone and proc_start_time(rt.pid) is not None:
            return
        with contextlib.suppress(OSError):
            os.killpg(rt.pid, sig)

    def _poll_locked(self) -> list[TaskStatus]:
        still: list[subprocess.Popen[bytes]] = []
        for p in self._reap:
            if p.poll() is None:
                still.append(p)
        self._reap = still
        out: list[TaskStatus] = []
        mono = time.monotonic()
        for rt in list(self._running.values()):
            if self._alive_locked(rt):
                # The wrapper lives until the command has ended and the exit file is written, so only a gone
                # wrapper needs a look at the sandbox.
                if (
                    rt.kill_requested_mono is not None
                    and not rt.sigkill_sent
                    and mono - rt.kill_requested_mono >= self._kill_grace_s
                ):
                    self._signal_group_locked(rt, signal.SIGKILL)
                    rt.sigkill_sent = True
                continue
            if not rt.announced:
                continue
            exit_doc = _read_json(rt.sandbox / runner.EXIT_FILE)
            if isinstance(exit_doc, dict):
                st = self._status_from_exit(rt.task_id, rt.hostname, exit_doc, rt.kill_requested_wall)
            else:
                # Wrapper gone without recording an exit: make sure nothing of the group lingers.
                self._signal_group_locked(rt, signal.SIGKILL)
                if rt.kill_requested_wall is not None:
                    st = TaskStatus(rt.task_id, TaskState.KILLED, self._clock(), rt.hostname, reason="killed",
                                    message="killed")
                else:
                    st = TaskStatus(rt.task_id, TaskState.LOST, self._clock(), rt.hostname,
                                    reason="process vanished", message="the task's process ended without a result")
            out.append(st)
            self._finish_locked(rt, st)
        if out:
            self._write_index_locked()
        return out

    def _finish_locked(self, rt: _Running, st: TaskStatus) -> None:
        self._running.pop(rt.task_id, None)
        self._remember_locked(st)
        with contextlib.suppress(OSError):
            _write_json_atomic(rt.sandbox / FINAL_FILE, _status_to_json(st))

    def _remember_locked(self, st: TaskStatus) -> None:
        self._finished[st.task_id] = st
        self._finished.move_to_end(st.task_id)
        while len(self._finished) > _FINISHED_CACHE:
            self._finished.popitem(last=False)

    def _status_from_exit(
        self, task_id: str, hostname: str, doc: dict[str, Any], kill_requested: float | None
    ) -> TaskStatus:
        now = self._clock()
        code = doc.get("exit_code")
        sig = doc.get("signal")
        finished_at = doc.get("finished_at")
        err = str(doc.get("error") or "")
        if kill_requested is not None:
            if code == 0 and isinstance(finished_at, (int, float)) and finished_at < kill_requested:
                return TaskStatus(task_id, TaskState.SUCCEEDED, now, hostname, exit_code=0)
            return TaskStatus(
                task_id, TaskState.KILLED, now, hostname,
                exit_code=code if isinstance(code, int) else None, reason="killed", message="killed",
            )
        if isinstance(code, int):
            if code == 0:
                return TaskStatus(task_id, TaskState.SUCCEEDED, now, hostname, exit_code=0)
            msg = f"exit code {code}" + (f": {err}" if err else "")
            return TaskStatus(task_id, TaskState.FAILED, now, hostname, exit_code=code, reason="failed", message=msg)
        if isinstance(sig, int):
            return TaskStatus(
                task_id, TaskState.FAILED, now, hostname, reason="signaled", message=f"killed by signal {sig}"
            )
        return TaskStatus(task_id, TaskState.FAILED, now, hostname, reason="failed", message="unknown exit status")

    def _status_from_sandbox(self, task_id: str, now: float) -> TaskStatus | None:
        sandbox = self._sandbox_path(task_id)
        if sandbox is None or not sandbox.is_dir():
            return None
        final = _read_json(sandbox / FINAL_FILE)
        if isinstance(final, dict):
            st = _status_from_json(final)
            if st is not None:
                return st
        exit_doc = _read_json(sandbox / runner.EXIT_FILE)
        if isinstance(exit_doc, dict):
            task_doc = _read_json(sandbox / runner.TASK_FILE)
            hostname = str(task_doc.get("hostname", "")) if isinstance(task_doc, dict) else ""
            return self._status_from_exit(task_id, hostname, exit_doc, None)
        return None

    @staticmethod
    def _wrapper_pid_from_sandbox(sandbox: Path, wait_s: float = 2.0) -> int:
        deadline = time.monotonic() + wait_s
        while True:
            doc = _read_json(sandbox / runner.PIDS_FILE)
            if isinstance(doc, dict) and isinstance(doc.get("wrapper_pid"), int):
                return int(doc["wrapper_pid"])
            if not (sandbox / runner.TASK_FILE).exists() or time.monotonic() >= deadline:
                return 0  # the wrapper never started
            time.sleep(0.05)

    def _write_index_locked(self) -> None:
        tasks = dict(self._launching)
        tasks.update({tid: rt.index_entry() for tid, rt in self._running.items()})
        doc = {"tasks": tasks}
        try:
            _write_json_atomic(self._index_path, doc)
        except OSError:
            log.exception("local backend: could not write %s", self._index_path)

    def _adopt_locked(self) -> None:
        doc = _read_json(self._index_path)
        entries = doc.get("tasks") if isinstance(doc, dict) else None
        if not isinstance(entries, dict):
            return
        now = self._clock()
        for tid, entry in entries.items():
            if tid in self._running or not isinstance(entry, dict):
                continue
            sandbox = self._sandbox_path(str(tid))
            if sandbox is None:
                continue
            task_doc = _read_json(sandbox / runner.TASK_FILE)
            task_doc = task_doc if isinstance(task_doc, dict) else {}
            hostname = str(entry.get("hostname") or task_doc.get("hostname") or "")
            pid = int(entry.get("pid") or 0)
            start_time = entry.get("start_time")
            start_time = int(start_time) if isinstance(start_time, int) else None
            if pid == 0:  # spawned (or about to be) when the previous daemon died: the wrapper knows its pid
                pid = self._wrapper_pid_from_sandbox(sandbox)
                start_time = proc_start_time(pid) if pid else None
            kill_req = entry.get("kill_requested")
            kill_req = float(kill_req) if isinstance(kill_req, (int, float)) else None
            alive = _pid_alive(pid, start_time)
            exit_doc = _read_json(sandbox / runner.EXIT_FILE)
            st: TaskStatus | None = None
            if isinstance(exit_doc, dict):
                st = self._status_from_exit(tid, hostname, exit_doc, kill_req)
            elif not alive:
                if kill_req is not None:
                    st = TaskStatus(tid, TaskState.KILLED, now, hostname, reason="killed", message="killed")
                else:
                    st = TaskStatus(tid, TaskState.LOST, now, hostname, reason="process vanished",
                                    message="the task's process ended while the daemon was down")
            elif hostname not in self._hosts:
                with contextlib.suppress(OSError):
                    os.killpg(pid, signal.SIGKILL)
                st = TaskStatus(tid, TaskState.KILLED, now, hostname, reason="host removed",
                                message=f"host {hostname!r} is no longer configured")
            if st is not None:
                self._pending.append(st)
                self._remember_locked(st)
                with contextlib.suppress(OSError):
                    _write_json_atomic(sandbox / FINAL_FILE, _status_to_json(st))
                continue
            rt = _Running(
                task_id=tid,
                job_id=str(task_doc.get("job_id", "")),
                instance=int(task_doc.get("instance", 0)),
                attempt=int(task_doc.get("attempt", 0)),
                hostname=hostname,
                sandbox=sandbox,
                resources=_resources_from_json(task_doc.get("resources")),
                gpu_ids=tuple(int(g) for g in task_doc.get("gpu_ids") or ()),
                ports=tuple(int(p) for p in task_doc.get("ports") or ()),
                pid=pid,
                start_time=start_time,
                popen=None,
                kill_requested_wall=kill_req,
                kill_requested_mono=time.monotonic() if kill_req is not None else None,
            )
            self._running[tid] = rt
            log.info("local backend: adopted running task %s (pid %d) on %s", tid, pid, hostname)
        self._write_index_locked()


def _status_to_json(st: TaskStatus) -> dict[str, Any]:
    return {
        "task_id": st.task_id,
        "state": st.state.value,
        "time": st.time,
        "hostname": st.hostname,
        "exit_code": st.exit_code,
        "reason": st.reason,
        "message": st.message,
    }


def _status_from_json(d: dict[str, Any]) -> TaskStatus | None:
    try:
        code = d.get("exit_code")
        return TaskStatus(
            task_id=str(d["task_id"]),
            state=TaskState(str(d["state"])),
            time=float(d.get("time", 0.0)),
            hostname=str(d.get("hostname", "")),
            exit_code=int(code) if isinstance(code, int) else None,
            reason=str(d.get("reason", "")),
            message=str(d.get("message", "")),
        )
    except (KeyError, ValueError, TypeError):
        return None
