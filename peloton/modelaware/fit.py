"""Fitting the cost model's parameters to a profile (pure Python: a few dozen rows, nine parameters).

Least squares on log(predicted / measured step time), so a 10% miss weighs the same on a 40 ms step as on a 2 s
one, by Levenberg-Marquardt over the logarithms of the parameters (they stay positive; gamma = 1 + e^v stays
>= 1). A parameter the profile cannot tell (no multi-host row: the network's; rows on one number of hosts only:
the per-host latency alpha_h, which they cannot tell from alpha_n; no host with two GPUs or more at two local
batches, or no row of one GPU per host: the contention kappa, which they cannot tell from the sync or from beta_c)
keeps its value from `base` (the prior of the model's description, or the defaults).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from peloton.errors import InvalidArgument
from peloton.modelaware.cost import NET_STEP_LATENCY_S, PS, RING, CostParams, Reference, predict, uniform_hosts
from peloton.modelaware.document import Measurement
from peloton.modelaware.profile import ProfileRow

# When nothing better is known: a small model on the reference hardware (only the parameters a profile cannot
# tell keep these values).
DEFAULT_BASE = CostParams(alpha_c=0.005, beta_c=0.001, alpha_r=0.001, beta_r=0.01, alpha_n=0.005, beta_n=0.05,
                          gamma=1.0, alpha_h=NET_STEP_LATENCY_S["pcie"])  # alpha_h: the prior's for one bucket
_GAMMA_MAX = 10.0
_FLOOR = 1e-9  # seconds: a parameter the fit drives to zero stays just above it (its logarithm stays finite)


@dataclass(frozen=True, slots=True)
class FitResult:
    params: CostParams
    rows: int
    fitted: tuple[str, ...]  # the parameters the profile determined
    median_error: float  # |predicted - measured| / measured over the profile's rows
    p90_error: float
    max_error: float


def relative_errors(params: CostParams, rows: Sequence[ProfileRow], pattern: str = RING) -> list[float]:
    out = []
    for r in rows:
        pred = predict(params, uniform_hosts(r.placement, params.reference), r.local_bsz, pattern).step_time
        out.append(abs(pred - r.step_time) / r.step_time)
    return out


def quantile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between order statistics (numpy's default)."""
    v = sorted(values)
    if not v:
        return 0.0
    pos = q * (len(v) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def fit(rows: Sequence[ProfileRow], reference: Reference, base: CostParams | None = None,
        pattern: str = RING) -> FitResult:
    """The parameters that best explain `rows`, measured on hosts like `reference`."""
    if not rows:
        raise InvalidArgument("profile: no rows to fit", field="profile")
    base = replace(base or DEFAULT_BASE, reference=reference)
    names = ["alpha_c", "beta_c"]
    if any(len(r.placement) == 1 and r.gpus > 1 for r in rows):
        names += ["alpha_r", "beta_r"]
    if any(len(r.placement) > 1 for r in rows):
        names += ["alpha_n", "beta_n"]
    if len({len(r.placement) for r in rows if len(r.placement) > 1}) > 1:
        names.append("alpha_h")  # rows on two host counts tell the per-host latency from the per-sync one
    crowded = {r.local_bsz for r in rows if max(r.placement) > 1}
    if len(crowded) > 1 and any(max(r.placement) == 1 for r in rows):
        names.append("kappa")  # a crowded host's time grows with the batch beyond the lone GPU's: contention
    if any(r.gpus > 1 for r in rows):
        names.append("gamma")

    def params_of(u: Sequence[float]) -> CostParams:
        vals = {}
        for name, x in zip(names, u, strict=True):
            vals[name] = 1.0 + math.exp(x) if name == "gamma" else math.exp(x)
        return replace(base, **vals)  # type: ignore[arg-type]  # floats for the float fields only

    def residuals(u: Sequence[float]) -> list[float]:
        p = params_of(u)
        return [math.log(predict(p, uniform_hosts(r.placement, reference), r.local_bsz, pattern).step_time
                         / r.step_time) for r in rows]

    # seconds within [1e-9, 1e4]; gamma within [1, 10] (Pollux's range)
    bounds = [(math.log(1e-9), math.log(_GAMMA_MAX - 1)) if n == "gamma" else (math.log(_FLOOR), math.log(1e4))
              for n in names]
    best_u: list[float] | None = None
    best_cost = math.inf
    for start in _starts(rows, names, base):
        u, cost = _levenberg_marquardt(residuals, start, bounds)
        if cost < best_cost:
            best_u, best_cost = u, cost
    assert best_u is not None
    params = params_of(best_u)
    errs = relative_errors(params, rows, pattern)
    return FitResult(params, len(rows), tuple(names), quantile(errs, 0.5), quantile(errs, 0.9), max(errs))


def _starts(rows: Sequence[ProfileRow], names: list[str], base: CostParams) -> list[list[float]]:
    """A few starting points: the base, and one from the single-GPU rows' line (step = alpha_c + beta_c * b)."""
    single = [r for r in rows if r.gpus == 1] or list(rows)
    b_mean = sum(r.local_bsz for r in single) / len(single)
    t_mean = sum(r.step_time for r in single) / len(single)
    var = sum((r.local_bsz - b_mean) ** 2 for r in single)
    slope = sum((r.local_bsz - b_mean) * (r.step_time - t_mean) for r in single) / var if var else 0.0
    slope = max(slope, t_mean / max(b_mean, 1.0) * 0.1)
    icpt = max(t_mean - slope * b_mean, t_mean * 0.05)
    multi = [r.step_time for r in rows if r.gpus > 1]
    sync_guess = max((sum(multi) / len(multi) - t_mean) if multi else 0.0, t_mean * 0.05)
    guesses = []
    for scale in (1.0, 0.1):
        g = {"alpha_c": icpt, "beta_c": slope, "alpha_r": sync_guess * scale * 0.5,
             "beta_r": sync_guess * scale * 0.5, "alpha_n": sync_guess * scale, "beta_n": sync_guess * scale * 0.2,
             "alpha_h": sync_guess * scale * 0.05, "kappa": 0.05}
        guesses.append([math.log(max(g[n], _FLOOR)) if n != "gamma" else 0.0 for n in names])
    guesses.append([math.log(max(getattr(base, n), _FLOOR)) if n != "gamma" else math.log(max(base.gamma - 1, 0.01))
                    for n in names])
    return guesses


def _levenberg_marquardt(residuals: Callable[[Sequence[float]], list[float]], u0: list[float],
                         bounds: Sequence[tuple[float, float]], iterations: int = 300) -> tuple[list[float], float]:
    u = list(u0)
    r = residuals(u)
    cost = sum(x * x for x in r)
    lam = 1e-2
    n = len(u)
    for _ in range(iterations):
        jac = []  # jac[j][i] = d r_i / d u_j
        for j in range(n):
            h = 1e-6 * max(1.0, abs(u[j]))
            uj = list(u)
            uj[j] += h
            rj = residuals(uj)
            jac.append([(a - b) / h for a, b in zip(rj, r, strict=True)])
        a = [[sum(x * y for x, y in zip(jac[i], jac[j], strict=True)) for j in range(n)] for i in range(n)]
        g = [sum(x * y for x, y in zip(jac[i], r, strict=True)) for i in range(n)]
        improved = done = False
        while lam < 1e12:
            m = [[a[i][j] + (lam * (a[i][i] + 1e-9) if i == j else 0.0) for j in range(n)] for i in range(n)]
            step = _solve(m, [-x for x in g])
            cand = [x + s for x, s in zip(u, step, strict=True)]
            cand = [min(max(x, lo), hi) for x, (lo, hi) in zip(cand, bounds, strict=True)]
            rc = residuals(cand)
            c = sum(x * x for x in rc)
            if c < cost:
                done = cost - c < 1e-12 * max(cost, 1e-12)
                u, r, cost = cand, rc, c
                lam = max(lam / 3, 1e-12)
                improved = True
                break
            lam *= 4
        if not improved or done:
            break
    return u, cost


def _solve(m: list[list[float]], b: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting (the matrix is small, symmetric and damped)."""
    n = len(b)
    aug = [row[:] + [b[i]] for i, row in enumerate(m)]
    for col in range(n):
        piv = max(range(col, n), key=lambda i: abs(aug[i][col]))
        if abs(aug[piv][col]) < 1e-300:
            continue
        aug[col], aug[piv] = aug[piv], aug[col]
        for i in range(col + 1, n):
            f = aug[i][col] / aug[col][col]
            if f:
                for j in range(col, n + 1):
                    aug[i][j] -= f * aug[col][j]
    x = [0.0] * n
    for i in range(n - 1, -1, -1):
        if abs(aug[i][i]) < 1e-300:
            continue
        x[i] = (aug[i][n] - sum(aug[i][j] * x[j] for j in range(i + 1, n))) / aug[i][i]
    return x


def unlike_reference(m: Measurement, reference: Reference, pattern: str = RING) -> str:
    """Why `m` cannot be fitted as a step time on the reference hardware ("" when it can): what differs, like
    `gpu_model a100, not t4; gpu_link nvlink, not pcie`.

    The fit predicts every row on hosts like the reference, so a measurement is fitted only when the hardware the
    cost model reads for its placement is the reference's: every host's GPU model (the compute); their NICs when
    the gang spans hosts (the network term; and always for parameter servers, whose traffic leaves a host for the
    servers'); their link when a host has two of its GPUs or more (the ring within a host). With that hardware
    alike, the prediction on the hosts it ran on is exactly the prediction on the reference, for any parameters.
    No translation is made of the others: the GPU table's relative throughput is an estimate (a datasheet's, or
    the operator's), and a step's time mixes compute with synchronisation through gamma, so a step time measured
    on other GPUs or NICs cannot be turned into the reference's without the very parameters being fitted.

    A measurement recorded before measurements kept their hardware (no `hardware`) is assumed to have run on the
    reference, as refit then assumed; one of those that names its GPU model (`gpu_model`) is judged by it."""
    if m.hardware:
        kinds = m.hardware
    elif m.gpu_model:
        kinds = (Reference(m.gpu_model.lower(), reference.nic_gbps, reference.gpu_link),)
    else:
        return ""
    why = []
    models = sorted({h.gpu_model.lower() for h in kinds} - {reference.gpu_model.lower()})
    if models:
        why.append(f"gpu_model {', '.join(models)}, not {reference.gpu_model}")
    if len(m.placement) > 1 or pattern == PS:
        nics = sorted({h.nic_gbps for h in kinds} - {reference.nic_gbps})
        if nics:
            why.append(f"nic_gbps {', '.join(f'{x:g}' for x in nics)}, not {reference.nic_gbps:g}")
    if max(m.placement) > 1 or pattern == PS:
        links = sorted({h.gpu_link for h in kinds} - {reference.gpu_link})
        if links:
            why.append(f"gpu_link {', '.join(links)}, not {reference.gpu_link}")
    return "; ".join(why)


def split_measured(measured: Sequence[Measurement], reference: Reference, pattern: str = RING
                   ) -> tuple[list[Measurement], list[tuple[Measurement, str]]]:
    """The measurements refit fits (made on hardware like the reference), and the others with why not."""
    used: list[Measurement] = []
    left_out: list[tuple[Measurement, str]] = []
    for m in measured:
        why = unlike_reference(m, reference, pattern)
        if why:
            left_out.append((m, why))
        else:
            used.append(m)
    return used, left_out


def refit(rows: Sequence[ProfileRow], measured: Sequence[Measurement], reference: Reference,
          base: CostParams | None = None, pattern: str = RING) -> FitResult:
    """The parameters fitted again to the profile's rows and what jobs measured on hardware like the reference, the
    measured ones weighing as much as a profile row. Measurements made on other hardware are left out
    (unlike_reference says why): fitted as if on the reference, they would silently corrupt the parameters."""
    used, _ = split_measured(measured, reference, pattern)
    extra = [ProfileRow(m.placement, m.local_bsz, m.step_time) for m in used]
    return fit([*rows, *extra], reference, base, pattern)
