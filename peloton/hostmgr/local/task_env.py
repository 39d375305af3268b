"""What a local task inherits from the daemon's environment: only the variables of an allow-list, never the whole
environment, so no secret of the daemon's (a database password, a cloud token) reaches the commands users submit.
The job's own `env` and the variables peloton sets (RANK, CUDA_VISIBLE_DEVICES, PELOTON_*) come on top.

Pure: the daemon applies it to the spawners' environment (spawn.py), which every task starts from."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from peloton.errors import InvalidArgument

# What a shell and most programs need to behave as on this machine; nothing that is usually a secret.
DEFAULT_ALLOW: tuple[str, ...] = ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "LC_*", "TZ",
                                  "TMPDIR", "TERM")
_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\*?")


def parse_allow(value: str) -> tuple[str, ...]:
    """`--task-env-allow NAME[,PREFIX*]...`: names, or prefixes ending in `*`."""
    out = []
    for item in value.split(","):
        item = item.strip()
        if not item:
            continue
        if not _PATTERN.fullmatch(item):
            raise InvalidArgument(f"--task-env-allow: {item!r} is not a variable name or a PREFIX* pattern",
                                  field="--task-env-allow")
        out.append(item)
    return tuple(out)


def inherited(environ: Mapping[str, str], extra: Iterable[str] = ()) -> dict[str, str]:
    """The variables of `environ` that DEFAULT_ALLOW or `extra` allow."""
    patterns = (*DEFAULT_ALLOW, *extra)
    names = {p for p in patterns if not p.endswith("*")}
    prefixes = tuple(p[:-1] for p in patterns if p.endswith("*"))
    return {k: v for k, v in environ.items() if k in names or (prefixes and k.startswith(prefixes))}
