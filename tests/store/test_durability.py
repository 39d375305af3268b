"""What a commit promises (`--store-durability`): full syncs every commit on either store, relaxed does not; the
setting reaches every connection of the engine, whatever the server's own default."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from peloton.cli.groups.server import STORE_DURABILITIES
from peloton.errors import InvalidArgument
from peloton.store import db

# (SQLite's PRAGMA synchronous: 1 NORMAL, 2 FULL; PostgreSQL's synchronous_commit)
EXPECTED = {("sqlite", db.FULL): "2", ("sqlite", db.RELAXED): "1",
            ("postgresql", db.FULL): "on", ("postgresql", db.RELAXED): "off"}


@pytest.mark.parametrize("durability", db.DURABILITIES)
def test_every_connection_syncs_as_the_setting_says(db_url: str, durability: str) -> None:
    db.upgrade(db_url)
    eng = db.make_engine(db_url, durability=durability)
    kind = "sqlite" if db.sqlite_path(db_url) is not None else "postgresql"
    query = "PRAGMA synchronous" if kind == "sqlite" else "SHOW synchronous_commit"
    try:
        # two connections open at once (so two, not one reused): each is set up on connect, not only the first
        seen = []
        with eng.connect() as a:
            seen.append(str(a.execute(text(query)).scalar()))
            a.commit()  # (SQLite: its writer's BEGIN IMMEDIATE ends here, so the other may begin)
            with eng.connect() as b:
                seen.append(str(b.execute(text(query)).scalar()))
        assert seen == [EXPECTED[kind, durability]] * 2
    finally:
        eng.dispose()


def test_the_default_is_full_and_a_bad_value_is_named(db_url: str) -> None:
    eng = db.make_engine(db_url)
    kind = "sqlite" if db.sqlite_path(db_url) is not None else "postgresql"
    try:
        with eng.connect() as c:
            got = c.execute(text("PRAGMA synchronous" if kind == "sqlite" else "SHOW synchronous_commit")).scalar()
        assert str(got) == EXPECTED[kind, db.FULL]
    finally:
        eng.dispose()
    with pytest.raises(InvalidArgument, match="store durability: expected one of full, relaxed, got 'fast'") as e:
        db.make_engine(db_url, durability="fast")
    assert e.value.field == "store_durability"


def test_the_command_line_offers_the_stores_choices() -> None:
    assert STORE_DURABILITIES == db.DURABILITIES and STORE_DURABILITIES[0] == db.FULL
