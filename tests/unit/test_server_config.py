"""The daemon's configuration checks that need no daemon: the job manager's writers per store."""

from __future__ import annotations

from pathlib import Path

import pytest

from peloton.errors import InvalidArgument
from peloton.server import MAX_WRITERS, WRITERS_PG, ServerConfig

PG = "postgresql://postgres@127.0.0.1/peloton"


def cfg(db_url: str | None, writers: int | None) -> ServerConfig:
    return ServerConfig(listen="127.0.0.1:0", db_url=db_url, data_dir=Path("/nonexistent"), jobmgr_writers=writers)


@pytest.mark.parametrize(("db_url", "writers", "expected"), [
    (None, None, 1),  # the embedded SQLite default
    ("sqlite:////tmp/x.db", None, 1),
    (PG, None, WRITERS_PG),
    (PG, 1, 1),
    (PG, MAX_WRITERS, MAX_WRITERS),
    ("sqlite:////tmp/x.db", 1, 1),
])
def test_writers_per_store(db_url: str | None, writers: int | None, expected: int) -> None:
    c = cfg(db_url, writers)
    c.check()
    assert c.writers() == expected


@pytest.mark.parametrize(("db_url", "writers", "error"), [
    (None, 2, "more than one writer needs PostgreSQL"),
    ("sqlite:////tmp/x.db", 4, "more than one writer needs PostgreSQL"),
    (PG, 0, "must be between 1 and 16, got 0"),
    (PG, MAX_WRITERS + 1, "must be between 1 and 16"),
])
def test_writers_that_cannot_work_are_refused_by_name(db_url: str | None, writers: int, error: str) -> None:
    with pytest.raises(InvalidArgument, match=error) as e:
        cfg(db_url, writers).check()
    assert e.value.message.startswith("--jobmgr-writers:")
