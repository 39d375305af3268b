"""Which daemon a client command talks to, and how: the address and TLS files, from flags, then environment
variables, then a context of the client config file, then the defaults (the daemon's Unix socket in the default
data dir when this user may open it, else 127.0.0.1:5391).

The config file (`$PELOTON_CONFIG`, else `$XDG_CONFIG_HOME/peloton/config.toml`, else
`~/.config/peloton/config.toml`) holds named contexts, like kubectl's; one is current:

    current-context = "prod"

    [contexts.prod]
    address = "peloton.example.com:5391"
    tls-ca = "/etc/peloton/ca.pem"          # relative paths are relative to the config file
    client-cert = "~/.peloton/client.pem"
    client-key = "~/.peloton/client-key.pem"
    token = "pt_..."                         # or a bearer token (`peloton token create`)

`--context NAME` (or `$PELOTON_CONTEXT`) picks another. Standard library only (tomllib is read only when the file
exists)."""

from __future__ import annotations

import os

from peloton import config
from peloton.errors import InvalidArgument

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse

KEYS = ("address", "tls-ca", "client-cert", "client-key", "token")
ENV = {"address": "PELOTON_ADDRESS", "tls-ca": "PELOTON_TLS_CA", "client-cert": "PELOTON_CLIENT_CERT",
       "client-key": "PELOTON_CLIENT_KEY", "token": "PELOTON_TOKEN"}
PATHS = ("tls-ca", "client-cert", "client-key")


class Target:
    def __init__(self, address: str, tls_ca: str | None = None, client_cert: str | None = None,
                 client_key: str | None = None, context: str | None = None, token: str | None = None) -> None:
        self.address, self.tls_ca, self.client_cert, self.client_key = address, tls_ca, client_cert, client_key
        self.context = context
        self.token = token
        # the data dir's socket looked for in vain when no address was given (the CLI then tried the default TCP
        # address): a daemon that cannot be reached there is told where the socket was looked for
        self.searched: str | None = None

    @property
    def tls(self) -> bool:
        return bool(self.tls_ca or self.client_cert)


def config_path() -> str:
    if os.environ.get("PELOTON_CONFIG"):
        return os.environ["PELOTON_CONFIG"]
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "peloton", "config.toml")


def read_contexts(path: str) -> tuple[str | None, dict[str, dict[str, str]]]:
    """(current context, contexts) of the config file at `path`; (None, {}) when there is none."""
    from peloton.domain import limits
    from peloton.files import read_bounded

    try:
        raw = read_bounded(path, limits.MAX_CONFIG_FILE_BYTES, path, "a client config file", field="config")
    except FileNotFoundError:
        return None, {}
    except OSError as e:
        raise InvalidArgument(f"{path}: cannot read the client config: {e.strerror}", field="config") from None
    import tomllib

    try:
        doc = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise InvalidArgument(f"{path}: not valid TOML: {e}", field="config") from None
    unknown = set(doc) - {"current-context", "contexts"}
    if unknown:
        raise InvalidArgument(f"{path}: unknown key {sorted(unknown)[0]!r} (known: current-context, contexts)",
                              field="config")
    current = doc.get("current-context")
    if current is not None and not isinstance(current, str):
        raise InvalidArgument(f"{path}: current-context: must be a string", field="current-context")
    contexts = doc.get("contexts", {})
    if not isinstance(contexts, dict):
        raise InvalidArgument(f"{path}: contexts: must be a table of [contexts.NAME]", field="contexts")
    out: dict[str, dict[str, str]] = {}
    base = os.path.dirname(os.path.abspath(path))
    for name, ctx in contexts.items():
        if not isinstance(ctx, dict):
            raise InvalidArgument(f"{path}: contexts.{name}: must be a table", field=f"contexts.{name}")
        for key, value in ctx.items():
            if key not in KEYS:
                raise InvalidArgument(f"{path}: contexts.{name}.{key}: unknown key (known: {', '.join(KEYS)})",
                                      field=f"contexts.{name}.{key}")
            if not isinstance(value, str) or not value:
                raise InvalidArgument(f"{path}: contexts.{name}.{key}: must be a non-empty string",
                                      field=f"contexts.{name}.{key}")
        out[name] = {k: (os.path.join(base, os.path.expanduser(v)) if k in PATHS else v) for k, v in ctx.items()}
    if current is not None and current not in out:
        raise InvalidArgument(f"{path}: current-context: no context {current!r} (contexts: "
                              f"{', '.join(sorted(out)) or 'none'})", field="current-context")
    return current, out


def resolve(a: argparse.Namespace) -> Target:
    """Flags, then environment variables, then the context, then the defaults."""
    flags = {"address": a.address, "tls-ca": a.tls_ca, "client-cert": a.client_cert, "client-key": a.client_key,
             "token": getattr(a, "token", None)}
    wanted = a.context or os.environ.get("PELOTON_CONTEXT")
    ctx: dict[str, str] = {}
    name: str | None = None
    path = config_path()
    current, contexts = read_contexts(path)
    if wanted:
        if wanted not in contexts:
            raise InvalidArgument(f"--context: no context {wanted!r} in {path} (contexts: "
                                  f"{', '.join(sorted(contexts)) or 'none'})", field="--context")
        name = wanted
    elif current:
        name = current
    if name is not None:
        ctx = contexts[name]
    value = {k: flags[k] or os.environ.get(ENV[k]) or ctx.get(k) for k in KEYS}
    if bool(value["client-cert"]) != bool(value["client-key"]):
        raise InvalidArgument("--client-cert, --client-key: give both or neither", field="--client-cert")
    target = Target(value["address"] or default_address(), value["tls-ca"], value["client-cert"],
                    value["client-key"], name, value["token"])
    if not value["address"] and not target.address.startswith("unix:"):
        target.searched = _socket_path()
    return target


def default_address() -> str:
    """The daemon's owner-only Unix socket in the default data dir when this user can open it (`make run`, then
    any command), else the default TCP address."""
    sock = _socket_path()
    if os.path.exists(sock) and os.access(sock, os.R_OK | os.W_OK):
        return f"unix:{sock}"
    return config.DEFAULT_LISTEN


def _socket_path() -> str:
    return os.path.join(config.default_data_dir_path(), "peloton.sock")
