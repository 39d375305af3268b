"""How a caller becomes a principal, and what each RPC needs: tokens, the principals file, the methods' permissions.
Pure apart from reading the principals file. The principal and its permissions are plain data
(peloton/domain/principal.py); the gRPC side (authenticating a call, checking its method's permission) is
security/auth.py, which hands the principal to the servicers through peloton/api/caller.py.

Roles (cluster-wide; a pool's access list also decides who submits to it: jobmgr/service.py, docs/security.md):
  admin      everything
  operator   every job (read, control, see its secrets and logs), hosts, the audit log; pools read-only
  submitter  create jobs, read every job, control and see the secrets and logs of its own
  viewer     read jobs, pools and hosts; never a job's environment values or logs

The principals file (JSON, owner-only), written by `peloton token create`:
  {"principals": {"alice": {"roles": ["admin"], "tokens": ["sha256:<hex>", ...], "user": "alice",
                            "users": ["ml"]}, ...}}
Only a token's hash is kept. `user`: the Unix user the principal's tasks run as (its identity, run_as.py); absent:
a uid allocated to it (a principal's name alone never maps to an account of the host). `users`: other Unix users its
jobs may name in `task.user`. One Unix user belongs to one principal: a file that gives a user to two principals is
refused (root excepted, which a job may name only in a pool that allows it). Admins may name any user. A principal
named by a client certificate (mutual TLS) gets its roles and users from the same file; one the file does not name
is a submitter (without a file, every certificate holder is)."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from peloton.domain import limits
from peloton.domain.principal import (
    AUDIT_READ,
    HOST_OPERATE,
    HOST_READ,
    JOB_CONTROL_OWN,
    JOB_CREATE,
    JOB_READ,
    POOL_READ,
    POOL_WRITE,
    ROLES,
    Principal,
)
from peloton.errors import FailedPrecondition, InvalidArgument, NotFound
from peloton.files import make_dirs, read_bounded

log = logging.getLogger(__name__)

# What each RPC needs (anything not listed: admin only). Health and reflection need nothing.
PUBLIC_SERVICES = ("/grpc.health.v1.Health/", "/grpc.reflection.v1alpha.ServerReflection/",
                   "/grpc.reflection.v1.ServerReflection/")
METHODS: dict[str, str] = {
    "/peloton.v1.JobService/CreateJob": JOB_CREATE,
    "/peloton.v1.JobService/GetJob": JOB_READ,
    "/peloton.v1.JobService/PlanJob": HOST_READ,  # it shows the hosts' free GPUs; nothing is created
    "/peloton.v1.JobService/ListJobs": JOB_READ,
    "/peloton.v1.JobService/WatchJobs": JOB_READ,
    "/peloton.v1.JobService/StopJob": JOB_CONTROL_OWN,  # and the job's owner, unless job.control.any
    "/peloton.v1.JobService/DeleteJob": JOB_CONTROL_OWN,
    "/peloton.v1.TaskService/ListTasks": JOB_READ,
    "/peloton.v1.TaskService/GetTask": JOB_READ,
    "/peloton.v1.TaskService/ListTaskEvents": JOB_READ,
    "/peloton.v1.TaskService/GetTaskLogs": JOB_READ,  # and the job's owner, unless job.secrets.any
    "/peloton.v1.ResourcePoolService/CreatePool": POOL_WRITE,
    "/peloton.v1.ResourcePoolService/UpdatePool": POOL_WRITE,
    "/peloton.v1.ResourcePoolService/DeletePool": POOL_WRITE,
    "/peloton.v1.ResourcePoolService/GetPool": POOL_READ,
    "/peloton.v1.ResourcePoolService/ListPools": POOL_READ,
    "/peloton.v1.ResourcePoolService/ListQueue": POOL_READ,
    "/peloton.v1.HostService/ListHosts": HOST_READ,
    "/peloton.v1.HostService/DrainHost": HOST_OPERATE,
    "/peloton.v1.HostService/UndrainHost": HOST_OPERATE,
    "/peloton.v1.SimService/FailHost": HOST_OPERATE,
    "/peloton.v1.SimService/RecoverHost": HOST_OPERATE,
    "/peloton.v1.AuditService/ListAuditEvents": AUDIT_READ,
    "/peloton.v1.ClusterService/GetClusterInfo": HOST_READ,  # every role: who am I, how is this daemon set up
    "/peloton.v1.ClusterService/GetClusterSummary": HOST_READ,  # every role: the cluster at a glance
    "/peloton.v1.ModelService/CreateModel": JOB_CREATE,  # replacing one: its owner or an admin (api/model_service.py)
    "/peloton.v1.ModelService/GetModel": JOB_READ,
    "/peloton.v1.ModelService/ListModels": JOB_READ,
    "/peloton.v1.ModelService/DeleteModel": JOB_CONTROL_OWN,  # and the model's owner, unless an admin
    # decided by how the caller came, not by a role (auth.Authenticator.authorize): the daemon's own user over its
    # owner-only socket makes a one-time console login; only the daemon's own console spends one
    "/peloton.v1.ClusterService/CreateConsoleLogin": "via:unix socket",
    "/peloton.v1.ClusterService/RedeemConsoleLogin": "via:console",
}
VIA = "via:"  # a METHODS value naming the one way a caller may come, instead of a permission
# The calls that change something: what the per-principal rate limit counts (--rate-limit).
MUTATING = frozenset({"/peloton.v1.JobService/CreateJob", "/peloton.v1.JobService/StopJob",
                      "/peloton.v1.JobService/DeleteJob", "/peloton.v1.ResourcePoolService/CreatePool",
                      "/peloton.v1.ResourcePoolService/UpdatePool",
                      "/peloton.v1.ResourcePoolService/DeletePool", "/peloton.v1.HostService/DrainHost",
                      "/peloton.v1.HostService/UndrainHost", "/peloton.v1.SimService/FailHost",
                      "/peloton.v1.SimService/RecoverHost", "/peloton.v1.ModelService/CreateModel",
                      "/peloton.v1.ModelService/DeleteModel", "/peloton.v1.ClusterService/CreateConsoleLogin",
                      "/peloton.v1.ClusterService/RedeemConsoleLogin"})
TOKEN_PREFIX = "pt_"


def hash_token(token: str) -> str:
    return "sha256:" + hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


@dataclass(frozen=True)
class Entry:
    roles: frozenset[str]
    tokens: tuple[str, ...]
    users: frozenset[str] = frozenset()
    user: str = ""


_UNIX_USER = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}")  # fullmatch: POSIX portable names, as task.user


def parse_principals(text: str, where: str) -> dict[str, Entry]:
    """The principals file's content; InvalidArgument naming the file and the key at fault."""
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise InvalidArgument(f"{where}: not JSON: {e}", field="principals") from None
    if not isinstance(doc, dict) or set(doc) - {"principals"} or not isinstance(doc.get("principals", {}), dict):
        raise InvalidArgument(f"{where}: expected {{\"principals\": {{NAME: {{...}}}}}}", field="principals")
    out: dict[str, Entry] = {}
    owner_of: dict[str, str] = {}  # Unix user -> the principal it belongs to
    for name, spec in doc.get("principals", {}).items():
        if not isinstance(spec, dict) or set(spec) - {"roles", "tokens", "user", "users"}:
            raise InvalidArgument(f"{where}: principals.{name}: expected {{\"roles\": [...], \"tokens\": [...], "
                                  f"\"user\": \"...\", \"users\": [...]}}", field=f"principals.{name}")
        roles, tokens, users = spec.get("roles", []), spec.get("tokens", []), spec.get("users", [])
        user = spec.get("user", "")
        if not isinstance(roles, list) or any(r not in ROLES for r in roles):
            raise InvalidArgument(f"{where}: principals.{name}.roles: {roles!r}: each one of "
                                  f"{', '.join(ROLES)}", field=f"principals.{name}.roles")
        if not isinstance(tokens, list) or any(not isinstance(t, str) or not t.startswith("sha256:")
                                               for t in tokens):
            raise InvalidArgument(f"{where}: principals.{name}.tokens: hashes (\"sha256:...\") only",
                                  field=f"principals.{name}.tokens")
        if not isinstance(users, list) or any(not isinstance(u, str) or not _UNIX_USER.fullmatch(u)
                                              for u in users):
            raise InvalidArgument(f"{where}: principals.{name}.users: a list of Unix user names",
                                  field=f"principals.{name}.users")
        if user != "" and (not isinstance(user, str) or not _UNIX_USER.fullmatch(user)):
            raise InvalidArgument(f"{where}: principals.{name}.user: {user!r} is not a Unix user name",
                                  field=f"principals.{name}.user")
        if user == "root":
            raise InvalidArgument(f"{where}: principals.{name}.user: root is nobody's identity: list it in users "
                                  "(a job may then name task.user root, in a pool created with --allow-root)",
                                  field=f"principals.{name}.user")
        for u in dict.fromkeys([user, *users]):
            if not u or u == "root":
                continue
            other = owner_of.setdefault(u, name)
            if other != name:  # two principals in one uid could read and signal each other's tasks
                key = "user" if u == user else "users"
                raise InvalidArgument(f"{where}: principals.{name}.{key}: the Unix user {u!r} is already "
                                      f"principals.{other}'s; one Unix user belongs to one principal",
                                      field=f"principals.{name}.{key}")
        out[name] = Entry(frozenset(roles), tuple(tokens), frozenset(users), user)
    return out


def read_principals_text(path: Path) -> str:
    """The principals file's text, read up to limits.MAX_PRINCIPALS_FILE_BYTES and no further (a larger one, or
    /dev/zero, is refused naming the file and the limit); InvalidArgument when it is not UTF-8 text. OSError as
    reading it raised it."""
    raw = read_bounded(path, limits.MAX_PRINCIPALS_FILE_BYTES, f"--principals-file: {path}", "a principals file",
                       field="--principals-file")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidArgument(f"{path}: not JSON: not UTF-8 text (at byte {e.start + 1})", field="principals") from None


def check_principals_file(path: Path) -> None:
    """The principals file as the daemon will load it (its size, its text, its entries), checked before anything is
    started or written. Not its mode: the daemon tightens what is directly in its data dir first (files.py), where
    the default one lives, and `Principals` checks the mode then."""
    try:
        parse_principals(read_principals_text(path), str(path))
    except OSError as e:
        raise FailedPrecondition(f"--principals-file: cannot read {path}: {e}", field="--principals-file") from None


RELOAD_WAIT_S = 5.0  # a check waits at most this long for the reload of the principals file already under way


@dataclass(frozen=True)
class _Loaded:
    """One version of the principals file, replaced whole (a reader never sees half of a reload)."""

    mtime: tuple[int, int, int]  # a rewrite changes one of them
    entries: dict[str, Entry]
    by_hash: dict[str, str]


class Principals:
    """The principals file, read again when it changes (checked at most once a second, and at once for a token
    it does not know), so a new token works without a restart and a removed one stops working within a second. A
    file that became unreadable or invalid keeps the last good version (logged).

    Every authenticated call reads the loaded version with no lock; the file's stat and read run with no lock held
    (`_lock` guards only which check is due and that one reload runs at a time)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._reloaded = threading.Condition(self._lock)  # a reload ended
        self._reloading = False
        self._checked = 0.0
        self._loaded = _Loaded((0, 0, 0), {}, {})
        self._load(strict=True)

    def _load(self, strict: bool) -> None:
        mtime = self._loaded.mtime
        try:
            st = self.path.stat()
            mtime = (st.st_mtime_ns, st.st_ino, st.st_size)
            if st.st_mode & 0o077:
                raise FailedPrecondition(f"--principals-file: {self.path} is readable by others (mode "
                                         f"{st.st_mode & 0o777:o}); chmod 600 it", field="--principals-file")
            entries = parse_principals(read_principals_text(self.path), str(self.path))
        except (OSError, InvalidArgument, FailedPrecondition) as e:
            if strict:
                if isinstance(e, OSError):
                    raise FailedPrecondition(f"--principals-file: cannot read {self.path}: {e}",
                                             field="--principals-file") from None
                raise
            log.error("principals file %s not reloaded (keeping the last good one): %s", self.path, e)
            old = self._loaded
            self._loaded = _Loaded(mtime, old.entries, old.by_hash)  # not again until it changes
            return
        self._loaded = _Loaded(mtime, entries, {h: name for name, e in entries.items() for h in e.tokens})

    def _fresh(self, now_please: bool = False) -> None:
        now = time.monotonic()
        with self._lock:
            if now - self._checked < 1.0 and not now_please:
                return
            self._checked = now
        try:
            st = self.path.stat()
        except OSError:
            return
        mtime = (st.st_mtime_ns, st.st_ino, st.st_size)
        with self._lock:
            while self._reloading:  # the reload in flight may be of this very version: its answer, then judge
                if not self._reloaded.wait(RELOAD_WAIT_S):
                    return
            if mtime == self._loaded.mtime:
                return
            self._reloading = True
        try:
            self._load(strict=False)
        finally:
            with self._lock:
                self._reloading = False
                self._reloaded.notify_all()

    def by_token(self, token: str) -> Principal | None:
        """The token's principal; an unknown token has the file checked again at once (a token just created)."""
        self._fresh()
        found = self._find(token)
        if found is None:
            self._fresh(now_please=True)
            found = self._find(token)
        return found

    def _find(self, token: str) -> Principal | None:
        h = hash_token(token)
        loaded = self._loaded
        for known, name in loaded.by_hash.items():
            if hmac.compare_digest(known, h):
                e = loaded.entries[name]
                return Principal(name, e.roles, "token", e.users, e.user)
        return None

    def entry_of(self, name: str) -> Entry:
        """The roles and users of the principal `name` (none for a name the file does not know)."""
        self._fresh()
        return self._loaded.entries.get(name) or Entry(frozenset(), ())


def add_token(path: Path, name: str, roles: Iterable[str], user: str | None = None) -> str:
    """Create a token for `name` (a new principal gets `roles`; given roles replace an existing one's) in the
    principals file (created owner-only); returns the token, which is stored only as its hash. `user`: map the
    principal to that Unix user (its tasks' identity; "" removes the mapping; None leaves it as it is)."""
    if not name or len(name) > 128 or any(c.isspace() or c in "/,=\"" for c in name):
        raise InvalidArgument(f"NAME: {name!r} is not a principal name (1-128 characters, no spaces, / , = \")",
                              field="NAME")
    roles = list(dict.fromkeys(roles))
    for r in roles:
        if r not in ROLES:
            raise InvalidArgument(f"--role: {r!r} is not one of {', '.join(ROLES)}", field="--role")
    doc: dict[str, dict[str, dict[str, Any]]] = {"principals": {}}
    if path.exists():
        text = read_principals_text(path)
        parse_principals(text, str(path))  # refuse to rewrite a file that is not valid
        doc = json.loads(text)
        doc.setdefault("principals", {})
    entry = doc["principals"].setdefault(name, {"roles": [], "tokens": []})
    if roles:
        entry["roles"] = roles
    elif not entry.get("roles"):
        raise InvalidArgument(f"--role: {name} is a new principal: give it a role ({', '.join(ROLES)})",
                              field="--role")
    if user is not None:
        if user:
            entry["user"] = user
        else:
            entry.pop("user", None)
    token = new_token()
    entry.setdefault("tokens", []).append(hash_token(token))
    # what is written must load: a user already another principal's is refused here, naming --user
    try:
        parse_principals(json.dumps(doc), str(path))
    except InvalidArgument as e:
        raise InvalidArgument(f"--user: {e.message}", field="--user") from None
    _write_principals(path, doc)
    return token


def _write_principals(path: Path, doc: dict[str, Any]) -> None:
    """The principals file replaced whole (a daemon reading it sees the old or the new one), owner-only."""
    make_dirs(path.parent)  # owner-only, the missing ones above it too (files.py)
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)  # a leftover keeps its mode: the new one is made 0600
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f, indent=2, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


TOKEN_ID_CHARS = 12  # a token's id: the first hex digits of its hash (what `token list` shows, `token revoke` takes)
MIN_TOKEN_ID_CHARS = 6  # a shorter prefix of an id is refused (it would match too easily)


def token_id(hashed: str) -> str:
    """The id of a token stored as `hashed` ("sha256:..."): names it without being it."""
    return hashed.removeprefix("sha256:")[:TOKEN_ID_CHARS]


def list_principals(path: Path) -> dict[str, Entry]:
    """The principals file's entries (InvalidArgument naming the file and key at fault; NotFound with no file)."""
    return parse_principals(_principals_text(path), str(path))


def _principals_text(path: Path) -> str:
    if not path.exists():
        raise NotFound(f"--principals-file: {path} does not exist (`peloton token create` makes it)",
                       field="--principals-file")
    return read_principals_text(path)


def revoke_tokens(path: Path, name: str, ids: Iterable[str], every: bool = False) -> list[str]:
    """Remove tokens of principal `name` from the principals file: those whose id starts with one of `ids`
    (each matching exactly one of its tokens), or with `every` all of them. The principal stays, with its roles
    (a client certificate may still name it). Returns the ids removed. Nothing is written on an error. A running
    daemon reads the file again within a second; open streams of a revoked token end within 6 s (auth.py)."""
    text = _principals_text(path)
    entries = parse_principals(text, str(path))
    if name not in entries:
        raise NotFound(f"NAME: no principal {name!r} in {path}", field="NAME")
    hashes = list(entries[name].tokens)
    wanted = list(dict.fromkeys(ids))
    if every == bool(wanted):
        raise InvalidArgument("--id: give the ids of the tokens to revoke (`peloton token list` shows them), or --all",
                              field="--id")
    gone: list[str] = []
    for want in wanted:
        if len(want) < MIN_TOKEN_ID_CHARS or len(want) > TOKEN_ID_CHARS or any(c not in "0123456789abcdef" for c in want):
            raise InvalidArgument(f"--id: {want!r} is not a token id ({MIN_TOKEN_ID_CHARS} to {TOKEN_ID_CHARS} "
                                  "lowercase hex digits, as `peloton token list` shows them)", field="--id")
        match = [h for h in hashes if token_id(h).startswith(want)]
        if len(match) != 1:
            have = ", ".join(token_id(h) for h in hashes) or "none"
            raise NotFound(f"--id: {want} {'matches no' if not match else 'matches more than one'} token of {name} "
                           f"(its tokens: {have})", field="--id")
        if match[0] not in gone:  # (a prefix and the whole id of one token: once)
            gone.append(match[0])
    if every:
        gone = hashes
    doc = json.loads(text)
    doc["principals"][name]["tokens"] = [h for h in hashes if h not in gone]
    _write_principals(path, doc)
    return [token_id(h) for h in gone]
