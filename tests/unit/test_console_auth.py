"""The web console's logins (pure parts): the one-time links of `peloton cluster ui-login`, the console's own
sessions, and how the API takes a call of the console for the browser's caller (security/auth.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from peloton.console.sessions import MAX_SESSIONS, MAX_SESSIONS_PER_PRINCIPAL, Sessions
from peloton.domain.principal import Principal
from peloton.errors import PermissionDenied, Unauthenticated
from peloton.security.auth import CONSOLE_SECRET, ON_BEHALF, Authenticator
from peloton.security.console_login import MAX_PENDING, OneTimeLogins
from peloton.security.identity import Principals, add_token
from tests.unit.test_identity import FakeContext


def test_a_one_time_login_opens_once_within_its_time_and_only_with_its_secret() -> None:
    logins = OneTimeLogins(ttl_s=60)
    a = logins.make(now=1000.0)
    assert a.expires_at == 1060.0 and len(a.login_id) == 8 and len(a.secret) == 43
    logins.spend(a.login_id, a.secret, now=1059.9)
    with pytest.raises(PermissionDenied, match=f"console login {a.login_id}: unknown or used already"):
        logins.spend(a.login_id, a.secret, now=1001.0)  # used
    b = logins.make(now=1000.0)
    with pytest.raises(PermissionDenied, match="expired") as e:
        logins.spend(b.login_id, b.secret, now=1060.0)
    assert b.secret not in str(e.value)  # never in a message, so never in a log or the audit
    c = logins.make(now=1000.0)
    with pytest.raises(PermissionDenied, match="wrong code"):
        logins.spend(c.login_id, "x" * 43, now=1001.0)
    with pytest.raises(PermissionDenied, match="used already"):  # a wrong guess spent it
        logins.spend(c.login_id, c.secret, now=1001.0)


def test_pending_logins_are_bounded_oldest_first() -> None:
    logins = OneTimeLogins()
    first = logins.make(now=0.0)
    last = [logins.make(now=0.0) for _ in range(MAX_PENDING)][-1]
    with pytest.raises(PermissionDenied, match="unknown"):
        logins.spend(first.login_id, first.secret, now=1.0)
    logins.spend(last.login_id, last.secret, now=1.0)


def test_a_certificates_session_holds_only_with_its_certificate_and_ends() -> None:
    s = Sessions(lifetime_s=100)
    sid = s.open("certificate:alice", b"fp-alice", now=0.0)
    assert s.get(sid, b"fp-alice", now=50.0) is not None
    assert s.get(sid, b"fp-mallory", now=50.0) is None  # the cookie alone, with another certificate: nothing
    assert s.get(sid, b"", now=50.0) is None
    local = s.open("local:peloton", b"", now=0.0)
    got = s.get(local, b"", now=99.0)
    assert got is not None and got.credential == "local:peloton"
    assert s.get(sid, b"fp-alice", now=100.0) is None  # expired
    s.close(local)
    assert s.get(local, b"", now=1.0) is None
    assert s.get("cs:unknown", b"", now=1.0) is None


def test_a_principal_logging_in_again_and_again_ends_only_its_own_oldest_sessions() -> None:
    s = Sessions(lifetime_s=100)
    alice = s.open("certificate:alice", b"fp-alice", now=0.0)
    local = s.open("local:peloton", b"", now=0.0)
    mallory = [s.open("certificate:mallory", b"fp-m", now=1.0) for _ in range(MAX_SESSIONS + 1)]
    assert s.get(alice, b"fp-alice", now=2.0) is not None and s.get(local, b"", now=2.0) is not None
    alive = [sid for sid in mallory if s.get(sid, b"fp-m", now=2.0) is not None]
    assert alive == mallory[-MAX_SESSIONS_PER_PRINCIPAL:]
    s.close(alive[0])
    assert s.get(alive[0], b"fp-m", now=2.0) is None and s.get(alive[1], b"fp-m", now=2.0) is not None


def test_when_all_sessions_together_are_too_many_the_largest_holder_gives_one_up() -> None:
    s = Sessions(lifetime_s=100)
    n = MAX_SESSIONS // MAX_SESSIONS_PER_PRINCIPAL
    everyone = {f"certificate:p{i}": [s.open(f"certificate:p{i}", b"fp", now=float(i))
                                      for _ in range(MAX_SESSIONS_PER_PRINCIPAL)] for i in range(n)}
    small = [s.open("local:peloton", b"", now=float(n)) for _ in range(MAX_SESSIONS - n * MAX_SESSIONS_PER_PRINCIPAL)]
    late = s.open("certificate:late", b"fp", now=float(n))  # one too many: p0's oldest goes, not peloton's
    assert s.get(late, b"fp", now=50.0) is not None
    assert s.get(everyone["certificate:p0"][0], b"fp", now=50.0) is None
    assert s.get(everyone["certificate:p0"][1], b"fp", now=50.0) is not None
    assert all(s.get(sid, b"", now=50.0) is not None for sid in small)
    # sessions expired by then go first: p0's (opened at 0, expired at 100), not p1's oldest (the largest holder's)
    s.open("certificate:later", b"fp", now=100.5)
    assert s.get(everyone["certificate:p1"][0], b"fp", now=100.5) is not None
    assert s.get(everyone["certificate:p0"][1], b"fp", now=0.0) is None  # (forgotten, not merely expired)


def test_the_api_takes_a_call_of_its_console_for_the_caller_the_console_names(tmp_path: Path) -> None:
    path = tmp_path / "principals.json"
    token = add_token(path, "alice", ["submitter"])
    add_token(path, "carol", ["operator"])
    auth = Authenticator(Principals(path), mutual_tls=True)
    auth.console_secret = "s3cret"
    unix = "unix:"

    def call(*md: tuple[str, str], peer: str = unix) -> Principal:
        return auth.principal(FakeContext(peer=peer, metadata=md))

    by_token = call((CONSOLE_SECRET, "s3cret"), (ON_BEHALF, "token"), ("authorization", f"Bearer {token}"))
    assert (by_token.name, by_token.via) == ("alice", "token")
    cert = call((CONSOLE_SECRET, "s3cret"), (ON_BEHALF, "certificate:carol"))
    assert (cert.name, cert.roles, cert.via) == ("carol", frozenset({"operator"}), "certificate via console")
    nobody = call((CONSOLE_SECRET, "s3cret"), (ON_BEHALF, "certificate:d%C3%A4ve"))
    assert (nobody.name, nobody.roles) == ("däve", frozenset())  # the file's say: no role
    local = call((CONSOLE_SECRET, "s3cret"), (ON_BEHALF, "local"))
    assert local.name == auth.owner and local.via == "local login via console"
    assert call((CONSOLE_SECRET, "s3cret")).via == "console"
    with pytest.raises(Unauthenticated, match="not this daemon's console"):
        call((CONSOLE_SECRET, "guess"), (ON_BEHALF, "local"))
    with pytest.raises(Unauthenticated, match="not known"):
        call((CONSOLE_SECRET, "s3cret"), (ON_BEHALF, "token"), ("authorization", "Bearer pt_nope"))
    # over TCP the console's headers mean nothing: no credentials
    with pytest.raises(Unauthenticated, match="no credentials"):
        call((CONSOLE_SECRET, "s3cret"), (ON_BEHALF, "local"), peer="ipv4:127.0.0.1:5")
    # a daemon without a console has no secret to match
    auth.console_secret = None
    with pytest.raises(Unauthenticated):
        call((CONSOLE_SECRET, ""), (ON_BEHALF, "local"))


def test_console_logins_are_made_over_the_owner_socket_and_spent_by_the_console_only(tmp_path: Path) -> None:
    path = tmp_path / "principals.json"
    add_token(path, "alice", ["admin"])
    auth = Authenticator(Principals(path), mutual_tls=False)
    auth.console_secret = "s3cret"
    owner = auth.principal(FakeContext(peer="unix:"))
    admin = Principals(path).entry_of("alice")
    alice = Principal("alice", admin.roles, "token")
    console = auth.principal(FakeContext(peer="unix:", metadata=((CONSOLE_SECRET, "s3cret"),)))
    create, redeem = "/peloton.v1.ClusterService/CreateConsoleLogin", "/peloton.v1.ClusterService/RedeemConsoleLogin"
    auth.authorize(create, owner)
    auth.authorize(redeem, console)
    with pytest.raises(PermissionDenied, match="alice may not call CreateConsoleLogin: only the daemon's own user"):
        auth.authorize(create, alice)  # an admin by token is not the daemon's user
    with pytest.raises(PermissionDenied, match="only the daemon's own console"):
        auth.authorize(redeem, owner)
