"""Store fixtures: every store test runs on SQLite and on PostgreSQL."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from peloton.domain.resources import Resources
from peloton.hostmgr.sim.backend import SimSettings
from peloton.server import Daemon
from peloton.settings import ServerConfig
from peloton.store import db
from tests.dbutil import postgres_database


@pytest.fixture(scope="session")
def migrated_sqlite_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite database migrated to head, copied for each test that asks for `engine` (migrating each one took 0.4
    to 0.6 s, a copy takes next to nothing)."""
    url = db.default_sqlite_url(tmp_path_factory.mktemp("migrated") / "data")
    db.upgrade(url)  # its engine is disposed, so the WAL is checkpointed into the file: the file alone is the database
    path = db.sqlite_path(url)
    assert path is not None
    return path


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database (no schema); for a test that asks for `engine`, one already at the schema's head."""
    migrated = "engine" in request.fixturenames
    if request.param == "sqlite":
        url = db.default_sqlite_url(tmp_path / "data")
        if migrated:
            path = db.sqlite_path(url)
            assert path is not None
            shutil.copyfile(request.getfixturevalue("migrated_sqlite_file"), path)
        yield url
    else:
        with postgres_database(migrated=migrated) as url:
            yield url


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    db.upgrade(db_url)  # at head already (db_url): this checks it, and tightens a SQLite file's mode
    eng = db.make_engine(db_url)
    try:
        yield eng
    finally:
        eng.dispose()


@pytest.fixture
def sessions(engine: Engine) -> sessionmaker[Session]:
    """A sessionmaker on a database migrated to head."""
    return db.make_sessions(engine)


@pytest.fixture
def daemon(db_url: str, tmp_path: Path) -> Iterator[Daemon]:
    """A whole daemon in this process on the sim backend (2 hosts of 8 CPUs, 8 GiB, 2 GPUs), on `db_url`."""
    d = Daemon(ServerConfig(listen="127.0.0.1:0", db_url=db_url, data_dir=tmp_path / "data", metrics_listen="",
                            backend="sim", unix_socket="",
                            sim=SimSettings(hosts=2, resources=Resources(cpu=8, mem=8192, gpu=2), racks=1)))
    d.start()
    try:
        yield d
    finally:
        d.stop()
