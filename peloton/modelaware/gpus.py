"""The GPU models and links the cost model knows.

`relative` is a GPU's training throughput relative to an NVIDIA T4 (the GPU of the public profiles in
shared/data/public/adaptdl). Without a measurement it is estimated from the vendors' datasheets as the geometric
mean of the FP32 peak and the memory bandwidth, each against the T4's: training steps are partly compute-bound
and partly memory-bound. An operator replaces any row, or adds one, with a measured figure (`--gpu-table FILE`,
`load_table`): a relative throughput measured on the operator's own models beats this estimate.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass

from peloton.errors import InvalidArgument


@dataclass(frozen=True, slots=True)
class GpuModel:
    name: str
    fp32_tflops: float  # vendor peak, dense
    mem_gbps: float  # memory bandwidth, GB/s
    memory_gib: float
    relative: float  # training throughput relative to a T4


def _estimate(fp32_tflops: float, mem_gbps: float) -> float:
    return round(math.sqrt(fp32_tflops / 8.1 * mem_gbps / 320.0), 3)


def _row(name: str, fp32: float, bw: float, mem: float) -> GpuModel:
    return GpuModel(name, fp32, bw, mem, _estimate(fp32, bw))


# Vendor datasheets (NVIDIA product briefs: T4, V100 SXM2, A100 SXM4 40 GB, H100 SXM5, A10, A10G (AWS g5), L4,
# P100 PCIe, K80 (one of its two GPUs)). "unknown" and the sim backend's "sim-gpu" count as a T4.
BUILTIN: dict[str, GpuModel] = {
    g.name: g for g in (
        _row("t4", 8.1, 320, 16),
        _row("v100", 15.7, 900, 32),
        _row("a100", 19.5, 1555, 40),
        _row("h100", 67.0, 3350, 80),
        _row("a10", 31.2, 600, 24),
        _row("a10g", 31.2, 600, 24),
        _row("l4", 30.3, 300, 24),
        _row("p100", 9.3, 732, 16),
        _row("k80", 4.4, 240, 12),
        GpuModel("unknown", 8.1, 320, 16, 1.0),
        GpuModel("sim-gpu", 8.1, 320, 16, 1.0),
    )
}

# Intra-host links between GPUs of one host: effective all-reduce bandwidth in GB/s (PCIe 3.0 x16 moves about
# 12 GB/s of its 15.75; NVLink 2 on a V100 gives a GPU 150 GB/s, of which a ring uses about 100).
LINK_GBYTES_S: dict[str, float] = {"pcie": 12.0, "nvlink": 100.0}
# What a TCP stream gets of a NIC's line rate in practice.
NIC_EFFICIENCY = 0.7


@dataclass(frozen=True, slots=True)
class GpuTable:
    models: Mapping[str, GpuModel]

    def get(self, name: str) -> GpuModel:
        """The row for `name`; a GPU model nobody has described counts as `unknown` (a T4)."""
        return self.models.get(name.lower()) or self.models["unknown"]

    def relative(self, name: str) -> float:
        return self.get(name).relative


DEFAULT_TABLE = GpuTable(BUILTIN)


def load_table(text: str, source: str = "gpu table") -> GpuTable:
    """The built-in table with the rows of a JSON object `{"name": {"relative": 2.1, "fp32_tflops": ..., ...}}`
    replacing or adding to it. A row needs `relative`, or `fp32_tflops` and `mem_gbps` to estimate it from."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise InvalidArgument(f"{source}: not JSON: {e}", field=source) from None
    if not isinstance(doc, dict):
        raise InvalidArgument(f"{source}: expected an object of GPU models", field=source)
    rows = dict(BUILTIN)
    for name, row in doc.items():
        f = f"{source}.{name}"
        if not isinstance(row, dict):
            raise InvalidArgument(f"{f}: expected an object", field=f)
        known = {"relative", "fp32_tflops", "mem_gbps", "memory_gib"}
        extra = sorted(set(row) - known)
        if extra:
            raise InvalidArgument(f"{f}.{extra[0]}: unknown field (known: {', '.join(sorted(known))})",
                                  field=f"{f}.{extra[0]}")
        vals = {}
        for k in known:
            if k in row:
                v = row[k]
                try:  # json.loads gives an int of any size: too large for a float is not finite
                    finite = not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)
                except OverflowError:
                    finite = False
                if not finite or v <= 0:
                    raise InvalidArgument(f"{f}.{k}: expected a positive number, got {v!r}", field=f"{f}.{k}")
                vals[k] = float(v)
        base = rows.get(name.lower())
        fp32 = vals.get("fp32_tflops", base.fp32_tflops if base else 0.0)
        bw = vals.get("mem_gbps", base.mem_gbps if base else 0.0)
        if "relative" in vals:
            rel = vals["relative"]
        elif fp32 and bw:
            rel = _estimate(fp32, bw)
        else:
            raise InvalidArgument(f"{f}: give relative, or fp32_tflops and mem_gbps", field=f)
        rows[name.lower()] = GpuModel(name.lower(), fp32, bw, vals.get("memory_gib", base.memory_gib if base else 0),
                                      rel)
    return GpuTable(rows)
