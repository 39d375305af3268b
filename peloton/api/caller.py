"""The principal of the call being served: set by the authentication interceptor (peloton/security/auth.py) for
the call's duration, read by the servicers. OPEN (an admin) when authentication is off, and for in-process
calls."""

from __future__ import annotations

import contextvars

from peloton.domain.principal import OPEN, Principal

CALLER: contextvars.ContextVar[Principal] = contextvars.ContextVar("peloton_caller", default=OPEN)


def current() -> Principal:
    """The principal of the call being served."""
    return CALLER.get()
