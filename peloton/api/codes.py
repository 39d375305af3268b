"""The one table of which error of the hierarchy travels as which gRPC status code, by the code's name. Standard
library only: the CLI reads it without importing grpc. `status.py` applies it on the server side."""

from __future__ import annotations

from peloton import errors

TO_CODE: tuple[tuple[type[errors.PelotonError], str], ...] = (
    (errors.OutOfRange, "OUT_OF_RANGE"),  # (before InvalidArgument, which it is a kind of)
    (errors.InvalidArgument, "INVALID_ARGUMENT"),
    (errors.NotFound, "NOT_FOUND"),
    (errors.AlreadyExists, "ALREADY_EXISTS"),
    (errors.Conflict, "ABORTED"),
    (errors.FailedPrecondition, "FAILED_PRECONDITION"),
    (errors.Unavailable, "UNAVAILABLE"),
    (errors.Unauthenticated, "UNAUTHENTICATED"),
    (errors.PermissionDenied, "PERMISSION_DENIED"),
    (errors.ResourceExhausted, "RESOURCE_EXHAUSTED"),
)
_FROM_CODE = {code: cls for cls, code in TO_CODE}


def code_name_for(err: errors.PelotonError) -> str:
    for cls, code in TO_CODE:
        if isinstance(err, cls):
            return code
    return "INTERNAL"


def error_for(code_name: str, details: str) -> errors.PelotonError:
    """Client side: a failed call's status as the error hierarchy (a daemon that could not be reached, or ran out
    of time, is Unavailable)."""
    if code_name in ("UNAVAILABLE", "DEADLINE_EXCEEDED"):
        return errors.Unavailable(details or "daemon unavailable")
    cls = _FROM_CODE.get(code_name, errors.PelotonError)
    return cls(details or code_name)
