"""SIGTERM stops the daemon whichever of its threads the kernel hands the signal to: a signal that lands on a gRPC
or loop thread only sets a flag for the main thread, which must not sit in one endless wait."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

SYS_TGKILL = 234  # x86_64


@pytest.mark.skipif(sys.platform != "linux" or os.uname().machine != "x86_64", reason="tgkill's number is x86_64's")
def test_sigterm_to_a_thread_other_than_the_main_one_stops_the_daemon(tmp_path: Path) -> None:
    p = subprocess.Popen([sys.executable, "-m", "peloton.cli.main", "server", "--backend", "sim", "--sim-hosts", "2",
                          "--listen", "127.0.0.1:0", "--metrics-listen", "", "--data-dir", str(tmp_path / "data"),
                          "--insecure"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and "serving on" in p.stdout.readline()
        threads = [int(t) for t in os.listdir(f"/proc/{p.pid}/task") if int(t) != p.pid]
        assert threads
        libc = ctypes.CDLL(None, use_errno=True)
        assert libc.syscall(SYS_TGKILL, p.pid, threads[-1], signal.SIGTERM) == 0, ctypes.get_errno()
        _, err = p.communicate(timeout=20)
        assert p.returncode == 0, err[-2000:]
        assert "signal 15: shutting down" in err
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()


def test_two_signals_at_once_stop_the_daemon_once(tmp_path: Path) -> None:
    """SIGTERM twice and SIGINT at once (a supervisor and a terminal, `timeout` signalling the command and its group)
    make one stop (a signal that finds it stopping is told so; one that comes before the first stop has begun waits
    for it), and nothing is closed twice (the local backend's journal was:
    EBADF in a second stop thread)."""
    p = subprocess.Popen([sys.executable, "-m", "peloton.cli.main", "server", "--backend", "local", "--local-hosts",
                          "1", "--local-host-resources", "cpu=2,mem=2Gi", "--listen", "127.0.0.1:0",
                          "--metrics-listen", "", "--ui-listen", "", "--data-dir", str(tmp_path / "data"),
                          "--insecure"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and "serving on" in p.stdout.readline()
        for sig in (signal.SIGTERM, signal.SIGTERM, signal.SIGINT):
            os.kill(p.pid, sig)
        _, err = p.communicate(timeout=30)
        assert p.returncode == 0, err[-3000:]
        assert "Traceback" not in err and "Exception in thread" not in err, err[-3000:]
        assert "shutting down (tasks keep running" in err  # (signal 2's or 15's: Python runs pending ones by number)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
