from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.dbutil import postgres_database
from tests.e2e.harness import Daemon, serving


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database. PostgreSQL unreachable: the test fails (skips with PELOTON_TEST_ALLOW_NO_PG=1)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/peloton.db"
        return
    with postgres_database() as url:
        yield url


@pytest.fixture
def daemon(db_url: str, tmp_path: Path) -> Iterator[Daemon]:
    with serving(Daemon(tmp_path / "data", db_url)) as d:
        yield d
