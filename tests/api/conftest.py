"""Every daemon a module of these tests starts is stopped by the module's end. A thread of one left running (a job
manager writer, a loop) outlives its test: it holds its store and keeps working, far from the fixture that left
it. (The "I/O operation on closed file" log errors these tests once printed came from a root log handler left by
an in-process `peloton server` of an earlier test: tests/conftest.py removes it.)"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator

import pytest

# the threads of a Daemon (peloton/server.py and what it starts): loops, the job manager's writers and side effects,
# the audit log, the sim backend's timer
DAEMON_THREAD = re.compile(r"loop-.+|jobmgr-writer-\d+|jobmgr-side-effects|audit-log|sim-timer")


@pytest.fixture(autouse=True, scope="module")
def no_daemon_thread_outlives_the_module() -> Iterator[None]:
    """Set up before the module's own fixtures, so torn down after them: what is left then was never stopped."""
    before = set(threading.enumerate())
    yield
    left = sorted(t.name for t in threading.enumerate()
                  if t not in before and t.is_alive() and DAEMON_THREAD.fullmatch(t.name))
    assert not left, f"daemon threads still running after the module's fixtures were torn down: {left}"
