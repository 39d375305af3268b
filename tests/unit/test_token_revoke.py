"""`peloton token revoke` and `token list` (security/identity.py): the principals file rewritten whole, nothing
written on an error, each error naming what is at fault."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from peloton.errors import InvalidArgument, NotFound
from peloton.security.identity import add_token, hash_token, list_principals, revoke_tokens, token_id


def test_revoke_by_id_or_prefix_or_all_keeps_the_principal_and_the_others(tmp_path: Path) -> None:
    path = tmp_path / "principals.json"
    a1, a2, a3 = (add_token(path, "alice", ["submitter"]) for _ in range(3))
    b = add_token(path, "bob", ["viewer"], user="bob")
    i1, i2, i3 = (token_id(hash_token(t)) for t in (a1, a2, a3))
    assert len(i1) == 12 and list_principals(path)["alice"].tokens == tuple(hash_token(t) for t in (a1, a2, a3))

    assert revoke_tokens(path, "alice", [i2[:6], i2]) == [i2]  # (the same token twice: once)
    assert list_principals(path)["alice"].tokens == (hash_token(a1), hash_token(a3))
    assert revoke_tokens(path, "alice", [], every=True) == [i1, i3]
    left = list_principals(path)
    assert left["alice"].tokens == () and left["alice"].roles == {"submitter"}
    assert left["bob"].tokens == (hash_token(b),) and left["bob"].user == "bob"
    assert path.stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize(("name", "ids", "every", "error", "message"), [
    ("carol", ["abcdef"], False, NotFound, "NAME: no principal 'carol' in "),
    ("alice", [], False, InvalidArgument, "--id: give the ids of the tokens to revoke"),
    ("alice", ["abcdef"], True, InvalidArgument, "--id: give the ids of the tokens to revoke"),
    ("alice", ["abc"], False, InvalidArgument, "--id: 'abc' is not a token id (6 to 12 lowercase hex digits"),
    ("alice", ["ABCDEF"], False, InvalidArgument, "--id: 'ABCDEF' is not a token id"),
    ("alice", ["0123456789abc"], False, InvalidArgument, "--id: '0123456789abc' is not a token id"),
])
def test_a_bad_revoke_names_what_is_at_fault_and_writes_nothing(tmp_path: Path, name: str, ids: list[str], every: bool,
                                                               error: type[Exception], message: str) -> None:
    path = tmp_path / "principals.json"
    add_token(path, "alice", ["submitter"])
    before = path.read_bytes()
    with pytest.raises(error, match="^" + message.replace("(", r"\(")):
        revoke_tokens(path, name, ids, every)
    assert path.read_bytes() == before


def test_an_id_that_matches_none_or_two_lists_the_principals_tokens(tmp_path: Path) -> None:
    path = tmp_path / "principals.json"
    doc = {"principals": {"alice": {"roles": ["submitter"], "tokens": ["sha256:" + "ab1234" + "0" * 58,
                                                                      "sha256:" + "ab1234" + "f" * 58]}}}
    path.write_text(json.dumps(doc))
    before = path.read_bytes()
    with pytest.raises(NotFound, match=r"^--id: ab1234 matches more than one token of alice \(its tokens: "
                                       r"ab1234000000, ab1234ffffff\)"):
        revoke_tokens(path, "alice", ["ab1234"])
    with pytest.raises(NotFound, match=r"^--id: cd1234 matches no token of alice"):
        revoke_tokens(path, "alice", ["cd1234"])
    assert path.read_bytes() == before
    assert revoke_tokens(path, "alice", ["ab1234f"]) == ["ab1234ffffff"]


def test_no_file_or_a_broken_one_is_refused_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "principals.json"
    with pytest.raises(NotFound, match=r"^--principals-file: .*principals.json does not exist"):
        revoke_tokens(path, "alice", [], every=True)
    with pytest.raises(NotFound, match=r"^--principals-file: "):
        list_principals(path)
    path.write_text('{"principals": {"alice": {"roles": ["wizard"]}}}')
    with pytest.raises(InvalidArgument, match=r"principals.alice.roles"):
        revoke_tokens(path, "alice", [], every=True)
    assert path.read_text() == '{"principals": {"alice": {"roles": ["wizard"]}}}'
