"""Checks of the request fields of the public RPCs (ids, instance numbers, filters, page size, spec size), so that
the servicers hand the managers and the store only what the limits allow (peloton/domain/limits.py): the same
answer on SQLite and PostgreSQL, and INVALID_ARGUMENT naming the field rather than a store error."""

from __future__ import annotations

from collections.abc import Sequence

from google.protobuf.message import Message
from google.protobuf.unknown_fields import UnknownFieldSet

from peloton.api.v1 import job_pb2
from peloton.domain import checks, limits
from peloton.domain.spec import validate_pool_path
from peloton.domain.states import JobState

_JOB_STATES = {s.value for s in JobState}


def job_id(value: str, field: str = "job_id") -> str:
    if not value:
        raise checks.bad(field, "must not be empty")
    checks.text(value, field, max_chars=limits.MAX_JOB_ID_CHARS)
    return value


def request_id(value: str, field: str = "request_id") -> str:
    """A caller's idempotency key: optional, printable, at most 128 characters (the column's length)."""
    checks.text(value, field, max_chars=limits.MAX_REQUEST_ID_CHARS)
    if value and not value.isprintable():
        raise checks.bad(field, "must be printable text (for example a UUID)")
    return value


def instance(value: int, field: str = "instance") -> int:
    checks.integer(value, field, minimum=0, maximum=limits.INT32_MAX)
    return value


def attempt(value: int, field: str = "attempt") -> int:
    """0: the current attempt."""
    checks.integer(value, field, minimum=0, maximum=limits.INT32_MAX)
    return value


def pool_path(value: str, field: str = "path") -> str:
    validate_pool_path(value, field)
    return value


def spec_size(spec: job_pb2.JobSpec, field: str = "spec") -> None:
    size = spec.ByteSize()
    if size > limits.MAX_SPEC_BYTES:
        raise checks.bad(field, f"{size} bytes serialized, more than the {limits.MAX_SPEC_BYTES} a job spec may have")


def list_jobs(states: Sequence[str], owner: str, respool: str, name_contains: str, limit: int,
              id_prefix: str = "") -> None:
    """The filters and page size of ListJobs ("" and 0 mean no filter and the default page)."""
    if len(states) > limits.MAX_STATE_FILTERS:
        raise checks.bad("states", f"at most {limits.MAX_STATE_FILTERS} states, got {len(states)}")
    for i, st in enumerate(states):
        if st.upper() not in _JOB_STATES:
            raise checks.bad(f"states[{i}]", f"unknown job state {checks.show(st)} "
                                             f"(known: {', '.join(s.value for s in JobState)})")
    checks.text(owner, "owner", max_chars=limits.MAX_OWNER_CHARS)
    if respool:
        validate_pool_path(respool, "respool")
    checks.text(name_contains, "name_contains", max_chars=limits.MAX_NAME_CONTAINS_CHARS)
    checks.integer(limit, "limit", minimum=0, maximum=limits.MAX_LIST_LIMIT)
    if id_prefix and (len(id_prefix) > limits.DAEMON_JOB_ID_CHARS or any(ch not in "0123456789abcdef" for ch in id_prefix)):
        raise checks.bad("id_prefix", f"at most {limits.DAEMON_JOB_ID_CHARS} lowercase hex digits (the start of a job id), "
                                      f"got {checks.show(id_prefix)}")


def page(page_size: int, page_token: str) -> None:
    """A page request: size 0 (the default) up to the largest page; a token no longer than any this API makes."""
    checks.integer(page_size, "page_size", minimum=0, maximum=limits.MAX_LIST_LIMIT)
    checks.text(page_token, "page_token", max_chars=1024)


def text_field(value: str, field: str, max_chars: int) -> str:
    """Any other short text of a request: no NUL, at most `max_chars`."""
    checks.text(value, field, max_chars=max_chars)
    return value


MAX_UNKNOWN_SHOWN = 10


def unknown_fields(message: Message, path: str = "request") -> list[str]:
    """What of `message` this daemon's schema does not know, through every nested message (repeated, map values),
    each as `PATH: unknown field N (...)`: protobuf keeps such fields aside when it parses, and the servicers would
    never look at them, so a setting of a newer client (or a crafted field) would be ignored without a word."""
    out: list[str] = []
    unknown = UnknownFieldSet(message)
    numbers = sorted({unknown[i].field_number for i in range(len(unknown))})
    if numbers:
        out.append(f"{path}: unknown field{'s' if len(numbers) > 1 else ''} {', '.join(map(str, numbers))} "
                   f"({message.DESCRIPTOR.full_name} of this daemon's release has no such field)")
    for fd, value in message.ListFields():
        if fd.message_type is None or len(out) >= MAX_UNKNOWN_SHOWN:
            continue
        name = f"{fd.name}" if path == "request" else f"{path}.{fd.name}"
        if fd.message_type.GetOptions().map_entry:
            if fd.message_type.fields_by_name["value"].message_type is not None:
                for key in value:
                    out += unknown_fields(value[key], f"{name}[{key!r}]")
        elif fd.is_repeated:
            for i, item in enumerate(value):
                out += unknown_fields(item, f"{name}[{i}]")
        else:
            out += unknown_fields(value, name)
    return out[:MAX_UNKNOWN_SHOWN]
