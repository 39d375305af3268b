"""The host labels the cost model reads (docs/model-aware.md): which GPUs a host has, how fast its network is and how
its GPUs talk to each other. Pure: a labels dict in, checked values out.

Well-known labels, with the value assumed when a host does not carry one:
  gpu_model  the GPUs' model, a lower-case name (`t4`, `v100`, `a100`, `h100`); `unknown` on a host with GPUs
  nic_gbps   the network's bandwidth in Gbit/s, a positive number; 25
  gpu_link   how the host's GPUs exchange data: `pcie` or `nvlink`; `pcie`
A host without GPUs has no gpu_model or gpu_link (""): labels for them are refused where hosts are made
(`--sim-host-group`, `--local-host-labels`) and ignored where they are not ours to refuse (Mesos attributes).

Any other label is free-form (`rack`, `zone`, ...): hosts carry `labels: dict[str, str]`, which constraints match.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from peloton.errors import InvalidArgument

GPU_MODEL = "gpu_model"
NIC_GBPS = "nic_gbps"
GPU_LINK = "gpu_link"
WELL_KNOWN = (GPU_MODEL, NIC_GBPS, GPU_LINK)

DEFAULT_GPU_MODEL = "unknown"
DEFAULT_NIC_GBPS = 25.0
DEFAULT_GPU_LINK = "pcie"
GPU_LINKS = ("pcie", "nvlink")
MAX_NIC_GBPS = 1_000_000.0  # a terabit a second a thousand times over: anything above is a typo

# fullmatch. Names of GPU models are case-insensitive (a Mesos attribute may say `A100`); they are kept lower-case.
_GPU_MODEL = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
# Label keys and values given on the command line (`K=V,...`): no `,` or `=` in either, nothing invisible.
_LABEL_KEY = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_./-]{0,62}")
MAX_LABEL_VALUE_CHARS = 256
# Set by the backends, never given: `host` by every backend to the host's name (constraints match it); `gpu_error`
# by the local backend to why the nvidia-smi it found gave no GPU (a broken driver; peloton/hostmgr/local/gpus.py).
GPU_ERROR = "gpu_error"
RESERVED = {"host": "the host's name", GPU_ERROR: "why nvidia-smi gave no GPU"}


@dataclass(frozen=True, slots=True)
class HostHardware:
    """A host's well-known labels with the defaults applied (what the cost model assumes of it)."""

    gpu_model: str  # "" on a host without GPUs
    nic_gbps: float
    gpu_link: str  # "" on a host without GPUs
    # the well-known labels whose default is assumed: the host does not carry them (or, read leniently, their value
    # does not check)
    defaulted: tuple[str, ...] = ()


def _bad(field: str, label: str, why: str) -> InvalidArgument:
    f = f"{field}.{label}"
    return InvalidArgument(f"{f}: {why}", field=f)


def gpu_model(value: str, field: str = "labels") -> str:
    """A GPU model's name, lower-cased; InvalidArgument naming `field.gpu_model`."""
    name = value.strip().lower()
    if not _GPU_MODEL.fullmatch(name):
        raise _bad(field, GPU_MODEL, f"expected a GPU model's name of letters, digits, '.', '_' or '-' (at most 64 "
                                     f"characters, like t4, a100, h100), got {value!r}")
    return name


def nic_gbps(value: str, field: str = "labels") -> float:
    text = value.strip()
    try:
        gbps = float(text)
    except ValueError:
        gbps = math.nan
    if not (math.isfinite(gbps) and 0 < gbps <= MAX_NIC_GBPS):
        raise _bad(field, NIC_GBPS, f"expected a positive number of Gbit/s, got {value!r}")
    return gbps


def gpu_link(value: str, field: str = "labels") -> str:
    link = value.strip().lower()
    if link not in GPU_LINKS:
        raise _bad(field, GPU_LINK, f"expected one of {', '.join(GPU_LINKS)}, got {value!r}")
    return link


def read(labels: Mapping[str, str], field: str = "labels") -> dict[str, str | float]:
    """The well-known labels `labels` carries, checked and normalized (gpu_model and gpu_link lower-case, nic_gbps a
    float); absent ones are absent. InvalidArgument naming the label (`labels.nic_gbps: expected ...`)."""
    out: dict[str, str | float] = {}
    if GPU_MODEL in labels:
        out[GPU_MODEL] = gpu_model(labels[GPU_MODEL], field)
    if NIC_GBPS in labels:
        out[NIC_GBPS] = nic_gbps(labels[NIC_GBPS], field)
    if GPU_LINK in labels:
        out[GPU_LINK] = gpu_link(labels[GPU_LINK], field)
    return out


def hardware(labels: Mapping[str, str], has_gpus: bool, field: str = "labels") -> HostHardware:
    """The effective values: the labels' where present (checked: InvalidArgument naming the label), else the
    defaults. On a host without GPUs, gpu_model and gpu_link are "" whatever its labels say."""
    values = read(labels, field)
    return _effective(values, has_gpus)


def hardware_lenient(labels: Mapping[str, str], has_gpus: bool, field: str = "labels"
                     ) -> tuple[HostHardware, list[str]]:
    """`hardware` for hosts whose labels are not ours to refuse (a Mesos agent's attributes): a label that does
    not check is replaced by its default, and its error is returned beside the values."""
    values: dict[str, str | float] = {}
    problems: list[str] = []
    checks: tuple[tuple[str, Callable[[str, str], str | float]], ...] = (
        (GPU_MODEL, gpu_model), (NIC_GBPS, nic_gbps), (GPU_LINK, gpu_link))
    for label, check in checks:
        if label in labels:
            try:
                values[label] = check(labels[label], field)
            except InvalidArgument as e:
                problems.append(e.message)
    return _effective(values, has_gpus), problems


def _effective(values: Mapping[str, str | float], has_gpus: bool) -> HostHardware:
    defaulted = tuple(k for k in WELL_KNOWN if k not in values and (has_gpus or k == NIC_GBPS))
    return HostHardware(
        gpu_model=str(values.get(GPU_MODEL, DEFAULT_GPU_MODEL)) if has_gpus else "",
        nic_gbps=float(values.get(NIC_GBPS, DEFAULT_NIC_GBPS)),
        gpu_link=str(values.get(GPU_LINK, DEFAULT_GPU_LINK)) if has_gpus else "",
        defaulted=defaulted,
    )


def parse_labels(text: str, field: str) -> dict[str, str]:
    """`K=V,K=V` (a flag's value) -> labels, the well-known ones checked and normalized. InvalidArgument naming
    `field` (the flag), and the label for a well-known one (`--sim-host-labels: labels.nic_gbps: ...`)."""
    labels: dict[str, str] = {}
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        k, eq, v = part.partition("=")
        k, v = k.strip(), v.strip()
        if not eq or not k:
            raise InvalidArgument(f"{field}: expected KEY=VALUE, got {part!r}", field=field)
        if not _LABEL_KEY.fullmatch(k):
            raise InvalidArgument(f"{field}: label name {k!r}: expected letters, digits, '_', '.', '/' or '-' (at "
                                  "most 63 characters)", field=field)
        if k in RESERVED:
            raise InvalidArgument(f"{field}: label {k!r} is set by the backend ({RESERVED[k]})", field=field)
        if k in labels:
            raise InvalidArgument(f"{field}: label {k!r} given twice", field=field)
        if not v or len(v) > MAX_LABEL_VALUE_CHARS or not v.isprintable():
            raise InvalidArgument(f"{field}: label {k}: expected a value of 1 to {MAX_LABEL_VALUE_CHARS} printable "
                                  f"characters, got {v!r}", field=field)
        labels[k] = v
    try:
        known = read(labels)
    except InvalidArgument as e:
        raise InvalidArgument(f"{field}: {e.message}", field=field) from None
    return labels | {k: _text(v) for k, v in known.items()}


def check_for_hosts(labels: Mapping[str, str], has_gpus: bool, field: str) -> None:
    """Labels given to hosts we make (sim, local): GPU labels on hosts without GPUs are a mistake."""
    if not has_gpus:
        for k in (GPU_MODEL, GPU_LINK):
            if k in labels:
                raise InvalidArgument(f"{field}: labels.{k}: the hosts have no GPUs (gpu=0)", field=field)


def _text(v: str | float) -> str:
    """A checked value as its label's text: `50` for 50.0, `12.5` as is."""
    if isinstance(v, float):
        return str(int(v)) if v.is_integer() else repr(v)
    return v
