"""One-time logins to the web console for the daemon's own user (`peloton cluster ui-login`, docs/ui.md): a code
made on a call over the owner-only Unix socket, spent by the console once, within its time to live. Pure apart from
the random source; the clock is passed in.

A code is `<id>.<secret>`: the id names the login in the audit log, the secret is kept only as its SHA-256, so
neither this process's memory nor any record holds what would open the console."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
from collections import OrderedDict
from dataclasses import dataclass

from peloton.errors import PermissionDenied

DEFAULT_TTL_S = 60
MAX_PENDING = 64  # logins made and not spent; beyond, the oldest is forgotten (only the daemon's user makes them)


@dataclass(frozen=True)
class Login:
    login_id: str
    secret: str
    expires_at: float


@dataclass(frozen=True)
class _Pending:
    digest: bytes
    expires_at: float


class OneTimeLogins:
    def __init__(self, ttl_s: int = DEFAULT_TTL_S) -> None:
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._pending: OrderedDict[str, _Pending] = OrderedDict()

    def make(self, now: float) -> Login:
        login_id, secret = secrets.token_hex(4), secrets.token_urlsafe(32)
        pending = _Pending(hashlib.sha256(secret.encode()).digest(), now + self.ttl_s)
        with self._lock:
            self._drop_expired(now)
            self._pending[login_id] = pending
            while len(self._pending) > MAX_PENDING:
                self._pending.popitem(last=False)
        return Login(login_id, secret, pending.expires_at)

    def spend(self, login_id: str, secret: str, now: float) -> None:
        """The login, spent: PermissionDenied (naming why, never the secret) when it is unknown, used already,
        expired, or the secret is wrong. A wrong secret spends it too: a guess gets one try."""
        with self._lock:
            pending = self._pending.pop(login_id, None)
            self._drop_expired(now)
        if pending is None:
            raise PermissionDenied(f"console login {login_id}: unknown or used already (a link opens the console "
                                   "once: run `peloton cluster ui-login` again)")
        if now >= pending.expires_at:
            raise PermissionDenied(f"console login {login_id}: expired (a link lasts {self.ttl_s}s: run `peloton "
                                   "cluster ui-login` again)")
        if not hmac.compare_digest(pending.digest, hashlib.sha256(secret.encode()).digest()):
            raise PermissionDenied(f"console login {login_id}: wrong code")

    def _drop_expired(self, now: float) -> None:
        for k in [k for k, p in self._pending.items() if now >= p.expires_at]:
            del self._pending[k]
