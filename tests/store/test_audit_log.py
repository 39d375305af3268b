"""The audit log's writer (api/audit.py) on both stores: flushes that run at once (its thread's, and a listing's
read-your-writes one) write every record exactly once."""

from __future__ import annotations

import threading

from sqlalchemy.orm import Session, sessionmaker

from peloton.api.audit import AuditLog
from peloton.store import repo
from peloton.store.db import transaction

RECORDS = 600


def test_flushes_at_once_write_each_record_once(sessions: sessionmaker[Session]) -> None:
    audit = AuditLog(sessions)
    audit.start()  # its own thread flushes too, every AUDIT_FLUSH_S
    done = threading.Event()

    def record(who: str) -> None:
        for i in range(RECORDS // 3):
            audit.record(who, "token", "/peloton.v1.JobService/StopJob", f"job-{i}", False, "RESOURCE_EXHAUSTED",
                         f"{who} {i}")

    def flush() -> None:
        while not done.is_set():
            audit.flush()

    recorders = [threading.Thread(target=record, args=(w,)) for w in ("alice", "bob", "carol")]
    flushers = [threading.Thread(target=flush) for _ in range(3)]
    for t in flushers + recorders:
        t.start()
    for t in recorders:
        t.join(60)
    done.set()
    for t in flushers:
        t.join(60)
    assert audit.flush()
    audit.stop()
    with transaction(sessions) as s:
        rows = repo.list_audit_events(s, limit=10 * RECORDS)
    messages = [r.message for r in rows]
    assert len(messages) == len(set(messages)), f"{len(messages) - len(set(messages))} records written twice"
    assert len(messages) == RECORDS, f"{RECORDS - len(set(messages))} records lost"


def test_a_record_of_text_no_store_can_hold_does_not_hold_up_the_others(sessions: sessionmaker[Session]) -> None:
    """A lone surrogate (text decoded with surrogateescape: a path, a process's output) cannot be encoded for
    either store; such a record failed its batch at every flush, and every record after it waited until the queue
    overflowed and dropped them. It is written with the surrogate escaped, and the others with it."""
    audit = AuditLog(sessions)
    audit.record("alice", "token", "/peloton.v1.JobService/StopJob", "job-\udcff", False, "NOT_FOUND",
                 "no such file: /data/\udce9t\udce9")
    audit.record("bob\udc80", "token", "/peloton.v1.JobService/StopJob", "job-2", True, "OK")
    assert audit.flush()
    with transaction(sessions) as s:
        rows = sorted(repo.list_audit_events(s, limit=10), key=lambda r: r.principal)
    assert [(r.principal, r.object, r.message) for r in rows] == [
        ("alice", "job-\\udcff", "no such file: /data/\\udce9t\\udce9"), ("bob\\udc80", "job-2", "")]
