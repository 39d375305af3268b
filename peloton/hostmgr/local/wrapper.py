"""What a task's wrapper leaves in its sandbox (see spawner.py for the wrapper itself): its pid in `pids`, the
command's exit status in `exit`. Readers for both, which also understand the JSON files of the Python runner of
earlier releases, and a check that a pid is still the wrapper of a given sandbox."""

from __future__ import annotations

import json
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from peloton.hostmgr.local.spawner import EXIT_FILE, PIDS_FILE, SHELL, STDERR_FILE, STDOUT_FILE, WORK_DIR

__all__ = ["EXIT_FILE", "PIDS_FILE", "SHELL", "STDERR_FILE", "STDOUT_FILE", "WORK_DIR", "ExitRecord", "is_wrapper",
           "read_exit", "read_pid"]


@dataclass(frozen=True, slots=True)
class ExitRecord:
    exit_code: int | None  # None when the command was killed by a signal
    signal: int | None
    finished_at: float


def read_exit(sandbox: Path) -> ExitRecord | None:
    """The command's end as the wrapper recorded it; None if it has not (the wrapper died first, or was never
    started)."""
    path = sandbox / EXIT_FILE
    try:
        text = path.read_text(encoding="utf-8", errors="replace").strip()
        finished = path.stat().st_mtime
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
        text = (sandbox / PIDS_FILE).read_text(encoding="utf-8").strip()
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
        if cmdline:
            return str(sandbox).encode() in cmdline.split(b"\0")
        time.sleep(0.005)  # a live process with no command line is in the middle of an exec: look again
    return False
