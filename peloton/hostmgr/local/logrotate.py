"""A task's stdout and stderr kept in bounds: when one grows past its cap it is rotated, and reads see one stream.

The task writes its logs itself, with O_APPEND, on descriptors the daemon does not hold (it must outlive the
daemon), so a log cannot be renamed away from under it: it is copied and truncated (logrotate's `copytruncate`).
Rotation of `stdout`:

1. a new file gets what `stdout` holds, copied in rounds until little is left, the last round right before
   `stdout` is truncated to 0 (the task's next write lands at its start: O_APPEND). What the task writes in the
   instant between that last copy and the truncation is lost, as with logrotate;
2. `stdout.1` becomes `stdout.2` (and so on; beyond `keep` the oldest is removed), and the new file `stdout.1`;
3. `stdout.offset` records how many bytes came before `stdout`'s first byte, so offsets (`task logs -f`, paging)
   stay those of the whole stream: `read` serves an offset from whichever file holds it, and one older than what is
   kept from the oldest kept byte.
A rotation that fails before the truncation (a full disk) has changed nothing: no file moved, no byte lost.

The sandbox belongs to the task's user, who could put a link where the daemon writes: files are created with
O_EXCL|O_NOFOLLOW after unlinking what was there, read and truncated only as regular files with one link
(wrapper.open_task_file), and given to the sandbox's owner. A user can only spoil their own logs.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
from pathlib import Path

from peloton.hostmgr.local.wrapper import open_task_file

log = logging.getLogger(__name__)

COPY_CHUNK = 1 << 20
LAST_ROUND = 64 << 10  # copy rounds go on until less than this was added during one; then the last, and truncate
MAX_ROUNDS = 8  # a task writing faster than the copy: truncate after this many rounds anyway (more is lost)


def _offset_file(sandbox: Path, stream: str) -> Path:
    return sandbox / f"{stream}.offset"


def _rotated(sandbox: Path, stream: str, i: int) -> Path:
    return sandbox / f"{stream}.{i}"


def base_offset(sandbox: Path, stream: str) -> int:
    """Bytes of the stream before its current file's first byte (0 before any rotation)."""
    try:
        with os.fdopen(open_task_file(_offset_file(sandbox, stream)), "rb") as f:
            return max(0, int(f.read(32).decode("ascii", errors="replace").strip() or 0))
    except (OSError, ValueError):
        return 0


def _size(path: Path) -> int:
    try:
        with os.fdopen(open_task_file(path), "rb") as f:
            return os.fstat(f.fileno()).st_size
    except OSError:
        return 0


def _create(path: Path, owner: tuple[int, int] | None) -> int:
    """A new file of the daemon's at `path` (whatever the user had put there is unlinked first)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    if owner is not None:
        with contextlib.suppress(OSError):
            os.fchown(fd, *owner)
    return fd


def _copy(src: int, dst: int, start: int, end: int) -> None:
    pos = start
    while pos < end:
        data = os.pread(src, min(COPY_CHUNK, end - pos), pos)
        if not data:
            return
        view = memoryview(data)
        while view:  # a write the disk cut short (full) would drop the rest of the chunk: all of it, or OSError
            n = os.write(dst, view)
            if n <= 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            view = view[n:]
        pos += len(data)


def due(sandbox: Path, stream: str, max_bytes: int) -> bool:
    """Whether `stream` is a regular file grown past `max_bytes` (what `rotate` would act on)."""
    try:
        st = os.stat(sandbox / stream, follow_symlinks=False)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_size > max_bytes


def rotate(sandbox: Path, stream: str, max_bytes: int, keep: int) -> int:
    """Rotate `stream` of the sandbox if it is larger than `max_bytes`; the bytes moved out of it (0: nothing to
    do, or it could not be done safely now). Raises nothing: a failure is logged and tried again next time."""
    path = sandbox / stream
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return 0
    if not stat.S_ISREG(st.st_mode) or st.st_size <= max_bytes:
        return 0
    try:
        return _rotate(sandbox, stream, keep, (st.st_uid, st.st_gid) if os.geteuid() == 0 else None)
    except OSError as e:
        log.warning("rotating %s: %s", path, e.strerror or e)
        return 0


def _rotate(sandbox: Path, stream: str, keep: int, owner: tuple[int, int] | None) -> int:
    path = sandbox / stream
    # everything that can fail for want of space is done before the log is truncated and before the rotated files
    # move: the copy goes to a file of its own, the new offset too. A rotation that fails (a full disk: the logs are
    # what fills it) changes nothing, and is tried again at the next check
    tmp, offset_tmp = sandbox / f".{stream}.1.tmp", sandbox / f".{stream}.offset.tmp"
    fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            raise OSError(errno.EINVAL, "not a regular file of its own")
        base = base_offset(sandbox, stream)
        out = _create(tmp, owner)
        try:
            copied = 0
            for _ in range(MAX_ROUNDS):
                end = os.fstat(fd).st_size
                _copy(fd, out, copied, end)
                grew, copied = end - copied, end
                if grew < LAST_ROUND:
                    break
            tfd = _create(offset_tmp, owner)
            try:
                _copy(fd, out, copied, os.fstat(fd).st_size)  # what came during the last round, then at once:
                copied = os.lseek(out, 0, os.SEEK_CUR)
                os.write(tfd, f"{base + copied}\n".encode())
                os.ftruncate(fd, 0)
            finally:
                os.close(tfd)
        except BaseException:
            for leftover in (tmp, offset_tmp):
                with contextlib.suppress(OSError):
                    os.unlink(leftover)
            raise
        finally:
            os.close(out)
    finally:
        os.close(fd)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(_rotated(sandbox, stream, keep))
    for i in range(keep - 1, 0, -1):
        with contextlib.suppress(FileNotFoundError):
            os.rename(_rotated(sandbox, stream, i), _rotated(sandbox, stream, i + 1))
    os.rename(tmp, _rotated(sandbox, stream, 1))
    os.replace(offset_tmp, _offset_file(sandbox, stream))
    return copied


def read(sandbox: Path, stream: str, offset: int, max_bytes: int, keep: int) -> tuple[bytes, int]:
    """Up to `max_bytes` of the stream from `offset` (negative: that far from its end), across its rotated files;
    (data, the offset after it). Offsets are the whole stream's; one older than what is kept reads from the oldest
    byte kept. Raises OSError (FileNotFoundError: no log yet)."""
    base = base_offset(sandbox, stream)
    with os.fdopen(open_task_file(sandbox / stream), "rb") as f:
        end = base + f.seek(0, os.SEEK_END)
    # the kept files, oldest first, as (first offset, path): rotated file i holds the bytes just before file i-1's
    files: list[tuple[int, Path]] = [(base, sandbox / stream)]
    for i in range(1, keep + 1):
        n = _size(_rotated(sandbox, stream, i))
        if not n:
            break
        files.insert(0, (files[0][0] - n, _rotated(sandbox, stream, i)))
    oldest = max(0, files[0][0])
    start = max(oldest, end + offset if offset < 0 else min(offset, end))
    data = bytearray()
    pos = start
    bounds = [o for o, _ in files[1:]] + [end]  # where each file's bytes end
    for (first, path), last in zip(files, bounds, strict=True):
        if pos >= last or len(data) >= max_bytes:
            continue
        want = min(max_bytes - len(data), last - pos)
        with os.fdopen(open_task_file(path), "rb") as g:
            g.seek(pos - first)
            chunk = g.read(want)
        data += chunk
        pos += len(chunk)
        if len(chunk) < want:
            break  # shorter than its place says (rotated meanwhile): the rest on the next read
    return bytes(data), pos
