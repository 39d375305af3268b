"""The local backend's journal (hostmgr/local/journal.py): a record that need not be durable is written by its caller
when nothing is ahead of it (no wake of the writer thread), queued behind what is; the file keeps the appends'
order either way; durable records are fsynced before `append` returns; compaction still comes."""

from __future__ import annotations

import errno
import functools
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from peloton.hostmgr.local import journal as journal_mod
from peloton.hostmgr.local.journal import Journal


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def rec(op: str, task: str) -> dict[str, Any]:
    return {"op": op, "task": task}


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Journal]:
    j = Journal(tmp_path / "journal", snapshot=lambda: [])
    j.start()
    try:
        yield j
    finally:
        j.stop()


def test_a_record_with_nothing_ahead_is_written_by_its_caller_without_waking_the_writer(
        journal: Journal, monkeypatch: pytest.MonkeyPatch) -> None:
    wakes: list[int] = []
    notify = journal._cond.notify

    def counted(n: int = 1) -> None:
        wakes.append(n)
        notify(n)

    monkeypatch.setattr(journal._cond, "notify", counted)
    journal.append([rec("pid", "t-0-1"), rec("end", "t-0-1")])
    assert [r["op"] for r in lines(journal.path)] == ["pid", "end"]  # in the file when append returned
    assert wakes == [] and journal.fsyncs == 0


def test_durable_records_are_fsynced_before_append_returns(journal: Journal) -> None:
    journal.append([rec("start", "t-0-1")], durable=True)
    assert journal.fsyncs == 1 and [r["op"] for r in lines(journal.path)] == ["start"]


def test_a_record_behind_one_being_written_follows_it(journal: Journal, monkeypatch: pytest.MonkeyPatch) -> None:
    in_fsync, go = threading.Event(), threading.Event()
    real_fsync = os.fsync

    def slow_fsync(fd: int) -> None:
        in_fsync.set()
        assert go.wait(10)
        real_fsync(fd)

    monkeypatch.setattr(journal_mod.os, "fsync", slow_fsync)
    durable = threading.Thread(target=lambda: journal.append([rec("start", "a-0-1")], durable=True))
    durable.start()
    assert in_fsync.wait(10)  # the writer thread is in the middle of its batch
    after = threading.Thread(target=lambda: journal.append([rec("pid", "a-0-1")]))
    after.start()
    after.join(10)
    assert not after.is_alive()  # queued, not waiting for the fsync
    go.set()
    durable.join(10)
    deadline = time.monotonic() + 10
    while len(lines(journal.path)) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert [(r["op"], r["task"]) for r in lines(journal.path)] == [("start", "a-0-1"), ("pid", "a-0-1")]


def test_appends_from_many_threads_all_land_whole_and_in_each_threads_order(journal: Journal) -> None:
    def one(k: int) -> None:
        for i in range(200):
            journal.append([rec("pid", f"t{k}-{i}-1")], durable=i % 50 == 0)

    threads = [threading.Thread(target=one, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    journal.stop()
    got = [r["task"] for r in lines(journal.path)]
    assert len(got) == 800
    for k in range(4):
        assert [t for t in got if t.startswith(f"t{k}-")] == [f"t{k}-{i}-1" for i in range(200)]


def test_compaction_still_comes_when_every_record_is_written_by_its_caller(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(journal_mod, "COMPACT_AFTER", 10)
    j = Journal(tmp_path / "journal", snapshot=lambda: [rec("start", "live-0-1")])
    j.start()
    try:
        for i in range(30):
            j.append([rec("end", f"t-{i}-1")])
        deadline = time.monotonic() + 10
        while len(lines(j.path)) > 15:  # rewritten to the live task and what came after
            assert time.monotonic() < deadline, len(lines(j.path))
            time.sleep(0.01)
        assert lines(j.path)[0] == rec("start", "live-0-1")
    finally:
        j.stop()


def _errors() -> float:
    from prometheus_client import REGISTRY
    return REGISTRY.get_sample_value("peloton_loop_errors_total", {"loop": "local-journal"}) or 0.0


def _in_time(fn: Callable[[], None], timeout: float = 10.0) -> None:
    """fn() in a thread, its exception raised here; fails if it is still waiting after `timeout`."""
    out: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - raised again in the test
            out.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), "append still waiting: the journal's thread is gone"
    if out:
        raise out[0]


def test_a_batch_the_thread_cannot_write_fails_its_callers_and_the_thread_lives_on(journal: Journal) -> None:
    """A record that is not JSON (a bug in the backend that made it) ended the writer thread: its durable caller,
    and every durable append after it, waited for ever (a launch hung, its members' resources held) while the
    daemon looked healthy. The batch's callers get an OSError (a launch refuses its gangs, as for a full disk);
    the error is logged whole and counted; later appends are written."""
    before = _errors()
    with pytest.raises(OSError, match="could not be written"):
        _in_time(lambda: journal.append([{"op": "start", "task": "bad-0-1", "gpus": {1, 2}}], durable=True))
    _in_time(lambda: journal.append([rec("start", "good-0-1")], durable=True))
    assert [r["task"] for r in lines(journal.path)] == ["good-0-1"]
    assert _errors() - before == 1


def test_a_compaction_that_raises_something_unexpected_ends_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A snapshot that raised (a bug in the backend's book, not an OSError) ended the writer thread at the next
    compaction: every durable append after it waited for ever. It is logged, counted and tried again later."""
    monkeypatch.setattr(journal_mod, "COMPACT_AFTER", 10)
    calls: list[int] = []

    def snapshot() -> list[dict[str, Any]]:
        calls.append(1)
        if len(calls) == 2:  # (the first is start's)
            raise RuntimeError("a bug in the book")
        return [rec("start", "live-0-1")]

    j = Journal(tmp_path / "journal", snapshot=snapshot)
    j.start()
    before = _errors()
    try:
        for i in range(12):
            _in_time(functools.partial(j.append, [rec("start", f"t-{i}-1")], durable=True))
        deadline = time.monotonic() + 10
        while len(calls) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        for i in range(12, 40):
            _in_time(functools.partial(j.append, [rec("start", f"t-{i}-1")], durable=True))
        assert len(calls) >= 3  # compacted after all, later
        assert _errors() - before == 1
    finally:
        j.stop()


def test_appends_after_a_compaction_that_failed_late_land_in_the_journal(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A compaction whose reopening of the renamed journal failed (out of descriptors: EMFILE) kept the descriptor
    of the file it had just replaced: every later record went to that unlinked file, lost at replay (a task
    started then is not adopted after a restart, its cgroup killed as no task's)."""
    monkeypatch.setattr(journal_mod, "COMPACT_AFTER", 5)
    path = tmp_path / "journal"
    real_open = os.open

    def open_(p: Any, flags: int, *args: Any) -> int:
        if str(p) == str(path) and compacting.is_set():
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return real_open(p, flags, *args)

    compacting = threading.Event()
    j = Journal(path, snapshot=lambda: [])
    j.start()
    try:
        monkeypatch.setattr(journal_mod.os, "open", open_)
        compacting.set()
        for i in range(6):
            _in_time(functools.partial(j.append, [rec("start", f"t-{i}-1")], durable=True))
        compacting.clear()
        _in_time(functools.partial(j.append, [rec("start", "after-0-1")], durable=True))
    finally:
        j.stop()
    assert "after-0-1" in Journal(path, lambda: []).replay()
