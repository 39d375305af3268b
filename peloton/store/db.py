"""Engines, sessions and migrations. SQLite is configured explicitly (WAL, foreign keys, busy timeout,
BEGIN IMMEDIATE for writers); PostgreSQL through psycopg2."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker


def default_sqlite_url(data_dir: Path) -> str:
    raise NotImplementedError


def make_engine(url: str) -> Engine:
    raise NotImplementedError


def make_sessions(engine: Engine) -> sessionmaker[Session]:
    raise NotImplementedError


@contextlib.contextmanager
def transaction(sessions: sessionmaker[Session]) -> Iterator[Session]:
    """One write transaction: commit on success, rollback on error. On SQLite it begins IMMEDIATE so two
    writers never deadlock on lock upgrade."""
    raise NotImplementedError
    yield  # pragma: no cover


def upgrade(url: str, revision: str = "head") -> None:
    """Apply the Alembic chain in migrations/ (idempotent)."""
    raise NotImplementedError


def downgrade(url: str, revision: str) -> None:
    raise NotImplementedError


def current_revision(url: str) -> str | None:
    raise NotImplementedError
