"""Checks of the request fields of the public RPCs (ids, instance numbers, filters, page size, spec size), so that
the servicers hand the managers and the store only what the limits allow (peloton/domain/limits.py): the same
answer on SQLite and PostgreSQL, and INVALID_ARGUMENT naming the field rather than a store error."""

from __future__ import annotations

import json
import math
import operator
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
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


# --- numbers that are not finite (the internal services: requests of peers holding the components' secret) ---------
MAX_NON_FINITE_SHOWN = 10
_FLOATS = (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT)
JSON_SUFFIX = "_json"  # a string field of JSON text (goal_json, plan_json): its numbers are checked as the others


class _Plan:
    """Where a message type can hold a number: its float and double fields (`floats`: name, repeated or a map's
    values), its JSON text fields, and its fields of message types that can (`nested`: name, repeated, map, the
    type), which `_non_finite` walks to say where one is not finite. `ok` answers first, and fast: a message's
    numbers are read together, those of the messages it holds one at a time (`single`: the names, dotted) with
    its own, and a repeated field of such messages in one pass."""

    __slots__ = ("fast", "floats", "get", "json", "many", "nested", "pure", "single")

    def __init__(self) -> None:
        self.floats: list[tuple[str, bool]] = []
        self.json: list[str] = []
        self.nested: list[tuple[str, bool, bool, Any]] = []  # Any: a Descriptor (upb's or Python's)
        self.single: list[str] = []  # non-repeated floats, its own and those of its messages (`resources.cpu`)
        self.get: Callable[[Message], Any] = lambda m: ()  # their values, a tuple
        self.many: list[str] = []  # repeated floats and maps of them
        self.fast: list[tuple[str, bool, bool, Any]] = []  # `nested` but for those read into `single`
        self.pure = False  # only `single`: a message's numbers are get(message)

    def ok(self, message: Message) -> bool:
        """True when every number of `message` is finite. (False may be wrong, for finite numbers whose sum
        overflows: the caller then looks at each with _non_finite.)"""
        if self.single and not _finite_sum(self.get(message)):
            return False
        for name in self.many:
            values = getattr(message, name)
            if not _finite_sum(values.values() if hasattr(values, "values") else values):
                return False
        for name in self.json:
            text = getattr(message, name)
            if text and _json_problem(text):
                return False
        for name, repeated, is_map, desc in self.fast:
            plan = _plan(desc)
            if not repeated:
                if not plan.ok(getattr(message, name)):
                    return False
                continue
            field = getattr(message, name)
            items = field.values() if is_map else field
            if plan.pure:  # every member's resources of a gang, in one pass
                if not _finite_sum(map(sum, map(plan.get, items))):
                    return False
            elif not all(map(plan.ok, items)):
                return False
        return True


def _finite_sum(values: Iterable[float]) -> bool:
    total = sum(values)
    return total - total == 0.0  # NaN for a NaN or an infinity among them (or finite ones that overflow)


_PLANS: dict[Any, _Plan] = {}  # by Descriptor
_BUILDING: set[Any] = set()  # the plans being made: a type that holds itself is not read into itself
_PLANS_LOCK = threading.RLock()


def _plan(desc: Any) -> _Plan:
    """The plan of `desc`, made once per message type. Fields of types that hold no number (the constraints of a
    gang, a launch's environment) are not in it: a check never walks them."""
    plan = _PLANS.get(desc)
    if plan is not None:
        return plan
    with _PLANS_LOCK:
        plan = _PLANS.get(desc)
        if plan is None:
            _BUILDING.add(desc)
            try:
                plan = _PLANS[desc] = _make_plan(desc)
            finally:
                _BUILDING.discard(desc)
        return plan


def _make_plan(desc: Any) -> _Plan:
    plan = _Plan()
    for fd in desc.fields:
        mt = fd.message_type
        if mt is None:
            if fd.type in _FLOATS:
                plan.floats.append((fd.name, fd.is_repeated))
                (plan.many if fd.is_repeated else plan.single).append(fd.name)
            elif fd.type == FieldDescriptor.TYPE_STRING and fd.name.endswith(JSON_SUFFIX) and not fd.is_repeated:
                plan.json.append(fd.name)
        elif mt.GetOptions().map_entry:
            value = mt.fields_by_name["value"]
            if value.type in _FLOATS:
                plan.floats.append((fd.name, True))
                plan.many.append(fd.name)
            elif value.message_type is not None and _holds_numbers(value.message_type, set()):
                plan.nested.append((fd.name, True, True, value.message_type))
                plan.fast.append(plan.nested[-1])
        elif _holds_numbers(mt, set()):
            plan.nested.append((fd.name, fd.is_repeated, False, mt))
            child = None if fd.is_repeated or mt in _BUILDING else _plan(mt)
            if child is not None and child.pure:  # a message of numbers only (resources): read with this one's
                plan.single += [f"{fd.name}.{name}" for name in child.single]
            else:
                plan.fast.append(plan.nested[-1])
    if plan.single:
        get = operator.attrgetter(*plan.single)
        plan.get = get if len(plan.single) > 1 else lambda m: (get(m),)
    plan.pure = bool(plan.single) and not (plan.many or plan.json or plan.fast)
    return plan


def _holds_numbers(desc: Any, seen: set[str]) -> bool:
    """Whether a message of type `desc` can hold a float, a double or JSON text, at any depth."""
    if desc.full_name in seen:  # a type that contains itself: what it holds is found where it was first met
        return False
    seen.add(desc.full_name)
    for fd in desc.fields:
        field, mt = fd, fd.message_type
        if mt is not None and mt.GetOptions().map_entry:
            field = mt.fields_by_name["value"]
            mt = field.message_type
        if mt is None:
            if field.type in _FLOATS or (field.type == FieldDescriptor.TYPE_STRING and field.name.endswith(JSON_SUFFIX)):
                return True
        elif _holds_numbers(mt, seen):
            return True
    return False


class _NotFinite(ValueError):
    pass


def _refuse(text: str) -> float:
    raise _NotFinite(text)


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999: JSON's grammar allows it; as a double it is infinite
        raise _NotFinite(text)
    return value


def _json_problem(text: str) -> str:
    """Why JSON text is not what a peer may send: it is not JSON, or holds a number that is not finite (NaN,
    Infinity, 1e999: Python's json reads them all); "" when it is neither."""
    try:
        json.loads(text, parse_constant=_refuse, parse_float=_finite)
    except _NotFinite as e:
        return f"must be JSON with finite numbers, got {str(e)[:40]}"
    except RecursionError:
        return "not valid JSON (nested too deeply)"
    except ValueError as e:
        return f"not valid JSON ({str(e)[:200]})"
    return ""


def non_finite(message: Message, path: str = "request") -> list[str]:
    """Every float or double of `message` that is NaN or infinite, through every nested message (repeated, map
    values), and every JSON text field (`*_json`) that is not JSON or holds such a number, each as `PATH: why`
    (the first MAX_NON_FINITE_SHOWN). NaN compares false with everything: one in a gang's resources made its
    pool's allocation NaN, and every share and admission computed from it."""
    if _plan(message.DESCRIPTOR).ok(message):
        return []
    out: list[str] = []
    _non_finite(message, "" if path == "request" else path, out)
    return out[:MAX_NON_FINITE_SHOWN]


def _non_finite(message: Message, path: str, out: list[str]) -> None:
    plan = _plan(message.DESCRIPTOR)
    prefix = f"{path}." if path else ""
    for name, repeated in plan.floats:
        value = getattr(message, name)
        if not repeated:
            if not math.isfinite(value):
                out.append(f"{prefix}{name}: must be a finite number, got {value}")
        elif hasattr(value, "items"):  # a map<K, double>
            out += [f"{prefix}{name}[{k!r}]: must be a finite number, got {v}" for k, v in value.items()
                    if not math.isfinite(v)]
        else:
            out += [f"{prefix}{name}[{i}]: must be a finite number, got {v}" for i, v in enumerate(value)
                    if not math.isfinite(v)]
    for name in plan.json:
        text = getattr(message, name)
        if text and (problem := _json_problem(text)):
            out.append(f"{prefix}{name}: {problem}")
    for name, repeated, is_map, _desc in plan.nested:
        if len(out) >= MAX_NON_FINITE_SHOWN:
            return
        if not repeated:
            if message.HasField(name):
                _non_finite(getattr(message, name), f"{prefix}{name}", out)
        elif is_map:
            for key, value in getattr(message, name).items():
                _non_finite(value, f"{prefix}{name}[{key!r}]", out)
        else:
            for i, item in enumerate(getattr(message, name)):
                _non_finite(item, f"{prefix}{name}[{i}]", out)
