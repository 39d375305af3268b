"""Commands that leave processes behind out of their process group's reach, and how tests find those processes: by
a marker in their environment (ESCAPE_MARK=<mark>-<how>), read from /proc, never by the name of a program."""

from __future__ import annotations

import os
import shlex
import sys
import time
import uuid
from pathlib import Path

VAR = "ESCAPE_MARK"
KINDS = ("setsid", "doublefork", "nohup", "setpgid")
_SETUP = {
    "setsid": "",  # setsid(1) did it
    "doublefork": "os.fork() and os._exit(0); os.setsid(); os.fork() and os._exit(0); ",  # a classic daemon
    "nohup": "",
    "setpgid": "os.setpgid(0, 0); ",
}


def new_mark() -> str:
    return "esc" + uuid.uuid4().hex[:12]


def escape_command(mark: str, then: str = "sleep 600", *, stubborn: bool = False) -> str:
    """A shell command that starts four processes which leave its process group, then runs `then`:
    `setsid ... &`; a double fork with setsid in between; `nohup setsid ... &`; and a process that moves itself
    into a process group of its own (setpgid). Each is a Python that, once it has done so (and with `stubborn`
    ignores SIGTERM, so that only a SIGKILL ends it), creates the file `ready-<how>` in the command's working
    directory (wait_escaped) and sleeps. `mark` may name the shell's variables (`$PELOTON_INSTANCE`)."""

    def sleeper(kind: str) -> str:
        ign = "signal.signal(signal.SIGTERM, signal.SIG_IGN); " if stubborn else ""
        code = f"import os, signal, sys, time; {_SETUP[kind]}{ign}open(sys.argv[1], \"w\").close(); time.sleep(600)"
        return f"env {VAR}={mark}-{kind} {sys.executable} -c {shlex.quote(code)} ready-{kind}"

    return (f"setsid {sleeper('setsid')} & "
            f"{sleeper('doublefork')} & "
            f"nohup setsid {sleeper('nohup')} >/dev/null 2>&1 & "
            f"{sleeper('setpgid')} & "
            f"{then}")


def marked(mark: str) -> dict[int, str]:
    """pid -> how it escaped, of every live (not zombie) process whose environment carries `mark`."""
    want = f"{VAR}={mark}-".encode()
    out: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read()
            with open(f"/proc/{entry}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state in ("Z", "X"):
            continue
        for var in env.split(b"\0"):
            if var.startswith(want):
                out[int(entry)] = var[len(want):].decode()
                break
    return out


def wait_escaped(mark: str, work: Path, timeout: float = 30.0) -> dict[int, str]:
    """Until every escapee of `mark` has done what it does (its file in `work`, the task's working directory); its
    processes."""
    deadline = time.monotonic() + timeout
    while True:
        got = marked(mark)
        if all((work / f"ready-{k}").exists() for k in KINDS) and set(got.values()) >= set(KINDS):
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"the escapees of {mark} did not all start: {sorted(set(got.values()))}")
        time.sleep(0.05)


def wait_gone(mark: str, timeout: float) -> float:
    """Until no process carries `mark`; how long that took. AssertionError naming the survivors otherwise."""
    t0 = time.monotonic()
    while True:
        got = marked(mark)
        if not got:
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"still running {timeout:.1f}s later: {sorted(got.items())}")
        time.sleep(0.05)


def kill_marked(mark: str) -> None:
    """SIGKILL whatever carries `mark` (a test's cleanup, whatever the code under test did)."""
    for pid in marked(mark):
        try:
            os.kill(pid, 9)
        except OSError:
            pass
