"""The uids allocated to principals (run_as.py, repo's task_uids): one per principal, one principal per uid, kept
for good, skipping the host's accounts; concurrent first jobs of new principals never share one. SQLite and
PostgreSQL."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from peloton.errors import AlreadyExists, FailedPrecondition
from peloton.jobmgr.manager import JobManager
from peloton.security.unix_accounts import host_has_id
from peloton.store import db, repo
from tests.unit.test_spawner_faults import _run


def _manager(sessions: sessionmaker[Session]) -> JobManager:
    stub: Any = None  # allocation talks to the store only
    return JobManager(sessions, sessions, stub, stub)


def test_a_principal_keeps_its_uid_and_two_never_share_one(sessions: sessionmaker[Session]) -> None:
    jm = _manager(sessions)
    lo = 70000
    a = jm.task_uid("alice", (lo, lo + 99))
    assert a == lo and jm.task_uid("alice", (lo, lo + 99)) == a
    b = jm.task_uid("bob", (lo, lo + 99))
    assert b == lo + 1
    # a restarted daemon (a new manager, nothing cached) finds the same uids in the store
    again = _manager(sessions)
    assert again.task_uid("bob", (lo, lo + 99)) == b and again.task_uid("alice", (lo, lo + 99)) == a
    with db.transaction(sessions) as s:
        assert repo.task_uids_taken(s, lo, lo + 99) == {a, b}
        with pytest.raises(AlreadyExists):
            repo.insert_task_uid(s, "carol", a, 0.0)  # a uid is one principal's


def test_the_hosts_accounts_are_skipped_and_a_full_range_is_named(sessions: sessionmaker[Session]) -> None:
    jm = _manager(sessions)
    assert host_has_id(65534)  # nobody (and nogroup) on every Debian
    assert jm.task_uid("alice", (65534, 65536)) == 65535
    assert jm.task_uid("bob", (65534, 65536)) == 65536
    with pytest.raises(FailedPrecondition, match=r"task.user: no uid of --task-uid-range 65534-65536 is free for "
                                                 r"carol \(2 allocated"):
        jm.task_uid("carol", (65534, 65536))


def test_concurrent_first_jobs_of_new_principals_get_distinct_uids(sessions: sessionmaker[Session]) -> None:
    managers = [_manager(sessions) for _ in range(4)]  # as if four daemons' requests raced (and threads of one)
    got: dict[str, set[int]] = {}
    errors: list[BaseException] = []
    lock = threading.Lock()

    def allocate(i: int) -> None:
        try:
            for n in range(5):
                who = f"p{n}"
                uid = managers[i].task_uid(who, (80000, 80999))
                with lock:
                    got.setdefault(who, set()).add(uid)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=allocate, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert all(len(uids) == 1 for uids in got.values()), got  # each principal one uid, whoever asked
    assert len({next(iter(u)) for u in got.values()}) == 5  # and no two share one


def test_no_uid_is_allocated_while_the_user_database_cannot_answer(engine: Any, db_url: str,
                                                                   tmp_path: Path) -> None:
    """Python's pwd and grp raise KeyError for "no such entry" and for "could not look" alike: during an LDAP or
    sssd outage (here, made real, a process out of descriptors, which cannot open /etc/passwd) every uid looked
    free, so a principal's first job could be given an LDAP account's uid, kept for good, whose tasks the spawner
    then refuses. Now the create fails for now (UNAVAILABLE, saying why) and nothing is allocated; once the
    database answers, the allocation goes on."""
    # No lookup before the descriptors run out: this host's last source (libnss_systemd), once loaded, answers
    # "not found" without a descriptor, and a merged NOTFOUND is all glibc reports; unloadable now, it cannot
    # answer, as an unreachable sss or ldap, the last source where it matters, cannot.
    out = _run(f"""
from peloton.errors import Unavailable
from peloton.jobmgr.manager import JobManager
from peloton.security.unix_accounts import host_has_id
from peloton.store import db, repo
sessions = db.make_sessions(db.make_engine({db_url!r}))
jm = JobManager(sessions, sessions, None, None)
with db.transaction(sessions) as s:  # the store's connection open before the descriptors run out; no user
    first = sorted(repo.task_uids_taken(s, 70000, 70099))  # looked up yet (below)
starved()
try:
    during = jm.task_uid("bob", (70000, 70099))
except Unavailable as e:
    during = {{"unavailable": e.message, "field": e.field}}
try:
    looked = host_has_id(70050)
except Unavailable as e:
    looked = "unavailable"
fed()
with db.transaction(sessions) as s:
    taken = sorted(repo.task_uids_taken(s, 70000, 70099))
print(json.dumps({{"first": first, "during": during, "looked": looked, "taken": taken,
                  "after": jm.task_uid("bob", (70000, 70099)), "free": host_has_id(70050),
                  "nobody": host_has_id(65534)}}))
""", tmp_path)
    assert out["first"] == [], out
    assert isinstance(out["during"], dict) and out["during"]["field"] == "task.user", out
    assert out["during"]["unavailable"].startswith(
        "task.user: this host's user database could not say whether uid 70000 is an account's (getpwuid_r: Too "
        "many open files), so no uid is allocated now"), out
    assert out["looked"] == "unavailable" and out["taken"] == [], out  # nothing allocated meanwhile
    assert out["after"] == 70000 and out["free"] is False and out["nobody"] is True, out
