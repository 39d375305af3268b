"""Owner-only files: the data dir (the store, the local backend's journal, sandboxes and task logs) is created 0700
and its files 0600, and a daemon tightens what it finds looser at start, so no other local user can read a job's
environment, its logs or the store. Group and other bits are removed; the owner's are kept.

Everything is created with its mode (os.open, os.mkdir: the umask can only take bits away), never created with the
umask's and tightened after: for a moment another user could open it. Directories above, when missing, too
(`mkdir(parents=True)` gives them the umask's mode); and what a library creates by itself (gRPC's Unix sockets)
under an owner-only umask.

A daemon running as root runs tasks as other users (task.user), who must reach their sandboxes: it keeps the
directories on the way traversable (0711: others may pass through by exact name, never list or read); every file
stays 0600 and each sandbox 0700, owned by its task's user."""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

from peloton.errors import InvalidArgument

log = logging.getLogger(__name__)


TRAVERSE = 0o011  # group and other may pass through a directory, not list it


def tasks_run_as_others() -> bool:
    """Whether this process can start tasks as other users (it runs as root)."""
    return os.geteuid() == 0


def warn_untraversable(path: Path) -> None:
    """A root daemon's tasks run as other users: say so when one of the directories above `path` keeps them out
    (their sandbox still works, being entered before the switch, but not the absolute PELOTON_SANDBOX and
    PELOTON_HOSTFILE paths)."""
    if not tasks_run_as_others():
        return
    for d in path.resolve().parents:
        try:
            mode = d.stat().st_mode
        except OSError:
            continue
        if not mode & 0o001:
            log.warning("%s does not let other users pass (mode %o): tasks running as other users cannot open "
                        "$PELOTON_SANDBOX or $PELOTON_HOSTFILE by path under %s; give it o+x or use a --data-dir "
                        "such as /var/lib/peloton", d, stat.S_IMODE(mode), path)
            return


def tighten(path: Path, keep_traverse: bool = False) -> bool:
    """Remove group and other permissions from `path` (not following a symlink), but for a directory's traverse
    bits when `keep_traverse`. True when it had some."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return False
    keep = TRAVERSE if keep_traverse and stat.S_ISDIR(st.st_mode) else 0
    extra = st.st_mode & 0o077 & ~keep
    if stat.S_ISLNK(st.st_mode) or not extra:
        return False
    mode = stat.S_IMODE(st.st_mode)
    os.chmod(path, mode & ~extra)
    log.warning("tightened %s from %o to %o (owner-only: docs/security.md)", path, mode, mode & ~extra)
    return True


def make_dirs(path: Path, traversable: bool = False) -> None:
    """`path` and each missing directory above it, each created 0700 (0711: `traversable`); what exists is left
    as it is."""
    missing = []
    p = Path(os.path.abspath(path))
    while not os.path.lexists(p) and p != p.parent:
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        with contextlib.suppress(FileExistsError):  # made meanwhile (by another daemon starting)
            os.mkdir(d, 0o711 if traversable else 0o700)


def create_private(path: Path, flags: int = os.O_WRONLY) -> int:
    """A descriptor of `path`, created 0600 if it was not there (O_CREAT; add O_TRUNC, O_EXCL, ... in `flags`)."""
    return os.open(path, flags | os.O_CREAT | os.O_CLOEXEC, 0o600)


_UMASK = threading.Lock()


@contextlib.contextmanager
def owner_only_umask() -> Iterator[None]:
    """What the process creates meanwhile (a library's socket, whose mode it does not take) is owner-only: the umask
    is the process's, so only around creations at start, where at worst another thread's file comes out tighter."""
    with _UMASK:
        old = os.umask(0o077)
        try:
            yield
        finally:
            os.umask(old)


def private_dir(path: Path, traversable: bool = False) -> None:
    """`path` exists as a directory only its owner can enter (or, `traversable`, pass through: 0711); the entries
    directly in it lose group and other permissions too (what is deeper cannot be reached through it by anyone
    else), directories keeping their traverse bits when `traversable`."""
    make_dirs(path, traversable)
    tighten(path, keep_traverse=traversable)
    if traversable:
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & TRAVERSE != TRAVERSE:
            os.chmod(path, mode | TRAVERSE)
    for child in path.iterdir():
        tighten(child, keep_traverse=traversable)


def private_file(path: Path) -> None:
    """`path` exists (empty if it was not there) with mode 0600 or tighter: created so before anyone writes it
    (SQLite gives its -wal and -shm files the database file's mode)."""
    try:
        os.close(create_private(path, os.O_WRONLY | os.O_EXCL))
    except FileExistsError:
        tighten(path)


def size_text(n: int) -> str:
    """`n` bytes as an operator reads it: "4 MiB", "512 KiB", "1000 bytes"."""
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} bytes"


def refuse_larger(raw: bytes | str, most: int, name: str, kind: str, field: str | None = None) -> None:
    """InvalidArgument naming the file (`name`: its flag and path, or its path), the limit and what the file is
    (`kind`: "a spec file") when `raw`, read up to `most` + 1, is over `most`."""
    if len(raw) > most:
        raise InvalidArgument(f"{name}: larger than the {most} bytes ({size_text(most)}) {kind} may have",
                              field=field or name)


def read_bounded(path: str | os.PathLike[str], most: int, name: str, kind: str, field: str | None = None) -> bytes:
    """The bytes of the file at `path`, read up to `most` and no further: a larger one, or one without end (a pipe,
    /dev/zero, whose size stat() says is 0) is refused once `most` + 1 bytes have come (`refuse_larger`), so no file
    named by mistake takes memory without end. An OSError of the open or the read is the caller's to word."""
    with open(path, "rb") as f:
        raw = f.read(most + 1)
    refuse_larger(raw, most, name, kind, field)
    return raw
