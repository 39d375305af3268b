"""The daemon's side of the spawner (spawner.py): a small pool of spawner processes, each used by one launch at a
time, so launches in parallel start their tasks in parallel and nothing is shared between them (no lock is held
while a spawner works). A spawner that dies is replaced on the next launch."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from peloton.hostmgr.local import spawner as spawner_main
from peloton.hostmgr.local.task_env import inherited

log = logging.getLogger(__name__)

_HEADER = struct.Struct("!I")
_MAX_FDS = 4096


@dataclass(frozen=True, slots=True)
class Started:
    pid: int
    pidfd: int | None  # None: the wrapper was already over when it was opened (its exit file tells how it ended)


@dataclass(frozen=True, slots=True)
class NotStarted:
    message: str
    permanent: bool


class SpawnerDied(Exception):
    """The spawner went away in the middle of a request: what it started is unknown."""


class _Spawner:
    def __init__(self, env: dict[str, str]) -> None:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        os.set_inheritable(child.fileno(), True)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-S", str(Path(spawner_main.__file__).resolve()), str(child.fileno())],
                stdin=subprocess.DEVNULL, pass_fds=(child.fileno(),), close_fds=True,
                start_new_session=True,  # Ctrl-C at the daemon's terminal is the daemon's business
                env=env,  # what every task starts from (task_env.py): not the daemon's whole environment
            )
        finally:
            child.close()
        self.sock = parent
        self._buf = b""
        self._fds: list[int] = []

    def spawn(self, tasks: list[dict[str, object]]) -> list[Started | NotStarted]:
        body = json.dumps({"tasks": tasks}).encode()
        try:
            self.sock.sendall(_HEADER.pack(len(body)) + body)
            reply = json.loads(self._read_frame())
        except (OSError, EOFError, ValueError) as e:
            raise SpawnerDied(str(e) or type(e).__name__) from None
        out: list[Started | NotStarted] = []
        for r in reply["results"]:
            if "error" in r:
                out.append(NotStarted(str(r["error"]), bool(r["permanent"])))
            else:
                out.append(Started(int(r["pid"]), self._fds.pop(0) if r["pidfd"] else None))
        return out

    def _read_frame(self) -> bytes:
        while True:
            if len(self._buf) >= _HEADER.size:
                (size,) = _HEADER.unpack_from(self._buf)
                if len(self._buf) >= _HEADER.size + size:
                    frame = self._buf[_HEADER.size:_HEADER.size + size]
                    self._buf = self._buf[_HEADER.size + size:]
                    return frame
            data, fds, _flags, _addr = socket.recv_fds(self.sock, 1 << 16, _MAX_FDS)
            if not data:
                raise EOFError("the spawner exited")
            for fd in fds:
                os.set_inheritable(fd, False)
            self._fds += fds
            self._buf += data

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()
        for fd in self._fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        with contextlib.suppress(Exception):
            self.proc.wait(5)


class SpawnerPool:
    def __init__(self, size: int = 4, env: dict[str, str] | None = None) -> None:
        """`env`: the environment of the spawners, which every task starts from (default: the allow-listed part
        of the daemon's, task_env.py)."""
        self._env = env if env is not None else inherited(os.environ)
        self._sem = threading.BoundedSemaphore(size)
        self._lock = threading.Lock()
        self._idle: list[_Spawner] = []
        self._all: list[_Spawner] = []
        self._closed = False

    @contextlib.contextmanager
    def _get(self) -> Iterator[_Spawner]:
        with self._sem:
            with self._lock:
                if self._closed:
                    raise SpawnerDied("the local backend is stopping")
                sp = self._idle.pop() if self._idle else None
            if sp is not None and sp.proc.poll() is not None:  # died while idle: replace it, nothing was lost
                log.warning("local backend: a spawner exited (code %s); starting another", sp.proc.returncode)
                with self._lock:
                    if sp in self._all:
                        self._all.remove(sp)
                sp.close()
                sp = None
            if sp is None:
                sp = _Spawner(self._env)
                with self._lock:
                    self._all.append(sp)
            ok = False
            try:
                yield sp
                ok = True
            finally:
                with self._lock:
                    if ok and not self._closed:
                        self._idle.append(sp)
                    else:
                        if sp in self._all:
                            self._all.remove(sp)
                if not ok:
                    sp.close()

    def spawn(self, tasks: list[dict[str, object]]) -> list[Started | NotStarted]:
        """Start `tasks` in order (stopping at the first that cannot be started). SpawnerDied if the spawner
        went away meanwhile (it is replaced next time)."""
        with self._get() as sp:
            return sp.spawn(tasks)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            spawners, self._all, self._idle = list(self._all), [], []
        for sp in spawners:
            sp.close()
