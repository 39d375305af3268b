"""The web console of a daemon whose API has mutual TLS, over HTTP from the standard library (no browser: a
browser trusting a test CA and presenting client certificates is not set up here): HTTPS with the daemon's own
certificate, login with a client certificate (the roles the API gives that certificate), with a token, and with a
one-time link of `peloton cluster ui-login` over the owner-only socket; and the refusals: no or a wrong client
certificate, a certificate whose name has no role, a session cookie with another certificate, a viewer's stop, a
used, an expired and a forged link, ui-login by anyone but the daemon's user (docs/ui.md, docs/security.md)."""

from __future__ import annotations

import datetime
import http.client
import re
import ssl
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from peloton.console.sessions import MAX_SESSIONS, MAX_SESSIONS_PER_PRINCIPAL
from peloton.security.identity import add_token
from tests.e2e.console import Answer, ConsoleDaemon, EventStream
from tests.e2e.harness import PELOTON, serving

pytestmark = pytest.mark.e2e
TTL_S = 5  # --ui-login-ttl: long enough for a link to be used at once, short enough to wait out


@dataclass
class TlsConsoleDaemon(ConsoleDaemon):
    certs: Path = Path()
    tokens: dict[str, str] = field(default_factory=dict)

    def server_args(self) -> list[str]:
        """The console on every interface (the later --ui-listen wins), without --insecure: HTTPS with client
        certificates may be served where other machines reach it."""
        c = self.certs
        return [*super().server_args(), "--tls-cert", str(c / "server.pem"), "--tls-key", str(c / "server-key.pem"),
                "--tls-client-ca", str(c / "ca.pem"), "--ui-login-ttl", str(TTL_S), "--ui-listen", "0.0.0.0:0"]


def client_cert(certs: Path, name: str) -> tuple[Path, Path]:
    """A client certificate of the test CA (`peloton certs init`'s) for `name`."""
    ca = x509.load_pem_x509_certificate((certs / "ca.pem").read_bytes())
    ca_key: Any = serialization.load_pem_private_key((certs / "ca-key.pem").read_bytes(), None)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(ca.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem, key_pem = certs / f"{name}.pem", certs / f"{name}-key.pem"
    pem.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_pem.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    return pem, key_pem


class TlsBrowser:
    """A browser that trusts the test CA and presents `cert` (or no certificate): the session cookie kept by
    hand, redirects not followed."""

    def __init__(self, url: str, ca: Path, cert: tuple[Path, Path] | None) -> None:
        u = urlsplit(url)
        self.host, self.port = u.hostname or "127.0.0.1", u.port or 443
        self.origin = f"https://{self.host}:{self.port}"
        self.ctx = ssl.create_default_context(cafile=str(ca))
        if cert is not None:
            self.ctx.load_cert_chain(*cert)
        self.cookie = ""

    def request(self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None) -> Answer:
        c = http.client.HTTPSConnection(self.host, self.port, context=self.ctx, timeout=20)
        h = {"Host": f"{self.host}:{self.port}", **({"Cookie": self.cookie} if self.cookie else {})}
        if method == "POST":
            h |= {"Origin": self.origin, "Content-Type": "application/x-www-form-urlencoded"}
        h.update(headers or {})
        try:
            c.request(method, path, body=body, headers=h)
            r = c.getresponse()
            a = Answer(r.status, {k.lower(): v for k, v in r.getheaders()}, r.read())
        finally:
            c.close()
        m = re.match(r"peloton_console=([^;]*)", a.headers.get("set-cookie", ""))
        if m and method == "POST" and path.startswith("/login"):
            self.cookie = f"peloton_console={m.group(1)}"
        return a

    def get(self, path: str) -> Answer:
        return self.request("GET", path)

    def post(self, path: str, form: dict[str, str] | None = None, csrf: bool = True) -> Answer:
        headers = {"X-CSRF-Token": self.get("/api/session").json()["csrf"]} if csrf else {}
        return self.request("POST", path, urlencode(form or {}).encode(), headers)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsConsoleDaemon]:
    tmp = tmp_path_factory.mktemp("console-tls")
    certs = tmp / "certs"
    r = subprocess.run([*PELOTON, "certs", "init", str(certs), "--client", "alice"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    data = tmp / "data"
    data.mkdir()
    path = data / "principals.json"
    # alice (admin) and victor (viewer) by token and by certificate: the principals file gives a certificate's
    # name its roles, as the API does
    tokens = {"alice": add_token(path, "alice", ["admin"]), "victor": add_token(path, "victor", ["viewer"])}
    d = TlsConsoleDaemon(data, f"sqlite:///{tmp / 'peloton.db'}", certs=certs, tokens=tokens)
    for name in ("victor", "dave"):
        client_cert(certs, name)
    with serving(d):
        yield d


def browser(d: TlsConsoleDaemon, who: str | None) -> TlsBrowser:
    c = d.certs
    cert = None if who is None else ((c / "client.pem", c / "client-key.pem") if who == "alice"
                                     else (c / f"{who}.pem", c / f"{who}-key.pem"))
    return TlsBrowser(d.ui, c / "ca.pem", cert)


def test_the_console_of_a_tls_daemon_is_https_and_asks_for_a_certificate_of_its_ca(daemon: TlsConsoleDaemon,
                                                                                    tmp_path: Path) -> None:
    assert daemon.ui.startswith("https://127.0.0.1:")
    log = daemon.log()
    assert "web console on https://" in log and "client certificates of --tls-client-ca log in" in log
    assert "INSECURE" not in log
    b = browser(daemon, "victor")
    a = b.get("/login")
    assert a.status == 200 and b"Log in" in a.body
    assert b.get("/api/login").json() == {"certificate": "victor", "authenticated": True, "session": False}
    # turned away at the handshake: plain HTTP, no client certificate, a certificate of another CA
    u = urlsplit(daemon.ui)
    plain = http.client.HTTPConnection(u.hostname or "", u.port, timeout=10)
    with pytest.raises((http.client.HTTPException, ConnectionError)):
        plain.request("GET", "/login")
        plain.getresponse().read()
    with pytest.raises((ssl.SSLError, ConnectionError)):
        browser(daemon, None).get("/login")
    other = tmp_path / "other"
    assert subprocess.run([*PELOTON, "certs", "init", str(other), "--client", "alice"], capture_output=True,
                          timeout=60).returncode == 0
    mallory = TlsBrowser(daemon.ui, daemon.certs / "ca.pem", (other / "client.pem", other / "client-key.pem"))
    with pytest.raises((ssl.SSLError, ConnectionError)):
        mallory.get("/login")


def test_a_client_certificate_logs_in_with_the_roles_the_api_gives_it(daemon: TlsConsoleDaemon,
                                                                       tmp_path: Path) -> None:
    job = daemon.submit(tmp_path, "certs")
    viewer = browser(daemon, "victor")
    assert viewer.get("/api/session").status == 401
    a = viewer.post("/login", {"method": "certificate"}, csrf=False)
    assert a.status == 303 and a.headers["location"] == "/", a.headers
    cookie = a.headers["set-cookie"]
    assert all(attr in cookie for attr in ("HttpOnly", "SameSite=Strict", "Secure")), cookie
    s = viewer.get("/api/session").json()
    assert (s["name"], s["roles"], s["via"]) == ("victor", ["viewer"], "certificate via console")
    assert viewer.get(f"/api/jobs/{job}").json()["id"] == job
    # a viewer's stop, well formed, is the API's to refuse, and it is audited under the certificate's name
    a = viewer.post(f"/api/jobs/{job}/stop")
    assert a.status == 403 and "victor may not call StopJob" in a.json()["error"], a.body
    refused = [e for e in daemon.audit("victor") if e["method"].endswith("StopJob")]
    assert refused and not refused[0]["allowed"] and refused[0]["via"] == "certificate via console"
    # the session cookie is good only with the certificate it logged in with
    thief = browser(daemon, "dave")
    thief.cookie = viewer.cookie
    assert thief.get("/api/session").status == 401
    assert thief.get("/").status == 303
    # a certificate of the CA whose name the principals file gives no role: no session
    a = browser(daemon, "dave").post("/login", {"method": "certificate"}, csrf=False)
    assert a.status == 303 and a.headers["location"] == "/login?failed=certdenied" and "set-cookie" not in a.headers
    # an admin's certificate stops the job
    admin = browser(daemon, "alice")
    assert admin.post("/login", {"method": "certificate"}, csrf=False).status == 303
    assert admin.get("/api/session").json()["roles"] == ["admin"]
    assert admin.post(f"/api/jobs/{job}/stop", csrf=False).status == 403  # CSRF still
    assert admin.post(f"/api/jobs/{job}/stop").status == 200
    # logout ends the console's session, on the server too
    old = admin.cookie
    assert admin.post("/logout").status == 303
    admin.cookie = old
    assert admin.get("/api/session").status == 401


def test_a_token_decides_who_logs_in_whatever_the_certificate(daemon: TlsConsoleDaemon) -> None:
    b = browser(daemon, "victor")  # (the handshake needs a certificate of the CA, as the API's)
    assert b.post("/login", {"token": daemon.tokens["alice"]}, csrf=False).status == 303
    s = b.get("/api/session").json()
    assert (s["name"], s["roles"], s["via"]) == ("alice", ["admin"], "token")


def _ui_login(d: TlsConsoleDaemon) -> tuple[str, str]:
    r = d.cli("cluster", "ui-login")
    url = r.stdout.strip()
    m = re.fullmatch(re.escape(d.ui) + r"login#once=([0-9a-f]{8})\.([A-Za-z0-9_-]{43})", url)
    assert m, url
    assert f"within {TTL_S}s" in r.stderr and m.group(1) in r.stderr
    return m.group(1), f"{m.group(1)}.{m.group(2)}"


def test_the_daemons_user_logs_in_once_with_a_link_of_ui_login(daemon: TlsConsoleDaemon) -> None:
    login_id, code = _ui_login(daemon)
    b = browser(daemon, "dave")  # any certificate of the CA gets through the handshake; the link says who
    a = b.post("/login/once", {"once": code}, csrf=False)
    assert a.status == 303 and a.headers["location"] == "/", a.headers
    s = b.get("/api/session").json()
    assert s["roles"] == ["admin"] and s["via"] == "local login via console"
    owner = s["name"]
    # used: refused, and no session
    again = browser(daemon, "dave")
    a = again.post("/login/once", {"once": code}, csrf=False)
    assert a.status == 303 and a.headers["location"] == "/login?failed=once" and not again.cookie
    # forged: a made-up code, or the id with another secret (which spends it)
    forged_id, forged = _ui_login(daemon)
    a = again.post("/login/once", {"once": forged_id + "." + "A" * 43}, csrf=False)
    assert a.headers["location"] == "/login?failed=once"
    assert again.post("/login/once", {"once": forged}, csrf=False).headers["location"] == "/login?failed=once"
    assert again.post("/login/once", {"once": "not-a-code"}, csrf=False).headers["location"] == "/login?failed=once"
    # from another site: refused before anything is spent
    late_id, late = _ui_login(daemon)
    a = again.request("POST", "/login/once", urlencode({"once": late}).encode(), {"Origin": "https://evil.example"})
    assert a.status == 403
    # expired: past --ui-login-ttl
    time.sleep(TTL_S + 0.5)
    a = again.post("/login/once", {"once": late}, csrf=False)
    assert a.headers["location"] == "/login?failed=expired" and not again.cookie
    # each try is audited under the login's id, never with its code; nor is the code in the daemon's log
    events = daemon.audit(owner) + daemon.audit("(console)")
    made = [e for e in events if e["method"].endswith("CreateConsoleLogin") and e["object"] == login_id]
    spent = [e for e in events if e["method"].endswith("RedeemConsoleLogin") and e["object"] == login_id]
    assert made and made[0]["allowed"] and made[0]["via"] == "unix socket"
    assert [e["allowed"] for e in sorted(spent, key=lambda e: e["id"])] == [True, False], spent
    assert any(e["object"] == late_id and not e["allowed"] and "expired" in e["message"] for e in events)
    secrets_ = [c.split(".")[1] for c in (code, forged, late)]
    for text in [daemon.log(), *(str(e) for e in events)]:
        assert not any(x in text for x in secrets_)


def test_only_the_daemons_user_over_its_socket_may_make_a_login_link(daemon: TlsConsoleDaemon) -> None:
    c = daemon.certs
    creds = ["--tls-ca", str(c / "ca.pem"), "--client-cert", str(c / "client.pem"),
             "--client-key", str(c / "client-key.pem")]
    r = subprocess.run([*PELOTON, "--address", daemon.address, *creds, "--token", daemon.tokens["alice"], "cluster",
                        "ui-login"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "alice may not call CreateConsoleLogin: only the daemon's own user" in r.stderr, r
    denied = [e for e in daemon.audit("alice") if e["method"].endswith("CreateConsoleLogin")]
    assert denied and not denied[0]["allowed"]


def test_logging_in_again_and_again_ends_only_ones_own_oldest_sessions(daemon: TlsConsoleDaemon) -> None:
    """The console's sessions were capped at MAX_SESSIONS in all, the oldest ended first: any holder of a
    certificate with a role (a viewer) could log everybody else out by logging in that many times. The cap is
    per principal now: a login past MAX_SESSIONS_PER_PRINCIPAL ends that principal's own oldest session."""
    admin = browser(daemon, "alice")
    assert admin.post("/login", {"method": "certificate"}, csrf=False).status == 303
    local = browser(daemon, "dave")
    assert local.post("/login/once", {"once": _ui_login(daemon)[1]}, csrf=False).status == 303
    viewer = browser(daemon, "victor")
    cookies = []
    for _ in range(MAX_SESSIONS + 1):
        a = viewer.post("/login", {"method": "certificate"}, csrf=False)
        assert a.status == 303 and a.headers["location"] == "/", a.headers
        cookies.append(viewer.cookie)
    s = admin.get("/api/session")  # still logged in
    assert s.status == 200 and s.json()["name"] == "alice", s.body
    assert local.get("/api/session").status == 200
    kept = cookies[-MAX_SESSIONS_PER_PRINCIPAL:]
    for cookie, alive in [(c, False) for c in cookies[:2]] + [(cookies[-len(kept) - 1], False)] + [
            (c, True) for c in (kept[0], kept[-1])]:
        viewer.cookie = cookie
        assert viewer.get("/api/session").status == (200 if alive else 401), (cookies.index(cookie), alive)


def test_a_console_sessions_event_stream_ends_with_the_session(daemon: TlsConsoleDaemon) -> None:
    """A certificate's session ended (logged out, expired, or ended by its principal's logins past the cap) while
    its page's event stream stayed open: the stream went on delivering. It ends at once at logout, and at its next
    message a second or more after any other end of its session (a heartbeat every 5 s), saying why."""
    viewer = browser(daemon, "victor")

    def stream() -> EventStream:
        c = http.client.HTTPSConnection(viewer.host, viewer.port, context=viewer.ctx, timeout=15)
        return EventStream(c, viewer.cookie)

    assert viewer.post("/login", {"method": "certificate"}, csrf=False).status == 303
    s = stream()
    assert viewer.post("/logout").status == 303
    asked = time.monotonic()
    assert s.until_closed(within=8) - asked < 2
    assert viewer.post("/login", {"method": "certificate"}, csrf=False).status == 303
    s = stream()
    first = viewer.cookie
    for _ in range(MAX_SESSIONS_PER_PRINCIPAL):  # the principal's logins past its cap end its oldest: this one
        assert viewer.post("/login", {"method": "certificate"}, csrf=False).status == 303
    ended = time.monotonic()
    assert s.until_closed(within=15) - ended < 6 + 1.5  # (a heartbeat's wait, and a loaded machine's slack)
    failed = s.failed()
    assert failed is not None and failed == {"error": "the session ended: log in again", "code": "Unauthenticated"}
    viewer.cookie = first
    assert viewer.get("/api/events").status == 401
