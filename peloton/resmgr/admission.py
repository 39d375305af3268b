"""Admission of a whole gang against its pool and every ancestor. Pure.

This release enforces each pool's `limit` (hierarchically: a gang counts against its pool and all ancestors).
Reservations and shares are stored and shown but not yet used to divide capacity (a later issue).
"""

from __future__ import annotations

from collections.abc import Mapping

from peloton.domain.model import ResourcePool
from peloton.domain.resources import Resources


def ancestors(path: str) -> list[str]:
    """'/a/b' -> ['/a/b', '/a', '/']."""
    out = [path]
    while path != "/":
        path = path.rsplit("/", 1)[0] or "/"
        out.append(path)
    return out


def admit(
    gang_total: Resources,
    pool_path: str,
    pools: Mapping[str, ResourcePool],
    allocated: Mapping[str, Resources],
) -> str | None:
    """None when the gang may be admitted; otherwise the reason it waits. `allocated[p]` is what gangs in p and
    its descendants hold now."""
    if pool_path not in pools:
        return f"resource pool {pool_path} does not exist"
    for p in ancestors(pool_path):
        pool = pools.get(p)
        if pool is None or pool.limit is None:
            continue
        used = allocated.get(p, Resources())
        after = used + gang_total
        short = after.short_of(Resources(pool.limit.cpu, pool.limit.mem, pool.limit.disk, pool.limit.gpu, 10**9))
        short = [d for d in short if _limited(pool.limit, d)]
        if short:
            return (
                f"waiting for admission: pool {p} limit {pool.limit.describe()} would be exceeded in "
                f"{', '.join(short)} (allocated {used.describe()}, gang needs {gang_total.describe()})"
            )
    return None


def exceeds_limit_forever(gang_total: Resources, pool_path: str, pools: Mapping[str, ResourcePool]) -> str | None:
    """A gang larger than a limit on its path can never be admitted."""
    for p in ancestors(pool_path):
        pool = pools.get(p)
        if pool is None or pool.limit is None:
            continue
        short = [d for d in gang_total.short_of(Resources(pool.limit.cpu, pool.limit.mem, pool.limit.disk,
                                                            pool.limit.gpu, 10**9)) if _limited(pool.limit, d)]
        if short:
            return f"gang needs {gang_total.describe()}, more than pool {p} limit {pool.limit.describe()} ({', '.join(short)})"
    return None


def _limited(limit: Resources, dim: str) -> bool:
    # a zero in a limit means "not limited in this dimension" so `limit: {gpu: 8}` limits only GPUs
    return bool(getattr(limit, dim))
