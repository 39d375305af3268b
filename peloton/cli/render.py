"""What the client commands print: tables, JSON documents (their stable form: docs/cli.md#json-output), the job
view. Imports only what printing needs."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from google.protobuf.message import Message

    from peloton.api.v1 import job_pb2, task_pb2

DOCUMENTS = frozenset({"json", "yaml"})  # the -o formats that print a document, not a table
JOB_TERMINAL = frozenset({"SUCCEEDED", "FAILED", "KILLED"})
TASK_TERMINAL = frozenset({"SUCCEEDED", "FAILED", "LOST", "KILLED"})


def table(rows: Sequence[Sequence[object]], headers: Sequence[str]) -> str:
    cells = [list(map(str, headers))] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells)


# The JSON output's form (docs/cli.md#json-output). The API carries times as float seconds; these are its fields
# that are points in time (written as RFC 3339 in UTC, to the millisecond; 0, "not yet" or "none", as null) and those
# that are spans of seconds (written like a Duration: "6s", "0.523s"). Every other double is a plain number
# (tests/unit/test_json_output.py checks that each double field of the public API is in one of the lists).
TIMESTAMPS: dict[str, frozenset[str]] = {
    "peloton.v1.JobStatus": frozenset({"created_at", "updated_at", "completed_at"}),
    "peloton.v1.TaskInfo": frozenset({"started_at", "finished_at"}),
    "peloton.v1.TaskEvent": frozenset({"time"}),
    "peloton.v1.Host": frozenset({"drain_deadline"}),
    "peloton.v1.QueuedGang": frozenset({"enqueued_at", "expected_start"}),
    "peloton.v1.GetClusterInfoResponse": frozenset({"started_at"}),
    "peloton.v1.Leadership": frozenset({"leading_since"}),
    "peloton.v1.RoleLeader": frozenset({"since"}),
    "peloton.v1.Standby": frozenset({"waiting_since"}),
    "peloton.v1.AuditEvent": frozenset({"at"}),
    "peloton.v1.Model": frozenset({"created_at", "updated_at"}),
}
SECONDS: dict[str, frozenset[str]] = {
    "peloton.v1.Leadership": frozenset({"lease_seconds"}),
    "peloton.v1.RoleLeader": frozenset({"silent_seconds"}),
    "peloton.v1.StageLatency": frozenset({"mean_seconds", "p50_seconds", "p95_seconds", "p99_seconds"}),
}
_NONE: frozenset[str] = frozenset()


def rfc3339(ts: float) -> str | None:
    """`2026-11-25T18:00:04.123Z`: UTC, always to the millisecond (so that the strings sort as the times do),
    truncated (an event never moves after the next one); None for 0."""
    if not ts:
        return None
    ms = int(ts * 1000 // 1)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms // 1000)) + f".{ms % 1000:03d}Z"


def duration(seconds: int, nanos: int) -> str:
    """As protobuf's JSON form of a Duration writes it: `300s`, `1.500s`, `0.000001s` (0, 3, 6 or 9 decimals)."""
    if not nanos:
        return f"{seconds}s"
    sign = "-" if seconds < 0 or nanos < 0 else ""
    frac = f"{abs(nanos):09d}"
    frac = frac[:3] if abs(nanos) % 1_000_000 == 0 else frac[:6] if abs(nanos) % 1000 == 0 else frac
    return f"{sign}{abs(seconds)}.{frac}s"


def span(seconds: float) -> str:
    """Float seconds as a duration, to the millisecond: `6s`, `0.523s`."""
    q, r = divmod(round(abs(seconds) * 1000), 1000)
    return ("-" if seconds < 0 else "") + duration(q, r * 1_000_000)


def to_dict(msg: Message) -> dict[str, Any]:
    """The documented JSON form of a message: proto field names; every field present, with null for a message or
    optional field that is not set (a pool's limit: none; a task's exit code: not yet); times as RFC 3339 strings,
    durations as `300s`; 64-bit integers as numbers (protobuf's own JSON form writes them as strings)."""
    out: dict[str, Any] = {}
    for name, shape, conv, presence in _plan(msg.DESCRIPTOR):
        v = getattr(msg, name)
        if shape == _MAP:
            out[name] = {str(k): conv(x) for k, x in v.items()} if conv else {str(k): x for k, x in v.items()}
        elif shape == _REPEATED:
            out[name] = [conv(x) for x in v] if conv else list(v)
        elif presence and not msg.HasField(name):
            out[name] = None
        else:
            out[name] = conv(v) if conv else v
    return out


_SINGLE, _REPEATED, _MAP = 0, 1, 2
# per message type, once: (field, shape, how to write one value (None: as it is), whether it may be unset)
_PLANS: dict[str, list[tuple[str, int, Callable[[Any], Any] | None, bool]]] = {}


def _plan(d: Any) -> list[tuple[str, int, Callable[[Any], Any] | None, bool]]:
    plan = _PLANS.get(d.full_name)
    if plan is None:
        stamps, spans = TIMESTAMPS.get(d.full_name, _NONE), SECONDS.get(d.full_name, _NONE)
        plan = []
        for f in d.fields:
            if f.message_type is not None and f.message_type.GetOptions().map_entry:
                plan.append((f.name, _MAP, _converter(f.message_type.fields_by_name["value"], stamps, spans), False))
            else:
                plan.append((f.name, _REPEATED if f.is_repeated else _SINGLE, _converter(f, stamps, spans),
                             f.has_presence and not f.is_repeated))
        _PLANS[d.full_name] = plan
    return plan


def _converter(f: Any, stamps: frozenset[str], spans: frozenset[str]) -> Callable[[Any], Any] | None:
    from google.protobuf.descriptor import FieldDescriptor

    if f.message_type is not None:
        if f.message_type.full_name == "google.protobuf.Duration":
            return lambda v: duration(v.seconds, v.nanos)
        return to_dict
    if f.name in stamps:
        return rfc3339
    if f.name in spans:
        return span
    if f.type == FieldDescriptor.TYPE_ENUM:
        names = {n: v.name for n, v in f.enum_type.values_by_number.items()}
        return lambda v: names.get(v, v)
    if f.type == FieldDescriptor.TYPE_BYTES:
        import base64

        return lambda v: base64.b64encode(v).decode()
    return None


# what `-o` asked a document to be written as: json, or yaml (main sets it); the same document either way
FORMAT = "json"


def dumps(obj: object, compact: bool = False) -> str:
    import json

    if FORMAT == "yaml":  # a stream of them (`job get -w`) as YAML documents, each begun by ---
        import yaml

        text = str(yaml.safe_dump(obj, sort_keys=True, default_flow_style=False, allow_unicode=True)).rstrip("\n")
        return "---\n" + text if compact else text
    if compact:
        return json.dumps(obj, sort_keys=True, separators=(",", ":"))
    return json.dumps(obj, indent=2, sort_keys=True)


def done(a: Any, record: dict[str, Any], line: str | None = None) -> None:
    """What a command that acts prints: with `-o json|yaml` the record of what it did, on stdout; otherwise `line`
    (if any) as it always has (docs/cli.md, Output)."""
    if getattr(a, "output", "table") in DOCUMENTS:
        print(dumps(record))
    elif line is not None:
        print(line)


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
    """A quantity of memory or disk (`24105.1328125Mi`, `16Gi`, as the daemon writes them) as a table shows it:
    `mib` of it. The daemon's forms are read here; anything else goes through the spec's parser (importing it
    costs a few ms of start-up, so only then)."""
    num, unit = q[:-2], q[-2:]
    try:
        if unit in ("Mi", "Gi") and num[:1].isdigit():
            return mib(float(num) * (1024 if unit == "Gi" else 1))
    except ValueError:
        pass
    from peloton.domain.resources import parse_mib

    return mib(parse_mib(q or "0", "mem"))


_UNITS = (("Ti", 1024.0 * 1024), ("Gi", 1024.0), ("Mi", 1.0))


def mib(v: float) -> str:
    """MiB as a table shows them, in the largest unit that keeps it at least 1 and to a tenth of it, in the
    spec's own units: `512Mi`, `0.5Mi`, `16Gi`, `23.5Gi` (24105.13 MiB), `1.5Ti`. `-o json` has them exact."""
    i = next(i for i, (_, size) in enumerate(_UNITS) if abs(v) >= size or i == len(_UNITS) - 1)
    if i and abs(round(v / _UNITS[i][1], 1)) >= 1024:  # 1023.96Mi rounds to 1024.0Mi: 1Gi
        i -= 1
    unit, size = _UNITS[i]
    return f"{v / size:.1f}".removesuffix(".0") + unit


def detail(reason: str, message: str) -> str:
    """`reason: message`, once when they say the same (`killed`, not `killed: killed`)."""
    if not reason or not message or message.lower().startswith(reason.lower()):
        return message or reason
    if reason.lower().startswith(message.lower()):
        return reason
    return f"{reason}: {message}"


def resources(r: job_pb2.Resources, disk: bool = False, gpu: bool = False) -> str:
    """`cpu=4,mem=23.5Gi[,disk=100Gi][,gpu=2]`: disk when there is some (or `disk`: always), gpu when there is
    (or `gpu`: always, e.g. the allocation of a host that has GPUs)."""
    parts = [f"cpu={r.cpu:g}", f"mem={quantity(r.mem)}"]
    if disk or quantity(r.disk) != "0Mi":
        parts.append(f"disk={quantity(r.disk)}")
    if r.gpu or gpu:
        parts.append(f"gpu={r.gpu}")
    return ",".join(parts)


def role_cell(t: task_pb2.TaskInfo) -> str:
    """A task's role and its rank in it (`worker/3`), for the ROLE column of a job with roles."""
    return f"{t.role}/{t.role_rank}" if t.role else "-"


def _ports(r: job_pb2.Resources) -> str:
    return f",ports={r.ports}" if r.ports else ""


def _cut_line(text: str, limit: int = 60) -> str:
    """A command on one line, cut to `limit` characters."""
    one = " ".join(text.split())
    return one if len(one) <= limit else one[:limit - 3] + "..."


def job_json(job: job_pb2.Job, tasks: Sequence[task_pb2.TaskInfo]) -> dict[str, Any]:
    """`job get -o json`: the job with a `tasks` list added."""
    out = to_dict(job)
    out["tasks"] = [to_dict(t) for t in tasks]
    return out


COMPACT_OVER = 20  # `job get` lists more tasks (or gangs) than this as groups of instance ranges, unless --all
MAX_RANGES = 8  # instance ranges written out in one group; the rest are counted


def ranges(nums: Sequence[int]) -> str:
    """Sorted numbers as ranges: `0-511,600,700-710`; past MAX_RANGES ranges, `... (+N more)`."""
    runs: list[tuple[int, int]] = []
    for n in nums:
        if runs and n == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], n)
        else:
            runs.append((n, n))
    text = ",".join(f"{a}-{b}" if b > a else str(a) for a, b in runs[:MAX_RANGES])
    return text + (f",... (+{len(runs) - MAX_RANGES} ranges)" if len(runs) > MAX_RANGES else "")


def _span(values: Sequence[int]) -> str:
    lo, hi = min(values), max(values)
    return str(lo) if lo == hi else f"{lo}-{hi}"


def _task_groups(tasks: Sequence[task_pb2.TaskInfo]) -> list[list[object]]:
    """One row per state and outcome (exit code and message), with its instances as ranges; by state alone when
    the outcomes are too varied to group."""
    def outcome(t: task_pb2.TaskInfo) -> tuple[str, str]:
        return (str(t.exit_code) if t.HasField("exit_code") else "-", t.message or t.reason or "")

    groups: dict[tuple[str, str, str], list[task_pb2.TaskInfo]] = {}
    for t in tasks:
        groups.setdefault((t.state, *outcome(t)), []).append(t)
    if len(groups) > COMPACT_OVER:
        groups = {}
        for t in tasks:
            groups.setdefault((t.state, "", ""), []).append(t)
    rows: list[list[object]] = []
    for (state, code, message), ts in sorted(groups.items(), key=lambda kv: kv[1][0].instance):
        hosts = {t.host for t in ts if t.host}
        if not code and not message:  # grouped by state alone
            outcomes = {outcome(t) for t in ts}
            (code, message), = outcomes if len(outcomes) == 1 else {("*", f"({len(outcomes)} different outcomes)")}
        rows.append([ranges([t.instance for t in ts]), state, len(ts),
                     next(iter(hosts)) if len(hosts) == 1 else f"{len(hosts)} hosts" if hosts else "-",
                     _span([t.attempt for t in ts]), code, message])
    return rows


def _gang_lines(st: job_pb2.JobStatus, gangs: Sequence[job_pb2.GangStatus]) -> list[str]:
    """Gangs alike (size, state, attempt, run, reason) on one line, with their indexes and instances as ranges;
    without the reason, one gang's given for an example, when the reasons are too varied to group."""
    def key(g: job_pb2.GangStatus, reason: bool) -> tuple[int, str, int, int, str]:
        return (len(g.instances), g.state, g.attempt, g.run, g.reason if reason else "")

    for with_reason in (True, False):
        groups: dict[tuple[int, str, int, int, str], list[job_pb2.GangStatus]] = {}
        for g in gangs:
            groups.setdefault(key(g, with_reason), []).append(g)
        if len(groups) <= COMPACT_OVER:
            break
    lines = []
    for gs in sorted(groups.values(), key=lambda gs: gs[0].index):
        if len(gs) == 1:
            lines.append(_gang_line(st, gs[0]))
            continue
        g = gs[0]
        reasons = {x.reason for x in gs}
        line = (f"  gangs {ranges([x.index for x in gs])} ({len(gs)} gangs, instances "
                f"{ranges(sorted(i for x in gs for i in x.instances))}): {g.state}, attempt {g.attempt}")
        if g.preemptions:
            line += f" (run {g.run}: preempted {g.preemptions}x, which uses up no attempt)"
        if g.reason and g.state != "RUNNING":
            why = g.reason if len(reasons) == 1 else f"(gang {g.index}, one of {len(reasons)} reasons) {g.reason}"
            line += f"\n    why: {why}" if st.state == "PENDING" or g.state == "QUEUED" else f" - {why}"
        lines.append(line)
    return lines


def _gang_line(st: job_pb2.JobStatus, g: job_pb2.GangStatus) -> str:
    members = f"{g.instances[0]}-{g.instances[-1]}" if len(g.instances) > 1 else str(g.instances[0])
    line = f"  gang {g.index} (instances {members}): {g.state}, attempt {g.attempt}"
    if g.preemptions:
        line += f" (run {g.run}: preempted {g.preemptions}x, which uses up no attempt)"
    if g.reason and g.state not in ("RUNNING",):
        line += f"\n    why: {g.reason}" if st.state == "PENDING" or g.state == "QUEUED" else f" - {g.reason}"
    if g.HasField("plan"):
        line += "\n" + "\n".join(plan_lines(g.plan, ended=g.state in _RUN_OVER))
    return line


def _gph(gpus_per_host: Sequence[int]) -> str:
    return ",".join(str(n) for n in gpus_per_host)


# a gang whose run has ended (or is being torn down): the daemon reads its members' speed only while it runs
_RUN_OVER = frozenset({"DONE", "ABORTING", "PREEMPTING"})


def plan_lines(p: job_pb2.PlanInfo, indent: str = "    ", ended: bool = False) -> list[str]:
    """Why this plan: the GPUs per host chosen, predicted against measured, and the runner-ups. `ended`: the gang's
    run is over, so no measurement is shown whatever its members wrote (not "not reported yet")."""
    out = [f"{indent}plan: GPUs per host {_gph(p.gpus_per_host)}, local batch {p.local_bsz:g}: predicted "
           f"{p.step_time:.3f} s/step, {p.samples_per_s:.1f} samples/s"]
    if p.measured_members:
        err = (p.measured_step_time - p.step_time) / p.step_time * 100 if p.step_time else 0.0
        out.append(f"{indent}  measured {p.measured_step_time:.3f} s/step, {p.measured_samples_per_s:.1f} samples/s "
                   f"({p.measured_members} members reporting; prediction off by {err:+.0f}%)")
    elif ended:
        out.append(f"{indent}  measured: read only while the gang runs (model refit --from-job then)")
    else:
        out.append(f"{indent}  measured: not reported yet (a member writes step_time=SECONDS to "
                   "$PELOTON_METRICS_FILE)")
    if p.alternatives:
        alts = "; ".join(f"{_gph(a.gpus_per_host)} {a.samples_per_s:.1f} samples/s" for a in p.alternatives)
        out.append(f"{indent}  why: the best predicted of those that fit; runner-ups: {alts}")
    return out


def job_view(job: job_pb2.Job, tasks: Sequence[task_pb2.TaskInfo], every_row: bool = False) -> str:
    """`job get`: state, gangs (and why they wait), tasks. Past COMPACT_OVER tasks (gangs), grouped by state and
    outcome into ranges of instances, unless `every_row` (--all)."""
    st, spec = job.status, job.spec
    lines = [f"Job:       {job.id}  {spec.name}",
             f"State:     {st.state}" + (f"  (desired {st.desired_state})" if st.desired_state != "RUNNING" else "")]
    if st.reason:
        lines.append(f"Reason:    {st.reason}")
    runs_as = f" (runs as {st.run_as})" if st.run_as else ""
    lines.append(f"Owner:     {spec.owner or '-'}{runs_as}   Pool: {spec.respool}   Priority: {spec.sla.priority}")
    if spec.roles:
        lines.append(f"Instances: {spec.instances} in {len(spec.roles)} roles   created {ago(st.created_at)}")
        lines.append("Roles:")
        start = 0
        rows: list[list[object]] = []
        for r in spec.roles:
            span = f"{start}-{start + r.instances - 1}" if r.instances > 1 else str(start)
            rows.append([r.name, r.instances, span, resources(r.task.resources) + _ports(r.task.resources),
                         _cut_line(r.task.command)])
            start += r.instances
        lines += ["  " + x for x in table(rows, ["ROLE", "N", "INSTANCES", "EACH", "COMMAND"]).splitlines()]
    else:
        lines.append(f"Instances: {spec.instances}  each {resources(spec.task.resources)}   "
                     f"created {ago(st.created_at)}")
    shown = len(st.gangs)
    if st.gang_count > shown:
        counts = ", ".join(f"{n} {state}" for state, n in sorted(st.gang_states.items()))
        lines.append(f"Gangs:     {st.gang_count} ({counts}); the first {shown}:")
    else:
        lines.append("Gangs:")
    if every_row or len(st.gangs) <= COMPACT_OVER:
        lines += [_gang_line(st, g) for g in st.gangs]
    else:
        lines += _gang_lines(st, st.gangs)
    if every_row or len(tasks) <= COMPACT_OVER:
        lines.append("Tasks:")
        with_roles = bool(spec.roles)
        rows = [[t.instance, *([role_cell(t)] if with_roles else []), t.state, t.host or "-", t.attempt,
                 ",".join(map(str, t.gpus)) or "-", t.exit_code if t.HasField("exit_code") else "-",
                 t.message or t.reason or ""] for t in tasks]
        lines.append(table(rows, ["INSTANCE", *(["ROLE"] if with_roles else []), "STATE", "HOST", "ATTEMPT", "GPUS",
                                  "EXIT", "MESSAGE"]))
    else:
        by_state: dict[str, int] = {}
        for t in tasks:
            by_state[t.state] = by_state.get(t.state, 0) + 1
        lines.append(f"Tasks:     {len(tasks)} ({', '.join(f'{n} {s}' for s, n in sorted(by_state.items()))}); "
                     "by state and outcome (--all: a row per task):")
        lines.append(table(_task_groups(tasks), ["INSTANCES", "STATE", "TASKS", "HOSTS", "ATTEMPT", "EXIT",
                                                 "MESSAGE"]))
    return "\n".join(lines)
