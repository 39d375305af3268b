"""ModelService through the real daemon (gRPC over a socket, sim backend) on SQLite and PostgreSQL: who may read,
create, replace and delete a stored model, the errors (NOT_FOUND, ALREADY_EXISTS, INVALID_ARGUMENT naming the
field, nothing written), and the audit of its changes."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import grpc
import pytest

from peloton.api.v1 import audit_pb2, audit_pb2_grpc, model_pb2, model_pb2_grpc
from peloton.domain.resources import Resources
from peloton.hostmgr.sim.backend import SimSettings
from peloton.security.identity import add_token
from tests.api.test_permissions import Cluster, running

ROLES = ("admin", "operator", "submitter", "viewer")
T = 15.0
DOC = json.dumps({"kind": "peloton.model/v1", "description": {"parameters": 110_000_000, "flops_per_sample": 2.5e11,
                                                              "sync": "allreduce-ring"}})


@pytest.fixture(params=["sqlite", "postgresql"], scope="module")
def cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("models")
    principals = tmp / "principals.json"
    tokens = {role: add_token(principals, role, [role]) for role in ROLES}
    tokens["bob"] = add_token(principals, "bob", ["submitter"])
    yield from running(request.param, tmp, principals, tokens,
                       sim=SimSettings(hosts=1, resources=Resources(cpu=4, mem=4096), racks=1))


class Models:
    def __init__(self, cluster: Cluster) -> None:
        self.stub = model_pb2_grpc.ModelServiceStub(cluster.channel)
        self.cluster = cluster

    def create(self, who: str, name: str, doc: str = DOC, replace: bool = False) -> model_pb2.CreateModelResponse:
        return self.stub.CreateModel(model_pb2.CreateModelRequest(name=name, document_json=doc, replace=replace),
                                     timeout=T, metadata=self.cluster.md(who))

    def get(self, who: str, name: str) -> model_pb2.Model:
        return self.stub.GetModel(model_pb2.GetModelRequest(name=name), timeout=T, metadata=self.cluster.md(who)).model

    def names(self, who: str) -> list[str]:
        r = self.stub.ListModels(model_pb2.ListModelsRequest(), timeout=T, metadata=self.cluster.md(who))
        return [m.name for m in r.models]

    def delete(self, who: str, name: str) -> None:
        self.stub.DeleteModel(model_pb2.DeleteModelRequest(name=name), timeout=T, metadata=self.cluster.md(who))


def code(fn: object, *args: object) -> tuple[grpc.StatusCode, str]:
    try:
        fn(*args)  # type: ignore[operator]
    except grpc.RpcError as e:
        return e.code(), e.details()
    return grpc.StatusCode.OK, ""


def test_every_role_reads_submitters_create_and_owners_or_admins_replace_and_delete(cluster: Cluster) -> None:
    m = Models(cluster)
    r = m.create("submitter", "perm-bert")
    assert not r.replaced and (r.model.name, r.model.owner, r.model.version) == ("perm-bert", "submitter", 1)
    assert r.model.created_at > 0 and r.model.updated_at == r.model.created_at
    assert json.loads(r.model.document_json)["description"]["parameters"] == 110_000_000
    for role in (*ROLES, "bob"):  # reading is everyone's
        assert m.get(role, "perm-bert").version == 1
        assert "perm-bert" in m.names(role)
    # a viewer creates nothing and deletes nothing
    assert code(m.create, "viewer", "perm-viewer")[0] == grpc.StatusCode.PERMISSION_DENIED
    assert code(m.delete, "viewer", "perm-bert")[0] == grpc.StatusCode.PERMISSION_DENIED
    # another submitter (or an operator) may neither replace nor delete it
    for who in ("bob", "operator"):
        c, why = code(m.create, who, "perm-bert", DOC, True)
        assert c == grpc.StatusCode.PERMISSION_DENIED and why.startswith(f"name: {who} may not replace"), why
        c, why = code(m.delete, who, "perm-bert")
        assert c == grpc.StatusCode.PERMISSION_DENIED and why.startswith(f"name: {who} may not delete"), why
    assert m.get("admin", "perm-bert").version == 1
    # its owner replaces it (the version goes up), then an admin does, then the admin deletes it
    r = m.create("submitter", "perm-bert", DOC, True)
    assert r.replaced and r.model.version == 2 and r.model.owner == "submitter"
    r = m.create("admin", "perm-bert", DOC, True)
    assert r.replaced and r.model.version == 3 and r.model.owner == "submitter"
    m.delete("admin", "perm-bert")
    assert code(m.get, "viewer", "perm-bert")[0] == grpc.StatusCode.NOT_FOUND
    # and a submitter deletes its own
    m.create("bob", "perm-bobs")
    m.delete("bob", "perm-bobs")
    assert "perm-bobs" not in m.names("admin")


def test_errors_name_what_is_wrong_and_write_nothing(cluster: Cluster) -> None:
    m = Models(cluster)
    m.create("bob", "err-model")
    before = m.names("admin")
    c, why = code(m.create, "bob", "err-model")
    assert c == grpc.StatusCode.ALREADY_EXISTS and why.startswith("name: model 'err-model' already exists"), why
    c, why = code(m.get, "bob", "err-none")
    assert c == grpc.StatusCode.NOT_FOUND and why == "name: no model 'err-none'"
    assert code(m.delete, "bob", "err-none")[0] == grpc.StatusCode.NOT_FOUND
    bad = [("bad name", DOC, "name"), ("err-x", "{", "document_json"),
           ("err-x", json.dumps({"kind": "peloton.model/v1", "description": {"parameters": "many"}}),
            "model.description.parameters"),
           ("err-model", json.dumps({"kind": "peloton.model/v2"}), "model.kind"),
           ("err-\x00", DOC, "name"), ("err-x", " " * (2 << 20), "document_json"),  # 2 MiB: over a document's 1
           ("err-x", "\x00", "document_json")]
    for name, doc, field in bad:
        for replace in (False, True):
            c, why = code(m.create, "bob", name, doc, replace)
            assert c == grpc.StatusCode.INVALID_ARGUMENT and why.startswith(field + ": "), (name, why)
    c, why = code(m.stub.ListModels, model_pb2.ListModelsRequest(page_token="???"), T, cluster.md("bob"))
    assert c == grpc.StatusCode.INVALID_ARGUMENT and why.startswith("page_token:")
    assert m.names("admin") == before and m.get("bob", "err-model").version == 1


@pytest.mark.parametrize("bound", ["since", "until"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1.0])
def test_the_audit_log_bounds_must_be_finite_seconds(cluster: Cluster, bound: str, value: float) -> None:
    # an infinite bound passed (only NaN and negatives were refused), where every other number of the API must be
    # finite (docs/job-spec.md)
    audit = audit_pb2_grpc.AuditServiceStub(cluster.channel)
    request = audit_pb2.ListAuditEventsRequest()
    setattr(request, bound, value)
    c, why = code(audit.ListAuditEvents, request, T, cluster.md("admin"))
    assert (c, why) == (grpc.StatusCode.INVALID_ARGUMENT, f"{bound}: seconds since the epoch, not {value}")


def test_changes_of_models_are_audited_under_their_name(cluster: Cluster) -> None:
    m = Models(cluster)
    m.create("bob", "audit-model")
    assert code(m.delete, "submitter", "audit-model")[0] == grpc.StatusCode.PERMISSION_DENIED
    m.delete("bob", "audit-model")
    audit = audit_pb2_grpc.AuditServiceStub(cluster.channel)
    seen: list[tuple[str, str, bool, str]] = []
    deadline = time.monotonic() + 10
    while len(seen) < 3 and time.monotonic() < deadline:  # (records are written in the background)
        events = audit.ListAuditEvents(audit_pb2.ListAuditEventsRequest(object="audit-model"), timeout=T,
                                       metadata=cluster.md("admin")).events
        seen = [(e.principal, e.method, e.allowed, e.code) for e in reversed(events)]
        time.sleep(0.2)
    assert seen == [("bob", "ModelService/CreateModel", True, "OK"),
                    ("submitter", "ModelService/DeleteModel", False, "PERMISSION_DENIED"),
                    ("bob", "ModelService/DeleteModel", True, "OK")]
    # what a caller names goes into the audit as the store can keep it (a NUL, on PostgreSQL, would stop the log)
    assert code(m.create, "bob", "a\x00b")[0] == grpc.StatusCode.INVALID_ARGUMENT
    assert code(m.delete, "viewer", "x" * 1000)[0] == grpc.StatusCode.PERMISSION_DENIED
    events = audit.ListAuditEvents(audit_pb2.ListAuditEventsRequest(object="a\\x00b"), timeout=T,
                                   metadata=cluster.md("admin")).events
    assert [(e.principal, e.code) for e in events] == [("bob", "INVALID_ARGUMENT")]
    events = audit.ListAuditEvents(audit_pb2.ListAuditEventsRequest(principal="viewer", denied_only=True), timeout=T,
                                   metadata=cluster.md("admin")).events
    assert events[0].object == "x" * 509 + "..." and events[0].method == "ModelService/DeleteModel"
