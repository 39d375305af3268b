"""A stopping daemon refuses new public calls first (SIGTERM: stop accepting, finish the round, release
leadership, exit). The internal services and health stay open, so the loops can finish the round they are in:
in one process they call each other through this same server."""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import grpc

from peloton.api.edge import refusing

# calls that keep working while the daemon stops: the components' own traffic and health checks
_OPEN_WHILE_CLOSING = ("/peloton.v1.ResourceManagerInternal/", "/peloton.v1.HostManagerInternal/",
                       "/grpc.health.v1.Health/")

MESSAGE = "the daemon is shutting down: try again (another address, or once it is back)"


class RefuseWhileClosing(grpc.ServerInterceptor):
    """UNAVAILABLE to every new public call once `closing` is set; calls already in flight finish."""

    def __init__(self, closing: threading.Event) -> None:
        self._closing = closing
        self._refuse = refusing(grpc.StatusCode.UNAVAILABLE, lambda: (MESSAGE, []))  # (the request left unread)

    def intercept_service(self, continuation: Callable[..., Any], details: grpc.HandlerCallDetails) -> Any:
        if not self._closing.is_set() or details.method.startswith(_OPEN_WHILE_CLOSING):
            return continuation(details)
        return None if continuation(details) is None else self._refuse
