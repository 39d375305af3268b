"""Which daemon a CLI command talks to, and how: flags, then environment, then the config file's context."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from peloton.cli.connection import resolve
from peloton.errors import InvalidArgument

CONFIG = """
current-context = "prod"

[contexts.prod]
address = "prod.example.com:5391"
tls-ca = "ca.pem"
client-cert = "~/prod/client.pem"
client-key = "/etc/peloton/client-key.pem"

[contexts.dev]
address = "127.0.0.1:5391"
"""


def args(**kw: str | None) -> argparse.Namespace:
    base: dict[str, str | None] = {"address": None, "context": None, "tls_ca": None, "client_cert": None,
                                   "client_key": None}
    return argparse.Namespace(**{**base, **kw})


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    p = tmp_path / "config.toml"
    p.write_text(CONFIG)
    monkeypatch.setenv("PELOTON_CONFIG", str(p))
    monkeypatch.setenv("HOME", "/home/u")
    monkeypatch.setenv("PELOTON_DATA_DIR", str(p.parent / "no-daemon-here"))
    for v in ("PELOTON_ADDRESS", "PELOTON_CONTEXT", "PELOTON_TLS_CA", "PELOTON_CLIENT_CERT", "PELOTON_CLIENT_KEY"):
        monkeypatch.delenv(v, raising=False)
    return p


def test_the_current_context(config: Path) -> None:
    t = resolve(args())
    assert (t.address, t.context, t.tls) == ("prod.example.com:5391", "prod", True)
    assert t.tls_ca == str(config.parent / "ca.pem")  # relative to the config file
    assert t.client_cert == "/home/u/prod/client.pem" and t.client_key == "/etc/peloton/client-key.pem"


def test_flags_then_environment_then_context(config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PELOTON_ADDRESS", "env:1")
    assert resolve(args()).address == "env:1"
    assert resolve(args(address="flag:2")).address == "flag:2"
    monkeypatch.setenv("PELOTON_CONTEXT", "dev")
    t = resolve(args(address=None))
    assert t.context == "dev" and t.address == "env:1" and not t.tls
    assert resolve(args(context="prod")).context == "prod"  # the flag over the environment


def test_no_config_file_means_the_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PELOTON_CONFIG", str(tmp_path / "none.toml"))
    monkeypatch.setenv("PELOTON_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("PELOTON_ADDRESS", raising=False)
    monkeypatch.delenv("PELOTON_CONTEXT", raising=False)
    t = resolve(args())
    assert (t.address, t.context, t.tls) == ("127.0.0.1:5391", None, False)
    with pytest.raises(InvalidArgument, match="--context: no context 'x' in .*none.toml .contexts: none."):
        resolve(args(context="x"))


@pytest.mark.parametrize(("text", "error"), [
    ("current-context = 'nope'\n[contexts.a]\naddress = 'x:1'\n", "current-context: no context 'nope'"),
    ("[contexts.a]\naddres = 'x:1'\n", r"contexts.a.addres: unknown key"),
    ("[contexts.a]\naddress = 5\n", "contexts.a.address: must be a non-empty string"),
    ("colour = 'blue'\n", "unknown key 'colour'"),
    ("[contexts\n", "not valid TOML"),
])
def test_a_bad_config_file_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, error: str) -> None:
    p = tmp_path / "config.toml"
    p.write_text(text)
    monkeypatch.setenv("PELOTON_CONFIG", str(p))
    with pytest.raises(InvalidArgument, match=error) as e:
        resolve(args())
    assert str(p) in e.value.message


def test_a_client_certificate_needs_its_key(config: Path) -> None:
    with pytest.raises(InvalidArgument, match="--client-cert, --client-key: give both"):
        resolve(args(context="dev", client_cert="c.pem"))


def test_the_daemons_unix_socket_is_the_default_when_it_may_be_opened(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    monkeypatch.setenv("PELOTON_CONFIG", str(tmp_path / "none.toml"))
    monkeypatch.setenv("PELOTON_DATA_DIR", str(tmp_path))
    for v in ("PELOTON_ADDRESS", "PELOTON_CONTEXT"):
        monkeypatch.delenv(v, raising=False)
    assert resolve(args()).address == "127.0.0.1:5391"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(tmp_path / "peloton.sock"))
        (tmp_path / "peloton.sock").chmod(0o600)
        assert resolve(args()).address == f"unix:{tmp_path / 'peloton.sock'}"
        assert resolve(args(address="127.0.0.1:7")).address == "127.0.0.1:7"  # said otherwise: as said
        (tmp_path / "peloton.sock").chmod(0o000)  # another user's daemon (root would still be allowed)
        expected = f"unix:{tmp_path / 'peloton.sock'}" if os.geteuid() == 0 else "127.0.0.1:5391"
        assert resolve(args()).address == expected


def test_a_daemon_not_found_by_default_is_told_where_the_socket_was_looked_for(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No address anywhere and no socket in the data dir: the CLI tries 127.0.0.1:5391. A daemon started with a
    --data-dir and --listen of its own (the tutorial's, as root) was then reported as not running at 5391 alone;
    the error names the socket it looked for and $PELOTON_DATA_DIR. A real call to a port nobody listens on."""
    import socket

    from peloton.api.v1 import job_pb2
    from peloton.cli.client import Client
    from peloton.errors import Unavailable

    monkeypatch.setenv("PELOTON_CONFIG", str(tmp_path / "none.toml"))
    monkeypatch.setenv("PELOTON_DATA_DIR", str(tmp_path / "data"))
    for v in ("PELOTON_ADDRESS", "PELOTON_CONTEXT", "PELOTON_TLS_CA", "PELOTON_CLIENT_CERT", "PELOTON_CLIENT_KEY"):
        monkeypatch.delenv(v, raising=False)
    t = resolve(args())
    assert t.address == "127.0.0.1:5391" and t.searched == str(tmp_path / "data" / "peloton.sock")
    assert resolve(args(address="127.0.0.1:5391")).searched is None  # asked for: nothing was looked for
    with socket.socket() as s:  # a port that refuses, instead of 5391 (another daemon may be there)
        s.bind(("127.0.0.1", 0))
        t.address = f"127.0.0.1:{s.getsockname()[1]}"
    c = Client(t, timeout=5)
    with pytest.raises(Unavailable) as e:
        c.call(c.jobs.ListJobs, job_pb2.ListJobsRequest())
    assert f"no daemon socket at {tmp_path / 'data' / 'peloton.sock'}" in e.value.message  # what the CLI prints
    assert "export PELOTON_DATA_DIR=DIR" in e.value.message
