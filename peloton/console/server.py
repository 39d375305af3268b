"""The console's HTTP server: the standard library's http.server, a thread per connection (bounded), serving the
assets shipped in the wheel and JSON endpoints that call the public API as the browser's caller (api.py).

Security (docs/ui.md, "Security"): the caller's token lives in an HttpOnly, SameSite=Strict cookie and is handed to
the API on every call, so what the API refuses the console cannot do; a changing request (POST) must come from
this console's own pages (its Origin, and a CSRF token derived from the session that only a same-origin script
can read); a console on loopback answers only requests addressed to loopback (a DNS-rebinding page cannot reach
it); every answer forbids inline scripts and framing (Content-Security-Policy).

Where the daemon's API has TLS, the console is HTTPS with the daemon's own certificate and, with --tls-client-ca,
asks browsers for a client certificate of that CA as the API asks its clients (the handshake fails without one).
Besides a token, a browser logs in with that certificate (the API gives it the roles it gives the certificate), or
with a one-time link of `peloton cluster ui-login` (the daemon's own user); those sessions are the console's own
(sessions.py), a certificate's bound to the certificate it logged in with."""

from __future__ import annotations

import hashlib
import hmac
import io
import ipaddress
import json
import logging
import re
import secrets
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, parse_qsl, urlencode, urlsplit

from peloton import errors
from peloton.config import split_hostport
from peloton.console import params
from peloton.console.api import Api
from peloton.console.hangups import Hangups
from peloton.console.sessions import SESSION_PREFIX, Sessions
from peloton.errors import PelotonError

log = logging.getLogger("peloton.console")

COOKIE = "peloton_console"
CSRF_HEADER = "X-CSRF-Token"
MAX_CONNECTIONS = 64  # connections served at once; more wait in the listen backlog's place: refused
MAX_STREAMS = 32  # of them, event streams (each holds a WatchJobs stream of the daemon's 256)
MAX_BODY = 4096
TOKEN = re.compile(r"[A-Za-z0-9_.~+/=-]{1,512}")
SESSION = re.compile(re.escape(SESSION_PREFIX) + r"[A-Za-z0-9_-]{43}")
ONCE = re.compile(r"([0-9a-f]{8})\.([A-Za-z0-9_-]{43})")  # a one-time login's code: <login id>.<secret>
HANDSHAKE_TIMEOUT_S = 10.0  # a TLS client that does not finish its handshake by then is let go
REQUEST_TIMEOUT_S = 10.0  # a connection silent this long (its request not sent, or its answer not read) is let go
REQUEST_DEADLINE_S = 15.0  # a request (its line, headers and body) not whole this long after the connection: let go
# an event stream of a console session (certificate, one-time login) checks that its session is still open at its
# first message this long after the last check: one logged out elsewhere, expired or ended by a newer login ends
SESSION_RECHECK_S = 1.0
LOOPBACK_NAMES = ("localhost", "::1")
ASSET = re.compile(r"[a-z0-9-]+\.(html|js|css|svg)")
TYPES = {"html": "text/html; charset=utf-8", "js": "text/javascript; charset=utf-8",
         "css": "text/css; charset=utf-8", "svg": "image/svg+xml"}
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
       "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
STATUS = {errors.InvalidArgument: 400, errors.Unauthenticated: 401, errors.PermissionDenied: 403,
          errors.NotFound: 404, errors.AlreadyExists: 409, errors.FailedPrecondition: 409, errors.Conflict: 409,
          errors.ResourceExhausted: 429, errors.Unavailable: 503}
PAGES = re.compile(r"/(|jobs|jobs/[0-9a-f]{12}|queue|pools|hosts|audit)")


def _next_page(value: str) -> str:
    """Where a login goes: `value`, the page a browser without a session asked for, when it is one of this
    console's pages (its query encoded again); the cluster view otherwise (no other site, no other path)."""
    if not value.startswith("/") or value.startswith("//") or any(c == "\\" or ord(c) < 32 for c in value):
        return "/"
    url = urlsplit(value)
    if url.scheme or url.netloc or not PAGES.fullmatch(url.path):
        return "/"
    query = urlencode(parse_qsl(url.query, keep_blank_values=True))
    return url.path + ("?" + query if query else "")


def _to_login(failed: str = "", next_page: str = "/") -> str:
    """The login page's address: why the last try failed, and the page to go to once logged in."""
    q = urlencode({**({"failed": failed} if failed else {}), **({"next": next_page} if next_page != "/" else {})})
    return "/login" + ("?" + q if q else "")


def _loopback(host: str) -> bool:
    """`localhost`, or an IP address of loopback. Only an address itself: a name that merely starts like one
    (`127.0.0.1.nip.io`, `127.attacker.example`) is anyone's to point at 127.0.0.1, the DNS rebinding the Host
    check is there to stop."""
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _host_name(host: str) -> str:
    """The name of a Host header, without its port: `[::1]:80` and `[::1]` are `[::1]`, `a:80` is `a`."""
    if host.startswith("["):
        name, bracket, port = host.partition("]")
        return name + bracket if bracket and (not port or port.startswith(":")) else ""
    return host.partition(":")[0] if host.count(":") == 1 else host


def _assets() -> dict[str, bytes]:
    """The console's files, read once from the installed package (the wheel's package data)."""
    out = {}
    for f in resources.files("peloton.console").joinpath("assets").iterdir():
        if ASSET.fullmatch(f.name):
            out[f.name] = f.read_bytes()
    return out


def _tls_context(cert: Path, key: Path, client_ca: Path | None) -> ssl.SSLContext:
    """HTTPS with the daemon's own certificate; with a client CA, the handshake needs a certificate it signed (as
    the API's: verified for client use, the purpose a server context checks)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cert, key)
        if client_ca is not None:
            ctx.load_verify_locations(cafile=client_ca)
            ctx.verify_mode = ssl.CERT_REQUIRED
    except (OSError, ssl.SSLError) as e:
        raise errors.FailedPrecondition(f"--ui-listen: cannot serve HTTPS with --tls-cert {cert}: {e}",
                                        field="--ui-listen") from None
    return ctx


class Console:
    """Bound at construction (a port in use refuses the daemon's start before it acts), serving once `start` is
    given the API's address. `tls`: (certificate, key, client CA or None) when the API has TLS."""

    def __init__(self, listen: str, tls: tuple[Path, Path, Path | None] | None = None) -> None:
        host, port = split_hostport(listen, "--ui-listen")
        self.authenticated = True  # the daemon asks who calls: a login first (set by start)
        self.loopback_only = _loopback(host)
        self.key = secrets.token_bytes(32)  # CSRF tokens of this process's sessions
        self.assets = _assets()
        self.api: Api | None = None
        self.sessions = Sessions()  # certificate and one-time logins (a token login's session is its token)
        self.tls = tls is not None
        self.ssl_context = _tls_context(*tls) if tls is not None else None
        self._streams = threading.BoundedSemaphore(MAX_STREAMS)
        self._open_lock = threading.Lock()
        self._open: dict[str, set[Callable[[], None]]] = {}  # a session's cookie -> its open event streams' cancels
        self.hangups = Hangups()
        try:
            self.httpd = _Server((host, port), _Handler, self)
        except OSError as e:
            raise errors.FailedPrecondition(f"--ui-listen: cannot listen on {listen}: {e.strerror}",
                                            field="--ui-listen") from None
        bound = self.httpd.server_address
        scheme = "https" if self.tls else "http"
        self.url = f"{scheme}://{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{bound[1]}/"
        self._thread: threading.Thread | None = None

    def start(self, api_address: str, secret: str, authenticated: bool) -> None:
        """`api_address`: the console's own socket of the API, where `secret` says a call is the console's."""
        self.authenticated = authenticated
        self.api = Api(api_address, secret)
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="console", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self.httpd.shutdown()
        if self.api is not None:
            self.api.close()  # the event streams' watches end, and their threads with them
        self.httpd.server_close()
        self.hangups.close()

    def csrf(self, token: str) -> str:
        return hmac.new(self.key, token.encode(), hashlib.sha256).hexdigest()[:32]

    def take_stream(self) -> bool:
        return self._streams.acquire(blocking=False)

    def give_stream(self) -> None:
        self._streams.release()

    def stream_opened(self, cookie: str, cancel: Callable[[], None]) -> None:
        """An event stream of the session whose cookie is `cookie` (a token, or a console session's id) is open;
        `cancel` ends it (its watch)."""
        with self._open_lock:
            self._open.setdefault(cookie, set()).add(cancel)

    def stream_closed(self, cookie: str, cancel: Callable[[], None]) -> None:
        with self._open_lock:
            left = self._open.get(cookie)
            if left is not None:
                left.discard(cancel)
                if not left:
                    del self._open[cookie]

    def end_streams(self, cookie: str) -> None:
        """Logout: every open event stream of that cookie ends now. A browser that still has the session (the same
        token logged in elsewhere) reconnects a second later and resumes where it was (Last-Event-ID); one that
        has not is refused (401), and its page goes to the login."""
        with self._open_lock:
            cancels = list(self._open.pop(cookie, ()))
        for cancel in cancels:
            cancel()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    # the listen backlog (socketserver's default is 5): a burst of connections beyond it (a few browsers opening
    # their pages at once) had its handshakes' last step dropped by the kernel and retried after 1, 2, 4... s
    request_queue_size = 2 * MAX_CONNECTIONS

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], console: Console) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.console = console
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        # serve_forever's wake-up: socketserver's own loop looked for its stop every poll_interval (half a second
        # of every daemon's stop); this one sleeps in select until a connection or `shutdown` writes here
        self._wake_r, self._wake_w = socket.socketpair()
        self._stopping = False
        self._serving: threading.Thread | None = None
        super().__init__(address, handler)

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        """socketserver's loop, but ended by `shutdown` at once (`poll_interval` is not used: nothing polls)."""
        del poll_interval
        self._serving = threading.current_thread()
        with selectors.DefaultSelector() as sel:
            sel.register(self, selectors.EVENT_READ)
            sel.register(self._wake_r, selectors.EVENT_READ)
            while not self._stopping:
                ready = sel.select()
                if self._stopping:
                    break
                if any(key.fileobj is self for key, _ in ready):
                    self._handle_request_noblock()  # type: ignore[attr-defined]  # (socketserver's own, untyped)
                self.service_actions()

    def shutdown(self) -> None:
        """Ends serve_forever and waits for it (socketserver's contract), at once. Before serve_forever started,
        it ends as it starts."""
        self._stopping = True
        try:
            self._wake_w.send(b"\0")
        except OSError:  # (closed already: server_close ran)
            pass
        serving = self._serving
        if serving is not None and serving is not threading.current_thread():
            serving.join()

    def server_close(self) -> None:
        super().server_close()
        self._wake_r.close()
        self._wake_w.close()

    def process_request(self, request: Any, client_address: Any) -> None:
        """A named thread per connection, at most MAX_CONNECTIONS at once (more are closed at once)."""
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        t = threading.Thread(target=self._serve, args=(request, client_address), name="console-request",
                             daemon=True)
        try:
            t.start()
        except BaseException:
            # (out of threads or memory for a moment: socketserver closes the connection) its slot is not taken:
            # kept, MAX_CONNECTIONS such moments closed the console to every connection for good
            self._slots.release()
            raise

    def _serve(self, request: Any, client_address: Any) -> None:
        try:
            ctx = self.console.ssl_context
            if ctx is not None:  # the handshake here, in the connection's thread: a slow one holds only its own
                try:
                    request.settimeout(HANDSHAKE_TIMEOUT_S)
                    request = ctx.wrap_socket(request, server_side=True)
                    request.settimeout(None)
                except (OSError, ssl.SSLError) as e:  # (no certificate of the CA, plain HTTP, a scan)
                    log.debug("console: TLS handshake with %s failed: %s", client_address[0], e)
                    self.shutdown_request(request)
                    return
            self.process_request_thread(request, client_address)
        finally:
            self._slots.release()


class _ReadBy(io.RawIOBase):
    """A connection's reads, each waiting at most `timeout` and all of them over by `deadline` (monotonic): a
    client sending its request a byte every few seconds passes every read's timeout, and MAX_CONNECTIONS of them
    held every slot for as long as they trickled. Writes keep `timeout` alone (an event stream writes for hours)."""

    def __init__(self, sock: Any, timeout: float, deadline: float) -> None:
        self._sock, self._timeout, self._deadline = sock, timeout, deadline

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request did not come whole in time")
        self._sock.settimeout(min(self._timeout, left))
        try:
            return int(self._sock.recv_into(b))
        finally:
            self._sock.settimeout(self._timeout)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    # on every read and write of the connection (StreamRequestHandler.setup): without it a client that connects
    # and sends nothing keeps its slot for ever, and MAX_CONNECTIONS of them shut everyone out of the console
    timeout = REQUEST_TIMEOUT_S
    protocol_version = "HTTP/1.0"
    server_version = "peloton-console"
    sys_version = ""

    def setup(self) -> None:
        super().setup()
        self.rfile.close()  # (the socket's own file: its reference would keep the socket open after ours closes)
        self.rfile = io.BufferedReader(_ReadBy(self.connection, REQUEST_TIMEOUT_S,
                                               time.monotonic() + REQUEST_DEADLINE_S))

    @property
    def console(self) -> Console:
        return self.server.console

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's name
        log.debug("%s %s", self.address_string(), format % args)

    # -- answers

    def _send(self, status: int, body: bytes, ctype: str, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Content-Security-Policy", CSP)
        self.send_header("X-Content-Type-Options", "nosniff")
        # (not no-referrer: with it a browser sends `Origin: null` on a form's POST, and the login checks Origin)
        self.send_header("Referrer-Policy", "same-origin")
        self.send_header("Cache-Control", "no-store")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, obj: Any, headers: dict[str, str] | None = None) -> None:
        self._send(status, json.dumps(obj, separators=(",", ":")).encode(), "application/json", headers)

    def _error(self, e: PelotonError) -> None:
        self._json(_status_of(e), {"error": str(e), "field": e.field, "code": type(e).__name__})

    def _redirect(self, to: str, headers: dict[str, str] | None = None) -> None:
        self._send(303, b"", "text/plain", {"Location": to, **(headers or {})})

    # -- who asks

    def _cookie(self) -> str:
        for part in self.headers.get("Cookie", "").split(";"):
            name, _, value = part.strip().partition("=")
            if name == COOKIE and (TOKEN.fullmatch(value) or SESSION.fullmatch(value)):
                return value
        return ""

    def _token(self) -> str | None:
        """The caller's credential for the API (api.py: a token, "certificate:<name>" or "local:<name>"); "" when
        the daemon authenticates nobody; None: no session (log in first)."""
        if not self.console.authenticated:
            return ""
        value = self._cookie()
        if value.startswith(SESSION_PREFIX):
            s = self.console.sessions.get(value, self._fingerprint(), time.time())
            return s.credential if s is not None else None
        return value or None

    def _csrf_of_session(self) -> str:
        """The session's CSRF token: an HMAC of its cookie (a token, or the console's session id)."""
        return self.console.csrf(self._cookie() if self.console.authenticated else "")

    def _fingerprint(self) -> bytes:
        """The SHA-256 of the client certificate this connection presented (b"" for none)."""
        der = self.connection.getpeercert(binary_form=True) if isinstance(self.connection, ssl.SSLSocket) else None
        return hashlib.sha256(der).digest() if der else b""

    def _certificate_name(self) -> str | None:
        """The subject's common name of the client certificate the handshake verified (as the API reads it)."""
        if not isinstance(self.connection, ssl.SSLSocket):
            return None
        cert: dict[str, Any] = dict(self.connection.getpeercert() or {})
        for rdn in cert.get("subject", ()):
            for attribute in rdn:
                if attribute[0] == "commonName" and attribute[1]:
                    return str(attribute[1])
        return None

    def _cookie_header(self, value: str, max_age: int | None = None) -> str:
        # Secure over HTTPS: the browser never sends it over plain HTTP
        return (f"{COOKIE}={value}; HttpOnly; SameSite=Strict; Path=/" + ("; Secure" if self.console.tls else "")
                + (f"; Max-Age={max_age}" if max_age is not None else ""))

    def _host_ok(self) -> bool:
        """A console on loopback answers only requests addressed to loopback: a page of another site whose name
        was made to resolve to 127.0.0.1 (DNS rebinding) is refused."""
        if not self.console.loopback_only:
            return True
        return _loopback(_host_name(self.headers.get("Host", "")))

    def _same_origin(self) -> bool:
        """A changing request from this console's own pages: the browser's Origin (sent with every POST) names
        this console, and the fetch metadata, where sent, says same-origin."""
        site = self.headers.get("Sec-Fetch-Site")
        if site is not None and site not in ("same-origin", "none"):
            return False
        origin = self.headers.get("Origin")
        scheme = "https" if self.console.tls else "http"
        return origin is None or origin == f"{scheme}://{self.headers.get('Host', '')}"

    def _csrf_ok(self) -> bool:
        # (as bytes: a header is read as Latin-1, and compare_digest raises on a str that is not ASCII)
        given = self.headers.get(CSRF_HEADER, "").encode("utf-8", "replace")
        return self._same_origin() and hmac.compare_digest(given, self._csrf_of_session().encode())

    # -- routes

    def do_HEAD(self) -> None:  # noqa: N802
        self.do_GET()

    def do_GET(self) -> None:  # noqa: N802
        try:
            if not self._host_ok():
                self._json(421, {"error": "Host: this console answers only requests addressed to loopback",
                                 "field": "Host", "code": "InvalidArgument"})
                return
            url = urlsplit(self.path)
            path, query = url.path, parse_qs(url.query, keep_blank_values=True)
            if path.startswith("/assets/"):
                self._asset(path[len("/assets/"):])
            elif path == "/favicon.ico":  # asked for by a browser on a page without its <link rel=icon>
                self._asset("icon.svg")
            elif path == "/login":
                if self._token() is not None and not query.get("failed") and not self.console.authenticated:
                    self._redirect(_next_page((query.get("next") or [""])[0]))
                else:
                    self._send(200, self.console.assets["login.html"], TYPES["html"])
            elif PAGES.fullmatch(path):
                if self._token() is None:  # (login.js goes back at once where the browser has a session after all)
                    self._redirect(_to_login(next_page=_next_page(path + ("?" + url.query if url.query else ""))))
                else:
                    self._send(200, self.console.assets["index.html"], TYPES["html"])
            elif path == "/api/login":  # what the login page offers (no session needed)
                params._only(query, frozenset(), path)
                self._json(200, {"certificate": self._certificate_name() if self.console.authenticated else None,
                                 "authenticated": self.console.authenticated, "session": self._token() is not None})
            elif path.startswith("/api/"):
                self._api_get(path, query)
            else:
                self._json(404, {"error": f"{path}: no such page", "field": None, "code": "NotFound"})
        except PelotonError as e:
            self._error(e)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def do_POST(self) -> None:  # noqa: N802
        try:
            if not self._host_ok():
                self._json(421, {"error": "Host: this console answers only requests addressed to loopback",
                                 "field": "Host", "code": "InvalidArgument"})
                return
            length = self.headers.get("Content-Length", "0")
            if not (length.isascii() and length.isdigit()) or int(length) > MAX_BODY:  # ('²' is a digit, not int's)
                self._json(413, {"error": f"Content-Length: a request body is at most {MAX_BODY} bytes",
                                 "field": "Content-Length", "code": "InvalidArgument"})
                return
            body = self.rfile.read(int(length))
            path = urlsplit(self.path).path
            if path == "/login":
                self._login(body)
                return
            if path == "/login/once":
                self._login_once(body)
                return
            token = self._token()
            if token is None:
                raise errors.Unauthenticated("no session: log in first (/login)")
            if not self._csrf_ok():
                log.warning("console: refused a %s from %s without this console's CSRF token or origin",
                            path, self.address_string())
                self._json(403, {"error": f"{CSRF_HEADER}: missing or wrong, or the request came from another "
                                          "site: changes are made from this console's own pages",
                                 "field": CSRF_HEADER, "code": "PermissionDenied"})
                return
            if path == "/logout":
                self.console.sessions.close(self._cookie())
                self.console.end_streams(self._cookie())
                self._redirect("/login", {"Set-Cookie": self._cookie_header("", max_age=0)})
                return
            m = re.fullmatch(r"/api/jobs/([^/]+)/(stop|delete)", path)
            if m:
                job = params.job_id(m.group(1))
                if m.group(2) == "stop":
                    self._api().stop_job(job, token)
                    self._json(200, {"stopped": job})
                else:
                    self._api().delete_job(job, token)
                    self._json(200, {"deleted": job})
                return
            m = re.fullmatch(r"/api/hosts/([^/]+)/(drain|undrain)", path)
            if m:
                host, undrain = params.hostname(m.group(1)), m.group(2) == "undrain"
                deadline = None if undrain else params.drain_deadline(parse_qs(urlsplit(self.path).query))
                self._json(200, self._api().drain_host(host, token, undrain=undrain, deadline_s=deadline))
                return
            self._json(404, {"error": f"{path}: no such action", "field": None, "code": "NotFound"})
        except PelotonError as e:
            self._error(e)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _api(self) -> Api:
        api = self.console.api
        if api is None:
            raise errors.Unavailable("the console is starting; retry in a moment")
        return api

    def _asset(self, name: str) -> None:
        body = self.console.assets.get(name) if ASSET.fullmatch(name) else None
        if body is None:
            self._json(404, {"error": f"/assets/{name}: no such file", "field": None, "code": "NotFound"})
            return
        self._send(200, body, TYPES[name.rsplit(".", 1)[1]])

    def _login(self, body: bytes) -> None:
        if not self._same_origin():
            self._json(403, {"error": "Origin: log in from this console's own page", "field": "Origin",
                             "code": "PermissionDenied"})
            return
        if not self.console.authenticated:
            self._redirect("/")
            return
        form = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
        to = _next_page((form.get("next") or [""])[0])
        if (form.get("method") or [""])[0] == "certificate":
            self._login_certificate(to)
            return
        token = (form.get("token") or [""])[0].strip()
        if not TOKEN.fullmatch(token):
            self._redirect(_to_login("token", to))
            return
        try:
            who = self._api().whoami(token)
        except errors.Unauthenticated:
            self._redirect(_to_login("unknown", to))
            return
        except errors.PermissionDenied:  # a principal without a role: it may not even ask who it is
            self._redirect(_to_login("denied", to))
            return
        log.info("console: %s logged in (%s)", who["name"], ", ".join(who["roles"]) or "no role")
        self._redirect(to, {"Set-Cookie": self._cookie_header(token)})

    def _login_certificate(self, to: str) -> None:
        """The client certificate this connection presented (the handshake verified it against --tls-client-ca):
        the API says who it is, with the roles it gives that certificate; the session is bound to it."""
        name = self._certificate_name()
        if name is None:
            self._redirect(_to_login("nocert", to))
            return
        credential = f"certificate:{name}"
        try:
            who = self._api().whoami(credential)
        except (errors.Unauthenticated, errors.PermissionDenied):  # a name the principals file gives no role
            log.info("console: a client certificate of %r was refused: it has no role here", name)
            self._redirect(_to_login("certdenied", to))
            return
        sid = self.console.sessions.open(credential, self._fingerprint(), time.time())
        log.info("console: %s logged in by client certificate (%s)", who["name"], ", ".join(who["roles"]) or "no role")
        self._redirect(to, {"Set-Cookie": self._cookie_header(sid)})

    def _login_once(self, body: bytes) -> None:
        """A one-time link of `peloton cluster ui-login`: its code (from the link's fragment, posted by the login
        page) spent through the API, which refuses one unknown, used or expired and audits each try; the session
        is the daemon's own user's. The code is never logged."""
        if not self._same_origin():
            self._json(403, {"error": "Origin: log in from this console's own page", "field": "Origin",
                             "code": "PermissionDenied"})
            return
        if not self.console.authenticated:
            self._redirect("/")
            return
        form = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
        m = ONCE.fullmatch((form.get("once") or [""])[0].strip())
        if m is None:
            self._redirect("/login?failed=once")
            return
        try:
            name = self._api().redeem_login(m.group(1), m.group(2))
        except errors.PermissionDenied as e:
            log.info("console: %s", e)  # (names the login's id and why, never its code)
            self._redirect("/login?failed=" + ("expired" if "expired" in str(e) else "once"))
            return
        sid = self.console.sessions.open(f"local:{name}", b"", time.time())
        log.info("console: %s logged in by a one-time link of peloton cluster ui-login (login %s)", name, m.group(1))
        self._redirect("/", {"Set-Cookie": self._cookie_header(sid)})

    def _api_get(self, path: str, query: dict[str, list[str]]) -> None:
        token = self._token()
        if token is None:
            raise errors.Unauthenticated("no session: log in first (/login)")
        api = self._api()
        if path == "/api/session":
            params._only(query, frozenset(), path)
            self._json(200, {**api.whoami(token), "csrf": self._csrf_of_session()})
        elif path == "/api/cluster":
            params._only(query, frozenset(), path)
            self._json(200, api.cluster_summary(token))
        elif path == "/api/jobs":
            self._json(200, api.list_jobs(params.job_query(query), token))
        elif m := re.fullmatch(r"/api/jobs/([^/]+)/members/([^/]+)/logs", path):
            q = params.log_query(query)
            self._json(200, api.logs(params.job_id(m.group(1)), params.instance(m.group(2)), q, token))
        elif m := re.fullmatch(r"/api/jobs/([^/]+)/events", path):
            self._json(200, api.job_events(params.job_id(m.group(1)), params.events_limit(query), token))
        elif m := re.fullmatch(r"/api/jobs/([^/]+)/gangs/([^/]+)/timeline", path):
            params._only(query, frozenset(), "/api/jobs/ID/gangs/G/timeline")
            self._json(200, api.gang_timeline(params.job_id(m.group(1)), params.gang_index(m.group(2)), token,
                                              time.time()))
        elif m := re.fullmatch(r"/api/jobs/([^/]+)/members/([^/]+)", path):
            params._only(query, frozenset(), "/api/jobs/ID/members/N")
            self._json(200, api.member(params.job_id(m.group(1)), params.instance(m.group(2)), token, time.time()))
        elif path.startswith("/api/jobs/"):
            params._only(query, frozenset(), "/api/jobs/ID")
            self._json(200, api.get_job(params.job_id(path[len("/api/jobs/"):]), token))
        elif path == "/api/audit":
            self._json(200, api.audit(params.audit_query(query), token))
        elif path == "/api/queue":
            self._json(200, api.queue(params.queue_query(query), token))
        elif path == "/api/pools":
            params._only(query, frozenset(), path)
            self._json(200, api.list_pools(token))
        elif path == "/api/hosts":
            self._json(200, api.list_hosts(params.host_query(query), token))
        elif path == "/api/events":
            self._events(api, params.watch_jobs(query), token)
        else:
            raise errors.NotFound(f"{path}: no such endpoint")

    def _events(self, api: Api, job_ids: tuple[str, ...], token: str) -> None:
        """Server-sent events from WatchJobs: each message's id is `<stream_id>:<revision>`, which the browser
        sends back as Last-Event-ID when it reconnects, and the watch resumes after it (or the daemon sends a
        snapshot, or `resync` when it cannot)."""
        stream_id, after = params.resume_point(self.headers.get("Last-Event-ID", ""))
        # the session's cookie: its logout ends the stream at once (Console.end_streams); a console session's
        # stream also checks, every SESSION_RECHECK_S at a message, that the session is still open (a token's is
        # the API's to check: its WatchJobs ends UNAUTHENTICATED once the token is revoked)
        cookie = self._cookie() if self.console.authenticated else ""
        own_session = cookie.startswith(SESSION_PREFIX)
        watch = None
        if not self.console.take_stream():
            raise errors.Unavailable(f"more than {MAX_STREAMS} open event streams on this console; retry later")
        started = False
        fd = -1
        try:
            watch = api.watch(job_ids, stream_id, after, token)
            if cookie:
                self.console.stream_opened(cookie, watch.cancel)
            messages = iter(watch)
            first = next(messages)  # a refusal (a revoked token) is an HTTP error, not a stream that ends at once
            started = True
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-store")
            self.send_header("X-Content-Type-Options", "nosniff")
            self.end_headers()
            if self.command == "HEAD":  # its headers alone: no stream (it held one, and a watch, for nothing)
                watch.cancel()
                return
            self.wfile.write(b"retry: 1000\n\n")
            fd = self.connection.fileno()
            self.console.hangups.watch(fd, watch.cancel)  # the browser gone: the watch ends at once (hangups.py)
            checked = time.monotonic()
            for m in _chain(first, messages):
                if own_session and time.monotonic() - checked >= SESSION_RECHECK_S:
                    checked = time.monotonic()
                    if self._token() is None:  # logged out elsewhere, expired, or ended by a login past the cap
                        raise errors.Unauthenticated("the session ended: log in again")
                # every message moves the resume point, a heartbeat's too: an id alone sets the browser's
                # Last-Event-ID without an event (the SSE rules), so a reconnect misses nothing sent before it;
                # but a part of a revision (`more`) does not: a reconnect resumes after a whole one
                out = "" if m["more"] else f"id: {m['stream_id']}:{m['revision']}\n"
                if m["changes"] or m["snapshot"] or m["resync"]:
                    out += f"event: jobs\ndata: {json.dumps(m, separators=(',', ':'))}\n"
                self.wfile.write(out.encode() + b"\n")  # (a browser gone is found here, within seconds)
                self.wfile.flush()
        except PelotonError as e:
            if started:  # the headers went: the browser reconnects (Last-Event-ID) after this event
                data = json.dumps({"error": str(e), "code": type(e).__name__})
                self.wfile.write(f"event: failed\ndata: {data}\n\n".encode())
            else:
                raise
        except StopIteration:
            self._json(503, {"error": "the daemon ended the watch", "field": None, "code": "Unavailable"})
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            if watch is not None:
                watch.cancel()  # (ended here, by the session's end or a failed write: its watch with it)
                if cookie:
                    self.console.stream_closed(cookie, watch.cancel)
            if fd >= 0:
                self.console.hangups.forget(fd)
            self.console.give_stream()


def _chain(first: dict[str, Any], rest: Any) -> Any:
    yield first
    yield from rest


def _status_of(e: PelotonError) -> int:
    for cls, status in STATUS.items():
        if isinstance(e, cls):
            return status
    return HTTPStatus.INTERNAL_SERVER_ERROR

