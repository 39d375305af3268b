"""The spawner: a small helper process of the local backend that starts task wrappers, so that starting processes
never competes with the daemon's own threads for the daemon's interpreter lock (CPython's posix_spawn holds it
through vfork and exec) and runs on another core.

The daemon keeps a few of these (one per launch in progress, see SpawnerPool in spawn.py), each started once with
`python -I -S <this file>` (standard library only, no site: it starts in milliseconds) and spoken to over a Unix
stream socket (its descriptor number is the argument): length-prefixed JSON requests, each a list of tasks to start in order; replies with
each task's pid and, passed with SCM_RIGHTS, a pidfd opened at once (so the daemon watches exactly that process,
whatever happens to its pid). It stops at the first task that cannot be started. It exits when the socket closes
(the daemon stopped or died); the tasks, in their own sessions, run on.

What a task runs, started with posix_spawn in a new session (so it leads its process group and outlives the daemon),
with every signal disposition and the signal mask back to the defaults (Python ignores SIGPIPE and SIGXFSZ, and
posix_spawn, unlike subprocess, keeps what is ignored): `/bin/sh` running WRAPPER in the sandbox, which
- writes its pid to `pids` (a daemon killed between spawning and recording the pid finds it there);
- catches SIGTERM (a handler, not "ignore": exec resets caught signals to their default, so the command stays
  killable) so that a SIGTERM to the group stops the command while the wrapper still records the result;
- runs the command with `/bin/sh -c` in `work/` (so `$$` and `exit` in the command are the command's own);
- writes the command's exit status to `exit` (the file's mtime is when it ended);
- SIGKILLs its whole process group, like a container being torn down, so nothing the command left behind runs on.
posix_spawn returns once /bin/sh has been executed: from then on the command is being run (RUNNING).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import socket
import struct
import sys

SHELL = "/bin/sh"
PIDS_FILE = "pids"
EXIT_FILE = "exit"
STDOUT_FILE = "stdout"
STDERR_FILE = "stderr"
WORK_DIR = "work"

WRAPPER = """cd "$1" || exit 127
echo $$ > pids
trap : TERM
cd work && /bin/sh -c "$2"
rc=$?
cd .. && echo $rc > exit
kill -KILL 0
"""

_OUT_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_APPEND
_HEADER = struct.Struct("!I")
_DEFAULT_SIGNALS = tuple(s for s in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGCHLD, signal.SIGINT, signal.SIGTERM,
                                     signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2))


def spawn(sandbox: str, command: str, env: dict[str, str]) -> int:
    """Start the wrapper for `command` in `sandbox` (with its `work/`); its pid is the task's process group id.
    Raises ValueError (NUL bytes) or OSError (E2BIG: too large for exec; ENOENT/EACCES: no shell)."""
    return os.posix_spawn(
        SHELL, [SHELL, "-c", WRAPPER, "peloton-task", sandbox, command], env,
        file_actions=[
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            (os.POSIX_SPAWN_OPEN, 1, f"{sandbox}/{STDOUT_FILE}", _OUT_FLAGS, 0o600),
            (os.POSIX_SPAWN_OPEN, 2, f"{sandbox}/{STDERR_FILE}", _OUT_FLAGS, 0o600),
        ],
        setsid=True, setsigdef=_DEFAULT_SIGNALS, setsigmask=(),
    )


def describe(e: BaseException) -> tuple[str, bool]:
    """(message, permanent) for a task that could not be started."""
    if isinstance(e, ValueError):  # an embedded NUL byte in the command or the environment
        return f"the command cannot be started: {e}", True
    if isinstance(e, OSError):
        if e.errno == errno.E2BIG:
            return "the command and its environment are too large to start (Argument list too long)", True
        if e.errno in (errno.ENOENT, errno.EACCES, errno.ENOEXEC):
            return f"cannot start {SHELL}: {e.strerror}", True
        return f"cannot start the task: {e.strerror or e}", False
    return f"cannot start the task: {e}", False


def prepare(sandbox: str, files: dict[str, str]) -> None:
    """A fresh sandbox with its `work/` and the launch's files (an earlier try of the same task id is removed:
    it is not running)."""
    if os.path.exists(sandbox):
        shutil.rmtree(sandbox)
    os.makedirs(sandbox, 0o700)  # owner-only: the logs and files of a task are its submitter's business
    os.mkdir(os.path.join(sandbox, WORK_DIR), 0o700)
    for name, content in files.items():
        path = os.path.join(sandbox, name)
        os.makedirs(os.path.dirname(path), 0o700, exist_ok=True)
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w", encoding="utf-8") as f:
            f.write(content)


def start(task: dict[str, object], base_env: dict[str, str]) -> tuple[dict[str, object], int | None]:
    """Start one task: (its reply entry, its pidfd or None)."""
    sandbox = str(task["sandbox"])
    try:
        prepare(sandbox, dict(task.get("files") or {}))  # type: ignore[call-overload]
    except OSError as e:
        return {"error": f"cannot prepare the sandbox: {e}", "permanent": False}, None
    env = dict(base_env)
    env.update(task.get("env") or {})  # type: ignore[call-overload]
    try:
        pid = spawn(sandbox, str(task["command"]), env)
    except (ValueError, OSError) as e:
        msg, permanent = describe(e)
        return {"error": msg, "permanent": permanent}, None
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:  # already over and reaped: the daemon reads its exit file
        return {"pid": pid, "pidfd": False}, None
    return {"pid": pid, "pidfd": True}, fd


def _read_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return bytes(buf)


def serve(sock: socket.socket) -> None:
    base_env = dict(os.environ)
    while True:
        try:
            (size,) = _HEADER.unpack(_read_exact(sock, _HEADER.size))
            request = json.loads(_read_exact(sock, size))
        except (EOFError, ConnectionError):
            return
        replies: list[dict[str, object]] = []
        fds: list[int] = []
        for task in request["tasks"]:
            entry, fd = start(task, base_env)
            replies.append(entry)
            if fd is not None:
                fds.append(fd)
            if "error" in entry:
                break
        body = json.dumps({"results": replies}).encode()
        frame = _HEADER.pack(len(body)) + body
        try:
            sent = sock.sendmsg([frame], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, bytes(_ints(fds)))] if fds else [])
            if sent < len(frame):
                sock.sendall(frame[sent:])
        except (BrokenPipeError, ConnectionError):
            return
        finally:
            for fd in fds:
                os.close(fd)


def _ints(fds: list[int]) -> bytes:
    return struct.pack(f"{len(fds)}i", *fds)


def main() -> int:
    # Children are reaped by the kernel (the daemon learns of their end through the pidfds and the exit files);
    # Ctrl-C at the daemon's terminal is the daemon's business, not the spawner's.
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    fd = int(sys.argv[1])  # the daemon's end of the socket pair is its; this is ours
    os.set_inheritable(fd, False)  # never into a task
    sock = socket.socket(fileno=fd)
    try:
        serve(sock)
    finally:
        sock.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
