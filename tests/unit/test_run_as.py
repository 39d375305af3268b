"""Who a job's tasks run as (run_as.py, identity.py's `user`): the pure rules, without a daemon. The real daemon
with two tenants is tests/e2e/test_tenant_isolation_e2e.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from peloton.domain import principal, task_identity
from peloton.domain.principal import Principal
from peloton.errors import FailedPrecondition, InvalidArgument, PermissionDenied
from peloton.security import run_as
from peloton.security.identity import add_token, parse_principals
from peloton.security.run_as import Allocate, Mode, Policy, resolve

LOCAL, MESOS, OFF = Policy(Mode.LOCAL), Policy(Mode.MESOS), Policy(Mode.OFF)
ALICE = Principal("alice", frozenset({"submitter"}), "token")
MAPPED = Principal("carol", frozenset({"submitter"}), "token", frozenset({"ml-team"}), "carol")
ADMIN = Principal("ada", frozenset({"admin"}), "token")
SOCKET = Principal("root", frozenset({"admin"}), "unix socket")


def test_a_principal_without_a_mapping_gets_a_uid_of_its_own_never_an_account_by_name() -> None:
    assert resolve(LOCAL, ALICE, "") == Allocate("alice")
    for name in ("postgres", "daemon", "backup"):  # issue 19: a principal named like a system account
        p = Principal(name, frozenset({"submitter"}), "token")
        assert resolve(LOCAL, p, "") == Allocate(name)
        with pytest.raises(PermissionDenied, match=f"task.user: {name} may not run tasks as '{name}': the principals "
                                                    "file maps no Unix user"):
            resolve(LOCAL, p, name)
    # a certificate's common name is a principal like any other
    cn = Principal("www-data", frozenset({"submitter"}), "certificate")
    assert resolve(LOCAL, cn, "") == Allocate("www-data")


def test_a_mapped_principal_runs_as_its_user_and_may_name_only_its_own() -> None:
    assert resolve(LOCAL, MAPPED, "") == "carol"
    assert resolve(LOCAL, MAPPED, "ml-team") == "ml-team"
    assert resolve(MESOS, MAPPED, "") == "carol"
    with pytest.raises(PermissionDenied, match="only as carol, ml-team"):
        resolve(LOCAL, MAPPED, "alice")
    with pytest.raises(PermissionDenied, match="only as carol, ml-team"):
        resolve(LOCAL, MAPPED, "root")  # root only if the file lists it (and the pool allows it)


def test_admins_name_any_user_and_the_daemons_own_user_runs_as_the_backends_default() -> None:
    assert resolve(LOCAL, ADMIN, "postgres") == "postgres"  # an admin's explicit choice
    assert resolve(LOCAL, ADMIN, "") == Allocate("ada")  # an admin by token is a tenant too
    assert resolve(LOCAL, SOCKET, "", unix_socket_default=True) == ""  # --default-task-user, never root
    assert resolve(OFF, principal.OPEN, "") == "" and resolve(OFF, principal.OPEN, "bob") == "bob"


def test_on_mesos_a_principal_needs_a_mapped_user() -> None:
    with pytest.raises(FailedPrecondition, match=r"task.user: the principals file maps no Unix user to alice, and on "
                                                 r"Mesos .* principals.alice"):
        resolve(MESOS, ALICE, "")
    assert resolve(MESOS, ADMIN, "svc") == "svc"


def test_without_isolation_the_user_is_passed_on_but_still_checked() -> None:
    assert resolve(OFF, ALICE, "") == ""
    with pytest.raises(PermissionDenied):
        resolve(OFF, ALICE, "alice")  # the same rules, whatever the mode: no name-based permission anywhere


def test_uids_are_picked_lowest_first_skipping_allocated_ones_and_the_hosts() -> None:
    assert run_as.pick_uid((70000, 70005), {70000, 70002}, lambda u: u == 70001) == 70003
    assert run_as.pick_uid((70000, 70001), {70000}, lambda u: u == 70001) is None
    assert task_identity.dynamic(70003) == "#70003" and task_identity.dynamic_uid("#70003") == 70003
    assert task_identity.dynamic_uid("alice") is None and task_identity.dynamic_uid("#x") is None
    assert task_identity.describe("#70003") == "uid 70003" and task_identity.describe("carol") == "carol"
    assert task_identity.describe(None) == ""


@pytest.mark.parametrize(("text", "error"), [
    ("65536", "expected LO-HI"),
    ("500-2000", "within 1000-"),
    ("70000-60000", "low end first"),
    ("60000-70000", "holds 65534"),
])
def test_a_bad_uid_range_is_named(text: str, error: str) -> None:
    with pytest.raises(InvalidArgument, match=f"--task-uid-range: .*{error}"):
        run_as.parse_uid_range(text)


def test_ranges_overlapping_subordinate_ids_are_found() -> None:
    subuid = "alice:100000:65536\nbob:165536:65536\nbroken line\n"
    assert run_as.overlapping_subids((65536, 99999), subuid) == []
    assert run_as.overlapping_subids((99000, 100001), subuid) == ["alice:100000:65536"]


def test_system_accounts_by_name_and_by_uid() -> None:
    assert run_as.system_account("postgres", 1005)  # a service's account, even numbered like a person
    assert run_as.system_account("systemd-oom", None) and run_as.system_account("_apt", None)
    assert run_as.system_account("lp", 7) and run_as.system_account("someservice", 130)
    assert not run_as.system_account("alice", 1000) and not run_as.system_account("nobody", 65534)
    assert not run_as.system_account("root", 0)  # root has its own rule: a pool that allows it
    assert run_as.sys_uid_max("UID_MIN 1000\nSYS_UID_MAX  499\n") == 499
    assert run_as.sys_uid_max("UID_MIN 500\n") == 499 and run_as.sys_uid_max("") == 999


def test_the_principals_file_maps_one_user_to_one_principal(tmp_path: Path) -> None:
    ok = parse_principals(json.dumps({"principals": {
        "alice": {"roles": ["submitter"], "user": "alice", "users": ["root"]},
        "bob": {"roles": ["submitter"], "users": ["ml-team", "root"]}}}), "p.json")
    assert ok["alice"].user == "alice" and ok["bob"].users == frozenset({"ml-team", "root"})
    for doc, error in [
        ({"alice": {"user": "ml"}, "bob": {"user": "ml"}}, "principals.bob.user: the Unix user 'ml' is already "
                                                             "principals.alice's"),
        ({"alice": {"user": "ml"}, "bob": {"users": ["x", "ml"]}}, "principals.bob.users: the Unix user 'ml'"),
        ({"alice": {"user": "root"}}, "principals.alice.user: root is nobody's identity"),
        ({"alice": {"user": "bad user"}}, "principals.alice.user: 'bad user' is not a Unix user name"),
        ({"alice": {"user": 7}}, "principals.alice.user"),
        ({"alice": {"users": ["a:b"]}}, "principals.alice.users: a list of Unix user names"),
    ]:
        with pytest.raises(InvalidArgument, match=error):
            parse_principals(json.dumps({"principals": doc}), "p.json")


def test_token_create_maps_a_user_and_refuses_one_that_is_anothers(tmp_path: Path) -> None:
    path = tmp_path / "principals.json"
    add_token(path, "alice", ["submitter"], user="alice")
    assert json.loads(path.read_text())["principals"]["alice"]["user"] == "alice"
    with pytest.raises(InvalidArgument, match="--user: .*the Unix user 'alice' is already principals.alice's"):
        add_token(path, "bob", ["submitter"], user="alice")
    assert "bob" not in json.loads(path.read_text())["principals"]  # nothing written
    add_token(path, "alice", [], user="")  # removed
    assert "user" not in json.loads(path.read_text())["principals"]["alice"]
