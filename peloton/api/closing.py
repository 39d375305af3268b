"""A stopping daemon refuses new public calls first (SIGTERM: stop accepting, finish the round, release
leadership, exit). The internal services and health stay open, so the loops can finish the round they are in:
in one process they call each other through this same server."""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import grpc

# calls that keep working while the daemon stops: the components' own traffic and health checks
_OPEN_WHILE_CLOSING = ("/peloton.v1.ResourceManagerInternal/", "/peloton.v1.HostManagerInternal/",
                       "/grpc.health.v1.Health/")

MESSAGE = "the daemon is shutting down: try again (another address, or once it is back)"


class RefuseWhileClosing(grpc.ServerInterceptor):
    """UNAVAILABLE to every new public call once `closing` is set; calls already in flight finish."""

    def __init__(self, closing: threading.Event) -> None:
        self._closing = closing

        def refuse(request: Any, context: grpc.ServicerContext) -> Any:
            context.abort(grpc.StatusCode.UNAVAILABLE, MESSAGE)

        self._unary = grpc.unary_unary_rpc_method_handler(refuse)
        self._stream = grpc.unary_stream_rpc_method_handler(refuse)

    def intercept_service(self, continuation: Callable[..., Any], details: grpc.HandlerCallDetails) -> Any:
        if not self._closing.is_set() or details.method.startswith(_OPEN_WHILE_CLOSING):
            return continuation(details)
        handler = continuation(details)
        if handler is None:
            return None
        return self._stream if handler.response_streaming else self._unary
