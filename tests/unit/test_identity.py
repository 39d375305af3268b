"""Principals, roles and tokens (identity.py) and how a call is authenticated (security/auth.py), without a daemon."""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path
from typing import Any

import pytest

from peloton.domain import principal
from peloton.domain.principal import Principal
from peloton.errors import FailedPrecondition, InvalidArgument, PermissionDenied, Unauthenticated
from peloton.security import identity
from peloton.security.auth import Authenticator
from peloton.security.identity import Principals, add_token, parse_principals


def test_add_token_keeps_only_the_hash_owner_only(tmp_path: Path) -> None:
    path = tmp_path / "d" / "principals.json"
    token = add_token(path, "alice", ["submitter"])
    assert token.startswith("pt_") and len(token) > 40
    text = path.read_text()
    assert token not in text and identity.hash_token(token) in text
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    second = add_token(path, "alice", [])  # another token, same roles
    doc = json.loads(path.read_text())
    assert doc["principals"]["alice"] == {"roles": ["submitter"],
                                          "tokens": [identity.hash_token(token), identity.hash_token(second)]}
    with pytest.raises(InvalidArgument, match="--role: bob is a new principal: give it a role"):
        add_token(path, "bob", [])
    with pytest.raises(InvalidArgument, match="--role: 'root' is not one of"):
        add_token(path, "bob", ["root"])
    with pytest.raises(InvalidArgument, match="NAME: "):
        add_token(path, "a b", ["viewer"])


@pytest.mark.parametrize(("text", "error"), [
    ("{", "not JSON"),
    ('{"users": {}}', "expected"),
    ('{"principals": {"a": {"roles": ["root"]}}}', r"principals.a.roles: \['root'\]"),
    ('{"principals": {"a": {"roles": ["admin"], "tokens": ["plain-token"]}}}', "principals.a.tokens: hashes"),
    ('{"principals": {"a": {"role": ["admin"]}}}', "principals.a: expected"),
    ('{"principals": {"a": {"roles": ["admin"], "users": "alice"}}}', "principals.a.users: a list"),
    ('{"principals": {"a": {"roles": ["admin"], "users": [""]}}}', "principals.a.users: a list"),
])
def test_a_bad_principals_file_is_named(text: str, error: str) -> None:
    with pytest.raises(InvalidArgument, match=error):
        parse_principals(text, "/etc/p.json")


def test_a_new_token_works_without_a_restart_and_a_broken_file_keeps_the_last_good_one(tmp_path: Path) -> None:
    path = tmp_path / "principals.json"
    first = add_token(path, "alice", ["viewer"])
    p = Principals(path)
    assert p.by_token(first) == Principal("alice", frozenset({"viewer"}), "token")
    second = add_token(path, "bob", ["operator"])
    assert p.by_token(second) is not None  # an unknown token has the file read again at once
    assert p.entry_of("bob").roles == frozenset({"operator"})
    path.write_text("{ broken")
    os.utime(path, (time.time() + 10, time.time() + 10))
    p._checked = 0.0
    assert p.by_token(first) is not None  # kept
    assert p.by_token("pt_unknown") is None


def test_a_principals_file_others_can_read_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "principals.json"
    add_token(path, "alice", ["viewer"])
    path.chmod(0o644)
    with pytest.raises(FailedPrecondition, match="--principals-file: .* readable by others"):
        Principals(path)


def test_permission_messages_name_what_is_missing() -> None:
    viewer = Principal("vic", frozenset({"viewer"}), "token")
    with pytest.raises(PermissionDenied, match="vic may not .*job.create .role admin or operator or submitter.*viewer"):
        viewer.require(principal.JOB_CREATE)
    sub = Principal("alice", frozenset({"submitter"}), "token")
    assert sub.may_control("alice") and not sub.may_control("bob") and sub.may_see_secrets("alice")
    op = Principal("olga", frozenset({"operator"}), "certificate")
    assert op.may_control("bob") and op.may_see_secrets("bob") and not op.can(principal.POOL_WRITE)


class FakeContext:
    def __init__(self, peer: str = "ipv4:127.0.0.1:5", metadata: Any = (), cn: str | None = None) -> None:
        self._peer, self._md, self._cn = peer, metadata, cn

    def peer(self) -> str:
        return self._peer

    def invocation_metadata(self) -> Any:
        return self._md

    def auth_context(self) -> dict[str, list[bytes]]:
        return {"x509_common_name": [self._cn.encode()]} if self._cn else {}


def test_how_a_call_is_authenticated(tmp_path: Path) -> None:
    path = tmp_path / "principals.json"
    token = add_token(path, "alice", ["submitter"])
    add_token(path, "carol", ["operator"])
    auth = Authenticator(Principals(path), mutual_tls=True)
    assert auth.principal(FakeContext(metadata=(("authorization", f"Bearer {token}"),))).name == "alice"
    assert auth.principal(FakeContext(cn="carol")).roles == frozenset({"operator"})  # roles from the file
    assert auth.principal(FakeContext(cn="dave")).roles == frozenset()  # a certificate, but no role: nothing
    owner = auth.principal(FakeContext(peer="unix:/data/peloton.sock"))
    assert owner.via == "unix socket" and "admin" in owner.roles
    with pytest.raises(Unauthenticated, match=r"no credentials: .* own user needs neither .* Unix socket"):
        auth.principal(FakeContext())  # where a root daemon's own user (no tokens yet) gets in instead
    # mutual TLS without a principals file: a holder of a certificate of the CA is a submitter of its own jobs,
    # never an admin (who could allow root in a pool and run as root)
    assert Authenticator(None, mutual_tls=True).principal(FakeContext(cn="eve")).roles == frozenset({"submitter"})
    # authentication off: everyone is the open admin
    assert Authenticator(None, mutual_tls=False).principal(FakeContext()) is principal.OPEN


def test_every_public_method_has_a_permission() -> None:
    from peloton.api.v1 import audit_pb2, cluster_pb2, host_pb2, job_pb2, model_pb2, respool_pb2, sim_pb2, task_pb2

    for module in (job_pb2, task_pb2, respool_pb2, host_pb2, sim_pb2, model_pb2, audit_pb2, cluster_pb2):
        for service in module.DESCRIPTOR.services_by_name.values():
            for m in service.methods:
                assert f"/{service.full_name}/{m.name}" in identity.METHODS, m.full_name


def test_who_may_run_as_which_user(tmp_path: Path) -> None:
    path = tmp_path / "principals.json"
    add_token(path, "alice", ["submitter"])
    doc = json.loads(path.read_text())
    doc["principals"]["alice"]["users"] = ["ml-team"]
    path.write_text(json.dumps(doc))
    p = Principals(path)
    alice = p.by_token(add_token(path, "alice", []))
    assert alice is not None and alice.users == frozenset({"ml-team"})
    assert alice.may_run_as("ml-team")
    # a name alone is no permission: without a mapping, not even the account named like the principal
    assert not alice.may_run_as("alice") and not alice.may_run_as("bob") and not alice.may_run_as("root")
    add_token(path, "alice", [], user="alice")  # mapped by an admin
    alice = p.by_token(add_token(path, "alice", []))
    assert alice is not None and alice.user == "alice" and alice.may_run_as("alice")
    assert p.entry_of("alice").users == frozenset({"ml-team"}) and p.entry_of("nobody-known").roles == frozenset()
    admin = Principal("root-admin", frozenset({"admin"}), "token")
    assert admin.may_run_as("anyone")


def test_a_token_is_checked_with_no_lock_held_while_the_file_is_read(tmp_path: Path) -> None:
    """Authenticated calls read the loaded principals lock-free: a slow read of the file (a reload) holds none of
    them up, and concurrent checks of a changed file reload it once."""
    import threading

    path = tmp_path / "principals.json"
    alice = add_token(path, "alice", ["viewer"])
    p = Principals(path)
    bob = add_token(path, "bob", ["operator"])
    entered, go = threading.Event(), threading.Event()
    reads: list[bool] = []
    from peloton.security import identity

    real_read = identity.read_principals_text

    def slow_read(at: Path) -> str:
        if at == path:
            reads.append(p._lock.locked())
            entered.set()
            assert go.wait(60)
        return real_read(at)

    identity.read_principals_text = slow_read  # type: ignore[assignment]
    try:
        found: list[object] = []
        reloaders = [threading.Thread(target=lambda: found.append(p.by_token(bob))) for _ in range(3)]
        for t in reloaders:
            t.start()
        assert entered.wait(10)
        # known: answered while the file is being read (until `go`, a minute away)
        answered: list[object] = []
        reader = threading.Thread(target=lambda: answered.append(p.by_token(alice)), daemon=True)
        reader.start()
        reader.join(30)
        assert answered and answered[0] is not None
        go.set()
        for t in reloaders:
            t.join(10)
    finally:
        identity.read_principals_text = real_read
    assert reads == [False]  # read once, with the lock free
    assert len(found) == 3 and all(f is not None for f in found)


def test_a_default_principals_file_left_readable_by_others_is_still_tightened_and_loaded(tmp_path: Path) -> None:
    """The start checks the principals file before anything is written (its size, its entries), but not its mode:
    the daemon tightens what is directly in its data dir first (files.py), the default principals.json included."""
    from peloton.files import private_dir
    from peloton.settings import ServerConfig

    path = tmp_path / "principals.json"
    token = add_token(path, "alice", ["viewer"])
    path.chmod(0o644)
    ServerConfig("127.0.0.1:0", None, tmp_path).check()  # not refused for its mode here ...
    private_dir(tmp_path)  # ... which the daemon's taking its data dir tightens
    assert Principals(path).by_token(token) is not None
