"""Reading a job spec file: YAML whose structure is the JSON form of peloton.v1.JobSpec."""

from __future__ import annotations

import re
from typing import Any

import yaml
from google.protobuf import json_format

from peloton.api.v1 import job_pb2
from peloton.domain import checks
from peloton.errors import InvalidArgument

_QUANTITY_FIELDS = ("mem", "disk")
_DURATION_FIELDS = (("gang", "launch_timeout"), ("sla", "max_runtime"), ("sla", "preemption_grace"))


def _normalize(doc: dict[str, Any]) -> dict[str, Any]:
    """YAML conveniences the JSON mapping lacks: `mem: 1024` (MiB) and `launch_timeout: 300` (seconds)."""
    res = doc.get("task", {}).get("resources") if isinstance(doc.get("task"), dict) else None
    if isinstance(res, dict):
        for k in _QUANTITY_FIELDS:
            if isinstance(res.get(k), (int, float)) and not isinstance(res.get(k), bool):
                res[k] = _number_text(res[k], f"task.resources.{k}")
    for outer, inner in _DURATION_FIELDS:
        section = doc.get(outer)
        if isinstance(section, dict) and isinstance(section.get(inner), (int, float)):
            section[inner] = _number_text(section[inner], f"{outer}.{inner}") + "s"
    if isinstance(doc.get("task"), dict) and isinstance(doc["task"].get("env"), dict):
        doc["task"]["env"] = {_env_name(k): _env_value(v, k) for k, v in doc["task"]["env"].items()}
    return doc


def _number_text(v: int | float, field: str) -> str:
    try:
        return str(v)
    except ValueError:  # an int of more than 4300 digits (YAML reads 0x... of any length)
        raise InvalidArgument(f"{field}: number too large", field=field) from None


def _env_name(k: Any) -> str:
    return _number_text(k, "task.env") if isinstance(k, int) else str(k)


def _env_value(v: Any, k: Any) -> str:
    # YAML reads `true` as a bool; the variable should say what the file said
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return ""
    if isinstance(v, (list, dict, set, bytes)):  # str() of nested aliases can grow without bound
        field = f"task.env.{checks.key(str(k))}"
        raise InvalidArgument(f"{field}: must be a string, number or boolean, not {type(v).__name__}", field=field)
    if isinstance(v, int):
        return _number_text(v, f"task.env.{checks.key(str(k))}")
    return str(v)


def parse_spec(text: str, source: str = "spec") -> job_pb2.JobSpec:
    """The JobSpec a spec file describes. Raises InvalidArgument, and nothing else, for any text: its message starts
    with `source`, then the field path when one is at fault (`field`; the source for a whole-file error)."""
    try:
        doc = yaml.safe_load(text)
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
    try:
        return json_format.ParseDict(_normalize(doc), job_pb2.JobSpec())
    except InvalidArgument as e:
        raise InvalidArgument(f"{source}: {e.message}", field=e.field) from None
    except (json_format.ParseError, ValueError, TypeError, OverflowError, RecursionError) as e:
        field, why = _explain(str(e))
        raise InvalidArgument(f"{source}: {field}: {why}" if field else f"{source}: {why}", field=field or source) from None


_UNKNOWN = re.compile(r'has no field named "([^"]+)" at "([^"]*)"\.?\s*Available Fields\(except extensions\): "\[(.*)\]"', re.S)
_AT = re.compile(r"\s*at JobSpec\.([A-Za-z0-9_.\[\]]+?)\.*$")
_CHAIN = re.compile(r"Failed to parse (\w+) field: ")


def _cut(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."


def _explain(msg: str) -> tuple[str, str]:
    """json_format's messages as (field path, one line of why)."""
    m = _UNKNOWN.search(msg)
    if m:
        name, where, known = m.groups()
        path = where.split(".", 1)[1] + "." if "." in where else ""
        known = ", ".join(re.sub(r"(?<!^)(?=[A-Z])", "_", k.strip(" '")).lower() for k in known.split(","))
        return f"{path}{checks.key(name)}", f"unknown field (known here: {known})"
    msg = " ".join(msg.split())
    chain = _CHAIN.findall(msg)
    why = _CHAIN.sub("", msg)
    at = _AT.search(why)
    if at:
        field = re.sub(r"\.(key|value)$", "", at.group(1))
        why = why[: at.start()]
    else:
        field = ".".join(chain)
    return field, _cut(why.rstrip(" ."))
