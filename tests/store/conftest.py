"""Store fixtures: every store test runs on SQLite and on PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from peloton.store import db
from tests.dbutil import postgres_database


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database (no schema)."""
    if request.param == "sqlite":
        yield db.default_sqlite_url(tmp_path / "data")
    else:
        with postgres_database() as url:
            yield url


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    db.upgrade(db_url)
    eng = db.make_engine(db_url)
    try:
        yield eng
    finally:
        eng.dispose()


@pytest.fixture
def sessions(engine: Engine) -> sessionmaker[Session]:
    """A sessionmaker on a database migrated to head."""
    return db.make_sessions(engine)
