"""A model document: what the cost model knows of one training model, as JSON (stored by `peloton model create`,
written by `peloton model fit`).

    {"kind": "peloton.model/v1", "name": "bert",
     "description": {"parameters": 110000000, "parameter_bytes": 440000000, "flops_per_sample": 2.5e11,
                     "sync": "allreduce-ring", "local_bsz": 12, "dataset_samples": 88000},
     "params": {"alpha_c": ..., "beta_c": ..., "alpha_r": ..., "beta_r": ..., "alpha_n": ..., "beta_n": ...,
                "alpha_h": ..., "kappa": ..., "gamma": ...,
                "reference": {"gpu_model": "t4", "nic_gbps": 50, "gpu_link": "pcie"}},
     "fit": {"rows": 30, "median_error": 0.01, "p90_error": 0.03, "source": "bert/placements.csv"},
     "profile": [[[1, 1], 8, 1.40], ...],  # the rows fitted: [GPUs per host, local_bsz, step_time]
     "measured": [{"job_id": "...", "placement": [4, 4], "local_bsz": 12, "step_time": 2.5,
                   "predicted_step_time": 2.4,
                   "hardware": [{"gpu_model": "t4", "nic_gbps": 50, "gpu_link": "pcie"}]}]}

Every part but `kind` is optional, but a document must give either `params` (fitted) or the description's
`parameters` (or `parameter_bytes` or `layers`) and `flops_per_sample`, from which the prior is computed.
`params.alpha_h` and `params.kappa` are optional (0: documents written before the cost model had them describe
rings without a per-host latency, GPUs that compute as if alone on their host).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from peloton.errors import InvalidArgument
from peloton.modelaware.cost import OPTIONAL_PARAMS, PARAM_NAMES, PS, RING, SYNC_PATTERNS, CostParams, Reference, prior
from peloton.modelaware.gpus import DEFAULT_TABLE, LINK_GBYTES_S, GpuTable
from peloton.modelaware.profile import ProfileRow

KIND = "peloton.model/v1"
MAX_NAME_CHARS = 128
MAX_LAYERS = 100_000
MAX_MEASURED = 1000  # the newest are kept
MAX_PROFILE_ROWS = 10_000
BYTES_PER_PARAMETER = 4  # FP32 gradients, when only the count is given
# alpha_c's least: every step computes for some time (samples/s divides by the step time; below this a faster
# GPU's scaled compute underflows to 0 s). Far below the fit's floor (1e-9 s), so fitted params always pass.
MIN_ALPHA_C = 1e-12
# a document's params (and kappa) at most this: larger ones overflow a prediction to inf and NaN. Far above the
# fit's bounds (1e4 s, kappa 1e4)
MAX_PARAM = 1e6


@dataclass(frozen=True, slots=True)
class Description:
    parameters: int = 0  # count
    parameter_bytes: int = 0  # gradient bytes synchronised per step (default: parameters * 4, or the layers' sum)
    layers: tuple[int, ...] = ()  # bytes per layer
    flops_per_sample: float = 0.0  # forward + backward
    sync: str = RING
    ps_count: int | None = None  # parameter servers; None: the planner chooses
    local_bsz: float = 0.0  # per GPU; 0: not given
    global_bsz: float = 0.0  # over the gang; 0: not given
    dataset_samples: int = 0

    @property
    def gradient_bytes(self) -> int:
        return self.parameter_bytes or sum(self.layers) or self.parameters * BYTES_PER_PARAMETER


@dataclass(frozen=True, slots=True)
class FitInfo:
    rows: int
    median_error: float
    p90_error: float
    source: str = ""


@dataclass(frozen=True, slots=True)
class Measurement:
    """What a running job reported, beside what the model predicted for its placement, and the hardware it ran
    on (`model refit` fits only measurements made on hardware like the model's reference: fit.unlike_reference)."""

    job_id: str
    placement: tuple[int, ...]
    local_bsz: float
    step_time: float
    predicted_step_time: float = 0.0
    gpu_model: str = ""  # older documents' one hint of the hardware: the GPU model alone ("": not given)
    # the distinct hardware (labels gpu_model, nic_gbps, gpu_link, defaults applied) of the hosts its gang ran on,
    # as the plan search saw them; (): recorded before measurements kept it (assumed the reference, as then)
    hardware: tuple[Reference, ...] = ()


@dataclass(frozen=True, slots=True)
class ModelDocument:
    name: str = ""
    description: Description = Description()
    params: CostParams | None = None
    fit: FitInfo | None = None
    measured: tuple[Measurement, ...] = field(default=())
    profile: tuple[ProfileRow, ...] = ()  # the rows the params were fitted to (a refit adds the measured ones)

    def cost_params(self, table: GpuTable = DEFAULT_TABLE, field_prefix: str = "model") -> CostParams:
        """The fitted parameters, else the prior of the description."""
        if self.params is not None:
            return self.params
        d = self.description
        if not d.gradient_bytes or not d.flops_per_sample:
            f = f"{field_prefix}.description.{'flops_per_sample' if d.gradient_bytes else 'parameters'}"
            raise InvalidArgument(f"{f}: needed to predict (the model has no fitted params: run peloton model fit "
                                  "on a profile, or describe the model)", field=f)
        return prior(d.gradient_bytes, d.flops_per_sample, table)


def _bad(f: str, why: str) -> InvalidArgument:
    return InvalidArgument(f"{f}: {why}", field=f)


def _obj(v: object, f: str, known: tuple[str, ...]) -> dict[str, object]:
    if not isinstance(v, dict):
        raise _bad(f, f"expected an object, got {type(v).__name__}")
    for k in v:
        if k not in known:
            raise _bad(f"{f}.{k}", f"unknown field (known here: {', '.join(known)})")
    return v


def _num(v: object, f: str, *, integer: bool = False, positive: bool = False) -> float:
    try:  # json.loads gives an int of any size: one too large for a float is not a finite number
        finite = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    except OverflowError:
        finite = False
    if not finite or not isinstance(v, (int, float)) or v < 0:
        raise _bad(f, f"expected a non-negative {'whole number' if integer else 'number'}, got {v!r}")
    if integer and v != int(v):
        raise _bad(f, f"expected a whole number, got {v!r}")
    if positive and v <= 0:
        raise _bad(f, "must be greater than 0")
    return float(v)


def _text(v: object, f: str, max_chars: int = 256) -> str:
    if not isinstance(v, str):
        raise _bad(f, f"expected text, got {type(v).__name__}")
    if len(v) > max_chars or "\x00" in v:
        raise _bad(f, f"at most {max_chars} characters, no NUL")
    return v


def _description(v: object, f: str) -> Description:
    d = _obj(v, f, ("parameters", "parameter_bytes", "layers", "flops_per_sample", "sync", "ps_count", "local_bsz",
                    "global_bsz", "dataset_samples"))
    layers: tuple[int, ...] = ()
    if "layers" in d:
        raw = d["layers"]
        if not isinstance(raw, list) or len(raw) > MAX_LAYERS:
            raise _bad(f"{f}.layers", f"expected a list of at most {MAX_LAYERS} byte sizes")
        layers = tuple(int(_num(x, f"{f}.layers[{i}]", integer=True, positive=True)) for i, x in enumerate(raw))
    sync = _text(d.get("sync", RING), f"{f}.sync", 64)
    if sync not in SYNC_PATTERNS:
        raise _bad(f"{f}.sync", f"must be one of {', '.join(SYNC_PATTERNS)}, got {sync!r}")
    ps_count: int | None = None
    if "ps_count" in d and d["ps_count"] != "choose":
        ps_count = int(_num(d["ps_count"], f"{f}.ps_count", integer=True, positive=True))
    if ps_count is not None and sync != PS:
        raise _bad(f"{f}.ps_count", f"only with sync: {PS}")
    desc = Description(
        parameters=int(_num(d.get("parameters", 0), f"{f}.parameters", integer=True)),
        parameter_bytes=int(_num(d.get("parameter_bytes", 0), f"{f}.parameter_bytes", integer=True)),
        layers=layers,
        flops_per_sample=_num(d.get("flops_per_sample", 0), f"{f}.flops_per_sample"),
        sync=sync, ps_count=ps_count,
        local_bsz=_num(d.get("local_bsz", 0), f"{f}.local_bsz"),
        global_bsz=_num(d.get("global_bsz", 0), f"{f}.global_bsz"),
        dataset_samples=int(_num(d.get("dataset_samples", 0), f"{f}.dataset_samples", integer=True)),
    )
    if desc.local_bsz and desc.global_bsz:
        raise _bad(f"{f}.global_bsz", "give local_bsz or global_bsz, not both")
    if layers and desc.parameter_bytes and sum(layers) != desc.parameter_bytes:
        raise _bad(f"{f}.layers", f"add up to {sum(layers)} bytes, but parameter_bytes is {desc.parameter_bytes}")
    return desc


def parse_reference(v: object, f: str) -> Reference:
    d = _obj(v, f, ("gpu_model", "nic_gbps", "gpu_link"))
    link = _text(d.get("gpu_link", "pcie"), f"{f}.gpu_link", 16)
    if link not in LINK_GBYTES_S:
        raise _bad(f"{f}.gpu_link", f"must be one of {', '.join(LINK_GBYTES_S)}, got {link!r}")
    return Reference(gpu_model=_text(d.get("gpu_model", "t4"), f"{f}.gpu_model", 64).lower(),
                     nic_gbps=_num(d.get("nic_gbps", 25.0), f"{f}.nic_gbps", positive=True), gpu_link=link)


def parse_params(v: object, f: str) -> CostParams:
    d = _obj(v, f, (*PARAM_NAMES, "reference"))
    vals = {}
    for name in PARAM_NAMES:
        if name not in d and name not in OPTIONAL_PARAMS:
            raise _bad(f"{f}.{name}", "required")
        vals[name] = _num(d.get(name, OPTIONAL_PARAMS.get(name)), f"{f}.{name}")
    if vals["gamma"] < 1:
        raise _bad(f"{f}.gamma", f"at least 1, got {vals['gamma']}")
    if vals["alpha_c"] < MIN_ALPHA_C:
        raise _bad(f"{f}.alpha_c", f"at least {MIN_ALPHA_C:g} s (every step computes; a step of 0 s has no "
                                   f"samples/s), got {vals['alpha_c']}")
    return CostParams(**vals, reference=parse_reference(d.get("reference", {}), f"{f}.reference"))


def _measurement(v: object, f: str) -> Measurement:
    d = _obj(v, f, ("job_id", "placement", "local_bsz", "step_time", "predicted_step_time", "gpu_model",
                    "hardware"))
    raw = d.get("placement")
    if not isinstance(raw, list) or not raw:
        raise _bad(f"{f}.placement", "expected a list of GPUs per host")
    placement = tuple(int(_num(x, f"{f}.placement[{i}]", integer=True, positive=True)) for i, x in enumerate(raw))
    hardware: tuple[Reference, ...] = ()
    if "hardware" in d:
        hw = d["hardware"]
        if not isinstance(hw, list) or not 1 <= len(hw) <= len(placement):
            raise _bad(f"{f}.hardware", f"expected a list of 1 to {len(placement)} hosts' hardware (one per kind of "
                                        "host the placement ran on)")
        hardware = tuple(_hardware(x, f"{f}.hardware[{i}]") for i, x in enumerate(hw))
    return Measurement(job_id=_text(d.get("job_id", ""), f"{f}.job_id"), placement=placement,
                       local_bsz=_num(d.get("local_bsz"), f"{f}.local_bsz", positive=True),
                       step_time=_num(d.get("step_time"), f"{f}.step_time", positive=True),
                       predicted_step_time=_num(d.get("predicted_step_time", 0), f"{f}.predicted_step_time"),
                       gpu_model=_text(d.get("gpu_model", ""), f"{f}.gpu_model", 64), hardware=hardware)


def _hardware(v: object, f: str) -> Reference:
    """A host's hardware in a measurement: every field given (the daemon recorded them, defaults applied)."""
    d = _obj(v, f, ("gpu_model", "nic_gbps", "gpu_link"))
    for name in ("gpu_model", "nic_gbps", "gpu_link"):
        if name not in d:
            raise _bad(f"{f}.{name}", "required")
    return parse_reference(d, f)


def hardware_to_dict(h: Reference) -> dict[str, object]:
    return {"gpu_model": h.gpu_model, "nic_gbps": h.nic_gbps, "gpu_link": h.gpu_link}


def _profile_row(v: object, f: str) -> ProfileRow:
    if not isinstance(v, list) or len(v) != 3 or not isinstance(v[0], list) or not v[0]:
        raise _bad(f, "expected [GPUs per host (a list), local_bsz, step_time]")
    placement = tuple(int(_num(x, f"{f}[0]", integer=True, positive=True)) for x in v[0])
    return ProfileRow(placement, _num(v[1], f"{f}[1]", positive=True), _num(v[2], f"{f}[2]", positive=True))


def parse_document(doc: object, field: str = "model") -> ModelDocument:
    """A model document from its JSON value; InvalidArgument names the field at fault."""
    d = _obj(doc, field, ("kind", "name", "description", "params", "fit", "measured", "profile"))
    kind = d.get("kind", KIND)
    if kind != KIND:
        raise _bad(f"{field}.kind", f"expected {KIND!r}, got {kind!r}")
    desc = _description(d.get("description", {}), f"{field}.description")
    params = parse_params(d["params"], f"{field}.params") if d.get("params") is not None else None
    if params is not None:  # here, not in parse_params: a job's recorded goal may hold a large prior's params
        for name in PARAM_NAMES:
            if name != "gamma" and getattr(params, name) > MAX_PARAM:
                raise _bad(f"{field}.params.{name}", f"at most {MAX_PARAM:g} (larger overflows a prediction), "
                                                     f"got {getattr(params, name)}")
    fit = None
    if d.get("fit") is not None:
        fd = _obj(d["fit"], f"{field}.fit", ("rows", "median_error", "p90_error", "source"))
        fit = FitInfo(rows=int(_num(fd.get("rows", 0), f"{field}.fit.rows", integer=True)),
                      median_error=_num(fd.get("median_error", 0), f"{field}.fit.median_error"),
                      p90_error=_num(fd.get("p90_error", 0), f"{field}.fit.p90_error"),
                      source=_text(fd.get("source", ""), f"{field}.fit.source", 1024))
    raw = d.get("measured", [])
    if not isinstance(raw, list) or len(raw) > MAX_MEASURED:
        raise _bad(f"{field}.measured", f"expected a list of at most {MAX_MEASURED} measurements")
    rows = d.get("profile", [])
    if not isinstance(rows, list) or len(rows) > MAX_PROFILE_ROWS:
        raise _bad(f"{field}.profile", f"expected a list of at most {MAX_PROFILE_ROWS} rows")
    out = ModelDocument(name=_text(d.get("name", ""), f"{field}.name", MAX_NAME_CHARS), description=desc,
                        params=params, fit=fit,
                        measured=tuple(_measurement(m, f"{field}.measured[{i}]") for i, m in enumerate(raw)),
                        profile=tuple(_profile_row(r, f"{field}.profile[{i}]") for i, r in enumerate(rows)))
    if params is None and not (desc.gradient_bytes and desc.flops_per_sample):
        raise _bad(f"{field}.params", "required unless the description gives parameters (or parameter_bytes or "
                                      "layers) and flops_per_sample")
    return out


def document_to_dict(doc: ModelDocument) -> dict[str, object]:
    d = doc.description
    desc: dict[str, object] = {"sync": d.sync}
    for name in ("parameters", "parameter_bytes", "flops_per_sample", "local_bsz", "global_bsz", "dataset_samples"):
        val = getattr(d, name)
        if val:
            desc[name] = val
    if d.layers:
        desc["layers"] = list(d.layers)
    if d.sync == PS:
        desc["ps_count"] = d.ps_count if d.ps_count is not None else "choose"
    out: dict[str, object] = {"kind": KIND}
    if doc.name:
        out["name"] = doc.name
    out["description"] = desc
    if doc.params is not None:
        out["params"] = doc.params.as_dict()
    if doc.fit is not None:
        out["fit"] = {"rows": doc.fit.rows, "median_error": doc.fit.median_error, "p90_error": doc.fit.p90_error,
                      "source": doc.fit.source}
    if doc.profile:
        out["profile"] = [[list(r.placement), r.local_bsz, r.step_time] for r in doc.profile]
    if doc.measured:
        out["measured"] = [{"job_id": m.job_id, "placement": list(m.placement), "local_bsz": m.local_bsz,
                            "step_time": m.step_time, "predicted_step_time": m.predicted_step_time,
                            **({"gpu_model": m.gpu_model} if m.gpu_model else {}),
                            **({"hardware": [hardware_to_dict(h) for h in m.hardware]} if m.hardware else {})}
                           for m in doc.measured]
    return out
