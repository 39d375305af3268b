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
from concurrent.futures import Future, ThreadPoolExecutor

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.pool import NullPool

from peloton.store import db

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


def fresh_postgres_url(template: str = "") -> str:
    """CREATE a new database peloton_test_<hex> (empty, or a copy of the database `template`) and return its URL."""
    name = _TEST_DB_PREFIX + uuid.uuid4().hex[:16]
    engine = _admin_engine()
    try:
        with engine.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else "")))
    finally:
        engine.dispose()
    return make_url(PG_ADMIN_URL).set(database=name).render_as_string(hide_password=False)


_migrated_template: str = ""  # this process's database migrated to head, copied by `postgres_database(migrated=True)`


def _migrated_template_name() -> str:
    """Migrating each test's database took 0.2 to 0.5 s; copying one migrated database (CREATE DATABASE ...
    TEMPLATE) takes under 0.1 s. The template is made once per process (nothing else connects to it, as a copy
    needs) and dropped with the others (`wait_for_drops`)."""
    global _migrated_template
    if not _migrated_template:
        url = fresh_postgres_url()
        db.upgrade(url)  # its engine is disposed: no connection is left on the template
        _migrated_template = str(make_url(url).database)
    return _migrated_template


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


# DROP DATABASE makes PostgreSQL checkpoint (0.2 to 1 s, waited on): the test suite drops in a thread of its own
# instead (`drop_in_background`), so the next test need not wait. Benchmarks drop in line: no checkpoint of an
# earlier database may land in a measurement.
_dropper: ThreadPoolExecutor | None = None
_drops: list[Future[None]] = []


def drop_in_background() -> None:
    """From now on `postgres_database` drops its database in a background thread (`wait_for_drops` waits)."""
    global _dropper
    _dropper = _dropper or ThreadPoolExecutor(1, thread_name_prefix="pg-drop")


def wait_for_drops() -> None:
    """Drop the migrated template (if any) and wait until every background drop is done; the first that failed
    raises."""
    global _migrated_template
    if _migrated_template:
        drop_postgres_db(make_url(PG_ADMIN_URL).set(database=_migrated_template).render_as_string(hide_password=False))
        _migrated_template = ""
    while _drops:
        _drops.pop(0).result()


@contextlib.contextmanager
def postgres_database(migrated: bool = False) -> Iterator[str]:
    """A fresh PostgreSQL database for the duration of the block (fails/skips as `require_postgres`): empty, or with
    `migrated` at the schema's head (as `db.upgrade` leaves it)."""
    require_postgres()
    url = fresh_postgres_url(_migrated_template_name() if migrated else "")
    try:
        yield url
    finally:
        if _dropper is None:
            drop_postgres_db(url)
        else:
            _drops.append(_dropper.submit(drop_postgres_db, url))


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
