"""Reading a job spec file: YAML whose structure is the JSON form of peloton.v1.JobSpec."""

from __future__ import annotations

import re
from typing import Any

import yaml
from google.protobuf import json_format

from peloton.api.v1 import job_pb2
from peloton.errors import InvalidArgument

_QUANTITY_FIELDS = ("mem", "disk")
_DURATION_FIELDS = (("gang", "launch_timeout"), ("sla", "max_runtime"))


def _normalize(doc: dict[str, Any]) -> dict[str, Any]:
    """YAML conveniences the JSON mapping lacks: `mem: 1024` (MiB) and `launch_timeout: 300` (seconds)."""
    res = doc.get("task", {}).get("resources") if isinstance(doc.get("task"), dict) else None
    if isinstance(res, dict):
        for k in _QUANTITY_FIELDS:
            if isinstance(res.get(k), (int, float)) and not isinstance(res.get(k), bool):
                res[k] = str(res[k])
    for outer, inner in _DURATION_FIELDS:
        section = doc.get(outer)
        if isinstance(section, dict) and isinstance(section.get(inner), (int, float)):
            section[inner] = f"{section[inner]}s"
    if isinstance(doc.get("task"), dict) and isinstance(doc["task"].get("env"), dict):
        doc["task"]["env"] = {str(k): _env_value(v) for k, v in doc["task"]["env"].items()}
    return doc


def _env_value(v: Any) -> str:
    # YAML reads `true` as a bool; the variable should say what the file said
    if isinstance(v, bool):
        return "true" if v else "false"
    return "" if v is None else str(v)


def parse_spec(text: str, source: str = "spec") -> job_pb2.JobSpec:
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or "syntax error"
        raise InvalidArgument(f"{source}: not valid YAML{where}: {problem}") from None
    if not isinstance(doc, dict):
        raise InvalidArgument(f"{source}: expected a mapping at the top level")
    try:
        return json_format.ParseDict(_normalize(doc), job_pb2.JobSpec())
    except json_format.ParseError as e:
        raise InvalidArgument(f"{source}: {_explain(str(e))}") from None


_UNKNOWN = re.compile(r'has no field named "([^"]+)" at "([^"]*)"\.?\s*Available Fields\(except extensions\): "\[(.*)\]"', re.S)


def _explain(msg: str) -> str:
    """json_format's messages, made one line that names the field at fault."""
    m = _UNKNOWN.search(msg)
    if m:
        name, where, known = m.groups()
        path = where.split(".", 1)[1] + "." if "." in where else ""
        known = ", ".join(re.sub(r"(?<!^)(?=[A-Z])", "_", k.strip(" '")).lower() for k in known.split(","))
        return f"{path}{name}: unknown field (known here: {known})"
    msg = re.sub(r"Failed to parse (\w+) field: ", r"\1: ", msg)
    return " ".join(msg.split())
