"""Durations as people write them: `90s`, `5m`, `1h30m`, `2d`, `500ms`, `1.5h`, or a bare number of seconds.

One parser for every duration the project reads from text: the job spec's fields (gang.launch_timeout,
sla.max_runtime, sla.preemption_grace), the sim backend's PELOTON_SIM_DURATION and the CLI's duration flags. Exact:
the text is read as a fraction and converted to whole nanoseconds (a protobuf Duration's resolution), never through
a float. Pure: no clock, no I/O.

Units: `ms`, `s`, `m` (minutes), `h`, `d` (24 hours). Components add up (`1h30m`, `1d12h`) and may have decimals
(`1.5h`); a bare number is seconds (`300`, `0.5`). A `-` in front (signed only) negates the whole.
"""

from __future__ import annotations

import re
from decimal import Decimal
from fractions import Fraction

from peloton.domain import checks
from peloton.errors import InvalidArgument

_NS = {"ms": 1_000_000, "s": 1_000_000_000, "m": 60_000_000_000, "h": 3_600_000_000_000, "d": 86_400_000_000_000}
_NUMBER = r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
_PART = re.compile(rf"\s*({_NUMBER})\s*(ms|s|m|h|d)\s*")
_BARE = re.compile(rf"\s*({_NUMBER})\s*")
_MAX_TEXT = 64  # longer than any sensible duration; keeps Fraction() away from huge digit strings
EXAMPLES = "90s, 5m, 1h30m or 2d"


def _bad(text: str, field: str) -> InvalidArgument:
    return checks.bad(field, f"expected a duration like {EXAMPLES}, got {checks.show(text)}")


def parse_duration_ns(text: str, field: str, *, signed: bool = False) -> int:
    """`text` as whole nanoseconds. InvalidArgument naming `field` for anything else, and for a value finer than a
    nanosecond. `signed`: a leading `-` is allowed (the caller's range check says what is allowed)."""
    if len(text) > _MAX_TEXT:
        raise checks.bad(field, f"expected a duration like {EXAMPLES}, got {len(text)} characters")
    body = text.strip()
    negative = signed and body.startswith("-")
    if negative:
        body = body[1:]
    bare = _BARE.fullmatch(body)
    if bare:
        total = Fraction(bare.group(1)) * _NS["s"]
    else:
        total = Fraction(0)
        pos = 0
        for m in _PART.finditer(body):
            if m.start() != pos:
                raise _bad(text, field)
            total += Fraction(m.group(1)) * _NS[m.group(2)]
            pos = m.end()
        if pos == 0 or pos != len(body):
            raise _bad(text, field)
    if total.denominator != 1:
        raise checks.bad(field, f"finer than a nanosecond: {checks.show(text)}")
    return -int(total) if negative else int(total)


def parse_duration(text: str, field: str) -> float:
    """`text` as seconds (a float, not negative). InvalidArgument naming `field` when it is not a duration."""
    return parse_duration_ns(text, field) / 1_000_000_000


def format_duration(seconds: float) -> str:
    """The shortest exact spelling in the units above: `7d`, `1h30m`, `90.5s`, `0.25s` (what parse_duration reads
    back), for messages."""
    if seconds < 0:
        return "-" + format_duration(-seconds)
    whole = int(seconds)
    if whole != seconds:
        return f"{format(Decimal(repr(seconds)), 'f')}s"  # never an exponent: parse_duration reads it back
    if whole < 60:
        return f"{whole}s"
    out = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        n, whole = divmod(whole, size)
        if n:
            out.append(f"{n}{unit}")
    return "".join(out)
