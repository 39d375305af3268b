"""The internal services of a role that has standbys: `--resmgr` / `--hostmgr` may list several addresses (the
leader's and its standbys', `unix:/a.sock,10.0.0.2:5393`). Only the leader serves them: a standby does not listen
yet, and a replaced leader answers UNAVAILABLE. So a caller keeps to one address until a call to it ends
UNAVAILABLE (or is not answered in time), then moves on to the next for its next call.

The failed call itself is not sent again here: UNAVAILABLE may also end a call the server had begun, and every
caller of the internal services already treats it as "try again later" (the loops retry; the job manager keeps its
side effects until they are sent).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

import grpc

log = logging.getLogger(__name__)

# Unavailable: the process is gone, stands by, or was replaced. Deadline exceeded: it did not answer in time (paused
# or stuck; the channels' keepalive usually ends such calls sooner, as UNAVAILABLE).
MOVE_ON = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})


def split_addresses(value: str) -> list[str]:
    """The addresses of a comma-separated list, in order, without blanks or repeats."""
    return list(dict.fromkeys(a.strip() for a in value.split(",") if a.strip()))


class FailoverStub:
    """The interface of a generated stub (`stub.Method(request, timeout=...)`) over one stub per address."""

    def __init__(self, stubs: Sequence[Any], addresses: Sequence[str], what: str) -> None:
        assert stubs and len(stubs) == len(addresses)
        self._stubs = list(stubs)
        self._addresses = list(addresses)
        self._what = what
        self._mu = threading.Lock()
        self._current = 0

    @property
    def address(self) -> str:
        return self._addresses[self._current]

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name.startswith("_"):
            raise AttributeError(name)

        def call(request: Any, **kwargs: Any) -> Any:
            i = self._current
            try:
                return getattr(self._stubs[i], name)(request, **kwargs)
            except grpc.RpcError as e:
                if e.code() in MOVE_ON:
                    self._next(i, e)
                raise

        return call

    def _next(self, failed: int, e: grpc.RpcError) -> None:
        with self._mu:
            if self._current != failed:  # another thread moved on already
                return
            self._current = (failed + 1) % len(self._stubs)
            log.warning("the %s at %s is unavailable (%s): calling %s next", self._what, self._addresses[failed],
                        (e.details() or "").split(";")[0], self._addresses[self._current])
