"""The daemon's log lines: text by default, JSON with --log-format json (one object a line, ids as fields)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from peloton.observability import logs


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for h in list(root.handlers):
        root.removeHandler(h)
    for h in handlers:
        root.addHandler(h)
    root.setLevel(level)


def test_json_lines_carry_time_level_logger_message_and_ids(restore_logging: None,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure("info", "json")
    log = logging.getLogger("peloton.test")
    log.info("gang %s placed", "j1/0", extra={"job_id": "j1", "gang_id": "j1/0"})
    log.debug("not shown at info")
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("it failed")
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2
    first, second = (json.loads(x) for x in lines)
    assert first["level"] == "info" and first["logger"] == "peloton.test" and first["message"] == "gang j1/0 placed"
    assert (first["job_id"], first["gang_id"]) == ("j1", "j1/0") and "task_id" not in first
    assert first["time"].endswith("Z") and first["time"][10] == "T"
    assert second["level"] == "error" and "ValueError: boom" in second["exception"]


def test_text_is_the_default(restore_logging: None, capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure("info", "text")
    logging.getLogger("peloton.test").warning("plain")
    assert capsys.readouterr().err.rstrip().endswith(" WARNING peloton.test: plain")


def test_the_daemon_logs_json_lines(tmp_path: Path) -> None:
    """The real daemon with --log-format json: every line of its log is a JSON object, and a job's end is a line
    with the job's id as a field of its own."""
    p = subprocess.Popen([sys.executable, "-m", "peloton.cli.main", "server", "--log-format", "json", "--backend",
                          "sim", "--sim-hosts", "2", "--listen", "127.0.0.1:0", "--metrics-listen", "", "--data-dir",
                          str(tmp_path / "data"), "--insecure"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        assert p.stdout is not None
        first = p.stdout.readline()
        assert "serving on" in first
        address = first.split("serving on ")[1].split()[0]
        cli = [sys.executable, "-m", "peloton.cli.main", "--address", address]
        spec = ("name: logged\ninstances: 2\ntask: {command: train, resources: {cpu: 1, mem: 64Mi}, "
                "env: {PELOTON_SIM_DURATION: 100ms}}\n")
        job = subprocess.run([*cli, "job", "create", "-f", "-"], input=spec, capture_output=True, text=True,
                             timeout=60, check=True).stdout.strip()
        subprocess.run([*cli, "job", "wait", job, "--timeout", "60"], capture_output=True, timeout=90, check=True)
    finally:
        p.terminate()
        _, err = p.communicate(timeout=30)
    lines = [json.loads(x) for x in err.splitlines() if x.strip()]
    assert lines and all({"time", "level", "logger", "message"} <= set(x) for x in lines)
    assert any("shutting down" in x["message"] for x in lines)
    ended = [x for x in lines if x.get("job_id") == job and x["message"] == f"job {job} SUCCEEDED"]
    assert len(ended) == 1 and ended[0]["level"] == "info", [x for x in lines if x.get("job_id")]
