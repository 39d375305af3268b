"""The daemon's configuration checks that need no daemon: the job manager's writers per store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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
    with pytest.raises(InvalidArgument, match="can be reached from other machines") as e:
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


def test_mutual_tls_may_serve_other_machines_and_its_files_are_checked(tmp_path: Path) -> None:
    from peloton import certs

    certs.init(tmp_path, [])
    c = cfg(None, None)
    c.listen = "0.0.0.0:5391"
    c.tls_cert, c.tls_key = tmp_path / "server.pem", tmp_path / "server-key.pem"
    with pytest.raises(InvalidArgument, match="--listen: .*no TLS with client certificates"):
        c.check()  # TLS alone authenticates nobody
    c.tls_client_ca = tmp_path / "ca.pem"
    c.check()
    c.metrics_tls = True
    c.check()
    c.internal_listen = "0.0.0.0:5393"  # the internal services have no TLS yet
    with pytest.raises(InvalidArgument, match="--internal-listen: .*in clear"):
        c.check()


@pytest.mark.parametrize(("change", "error"), [
    (lambda c, d: setattr(c, "tls_key", None), "--tls-cert, --tls-key: give both or neither"),
    (lambda c, d: (setattr(c, "tls_cert", None), setattr(c, "tls_key", None)), "--tls-client-ca: needs --tls-cert"),
    (lambda c, d: setattr(c, "tls_cert", d / "missing.pem"), "--tls-cert: .*missing.pem is not a readable file"),
    (lambda c, d: (d / "server-key.pem").chmod(0o644), "--tls-key: .*readable by others"),
    (lambda c, d: setattr(c, "tls_cert", d / "ca.pem"), "--tls-cert: .*are not a PEM certificate and its key"),
    (lambda c, d: setattr(c, "tls_client_ca", d / "server-key.pem"), "--tls-client-ca: .*not a PEM CA"),
])
def test_tls_settings_that_cannot_work_are_refused_by_flag(tmp_path: Path, change: Any, error: str) -> None:
    from peloton import certs

    certs.init(tmp_path, [])
    c = cfg(None, None)
    c.tls_cert, c.tls_key, c.tls_client_ca = tmp_path / "server.pem", tmp_path / "server-key.pem", tmp_path / "ca.pem"
    change(c, tmp_path)
    with pytest.raises(InvalidArgument, match=error):
        c.check()


def test_the_unix_socket_of_the_api() -> None:
    c = cfg(None, None)
    assert c.unix_socket_path() == Path("/nonexistent/peloton.sock")  # the default, in the data dir
    c.unix_socket = ""
    assert c.unix_socket_path() is None  # none
    c.unix_socket = "/run/peloton/api.sock"
    assert c.unix_socket_path() == Path("/run/peloton/api.sock")


def test_a_data_dir_too_deep_for_the_default_socket_still_serves_tcp(tmp_path: Path) -> None:
    from peloton.server import Daemon

    deep = tmp_path / ("d" * 120)
    d = Daemon(ServerConfig(listen="127.0.0.1:0", db_url=None, data_dir=deep, metrics_listen="", backend="sim"))
    d.start()
    try:
        assert d.unix_socket is None and d.address.startswith("127.0.0.1:")
    finally:
        d.stop()
    given = ServerConfig(listen="127.0.0.1:0", db_url=None, data_dir=tmp_path / "d2", metrics_listen="",
                         backend="sim", unix_socket=str(deep / "api.sock"))
    with pytest.raises(InvalidArgument, match="--unix-socket: .* is longer than a Unix socket's 107 bytes"):
        Daemon(given).start()


@pytest.mark.parametrize(("field", "value", "error"), [
    ("rate_limit", -1.0, "--rate-limit: must be 0"), ("rate_limit", float("nan"), "--rate-limit"),
    ("max_waiting_jobs", -5, "--max-waiting-jobs: must be 0"),
])
def test_bounds_that_make_no_sense_are_refused(field: str, value: float, error: str) -> None:
    c = cfg(None, None)
    setattr(c, field, value)
    with pytest.raises(InvalidArgument, match=error):
        c.check()
