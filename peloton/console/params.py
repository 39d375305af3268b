"""The console's query parameters, read and checked (pure): a list's filters and page, a job id. A wrong one is
an InvalidArgument naming the parameter, before any call to the API."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from peloton.domain.durations import parse_duration
from peloton.domain.gpumap import HOST_STATUSES
from peloton.domain.states import JobState
from peloton.errors import InvalidArgument

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 500  # a page the browser renders in well under a second (the API allows 1,000)
MAX_TEXT = 256
MAX_WATCH_JOBS = 100  # job ids one event stream may follow (the API's own bound is higher)
JOB_ID = re.compile(r"[0-9a-f]{12}")
PAGE_TOKEN = re.compile(r"[A-Za-z0-9_=.:-]{0,1024}")
JOB_STATES = tuple(s.value for s in JobState)


@dataclass(frozen=True)
class JobQuery:
    states: tuple[str, ...] = ()
    owner: str = ""
    pool: str = ""
    name_contains: str = ""
    page_size: int = DEFAULT_PAGE_SIZE
    page_token: str = ""


def _only(query: Mapping[str, Sequence[str]], allowed: frozenset[str], where: str) -> None:
    unknown = sorted(set(query) - allowed)
    if unknown:
        raise InvalidArgument(f"{unknown[0]}: not a parameter of {where}; known: {', '.join(sorted(allowed))}",
                              field=unknown[0])


def _one(query: Mapping[str, Sequence[str]], name: str) -> str:
    values = query.get(name, [])
    if len(values) > 1:
        raise InvalidArgument(f"{name}: given {len(values)} times; give it once", field=name)
    value = values[0] if values else ""
    if len(value) > MAX_TEXT:
        raise InvalidArgument(f"{name}: at most {MAX_TEXT} characters, got {len(value)}", field=name)
    if any(ord(c) < 32 for c in value):
        raise InvalidArgument(f"{name}: must not contain control characters", field=name)
    return value


def job_query(query: Mapping[str, Sequence[str]]) -> JobQuery:
    """/api/jobs?state=RUNNING&state=PENDING&owner=&pool=&q=&page_size=&page_token="""
    _only(query, frozenset({"state", "owner", "pool", "q", "page_size", "page_token"}), "/api/jobs")
    states: list[str] = []
    for raw in query.get("state", []):
        for s in filter(None, raw.split(",")):
            if s.upper() not in JOB_STATES:
                raise InvalidArgument(f"state: {s!r} is not a job state; one of {', '.join(JOB_STATES)}",
                                      field="state")
            states.append(s.upper())
    page_size = _int(query, "page_size", DEFAULT_PAGE_SIZE, 1, MAX_PAGE_SIZE)
    token = _one(query, "page_token")
    if not PAGE_TOKEN.fullmatch(token):
        raise InvalidArgument("page_token: not a page token this console gave (use next_page_token of the page "
                              "before)", field="page_token")
    pool = _one(query, "pool")
    if pool and not pool.startswith("/"):
        raise InvalidArgument(f"pool: a pool's path starts with '/', got {pool!r}", field="pool")
    return JobQuery(tuple(dict.fromkeys(states)), _one(query, "owner"), pool, _one(query, "q"), page_size, token)


DEFAULT_HOST_PAGE = 200
MAX_HOST_PAGE = 1000  # ListHosts' own bound
HOSTNAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")


@dataclass(frozen=True)
class HostQuery:
    rack: str = ""
    status: str = ""
    label: str = ""  # key=value, or key
    name_contains: str = ""
    min_free_gpus: int = 0
    page_size: int = DEFAULT_HOST_PAGE
    page_token: str = ""


def _int(query: Mapping[str, Sequence[str]], name: str, default: int, low: int, high: int) -> int:
    text = _one(query, name)
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        raise InvalidArgument(f"{name}: must be a whole number, got {text!r}", field=name) from None
    if not low <= value <= high:
        raise InvalidArgument(f"{name}: must be between {low} and {high}, got {value}", field=name)
    return value


def host_query(query: Mapping[str, Sequence[str]]) -> HostQuery:
    """/api/hosts?rack=&status=&label=&q=&free_gpus=&page_size=&page_token= (filtered and paged by ListHosts)"""
    _only(query, frozenset({"rack", "status", "label", "q", "free_gpus", "page_size", "page_token"}), "/api/hosts")
    status = _one(query, "status")
    if status and status not in HOST_STATUSES:
        raise InvalidArgument(f"status: {status!r} is not a host status; one of {', '.join(HOST_STATUSES)}",
                              field="status")
    label = _one(query, "label")
    if label.startswith("="):
        raise InvalidArgument(f"label: key=value or key, got {label!r}", field="label")
    token = _one(query, "page_token")
    if not PAGE_TOKEN.fullmatch(token):
        raise InvalidArgument("page_token: not a page token this console gave (use next_page_token of the page "
                              "before)", field="page_token")
    return HostQuery(_one(query, "rack"), status, label, _one(query, "q"), _int(query, "free_gpus", 0, 0, 1024),
                     _int(query, "page_size", DEFAULT_HOST_PAGE, 1, MAX_HOST_PAGE), token)


MAX_DRAIN_DEADLINE_S = 365 * 24 * 3600.0  # (a drain's deadline is from now: a year is already no deadline)


def drain_deadline(query: Mapping[str, Sequence[str]]) -> float | None:
    """POST /api/hosts/NAME/drain?deadline=2h: seconds from now after which the gangs still on the host are
    preempted (the CLI's `host drain --deadline`); None without one (they finish in their own time)."""
    _only(query, frozenset({"deadline"}), "/api/hosts/NAME/drain")
    text = _one(query, "deadline").strip()
    if not text:
        return None
    seconds = parse_duration(text, "deadline")
    if not 0 < seconds <= MAX_DRAIN_DEADLINE_S:
        raise InvalidArgument(f"deadline: more than 0 and at most a year, got {text!r}", field="deadline")
    return seconds


def hostname(text: str) -> str:
    if not HOSTNAME.fullmatch(text):
        raise InvalidArgument(f"host: not a host name, got {text[:60]!r}", field="host")
    return text


MAX_QUEUE_PAGE = 1000  # ListQueue's own bound


@dataclass(frozen=True)
class QueueQuery:
    pool: str = ""
    limit: int = 200


def queue_query(query: Mapping[str, Sequence[str]]) -> QueueQuery:
    """/api/queue?pool=/P&limit=N: the gangs waiting in a pool and its subtree (every pool without one)."""
    _only(query, frozenset({"pool", "limit"}), "/api/queue")
    pool = _one(query, "pool")
    if pool and not pool.startswith("/"):
        raise InvalidArgument(f"pool: a pool's path starts with '/', got {pool!r}", field="pool")
    return QueueQuery(pool, _int(query, "limit", 200, 1, MAX_QUEUE_PAGE))


@dataclass(frozen=True)
class AuditQuery:
    principal: str = ""
    object: str = ""
    denied: bool = False
    limit: int = 100
    before_id: int = 0


def audit_query(query: Mapping[str, Sequence[str]]) -> AuditQuery:
    """/api/audit?principal=&object=&denied=1&limit=&before=ID: newest first, a page at a time."""
    _only(query, frozenset({"principal", "object", "denied", "limit", "before"}), "/api/audit")
    denied = _one(query, "denied")
    if denied not in ("", "0", "1"):
        raise InvalidArgument(f"denied: 1 (only refused calls) or 0, got {denied!r}", field="denied")
    return AuditQuery(_one(query, "principal"), _one(query, "object"), denied == "1",
                      _int(query, "limit", 100, 1, 1000), _int(query, "before", 0, 0, 2**62))


MAX_JOB_EVENTS = 1000  # a job page's events list (ListTaskEvents allows 10,000)


def events_limit(query: Mapping[str, Sequence[str]]) -> int:
    """/api/jobs/ID/events?limit=N: the job's newest N state changes."""
    _only(query, frozenset({"limit"}), "/api/jobs/ID/events")
    return _int(query, "limit", 200, 1, MAX_JOB_EVENTS)


LOG_STREAMS = ("stdout", "stderr")
LOG_TAIL = 64 * 1024  # the first read of a log: its last 64 KiB (then follow from next_offset)


@dataclass(frozen=True)
class LogQuery:
    stream: str = "stdout"
    offset: int | None = None  # None: the last LOG_TAIL bytes
    run: int = 0  # 0: the current run


def log_query(query: Mapping[str, Sequence[str]]) -> LogQuery:
    """/api/jobs/ID/members/N/logs?stream=stdout|stderr&offset=B&run=R"""
    _only(query, frozenset({"stream", "offset", "run"}), "/api/jobs/ID/members/N/logs")
    stream = _one(query, "stream") or "stdout"
    if stream not in LOG_STREAMS:
        raise InvalidArgument(f"stream: stdout or stderr, got {stream[:20]!r}", field="stream")
    offset = _int(query, "offset", -1, 0, 2**62) if _one(query, "offset") else None
    return LogQuery(stream, offset, _int(query, "run", 0, 0, 2**31 - 1))


def gang_index(text: str) -> int:
    if not text.isdigit() or len(text) > 7:
        raise InvalidArgument(f"gang: a gang's index is a whole number from 0, got {text[:20]!r}", field="gang")
    return int(text)


def instance(text: str) -> int:
    if not text.isdigit() or len(text) > 7:
        raise InvalidArgument(f"instance: a member's instance is a whole number from 0, got {text[:20]!r}",
                              field="instance")
    return int(text)


def job_id(text: str, name: str = "job") -> str:
    if not JOB_ID.fullmatch(text):
        raise InvalidArgument(f"{name}: a job id is 12 hexadecimal digits, got {text[:40]!r}", field=name)
    return text


def watch_jobs(query: Mapping[str, Sequence[str]]) -> tuple[str, ...]:
    """/api/events?job=ID&job=ID: the jobs to follow (none: every job)."""
    _only(query, frozenset({"job"}), "/api/events")
    ids = tuple(dict.fromkeys(job_id(j) for raw in query.get("job", []) for j in filter(None, raw.split(","))))
    if len(ids) > MAX_WATCH_JOBS:
        raise InvalidArgument(f"job: at most {MAX_WATCH_JOBS} jobs per event stream, got {len(ids)}", field="job")
    return ids


def resume_point(last_event_id: str) -> tuple[str, int]:
    """An SSE Last-Event-ID, `<stream_id>:<revision>` as the console sent it: where the watch resumes. Anything
    else (a browser's first connection sends none) starts afresh."""
    stream, _, rev = last_event_id.strip().rpartition(":")
    if not stream or not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", stream) or not rev.isdigit() or len(rev) > 18:
        return "", 0
    return stream, int(rev)
