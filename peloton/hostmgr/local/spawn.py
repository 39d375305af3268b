"""The daemon's side of the spawner (spawner.py): a small pool of spawner processes, each used by one launch at a
time; a launch splits its members over the spawners free at that moment (spawn_many), so a gang's members start in
parallel, and launches in parallel start their tasks in parallel with nothing shared between them (no lock is held
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
    warm: bool = False  # handed a warm wrapper (spawner.py), not started by a spawn


@dataclass(frozen=True, slots=True)
class NotStarted:
    message: str
    permanent: bool


class SpawnerDied(Exception):
    """The spawner went away in the middle of a request: what it started is unknown."""


@dataclass(frozen=True, slots=True)
class Unknown:
    """spawn_many: the spawner that had this task died in the middle of its request: whether it started is
    unknown (its wrapper, if any, wrote its pid)."""

    message: str


class _Spawner:
    def __init__(self, env: dict[str, str], warm: int = 0) -> None:
        """`warm`: how many warm wrappers (spawner.py) it may keep per user."""
        try:
            parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        except OSError as e:  # (EMFILE) as a spawner that died: the launch fails, registering nothing for good
            raise SpawnerDied(f"cannot start a spawner: {e.strerror or e}") from None
        os.set_inheritable(child.fileno(), True)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-S", str(Path(spawner_main.__file__).resolve()), str(child.fileno()),
                 str(warm)],
                stdin=subprocess.DEVNULL, pass_fds=(child.fileno(),), close_fds=True,
                start_new_session=True,  # Ctrl-C at the daemon's terminal is the daemon's business
                env=env,  # what every task starts from (task_env.py): not the daemon's whole environment
            )
        except (OSError, subprocess.SubprocessError) as e:  # a fork refused (EAGAIN, ENOMEM), the program gone
            parent.close()
            raise SpawnerDied(f"cannot start a spawner: {getattr(e, 'strerror', None) or e}") from None
        finally:
            child.close()
        self.sock = parent
        self._buf = b""
        self._fds: list[int] = []

    def spawn(self, tasks: list[dict[str, object]]) -> list[Started | NotStarted | None]:
        self.send(tasks)
        out = self.receive()
        self.let_go()
        return out

    def send(self, tasks: list[dict[str, object]]) -> None:
        self._frame({"tasks": tasks})

    def let_go(self) -> None:
        """Tell the spawner to move the wrappers it started into their cgroups and let them run (spawner.py: a
        move stalls every fork on the machine for a grace period, so a launch's moves wait until every spawner of
        the launch has answered). No reply; a spawner gone meanwhile let them go as it saw its socket close."""
        with contextlib.suppress(SpawnerDied):
            self._frame({"go": True})

    def _frame(self, doc: dict[str, object]) -> None:
        body = json.dumps(doc).encode()
        try:
            self.sock.sendall(_HEADER.pack(len(body)) + body)
        except OSError as e:
            raise SpawnerDied(str(e) or type(e).__name__) from None

    def receive(self) -> list[Started | NotStarted | None]:
        """The reply to the request sent: one entry per task tried (None: skipped, as another task of its group
        could not start)."""
        try:
            reply = json.loads(self._read_frame())
        except (OSError, EOFError, ValueError) as e:
            raise SpawnerDied(str(e) or type(e).__name__) from None
        out: list[Started | NotStarted | None] = []
        for r in reply["results"]:
            if "skipped" in r:
                out.append(None)
            elif "error" in r:
                out.append(NotStarted(str(r["error"]), bool(r["permanent"])))
            else:
                out.append(Started(int(r["pid"]), self._fds.pop(0) if r["pidfd"] else None, bool(r.get("warm"))))
        return out

    def _read_frame(self) -> bytes:
        while True:
            if len(self._buf) >= _HEADER.size:
                (size,) = _HEADER.unpack_from(self._buf)
                if len(self._buf) >= _HEADER.size + size:
                    frame = self._buf[_HEADER.size:_HEADER.size + size]
                    self._buf = self._buf[_HEADER.size + size:]
                    return frame
            data, fds = spawner_main.recv_fds_cloexec(self.sock, 1 << 16, _MAX_FDS)
            if not data:
                raise EOFError("the spawner exited")
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
    def __init__(self, size: int = 4, env: dict[str, str] | None = None, warm: int = 0) -> None:
        """`env`: the environment of the spawners, which every task starts from (default: the allow-listed part
        of the daemon's, task_env.py). `warm`: the warm wrappers each spawner may keep per user (spawner.py)."""
        before, now = spawner_main.raise_fd_limit()  # (the spawners inherit it)
        if now != before:
            log.info("local backend: open descriptors' soft limit raised from %d to %d", before, now)
        self._env = env if env is not None else inherited(os.environ)
        self._warm = warm
        self.size = size
        self._sem = threading.BoundedSemaphore(size)
        self._lock = threading.Lock()
        self._idle: list[_Spawner] = []
        self._all: list[_Spawner] = []
        self._closed = False

    def _take(self) -> _Spawner:
        """An idle spawner, or a new one (a permit of _sem is held)."""
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
            sp = _Spawner(self._env, self._warm)
            with self._lock:
                self._all.append(sp)
        return sp

    def _give_back(self, sp: _Spawner, ok: bool) -> None:
        with self._lock:
            if ok and not self._closed:
                self._idle.append(sp)
            elif sp in self._all:
                self._all.remove(sp)
        if not ok:
            sp.close()

    @contextlib.contextmanager
    def _get(self) -> Iterator[_Spawner]:
        """A spawner, waited for; given back at the end (closed if the block raised)."""
        with self._sem:
            sp = self._take()
            ok = False
            try:
                yield sp
                ok = True
            finally:
                self._give_back(sp, ok)

    def spawn(self, tasks: list[dict[str, object]]) -> list[Started | NotStarted]:
        """Start `tasks` in order (stopping at the first that cannot be started). SpawnerDied if the spawner
        went away meanwhile (it is replaced next time)."""
        with self._get() as sp:
            return [r for r in sp.spawn(tasks) if r is not None]

    def spawn_many(self, tasks: list[dict[str, object]], per_spawner: int = 2
                   ) -> list[Started | NotStarted | Unknown | None]:
        """Start `tasks` in parallel over as many spawners as are free (up to one per `per_spawner` tasks; at
        least one, waited for), each taking a contiguous share. A task's `group` (its gang) is skipped by its
        spawner after another task of the group failed there (None: skipped). One entry per task, in order; a
        spawner that died gives its tasks Unknown (it is replaced next time). No lock is held while a spawner
        works: the requests go out first, then the replies are read. Once every reply is in, each spawner is told
        to move the wrappers it started into their cgroups (let_go) and given back: a move stalls every fork on
        the machine for a grace period (spawner.py), which would otherwise fall on the spawners still starting
        this launch's members (a launch beside this one thus waits for this launch's last spawner to answer)."""
        if not tasks:
            return []
        want = max(1, min(self.size, -(-len(tasks) // max(1, per_spawner))))
        self._sem.acquire()
        permits = 1
        while permits < want and self._sem.acquire(blocking=False):
            permits += 1
        sps: list[_Spawner | None] = []
        try:
            for _ in range(permits):
                sps.append(self._take())
        except BaseException:
            for sp in sps:
                assert sp is not None
                self._give_back(sp, False)
            for _ in range(permits):
                self._sem.release()
            raise
        n = len(sps)
        bounds = [len(tasks) * i // n for i in range(n + 1)]
        sent: list[str] = []
        for i, sp in enumerate(sps):
            assert sp is not None
            try:
                sp.send(tasks[bounds[i]:bounds[i + 1]])
                sent.append("")
            except SpawnerDied as e:
                sent.append(str(e) or "its socket is closed")
        out: list[Started | NotStarted | Unknown | None] = []
        answered: list[_Spawner] = []
        try:
            for i, sp in enumerate(sps):
                assert sp is not None
                share = bounds[i + 1] - bounds[i]
                try:
                    if sent[i]:
                        raise SpawnerDied(sent[i])
                    got: list[Started | NotStarted | Unknown | None] = list(sp.receive())
                    got += [None] * (share - len(got))  # after a task of no group failed: not tried
                    answered.append(sp)
                except SpawnerDied as e:
                    log.error("local backend: a spawner died while starting %d tasks: %s", share, e)
                    got = [Unknown(f"the process starting tasks died: {e}")] * share
                    sps[i] = None
                    self._give_back(sp, False)
                    self._sem.release()
                out += got
            for sp in answered:  # every reply is in: the moves into cgroups stall no spawn of this launch now
                sp.let_go()
            for i, sp in enumerate(sps):
                if sp is not None:
                    sps[i] = None
                    self._give_back(sp, True)
                    self._sem.release()
        finally:  # (an exception above: what was not read is lost, as its spawners are; they let go as they close)
            for sp in sps:
                if sp is not None:
                    self._give_back(sp, False)
                    self._sem.release()
        return out

    def close(self) -> None:
        with self._lock:
            self._closed = True
            spawners, self._all, self._idle = list(self._all), [], []
        for sp in spawners:
            sp.close()
