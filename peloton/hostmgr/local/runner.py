"""The per-task wrapper of the local backend: `python -m peloton.hostmgr.local.runner <sandbox_dir>`.

The backend starts it in a new session, so it leads its own process group and outlives a daemon killed with
SIGKILL. It runs the task's command with `/bin/sh -c` as a child in the same process group, records the pids in
`<sandbox>/pids` and the command's end atomically in `<sandbox>/exit`:
`{"exit_code": int|null, "signal": int|null, "finished_at": epoch}`.

The wrapper ignores SIGTERM, so a SIGTERM to the group stops the command while the wrapper still records the result.
Once the command has ended, anything it left behind in the group is killed (the group, wrapper included, gets SIGKILL
after the exit file is written), like a container being torn down.

Standard library only: this must start fast and must not import the daemon's dependencies.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

TASK_FILE = "task.json"
PIDS_FILE = "pids"
EXIT_FILE = "exit"
STDOUT_FILE = "stdout"
STDERR_FILE = "stderr"
WORK_DIR = "work"


def write_json_atomic(path: Path, data: object) -> None:
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    # A handler rather than SIG_IGN: a caught signal reverts to the default in the exec'd command,
    # an ignored one would be inherited and make the command immune to SIGTERM.
    return None


def run(sandbox: Path) -> int:
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        spec = json.loads((sandbox / TASK_FILE).read_text(encoding="utf-8"))
        command = str(spec.get("command", ""))
        env = {str(k): str(v) for k, v in dict(spec.get("env") or {}).items()}
        work = sandbox / WORK_DIR
        work.mkdir(parents=True, exist_ok=True)
    except (OSError, ValueError, TypeError, AttributeError) as e:
        write_json_atomic(sandbox / PIDS_FILE, {"wrapper_pid": os.getpid(), "child_pid": None})
        write_json_atomic(
            sandbox / EXIT_FILE,
            {"exit_code": 127, "signal": None, "finished_at": time.time(), "error": f"bad {TASK_FILE}: {e}"},
        )
        return 1

    exit_code: int | None
    sig: int | None = None
    error = ""
    with open(sandbox / STDOUT_FILE, "ab") as out, open(sandbox / STDERR_FILE, "ab") as err:
        try:
            child = subprocess.Popen(
                ["/bin/sh", "-c", command],
                cwd=str(work),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                close_fds=True,
            )
        except OSError as e:
            child = None
            error = f"could not start the command: {e}"
            err.write(f"peloton runner: {error}\n".encode())
        write_json_atomic(
            sandbox / PIDS_FILE,
            {"wrapper_pid": os.getpid(), "child_pid": child.pid if child is not None else None},
        )
        if child is None:
            exit_code = 127
        else:
            rc = child.wait()
            if rc < 0:
                exit_code, sig = None, -rc
            else:
                exit_code = rc
    result: dict[str, object] = {"exit_code": exit_code, "signal": sig, "finished_at": time.time()}
    if error:
        result["error"] = error
    write_json_atomic(sandbox / EXIT_FILE, result)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m peloton.hostmgr.local.runner <sandbox_dir>", file=sys.stderr)
        return 2
    rc = run(Path(args[0]))
    # Tear down whatever the command left running in our process group (we lead it: started with setsid).
    if os.getpgid(0) == os.getpid():
        try:
            os.killpg(os.getpid(), signal.SIGKILL)
        except OSError:
            pass
    return rc


if __name__ == "__main__":
    sys.exit(main())
