"""Where the public measurements and traces are: `../shared/data/public` beside the checkout (its SOURCES.md says
what and from where). They are read from there, never copied into the repository.

A clone elsewhere (CI clones the checkout into a temporary directory) finds them beside the checkout it was cloned
from (its `origin`, when that is a path on this machine); PELOTON_PUBLIC_DATA names the folder outright."""

from __future__ import annotations

import os
import subprocess
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RELATIVE = Path("shared") / "data" / "public"


def _origin() -> Path | None:
    try:
        url = subprocess.run(["git", "-C", str(ROOT), "config", "--get", "remote.origin.url"], capture_output=True,
                             text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    if not url or "://" in url or ":" in url.split("/")[0]:  # a remote repository, not a path here
        return None
    return Path(url).resolve()


@cache
def public_data() -> Path | None:
    """The folder, or None when it is nowhere to be found."""
    candidates = []
    if os.environ.get("PELOTON_PUBLIC_DATA"):
        candidates.append(Path(os.environ["PELOTON_PUBLIC_DATA"]))
    candidates.append(ROOT.parent / RELATIVE)
    origin = _origin()
    if origin is not None:
        candidates.append(origin.parent / RELATIVE)
    return next((c for c in candidates if (c / "SOURCES.md").is_file()), None)


def require() -> Path:
    """The folder; a clear error when it is missing."""
    found = public_data()
    if found is None:
        raise FileNotFoundError(f"the public data is not beside the checkout ({ROOT.parent / RELATIVE}) nor beside "
                                "the repository it was cloned from; set PELOTON_PUBLIC_DATA to its folder")
    return found
