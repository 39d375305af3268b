"""The one place where the error hierarchy meets gRPC status codes (both directions)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, TypeVar

import grpc

from peloton import errors

log = logging.getLogger(__name__)

_TO_CODE: list[tuple[type[errors.PelotonError], grpc.StatusCode]] = [
    (errors.InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT),
    (errors.NotFound, grpc.StatusCode.NOT_FOUND),
    (errors.AlreadyExists, grpc.StatusCode.ALREADY_EXISTS),
    (errors.Conflict, grpc.StatusCode.ABORTED),
    (errors.FailedPrecondition, grpc.StatusCode.FAILED_PRECONDITION),
    (errors.Unavailable, grpc.StatusCode.UNAVAILABLE),
]
_FROM_CODE = {code: cls for cls, code in _TO_CODE}


def code_for(err: errors.PelotonError) -> grpc.StatusCode:
    for cls, code in _TO_CODE:
        if isinstance(err, cls):
            return code
    return grpc.StatusCode.INTERNAL


F = TypeVar("F", bound=Callable[..., Any])


def grpc_errors(fn: F) -> F:
    """Decorate a servicer method: PelotonError → its status code and message; anything else → INTERNAL."""

    @functools.wraps(fn)
    def wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return fn(self, request, context)
        except errors.PelotonError as e:
            context.abort(code_for(e), e.message)
        except Exception:
            log.exception("internal error in %s", fn.__qualname__)
            context.abort(grpc.StatusCode.INTERNAL, f"internal error in {fn.__name__}; see the daemon log")

    return wrapper  # type: ignore[return-value]


def from_rpc_error(e: grpc.RpcError) -> errors.PelotonError:
    """Client side: turn a failed call back into the error hierarchy."""
    code = e.code() if hasattr(e, "code") else grpc.StatusCode.UNKNOWN
    details = e.details() if hasattr(e, "details") else str(e)
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return errors.Unavailable(details or "daemon unavailable")
    cls = _FROM_CODE.get(code, errors.PelotonError)
    return cls(details or code.name)
