"""The local backend's process monitor (hostmgr/local/monitor.py): an exit is reported once, for the process that
exited, even when a descriptor is unwatched, closed and its number reused between epoll's answer and the monitor
reading it."""

from __future__ import annotations

import os
import select
import subprocess
import threading

from peloton.hostmgr.local.monitor import ProcessMonitor


def monitor() -> tuple[ProcessMonitor, list[str]]:
    exited: list[str] = []
    return ProcessMonitor(exited.append, lambda key: None), exited


def test_an_event_for_a_descriptor_it_no_longer_watches_closes_nothing() -> None:
    m, exited = monitor()
    fd = os.open("/dev/null", os.O_RDONLY)  # the number an unwatched pidfd had, now another file of the process
    try:
        m._handle([(fd, select.EPOLLIN)])
        os.fstat(fd)  # still open: the monitor closed nothing it does not own
        assert exited == []
    finally:
        os.close(fd)


def test_a_stale_event_on_a_reused_number_is_not_taken_for_an_exit() -> None:
    m, exited = monitor()
    child = subprocess.Popen(["sleep", "30"])
    try:
        fd = os.pidfd_open(child.pid)
        m.watch_fd("b", fd)
        m._handle([(fd, select.EPOLLIN)])  # an event of the number's earlier descriptor: b still runs
        assert exited == [] and m._keys == {"b": fd}
        child.kill()
        child.wait(10)
        m._handle([(fd, select.EPOLLIN)])
        assert exited == ["b"] and m._keys == {}
        m._handle([(fd, select.EPOLLIN)])  # reported once; the descriptor is closed and no longer its
        assert exited == ["b"]
    finally:
        child.kill()
        child.wait(10)
        m.stop()


def test_the_monitor_thread_reports_an_exit() -> None:
    done = threading.Event()
    exited: list[str] = []

    def on_exit(key: str) -> None:
        exited.append(key)
        done.set()

    m = ProcessMonitor(on_exit, lambda key: None)
    m.start()
    try:
        child = subprocess.Popen(["sleep", "0.3"])
        assert m.watch("t", child.pid)
        assert done.wait(10)
        assert exited == ["t"] and m._keys == {}
        child.wait(10)
    finally:
        m.stop()
