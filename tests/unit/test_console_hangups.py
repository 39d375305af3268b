"""console/hangups.py: a stream's socket turning readable (the browser hung up) calls its on_hangup once; a stream
forgotten first is not called; an fd forgotten and reused by a new stream is watched for the new one."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from peloton.console.hangups import Hangups


@pytest.fixture
def hangups() -> Iterator[Hangups]:
    h = Hangups()
    yield h
    h.close()


def test_a_hang_up_calls_its_stream_back_once(hangups: Hangups) -> None:
    server, browser = socket.socketpair()
    called = threading.Event()
    calls: list[int] = []

    def hung_up() -> None:
        calls.append(1)
        called.set()

    hangups.watch(server.fileno(), hung_up)
    assert not called.wait(0.2)  # nothing yet: the browser is there
    browser.close()
    assert called.wait(5)
    assert not threading.Event().wait(0.2) and calls == [1]  # once, not at every turn of the selector
    server.close()


def test_a_stream_forgotten_before_its_socket_closes_is_not_called(hangups: Hangups) -> None:
    server, browser = socket.socketpair()
    called = threading.Event()
    hangups.watch(server.fileno(), called.set)
    hangups.forget(server.fileno())
    fd = server.fileno()
    server.close()
    browser.close()
    # the fd, reused by the next connection, is watched for it (the forget was applied first)
    server2, browser2 = socket.socketpair()
    again = threading.Event()
    hangups.watch(server2.fileno(), again.set)
    browser2.close()
    assert again.wait(5)
    assert not called.is_set(), "the forgotten stream was called back"
    server2.close()
    assert fd >= 0


def test_a_closed_hangups_takes_nothing_more(hangups: Hangups) -> None:
    hangups.close()
    server, browser = socket.socketpair()
    hangups.watch(server.fileno(), lambda: None)  # no error, nothing done
    hangups.forget(server.fileno())
    server.close()
    browser.close()


def test_a_failing_cancel_is_counted_and_the_others_are_still_watched(hangups: Hangups) -> None:
    """The thread already outlived a stream's cancel that raised, but only said so in its log (a stream left
    holding its place among the console's streams went past the alert on peloton_loop_errors_total)."""
    from prometheus_client import REGISTRY

    def errors() -> float:
        return REGISTRY.get_sample_value("peloton_loop_errors_total", {"loop": "console-hangups"}) or 0.0

    before = errors()
    failed = threading.Event()

    def bad() -> None:
        failed.set()
        raise RuntimeError("a bug in the cancel")

    server, browser = socket.socketpair()
    hangups.watch(server.fileno(), bad)
    browser.close()
    assert failed.wait(5)
    server2, browser2 = socket.socketpair()
    called = threading.Event()
    hangups.watch(server2.fileno(), called.set)
    browser2.close()
    assert called.wait(5)
    assert errors() - before == 1
    server.close()
    server2.close()
