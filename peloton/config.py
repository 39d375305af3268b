"""Daemon and client defaults: where data lives, which address to use."""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (the CLI imports this module)

if TYPE_CHECKING:
    from pathlib import Path

DEFAULT_LISTEN = "127.0.0.1:5391"
DEFAULT_METRICS_LISTEN = "127.0.0.1:5392"
DEFAULT_UI_LISTEN = "127.0.0.1:5393"  # the web console (docs/ui.md)
ROOT_DATA_DIR = "/var/lib/peloton"


def default_data_dir() -> Path:
    """$PELOTON_DATA_DIR, else $XDG_DATA_HOME/peloton, else ~/.local/share/peloton (per user), or /var/lib/peloton
    for root (whose tasks run as other users, who must pass through the directories above their sandboxes)."""
    from pathlib import Path  # here: the CLI's client commands do without pathlib

    return Path(default_data_dir_path())


def default_data_dir_path() -> str:
    """default_data_dir() as a string, without importing pathlib (the CLI looks for the daemon's socket there)."""
    if os.environ.get("PELOTON_DATA_DIR"):
        return os.environ["PELOTON_DATA_DIR"]
    if not os.environ.get("XDG_DATA_HOME") and os.geteuid() == 0:
        return ROOT_DATA_DIR
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(base, "peloton")


def split_hostport(value: str, field: str) -> tuple[str, int]:
    from peloton.errors import InvalidArgument

    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not (0 <= int(port) < 65536):
        raise InvalidArgument(f"{field}: expected HOST:PORT, got {value!r}", field=field)
    return host or "0.0.0.0", int(port)
