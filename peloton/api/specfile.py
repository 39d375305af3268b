"""Reading a job spec file: YAML whose structure is the JSON form of peloton.v1.JobSpec."""

from __future__ import annotations

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
        doc["task"]["env"] = {str(k): str(v) for k, v in doc["task"]["env"].items()}
    return doc


def parse_spec(text: str, source: str = "spec") -> job_pb2.JobSpec:
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise InvalidArgument(f"{source}: not valid YAML: {e}") from None
    if not isinstance(doc, dict):
        raise InvalidArgument(f"{source}: expected a mapping at the top level")
    try:
        return json_format.ParseDict(_normalize(doc), job_pb2.JobSpec())
    except json_format.ParseError as e:
        raise InvalidArgument(f"{source}: {_explain(str(e))}") from None


def _explain(msg: str) -> str:
    # json_format says: 'Message type "peloton.v1.TaskSpec" has no field named "foo" at "JobSpec.task".'
    msg = msg.replace('Message type "peloton.v1.', '"').replace("at \"JobSpec.", 'at "')
    return msg
