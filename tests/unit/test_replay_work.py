"""How long a replayed job runs (peloton/replay/work.py): speed from the placement it got, work from the trace."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from peloton.errors import InvalidArgument
from peloton.modelaware.fit import quantile
from peloton.replay.traces import ClusterShape, TraceJob, parse_cluster, read_cluster_file, read_trace
from peloton.replay.work import (
    APPLICATIONS,
    HELD_OUT,
    KNOWN,
    SpeedModel,
    fitted_model,
    hosts_of,
    prior_model,
    reference_placement,
    remaining_s,
    speed,
    speed_models,
    work_samples,
)
from tests.unit.modelaware_data import PUBLIC, profile, profile_path, public_speed_models

CLUSTER = parse_cluster("16x4")


@pytest.fixture(scope="module")
def models() -> dict[str, SpeedModel]:
    return public_speed_models()  # speed_models of bert's and cifar10's profiles (shared with other modules)


def test_bert_and_cifar10_fitted_the_others_priors(models: dict[str, SpeedModel]) -> None:
    assert {a for a, m in models.items() if m.fitted} == {"bert", "cifar10"}
    assert set(models) == KNOWN
    for a in HELD_OUT:
        assert models[a] == prior_model(a)


@pytest.mark.parametrize("app", sorted(HELD_OUT | {"vgg16"}))
def test_held_out_and_profileless_applications_are_never_fitted(app: str) -> None:
    text = profile_path("cifar10").read_text()  # any profile: refused before it is read
    with pytest.raises(InvalidArgument, match="no profile may be fitted"):
        fitted_model(app, text, "x")
    with pytest.raises(InvalidArgument, match="no profile may be fitted"):
        speed_models({app: (text, "x")})


def test_unknown_application() -> None:
    with pytest.raises(InvalidArgument, match="application: unknown 'gpt5'"):
        prior_model("gpt5")


@pytest.mark.parametrize("app", ["bert", "cifar10"])
def test_the_fit_explains_the_measured_samples_per_second(models: dict[str, SpeedModel], app: str) -> None:
    errors = []
    for row in profile(app):
        measured = row.gpus * row.local_bsz / row.step_time
        predicted = speed(models[app], hosts_of(row.placement, CLUSTER), int(row.local_bsz * row.gpus))
        errors.append(abs(predicted - measured) / measured)
    assert quantile(errors, 0.5) < 0.10, quantile(errors, 0.5)


def test_a_better_placement_finishes_sooner_packed_and_spread(models: dict[str, SpeedModel]) -> None:
    """bert measured: 4 GPUs on one host beat 1,1,1,1 (the network); 2,2,2,2 beat 4,4 (two hosts share one
    pair). The fitted model ranks them the same way, and the remaining time follows the speed."""
    m = models["bert"]
    work = 1e5
    t = {p: remaining_s(m, hosts_of(p, CLUSTER), 4 * sum(p), work, 0) for p in [(4,), (1, 1, 1, 1), (4, 4),
                                                                                (2, 2, 2, 2)]}
    measured = {r.placement: r.step_time for r in profile("bert") if r.local_bsz == 4}
    assert (t[(4,)] < t[(1, 1, 1, 1)]) == (measured[(4,)] < measured[(1, 1, 1, 1)]) is True
    assert (t[(2, 2, 2, 2)] < t[(4, 4)]) == (measured[(2, 2, 2, 2)] < measured[(4, 4)]) is True
    # a prior (no profile) prefers one host too: the network is slower than the host's PCIe
    im = models["imagenet"]
    assert speed(im, hosts_of((4,), CLUSTER), 256) > speed(im, hosts_of((1, 1, 1, 1), CLUSTER), 256)


def test_faster_hardware_finishes_sooner(models: dict[str, SpeedModel]) -> None:
    m = models["resnet50"]
    v100 = replace(CLUSTER, gpu_model="v100", nic_gbps=100)
    assert remaining_s(m, hosts_of((4, 4), v100), None, 1e6, 0) < remaining_s(m, hosts_of((4, 4), CLUSTER), None,
                                                                                1e6, 0)


def test_remaining_time_counts_the_work_done(models: dict[str, SpeedModel]) -> None:
    m = models["cifar10"]
    hosts = hosts_of((4, 2), CLUSTER)
    full = remaining_s(m, hosts, 2048, 1e6, 0)
    assert remaining_s(m, hosts, 2048, 1e6, 2.5e5) == pytest.approx(0.75 * full, rel=1e-12)
    assert remaining_s(m, hosts, 2048, 1e6, 1e6) == 0 == remaining_s(m, hosts, 2048, 1e6, 2e6)
    assert full == pytest.approx(1e6 / speed(m, hosts, 2048), rel=1e-12)
    with pytest.raises(InvalidArgument, match="must not be negative"):
        remaining_s(m, hosts, 2048, 1e6, -1)
    with pytest.raises(InvalidArgument, match="at least one GPU"):
        speed(m, [], 2048)


def test_the_reference_placement_reproduces_every_tiresias_duration(models: dict[str, SpeedModel]) -> None:
    cluster = read_cluster_file((PUBLIC / "tiresias" / "cluster_spec.csv").read_text(), "spec")
    jobs = read_trace((PUBLIC / "tiresias" / "60_job.csv").read_text(), "tiresias", "60_job.csv", KNOWN)
    for j in jobs:
        assert j.work is not None
        m = models[j.application]
        work = work_samples(j, m, cluster)
        ref = hosts_of(reference_placement(j.gpus, cluster.gpus_per_host), cluster)
        assert remaining_s(m, ref, j.batch_size, work, 0) == pytest.approx(j.work, rel=1e-12)
        if j.gpus > 1:  # another placement: the duration scaled by the speeds, sooner exactly when faster
            spread = hosts_of((1,) * j.gpus, cluster)
            ratio = speed(m, ref, j.batch_size) / speed(m, spread, j.batch_size)
            assert ratio != pytest.approx(1.0)
            assert remaining_s(m, spread, j.batch_size, work, 0) == pytest.approx(j.work * ratio, rel=1e-12)


@pytest.mark.parametrize(("gpus", "per_host", "expected"), [
    (1, 4, (1,)), (4, 4, (4,)), (6, 4, (4, 2)), (16, 4, (4, 4, 4, 4)), (10, 8, (8, 2)), (3, 8, (3,))])
def test_reference_placement_packs_on_the_fewest_hosts(gpus: int, per_host: int, expected: tuple[int, ...]) -> None:
    assert reference_placement(gpus, per_host) == expected


def test_pollux_work_is_epochs_of_the_data_set(models: dict[str, SpeedModel]) -> None:
    jobs = read_trace((PUBLIC / "adaptdl" / "workloads" / "workload-6.csv").read_text(), "pollux", "w6", KNOWN)
    for j in jobs:
        app = APPLICATIONS[j.application]
        assert app.dataset_samples is not None and app.epochs is not None
        assert work_samples(j, models[j.application], CLUSTER) == app.dataset_samples * app.epochs
    # a Tiresias-only model has no data set: a Pollux-style row without work is refused
    with pytest.raises(InvalidArgument, match="has no data set and epochs"):
        work_samples(TraceJob("x", 0, "vgg16", 1), models["vgg16"], CLUSTER)


def test_work_in_samples_and_iterations(models: dict[str, SpeedModel]) -> None:
    m = models["bert"]
    assert work_samples(TraceJob("x", 0, "bert", 4, work=1e4, unit="samples"), m, CLUSTER) == 1e4
    assert work_samples(TraceJob("x", 0, "bert", 4, batch_size=384, work=100, unit="iterations"), m, CLUSTER) == 38400
    with pytest.raises(InvalidArgument, match="iterations need a batch size"):
        work_samples(TraceJob("x", 0, "bert", 4, work=100, unit="iterations"), m, CLUSTER)
    with pytest.raises(InvalidArgument, match="unknown unit 'hours'"):
        work_samples(TraceJob("x", 0, "bert", 4, work=1, unit="hours"), m, CLUSTER)


def test_the_global_batch_is_split_over_the_gang_or_the_per_gpu_default(models: dict[str, SpeedModel]) -> None:
    """Pollux's batch_size is the gang's: more GPUs, a smaller local batch. Without one (Tiresias) each GPU takes
    the model's default, so the gang's batch grows with it."""
    m = models["vgg16"]
    one = speed(m, hosts_of((1,), CLUSTER), None)
    p = m.params
    assert one == pytest.approx(64 / (p.alpha_c + p.beta_c * 64), rel=1e-12)  # the prior, one GPU: no sync
    assert speed(m, hosts_of((1,), CLUSTER), 128) == pytest.approx(128 / (p.alpha_c + p.beta_c * 128), rel=1e-12)


@pytest.mark.parametrize("app", sorted(KNOWN))
def test_every_application_has_a_sane_speed(models: dict[str, SpeedModel], app: str) -> None:
    m = models[app]
    for placement in [(1,), (4,), (2, 2), (4, 4, 4, 4)]:
        s = speed(m, hosts_of(placement, CLUSTER), None)
        assert math.isfinite(s) and s > 0
    # a whole host does more than one GPU of it at the default per-GPU batch
    assert speed(m, hosts_of((4,), CLUSTER), None) > speed(m, hosts_of((1,), CLUSTER), None)


def test_cluster_shape_hardware_reaches_the_hosts() -> None:
    shape = ClusterShape(hosts=2, gpus_per_host=8, gpu_model="a100", nic_gbps=200, gpu_link="nvlink")
    hosts = hosts_of((8, 0, 3), shape)
    assert [(h.gpus, h.gpu_model, h.nic_gbps, h.gpu_link) for h in hosts] == [
        (8, "a100", 200, "nvlink"), (3, "a100", 200, "nvlink")]
