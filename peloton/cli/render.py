"""What the client commands print: tables, JSON documents, the job view. Imports only what printing needs;
protobuf's json_format (tens of ms) only for `-o json`."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from google.protobuf.message import Message

    from peloton.api.v1 import job_pb2, task_pb2

JOB_TERMINAL = frozenset({"SUCCEEDED", "FAILED", "KILLED"})
TASK_TERMINAL = frozenset({"SUCCEEDED", "FAILED", "LOST", "KILLED"})


def table(rows: Sequence[Sequence[object]], headers: Sequence[str]) -> str:
    cells = [list(map(str, headers))] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells)


def to_dict(msg: Message) -> dict[str, Any]:
    """The protobuf JSON form with proto field names and every field present."""
    from google.protobuf import json_format

    return json_format.MessageToDict(msg, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)


def dumps(obj: object, compact: bool = False) -> str:
    import json

    if compact:
        return json.dumps(obj, sort_keys=True, separators=(",", ":"))
    return json.dumps(obj, indent=2, sort_keys=True)


def json_message(msg: Message) -> str:
    return dumps(to_dict(msg))


def json_list(key: str, items: Sequence[Message]) -> str:
    """Every page in one document: {"<key>": [...]}."""
    return dumps({key: [to_dict(m) for m in items]})


def ago(ts: float) -> str:
    if not ts:
        return "-"
    d = max(0, time.time() - ts)
    return f"{d:.0f}s ago" if d < 120 else f"{d / 60:.0f}m ago" if d < 7200 else f"{d / 3600:.1f}h ago"


def quantity(q: str) -> str:
    """A quantity as the daemon writes it (format_mib: `64Mi`, `16Gi`) as is; anything else (`0.5Mi` too) is
    parsed and written that way (importing the parser costs a few ms of start-up, so only then)."""
    num, unit = q[:-2], q[-2:]
    canonical = num.isdigit() and (num == "0" or num[0] != "0")  # no leading zeros
    if canonical and (unit == "Gi" and num != "0" or unit == "Mi" and (num == "0" or int(num) % 1024 != 0)):
        return q
    from peloton.domain.resources import format_mib, parse_mib

    return format_mib(parse_mib(q or "0", "mem"))


def mib(v: float) -> str:
    """A fractional MiB amount (an entitlement) as a quantity, to a tenth of a MiB."""
    from peloton.domain.resources import format_mib

    return format_mib(round(v, 1))


def resources(r: job_pb2.Resources) -> str:
    parts = [f"cpu={r.cpu:g}", f"mem={quantity(r.mem)}"]
    if r.gpu:
        parts.append(f"gpu={r.gpu}")
    return ",".join(parts)


def job_json(job: job_pb2.Job, tasks: Sequence[task_pb2.TaskInfo]) -> dict[str, Any]:
    """`job get -o json`: the job with a `tasks` list added."""
    out = to_dict(job)
    out["tasks"] = [to_dict(t) for t in tasks]
    return out


def job_view(job: job_pb2.Job, tasks: Sequence[task_pb2.TaskInfo]) -> str:
    """`job get`: state, gangs (and why they wait), tasks."""
    st, spec = job.status, job.spec
    lines = [f"Job:       {job.id}  {spec.name}",
             f"State:     {st.state}" + (f"  (desired {st.desired_state})" if st.desired_state != "RUNNING" else "")]
    if st.reason:
        lines.append(f"Reason:    {st.reason}")
    lines.append(f"Owner:     {spec.owner or '-'}   Pool: {spec.respool}   Priority: {spec.sla.priority}")
    lines.append(f"Instances: {spec.instances}  each {resources(spec.task.resources)}   created {ago(st.created_at)}")
    shown = len(st.gangs)
    if st.gang_count > shown:
        counts = ", ".join(f"{n} {state}" for state, n in sorted(st.gang_states.items()))
        lines.append(f"Gangs:     {st.gang_count} ({counts}); the first {shown}:")
    else:
        lines.append("Gangs:")
    for g in st.gangs:
        members = f"{g.instances[0]}-{g.instances[-1]}" if len(g.instances) > 1 else str(g.instances[0])
        line = f"  gang {g.index} (instances {members}): {g.state}, attempt {g.attempt}"
        if g.preemptions:
            line += f" (run {g.run}: preempted {g.preemptions}x, which uses up no attempt)"
        if g.reason and g.state not in ("RUNNING",):
            line += f"\n    why: {g.reason}" if st.state == "PENDING" or g.state == "QUEUED" else f" - {g.reason}"
        lines.append(line)
    lines.append("Tasks:")
    rows = [[t.instance, t.state, t.host or "-", t.attempt, ",".join(map(str, t.gpus)) or "-",
             t.exit_code if t.HasField("exit_code") else "-", t.message or t.reason or ""] for t in tasks]
    lines.append(table(rows, ["INSTANCE", "STATE", "HOST", "ATTEMPT", "GPUS", "EXIT", "MESSAGE"]))
    return "\n".join(lines)
