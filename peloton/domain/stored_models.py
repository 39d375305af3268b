"""Stored models, pure: the rules for their names and documents. The document's schema is
peloton/modelaware/document.py's; this module checks a document sent as JSON text against it and gives the
canonical text the store keeps (what the daemon read, with its defaults), so that every reader of a stored model
sees the same document whatever form it was sent in."""

from __future__ import annotations

import dataclasses
import json
import re

from peloton.domain import checks
from peloton.modelaware.document import ModelDocument, document_to_dict, parse_document

MAX_NAME_CHARS = 128
MAX_DOCUMENT_BYTES = 1024 * 1024  # as a job spec; a page of ListModels stops at 2 MiB of documents
# fullmatch. Letters, digits, `_`, `.`, `-`; not first `.` (hidden, `..`) or `-` (read as a flag on a command line).
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
DOCUMENT_FIELD = "model"  # the document's fields are named model.description.parameters, ...


def check_name(name: str, field: str = "name") -> str:
    if not name:
        raise checks.bad(field, "must not be empty")
    if not _NAME.fullmatch(name):
        raise checks.bad(field, f"expected 1 to {MAX_NAME_CHARS} letters, digits, '_', '.' or '-', not starting with "
                                f"'.' or '-', got {checks.show(name)}")
    return name


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number JSON allows")


def read_document(text: str, name: str, field: str = "document_json") -> ModelDocument:
    """The document of model `name` from its JSON text: InvalidArgument naming `field` for text that is not a JSON
    object within the size limit, or the document's field at fault (`model.description.parameters`). The document's
    own `name`, if any, gives way to the model's."""
    size = checks.text(text, field)
    if size > MAX_DOCUMENT_BYTES:
        raise checks.bad(field, f"{size} bytes, more than the {MAX_DOCUMENT_BYTES} a model document may have")
    if not text.strip():
        raise checks.bad(field, "must not be empty: a model document, "
                                '{"kind": "peloton.model/v1", "description": {...}} (docs/model-aware.md)')
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as e:
        raise checks.bad(field, f"not valid JSON: {str(e)[:200]}") from None
    doc = parse_document(value, DOCUMENT_FIELD)
    return dataclasses.replace(doc, name=name)


def canonical(doc: ModelDocument) -> str:
    """The text the store keeps: compact JSON, keys sorted."""
    return json.dumps(document_to_dict(doc), sort_keys=True, separators=(",", ":"))


def document_text(text: str, name: str, field: str = "document_json") -> str:
    """read_document, then canonical."""
    return canonical(read_document(text, name, field))

