"""Owner-only files: the data dir (the store, the local backend's journal, sandboxes and task logs) is created 0700
and its files 0600, and a daemon tightens what it finds looser at start, so no other local user can read a job's
environment, its logs or the store. Group and other bits are removed; the owner's are kept."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

log = logging.getLogger(__name__)


def tighten(path: Path) -> bool:
    """Remove group and other permissions from `path` (not following a symlink). True when it had some."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return False
    if stat.S_ISLNK(st.st_mode) or not st.st_mode & 0o077:
        return False
    mode = stat.S_IMODE(st.st_mode)
    os.chmod(path, mode & ~0o077)
    log.warning("tightened %s from %o to %o (owner-only: docs/security.md)", path, mode, mode & ~0o077)
    return True


def private_dir(path: Path) -> None:
    """`path` exists as a directory only its owner can enter; the entries directly in it lose group and other
    permissions too (what is deeper cannot be reached through it by anyone else)."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    tighten(path)
    for child in path.iterdir():
        tighten(child)


def private_file(path: Path) -> None:
    """`path` exists (empty if it was not there) with mode 0600 or tighter: created so before anyone writes it
    (SQLite gives its -wal and -shm files the database file's mode)."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        tighten(path)
