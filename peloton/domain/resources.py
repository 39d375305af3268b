"""Resource vectors and the quantity syntax of the job spec (`512Mi`, `16Gi`, or an integer of MiB)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from decimal import Decimal

from peloton.domain.checks import show
from peloton.errors import InvalidArgument

_UNITS_MIB = {"": 1.0, "Ki": 1 / 1024, "Mi": 1.0, "Gi": 1024.0, "Ti": 1024.0 * 1024}
_QUANTITY = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*(Ki|Mi|Gi|Ti)?")  # fullmatch, on the stripped text


def parse_mib(value: str | int | float, field: str) -> float:
    """`16Gi` -> 16384.0 MiB; a bare number is MiB. Raises InvalidArgument naming `field`."""
    if isinstance(value, bool):
        raise InvalidArgument(f"{field}: expected a quantity like 512Mi or 16Gi, got {value!r}", field=field)
    if isinstance(value, (int, float)):
        try:
            mib = float(value)
        except OverflowError:  # an int beyond float
            raise InvalidArgument(f"{field}: too large", field=field) from None
        if not math.isfinite(mib):
            raise InvalidArgument(f"{field}: must be a finite quantity, got {mib}", field=field)
        if mib < 0:
            raise InvalidArgument(f"{field}: must not be negative, got {mib:g}", field=field)
        return mib
    text = str(value).strip()
    if text == "":
        return 0.0
    if text.startswith("-"):
        raise InvalidArgument(f"{field}: must not be negative, got {show(value)}", field=field)
    m = _QUANTITY.fullmatch(text)
    if not m:
        raise InvalidArgument(f"{field}: expected a quantity like 512Mi or 16Gi, got {show(value)}", field=field)
    mib = float(m.group(1)) * _UNITS_MIB[m.group(2) or ""]
    if not math.isfinite(mib):  # float() of 400 digits is inf, it does not raise
        raise InvalidArgument(f"{field}: too large, got {show(value)}", field=field)
    return mib


def format_mib(mib: float) -> str:
    if mib >= 1024 and mib % 1024 == 0:
        return f"{int(mib // 1024)}Gi"
    if mib == int(mib):
        return f"{int(mib)}Mi"
    return f"{format(Decimal(repr(mib)), 'f')}Mi"  # exact, never an exponent: parse_mib reads it back


def show_quantity(dim: str, value: float) -> str:
    """A quantity for people (wait reasons, messages), in a form the CLI takes: `16Gi` or `1126.4Mi` for mem and
    disk, `8` or `1.5` for cpu and gpu, never an exponent. To three decimals (about a KiB, a thousandth of a core),
    so that a float sum's drift (1000 gangs of 1.1Gi hold 1126400.0000000088 MiB) does not show; format_mib is
    the exact form, for what is read back."""
    v = round(value, 3) + 0.0  # (+ 0.0: no "-0")
    if dim in ("mem", "disk"):
        return format_mib(v)
    return str(int(v)) if v == int(v) else format(Decimal(repr(v)), "f")


# Each dimension in the base unit Prometheus asks for, by what its figure is multiplied: cpu in cores, mem and
# disk in bytes (the daemon counts MiB), gpu a count. For every exported gauge of resources.
BASE_UNITS = {"cpu": 1.0, "mem": 1024.0 * 1024, "disk": 1024.0 * 1024, "gpu": 1.0}

# How far a float sum may stand above its bound and still fit. Sums of many quantities that are inexact in binary
# (1.1 cores, 1.1Gi = 1126.4 MiB) drift by about one ulp per term: 1000 gangs of 1.1Gi sum to 1126400.0000000088
# MiB, which an absolute 1e-9 alone refused against a limit of 1100Gi. So the tolerance grows with the bound
# (1e-10 of it: a 1 EiB limit gains 110 MiB, a 10-million-core one 0.001 core, far below what anyone asks).
ABS_TOLERANCE = 1e-9
REL_TOLERANCE = 1e-10


def within(value: float, bound: float, abs_tolerance: float = ABS_TOLERANCE) -> bool:
    """value <= bound, give or take float rounding (absolute near zero, relative to the bound above)."""
    return value <= bound + abs_tolerance + REL_TOLERANCE * abs(bound)


@dataclass(frozen=True, slots=True)
class Resources:
    """A resource vector. cpu in cores, mem/disk in MiB, gpu and ports as counts."""

    cpu: float = 0.0
    mem: float = 0.0
    disk: float = 0.0
    gpu: int = 0
    ports: int = 0

    def __add__(self, o: Resources) -> Resources:
        return Resources(self.cpu + o.cpu, self.mem + o.mem, self.disk + o.disk, self.gpu + o.gpu, self.ports + o.ports)

    def __sub__(self, o: Resources) -> Resources:
        return Resources(self.cpu - o.cpu, self.mem - o.mem, self.disk - o.disk, self.gpu - o.gpu, self.ports - o.ports)

    def scale(self, n: int) -> Resources:
        return Resources(self.cpu * n, self.mem * n, self.disk * n, self.gpu * n, self.ports * n)

    def fits_in(self, o: Resources) -> bool:
        return (
            within(self.cpu, o.cpu)
            and within(self.mem, o.mem)
            and within(self.disk, o.disk)
            and self.gpu <= o.gpu
            and self.ports <= o.ports
        )

    def short_of(self, o: Resources) -> list[str]:
        """Dimensions in which `self` does not fit in `o` (for failure explanations)."""
        out = []
        if not within(self.cpu, o.cpu):
            out.append("cpu")
        if not within(self.mem, o.mem):
            out.append("mem")
        if not within(self.disk, o.disk):
            out.append("disk")
        if self.gpu > o.gpu:
            out.append("gpu")
        if self.ports > o.ports:
            out.append("ports")
        return out

    def describe(self) -> str:
        parts = [f"cpu={show_quantity('cpu', self.cpu)}", f"mem={show_quantity('mem', self.mem)}"]
        if self.disk:
            parts.append(f"disk={show_quantity('disk', self.disk)}")
        if self.gpu:
            parts.append(f"gpu={self.gpu}")
        if self.ports:
            parts.append(f"ports={self.ports}")
        return ",".join(parts)


def parse_resources_flag(text: str, field: str = "--local-host-resources") -> Resources:
    """`cpu=8,mem=16Gi,gpu=2,disk=100Gi` -> Resources (ports are a range, not a count, on hosts)."""
    values: dict[str, str] = {}
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if "=" not in part:
            raise InvalidArgument(f"{field}: expected key=value, got {part!r}", field=field)
        k, v = part.split("=", 1)
        k = k.strip()
        if k not in ("cpu", "mem", "disk", "gpu"):
            raise InvalidArgument(f"{field}: unknown resource {k!r} (known: cpu, mem, disk, gpu)", field=field)
        values[k] = v.strip()
    try:
        cpu = float(values.get("cpu", "0"))
        gpu = int(values.get("gpu", "0"))
    except ValueError as e:
        raise InvalidArgument(f"{field}: {e}", field=field) from None
    if cpu < 0 or gpu < 0:
        raise InvalidArgument(f"{field}: resources must not be negative", field=field)
    return Resources(
        cpu=cpu,
        mem=parse_mib(values.get("mem", "0"), f"{field}.mem"),
        disk=parse_mib(values.get("disk", "0"), f"{field}.disk"),
        gpu=gpu,
    )
