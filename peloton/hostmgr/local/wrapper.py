"""What a task's wrapper leaves in its sandbox (see spawner.py for the wrapper itself): its pid in `pids`, the
command's exit status in `exit`. Readers for both, which also understand the JSON files of the Python runner of
earlier releases, and a check that a pid is still the wrapper of a given sandbox."""

from __future__ import annotations

import errno
import json
import os
import signal
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from peloton.hostmgr.local.spawner import EXIT_FILE, PIDS_FILE, SHELL, STDERR_FILE, STDOUT_FILE, WARM_MARK, WORK_DIR

__all__ = ["EXIT_FILE", "PIDS_FILE", "SHELL", "STDERR_FILE", "STDOUT_FILE", "WORK_DIR", "ExitRecord", "is_wrapper",
           "open_task_file", "read_exit", "read_pid"]

_SMALL = 4096  # the most read of `pids` and `exit`
_WARM = WARM_MARK.encode()


def open_task_file(path: Path) -> int:
    """A descriptor to read a file of a sandbox, which the task's user owns and could have replaced: never through
    a symlink (a root daemon would read what it points at for the user), never a FIFO or device (opening one can
    block, reading one can go on for ever). Raises OSError."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, f"{path} is not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _read_small(path: Path) -> tuple[str, float]:
    """The text of a small sandbox file and its mtime. Raises OSError."""
    with os.fdopen(open_task_file(path), "rb") as f:
        data = f.read(_SMALL)
        return data.decode("utf-8", errors="replace").strip(), os.fstat(f.fileno()).st_mtime


@dataclass(frozen=True, slots=True)
class ExitRecord:
    exit_code: int | None  # None when the command was killed by a signal
    signal: int | None
    finished_at: float


def read_exit(sandbox: Path) -> ExitRecord | None:
    """The command's end as the wrapper recorded it; None if it has not (the wrapper died first, or was never
    started)."""
    try:
        text, finished = _read_small(sandbox / EXIT_FILE)
    except OSError:
        return None
    if text.startswith("{"):
        try:
            doc = json.loads(text)
        except ValueError:
            return None
        code, sig = doc.get("exit_code"), doc.get("signal")
        at = doc.get("finished_at")
        return ExitRecord(code if isinstance(code, int) else None, sig if isinstance(sig, int) else None,
                          float(at) if isinstance(at, (int, float)) else finished)
    try:
        rc = int(text)
    except ValueError:
        return None
    if rc > 128 and rc - 128 < signal.NSIG:  # the shell's way of saying "killed by signal rc-128"
        return ExitRecord(None, rc - 128, finished)
    return ExitRecord(rc, None, finished)


def read_pid(sandbox: Path) -> int:
    """The wrapper's pid as it wrote it (0 if not written)."""
    try:
        text, _ = _read_small(sandbox / PIDS_FILE)
    except OSError:
        return 0
    if text.startswith("{"):
        try:
            v = json.loads(text).get("wrapper_pid")
        except (ValueError, AttributeError):
            return 0
        return v if isinstance(v, int) else 0
    try:
        return int(text)
    except ValueError:
        return 0


def is_wrapper(pid: int, sandbox: Path, attempts: int = 20) -> bool:
    """Process `pid` is alive (not a zombie) and is the wrapper of `sandbox` (its command line names the sandbox),
    not a stranger that was given the pid after the wrapper ended."""
    for _ in range(attempts):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            state = Path(f"/proc/{pid}/stat").read_text(errors="replace").rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return False
        if state in ("Z", "X"):
            return False
        args = cmdline.split(b"\0")
        # (a warm wrapper's $0, args[3], is the mark: a command run directly may have it as a word of its own)
        if cmdline and args[3:4] != [_WARM]:
            return str(sandbox).encode() in args
        # a live process with no command line is in the middle of an exec, and a warm wrapper (spawner.py) one
        # that is being handed its task (it executes the task's wrapper next): look again
        time.sleep(0.005)
    return False
