"""What a caller can make the daemon do before it is known to be anyone.

gRPC reads a unary request whole (up to the port's receive limit, limits.MAX_REQUEST_BYTES) before any Python code
sees the call, so every refusal that may come before the request matters is served as a client-streaming call
(the same bytes on the wire): the answer goes out without the request being read, and an unread request costs at
most HTTP/2's window (64 KiB: BDP probing, which grows it, is off on the public port). This module holds the
handlers that answer so, and the gate of the calls open to anyone (health, reflection), whose requests must be read
before they are answered: at most PUBLIC_READS of them are read at once. Authorize (security/auth.py) authenticates the
others before reading theirs. docs/security.md ("The edge") and docs/performance.md hold the measurements."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from peloton.domain import limits

# The public API's port (TCP, TLS and the owner-only Unix socket are one server; a standby's port too): a request
# over the documented limit is refused by gRPC itself (RESOURCE_EXHAUSTED, before any of it is kept). What it sends
# is bounded by each call (pages, log tails); its limit stays what it was.
# BDP probing off: it grows the HTTP/2 window of every stream, read or not, to ~1 MiB (measured), which an unknown
# caller's unread request could then fill; without it an unread request holds 64 KiB, and one being read is let in
# at a slower pace (a 1 MiB CreateJob over a 20 ms round trip: 44 ms instead of 23; docs/performance.md).
PUBLIC_PORT_OPTIONS = [("grpc.max_receive_message_length", limits.MAX_REQUEST_BYTES),
                       ("grpc.max_send_message_length", 64 * 1024 * 1024), ("grpc.http2.bdp_probe", 0)]
# Requests of calls open to anyone (health checks, reflection) being read at once; beyond: RESOURCE_EXHAUSTED.
# Each is at most the port's receive limit: together at most PUBLIC_READS x MAX_REQUEST_BYTES (16 MiB, which
# grpcio and protobuf copy two or three times while reading: docs/performance.md).
PUBLIC_READS = 4
PUBLIC_WAIT_S = 1.0  # a call waits this long for a slot (a burst of health checks), then is refused
BUSY = "too many requests without credentials are being read at once (health checks, reflection); retry"


def refusing(code: grpc.StatusCode, message: Callable[[], tuple[str, list[tuple[str, str]]]]
             ) -> grpc.RpcMethodHandler:
    """A handler that answers any call (unary or streaming, either way) with `code` and what `message()` says
    (details, trailing metadata), without reading its request."""

    def refuse(requests: Iterator[Any], context: grpc.ServicerContext) -> Any:
        details, metadata = message()
        if metadata:
            context.set_trailing_metadata(metadata)
        context.abort(code, details)

    return grpc.stream_unary_rpc_method_handler(refuse)


class GatePublicReads(grpc.ServerInterceptor):
    """The requests of the services anyone may call (`public`: method prefixes) are read at most `limit` at a
    time; a call that would be one more waits up to `wait_s` for a slot, then is answered RESOURCE_EXHAUSTED
    without being read. Other calls pass."""

    def __init__(self, public: tuple[str, ...], limit: int = PUBLIC_READS, wait_s: float = PUBLIC_WAIT_S) -> None:
        self._public = public
        self._slots = threading.BoundedSemaphore(limit)
        self._wait_s = wait_s

    def _read(self, requests: Iterator[Any], context: grpc.ServicerContext) -> Any:
        """The next request of the call (None at its end), read while holding a slot."""
        if not self._slots.acquire(timeout=self._wait_s):
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, BUSY)
        try:
            return next(requests, None)
        finally:
            self._slots.release()

    def intercept_service(self, continuation: Callable[..., Any], details: grpc.HandlerCallDetails) -> Any:
        handler = continuation(details)
        if handler is None or not details.method.startswith(self._public):
            return handler
        read, method = self._read, details.method

        def one(requests: Iterator[Any], context: grpc.ServicerContext) -> Any:
            request = read(requests, context)
            if request is None:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                              f"request: {method} takes exactly one request message, got none")
            return request

        def each(requests: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
            while (request := read(requests, context)) is not None:
                yield request

        kinds = {"request_deserializer": handler.request_deserializer,
                 "response_serializer": handler.response_serializer}
        if not handler.request_streaming:
            behaviour = handler.unary_stream if handler.response_streaming else handler.unary_unary

            def reads_one(requests: Iterator[Any], context: grpc.ServicerContext, *callback: Any) -> Any:
                return behaviour(one(requests, context), context, *callback)

            wrapped = _like(behaviour, reads_one)
        else:
            streaming = handler.stream_stream if handler.response_streaming else handler.stream_unary

            def reads_each(requests: Iterator[Any], context: grpc.ServicerContext, *callback: Any) -> Any:
                return streaming(each(requests, context), context, *callback)

            wrapped = _like(streaming, reads_each)
        if handler.response_streaming:
            return grpc.stream_stream_rpc_method_handler(wrapped, **kinds)
        return grpc.stream_unary_rpc_method_handler(wrapped, **kinds)


def _like(original: Any, wrapper: Callable[..., Any]) -> Callable[..., Any]:
    """`wrapper` served as `original` is: the health service's Watch answers through a callback, on a thread pool
    of its own (grpcio's experimental_non_blocking), holding no server thread while it waits."""
    for name in ("experimental_non_blocking", "experimental_thread_pool"):
        if hasattr(original, name):
            setattr(wrapper, name, getattr(original, name))
    return wrapper
