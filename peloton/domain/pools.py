"""The resource-pool tree's rules, checked before a pool is created or changed. Pure: the pools in, an error naming
the field at fault (nothing is written then) or the warnings worth telling the admin.

- A pool's limit is never below its reservation (per dimension; a 0 in a limit is "unlimited" there).
- A pool's children reserve together at most what it reserves (per dimension). The root reserves nothing of its
  own: its children are checked against the cluster's capacity instead, and only warned about (capacity comes and
  goes with hosts; while it is short, reservations are scaled down: peloton/resmgr/entitlement.py).
- Jobs go to leaf pools only: a pool with unfinished jobs gets no children, and a new job names a leaf. The root is
  the exception: it is where the jobs of a cluster without pools run, and it keeps taking jobs once it has
  children (its own gangs then share it with them as one more child, elastic, share 1, no reservation).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from peloton.domain import checks, limits
from peloton.domain.model import ResourcePool
from peloton.domain.resources import Resources, show_quantity
from peloton.domain.spec import validate_pool_path
from peloton.errors import FailedPrecondition, InvalidArgument, NotFound

RESERVATION_TYPES = ("elastic", "static")
DIMS = ("cpu", "mem", "disk", "gpu")
_EPS = 1e-9


def show(dim: str, value: float) -> str:
    """A quantity as the CLI takes it: `16Gi` for memory and disk, `8` for cpu and gpu (show_quantity)."""
    return show_quantity(dim, value)


def children(pools: Iterable[ResourcePool], path: str) -> list[ResourcePool]:
    return sorted((p for p in pools if p.parent == path), key=lambda p: p.path)


def check_job_pool(pools: Mapping[str, ResourcePool], path: str) -> None:
    """A new job's pool: it exists and is a leaf, or the root. InvalidArgument naming `respool`. Checked against the
    pools in memory; the job's commit checks it again in the store (repo._check_pools), where a pool change made
    meanwhile is seen."""
    if path not in pools:
        raise InvalidArgument(f"respool: resource pool {path} does not exist", field="respool")
    if path == "/":
        return
    kids = children(pools.values(), path)
    if kids:
        names = ", ".join(k.path for k in kids[:5]) + (" ..." if len(kids) > 5 else "")
        raise InvalidArgument(f"respool: {path} has child pools ({names}); jobs go to a leaf pool",
                              field="respool")


def check_pool(pools: Mapping[str, ResourcePool], pool: ResourcePool, capacity: Resources | None = None,
               busy: int = 0) -> list[str]:
    """`pool` as it is to be (created, or changed) among `pools` (as they are now). Raises InvalidArgument or
    FailedPrecondition naming the field; returns warnings. `busy`: unfinished jobs in `pool`'s parent (a new
    pool would make it a non-leaf)."""
    if pool.reservation_type not in RESERVATION_TYPES:
        raise checks.bad("pool.reservation_type", f"{checks.show(pool.reservation_type)} is not one of "
                                                  f"{', '.join(RESERVATION_TYPES)}")
    limit = pool.limit
    if limit is not None:
        for dim in DIMS:
            cap, res = getattr(limit, dim), getattr(pool.reservation, dim)
            if cap and res > cap + _EPS:
                raise checks.bad(f"pool.limit.{dim}", f"{show(dim, cap)} is below the pool's reservation "
                                                      f"{show(dim, res)}")
    parent = pool.parent
    if parent is not None and parent not in pools:
        raise NotFound(f"pool.path: the parent pool {parent} of {pool.path} does not exist", field="pool.path")
    if pool.path not in pools and busy and parent != "/":
        raise FailedPrecondition(f"pool.path: {parent} has {busy} unfinished job(s); jobs go to leaf pools, so "
                                 f"{parent} can get children only when they are done", field="pool.path")
    warnings: list[str] = []
    # its own children, when it is changed: they must still fit in what it reserves
    mine = children(pools.values(), pool.path)
    if mine and pool.path != "/":
        _fits(pool, mine, "pool.reservation", f"the children of {pool.path}")
    # its siblings and itself in its parent
    if parent is not None:
        siblings = [p for p in children(pools.values(), parent) if p.path != pool.path] + [pool]
        if parent == "/":
            if capacity is not None:
                warnings += _over_capacity(siblings, capacity)
        else:
            _fits(pools[parent], siblings, "pool.reservation", f"{pool.path} and its siblings")
    return warnings


def _overreserved(kids: list[ResourcePool], have: Resources) -> list[tuple[str, float, float]]:
    """(dimension, what `kids` reserve together, what `have` has) where they reserve more than it has."""
    out = []
    for dim in DIMS:
        total = sum(getattr(k.reservation, dim) for k in kids)
        if total > getattr(have, dim) + _EPS:
            out.append((dim, total, getattr(have, dim)))
    return out


def _fits(parent: ResourcePool, kids: list[ResourcePool], field: str, who: str) -> None:
    for dim, total, have in _overreserved(kids, parent.reservation)[:1]:
        raise checks.bad(f"{field}.{dim}", f"{who} would reserve {show(dim, total)} in all, more than "
                                           f"{parent.path} reserves ({show(dim, have)})")


def _over_capacity(kids: list[ResourcePool], capacity: Resources) -> list[str]:
    return [f"the top-level pools reserve {show(dim, total)} {dim} in all, more than the cluster has now "
            f"({show(dim, have)}): their reservations are scaled down while it is this small"
            for dim, total, have in _overreserved(kids, capacity)]


def validate_pool(pool: ResourcePool, updating: bool = False) -> ResourcePool:
    """A pool to create (not /) or to update: its path, and reservation, limit and share within the pool limits.
    The root may be updated (its limit, access list, allow_root) but reserves nothing: it is the whole cluster."""
    validate_pool_path(pool.path, "pool.path")
    if pool.path == "/" and not updating:
        raise checks.bad("pool.path", "the root pool / always exists (peloton pool update / changes it)")
    if pool.path == "/" and pool.reservation != Resources():
        raise checks.bad("pool.reservation", "the root pool / reserves nothing: it is the whole cluster")
    for name, res in (("reservation", pool.reservation), ("limit", pool.limit)):
        if res is None:
            continue
        f = f"pool.{name}"
        checks.number(res.cpu, f"{f}.cpu", minimum=0, maximum=limits.MAX_POOL_CPU, granularity=limits.MIN_CPU,
                      unit="cores")
        checks.number(res.mem, f"{f}.mem", minimum=0, maximum=limits.MAX_POOL_MEM_MIB,
                      granularity=limits.MIN_MEM_MIB, unit="MiB")
        checks.number(res.disk, f"{f}.disk", minimum=0, maximum=limits.MAX_POOL_DISK_MIB,
                      granularity=limits.MIN_MEM_MIB, unit="MiB")
        checks.integer(res.gpu, f"{f}.gpu", minimum=0, maximum=limits.MAX_POOL_GPU)
        checks.integer(res.ports, f"{f}.ports", minimum=0, maximum=limits.MAX_POOL_PORTS)
    if len(pool.submitters) > limits.MAX_POOL_SUBMITTERS:
        raise checks.bad("pool.submitters", f"at most {limits.MAX_POOL_SUBMITTERS} principals, got "
                                            f"{len(pool.submitters)}")
    for i, name in enumerate(pool.submitters):
        checks.text(name, f"pool.submitters[{i}]", max_chars=limits.MAX_PRINCIPAL_CHARS)
        if not name or any(c.isspace() or c in "/,=\"" for c in name):
            raise checks.bad(f"pool.submitters[{i}]", f"{checks.show(name)} is not a principal name")
    checks.number(pool.share, "pool.share", minimum=limits.MIN_POOL_SHARE, maximum=limits.MAX_POOL_SHARE)
    return pool
