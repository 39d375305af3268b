"""Where the error hierarchy meets grpcio: servicers' errors become status codes (by the table in codes.py), and a
failed call of an internal client becomes an error again."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, TypeVar

import grpc

from peloton import errors
from peloton.api.codes import code_name_for, error_for
from peloton.api.request_checks import non_finite, unknown_fields

log = logging.getLogger(__name__)


def code_for(err: errors.PelotonError) -> grpc.StatusCode:
    """Which status an error travels as (the table is codes.TO_CODE)."""
    return grpc.StatusCode[code_name_for(err)]


F = TypeVar("F", bound=Callable[..., Any])
RETRY_AFTER_MS = "1000"  # the hint sent with UNAVAILABLE (trailing metadata `retry-after-ms`)


def _abort(context: grpc.ServicerContext, fn: Callable[..., Any], e: Exception) -> None:
    if isinstance(e, errors.PelotonError):
        code = code_for(e)
        if code == grpc.StatusCode.UNAVAILABLE:
            leader = getattr(e, "leader", "")
            context.set_trailing_metadata((("retry-after-ms", RETRY_AFTER_MS),
                                           *((("peloton-leader", leader),) if leader else ())))
        elif isinstance(e, errors.ResourceExhausted) and e.retry_after_s is not None:
            context.set_trailing_metadata(retry_after(e.retry_after_s))
        context.abort(code, bounded(e.message))
    log.exception("internal error in %s", fn.__qualname__)
    context.abort(grpc.StatusCode.INTERNAL, f"internal error in {fn.__name__}; see the daemon log")


def grpc_errors(fn: F) -> F:
    """Decorate a servicer method: PelotonError → its status code and message (UNAVAILABLE with a retry hint);
    anything else → INTERNAL."""

    @functools.wraps(fn)
    def wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return fn(self, request, context)
        except Exception as e:  # noqa: BLE001 - mapped to a status, never lost
            _abort(context, fn, e)

    return wrapper  # type: ignore[return-value]


def grpc_stream_errors(fn: F) -> F:
    """`grpc_errors` for a server-streaming method (a generator)."""

    @functools.wraps(fn)
    def wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            yield from fn(self, request, context)
        except Exception as e:  # noqa: BLE001 - mapped to a status, never lost
            _abort(context, fn, e)

    return wrapper  # type: ignore[return-value]


MAX_MESSAGE_BYTES = 1024


def retry_after(seconds: float) -> tuple[tuple[str, str], ...]:
    """The trailing metadata that tells a client when to try again."""
    return (("retry-after-ms", str(max(1, round(seconds * 1000)))),)


def bounded(message: str) -> str:
    """A status message short enough for its header: gRPC drops a long one (the caller then sees
    RESOURCE_EXHAUSTED, not the error). Errors name their field first, so the cut keeps it."""
    raw = message.encode("utf-8", "replace")
    if len(raw) <= MAX_MESSAGE_BYTES:
        return message
    return raw[:MAX_MESSAGE_BYTES].decode("utf-8", "ignore") + "..."


class _Undecodable:
    def __init__(self, why: str) -> None:
        self.why = why


class RejectUndecodableRequests(grpc.ServerInterceptor):
    """A request that does not parse (bad UTF-8 in a string field, truncated bytes) is the caller's fault:
    INVALID_ARGUMENT, where gRPC would answer INTERNAL ("Exception deserializing request!"). So is one of the
    methods under `refuse_unknown` (prefixes) that carries fields this daemon's schema does not know, at any depth
    (named by their path and number: request_checks.unknown_fields), as the spec file reader refuses unknown keys.
    And one of the methods under `refuse_non_finite` that carries a float or double that is NaN or infinite, or
    JSON text (`*_json`) that is not JSON or holds such a number (request_checks.non_finite): the internal services'
    requests, whose numbers go into the pools' accounting as they come. (The public API's requests have their own
    checks, field by field, which refuse them as well, naming the field as its spec or pool says it.)
    Unary requests only (every peloton RPC); streaming ones pass unchanged."""

    def __init__(self, refuse_unknown: tuple[str, ...] = (), refuse_non_finite: tuple[str, ...] = ()) -> None:
        self._refuse_unknown = refuse_unknown
        self._refuse_non_finite = refuse_non_finite

    def intercept_service(self, continuation: Callable[..., Any], details: grpc.HandlerCallDetails) -> Any:
        handler = continuation(details)
        if handler is None or handler.request_deserializer is None or handler.request_streaming:
            return handler
        deserialize = handler.request_deserializer
        method = details.method
        check_unknown = method.startswith(self._refuse_unknown) if self._refuse_unknown else False
        check_finite = method.startswith(self._refuse_non_finite) if self._refuse_non_finite else False

        def safe_deserialize(data: bytes) -> Any:
            try:
                request = deserialize(data)
            except Exception as e:  # noqa: BLE001 - whatever the parser says, the bytes were bad
                return _Undecodable(f"request: not a valid request of {method}: {e}")
            unknown = unknown_fields(request) if check_unknown else []
            if unknown:
                return _Undecodable("; ".join(unknown) + " (sent by a client of a newer release, or not by a "
                                    "peloton client: this daemon refuses what it would otherwise ignore)")
            bad = non_finite(request) if check_finite else []
            if bad:
                return _Undecodable("; ".join(bad))
            return request

        def guard(behaviour: Callable[..., Any]) -> Callable[..., Any]:
            def run(request: Any, context: grpc.ServicerContext) -> Any:
                if isinstance(request, _Undecodable):
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, bounded(request.why))
                return behaviour(request, context)

            return run

        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(guard(handler.unary_unary), request_deserializer=safe_deserialize,
                                                       response_serializer=handler.response_serializer)
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(guard(handler.unary_stream),
                                                        request_deserializer=safe_deserialize,
                                                        response_serializer=handler.response_serializer)
        return handler


def from_rpc_error(e: grpc.RpcError) -> errors.PelotonError:
    """Client side: turn a failed call back into the error hierarchy."""
    code = e.code() if hasattr(e, "code") else grpc.StatusCode.UNKNOWN
    details = e.details() if hasattr(e, "details") else str(e)
    return error_for(code.name, details)
