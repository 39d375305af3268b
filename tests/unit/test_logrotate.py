"""Task logs kept in bounds (local backend, logrotate.py): copy and truncate past the cap, keep N rotated files,
offsets of the whole stream across them, nothing written through a link the task's user put in the sandbox, and a
real task writing while its log is rotated under it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from peloton.hostmgr.local import logrotate
from peloton.hostmgr.local.backend import LocalBackend
from tests.unit.test_local_backend import Recorder, launch, make_backend, spec  # noqa: F401 - fixture

MiB = 1 << 20


def _sandbox(tmp_path: Path) -> Path:
    sb = tmp_path / "sb"
    sb.mkdir()
    return sb


def _append(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def _whole(sb: Path, keep: int = 2) -> bytes:
    data, _ = logrotate.read(sb, "stdout", 0, 1 << 30, keep)
    return data


def test_under_the_cap_nothing_moves(tmp_path: Path) -> None:
    sb = _sandbox(tmp_path)
    _append(sb / "stdout", b"x" * 1000)
    assert logrotate.rotate(sb, "stdout", 1000, 2) == 0
    assert sorted(p.name for p in sb.iterdir()) == ["stdout"]
    assert logrotate.rotate(sb, "stderr", 1000, 2) == 0  # no such log yet


def test_past_the_cap_it_is_copied_truncated_and_offsets_go_on(tmp_path: Path) -> None:
    sb = _sandbox(tmp_path)
    first = b"".join(b"line %06d\n" % i for i in range(300_000))  # 3.3 MB
    _append(sb / "stdout", first)
    assert logrotate.rotate(sb, "stdout", MiB, 2) == len(first)
    assert (sb / "stdout").stat().st_size == 0 and (sb / "stdout.1").read_bytes() == first
    assert logrotate.base_offset(sb, "stdout") == len(first)
    _append(sb / "stdout", b"after\n")
    # offsets are the stream's: the new bytes come after the rotated ones, wherever a read starts
    assert logrotate.read(sb, "stdout", len(first), 100, 2) == (b"after\n", len(first) + 6)
    assert logrotate.read(sb, "stdout", -16, 100, 2) == (b"line 299999\nafter\n"[-16:], len(first) + 6)
    assert _whole(sb) == first + b"after\n"
    assert logrotate.read(sb, "stdout", 12, 11, 2) == (b"line 000001", 23)
    assert logrotate.read(sb, "stdout", 10**12, 100, 2) == (b"", len(first) + 6)


def test_only_keep_files_are_kept_and_older_offsets_read_from_the_oldest(tmp_path: Path) -> None:
    sb = _sandbox(tmp_path)
    chunks = [bytes([65 + i]) * (MiB + 10) for i in range(4)]  # AAAA..., BBBB..., ...
    for c in chunks:
        _append(sb / "stdout", c)
        assert logrotate.rotate(sb, "stdout", MiB, 2) == len(c)
    assert sorted(p.name for p in sb.iterdir()) == ["stdout", "stdout.1", "stdout.2", "stdout.offset"]
    assert (sb / "stdout.1").read_bytes() == chunks[3] and (sb / "stdout.2").read_bytes() == chunks[2]
    data, nxt = logrotate.read(sb, "stdout", 0, 100, 2)  # the first two chunks are gone: from the oldest kept
    assert data == b"C" * 100 and nxt == 2 * len(chunks[0]) + 100
    assert _whole(sb) == chunks[2] + chunks[3]
    # a tail longer than the current file spans the rotated ones, in order
    _append(sb / "stdout", b"tail")
    assert logrotate.read(sb, "stdout", -8, 100, 2)[0] == b"DDDDtail"


def test_a_link_in_the_sandbox_is_never_written_through(tmp_path: Path) -> None:
    sb = _sandbox(tmp_path)
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    os.symlink(victim, sb / "stdout.1")  # the task's user put it there
    os.symlink(victim, sb / ".stdout.offset.tmp")
    _append(sb / "stdout", b"y" * (MiB + 1))
    assert logrotate.rotate(sb, "stdout", MiB, 2) == MiB + 1
    assert victim.read_bytes() == b"precious"
    assert not (sb / "stdout.1").is_symlink() and (sb / "stdout.1").stat().st_size == MiB + 1
    # the log itself replaced by a link, or by a file with another name too: not rotated, not truncated
    (sb / "stdout").unlink()
    os.symlink(victim, sb / "stdout")
    assert logrotate.rotate(sb, "stdout", 1, 2) == 0 and victim.read_bytes() == b"precious"
    (sb / "stdout").unlink()
    os.link(victim, sb / "stdout")
    assert logrotate.rotate(sb, "stdout", 1, 2) == 0 and victim.read_bytes() == b"precious"


def test_a_writer_that_goes_on_during_rotations_loses_at_most_a_little(tmp_path: Path) -> None:
    """A process appends numbered lines as fast as it can while the log is rotated again and again: what is read
    back (oldest kept on) is in order, without duplicates, ends with the last line, and has at most one gap per
    rotation (each can lose only what the task wrote between its last copy and the truncation). How much a gap
    holds depends on how long the rotating thread was descheduled in that instant, so it is printed, not bounded."""
    sb = _sandbox(tmp_path)
    writer = subprocess.Popen([sys.executable, "-c", (
        "import os, sys\n"
        "fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)\n"
        "for i in range(400000): os.write(fd, b'%07d\\n' % i)\n"), str(sb / "stdout")])
    rotations = 0
    while writer.poll() is None:
        rotations += bool(logrotate.rotate(sb, "stdout", 256 << 10, 100))
    assert writer.wait() == 0 and rotations >= 3
    lines = _whole(sb, keep=100).split(b"\n")[:-1]
    numbers = [int(x) for x in lines if len(x) == 7 and x.isdigit()]
    assert numbers == sorted(set(numbers)), "out of order or duplicated"
    assert numbers[-1] == 399_999
    gaps = sum(1 for a, b in zip(numbers, numbers[1:], strict=False) if b != a + 1) + (numbers[0] != 0)
    # (the oldest lines may be gone with the oldest rotated file beyond `keep`: none are here, keep=100)
    assert gaps <= rotations, (gaps, rotations)
    print(f"{rotations} rotations, {gaps} gaps, {400_000 - len(numbers)} of 400,000 lines lost")


def test_the_backend_rotates_a_running_task_and_reads_across(
        make_backend: Callable[..., tuple[LocalBackend, Recorder]], tmp_path: Path) -> None:  # noqa: F811
    b, rec = make_backend(log_max_bytes=MiB, log_check_s=0.05)
    launch(b, spec("t-log", "i=0; while [ $i -lt 60 ]; do head -c 65536 /dev/zero | tr '\\0' a; echo; "
                            "i=$((i+1)); sleep 0.02; done; echo the-end", "local-0"))
    assert rec.wait_terminal("t-log", timeout=60).exit_code == 0
    sandbox = tmp_path / "sandboxes" / "t-log"
    assert (sandbox / "stdout.1").exists() and logrotate.base_offset(sandbox, "stdout") > 0
    size = logrotate.base_offset(sandbox, "stdout") + (sandbox / "stdout").stat().st_size
    data, nxt = b.read_log("t-log", "stdout", -8, 100)
    assert data == b"\nthe-end\n"[-8:] and nxt == size
    assert (sandbox / "stdout").stat().st_size <= 2 * MiB  # bounded (checked every 50 ms here)


def test_rotation_keeps_up(tmp_path: Path) -> None:
    """(A timing printed, not asserted: how long rotating a 100 MiB log takes.)"""
    sb = _sandbox(tmp_path)
    with open(sb / "stdout", "wb") as f:
        f.truncate(100 * MiB)
    t = time.perf_counter()
    assert logrotate.rotate(sb, "stdout", MiB, 2) == 100 * MiB
    print(f"rotating 100 MiB: {time.perf_counter() - t:.3f} s")


def test_a_read_that_overlaps_a_rotation_is_done_again_and_holds_up_no_other_log(
        make_backend: Callable[..., tuple[LocalBackend, Recorder]], tmp_path: Path,  # noqa: F811
        monkeypatch: object) -> None:
    """No lock is held across a log's read or rotation: a read of a log being rotated waits for that rotation
    only, another log is read meanwhile, and a read during which a rotation began is done again."""
    import threading

    b, _ = make_backend(log_max_bytes=MiB)
    sa, sb = _sandbox(tmp_path), tmp_path / "other"
    sb.mkdir()
    for s in (sa, sb):
        _append(s / "stdout", b"x" * 10)
    with b._logs_cond:  # a rotation of sa's stdout is under way
        b._rotating.add((sa, "stdout"))
        b._rotations += 1
    other: list[tuple[bytes, int]] = []  # another log: at once (waiting for sa's rotation, it would never end)
    reader = threading.Thread(target=lambda: other.append(b._read_rotated(sb, "stdout", 0, 100)))
    reader.start()
    reader.join(30)
    assert other == [(b"x" * 10, 10)]
    got: list[tuple[bytes, int]] = []
    waiter = threading.Thread(target=lambda: got.append(b._read_rotated(sa, "stdout", 0, 100)))
    waiter.start()
    time.sleep(0.2)
    assert not got  # waits for that rotation
    with b._logs_cond:
        b._rotating.discard((sa, "stdout"))
        b._logs_cond.notify_all()
    waiter.join(5)
    assert got == [(b"x" * 10, 10)]

    real, calls = logrotate.read, []

    def overlapped(*a: object, **k: object) -> tuple[bytes, int]:
        calls.append(1)
        if len(calls) == 1:  # a rotation begins while this read goes on: its answer is not used
            with b._logs_cond:
                b._rotations += 1
            return b"stale", 5
        return real(*a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(logrotate, "read", overlapped)  # type: ignore[attr-defined]
    assert b._read_rotated(sa, "stdout", 0, 100) == (b"x" * 10, 10) and len(calls) == 2
