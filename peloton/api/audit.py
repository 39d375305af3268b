"""The audit log: every changing call (allowed or not, and how it ended) and every refused call, with who made it,
how they were authenticated and what it was about, written to the store (`audit_events`) and read back with
`peloton audit` (AuditService).

Records are written in the background, in batches (every AUDIT_FLUSH_S or AUDIT_BATCH records), so no request
waits for the audit: a crash can lose the records of the last half second, and when the store is away they wait
(up to AUDIT_QUEUE records, then the oldest are dropped and counted)."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import grpc
from prometheus_client import Counter
from sqlalchemy.orm import Session, sessionmaker

from peloton.api import request_checks
from peloton.api.status import grpc_errors
from peloton.api.v1 import audit_pb2, audit_pb2_grpc
from peloton.domain.model import AuditEvent
from peloton.errors import InvalidArgument
from peloton.store import repo
from peloton.store.db import transaction

log = logging.getLogger(__name__)

AUDIT_FLUSH_S = 0.5
AUDIT_BATCH = 500
AUDIT_QUEUE = 100_000
DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
AUDIT_PRINCIPAL_CHARS = 128  # audit_events.principal
AUDIT_OBJECT_CHARS = 512  # audit_events.object

RECORDS = Counter("peloton_audit_records_total", "Audit records written", ["allowed"])
DROPPED = Counter("peloton_audit_records_dropped_total", "Audit records dropped: the store was away too long")


def object_of(request: Any, response: Any = None) -> str:
    """What a call was about: a job id, a pool path, a host name, a model's name or a console login's id (a created
    job: its new id; a refused one: the pool it named)."""
    for source, field in ((response, "job_id"), (request, "job_id"), (request, "path"), (request, "hostname"),
                          (request, "name"), (response, "login_id"), (request, "login_id")):
        value = getattr(source, field, "") if source is not None else ""
        if value:
            return str(value)
    pool = getattr(request, "pool", None) or getattr(getattr(request, "spec", None), "respool", None)
    return str(getattr(pool, "path", pool) or "")


def _column(text: str, chars: int | None) -> str:
    """A value as its column can hold it on both stores: the object of a refused call is whatever the caller sent
    (a model's name with a NUL, a job id of 100,000 characters), which PostgreSQL would refuse, and with it the
    whole batch, again and again. A lone surrogate (text decoded with surrogateescape) neither store can encode: it
    is written as its escape, \\udcxx."""
    text = text.replace("\x00", "\\x00")
    if not text.isascii():
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text if chars is None or len(text) <= chars else text[:chars - 3] + "..."


class AuditLog:
    def __init__(self, sessions: sessionmaker[Session], clock: Callable[[], float] = time.time) -> None:
        self.sessions = sessions
        self.clock = clock
        self._cond = threading.Condition()
        # one flush at a time (the writer thread's, and ListAuditEvents' read-your-writes one): two at once would
        # both write the same records, and the second's pops would drop records neither wrote
        self._flush_lock = threading.Lock()
        self._pending: deque[AuditEvent] = deque()
        self._stop = False
        self._failing = False
        self._thread = threading.Thread(target=self._run, name="audit-log", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify()
        self._thread.join(10)

    def record(self, principal: str, via: str, method: str, obj: str, allowed: bool, code: str,
               message: str = "") -> None:
        e = AuditEvent(at=self.clock(), principal=_column(principal, AUDIT_PRINCIPAL_CHARS), via=_column(via, 32),
                       method=_column(method.lstrip("/").split(".")[-1], 128), object=_column(obj, AUDIT_OBJECT_CHARS),
                       allowed=allowed, code=_column(code, 32), message=_column(message, None))
        with self._cond:
            if len(self._pending) >= AUDIT_QUEUE:
                self._pending.popleft()
                DROPPED.inc()
            self._pending.append(e)
            if len(self._pending) >= AUDIT_BATCH:
                self._cond.notify()

    def flush(self) -> bool:
        """Write what is pending now (the writer thread; a listing, to read what was just done; shutdown). False
        when the store refused."""
        with self._flush_lock:
            return self._flush()

    def _flush(self) -> bool:
        with self._cond:
            batch = list(self._pending)
        if not batch:
            return True
        try:
            with transaction(self.sessions) as s:
                repo.append_audit_events(s, batch)
        except Exception as e:  # noqa: BLE001 - the store is away: keep them, say so once per streak
            if not self._failing:
                log.warning("audit records not written yet (%d waiting): %s", len(batch), e)
            self._failing = True
            return False
        self._failing = False
        with self._cond:
            # the batch is the queue's head still (only flushes remove, one at a time), unless the queue overflowed
            # meanwhile and dropped some of it from the left
            written = set(map(id, batch))
            while self._pending and id(self._pending[0]) in written:
                self._pending.popleft()
        for ev in batch:
            RECORDS.labels("true" if ev.allowed else "false").inc()
        return True

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._stop or len(self._pending) >= AUDIT_BATCH, AUDIT_FLUSH_S)
                stop = self._stop
            self.flush()
            if stop:
                return


class AuditServicer(audit_pb2_grpc.AuditServiceServicer):
    def __init__(self, audit: AuditLog, read_sessions: sessionmaker[Session]) -> None:
        self.audit = audit
        self.read_sessions = read_sessions

    @grpc_errors
    def ListAuditEvents(self, request: audit_pb2.ListAuditEventsRequest, context: grpc.ServicerContext) -> audit_pb2.ListAuditEventsResponse:
        limit = request.limit or DEFAULT_LIMIT
        if not 0 < limit <= MAX_LIMIT:
            raise InvalidArgument(f"limit: must be 1..{MAX_LIMIT}, got {request.limit}", field="limit")
        for name, value in (("since", request.since), ("until", request.until)):
            if not math.isfinite(value) or value < 0:
                raise InvalidArgument(f"{name}: seconds since the epoch, not {value}", field=name)
        if request.before_id < 0:
            raise InvalidArgument("before_id: must not be negative", field="before_id")
        # as every request's text: a NUL is a store error on PostgreSQL (INTERNAL), and no record holds more than
        # its column (record() writes a NUL as \x00 and cuts there)
        request_checks.text_field(request.principal, "principal", AUDIT_PRINCIPAL_CHARS)
        request_checks.text_field(request.object, "object", AUDIT_OBJECT_CHARS)
        self.audit.flush()  # what was just done is in the answer
        with transaction(self.read_sessions) as s:
            rows = repo.list_audit_events(s, principal=request.principal, obj=request.object, since=request.since,
                                          until=request.until, denied_only=request.denied_only, limit=limit,
                                          before_id=request.before_id)
        return audit_pb2.ListAuditEventsResponse(events=[audit_pb2.AuditEvent(
            id=e.id, at=e.at, principal=e.principal, via=e.via, method=e.method, object=e.object, allowed=e.allowed,
            code=e.code, message=e.message) for e in rows])


def code_name(context: grpc.ServicerContext, failed: bool) -> str:
    """How a call ended, as its status code's name."""
    code = context.code() if hasattr(context, "code") else None
    if code is None:
        return "UNKNOWN" if failed else "OK"
    return str(code.name) if hasattr(code, "name") else str(code)

