"""How the suite runs its daemons when it runs as root (as on CI): its tasks write into the tests' private
temporary directories, so they run as root, and its clients call over TCP without tokens. Both are an operator's
explicit choices (`--default-task-user root`, `--insecure`); the secure defaults of a root daemon, which these
override, have their own tests (tests/unit/test_task_user.py, tests/e2e/test_ownership_e2e.py)."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

AS_ROOT = os.geteuid() == 0
AS_ROOT_FLAGS: list[str] = ["--default-task-user", "root", "--insecure"] if AS_ROOT else []
AS_ROOT_SETTINGS: dict[str, Any] = {"default_task_user": "root", "insecure": True} if AS_ROOT else {}


def let_others_pass(path: Path) -> None:
    """Give `path` and every directory above it the traverse bit for other users (no listing, no reading): a task
    running as another user enters its sandbox itself. pytest's tmp_path sits under a root-only directory."""
    for d in (path, *path.parents):
        mode = d.stat().st_mode
        if not mode & 0o001:
            d.chmod(stat.S_IMODE(mode) | 0o001)
