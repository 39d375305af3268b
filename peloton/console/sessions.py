"""The console's own sessions, for the logins the API has no token for: a client certificate the console's HTTPS
listener verified, and a one-time local login of the daemon's user. Pure apart from the random source; the clock is
passed in. (A token login keeps the token itself as its session: the API checks it on every call.)

A session id is 256 random bits, handed to the browser in an HttpOnly cookie; a certificate's session is good only
on a connection that presents the same certificate (its SHA-256), so a cookie taken away is worth nothing alone."""

from __future__ import annotations

import secrets
import threading
from collections import OrderedDict
from dataclasses import dataclass

SESSION_PREFIX = "cs:"  # (an API token never holds a colon: a cookie is one or the other)
LIFETIME_S = 8 * 3600
MAX_SESSIONS = 1000  # beyond, the oldest is ended


@dataclass(frozen=True)
class Session:
    credential: str  # how the console calls the API for it: "certificate:<name>" or "local:<name>"
    fingerprint: bytes  # the client certificate's SHA-256 it is bound to; b"" for a local login
    expires_at: float


class Sessions:
    def __init__(self, lifetime_s: float = LIFETIME_S) -> None:
        self.lifetime_s = lifetime_s
        self._lock = threading.Lock()
        self._by_id: OrderedDict[str, Session] = OrderedDict()

    def open(self, credential: str, fingerprint: bytes, now: float) -> str:
        sid = SESSION_PREFIX + secrets.token_urlsafe(32)
        with self._lock:
            self._by_id[sid] = Session(credential, fingerprint, now + self.lifetime_s)
            while len(self._by_id) > MAX_SESSIONS:
                self._by_id.popitem(last=False)
        return sid

    def get(self, sid: str, fingerprint: bytes, now: float) -> Session | None:
        """The session, if it exists, has not expired and (for a certificate's) is used with its certificate."""
        with self._lock:
            s = self._by_id.get(sid)
            if s is not None and now >= s.expires_at:
                del self._by_id[sid]
                s = None
        if s is None or (s.fingerprint and not secrets.compare_digest(s.fingerprint, fingerprint)):
            return None
        return s

    def close(self, sid: str) -> None:
        with self._lock:
            self._by_id.pop(sid, None)
