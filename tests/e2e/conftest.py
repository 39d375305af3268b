from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.dbutil import drop_postgres_db, fresh_postgres_url
from tests.e2e.harness import Daemon


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/peloton.db"
        return
    url = fresh_postgres_url()
    try:
        yield url
    finally:
        drop_postgres_db(url)


@pytest.fixture
def daemon(db_url: str, tmp_path: Path) -> Iterator[Daemon]:
    d = Daemon(tmp_path / "data", db_url)
    d.start()
    try:
        yield d
    finally:
        d.stop()
        running = d.data_dir / "local"
        _ = running
