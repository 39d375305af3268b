"""The local backend's journal: an append-only file of what it started and how each task ended, which a restarted
daemon replays to adopt the tasks still running.

One JSON object per line, each with an `op`:
- `start`: a task registered before its launch (task id, host, sandbox, resources, GPU ids, ports);
- `pid`: the wrapper's pid (a reused pid is told from ours by its command line, which names the sandbox);
- `kill`: when a kill was requested (a task that then ends with exit code 0 after that time still SUCCEEDED);
- `end`: the final status reported (`final`; null for a member of a launch that was stopped, of which nothing was
  reported: the launch's result said it).
Replay is idempotent (a record about an unknown task is ignored, a repeated one overwrites), so compaction may run
while records keep arriving.

One writer thread appends durable records: those that arrive together are written with one write and one fsync
(group commit). A launch waits for its `start` records to be durable before it spawns, so a daemon killed
mid-launch knows every task it may have started. Other records need no fsync: a process crash keeps the page
cache, and a machine crash ends every local task anyway. So they are written by the caller itself, in its
`append` (one write, no wake of the writer thread: a wake costs more CPU than the write on this VM), unless
records are queued or being written ahead of them, which they then follow through the writer thread: the journal
keeps the order of the appends either way.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from peloton.loop import LOOP_ERRORS

log = logging.getLogger(__name__)

Record = dict[str, Any]
COMPACT_AFTER = 20_000  # records appended before the journal is rewritten with only the live tasks


class Journal:
    def __init__(self, path: Path, snapshot: Callable[[], list[Record]]) -> None:
        """`snapshot()` returns the records that describe the live tasks now (used to compact)."""
        self.path = path
        self._snapshot = snapshot
        self._cond = threading.Condition()
        self._queue: list[tuple[list[Record], Future[None] | None]] = []
        self._stop = False
        self._thread: threading.Thread | None = None
        self._fd = -1
        self._size = 0  # the journal's length after the last write that landed whole (the one writer's)
        self._appended = 0
        # a write (or a compaction) is under way, by the writer thread or a caller: the one writer of the file at a
        # time; guarded by _cond
        self._writing = False
        self.fsyncs = 0  # for tests and benchmarks: one per durable batch

    # --- before start ---------------------------------------------------------------------------------------
    def replay(self) -> dict[str, Record]:
        """task id -> its merged record (every field seen, later records win), for tasks started and not ended,
        plus `end` entries for tasks that ended (field `final`)."""
        tasks: dict[str, Record] = {}
        try:
            f = open(self.path, encoding="utf-8", errors="replace")  # noqa: SIM115 - closed below
        except FileNotFoundError:
            return tasks
        with f:
            for line in f:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue  # a torn last line after a crash
                if not isinstance(rec, dict) or not isinstance(rec.get("task"), str):
                    continue
                op, tid = rec.get("op"), rec["task"]
                if op == "start":
                    tasks[tid] = {k: v for k, v in rec.items() if k != "op"}
                elif tid in tasks and op in ("pid", "kill", "end"):
                    tasks[tid].update({k: v for k, v in rec.items() if k not in ("op", "task")})
        return tasks

    # --- running --------------------------------------------------------------------------------------------
    def start(self) -> None:
        self._rewrite(self._snapshot())
        self._thread = threading.Thread(target=self._run, name="local-journal", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(10)
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def append(self, records: list[Record], *, durable: bool = False) -> None:
        """Append records; with `durable`, wait until they are on disk (raises OSError if they could not be). Other
        records are written before this returns when nothing is ahead of them, else queued behind what is."""
        if not records:
            return
        fut: Future[None] | None = Future() if durable else None
        with self._cond:
            if self._stop:
                raise OSError("the local backend journal is stopped")
            direct = fut is None and not self._queue and not self._writing and self._appended < COMPACT_AFTER
            if direct:
                self._writing = True
            else:
                self._queue.append((records, fut))
                self._cond.notify()
        if direct:
            try:
                self._write([(records, None)])
            finally:
                with self._cond:
                    self._writing = False
                    if self._queue or self._stop:  # queued meanwhile behind this write: the writer thread's now
                        self._cond.notify_all()
        elif fut is not None:
            fut.result()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stop and (not self._queue or self._writing):
                    self._cond.wait()
                while self._writing:  # (stopping) a caller's write is under way
                    self._cond.wait()
                batch, self._queue = self._queue, []
                stopping = self._stop
                self._writing = True
            try:
                if batch:
                    try:
                        self._write(batch)
                    except Exception as e:  # noqa: BLE001 - the thread must live on: every durable append waits on it
                        # (a record that is not JSON, a bug of its maker: nothing of the batch was written) its callers
                        # are told as of a disk that refused it (a launch refuses its gangs), and later appends go on
                        LOOP_ERRORS.labels("local-journal").inc()
                        log.exception("local backend: could not write %d records to the journal %s",
                                      sum(len(recs) for recs, _ in batch), self.path)
                        err = OSError(f"the journal's records could not be written: {e!r}")
                        for _, f in batch:
                            if f is not None and not f.done():
                                f.set_exception(err)
                if self._appended >= COMPACT_AFTER:
                    try:
                        self._rewrite(self._snapshot())
                    except Exception as e:  # noqa: BLE001 - a full disk, or a bug in the snapshot: the thread lives on
                        if not isinstance(e, OSError):
                            LOOP_ERRORS.labels("local-journal").inc()
                        log.exception("local backend: could not compact the journal %s", self.path)
                        self._appended = 0  # tried again after as many records again, not at every write (each logged)
            finally:
                with self._cond:
                    self._writing = False
            if stopping and not batch:
                return

    def _write(self, batch: list[tuple[list[Record], Future[None] | None]]) -> None:
        data = "".join(json.dumps(r, separators=(",", ":")) + "\n" for recs, _ in batch for r in recs)
        raw = data.encode()
        err: OSError | None = None
        try:
            _write_all(self._fd, raw)
            if any(f is not None for _, f in batch):
                os.fsync(self._fd)
                self.fsyncs += 1
            self._size += len(raw)
        except OSError as e:
            log.exception("local backend: could not write the journal %s", self.path)
            err = e
            # a write the disk cut short (full) left part of a line, which the next record would be glued to (both
            # lost at replay): back to the last whole record
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, self._size)
        self._appended += sum(len(recs) for recs, _ in batch)
        for _, f in batch:
            if f is not None:
                if err is None:
                    f.set_result(None)
                else:
                    f.set_exception(err)

    def _rewrite(self, records: list[Record]) -> None:
        """Replace the journal by `records` (the live tasks), atomically."""
        tmp = self.path.with_name(self.path.name + ".tmp")
        data = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records).encode()
        # opened to append: once renamed it is the journal's descriptor. Reopened after the rename, an open that
        # failed there (EMFILE) left the appends going to the file just replaced, every one lost at replay
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
        try:
            _write_all(fd, data)  # (a tmp the disk cut short must not replace the journal: its tasks would be lost)
            os.fsync(fd)
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        old, self._fd = self._fd, fd
        if old >= 0:
            with contextlib.suppress(OSError):
                os.close(old)
        self._size = len(data)
        self._appended = 0


def _write_all(fd: int, data: bytes) -> None:
    """All of `data`, or OSError: a regular file's write is cut short when the disk (or RLIMIT_FSIZE) has room for
    only part of it, and the next write then fails."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        if n <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view = view[n:]
