"""Start the real daemon as a subprocess and drive it through the real CLI."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import grpc

PELOTON = [sys.executable, "-m", "peloton.cli.main"]
from peloton.api.v1 import job_pb2, job_pb2_grpc  # noqa: E402
from peloton.hostmgr.local import cgroups  # noqa: E402
from tests.asroot import AS_ROOT_FLAGS  # noqa: E402 - after PELOTON, which it does not need


def _sigint_default() -> None:
    """Run in the child between fork and exec (a handler is reset by exec, an "ignore" is not); it takes no lock,
    so it is safe beside the test's threads."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def wait_until(pred: Callable[[], Any], timeout: float = 60.0, interval: float = 0.2, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


@dataclass
class Daemon:
    data_dir: Path
    db_url: str
    hosts: int = 2
    host_resources: str = "cpu=4,mem=4Gi,gpu=2"
    port_base: int = 0
    proc: subprocess.Popen[str] | None = None
    address: str = ""
    secure_defaults: bool = False  # as root, without tests/asroot.py's overrides: a root daemon's own defaults
    extra_args: tuple[str, ...] = ()  # more flags for `peloton server`
    standing_by: str = ""  # what a standby printed when it began to stand by
    log_path: Path = field(init=False)
    _channel: tuple[str, grpc.Channel] | None = field(init=False, default=None)  # polled_state's, to `address`

    def __post_init__(self) -> None:
        self.log_path = self.data_dir / "daemon.log"
        if not self.port_base:
            # a task port range of its own (each simulated host takes 1000 ports), so daemons never collide, below
            # the kernel's ephemeral ports (32768 on), which outgoing connections (the store's) take
            self.port_base = random.randrange(20000, 30000, 2000)

    def server_args(self) -> list[str]:
        """What the daemon runs with besides address, store and data dir (variants override it)."""
        return ["--local-hosts", str(self.hosts), "--local-host-resources", self.host_resources,
                "--local-port-base", str(self.port_base)]

    def start(self, timeout: float = 60.0, same_address: bool = False, standby: bool = False) -> None:
        """Start the daemon (again): on a free port, or with `same_address` on the one it had (a restart its
        clients should not notice but for the pause). With `standby` (--standby), return once it stands by,
        answering on `address` with the leader's (`wait_serving` then waits for it to take over)."""
        listen = self.address if same_address and self.address else "127.0.0.1:0"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "a") as log:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(
                [*PELOTON, "server", "--listen", listen, "--db", self.db_url, "--data-dir",
                 str(self.data_dir), "--metrics-listen", "", "--log-level", "info",
                 *([] if self.secure_defaults else AS_ROOT_FLAGS),
                 *self.server_args(), *self.extra_args, *(["--standby"] if standby else [])],
                stdout=subprocess.PIPE, stderr=log, text=True,
            )
        if standby:
            line = self._line(r"answering on (\S+)", timeout)
            self.standing_by = line
            self.address = re.search(r"answering on (\S+)", line).group(1)  # type: ignore[union-attr]
            return
        self.wait_serving(timeout)

    def wait_serving(self, timeout: float = 60.0) -> None:
        """Until it says it serves (a standby: once it took over)."""
        self.address = re.search(r"serving on (\S+)", self._line(r"serving on (\S+)", timeout)).group(1)  # type: ignore[union-attr]

    def _line(self, pattern: str, timeout: float) -> str:
        assert self.proc is not None and self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            if re.search(pattern, line):
                return line
        raise AssertionError(f"daemon did not print {pattern!r}; log:\n{self.log()[-4000:]}")

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self._channel is not None:
            self._channel[1].close()
            self._channel = None
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def cli(self, *args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        r = subprocess.run([*PELOTON, "--address", self.address, *args], capture_output=True, text=True,
                           timeout=timeout)
        if check and r.returncode != 0:
            raise AssertionError(f"peloton {' '.join(args)} -> {r.returncode}\nstdout: {r.stdout}\nstderr: {r.stderr}")
        return r

    def popen(self, *args: str, ctrl_c: bool = False) -> subprocess.Popen[str]:
        """The CLI in the background (stdout and stderr piped, text). `ctrl_c`: for a test that interrupts it, it
        starts with SIGINT at its default, as a command typed at a terminal does, whatever this run inherited: a
        suite started with SIGINT ignored (`cmd &` in a script, some CI runners) passes that on to its children,
        and the CLI, as POSIX tools do, keeps an inherited "ignore"."""
        return subprocess.Popen([*PELOTON, "--address", self.address, *args], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True,
                                preexec_fn=_sigint_default if ctrl_c else None)

    def create(self, spec: str, tmp: Path) -> str:
        f = tmp / f"spec-{time.monotonic_ns()}.yaml"
        f.write_text(spec)
        out = self.cli("job", "create", "-f", str(f)).stdout.strip()
        assert re.fullmatch(r"[0-9a-f]{12}", out), out
        return out

    def job(self, job_id: str) -> dict[str, Any]:
        return json.loads(self.cli("job", "get", job_id, "-o", "json").stdout)

    def state(self, job_id: str) -> str:
        return str(self.job(job_id)["status"]["state"])

    def polled_state(self, job_id: str) -> str | None:
        """The job's state over a plain gRPC call: a poll costs a millisecond where a CLI process costs 0.4 s (0.1
        s of CPU). None where the call fails (a daemon with TLS or authentication, one away, a prefix of an id):
        then the CLI answers."""
        try:
            if self._channel is None or self._channel[0] != self.address:
                self._channel = (self.address, grpc.insecure_channel(self.address))
            stub = job_pb2_grpc.JobServiceStub(self._channel[1])
            return str(stub.GetJob(job_pb2.GetJobRequest(job_id=job_id), timeout=5).job.status.state)
        except grpc.RpcError:
            return None

    def wait_state(self, job_id: str, *states: str, timeout: float = 60) -> dict[str, Any]:
        """Until the job is in one of `states`; what the CLI (`job get -o json`) says of it then."""
        def check() -> dict[str, Any] | None:
            polled = self.polled_state(job_id)
            if polled is not None and polled not in states:
                return None
            j = self.job(job_id)
            return j if j["status"]["state"] in states else None

        return wait_until(check, timeout, 0.3, f"job {job_id} in {states}")

    def tasks(self, job_id: str) -> list[dict[str, Any]]:
        return list(json.loads(self.cli("task", "list", job_id, "-o", "json").stdout).get("tasks", []))


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie is dead for our purposes
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


SANDBOX_VAR = b"PELOTON_SANDBOX="


def _inside(path: str, root: Path) -> bool:
    """`path` is `root` or below it (compared by path components, also after resolving symlinks)."""
    p = os.path.normpath(path)
    r = os.path.normpath(str(root))
    if os.path.commonpath([p, r]) == r:
        return True
    rp, rr = os.path.realpath(p), os.path.realpath(r)
    return os.path.commonpath([rp, rr]) == rr


def sandboxed_pids(root: Path) -> list[int]:
    """Pids of the live processes whose environment has PELOTON_SANDBOX pointing at or inside `root`.

    Reads /proc/<pid>/environ (the environment the process was started with), so it depends on nothing the
    backend writes; processes that vanish meanwhile or whose environment cannot be read are ignored."""
    me = os.getpid()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read()
        except OSError:  # gone, or not ours to read
            continue
        for var in environ.split(b"\0"):
            if var.startswith(SANDBOX_VAR):
                if _inside(os.fsdecode(var[len(SANDBOX_VAR):]), root) and pid_alive(int(entry)):
                    found.append(int(entry))
                break
    return found


def kill_sandboxed_processes(root: Path, timeout: float = 10.0) -> list[int]:
    """SIGKILL the process group of every process whose PELOTON_SANDBOX is inside `root` (a test's data dir), so
    tasks a test leaves behind (the local backend starts each one in a session of its own, to outlive the daemon)
    do not outlive the test. Waits until they are gone; returns the pids that were found.

    Call it after the daemon is stopped: a running daemon could start new tasks meanwhile. The task cgroups of the
    local backends whose data dirs are below `root` (they outlive a daemon as its tasks do) are emptied and
    removed too."""
    own_group = os.getpgid(0)
    found = sandboxed_pids(root)
    for journal in Path(root).glob("**/journal"):
        cgroups.kill_and_remove_subtree(journal.parent)
    for pid in found:
        try:
            pgid = os.getpgid(pid)
            if pgid == own_group:  # never the test runner's own group: only that process
                os.kill(pid, signal.SIGKILL)
            else:
                os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            continue
    wait_until(lambda: not any(pid_alive(p) for p in found), timeout, 0.05,
               f"the processes of sandboxes under {root} to die")
    return found


D = TypeVar("D", bound="Daemon")


@contextmanager
def serving(d: D) -> Iterator[D]:
    """`d` started for the block, then stopped, and its tasks (which outlive a daemon by design) killed."""
    try:
        d.start()  # (a start that times out leaves the process running: stopped below too)
        yield d
    finally:
        d.stop()
        kill_sandboxed_processes(d.data_dir)
