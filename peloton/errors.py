"""The one error hierarchy. Mapped to gRPC status codes in one place: the table of peloton/api/codes.py."""

from __future__ import annotations


class PelotonError(Exception):
    """Base of every error the daemon reports to a caller."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


class InvalidArgument(PelotonError):
    """Bad input; `field` names the field at fault. Nothing was written."""


class OutOfRange(InvalidArgument):
    """A value past the range the receiver takes (OUT_OF_RANGE): bad input, as InvalidArgument."""


class NotFound(PelotonError):
    pass


class AlreadyExists(PelotonError):
    pass


class FailedPrecondition(PelotonError):
    """The request is valid but the current state forbids it (e.g. deleting a running job)."""


class Conflict(PelotonError):
    """An optimistic check failed (stale lease, stale version); the caller may retry."""


class Unavailable(PelotonError):
    """A dependency (backend, component) is not reachable right now. `leader`: another daemon acts on the store,
    at that address (clients send the call there)."""

    def __init__(self, message: str, *, field: str | None = None, leader: str = "") -> None:
        super().__init__(message, field=field)
        self.leader = leader


class Unreachable(Unavailable):
    """An internal call that was never sent: no connection to the component could be made, so nothing it asked
    for happened (a caller may treat it as refused; any other Unavailable may have ended a call that was begun)."""


class Unauthenticated(PelotonError):
    """The caller did not prove who it is (no or an unknown token, no client certificate)."""


class PermissionDenied(PelotonError):
    """The caller is known but lacks the permission the message names."""


class ResourceExhausted(PelotonError):
    """A limit on how much or how fast one caller may ask was reached; `retry_after_s` when waiting helps."""

    def __init__(self, message: str, *, field: str | None = None, retry_after_s: float | None = None) -> None:
        super().__init__(message, field=field)
        self.retry_after_s = retry_after_s
