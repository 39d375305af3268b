"""The declared minimums of pyproject.toml's runtime dependencies, as pip constraints.

    python scripts/min_deps.py            print `name==floor` for every dependency (stdout)
    python scripts/min_deps.py --verify   check that this interpreter has exactly those versions

Every runtime dependency must state its floor with `>=`: an install honouring the floors is the oldest one the
project claims to support, and scripts/check_min_deps.sh installs and checks exactly that (finding a floor: lower
it in pyproject.toml and run that script). A dependency without a `>=` floor, or an upper bound below its floor, is
an error.
"""

from __future__ import annotations

import re
import sys
import tomllib
from importlib import metadata
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
_REQ = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*([^;]*?)\s*(;.*)?$")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _release(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v)[:4])


def floors(pyproject: Path = PYPROJECT) -> dict[str, tuple[str, str]]:
    """canonical name -> (name as written, floor version)."""
    deps = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    out: dict[str, tuple[str, str]] = {}
    errors = []
    for dep in deps:
        m = _REQ.match(dep)
        if m is None:
            errors.append(f"{dep!r}: not a requirement this script reads")
            continue
        name, spec = m.group(1), m.group(2)
        specs = [s.strip() for s in spec.split(",") if s.strip()]
        lows = [s[2:].strip() for s in specs if s.startswith(">=")]
        if len(lows) != 1:
            errors.append(f"{name}: states no `>=` floor ({spec or 'no version at all'})")
            continue
        for s in specs:
            if s.startswith("<") and not s.startswith("<=") and _release(s[1:]) <= _release(lows[0]):
                errors.append(f"{name}: upper bound {s} excludes its own floor {lows[0]}")
        out[canonical(name)] = (name, lows[0])
    if errors:
        sys.exit("pyproject.toml: " + "; ".join(errors))
    return out


def main(argv: list[str]) -> int:
    if argv not in ([], ["--verify"]):
        sys.exit(__doc__)
    wanted = floors()
    if not argv:
        sys.stdout.write("".join(f"{name}=={v}\n" for name, v in wanted.values()))
        return 0
    wrong = []
    for name, v in wanted.values():
        try:
            have = metadata.version(name)
        except metadata.PackageNotFoundError:
            have = "not installed"
        if have != v:
            wrong.append(f"{name} {have} (declared minimum {v})")
    if wrong:
        print("not the declared minimums: " + ", ".join(wrong), file=sys.stderr)
        return 1
    print("declared minimums installed: " + ", ".join(f"{n} {v}" for n, v in wanted.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
