"""The local backend's process monitor (hostmgr/local/monitor.py): an exit is reported once, for the process that
exited, even when a descriptor is unwatched, closed and its number reused between epoll's answer and the monitor
reading it."""

from __future__ import annotations

import os
import select
import subprocess
import threading
import time

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


def test_a_failing_exit_handler_is_counted_and_the_monitor_goes_on() -> None:
    """The monitor already outlived a handler that raised, but only said so in its log: an exit maybe not
    reported (a task left running in the book) went past the alert on peloton_loop_errors_total."""
    from prometheus_client import REGISTRY

    def errors() -> float:
        return REGISTRY.get_sample_value("peloton_loop_errors_total", {"loop": "local-monitor"}) or 0.0

    done = threading.Event()
    exited: list[str] = []

    def on_exit(key: str) -> None:
        if key == "bad":
            raise RuntimeError("a bug in handling it")
        exited.append(key)
        done.set()

    before = errors()
    m = ProcessMonitor(on_exit, lambda key: None)
    m.start()
    children = [subprocess.Popen(["sleep", "0.2"]) for _ in range(2)]
    try:
        assert m.watch("bad", children[0].pid)
        children[0].wait(10)
        deadline = time.monotonic() + 10
        while errors() == before:
            assert time.monotonic() < deadline, "the failing handler was not counted"
            time.sleep(0.01)
        assert m.watch("good", children[1].pid)
        assert done.wait(10)
        assert exited == ["good"] and errors() - before == 1
    finally:
        for c in children:
            c.kill()
            c.wait(10)
        m.stop()
