"""What makes the daemon quick to start and to stop (docs/performance.md, "Starting and stopping the daemon"): the
process ends without the interpreter's teardown once a stop is done, the imports run with the cyclic garbage
collector off and their objects frozen, and the suite runs peloton from compiled byte-code. Nothing here times
anything: each test checks that the mechanism is there."""

from __future__ import annotations

import importlib.util
import json
import logging
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import peloton.cli.main
import peloton.server
from peloton import server


class _Stopped(Exception):
    """What the test's os._exit raises instead of ending pytest."""


class _FakeDaemon:
    """Starts, serves until stopped (returns at once here), as Daemon does."""

    console = None
    unix_socket = None
    last: _FakeDaemon

    def __init__(self, cfg: Any) -> None:
        self.calls: list[str] = []
        _FakeDaemon.last = self

    def start(self) -> str:
        self.calls.append("start")
        return "127.0.0.1:1"

    def stop_on_signals(self) -> None:
        self.calls.append("signals")

    def serve_forever(self) -> None:
        self.calls.append("served")
        logging.getLogger("peloton.server").warning("stopped")  # buffered by the handler below until flushed


class _Buffered(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.pending: list[str] = []
        self.written: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.pending.append(record.getMessage())

    def flush(self) -> None:
        self.written += self.pending
        self.pending = []


def test_a_stopped_daemon_ends_the_process_with_status_0_after_flushing_its_log(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The interpreter's teardown (its last collection of the whole heap) is skipped: os._exit(0) once
    serve_forever returned, i.e. once Daemon.stop has done everything it does, and never before the log is out."""
    exits: list[int] = []

    def fake_exit(code: int) -> None:
        exits.append(code)
        raise _Stopped

    handler = _Buffered()
    logging.getLogger().addHandler(handler)
    monkeypatch.setattr(server, "Daemon", _FakeDaemon)
    monkeypatch.setattr(server.os, "_exit", fake_exit)
    interval = sys.getswitchinterval()
    try:
        with pytest.raises(_Stopped):
            server.run_server(SimpleNamespace(data_dir=tmp_path))  # type: ignore[arg-type]
    finally:
        sys.setswitchinterval(interval)
        logging.getLogger().removeHandler(handler)
    assert _FakeDaemon.last.calls == ["start", "signals", "served"]
    assert exits == [0]
    assert "stopped" in handler.written and not handler.pending  # logging.shutdown flushed every handler


def _run(code: str) -> Any:
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_peloton_server_imports_with_the_collector_off_then_freezes_what_it_imported(tmp_path: Path) -> None:
    """By the time the daemon starts, the imports' objects are frozen (no collection examines them again) and the
    collector is on again for what the daemon makes."""
    got = _run(
        "import gc, json, peloton.server as s\n"
        "s.run_server = lambda cfg: print(json.dumps([gc.isenabled(), gc.get_freeze_count()]))\n"
        "from peloton.cli.main import main\n"
        f"main(['server', '--listen', '127.0.0.1:0', '--data-dir', {str(tmp_path)!r}, '--metrics-listen', '',"
        " '--ui-listen', '', '--backend', 'sim'])\n")
    enabled, frozen = got
    assert enabled is True
    assert frozen > 10_000  # peloton.server and its imports: ~100,000 objects


def test_the_suite_runs_peloton_from_up_to_date_byte_code() -> None:
    """tests/conftest.py compiles peloton's modules: with PYTHONDONTWRITEBYTECODE set, every daemon and CLI call the
    tests start would compile them all again."""
    for module in (peloton.server, peloton.cli.main, server):
        src = Path(module.__file__ or "")
        pyc = Path(importlib.util.cache_from_source(str(src)))
        assert pyc.exists(), pyc
        assert pyc.stat().st_mtime >= src.stat().st_mtime, pyc
