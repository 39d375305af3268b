"""Stored models: ModelService (`peloton model create|get|list|delete`) and the book of models in the store it
serves from. Thin: the rules for names and documents are domain/stored_models.py's, the document's schema
peloton/modelaware/document.py's.

Who may do what: reading needs job.read (every role), creating job.create (identity.METHODS); replacing or
deleting a model is its owner's or an admin's."""

from __future__ import annotations

import base64
import binascii
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from sqlalchemy.orm import Session, sessionmaker

from peloton.api import caller, convert, request_checks
from peloton.api.status import grpc_errors
from peloton.api.v1 import model_pb2, model_pb2_grpc
from peloton.domain import checks, principal
from peloton.domain.model import StoredModel
from peloton.domain.stored_models import check_name, document_text
from peloton.errors import Conflict, InvalidArgument, NotFound, PermissionDenied
from peloton.store import repo
from peloton.store.db import transaction

if TYPE_CHECKING:
    import grpc

DEFAULT_PAGE = 100
MAX_PAGE = 1000
MAX_PAGE_BYTES = 2 * 1024 * 1024  # a page of documents (each at most 1 MiB) stays well under a response's 4 MiB


def may_change(who: principal.Principal, owner: str) -> bool:
    """A model is replaced or deleted by its owner or an admin."""
    return who.name == owner or "admin" in who.roles


class ModelBook:
    """The stored models: every check before anything is written, then one transaction."""

    def __init__(self, sessions: sessionmaker[Session], read_sessions: sessionmaker[Session],
                 clock: Callable[[], float] = time.time) -> None:
        self.sessions = sessions
        self.read_sessions = read_sessions
        self.clock = clock

    def create(self, name: str, document_json: str, who: principal.Principal, replace: bool = False,
               if_version: int = 0) -> tuple[StoredModel, bool]:
        """The model as stored, and whether an existing one was replaced. AlreadyExists for a name taken (without
        `replace`); PermissionDenied to replace another's model (unless an admin); InvalidArgument naming the field
        (`name`, `document_json`, `model.description.parameters`): nothing written."""
        check_name(name)
        document = document_text(document_json, name)
        now = self.clock()
        with transaction(self.sessions) as s:
            if replace:
                try:
                    old = repo.get_model(s, name)
                except NotFound:
                    old = None
                if old is None and if_version:
                    raise NotFound(f"name: no model {name!r} to replace (it was deleted)", field="name")
                if old is not None:
                    if if_version and old.version != if_version:
                        raise Conflict(f"name: model {name!r} is at version {old.version}, not {if_version}: it "
                                       "changed since it was read; try again", field="name")
                    if not may_change(who, old.owner):
                        raise PermissionDenied(f"name: {who.name} may not replace model {name!r} of {old.owner} "
                                               "(only its owner or an admin may)", field="name")
                    return repo.replace_model(s, name, document, now, old.version), True
            model = StoredModel(name=name, owner=who.name, document=document, version=1, created_at=now,
                                updated_at=now)
            repo.create_model(s, model)
        return model, False

    def get(self, name: str) -> StoredModel:
        check_name(name)
        with transaction(self.read_sessions) as s:
            return repo.get_model(s, name)

    def list(self, page_size: int = 0, page_token: str = "") -> tuple[list[StoredModel], str]:
        """A page by name, and the token of the next ("" after the last)."""
        checks.integer(page_size, "page_size", minimum=0, maximum=MAX_PAGE)
        size = page_size or DEFAULT_PAGE
        after = _untoken(page_token) if page_token else None
        with transaction(self.read_sessions) as s:
            models = repo.list_models(s, after=after, limit=size + 1)
        more = len(models) > size
        models = models[:size]
        total = 0
        for i, m in enumerate(models):  # a page of big documents ends early (at least one model a page)
            total += len(m.document)
            if total > MAX_PAGE_BYTES and i > 0:
                models, more = models[:i], True
                break
        return models, (_token(models[-1].name) if more and models else "")

    def delete(self, name: str, who: principal.Principal) -> None:
        check_name(name)
        with transaction(self.sessions) as s:
            model = repo.get_model(s, name)
            if not may_change(who, model.owner):
                raise PermissionDenied(f"name: {who.name} may not delete model {name!r} of {model.owner} (only its "
                                       "owner or an admin may)", field="name")
            repo.delete_model(s, name)


def _token(name: str) -> str:
    return base64.urlsafe_b64encode(name.encode()).decode()


def _untoken(token: str) -> str:
    request_checks.text_field(token, "page_token", max_chars=1024)
    try:
        name = base64.urlsafe_b64decode(token.encode()).decode()
        return check_name(name)
    except (ValueError, binascii.Error, UnicodeError, InvalidArgument):
        raise InvalidArgument("page_token: not a page token of this API", field="page_token") from None


class ModelServicer(model_pb2_grpc.ModelServiceServicer):
    def __init__(self, book: ModelBook) -> None:
        self.book = book

    @grpc_errors
    def CreateModel(self, request: model_pb2.CreateModelRequest, context: grpc.ServicerContext
                    ) -> model_pb2.CreateModelResponse:
        model, replaced = self.book.create(request.name, request.document_json, caller.current(), request.replace,
                                            request.if_version)
        return model_pb2.CreateModelResponse(model=convert.stored_model_to_proto(model), replaced=replaced)

    @grpc_errors
    def GetModel(self, request: model_pb2.GetModelRequest, context: grpc.ServicerContext
                 ) -> model_pb2.GetModelResponse:
        return model_pb2.GetModelResponse(model=convert.stored_model_to_proto(self.book.get(request.name)))

    @grpc_errors
    def ListModels(self, request: model_pb2.ListModelsRequest, context: grpc.ServicerContext
                   ) -> model_pb2.ListModelsResponse:
        models, token = self.book.list(request.page_size, request.page_token)
        return model_pb2.ListModelsResponse(models=[convert.stored_model_to_proto(m) for m in models],
                                            next_page_token=token)

    @grpc_errors
    def DeleteModel(self, request: model_pb2.DeleteModelRequest, context: grpc.ServicerContext
                    ) -> model_pb2.DeleteModelResponse:
        self.book.delete(request.name, caller.current())
        return model_pb2.DeleteModelResponse()
