"""The cost model's formulas (peloton/modelaware/cost.py, docs/model-aware.md) on cases computed by hand."""

from __future__ import annotations

from dataclasses import replace

import pytest

from peloton.errors import InvalidArgument
from peloton.modelaware.cost import (
    HIERARCHICAL,
    PS,
    RING,
    CostParams,
    HostUse,
    Reference,
    combine,
    compute_time,
    predict,
    step_time_counted,
    sync_time,
    uniform_hosts,
)
from peloton.modelaware.gpus import BUILTIN

REF = Reference("t4", 50, "pcie")
P = CostParams(alpha_c=0.1, beta_c=0.01, alpha_r=0.02, beta_r=0.05, alpha_n=0.03, beta_n=0.2, gamma=1.0,
               reference=REF)


def hosts(*gpus: int, model: str = "t4", nic: float = 50, link: str = "pcie") -> list[HostUse]:
    return [HostUse(g, model, nic, link) for g in gpus]


def test_one_gpu_is_compute_alone() -> None:
    pred = predict(P, hosts(1), 10)
    assert (pred.compute_time, pred.sync_time, pred.step_time) == pytest.approx((0.2, 0.0, 0.2))
    assert pred.samples_per_s == pytest.approx(10 / 0.2) and pred.gpus_per_host == (1,)


@pytest.mark.parametrize(("gpus", "pattern", "sync"), [
    # ring on one host: alpha_r + beta_r * 2(K-1)/K
    ((4,), RING, 0.02 + 0.05 * 2 * 3 / 4),
    ((2,), RING, 0.02 + 0.05 * 1),
    # ring over two hosts: every crossing joins the same pair (P = 1): alpha_n + beta_n * 2(K-1)
    ((2, 2), RING, 0.03 + 0.2 * 2 * 3),
    ((3, 1), RING, 0.03 + 0.2 * 2 * 3),
    # three hosts and more: P = N
    ((2, 1, 1), RING, 0.03 + 0.2 * 2 * 3 / 3),
    ((1, 1, 1, 1), RING, 0.03 + 0.2 * 2 * 3 / 4),
    ((4, 4, 4, 4), RING, 0.03 + 0.2 * 2 * 15 / 4),
    # hierarchical: within each host (the largest host's term), then one member per host across N hosts
    ((4,), HIERARCHICAL, 0.02 + 0.05 * 2 * 3 / 4),
    ((2, 2), HIERARCHICAL, (0.02 + 0.05 * 1) + (0.03 + 0.2 * 2 * 1 / 1)),
    ((4, 4, 4), HIERARCHICAL, (0.02 + 0.05 * 1.5) + (0.03 + 0.2 * 2 * 2 / 3)),
    ((4, 1, 1), HIERARCHICAL, (0.02 + 0.05 * 1.5) + (0.03 + 0.2 * 2 * 2 / 3)),
    ((1, 1, 1), HIERARCHICAL, 0.03 + 0.2 * 2 * 2 / 3),  # one GPU per host: nothing within hosts
])
def test_all_reduce_sync_time(gpus: tuple[int, ...], pattern: str, sync: float) -> None:
    pred = predict(P, hosts(*gpus), 10, pattern)
    assert pred.sync_time == pytest.approx(sync)
    assert pred.step_time == pytest.approx(0.2 + sync)  # gamma 1: no overlap


@pytest.mark.parametrize(("gpus", "pattern", "extra"), [
    ((4,), RING, 0.0),  # within one host no step crosses a host
    ((4,), HIERARCHICAL, 0.0),
    ((2, 2), RING, 2 * 1),  # 2(N-1) of the ring's steps cross hosts
    ((3, 3, 3), RING, 2 * 2),
    ((1, 1, 1, 1), RING, 2 * 3),
    ((4, 4, 4, 4), RING, 2 * 3),  # by hosts, not by GPUs
    ((4, 4, 4), HIERARCHICAL, 2 * 2),  # the ring across hosts, of one member each
])
def test_the_per_host_latency_is_paid_on_each_ring_step_across_hosts(gpus: tuple[int, ...], pattern: str,
                                                                      extra: float) -> None:
    """alpha_h, the alpha-beta model's latency of the steps that go over the network: 2(N-1) of a ring
    all-reduce's steps (NCCL's ring model). alpha_h = 0 is the model as it was."""
    with_h = replace(P, alpha_h=0.004)
    assert sync_time(with_h, hosts(*gpus), pattern) == pytest.approx(sync_time(P, hosts(*gpus), pattern)
                                                                     + 0.004 * extra)


def test_with_a_per_host_latency_fewer_fuller_hosts_can_win() -> None:
    """Without alpha_h the ring's network term only falls as hosts are added (2(K-1)/N); with it, three hosts of
    three beat four hosts for nine GPUs once 2 alpha_h > beta_n 2(K-1)/3 - beta_n 2(K-1)/4."""
    t = {(pl, h): sync_time(replace(P, alpha_h=h), hosts(*pl), RING)
         for pl in ((3, 3, 3), (3, 2, 2, 2)) for h in (0.0, 0.2)}
    assert t[(3, 2, 2, 2), 0.0] < t[(3, 3, 3), 0.0]
    assert P.beta_n * 16 / 3 - P.beta_n * 16 / 4 < 2 * 0.2 and t[(3, 3, 3), 0.2] < t[(3, 2, 2, 2), 0.2]


@pytest.mark.parametrize(("gpus", "busiest"), [
    ((1,), 1), ((4,), 4), ((1, 1, 1, 1), 1), ((3, 1), 3), ((2, 2, 2), 2), ((4, 4, 4, 4), 4), ((1, 0, 3), 3),
])
def test_contention_slows_each_gpu_by_the_gpus_busy_on_its_host(gpus: tuple[int, ...], busiest: int) -> None:
    """kappa: a GPU's compute on a host with g of the plan's GPUs busy takes (1 + kappa (g - 1)) times its time
    alone, the batch's part and the fixed part alike; the step waits for the busiest host. kappa = 0 is the model
    as it was."""
    crowded = replace(P, kappa=0.1)
    assert compute_time(crowded, hosts(*gpus), 10) == pytest.approx(0.2 * (1 + 0.1 * (busiest - 1)))
    assert compute_time(P, hosts(*gpus), 10) == pytest.approx(0.2)
    assert sync_time(crowded, hosts(*gpus), RING) == sync_time(P, hosts(*gpus), RING)


def test_contention_weighs_against_the_gpus_speed() -> None:
    """The slowest member is the host whose GPU model and crowding together take longest: three GPUs on an A100
    host (3.42 times a T4's throughput in the table) still beat one T4 alone, four on a T4 host do not."""
    crowded = replace(P, kappa=0.5)
    mixed = [HostUse(3, "a100"), HostUse(1, "t4")]
    assert compute_time(crowded, mixed, 10) == pytest.approx(0.2)  # the T4 alone: 0.2; the A100s: 0.2 * 2 / 3.42
    assert compute_time(crowded, [HostUse(4, "t4"), HostUse(1, "a100")], 10) == pytest.approx(0.2 * 2.5)


def test_with_contention_spreading_wins_at_large_batches() -> None:
    """Contention grows with the batch and sync does not: with kappa the best of 4 on one host and 1111 trade
    places as the local batch grows, which no setting of the other parameters does on hosts alike."""
    crowded = replace(P, kappa=0.1)

    def step(gpus: tuple[int, ...], bsz: float) -> float:
        return predict(crowded, hosts(*gpus), bsz).step_time

    assert step((4,), 1) < step((1, 1, 1, 1), 1) and step((1, 1, 1, 1), 1000) < step((4,), 1000)


def test_a_host_without_gpus_takes_no_part() -> None:
    assert predict(P, hosts(2, 0, 2), 10).sync_time == pytest.approx(predict(P, hosts(2, 2), 10).sync_time)
    with pytest.raises(InvalidArgument) as e:
        predict(P, hosts(0, 0), 10)
    assert e.value.field == "placement"


def test_parameter_servers_colocated_and_dedicated() -> None:
    # 2 + 2 workers, one server on the first host: it sends and receives S to each of the 2 remote workers
    # (2 * 2 units through its NIC); the other host's 2 workers each send and receive S (4 units)
    colocated = [HostUse(2, "t4", 50, "pcie", servers=1), HostUse(2, "t4", 50, "pcie")]
    assert sync_time(P, colocated, PS) == pytest.approx(0.03 + 0.2 * 4)
    # the server on a host of its own: all 4 workers' traffic through its NIC, both ways (8 units)
    dedicated = [*hosts(2, 2), HostUse(0, "t4", 50, "pcie", servers=1)]
    assert sync_time(P, dedicated, PS) == pytest.approx(0.03 + 0.2 * 8)
    # two dedicated servers halve it: each takes half the parameters (2 * 4 * 1/2 = 4 units)
    two = [*hosts(2, 2), HostUse(0, "t4", 50, "pcie", servers=1), HostUse(0, "t4", 50, "pcie", servers=1)]
    assert sync_time(P, two, PS) == pytest.approx(0.03 + 0.2 * 4)
    # a slower NIC on the server's host is the bottleneck: 50/10 times its traffic
    slow = [*hosts(2, 2), HostUse(0, "t4", 10, "pcie", servers=1)]
    assert sync_time(P, slow, PS) == pytest.approx(0.03 + 0.2 * 8 * 5)
    # every worker and the server on one host: within the host, 2 * workers * share units over its link
    assert sync_time(P, [HostUse(4, "t4", 50, "pcie", servers=1)], PS) == pytest.approx(0.02 + 0.05 * 8)
    with pytest.raises(InvalidArgument) as e:
        sync_time(P, hosts(2, 2), PS)
    assert e.value.field == "servers"


def test_slower_gpus_slow_the_whole_step() -> None:
    v100 = BUILTIN["v100"].relative
    base = 0.1 + 0.01 * 10
    assert compute_time(P, hosts(1, model="v100"), 10) == pytest.approx(base / v100)
    mixed = [HostUse(2, "v100", 50, "pcie"), HostUse(2, "t4", 50, "pcie")]
    assert compute_time(P, mixed, 10) == pytest.approx(base)  # the T4 host sets the pace
    assert predict(P, mixed, 10).step_time > predict(P, hosts(2, 2, model="v100"), 10).step_time
    # parameters fitted on V100s: a T4 is slower by the table's ratio
    on_v100 = replace(P, reference=Reference("v100", 50, "pcie"))
    assert compute_time(on_v100, hosts(1), 10) == pytest.approx(base * v100)
    assert compute_time(on_v100, hosts(1, model="v100"), 10) == pytest.approx(base)


def test_slower_nics_and_links_slow_the_sync() -> None:
    mixed = [HostUse(2, "t4", 50, "pcie"), HostUse(2, "t4", 10, "pcie")]
    assert sync_time(P, mixed, RING) == pytest.approx(0.03 + 0.2 * (50 / 10) * 2 * 3)  # the slowest NIC
    assert sync_time(P, hosts(2, 2, nic=100), RING) == pytest.approx(0.03 + 0.2 * 0.5 * 2 * 3)
    # NVLink moves gradients 100/12 times faster than the reference's PCIe
    assert sync_time(P, hosts(4, link="nvlink"), RING) == pytest.approx(0.02 + 0.05 * (12 / 100) * 1.5)
    # hierarchical: the worst host's link and GPU count set the within-host term
    h = [HostUse(4, "t4", 50, "nvlink"), HostUse(2, "t4", 50, "pcie")]
    assert sync_time(P, h, HIERARCHICAL) == pytest.approx((0.02 + 0.05 * max(1.5 * 0.12, 1.0)) + (0.03 + 0.2 * 2))


def test_gamma_overlaps_sync_with_compute() -> None:
    assert combine(0.3, 0.4, 1.0) == pytest.approx(0.7)
    assert combine(0.3, 0.4, 2.0) == pytest.approx(0.5)
    assert combine(0.3, 0.4, 500.0) == pytest.approx(0.4, rel=1e-3)  # nearly full overlap, without overflow
    assert combine(0.3, 0.0, 3.0) == 0.3
    p = replace(P, gamma=2.0)
    pred = predict(p, hosts(2, 2), 10)
    assert pred.step_time == pytest.approx((0.2 ** 2 + pred.sync_time ** 2) ** 0.5)


def test_uniform_hosts_take_the_reference_hardware() -> None:
    assert uniform_hosts((1, 3), REF) == [HostUse(1, "t4", 50, "pcie"), HostUse(3, "t4", 50, "pcie")]


@pytest.mark.parametrize("pattern", [RING, HIERARCHICAL])
def test_a_step_time_from_counted_hosts_is_the_predictions_to_the_bit(pattern: str) -> None:
    """step_time_counted (the plan search rates a size's plan by its kinds of hosts) against predict on every
    host written out, on random mixes of GPU models, NICs, links and GPUs per host."""
    import random

    for seed in range(300):
        rng = random.Random(seed)
        p = replace(P, alpha_h=rng.choice([0.0, 0.01]), kappa=rng.choice([0.0, 0.05]), gamma=rng.choice([1.0, 2.5]))
        uses = [(HostUse(rng.randint(0, 8), rng.choice(["t4", "v100", "a100"]), rng.choice([10, 50, 100]),
                         rng.choice(["pcie", "nvlink"])), rng.randint(0, 40)) for _ in range(rng.randint(1, 4))]
        written = [u for u, m in uses for _ in range(m)]
        if not any(u.gpus for u in written):
            with pytest.raises(InvalidArgument):
                step_time_counted(p, uses, 16, pattern)
            continue
        assert step_time_counted(p, uses, 16, pattern) == predict(p, written, 16, pattern).step_time, seed
