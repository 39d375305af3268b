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
# A principal's own sessions (its browsers and devices): a login beyond ends its own oldest. Never another's: a cap
# on all sessions together, the oldest ended first, let one holder of a certificate log everybody out by logging
# in that many times.
MAX_SESSIONS_PER_PRINCIPAL = 16
# All sessions together (memory): beyond, the expired go first, then the oldest of the principal holding the most.
MAX_SESSIONS = 1000


@dataclass(frozen=True)
class Session:
    credential: str  # how the console calls the API for it: "certificate:<name>" or "local:<name>"
    fingerprint: bytes  # the client certificate's SHA-256 it is bound to; b"" for a local login
    expires_at: float


class Sessions:
    """The sessions, and each principal's (by credential: who the console calls the API as), oldest first."""

    def __init__(self, lifetime_s: float = LIFETIME_S) -> None:
        self.lifetime_s = lifetime_s
        self._lock = threading.Lock()
        self._by_id: OrderedDict[str, Session] = OrderedDict()
        self._by_principal: dict[str, OrderedDict[str, None]] = {}

    def open(self, credential: str, fingerprint: bytes, now: float) -> str:
        sid = SESSION_PREFIX + secrets.token_urlsafe(32)
        with self._lock:
            own = self._by_principal.setdefault(credential, OrderedDict())
            while len(own) >= MAX_SESSIONS_PER_PRINCIPAL:
                self._end(next(iter(own)))
            if len(self._by_id) >= MAX_SESSIONS:
                self._end_expired(now)
            while len(self._by_id) >= MAX_SESSIONS:
                most = max(self._by_principal.values(), key=len)  # (the first of the largest: it fills first)
                self._end(next(iter(most)))
            self._by_id[sid] = Session(credential, fingerprint, now + self.lifetime_s)
            self._by_principal.setdefault(credential, own)[sid] = None
        return sid

    def get(self, sid: str, fingerprint: bytes, now: float) -> Session | None:
        """The session, if it exists, has not expired and (for a certificate's) is used with its certificate."""
        with self._lock:
            s = self._by_id.get(sid)
            if s is not None and now >= s.expires_at:
                self._end(sid)
                s = None
        if s is None or (s.fingerprint and not secrets.compare_digest(s.fingerprint, fingerprint)):
            return None
        return s

    def close(self, sid: str) -> None:
        with self._lock:
            self._end(sid)

    def _end(self, sid: str) -> None:
        """Forget the session `sid` (none: nothing), under the lock."""
        s = self._by_id.pop(sid, None)
        if s is None:
            return
        own = self._by_principal[s.credential]
        del own[sid]
        if not own:
            del self._by_principal[s.credential]

    def _end_expired(self, now: float) -> None:
        """Forget every session expired at `now`, under the lock (when all together reach MAX_SESSIONS)."""
        for sid in [sid for sid, s in self._by_id.items() if now >= s.expires_at]:
            self._end(sid)
