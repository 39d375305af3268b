"""Engines, sessions and migrations. SQLite is configured explicitly (WAL, foreign keys, busy timeout,
BEGIN IMMEDIATE for writers); PostgreSQL through psycopg2."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.orm import Session, sessionmaker

import peloton

MIGRATIONS_DIR = Path(peloton.__file__).resolve().parent.parent / "migrations"


def default_sqlite_url(data_dir: Path) -> str:
    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{(data_dir / 'peloton.db').resolve()}"


def _is_sqlite(url: str) -> bool:
    return make_url(url).get_backend_name() == "sqlite"


def _normalize(url: str) -> str:
    """`postgresql://...` means psycopg2 (SQLAlchemy 2.1 would otherwise pick psycopg 3)."""
    u = make_url(url)
    if u.drivername == "postgresql":
        u = u.set(drivername="postgresql+psycopg2")
    return u.render_as_string(hide_password=False)


def make_engine(url: str) -> Engine:
    url = _normalize(url)
    if _is_sqlite(url):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30.0})

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_connection: Any, _record: Any) -> None:
            # Take transaction control away from pysqlite; we emit BEGIN IMMEDIATE ourselves.
            dbapi_connection.isolation_level = None
            cur = dbapi_connection.cursor()
            try:
                cur.execute("PRAGMA journal_mode=WAL")
                cur.execute("PRAGMA foreign_keys=ON")
                cur.execute("PRAGMA busy_timeout=30000")
                cur.execute("PRAGMA synchronous=NORMAL")
            finally:
                cur.close()

        @event.listens_for(engine, "begin")
        def _on_begin(conn: Connection) -> None:
            conn.exec_driver_sql("BEGIN IMMEDIATE")

        return engine
    return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=10)


def make_sessions(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(bind=engine, expire_on_commit=False)


@contextlib.contextmanager
def transaction(sessions: sessionmaker[Session]) -> Iterator[Session]:
    """One write transaction: commit on success, rollback on error. On SQLite it begins IMMEDIATE so two
    writers never deadlock on lock upgrade."""
    s = sessions()
    try:
        yield s
        s.commit()
    except BaseException:
        s.rollback()
        raise
    finally:
        s.close()


def _alembic_config(connection: Connection) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", connection.engine.url.render_as_string(hide_password=False).replace("%", "%%"))
    cfg.attributes["connection"] = connection
    return cfg


@contextlib.contextmanager
def _connection(url: str) -> Iterator[Connection]:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            yield conn
    finally:
        engine.dispose()


def upgrade(url: str, revision: str = "head") -> None:
    """Apply the Alembic chain in migrations/ (idempotent)."""
    with _connection(url) as conn:
        command.upgrade(_alembic_config(conn), revision)
        conn.commit()


def downgrade(url: str, revision: str) -> None:
    with _connection(url) as conn:
        command.downgrade(_alembic_config(conn), revision)
        conn.commit()


def current_revision(url: str) -> str | None:
    with _connection(url) as conn:
        return MigrationContext.configure(conn).get_current_revision()
