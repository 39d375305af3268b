"""Shared database helpers for tests: fresh, throw-away PostgreSQL databases.

PostgreSQL is expected at PELOTON_TEST_PG_URL (default postgresql://postgres@127.0.0.1:5432/postgres, trust
auth). When it is unreachable, `require_postgres()` FAILS the test, unless PELOTON_TEST_ALLOW_NO_PG=1 is set,
in which case it skips.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.pool import NullPool

PG_ADMIN_URL = os.environ.get("PELOTON_TEST_PG_URL", "postgresql+psycopg2://postgres@127.0.0.1:5432/postgres")
ALLOW_NO_PG = os.environ.get("PELOTON_TEST_ALLOW_NO_PG") == "1"
_TEST_DB_PREFIX = "peloton_test_"


def _admin_engine() -> Engine:
    return create_engine(
        PG_ADMIN_URL, poolclass=NullPool, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 3}
    )


def postgres_error() -> str | None:
    """None when PostgreSQL answers, else why not."""
    engine = _admin_engine()
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        return None
    except Exception as e:  # noqa: BLE001 - any failure means "not usable"
        return f"{type(e).__name__}: {e}"
    finally:
        engine.dispose()


def require_postgres() -> None:
    """Fail (or, with PELOTON_TEST_ALLOW_NO_PG=1, skip) the current test when PostgreSQL is unreachable."""
    err = postgres_error()
    if err is None:
        return
    msg = f"PostgreSQL at {PG_ADMIN_URL} is unreachable ({err})"
    if ALLOW_NO_PG:
        pytest.skip(msg + "; skipped because PELOTON_TEST_ALLOW_NO_PG=1")
    pytest.fail(msg + "; start it or set PELOTON_TEST_ALLOW_NO_PG=1 to skip PostgreSQL tests", pytrace=False)


def fresh_postgres_url() -> str:
    """CREATE a new empty database peloton_test_<hex> and return its URL."""
    name = _TEST_DB_PREFIX + uuid.uuid4().hex[:16]
    engine = _admin_engine()
    try:
        with engine.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    finally:
        engine.dispose()
    return make_url(PG_ADMIN_URL).set(database=name).render_as_string(hide_password=False)


def drop_postgres_db(url: str) -> None:
    """Terminate the database's remaining sessions and DROP it (no error if already gone)."""
    name = make_url(url).database
    if not name or not name.startswith(_TEST_DB_PREFIX):
        raise ValueError(f"refusing to drop {name!r}: not a test database")
    engine = _admin_engine()
    try:
        with engine.connect() as conn:
            conn.execute(
                text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :n AND pid <> pg_backend_pid()"),
                {"n": name},
            )
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
    finally:
        engine.dispose()


@contextlib.contextmanager
def postgres_database() -> Iterator[str]:
    """A fresh PostgreSQL database for the duration of the block (fails/skips as `require_postgres`)."""
    require_postgres()
    url = fresh_postgres_url()
    try:
        yield url
    finally:
        drop_postgres_db(url)


@contextlib.contextmanager
def scratch_database(store: str) -> Iterator[str]:
    """The URL of a throw-away database of this store ("postgresql", or else SQLite in a temporary directory) for
    the duration of the block: what the measuring scripts run on."""
    if store == "postgresql":
        with postgres_database() as u:
            yield u
    else:
        with tempfile.TemporaryDirectory() as d:
            yield f"sqlite:///{d}/b.db"
