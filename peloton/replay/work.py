"""How long a replayed job runs (docs/scheduling-quality.md, "How long a job runs").

A job carries an amount of work in samples. Its speed on the placement it actually got is the cost model's
(peloton/modelaware/cost.py) samples/s for its application: bert and cifar10 fitted to their public profiles,
every other application a prior from its model's description (parameter bytes, FLOPs per sample). The Pollux
artifact's held-out applications (imagenet, yolov3, deepspeech2, ncf) are never fitted to anything.

Work: a trace's own amount (samples; iterations x global batch), or for a duration (Tiresias) that duration at
the speed of the reference placement (the gang packed on the fewest hosts), or for Pollux's traces, which give
none, the application's epochs of its data set. This is not Pollux's statistical-efficiency model: a sample is
worth the same at any batch size.

Pure: the profiles' text is handed in, there is no clock; the caller advances `done` by speed x its own time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from peloton.errors import InvalidArgument
from peloton.modelaware.cost import (
    CostParams,
    HostUse,
    Reference,
    combine,
    compute_time,
    network_time,
    predict,
    prior,
    sync_time,
)
from peloton.modelaware.fit import fit
from peloton.modelaware.profile import read_profile
from peloton.replay.traces import ClusterShape, TraceJob


@dataclass(frozen=True, slots=True)
class Application:
    """A trace's application: its model's description (docs/scheduling-quality.md has each value's source)."""

    model: str
    parameters: float  # gradients are parameters x 4 bytes (FP32)
    flops_per_sample: float  # forward + backward (3 x the forward pass)
    local_bsz: int  # per GPU, when the trace gives no batch (weak scaling: the global batch grows with the gang)
    dataset_samples: int | None = None  # one epoch; with `epochs`, the work when the trace gives none (Pollux)
    epochs: int | None = None
    profile: bool = False  # a public profile exists and may be fitted (bert, cifar10 only)

    @property
    def parameter_bytes(self) -> float:
        return self.parameters * 4


# MACs (multiply-adds) x 2 = forward FLOPs; x 3 for forward + backward, so flops_per_sample = 6 x MACs.
APPLICATIONS: dict[str, Application] = {
    # Pollux's six (workloads/workload-N.csv); epochs: the artifact's simulator/applications.py max_epochs.
    "bert": Application("BERT-base fine-tuned on SQuAD v1.1, 384 tokens", 110e6, 6 * 110e6 * 384, 12,
                        87_599, 2, profile=True),
    "cifar10": Application("ResNet-18 on CIFAR-10", 11.17e6, 6 * 0.56e9, 128, 50_000, 100, profile=True),
    "imagenet": Application("ResNet-50 on ImageNet-1k", 25.56e6, 6 * 4.11e9, 64, 1_281_167, 90),
    "yolov3": Application("YOLOv3 (Darknet-53, 416 px) on PASCAL VOC 07+12", 61.95e6, 3 * 65.86e9, 8,
                          16_551, 50),
    "deepspeech2": Application("DeepSpeech2 (2 conv + 5 bi-LSTM x 1024) on CMU ARCTIC", 87e6, 6 * 87e6 * 150, 20,
                               4_528, 80),
    "ncf": Application("NeuMF on Pinterest-20, 4 negatives per positive", 10.5e6, 6 * 43_072, 4096,
                       7_228_110, 10),
    # Tiresias's (60_job.csv): the TensorFlow CNN benchmarks' models at their default per-GPU batch.
    "vgg11": Application("VGG-11", 132.86e6, 6 * 7.61e9, 64),
    "vgg16": Application("VGG-16", 138.36e6, 6 * 15.47e9, 64),
    "vgg19": Application("VGG-19", 143.67e6, 6 * 19.63e9, 64),
    "resnet50": Application("ResNet-50", 25.56e6, 6 * 4.11e9, 64),
    "resnet101": Application("ResNet-101", 44.55e6, 6 * 7.83e9, 32),
    "resnet152": Application("ResNet-152", 60.19e6, 6 * 11.56e9, 32),
    "inception3": Application("Inception-v3, 299 px", 23.83e6, 6 * 5.71e9, 32),
    "inception4": Application("Inception-v4, 299 px", 42.68e6, 6 * 12.27e9, 32),
    "alexnet": Application("AlexNet", 61.10e6, 6 * 0.71e9, 512),
    "googlenet": Application("GoogLeNet", 6.62e6, 6 * 1.50e9, 32),
}
KNOWN = frozenset(APPLICATIONS)
# Held out by the Pollux artifact's data (shared/data/public/SOURCES.md): fit nothing to them.
HELD_OUT = frozenset({"imagenet", "yolov3", "deepspeech2", "ncf"})
# The public profiles' cluster: 16 x g4dn.12xlarge, 4 x T4 over PCIe, 50 Gb/s (SOURCES.md).
PROFILE_REFERENCE = Reference("t4", 50, "pcie")


@dataclass(frozen=True, slots=True)
class SpeedModel:
    application: str
    params: CostParams
    fitted: bool  # False: the description's prior


def prior_model(application: str) -> SpeedModel:
    app = _app(application)
    return SpeedModel(application, prior(app.parameter_bytes, app.flops_per_sample, reference=PROFILE_REFERENCE),
                      fitted=False)


def fitted_model(application: str, profile_text: str, source: str) -> SpeedModel:
    """The cost model fitted to every row of the application's public profile (placements.csv), from its prior."""
    app = _app(application)
    if application in HELD_OUT or not app.profile:
        raise InvalidArgument(f"application {application!r}: no profile may be fitted (only "
                              f"{', '.join(sorted(a for a, v in APPLICATIONS.items() if v.profile))})",
                              field="application")
    base = prior_model(application).params
    result = fit(read_profile(profile_text, source), PROFILE_REFERENCE, base)
    return SpeedModel(application, result.params, fitted=True)


def speed_models(profiles: Mapping[str, tuple[str, str]]) -> dict[str, SpeedModel]:
    """Every application's model: fitted where `profiles` ({application: (text, source)}) has its profile, the
    prior elsewhere."""
    out = {}
    for name in APPLICATIONS:
        if name in profiles:
            text, source = profiles[name]
            out[name] = fitted_model(name, text, source)
        else:
            out[name] = prior_model(name)
    unknown = sorted(set(profiles) - KNOWN)
    if unknown:
        raise InvalidArgument(f"profiles: unknown application {unknown[0]!r}", field="application")
    return out


def _app(application: str) -> Application:
    app = APPLICATIONS.get(application)
    if app is None:
        raise InvalidArgument(f"application: unknown {application!r} (known: {', '.join(sorted(KNOWN))})",
                              field="application")
    return app


def hosts_of(gpus_per_host: Sequence[int], cluster: ClusterShape) -> list[HostUse]:
    """A placement (GPUs on each host used) on hosts of the cluster's hardware."""
    return [HostUse(g, cluster.gpu_model, cluster.nic_gbps, cluster.gpu_link) for g in gpus_per_host if g > 0]


def reference_placement(gpus: int, gpus_per_host: int) -> tuple[int, ...]:
    """The gang packed on the fewest hosts: full hosts, then the rest on one more."""
    if gpus < 1 or gpus_per_host < 1:
        raise InvalidArgument(f"a placement of {gpus} GPUs on hosts of {gpus_per_host} is empty", field="gpus")
    full, rest = divmod(gpus, gpus_per_host)
    return (gpus_per_host,) * full + ((rest,) if rest else ())


def local_batch(model: SpeedModel, gpus: int, batch_size: int | None) -> float:
    """The per-GPU batch: the global batch split over the gang, or the application's per-GPU default."""
    if batch_size is None:
        return float(APPLICATIONS[model.application].local_bsz)
    return batch_size / gpus


def speed(model: SpeedModel, hosts: Sequence[HostUse], batch_size: int | None) -> float:
    """Samples/s of the job on `hosts` (its GPUs on each), the global batch `batch_size` (None: the per-GPU
    default on every GPU)."""
    gpus = sum(h.gpus for h in hosts)
    if gpus < 1:
        raise InvalidArgument("a placement needs at least one GPU", field="placement")
    return predict(model.params, hosts, local_batch(model, gpus, batch_size)).samples_per_s


def speed_of_runs(model: SpeedModel, runs: Sequence[tuple[int, int]], cluster: ClusterShape,
                  batch_size: int | None) -> float:
    """`speed` of a placement on the cluster's hosts given as runs, (GPUs on a host, how many such hosts), in a time
    that does not grow with the hosts: on hosts alike the cost model reads a placement only through the distinct
    GPU counts of its hosts (compute: the slowest host's), their total and the number of hosts (the ring's sync,
    cost.sync_time: within one host, else cost.network_time over them). The same value as `speed` on the hosts
    written out (tests/unit/test_replay_policies.py compares them), without building them: a gang of 3,000 GPUs on
    1,100 hosts took `policies.max_runtime_s` minutes."""
    used = [(g, c) for g, c in runs if g > 0 and c > 0]
    k = sum(g * c for g, c in used)
    n = sum(c for _, c in used)
    if k < 1:
        raise InvalidArgument("a placement needs at least one GPU", field="placement")
    kinds = [HostUse(g, cluster.gpu_model, cluster.nic_gbps, cluster.gpu_link) for g, _ in used]
    p = model.params
    bsz = local_batch(model, k, batch_size)
    tc = compute_time(p, kinds, bsz)
    ts = sync_time(p, kinds) if n == 1 else network_time(p, p.reference.nic_gbps / cluster.nic_gbps, n, 2 * (k - 1))
    return k * bsz / combine(tc, ts, p.gamma)


def work_samples(job: TraceJob, model: SpeedModel, cluster: ClusterShape) -> float:
    """The job's work in samples (module docstring: the rules)."""
    if job.unit is None:
        app = APPLICATIONS[job.application]
        if app.dataset_samples is None or app.epochs is None:
            raise InvalidArgument(f"job {job.name}: application {job.application!r} has no data set and epochs to "
                                  "give the work the trace does not", field="work")
        return float(app.dataset_samples * app.epochs)
    if job.work is None:
        raise InvalidArgument(f"job {job.name}: a unit ({job.unit}) but no work", field="work")
    if job.unit == "samples":
        return job.work
    if job.unit == "iterations":
        if job.batch_size is None:
            raise InvalidArgument(f"job {job.name}: iterations need a batch size", field="batch_size")
        return job.work * job.batch_size
    if job.unit == "seconds":
        ref = hosts_of(reference_placement(job.gpus, cluster.gpus_per_host), cluster)
        return job.work * speed(model, ref, job.batch_size)
    raise InvalidArgument(f"job {job.name}: unknown unit {job.unit!r}", field="unit")


def remaining_s(model: SpeedModel, hosts: Sequence[HostUse], batch_size: int | None, work: float,
                done: float) -> float:
    """Seconds until `work` samples are done, `done` already, at this placement's speed."""
    if work < 0 or done < 0:
        raise InvalidArgument(f"work ({work}) and done ({done}) must not be negative", field="work")
    left = work - done
    return left / speed(model, hosts, batch_size) if left > 0 else 0.0
