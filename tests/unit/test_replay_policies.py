"""The replay's policies as job specs, and the pools (peloton/replay/policies.py)."""

from __future__ import annotations

import json

import pytest

from peloton.domain.spec import MODEL_AWARE, validate, validate_submitted
from peloton.errors import InvalidArgument
from peloton.modelaware.document import parse_document
from peloton.replay import policies
from peloton.replay.policies import POLICIES, Policy
from peloton.replay.traces import ClusterShape, TraceJob, parse_cluster
from peloton.replay.work import KNOWN, SpeedModel, hosts_of, prior_model, speed, speed_of_runs, work_samples
from tests.unit.modelaware_data import public_speed_models

C16 = parse_cluster("16x4")


def _models() -> dict[str, SpeedModel]:
    return public_speed_models()  # speed_models of bert's and cifar10's profiles, fitted once per process


def _job(name: str = "j", gpus: int = 4, app: str = "resnet50", **kw: object) -> TraceJob:
    base: dict[str, object] = {"work": 3600.0, "unit": "seconds"}
    base.update(kw)
    return TraceJob(name=name, submit_s=0.0, application=app, gpus=gpus, **base)  # type: ignore[arg-type]


def test_policies_parse_from_repeats_and_comma_lists_in_order_each_once() -> None:
    assert [p.name for p in policies.parse_policies([])] == ["fifo", "default", "model-aware", "auto"]
    assert [p.name for p in policies.parse_policies(["auto,fifo", "fifo", " default "])] == [
        "auto", "fifo", "default"]
    with pytest.raises(InvalidArgument, match="--policy: unknown policy 'fast'"):
        policies.parse_policies(["default,fast"])


def _partitions(n: int, largest: int, hosts: int) -> list[tuple[int, ...]]:
    if n == 0:
        return [()]
    if hosts == 0:
        return []
    return [(p, *rest) for p in range(min(n, largest), 0, -1) for rest in _partitions(n - p, p, hosts - 1)]


@pytest.mark.parametrize("app,batch", [("bert", None), ("bert", 384), ("cifar10", 2048), ("ncf", None),
                                       ("imagenet", 1024), ("vgg16", None)])
def test_the_slowest_placement_is_found_among_every_placement_of_the_gang(app: str, batch: int | None) -> None:
    cluster = ClusterShape(hosts=6, gpus_per_host=4)
    m = _models()[app]
    for gpus in range(1, 25):
        every = [speed(m, hosts_of(p, cluster), batch) for p in _partitions(gpus, 4, 6)]
        assert policies.slowest_speed(m, gpus, batch, cluster) == pytest.approx(min(every), rel=1e-12)


def _expanded(runs: tuple[tuple[int, int], ...]) -> tuple[int, ...]:
    return tuple(g for g, c in runs for _ in range(c))


def test_the_splits_as_runs_are_the_placements_they_stand_for() -> None:
    """even_split and crowded_split give runs (GPUs on a host, hosts), so that a placement over 1,100 hosts is not
    written out host by host: the same placements as the host-by-host rules."""
    for per in (1, 2, 4, 8):
        for hosts in range(1, 30):
            for gpus in range(hosts, hosts * per + 1):
                crowded, left = [], gpus  # each host as full as it can be while every later one keeps one
                for i in range(hosts):
                    crowded.append(min(per, left - (hosts - 1 - i)))
                    left -= crowded[-1]
                assert _expanded(policies.crowded_split(gpus, hosts, per)) == tuple(crowded), (gpus, hosts, per)
                even = _expanded(policies.even_split(gpus, hosts))
                assert len(even) == hosts and sum(even) == gpus and max(even) - min(even) <= 1


@pytest.mark.parametrize("app,batch", [("bert", None), ("bert", 384), ("cifar10", 2048), ("ncf", None)])
def test_the_speed_of_runs_is_the_speed_of_the_hosts_written_out(app: str, batch: int | None) -> None:
    """work.speed_of_runs reads a placement as the cost model does without writing out its hosts: the same value,
    fitted models (contention kappa, overlap gamma) and priors alike, one host, two, many."""
    cluster = ClusterShape(hosts=1100, gpus_per_host=4, nic_gbps=25.0)
    m = _models()[app]
    for runs in [((1, 1),), ((4, 1),), ((3, 1), (1, 1)), ((2, 2),), ((4, 3), (2, 1), (1, 4)), ((4, 750),),
                 ((3, 1000), (2, 100)), ((1, 1100),), ((4, 0), (2, 5))]:
        written = [g for g, c in runs for _ in range(c)]
        assert speed_of_runs(m, runs, cluster, batch) == pytest.approx(speed(m, hosts_of(written, cluster), batch),
                                                                      rel=1e-12), runs


def test_max_runtime_covers_the_job_on_any_placement_with_the_margin() -> None:
    m = _models()["bert"]
    job = _job(gpus=8, app="bert", batch_size=96)
    limit = policies.max_runtime_s(job, m, C16, [8])
    work = work_samples(job, m, C16)
    slowest = min(speed(m, hosts_of(p, C16), 96) for p in _partitions(8, 4, 16))
    assert limit == pytest.approx(policies.MAX_RUNTIME_MARGIN * work / slowest, abs=1.0)
    assert limit >= policies.MAX_RUNTIME_MARGIN * work / slowest
    reference = work / speed(m, hosts_of((4, 4), C16), 96)
    assert limit >= reference * policies.MAX_RUNTIME_MARGIN  # the reference placement is one of them
    assert limit == float(int(limit))
    # any of several gang sizes: the longest of them
    assert policies.max_runtime_s(job, m, C16, [2, 8]) == policies.max_runtime_s(job, m, C16, [2])


def test_fifo_and_default_are_plain_gangs_of_one_gpu_members_default_declares_its_run_time() -> None:
    job = _job(gpus=6, priority=3)
    m = _models()["resnet50"]
    fifo = policies.job_spec(job, POLICIES["fifo"], C16, m, "/a")
    default = policies.job_spec(job, POLICIES["default"], C16, m, "/a")
    for spec in (fifo, default):
        validate(spec)
        assert (spec.instances, spec.resources.gpu, spec.respool, spec.priority) == (6, 1, "/a", 3)
        assert spec.min_available == 0 and spec.model is None and spec.strategy == "pack"
        assert spec.resources.cpu * 4 <= C16.cpus_per_host and spec.resources.mem * 4 <= C16.mem_gb_per_host * 1024
        assert spec.resources.cpu * 5 > C16.cpus_per_host  # GPUs and the rest run out together
    assert fifo.max_runtime_s == 0
    assert default.max_runtime_s == policies.max_runtime_s(job, m, C16, [6]) > 3600


def test_model_aware_names_the_application_with_the_traces_batch_or_the_per_gpu_default() -> None:
    p = POLICIES["model-aware"]
    pollux = policies.job_spec(_job(app="bert", gpus=8, batch_size=96, work=None, unit=None), p, C16,
                               _models()["bert"])
    tiresias = policies.job_spec(_job(app="vgg16", gpus=2), p, C16, _models()["vgg16"])
    for spec in (pollux, tiresias):
        validate(spec)
        assert spec.strategy == MODEL_AWARE and spec.model is not None and not spec.model.auto_instances
        assert spec.max_runtime_s > 0
    assert pollux.model is not None and (pollux.model.name, pollux.model.global_bsz) == ("bert", 96.0)
    assert tiresias.model is not None and (tiresias.model.local_bsz, tiresias.model.global_bsz) == (64.0, 0.0)


def test_auto_chooses_within_the_traces_bounds_or_half_to_twice_the_size_capped_at_the_cluster() -> None:
    assert policies.auto_bounds(_job(gpus=6), C16) == (3, 12)
    assert policies.auto_bounds(_job(gpus=1), C16) == (1, 2)
    assert policies.auto_bounds(_job(gpus=48), C16) == (24, 64)
    assert policies.auto_bounds(_job(gpus=8, min_gpus=4, max_gpus=16), C16) == (4, 16)
    assert policies.auto_bounds(_job(gpus=8, max_gpus=16), C16) == (8, 16)
    assert policies.auto_bounds(_job(gpus=8, min_gpus=2, max_gpus=128), C16) == (2, 64)
    # and at a gang's most members (model.max_instances: 4096), however large the cluster
    assert policies.auto_bounds(_job(gpus=3000), parse_cluster("1100x4")) == (1500, 4096)
    job = _job(gpus=6)
    m = _models()["resnet50"]
    spec = policies.job_spec(job, POLICIES["auto"], C16, m)
    validate_submitted(spec)
    assert spec.model is not None and spec.model.auto_instances
    assert (spec.model.min_instances, spec.model.max_instances, spec.instances) == (3, 12, 3)
    assert spec.max_runtime_s == policies.max_runtime_s(job, m, C16, range(3, 13))


def test_model_documents_carry_the_cost_model_the_work_model_runs_at() -> None:
    models = _models()
    docs = policies.model_documents(models, ["bert", "vgg16", "bert"])
    assert sorted(docs) == ["bert", "vgg16"]
    for name, doc in docs.items():
        parsed = parse_document(json.loads(json.dumps(doc)))
        assert parsed.cost_params() == models[name].params
        assert parsed.description.sync == "allreduce-ring" and parsed.description.flops_per_sample > 0
    assert models["bert"].fitted and not models["vgg16"].fitted


def test_two_pools_split_the_cluster_and_take_jobs_in_turn() -> None:
    jobs = [_job(name=f"j{i}") for i in range(5)]
    pools, pool_of = policies.assign_pools(jobs, parse_cluster("5x3"))
    assert [(p.path, p.reservation.gpu) for p in pools] == [("/a", 8), ("/b", 7)]
    assert sum(p.reservation.cpu for p in pools) <= 5 * 48
    assert [pool_of[j.name] for j in jobs] == ["/a", "/b", "/a", "/b", "/a"]
    assert policies.reservations(pools) == {"/a": 8, "/b": 7}


def test_the_traces_pools_or_a_pools_files_and_jobs_without_one_dealt_to_the_leaves() -> None:
    jobs = [_job(name="x", pool="research"), _job(name="y"), _job(name="z", pool="prod"), _job(name="w")]
    pools, pool_of = policies.assign_pools(jobs, C16)
    assert [(p.path, p.reservation.gpu) for p in pools] == [("/prod", 32), ("/research", 32)]
    assert pool_of == {"x": "/research", "y": "/prod", "z": "/prod", "w": "/research"}
    given = policies.split_pools(["/t", "/t/one", "/t/two", "/prod", "/research"], C16)
    _, pool_of = policies.assign_pools(jobs, C16, given)
    assert pool_of == {"x": "/research", "y": "/t/one", "z": "/prod", "w": "/t/two"}
    with pytest.raises(InvalidArgument, match=r"row 0, column pool: 'prod' is not a pool to submit to"):
        policies.assign_pools(jobs, C16, policies.split_pools(["/research"], C16))
    # a pool inside another: the replay makes flat pools of the trace's names, so it needs them given (--pools);
    # it failed once the replay began ("parent pool '/t' of '/t/one' does not exist")
    with pytest.raises(InvalidArgument, match=r"row 3, column pool: 't/one' is a pool inside another: give the "
                                              r"pools \(--pools\)"):
        policies.assign_pools([_job(name="v", pool="t/one", row=3)], C16)
    _, pool_of = policies.assign_pools([_job(name="v", pool="t/one", row=3)], C16, given)
    assert pool_of == {"v": "/t/one"}


def test_every_known_application_gives_a_valid_spec_under_every_policy() -> None:
    for app in sorted(KNOWN):
        m = prior_model(app)
        for p in POLICIES.values():
            assert isinstance(p, Policy)
            spec = policies.job_spec(_job(gpus=3, app=app), p, C16, m, "/b")
            validate_submitted(spec)
