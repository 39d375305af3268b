"""The store's connections find out that PostgreSQL went away without a word (its host lost power, a partition):
a statement whose request or reply the network swallows fails within the store's TCP limits (db.STORE_TCP_*), as
an unavailable store, instead of waiting for the kernel's retransmissions (~15 minutes) or for ever. Packets
between one connection and the server are dropped with iptables (root): the server stays up for everything else.
PostgreSQL only: a SQLite store is a local file, with no network to go silent."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import text

from peloton.store import db
from tests.dbutil import postgres_database

IPTABLES = shutil.which("iptables", path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")
needs_iptables = pytest.mark.skipif(IPTABLES is None or os.geteuid() != 0,
                                    reason="needs root and iptables (apt-get install iptables) to drop packets")


@contextmanager
def _replies_dropped(client_port: int) -> Iterator[None]:
    """Everything the server sends to the connection at `client_port` is lost (its ACKs too)."""
    rule = ["INPUT", "-i", "lo", "-p", "tcp", "--sport", "5432", "--dport", str(client_port), "-j", "DROP"]
    assert IPTABLES is not None
    subprocess.run([IPTABLES, "-I", *rule], check=True)
    try:
        yield
    finally:
        subprocess.run([IPTABLES, "-D", *rule], check=True)


def _run(conn: Any, sql: str, out: list[Any]) -> None:
    began = time.monotonic()
    try:
        conn.execute(text(sql)).all()
        out.append(("ok", time.monotonic() - began))
    except Exception as e:  # noqa: BLE001 - what it fails with is the point
        out.append((e, time.monotonic() - began))


@needs_iptables
@pytest.mark.parametrize("case", ["request lost", "reply lost"])
def test_a_store_connection_whose_server_went_silent_fails_in_bounded_time(case: str,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """`request lost`: the statement is sent and never acknowledged (TCP_USER_TIMEOUT bounds it). `reply lost`:
    the statement was received (acknowledged) and is running when the server's host goes silent: nothing of
    ours is unacknowledged, so only keepalive probes, unanswered, can tell."""
    monkeypatch.setattr(db, "STORE_TCP_USER_TIMEOUT_MS", 2000)
    monkeypatch.setattr(db, "STORE_KEEPALIVE", (1, 1, 2))
    with postgres_database() as url:
        engine = db.make_engine(url)
        try:
            with engine.connect() as conn:
                port = int(conn.execute(text("SELECT inet_client_port()")).scalar_one())
                out: list[Any] = []
                if case == "request lost":
                    with _replies_dropped(port):
                        t = threading.Thread(target=_run, args=(conn, "SELECT 1", out), daemon=True)
                        t.start()
                        t.join(30)
                else:
                    t = threading.Thread(target=_run, args=(conn, "SELECT pg_sleep(2)", out), daemon=True)
                    t.start()
                    time.sleep(0.5)  # sent, acknowledged, running
                    with _replies_dropped(port):
                        t.join(30)
                t.join(60)  # (the rule is gone: a connection that still waited gets its reply now)
                assert out, "still waiting"
                (result, _), = out
                assert result != "ok" and db.is_unavailable(result), result  # found out while the replies were lost
                conn.invalidate()
        finally:
            engine.dispose()


def test_the_tcp_limits_are_the_stores_own_unless_the_url_sets_them() -> None:
    with postgres_database() as url:
        for query, idle in (("", str(db.STORE_KEEPALIVE[0])), ("?keepalives_idle=60", "60")):
            engine = db.make_engine(url + query)
            try:
                with engine.connect() as conn:
                    dsn = conn.connection.dbapi_connection.get_dsn_parameters()  # type: ignore[union-attr]
                    assert dsn["keepalives"] == "1" and dsn["keepalives_idle"] == idle, dsn
                    assert dsn["tcp_user_timeout"] == str(db.STORE_TCP_USER_TIMEOUT_MS), dsn
            finally:
                engine.dispose()
