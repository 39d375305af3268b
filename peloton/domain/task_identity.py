"""A job's task identity as its spec keeps it (`run_as`, decided when the job is created: peloton/security/run_as.py)
and how it reads: "" the backend's default user, a Unix user's name, or "#<uid>" for a uid allocated to the job's
principal. Plain data."""

from __future__ import annotations

DYNAMIC_PREFIX = "#"


def dynamic(uid: int) -> str:
    return f"{DYNAMIC_PREFIX}{uid}"


def dynamic_uid(run_as: str) -> int | None:
    """The uid of an allocated identity ("#65537"), None for a user name or ""."""
    if not run_as.startswith(DYNAMIC_PREFIX):
        return None
    try:
        return int(run_as[len(DYNAMIC_PREFIX):])
    except ValueError:
        return None


def describe(run_as: str | None) -> str:
    """How a job's identity reads in `peloton job get`."""
    if run_as is None:
        return ""
    uid = dynamic_uid(run_as)
    if uid is not None:
        return f"uid {uid}"
    return run_as
