"""`peloton certs init DIR`: a private certificate authority, a server certificate for the daemon's names and a
client certificate, for a quick secure set-up (TLS with client certificates: docs/security.md). The `cryptography`
library does the work; keys are ECDSA P-256, written owner-only."""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from peloton.errors import FailedPrecondition, InvalidArgument
from peloton.files import make_dirs

CA_DAYS = 3650
LEAF_DAYS = 825  # what browsers still accept; rotate with `certs init --force` into a new dir
FILES = ("ca.pem", "ca-key.pem", "server.pem", "server-key.pem", "client.pem", "client-key.pem")


@dataclass(frozen=True)
class Written:
    directory: Path
    server_names: tuple[str, ...]
    client_name: str


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "peloton"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _san(names: Sequence[str]) -> x509.SubjectAlternativeName:
    entries: list[x509.GeneralName] = []
    for n in names:
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(n)))
        except ValueError:
            entries.append(x509.DNSName(n))
    return x509.SubjectAlternativeName(entries)


def check_names(names: Sequence[str], client: str) -> None:
    for n in names:
        if not n or len(n) > 253 or any(c.isspace() or c in "/,*" for c in n):
            raise InvalidArgument(f"--name: {n!r} is not a host name or an IP address", field="--name")
    if not client or len(client) > 64 or any(c.isspace() or c in "/,=" for c in client):
        raise InvalidArgument(f"--client: {client!r} is not a principal name (1-64 characters, no spaces, / , =)",
                              field="--client")


def init(directory: Path, names: Sequence[str], client: str = "admin", force: bool = False,
         now: datetime.datetime | None = None) -> Written:
    """Write the six files of FILES into `directory` (created 0700). The server certificate is valid for `names`
    plus localhost, 127.0.0.1 and ::1; the client certificate's common name is the principal `client`."""
    all_names = tuple(dict.fromkeys([*names, "localhost", "127.0.0.1", "::1"]))
    check_names(all_names, client)
    existing = [f for f in FILES if (directory / f).exists()]
    if existing and not force:
        raise FailedPrecondition(f"DIR: {directory} already holds {', '.join(existing)}; use another directory, or "
                                 "--force to replace them (clients of the old CA stop trusting the daemon)",
                                 field="DIR")
    now = now or datetime.datetime.now(datetime.UTC)
    make_dirs(directory)  # 0700, and the missing ones above it (files.py)

    ca_key = _key()
    ca_name = _name("peloton private CA")
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))

    def leaf(common_name: str, usage: x509.ObjectIdentifier, san: x509.SubjectAlternativeName
             ) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        key = _key()
        b = (x509.CertificateBuilder().subject_name(_name(common_name)).issuer_name(ca_name)
             .public_key(key.public_key()).serial_number(x509.random_serial_number())
             .not_valid_before(now - datetime.timedelta(minutes=5))
             .not_valid_after(now + datetime.timedelta(days=LEAF_DAYS))
             .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
             .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
             .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
             .add_extension(san, critical=False))
        return b.sign(ca_key, hashes.SHA256()), key

    server, server_key = leaf(all_names[0], ExtendedKeyUsageOID.SERVER_AUTH, _san(all_names))
    # a client certificate names its holder in the subject's CN, and (RFC 5280 wants a SAN) as a URI
    client_cert, client_key = leaf(client, ExtendedKeyUsageOID.CLIENT_AUTH, x509.SubjectAlternativeName(
        [x509.UniformResourceIdentifier(f"urn:peloton:principal:{client}")]))
    for name, cert, key in (("ca", ca, ca_key), ("server", server, server_key), ("client", client_cert, client_key)):
        _write(directory / f"{name}.pem", cert.public_bytes(serialization.Encoding.PEM), 0o644)
        _write(directory / f"{name}-key.pem", key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()), 0o600)
    return Written(directory, all_names, client)


def _write(path: Path, data: bytes, mode: int) -> None:
    """`path` holds `data` with `mode`: a key 0600 from the moment it exists (a leftover .tmp, which keeps its own
    mode, is removed first); a certificate, public, 0644 whatever the umask."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode & 0o700)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        os.fchmod(f.fileno(), mode)
    os.replace(tmp, path)
