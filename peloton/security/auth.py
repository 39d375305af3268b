"""Authentication and authorization of the public API: who each call is from (principal.Principal), and whether
its method's permission (identity.METHODS) is one of theirs. Servicers read the caller with caller.current() for
what depends on the object (a job's owner).

With authentication on (a principals file, or mutual TLS), a call is from:
  - the daemon's own user, when it came over the owner-only Unix socket (admin);
  - the principal of its bearer token (`authorization: Bearer pt_...`), if the token is known;
  - the subject (common name) of its client certificate, with the roles and users the principals file gives that
    name (none for a name it does not list); without a principals file, a submitter of its own jobs (an admin
    needs an entry in a principals file: holding a certificate of the CA is not enough);
  - nobody: UNAUTHENTICATED.
The daemon's web console calls over a private owner-only Unix socket with this process's console secret
(CONSOLE_SECRET) and says for whom (ON_BEHALF): a browser's token (checked here as any), or an identity the console
verified itself: a client certificate of --tls-client-ca (given the roles that certificate would get here) or a
one-time local login of the daemon's user. The secret never leaves the process, so only the console can say so.
With it off, every call is from `anonymous`, an admin (the single-user default: loopback and owner-only socket)."""

from __future__ import annotations

import getpass
import hmac
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import unquote

import grpc

from peloton.api import caller
from peloton.api.audit import AuditLog, code_name, object_of
from peloton.api.status import bounded, retry_after
from peloton.domain import limits, principal
from peloton.domain.principal import Principal
from peloton.errors import PermissionDenied, ResourceExhausted, Unauthenticated
from peloton.security import identity
from peloton.security.identity import Principals
from peloton.security.ratelimit import RateLimiter

log = logging.getLogger(__name__)
CERTIFICATE_DEFAULT_ROLES = frozenset({"submitter"})  # a client certificate the principals file does not list
CONSOLE_SECRET = "x-peloton-console"  # metadata: the console's secret (only over the Unix socket)
ON_BEHALF = "x-peloton-as"  # metadata: "token" | "certificate:<name, %-encoded>" | "local"; none: the console itself
CONSOLE = Principal("(console)", frozenset(), "console")  # the console on its own account: it may spend a login
# An open server stream's caller is authenticated and authorized again at its first message this long after the
# last check (Authorize): a revoked token's stream ends then, UNAUTHENTICATED (docs/security.md)
STREAM_RECHECK_S = 1.0


class Authenticator:
    def __init__(self, principals: Principals | None, mutual_tls: bool, limiter: RateLimiter | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """`limiter`: per-principal rate of mutating calls, applied when authentication is on."""
        self.principals = principals
        self.mutual_tls = mutual_tls
        self.enabled = principals is not None or mutual_tls
        self.limiter = limiter
        self.clock = clock
        self.console_secret: str | None = None  # set when this process serves a console (server.py)
        self._limit_lock = threading.Lock()
        try:
            self.owner = getpass.getuser()
        except (KeyError, OSError):
            self.owner = "daemon-user"

    def principal(self, context: grpc.ServicerContext) -> Principal:
        if not self.enabled:
            return principal.OPEN
        metadata = {k: str(v) for k, v in context.invocation_metadata() or ()}
        if context.peer().startswith("unix:"):
            if CONSOLE_SECRET in metadata:
                return self._for_console(metadata)
            return Principal(self.owner, frozenset({"admin"}), "unix socket")
        if "authorization" in metadata:
            return self._by_token(metadata["authorization"])
        names = (context.auth_context() or {}).get("x509_common_name") or []
        if names:
            name = names[0].decode() if isinstance(names[0], bytes) else str(names[0])
            return self.by_certificate(name, "certificate")
        # a root daemon with no tokens yet answers every TCP caller so: say how its own user gets in
        raise Unauthenticated("no credentials: give a token (--token, $PELOTON_TOKEN) or a client certificate "
                              "(--client-cert); the daemon's own user needs neither on its machine, through the "
                              "Unix socket in its data dir (--address unix:DATA_DIR/peloton.sock)")

    def _by_token(self, value: str) -> Principal:
        scheme, _, token = value.partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise Unauthenticated("authorization: expected \"Bearer <token>\"")
        p = self.principals.by_token(token.strip()) if self.principals is not None else None
        if p is None:
            raise Unauthenticated("the token is not known to this daemon (revoked, or for another cluster)")
        return p

    def by_certificate(self, name: str, via: str) -> Principal:
        """Who a client certificate of the CA whose subject is `name` is (the API's handshake, or the console's)."""
        if self.principals is None:  # a certificate of the CA alone: a submitter of its own jobs, never admin
            return Principal(name, CERTIFICATE_DEFAULT_ROLES, via)
        e = self.principals.entry_of(name)  # with a file, it says who may do what (a name it lacks: nothing)
        return Principal(name, e.roles, via, e.users, e.user)

    def _for_console(self, metadata: dict[str, str]) -> Principal:
        """A call of this process's console, for the browser's caller it names (module doc)."""
        if self.console_secret is None or not hmac.compare_digest(metadata[CONSOLE_SECRET].encode(),
                                                                  self.console_secret.encode()):
            raise Unauthenticated(f"{CONSOLE_SECRET}: not this daemon's console")
        kind, _, name = metadata.get(ON_BEHALF, "").partition(":")
        if kind == "token":
            return self._by_token(metadata.get("authorization", ""))
        if kind == "certificate" and name:
            return self.by_certificate(unquote(name), "certificate via console")
        if kind == "local":
            return Principal(self.owner, frozenset({"admin"}), "local login via console")
        if kind == "":
            return CONSOLE
        raise Unauthenticated(f"{ON_BEHALF}: {kind!r} is not a kind of caller")

    def authorize(self, method: str, p: Principal) -> None:
        """PermissionDenied unless `p` may call `method`; ResourceExhausted beyond its rate of changing calls."""
        self._permit(method, p)
        if self.limiter is not None and self.enabled and method in identity.MUTATING:
            with self._limit_lock:
                wait = self.limiter.allow(p.name, self.clock())
            if wait is not None:
                raise ResourceExhausted(
                    f"rate limit: {p.name} made more than {self.limiter.rate:g} changing calls a second "
                    f"(--rate-limit); retry in {wait:.1f}s", retry_after_s=wait)

    def still_permitted(self, method: str, context: grpc.ServicerContext) -> None:
        """An open stream's call checked again (Authorize, every STREAM_RECHECK_S at most): Unauthenticated once
        its credential no longer authenticates (a token removed from the principals file, which is read again
        when it changes), PermissionDenied once its principal may no longer call `method` (its roles changed).
        Never rate-limited: it is the same call."""
        if self.enabled:
            self._permit(method, self.principal(context))

    def _permit(self, method: str, p: Principal) -> None:
        needed = identity.METHODS.get(method)
        if needed is not None and needed.startswith(identity.VIA):
            way = needed[len(identity.VIA):]
            if self.enabled and p.via != way:
                raise PermissionDenied(f"{p.name} may not call {method.rsplit('/', 1)[-1]}: only "
                                       + ("the daemon's own user may, over its owner-only Unix socket (peloton "
                                          "cluster ui-login on the daemon's machine, as its user)"
                                          if way == "unix socket" else "the daemon's own console may"))
        elif needed is None:  # a method the table does not know: admins only
            if "admin" not in p.roles:
                raise PermissionDenied(f"{p.name} may not call {method}: only an admin may")
        else:
            p.require(needed, f"call {method.rsplit('/', 1)[-1]}")


# How a refused call ends, whoever refused it (this interceptor, or a servicer: a job's owner, a pool's access list,
# task.user, --max-waiting-jobs): each is audited as denied, with its message.
REFUSALS = frozenset({grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED,
                      grpc.StatusCode.RESOURCE_EXHAUSTED})
_CODES = {Unauthenticated: grpc.StatusCode.UNAUTHENTICATED, PermissionDenied: grpc.StatusCode.PERMISSION_DENIED,
          ResourceExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED}


class Authorize(grpc.ServerInterceptor):
    """Runs the Authenticator before every call; the servicer then finds the caller in caller.current(). With an
    audit log, records every refused call (here or in the servicer) and every changing call with how it ended.

    The caller is authenticated before its request is read: each call is served as a client-streaming one (the
    same bytes on the wire), whose request is read only once the caller is known. gRPC reads a unary request
    whole before any Python code runs, so otherwise anyone who reaches the port could make the daemon hold a
    full-size request (limits.MAX_REQUEST_BYTES) per call in flight; an unknown caller now costs at most HTTP/2's
    window (edge.py). A known caller's request is read before its permission is checked, so that the audit names
    the object of a refused call."""

    def __init__(self, auth: Authenticator, audit: AuditLog | None = None) -> None:
        self.auth = auth
        self.audit = audit

    def intercept_service(self, continuation: Callable[..., Any], details: grpc.HandlerCallDetails) -> Any:
        handler = continuation(details)
        if handler is None:
            return None
        method = details.method
        if method.startswith(identity.PUBLIC_SERVICES):
            return handler
        if handler.request_streaming:
            log.warning("refusing %s: a streaming kind the authorization does not cover", method)
            return None
        auth, audit = self.auth, self.audit
        changing = method in identity.MUTATING

        def refused(p: Principal | None, obj: str, context: grpc.ServicerContext, code: grpc.StatusCode,
                    message: str) -> None:
            if audit is not None:
                audit.record(p.name if p else "-", p.via if p else context.peer(), method, obj, False, code.name,
                             message)

        def admit(requests: Iterator[Any], context: grpc.ServicerContext) -> tuple[Principal, Any]:
            """Who calls (before reading the request), the request, and whether they may call the method."""
            p: Principal | None = None
            request: Any = None
            try:
                p = auth.principal(context)
                request = _read_one(requests, context)
                if request is None:
                    # gRPC refused it (RESOURCE_EXHAUSTED, to the caller) or the caller went: nothing to answer
                    refused(p, "", context, grpc.StatusCode.RESOURCE_EXHAUSTED, NOT_RECEIVED)
                    context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, NOT_RECEIVED)
                auth.authorize(method, p)
                return p, request
            except (Unauthenticated, PermissionDenied, ResourceExhausted) as e:
                code = _CODES[type(e)]
                refused(p, object_of(request) if request is not None else "", context, code, e.message)
                if isinstance(e, ResourceExhausted) and e.retry_after_s is not None:
                    context.set_trailing_metadata(retry_after(e.retry_after_s))
                context.abort(code, bounded(e.message))
            raise AssertionError("unreachable")  # context.abort raises

        def done(p: Principal, request: Any, response: Any, context: grpc.ServicerContext, failed: bool) -> None:
            if audit is None:
                return
            code = context.code() if failed else None
            if code in REFUSALS:
                refused(p, object_of(request, response), context, code, _details(context))
            elif changing and auth.enabled and not getattr(request, "dry_run", False):  # a dry run changes nothing
                audit.record(p.name, p.via, method, object_of(request, response), True, code_name(context, failed),
                             _details(context) if failed else "")

        if handler.unary_unary is not None:
            behaviour = handler.unary_unary

            def unary(requests: Iterator[Any], context: grpc.ServicerContext) -> Any:
                p, request = admit(requests, context)
                token = caller.CALLER.set(p)
                response, failed = None, True
                try:
                    response = behaviour(request, context)
                    failed = False
                    return response
                finally:
                    _reset(token)
                    done(p, request, response, context, failed)

            return grpc.stream_unary_rpc_method_handler(unary, request_deserializer=handler.request_deserializer,
                                                        response_serializer=handler.response_serializer)
        stream_behaviour = handler.unary_stream

        def stream(requests: Iterator[Any], context: grpc.ServicerContext) -> Any:
            p, request = admit(requests, context)
            token = caller.CALLER.set(p)
            failed = True
            messages: Any = None
            try:
                messages = iter(stream_behaviour(request, context))
                checked = time.monotonic()
                for message in messages:
                    # the credential and the method's permission again, at most every STREAM_RECHECK_S (a clock
                    # read per message, not a lookup): a stream outlives its token's revocation by at most that
                    # and the gap to its next message (WatchJobs: a heartbeat every 5 s)
                    now = time.monotonic()
                    if now - checked >= STREAM_RECHECK_S:
                        checked = now
                        try:
                            auth.still_permitted(method, context)
                        except (Unauthenticated, PermissionDenied) as e:
                            context.abort(_CODES[type(e)], bounded(f"{e.message}; this open stream ends"))
                    yield message
                failed = False
            finally:
                if hasattr(messages, "close"):  # the servicer's own clean-up (WatchJobs: its slot) now, not later
                    messages.close()
                _reset(token)
                done(p, request, None, context, failed)

        return grpc.stream_stream_rpc_method_handler(stream, request_deserializer=handler.request_deserializer,
                                                     response_serializer=handler.response_serializer)


NOT_RECEIVED = (f"request: not received whole: larger than the {limits.MAX_REQUEST_BYTES} bytes a request may have "
                "(or the caller cancelled it)")


def _read_one(requests: Iterator[Any], context: grpc.ServicerContext) -> Any:
    """The one request of a unary call, read now; None when it was not received (the call has ended)."""
    try:
        request = next(requests, None)
    except grpc.RpcError:  # the call was cancelled while its request was read
        return None
    if request is None and context.is_active():
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, "request: a unary call without its request message")
    return request


def _details(context: grpc.ServicerContext) -> str:
    """The status message a call ended with (grpcio keeps it encoded)."""
    details: Any = context.details()
    return details.decode("utf-8", "replace") if isinstance(details, bytes) else str(details or "")


def _reset(token: Any) -> None:
    try:
        caller.CALLER.reset(token)
    except ValueError:  # a stream closed from another context: that context's value is not ours to reset
        pass
