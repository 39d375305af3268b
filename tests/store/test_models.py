"""Stored models on SQLite and PostgreSQL: the repo's functions and the book the ModelService serves from (create,
replace bumping the version, a duplicate refused, paging, delete, and a refused request writing nothing)."""

from __future__ import annotations

import json

import pytest
from sqlalchemy.orm import Session, sessionmaker

from peloton.api.model_service import MAX_PAGE_BYTES, ModelBook
from peloton.domain import principal
from peloton.domain.model import StoredModel
from peloton.errors import AlreadyExists, Conflict, InvalidArgument, NotFound, PermissionDenied
from peloton.store import db, repo

DOC = {"kind": "peloton.model/v1",
       "description": {"parameters": 110_000_000, "flops_per_sample": 2.5e11, "sync": "allreduce-ring"}}
ALICE = principal.Principal("alice", frozenset({"submitter"}), "token")
BOB = principal.Principal("bob", frozenset({"submitter"}), "token")
ADMIN = principal.Principal("root", frozenset({"admin"}), "token")


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        self.t += 1
        return self.t


def _book(sessions: sessionmaker[Session]) -> ModelBook:
    return ModelBook(sessions, sessions, clock=Clock())


def _all(sessions: sessionmaker[Session]) -> list[StoredModel]:
    with db.transaction(sessions) as s:
        return repo.list_models(s)


def test_repo_create_get_replace_delete(sessions: sessionmaker[Session]) -> None:
    m = StoredModel("bert", "alice", '{"kind":"peloton.model/v1"}', 1, 10.0, 10.0)
    with db.transaction(sessions) as s:
        repo.create_model(s, m)
    with db.transaction(sessions) as s:
        assert repo.get_model(s, "bert") == m
        with pytest.raises(AlreadyExists, match="^name: model 'bert' already exists"):
            repo.create_model(s, m)
    with db.transaction(sessions) as s:
        new = repo.replace_model(s, "bert", '{"x":1}', 20.0, version=1)
    assert new == StoredModel("bert", "alice", '{"x":1}', 2, 10.0, 20.0)
    # read at version 1, replaced meanwhile: refused
    with db.transaction(sessions) as s, pytest.raises(Conflict, match="^name: model 'bert' changed"):
        repo.replace_model(s, "bert", '{"x":2}', 30.0, version=1)
    with db.transaction(sessions) as s:
        with pytest.raises(NotFound, match="^name: no model 'gone'"):
            repo.replace_model(s, "gone", "{}", 30.0, version=1)
        repo.delete_model(s, "bert")
        with pytest.raises(NotFound, match="^name: no model 'bert'"):
            repo.get_model(s, "bert")
        with pytest.raises(NotFound):
            repo.delete_model(s, "bert")


def test_create_stores_the_canonical_document_and_replace_bumps_the_version(sessions: sessionmaker[Session]) -> None:
    book = _book(sessions)
    m, replaced = book.create("bert", json.dumps({**DOC, "name": "other"}), ALICE)
    assert not replaced and (m.name, m.owner, m.version, m.created_at, m.updated_at) == ("bert", "alice", 1, 1001, 1001)
    doc = json.loads(m.document)
    assert doc["kind"] == "peloton.model/v1" and doc["name"] == "bert"  # the model's name, not the document's
    assert doc["description"] == {"parameters": 110_000_000, "flops_per_sample": 2.5e11, "sync": "allreduce-ring"}
    assert book.get("bert") == m
    with pytest.raises(AlreadyExists, match="^name: model 'bert' already exists"):
        book.create("bert", json.dumps(DOC), ALICE)
    changed = {**DOC, "description": {**DOC["description"], "local_bsz": 32}}  # type: ignore[dict-item]
    r, replaced = book.create("bert", json.dumps(changed), ALICE, replace=True)
    assert replaced and (r.version, r.owner, r.created_at, r.updated_at) == (2, "alice", 1001, 1003)  # (the refused create read the clock too)
    assert json.loads(r.document)["description"]["local_bsz"] == 32
    r, _ = book.create("bert", json.dumps(DOC), ADMIN, replace=True)  # an admin may replace anyone's
    assert (r.version, r.owner) == (3, "alice")
    with pytest.raises(PermissionDenied, match="^name: bob may not replace model 'bert' of alice"):
        book.create("bert", json.dumps(DOC), BOB, replace=True)
    assert book.get("bert") == r
    # --replace on a name nobody has: created
    n, replaced = book.create("gpt", json.dumps(DOC), BOB, replace=True)
    assert not replaced and (n.version, n.owner) == (1, "bob")


@pytest.mark.parametrize(("name", "text", "field"), [
    ("", json.dumps(DOC), "name"),
    ("-x", json.dumps(DOC), "name"),
    ("..", json.dumps(DOC), "name"),
    ("a b", json.dumps(DOC), "name"),
    ("x" * 129, json.dumps(DOC), "name"),
    ("ok", "", "document_json"),
    ("ok", "{not json", "document_json"),
    ("ok", '{"kind": "peloton.model/v1", "description": {"parameters": NaN}}', "document_json"),
    ("ok", "[" * 100_000, "document_json"),
    ("ok", json.dumps({**DOC, "extra": 1}), "model.extra"),
    ("ok", "[]", "model"),
    ("ok", json.dumps({**DOC, "kind": "v2"}), "model.kind"),
    ("ok", json.dumps({"kind": "peloton.model/v1", "description": {"parameters": -1}}), "model.description.parameters"),
    ("ok", json.dumps({"kind": "peloton.model/v1", "description": {"parameters": 1}}), "model.params"),
    ("ok", json.dumps({**DOC, "fit": {"rows": "many"}}), "model.fit.rows"),
    ("ok", json.dumps({**DOC, "name": "x" * 2_000_000}), "document_json"),
])
def test_a_refused_create_names_the_field_and_writes_nothing(sessions: sessionmaker[Session], name: str, text: str,
                                                            field: str) -> None:
    book = _book(sessions)
    book.create("keep", json.dumps(DOC), ALICE)
    before = _all(sessions)
    for replace in (False, True):
        with pytest.raises(InvalidArgument) as e:
            book.create(name or "", text, ALICE, replace=replace)
        assert e.value.field == field and e.value.message.startswith(field + ": "), e.value.message
        with pytest.raises(InvalidArgument):  # the same over an existing model: it is left as it was
            book.create("keep", text, ALICE, replace=True) if name == "ok" else book.get(name)
    assert _all(sessions) == before


def test_list_pages_by_name(sessions: sessionmaker[Session]) -> None:
    book = _book(sessions)
    names = ["a", "B", "a-1", "a.2", "_z", "Z9", "m"]
    for n in names:
        book.create(n, json.dumps(DOC), ALICE)
    seen: list[str] = []
    token = ""
    pages = 0
    while True:
        page, token = book.list(page_size=3, page_token=token)
        seen += [m.name for m in page]
        pages += 1
        if not token:
            break
    assert seen == sorted(names) and pages == 3  # byte order on both stores: B, Z9, _z, a, a-1, a.2, m
    assert [m.name for m in book.list()[0]] == sorted(names) and book.list()[1] == ""
    for bad in ("!!", "bm90IGEgbmFtZSE="):
        with pytest.raises(InvalidArgument, match="^page_token: not a page token of this API"):
            book.list(page_token=bad)
    with pytest.raises(InvalidArgument, match="^page_size: at most 1000"):
        book.list(page_size=1001)


def test_a_page_of_big_documents_ends_early(sessions: sessionmaker[Session]) -> None:
    book = _book(sessions)
    big = {**DOC, "fit": {"rows": 1, "median_error": 0, "p90_error": 0, "source": "x" * 1000},
           "measured": [{"job_id": f"j{i}", "placement": [4, 4, 4, 4], "local_bsz": 32, "step_time": 1.5,
                         "predicted_step_time": 1.4} for i in range(1000)]}
    size = len(book.create("m0", json.dumps(big), ALICE)[0].document)
    count = MAX_PAGE_BYTES // size + 2
    for i in range(1, count):
        book.create(f"m{i:02d}", json.dumps(big), ALICE)
    page, token = book.list(page_size=1000)
    assert 0 < len(page) < count and sum(len(m.document) for m in page) <= MAX_PAGE_BYTES and token
    rest, token = book.list(page_size=1000, page_token=token)
    assert len(page) + len(rest) == count and not token


def test_delete_is_the_owners_or_an_admins(sessions: sessionmaker[Session]) -> None:
    book = _book(sessions)
    book.create("bert", json.dumps(DOC), ALICE)
    book.create("gpt", json.dumps(DOC), ALICE)
    with pytest.raises(PermissionDenied, match="^name: bob may not delete model 'bert' of alice"):
        book.delete("bert", BOB)
    assert [m.name for m in _all(sessions)] == ["bert", "gpt"]
    book.delete("bert", ALICE)
    book.delete("gpt", ADMIN)
    assert _all(sessions) == []
    with pytest.raises(NotFound, match="^name: no model 'bert'"):
        book.delete("bert", ALICE)
    with pytest.raises(NotFound):
        book.get("bert")
