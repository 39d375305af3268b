"""`peloton certs init`: a CA, a server certificate for the daemon's names, a client certificate; checked with
the `cryptography` library's own verifier, and by a real TLS handshake in test_transport.py."""

from __future__ import annotations

import datetime
import ipaddress
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from cryptography.x509.verification import PolicyBuilder, Store

from peloton.errors import FailedPrecondition, InvalidArgument
from peloton.security import certs


def load(p: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(p.read_bytes())


def test_the_chain_verifies_for_every_server_name(tmp_path: Path) -> None:
    w = certs.init(tmp_path / "c", ["node-a.example.com", "10.1.2.3"], client="alice")
    d = w.directory
    assert set(w.server_names) == {"node-a.example.com", "10.1.2.3", "localhost", "127.0.0.1", "::1"}
    ca, server, client = load(d / "ca.pem"), load(d / "server.pem"), load(d / "client.pem")
    store = Store([ca])
    now = datetime.datetime.now(datetime.UTC)
    for name in ("node-a.example.com", "localhost"):
        PolicyBuilder().store(store).time(now).build_server_verifier(x509.DNSName(name)).verify(server, [])
    for ip in ("10.1.2.3", "127.0.0.1", "::1"):
        PolicyBuilder().store(store).time(now).build_server_verifier(
            x509.IPAddress(ipaddress.ip_address(ip))).verify(server, [])
    with pytest.raises(Exception):  # noqa: B017 - the verifier's own error type
        PolicyBuilder().store(store).time(now).build_server_verifier(x509.DNSName("other.example.com")).verify(
            server, [])
    PolicyBuilder().store(store).time(now).build_client_verifier().verify(client, [])
    assert client.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "alice"
    eku = client.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    for key in ("ca-key.pem", "server-key.pem", "client-key.pem"):
        assert stat.S_IMODE((d / key).stat().st_mode) == 0o600
    assert stat.S_IMODE(d.stat().st_mode) == 0o700


def test_existing_certificates_are_not_replaced_unless_forced(tmp_path: Path) -> None:
    certs.init(tmp_path, [])
    before = (tmp_path / "ca.pem").read_bytes()
    with pytest.raises(FailedPrecondition, match="already holds ca.pem"):
        certs.init(tmp_path, [])
    certs.init(tmp_path, [], force=True)
    assert (tmp_path / "ca.pem").read_bytes() != before


@pytest.mark.parametrize(("names", "client", "flag"), [
    (["bad name"], "admin", "--name"), (["a/b"], "admin", "--name"), (["*.x"], "admin", "--name"),
    ([], "", "--client"), ([], "a b", "--client"), ([], "x" * 65, "--client"),
])
def test_bad_names_are_refused_and_nothing_is_written(tmp_path: Path, names: list[str], client: str,
                                                      flag: str) -> None:
    with pytest.raises(InvalidArgument, match=flag):
        certs.init(tmp_path / "c", names, client=client)
    assert not (tmp_path / "c").exists()
