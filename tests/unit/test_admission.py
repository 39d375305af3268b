"""Admission of whole gangs against hierarchical pool limits (zero in a limit dimension means unlimited)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from peloton.domain.model import ResourcePool
from peloton.domain.resources import Resources
from peloton.resmgr.admission import admit, exceeds_limit_forever
from peloton.resmgr.paths import ancestors

R = Resources


def pools(*specs: tuple[str, Resources | None]) -> dict[str, ResourcePool]:
    out = {"/": ResourcePool("/")}
    for path, limit in specs:
        out[path] = ResourcePool(path, limit=limit)
    return out


@pytest.mark.parametrize("path,expected", [
    ("/", ["/"]),
    ("/a", ["/a", "/"]),
    ("/a/b", ["/a/b", "/a", "/"]),
    ("/team/vision/gpu-1", ["/team/vision/gpu-1", "/team/vision", "/team", "/"]),
])
def test_ancestors(path: str, expected: list[str]) -> None:
    assert ancestors(path) == expected


@given(st.lists(st.from_regex(r"[a-z0-9_.-]{1,6}", fullmatch=True), min_size=0, max_size=6))
@settings(max_examples=100, deadline=None)
def test_ancestors_walks_to_the_root(parts: list[str]) -> None:
    path = "/" + "/".join(parts)
    chain = ancestors(path)
    assert chain[0] == path and chain[-1] == "/"
    assert len(chain) == len(parts) + 1
    for child, parent in zip(chain, chain[1:], strict=False):
        assert child.startswith(parent)


def test_unknown_pool_is_never_admitted() -> None:
    why = admit(R(cpu=1), "/nope", pools(), {})
    assert why is not None and "/nope" in why and "does not exist" in why


def test_no_limit_admits_anything() -> None:
    assert admit(R(cpu=1e6, mem=1e9, gpu=1000), "/", pools(), {"/": R(cpu=1e6)}) is None
    assert admit(R(cpu=1e6), "/a", pools(("/a", None)), {}) is None


@pytest.mark.parametrize("used,gang,ok", [
    (R(), R(cpu=4, mem=1024), True),
    (R(cpu=2), R(cpu=2), True),  # exactly at the limit
    (R(cpu=2), R(cpu=2.5), False),
    (R(mem=3000), R(mem=1096), True),
    (R(mem=3000), R(mem=1097), False),
    (R(gpu=1), R(gpu=1), True),
    (R(gpu=1), R(gpu=2), False),
])
def test_admit_against_a_limit(used: Resources, gang: Resources, ok: bool) -> None:
    ps = pools(("/a", R(cpu=4, mem=4096, gpu=2)))
    why = admit(gang, "/a", ps, {"/a": used, "/": used})
    assert (why is None) == ok
    if not ok:
        assert "pool /a" in why and "waiting for admission" in why  # type: ignore[operator]


def test_zero_in_a_limit_dimension_is_unlimited() -> None:
    ps = pools(("/g", R(gpu=2)))  # limits only GPUs
    assert admit(R(cpu=1000, mem=1e7, disk=1e7, ports=64), "/g", ps, {}) is None
    why = admit(R(gpu=3), "/g", ps, {})
    assert why is not None and "exceeded in gpu (" in why


def test_ports_are_never_limited() -> None:
    ps = pools(("/a", R(cpu=1, mem=1, gpu=1, disk=1, ports=1)))
    assert admit(R(cpu=1, mem=1, gpu=1, disk=1, ports=500), "/a", ps, {}) is None


def test_the_reason_names_the_short_dimensions_usage_and_need() -> None:
    ps = pools(("/a", R(cpu=4, mem=1024)))
    why = admit(R(cpu=2, mem=1024), "/a", ps, {"/a": R(cpu=3, mem=512)})
    assert why is not None
    assert "cpu, mem" in why
    assert "allocated cpu=3,mem=512Mi" in why and "gang needs cpu=2,mem=1Gi" in why


def test_a_parent_limit_counts_allocations_of_all_descendants() -> None:
    ps = pools(("/team", R(cpu=8)), ("/team/a", None), ("/team/b", R(cpu=6)))
    # the caller sums allocations up the tree: 6 cpus held somewhere under /team
    alloc = {"/team/a": R(cpu=6), "/team": R(cpu=6), "/": R(cpu=6)}
    assert admit(R(cpu=2), "/team/b", ps, alloc) is None
    why = admit(R(cpu=3), "/team/b", ps, alloc)
    assert why is not None and "pool /team " in why
    # the child's own limit is checked too, before its parent's
    why = admit(R(cpu=7), "/team/b", ps, {})
    assert why is not None and "pool /team/b " in why


def test_a_limit_on_the_root_applies_to_every_pool() -> None:
    ps = pools(("/a", None))
    ps["/"] = ResourcePool("/", limit=R(gpu=4))
    assert admit(R(gpu=4), "/a", ps, {}) is None
    why = admit(R(gpu=1), "/a", ps, {"/": R(gpu=4)})
    assert why is not None and "pool / " in why


def test_missing_intermediate_pool_is_skipped() -> None:
    ps = pools(("/x/y", R(cpu=1)))  # /x is not in the mapping
    assert admit(R(cpu=1), "/x/y", ps, {}) is None
    assert admit(R(cpu=2), "/x/y", ps, {}) is not None


@pytest.mark.parametrize("gang,path,short", [
    (R(cpu=9), "/team/b", "cpu"),
    (R(cpu=7), "/team/b", "cpu"),  # the child limit is 6
    (R(gpu=3), "/team/a", "gpu"),
    (R(mem=2048), "/team", None),  # mem is unlimited (zero) everywhere
    (R(cpu=6, gpu=2), "/team/b", None),
])
def test_exceeds_limit_forever(gang: Resources, path: str, short: str | None) -> None:
    ps = pools(("/team", R(cpu=8, gpu=2)), ("/team/a", None), ("/team/b", R(cpu=6)))
    why = exceeds_limit_forever(gang, path, ps)
    if short is None:
        assert why is None
    else:
        assert why is not None and f"({short})" in why and "more than pool" in why


def test_exceeds_limit_forever_ignores_current_usage_and_unknown_pools() -> None:
    ps = pools(("/a", R(cpu=4)))
    assert exceeds_limit_forever(R(cpu=4), "/a", ps) is None
    assert exceeds_limit_forever(R(cpu=100), "/unknown", ps) is None


@given(
    limit=st.integers(0, 8), used=st.integers(0, 8), need=st.integers(0, 8),
)
@settings(max_examples=200, deadline=None)
def test_admit_is_consistent_with_exceeds_limit_forever(limit: int, used: int, need: int) -> None:
    ps = pools(("/a", R(gpu=limit, cpu=1)))
    alloc = {"/a": R(gpu=used), "/": R(gpu=used)}
    forever = exceeds_limit_forever(R(gpu=need), "/a", ps)
    now = admit(R(gpu=need), "/a", ps, alloc)
    if forever is not None:
        assert now is not None  # never admitted
    if limit == 0:
        assert forever is None and now is None
    else:
        assert (now is None) == (used + need <= limit)
        assert (forever is None) == (need <= limit)
