"""With PELOTON_TEST_NO_SKIP=1 (CI sets it: .ci/run installs what every test needs) a test that skips fails
instead, with its reason: a test that stopped running must not pass for one that ran."""

from __future__ import annotations

import logging
import os
from collections.abc import Generator, Iterator
from typing import Any

import pytest

from peloton.observability import logs
from tests import dbutil

NO_SKIP = os.environ.get("PELOTON_TEST_NO_SKIP") == "1"
# The daemons the tests start serve no web console (its default port, 127.0.0.1:5393, is one for the whole machine,
# and tests run side by side): `peloton server` reads PELOTON_UI_LISTEN as --ui-listen. The console's own tests
# pass --ui-listen 127.0.0.1:0, which the command line's wins over (tests/e2e/test_console_e2e.py).
os.environ.setdefault("PELOTON_UI_LISTEN", "")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if NO_SKIP and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped where nothing may skip (PELOTON_TEST_NO_SKIP=1): {reason}"


def pytest_configure(config: pytest.Config) -> None:
    dbutil.drop_in_background()  # the next test need not wait for PostgreSQL's checkpoint (tests/dbutil.py)
    compile_peloton()


def compile_peloton() -> None:
    """peloton's bytecode, written for every module whose cache is missing or stale. The editable install leaves
    it to the interpreter, and with PYTHONDONTWRITEBYTECODE set (as on this project's machines) the interpreter
    writes none: each of the ~200 daemons the suite starts, and each CLI call of the e2e tests, compiled all of
    peloton again (~0.4 s of a daemon's start on 2 loaded cores: docs/performance.md, "Starting and stopping the
    daemon"). Up-to-date files are only stat'ed; two pytest processes at once write each file atomically."""
    import compileall
    from pathlib import Path

    import peloton

    compileall.compile_dir(Path(peloton.__file__).parent, quiet=1)


def pytest_unconfigure(config: pytest.Config) -> None:
    dbutil.wait_for_drops()  # every database a test made is gone when pytest ends


@pytest.fixture(autouse=True)
def no_log_handler_outlives_its_test() -> Iterator[None]:
    """A test that runs `peloton server`'s command in-process (`main(["server", ...])`) configures the root logger
    with a handler on the stderr pytest captured for that test. Left in place, every later log line, of any
    daemon's thread in any later test, goes to that closed stream ("--- Logging error --- ... I/O operation on
    closed file"). The handler goes with its test, and the root logger's level back to what it was."""
    root = logging.getLogger()
    before, level = list(root.handlers), root.level
    yield
    ours = [h for h in root.handlers if h.get_name() == logs.HANDLER_NAME and h not in before]
    for h in ours:
        root.removeHandler(h)
    if ours:
        root.setLevel(level)
