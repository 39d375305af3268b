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


@pytest.mark.parametrize(("flag", "address"), [
    ("--listen", "0.0.0.0:5391"), ("--listen", "10.1.2.3:5391"), ("--listen", "[::]:5391"),
    ("--listen", "node-a.example.com:5391"), ("--internal-listen", "0.0.0.0:5393"),
])
def test_an_address_other_machines_reach_needs_insecure(flag: str, address: str) -> None:
    c = cfg(None, None)
    if flag == "--listen":
        c.listen = address
    else:
        c.internal_listen = address
    with pytest.raises(InvalidArgument, match="no TLS or authentication") as e:
        c.check()
    assert e.value.message.startswith(f"{flag}: {address}")
    c.insecure = True
    c.check()  # said explicitly: served (and the log says so loudly)


@pytest.mark.parametrize("address", ["127.0.0.1:5391", "127.0.0.1:0", "localhost:5391", "[::1]:5391"])
def test_local_addresses_need_nothing(address: str) -> None:
    c = cfg(None, None)
    c.listen = address
    c.internal_listen = "unix:/tmp/x.sock"
    c.check()


def test_the_internal_listener_is_served_only_for_a_split_deployment() -> None:
    c = cfg(None, None)
    assert not c.serves_internal()  # one process: the components call each other in process
    c.roles = frozenset({"hostmgr"})
    assert c.serves_internal() and c.internal_address() == "unix:/nonexistent/internal.sock"
    assert c.secret_file() == Path("/nonexistent/internal.secret")
    c.roles = frozenset({"placement"})
    assert not c.serves_internal()  # it calls the others; nothing of it is called
