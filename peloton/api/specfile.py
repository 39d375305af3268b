"""Reading a job spec file: YAML whose structure is the JSON form of peloton.v1.JobSpec."""

from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import Any, cast

import yaml
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from peloton.api.v1 import job_pb2
from peloton.domain import checks, limits
from peloton.domain.durations import EXAMPLES as DURATION_EXAMPLES
from peloton.domain.durations import parse_duration_ns
from peloton.errors import InvalidArgument

_DURATION = "google.protobuf.Duration"
_NULL_TAGS = ("tag:yaml.org,2002:null", "tag:yaml.org,2002:merge")


class _TextLoader(yaml.SafeLoader):
    """YAML where every plain scalar stays the text it was written as (only `null`, `~` and nothing are null): each
    field then reads its own type from that text. YAML 1.1's implicit typing would make a job named `on` the
    boolean true, `0x10` in task.env the number 16 and `2024-01-01` a date, and report a wrong type in the
    protobuf library's words; here `name: on` is the name "on" and `instances: four` says what a field expects."""


_TextLoader.yaml_implicit_resolvers = {
    first: kept
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    if (kept := [(tag, rx) for tag, rx in resolvers if tag in _NULL_TAGS])
}

# The same reading by libyaml when PyYAML was built with it: a 4 MiB spec of 60,000 env entries is read in 0.6 s of
# CPU against 4.1 s. A text libyaml refuses is read again by _TextLoader, whose messages the errors quote (libyaml
# counts positions in bytes and words its problems differently).
_FastTextLoader: type[yaml.SafeLoader] | None = None
if yaml.__with_libyaml__:
    class _CTextLoader(yaml.CSafeLoader):
        """_TextLoader's resolvers over libyaml's parser."""

    _CTextLoader.yaml_implicit_resolvers = _TextLoader.yaml_implicit_resolvers
    _FastTextLoader = cast("type[yaml.SafeLoader]", _CTextLoader)


def _load(text: str) -> Any:
    if _FastTextLoader is not None:
        try:
            return yaml.load(text, Loader=_FastTextLoader)  # noqa: S506 - a SafeLoader with fewer implicit types
        except Exception:  # noqa: BLE001 - any refusal is reported as the pure loader words it, below
            pass
    return yaml.load(text, Loader=_TextLoader)  # noqa: S506 - a SafeLoader with fewer implicit types


# Fields a spec must give (what the validator's defaults cannot stand for), with what each is for.
_REQUIRED = {
    "name": "the job's name",
    "instances": "how many members, 1 to 100000",
    "task.command": "what each member runs, with /bin/sh -c",
    "task.resources.cpu": "cores per member, e.g. 1 or 0.5",
}
# ... and those each role of a spec with roles must give, under `roles[i].`, instead of instances and task.
_REQUIRED_IN_ROLE = {
    "name": "the role's name, e.g. worker",
    "instances": "how many members play this role, at least 1",
    "task.command": "what each member of this role runs, with /bin/sh -c",
    "task.resources.cpu": "cores per member of this role, e.g. 1 or 0.5",
}
_WHOLE = re.compile(r"[-+]?[0-9]+")
_DECIMAL = re.compile(r"[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")
_BOOLEANS = {"true": True, "false": False, "yes": True, "no": False, "on": True, "off": False}
_INT_RANGE = {FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1), FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1)}
_MAX_NUMBER_TEXT = 40  # more digits than any int64 or sensible double: refused before int()/float() see them


def _kind(v: Any) -> str:
    """What a wrong value is, for a message: a short excerpt of a scalar, the kind of anything else."""
    if isinstance(v, dict):
        return "a mapping"
    if isinstance(v, (list, tuple)):
        return "a list"
    if isinstance(v, (set, frozenset)):
        return "a set"
    if isinstance(v, bytes):
        return "binary data"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)) and not (isinstance(v, int) and abs(v) > 10**_MAX_NUMBER_TEXT):
        return str(v)
    if isinstance(v, str):
        return checks.show(v)
    return f"a {type(v).__name__}"  # a date or time from an explicit !!timestamp


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _repeated(fd: FieldDescriptor) -> bool:
    rep = getattr(fd, "is_repeated", None)  # protobuf >= 5.28; `label` before (removed in 7)
    return bool(rep) if rep is not None else getattr(fd, "label", 0) == FieldDescriptor.LABEL_REPEATED


def _fill(msg: Message, doc: Any, path: str, present: set[str]) -> None:
    """Set the fields of `msg` from the mapping `doc`, each read as its type; `present` gets every field path given
    (not null). InvalidArgument naming the field at fault."""
    if not isinstance(doc, dict):
        raise checks.bad(path, f"expected a mapping of fields (name: value), got {_kind(doc)}")
    desc = msg.DESCRIPTOR
    by_json = {f.json_name: f for f in desc.fields}
    given: dict[str, str] = {}
    for key, value in doc.items():
        name = key if isinstance(key, str) else _number_text(key, path or "spec") if isinstance(key, int) else str(key)
        _utf8(name, _join(path, checks.key(name)))
        fd = cast("FieldDescriptor | None", desc.fields_by_name.get(name) or by_json.get(name))
        if fd is None:
            known = ", ".join(f.name for f in desc.fields)
            raise checks.bad(_join(path, checks.key(name)), f"unknown field (known here: {known})")
        field = _join(path, fd.name)
        if fd.name in given:
            raise checks.bad(field, f"given twice (as {given[fd.name]} and {checks.key(name)})")
        given[fd.name] = checks.key(name)
        if value is None:
            continue  # null or nothing: the field is absent, as in protobuf's JSON form
        present.add(field)
        _set(msg, fd, value, field, present)


def _set(msg: Message, fd: FieldDescriptor, value: Any, field: str, present: set[str]) -> None:
    mt = fd.message_type
    if mt is not None and mt.GetOptions().map_entry:
        if not isinstance(value, dict):
            raise checks.bad(field, f"expected a mapping of NAME: value, got {_kind(value)}")
        target = getattr(msg, fd.name)
        for k, v in value.items():
            if k is None:  # `NULL: 1`: YAML's null, whose text is gone (str() of it would name the variable None)
                raise checks.bad(field, "a name YAML reads as null (null, Null, NULL, ~ or nothing): quote it, e.g. "
                                        '"NULL": value')
            name = _env_name(k, field)
            where = f"{field}.{checks.key(name)}"
            _utf8(name, where)
            target[name] = _utf8(_env_value(v, where) if fd.name == "env" else _map_text(v, where), where)
        return
    if _repeated(fd):
        if not isinstance(value, list):
            raise checks.bad(field, f"expected a list, got {_kind(value)}")
        items = getattr(msg, fd.name)
        for i, item in enumerate(value):
            where = f"{field}[{i}]"
            if item is None:
                raise checks.bad(where, "expected a value, got nothing (null)")
            if mt is not None:
                _fill(items.add(), item, where, present)
            else:
                items.append(_scalar(fd, item, where))
        return
    if mt is not None:
        sub = getattr(msg, fd.name)
        sub.SetInParent()
        if mt.full_name == _DURATION:
            sub.FromNanoseconds(_duration_ns(value, field))
        else:
            _fill(sub, value, field, present)
        return
    setattr(msg, fd.name, _scalar(fd, value, field))


def _scalar(fd: FieldDescriptor, v: Any, field: str) -> Any:
    t = fd.type
    if t == FieldDescriptor.TYPE_STRING:
        if not isinstance(v, str):
            raise checks.bad(field, f"expected text, got {_kind(v)}")
        return _utf8(v, field)
    if t == FieldDescriptor.TYPE_BOOL:
        b = _BOOLEANS.get(v.strip().lower()) if isinstance(v, str) else v if isinstance(v, bool) else None
        if b is None:
            raise checks.bad(field, f"expected true or false, got {_kind(v)}")
        return b
    if t in _INT_RANGE:
        if isinstance(v, str) and len(v) <= _MAX_NUMBER_TEXT and _WHOLE.fullmatch(v.strip()):
            n = int(v)
        elif isinstance(v, int) and not isinstance(v, bool):
            n = v
        else:
            raise checks.bad(field, f"expected a whole number, got {_kind(v)}")
        lo, hi = _INT_RANGE[t]
        if not lo <= n <= hi:
            raise checks.bad(field, f"out of range: at most {hi}" if n > hi else f"out of range: at least {lo}")
        return n
    if t in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        if isinstance(v, str) and len(v) <= _MAX_NUMBER_TEXT and _DECIMAL.fullmatch(v.strip()):
            return float(v)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return _float(v, field)
        raise checks.bad(field, f"expected a number, got {_kind(v)}")
    raise checks.bad(field, f"cannot be read from a spec file, got {_kind(v)}")  # no such field in JobSpec today


def _float(v: int | float, field: str) -> float:
    try:
        return float(v)
    except OverflowError:  # an explicit !!int too large for a double
        raise checks.bad(field, "number too large") from None


_MAX_DURATION_NS = limits.PROTO_DURATION_MAX_SECONDS * 1_000_000_000 + limits.PROTO_DURATION_MAX_NANOS


def _duration_ns(v: Any, field: str) -> int:
    """`90s`, `5m`, `1h30m`, `2d`, or a number of seconds, as nanoseconds within a protobuf Duration."""
    if isinstance(v, str):
        ns = parse_duration_ns(v, field, signed=True)
    elif isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
        ns = round(Fraction(v) * 1_000_000_000)  # an explicit !!int or !!float: seconds
    else:
        raise checks.bad(field, f"expected a duration like {DURATION_EXAMPLES}, got {_kind(v)}")
    if abs(ns) > _MAX_DURATION_NS:
        raise checks.bad(field, f"out of range: at most {limits.PROTO_DURATION_MAX_SECONDS} seconds")
    return ns


def _utf8(v: str, field: str) -> str:
    """`v`, which protobuf can hold: YAML's escapes can write a lone surrogate ("\\ud800"), which no UTF-8 text
    holds and protobuf refuses with a UnicodeEncodeError (a map key or field name: a SystemError)."""
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:
        raise checks.bad(field, "is not valid UTF-8 text (lone surrogate)") from None
    return v


def _number_text(v: int | float, field: str) -> str:
    try:
        return str(v)
    except ValueError:  # an int of more than 4300 digits (an explicit !!int of any length)
        raise InvalidArgument(f"{field}: number too large", field=field) from None


def _env_name(k: Any, field: str) -> str:
    return _number_text(k, field) if isinstance(k, int) else str(k)


def _map_text(v: Any, field: str) -> str:
    if not isinstance(v, str):
        raise checks.bad(field, f"expected text, got {_kind(v)}")
    return v


def _env_value(v: Any, field: str) -> str:
    # plain scalars arrive as written (`0x10` stays "0x10"); these are what explicit tags and null give
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return ""
    if isinstance(v, (list, dict, set, bytes)):  # str() of nested aliases can grow without bound
        raise InvalidArgument(f"{field}: must be a string, number or boolean, not {type(v).__name__}", field=field)
    if isinstance(v, int):
        return _number_text(v, field)
    return str(v)


def parse_spec(text: str, source: str = "spec", *, partial: bool = False) -> job_pb2.JobSpec:
    """The JobSpec a spec file describes. Raises InvalidArgument, and nothing else, for any text: its message starts
    with `source`, then the field path when one is at fault (`field`; the source for a whole-file error). A field
    of _REQUIRED that is absent (or null) is refused as "required" unless `partial` (a fragment, in tests)."""
    try:
        doc = _load(text)
    except yaml.reader.ReaderError as e:  # a character YAML does not allow (NUL, a control character)
        ch = e.character if isinstance(e.character, int) else ord(e.character)
        raise InvalidArgument(f"{source}: not valid YAML: character #x{ch:04x} at position {e.position + 1}: "
                              f"{_cut(e.reason)}", field=source) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or "syntax error"
        raise InvalidArgument(f"{source}: not valid YAML{where}: {_cut(problem)}", field=source) from None
    except (ValueError, TypeError, OverflowError, RecursionError, AttributeError) as e:
        # PyYAML's constructors raise these on input they do not expect (a bad date, an empty !!timestamp, too deep
        # a nesting): still the file's fault
        raise InvalidArgument(f"{source}: not valid YAML: {_cut(str(e) or type(e).__name__)}", field=source) from None
    if not isinstance(doc, dict):
        raise InvalidArgument(f"{source}: expected a mapping at the top level", field=source)
    spec = job_pb2.JobSpec()
    present: set[str] = set()
    try:
        auto = _take_auto_instances(doc, present)
        _fill(spec, doc, "", present)
        if auto:
            if not spec.HasField("model"):
                raise checks.bad(auto, "auto needs a model to choose it with (model.name, and placement.strategy "
                                       "model-aware)")
            spec.model.auto_instances = True
        required = dict(_REQUIRED)
        if spec.roles:  # `roles: []` is no roles, as in protobuf (a single-task job's `-o json` has it)
            if "task" in present:  # `instances` may be there: the roles' sum (as `job get -o json` writes it)
                raise checks.bad("roles", "give either roles or instances and task, not both")
            required = {f"roles[{i}].{f}": why for i in range(len(spec.roles)) for f, why in _REQUIRED_IN_ROLE.items()}
        missing = [] if partial else [f for f in required if f not in present]
        if missing:
            also = f"; also missing: {', '.join(missing[1:])}" if missing[1:] else ""
            raise checks.bad(missing[0], f"required ({required[missing[0]]}){also}")
    except InvalidArgument as e:
        raise InvalidArgument(f"{source}: {e.message}", field=e.field) from None
    except RecursionError:  # aliases nested deeper than the interpreter's stack, under a field that takes mappings
        raise InvalidArgument(f"{source}: nested too deeply", field=source) from None
    return spec


def _take_auto_instances(doc: dict[Any, Any], present: set[str]) -> str:
    """`instances: auto` (the job's, or a role's): taken out of the document before it is read as protobuf (where
    instances is a number); the field it was in, or "" when none says auto. Only one may."""
    found = []
    if isinstance(doc.get("instances"), str) and doc["instances"].strip() == "auto":
        del doc["instances"]
        found.append("instances")
    roles = doc.get("roles")
    if isinstance(roles, list):
        for i, r in enumerate(roles):
            if isinstance(r, dict) and isinstance(r.get("instances"), str) and r["instances"].strip() == "auto":
                del r["instances"]
                found.append(f"roles[{i}].instances")
    if len(found) > 1:
        raise checks.bad(found[1], f"auto: only one count can be chosen (already {found[0]})")
    present.update(found)
    return found[0] if found else ""


def _cut(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."
