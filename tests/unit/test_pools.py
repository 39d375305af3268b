"""The pool tree's rules (peloton/domain/pools.py): every refusal names its field and reason; warnings, not
refusals, where the cluster's size is what falls short."""

from __future__ import annotations

import pytest

from peloton.domain.model import ResourcePool
from peloton.domain.pools import check_job_pool, check_pool
from peloton.domain.resources import Resources
from peloton.errors import FailedPrecondition, InvalidArgument, NotFound

R = Resources


def tree(*pools: ResourcePool) -> dict[str, ResourcePool]:
    out = {"/": ResourcePool("/")}
    out.update({p.path: p for p in pools})
    return out


RESEARCH = ResourcePool("/research", reservation=R(gpu=16, cpu=64), limit=R(gpu=32))


def test_a_limit_below_the_reservation_is_refused_naming_the_dimension() -> None:
    with pytest.raises(InvalidArgument, match=r"^pool.limit.gpu: 8 is below the pool's reservation 16$"):
        check_pool(tree(), ResourcePool("/a", reservation=R(gpu=16), limit=R(gpu=8)))
    # 0 in a limit is "unlimited in that dimension": no conflict
    assert check_pool(tree(), ResourcePool("/a", reservation=R(gpu=16, cpu=4), limit=R(gpu=16))) == []


def test_children_reserve_at_most_what_their_parent_reserves() -> None:
    pools = tree(RESEARCH, ResourcePool("/research/nlp", reservation=R(gpu=10)))
    assert check_pool(pools, ResourcePool("/research/vision", reservation=R(gpu=6))) == []
    with pytest.raises(InvalidArgument, match=r"^pool.reservation.gpu: /research/vision and its siblings would "
                                              r"reserve 17 in all, more than /research reserves \(16\)$"):
        check_pool(pools, ResourcePool("/research/vision", reservation=R(gpu=7)))
    with pytest.raises(InvalidArgument, match=r"^pool.reservation.mem: .* more than /research reserves \(0Mi\)$"):
        check_pool(pools, ResourcePool("/research/vision", reservation=R(mem=1024)))


def test_a_parent_cannot_shrink_below_what_its_children_reserve() -> None:
    pools = tree(RESEARCH, ResourcePool("/research/nlp", reservation=R(gpu=10)))
    smaller = ResourcePool("/research", reservation=R(gpu=8, cpu=64), limit=R(gpu=32))
    with pytest.raises(InvalidArgument, match=r"^pool.reservation.gpu: the children of /research would reserve 10 "):
        check_pool(pools, smaller)


def test_top_level_reservations_beyond_the_cluster_are_a_warning() -> None:
    warnings = check_pool(tree(RESEARCH), ResourcePool("/prod", reservation=R(cpu=100)), capacity=R(cpu=16, gpu=8))
    assert warnings == [
        "the top-level pools reserve 164 cpu in all, more than the cluster has now (16): their reservations are "
        "scaled down while it is this small",
        "the top-level pools reserve 16 gpu in all, more than the cluster has now (8): their reservations are "
        "scaled down while it is this small",
    ]
    assert check_pool(tree(RESEARCH), ResourcePool("/prod", reservation=R(cpu=100))) == []  # capacity unknown


def test_unknown_parent_and_reservation_type() -> None:
    with pytest.raises(NotFound, match=r"^pool.path: the parent pool /nope of /nope/x does not exist$"):
        check_pool(tree(), ResourcePool("/nope/x"))
    with pytest.raises(InvalidArgument, match=r"^pool.reservation_type: 'fixed' is not one of elastic, static$"):
        check_pool(tree(), ResourcePool("/a", reservation_type="fixed"))


def test_a_pool_with_unfinished_jobs_gets_no_children_but_the_root_may() -> None:
    pools = tree(ResourcePool("/team"))
    with pytest.raises(FailedPrecondition, match=r"^pool.path: /team has 3 unfinished job\(s\); jobs go to leaf "):
        check_pool(pools, ResourcePool("/team/a"), busy=3)
    assert check_pool(pools, ResourcePool("/other"), busy=3) == []  # the root's own jobs share it


def test_jobs_go_to_existing_leaf_pools_or_the_root() -> None:
    pools = tree(RESEARCH, ResourcePool("/research/nlp"))
    check_job_pool(pools, "/research/nlp")
    check_job_pool(pools, "/")  # the root always takes jobs: a cluster's default pool
    with pytest.raises(InvalidArgument, match=r"^respool: /research has child pools \(/research/nlp\); jobs go to "
                                              r"a leaf pool$"):
        check_job_pool(pools, "/research")
    with pytest.raises(InvalidArgument, match=r"^respool: resource pool /x does not exist$"):
        check_job_pool(pools, "/x")
