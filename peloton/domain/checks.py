"""Field checks shared by the validators: each raises InvalidArgument whose message starts with the field path
and whose `field` is that path. Messages never echo more than a short, escaped excerpt of what was sent: a
gRPC status message travels in a header, and a long one is dropped on the way (the caller would see
RESOURCE_EXHAUSTED instead of the error)."""

from __future__ import annotations

import math

from peloton.domain import limits
from peloton.errors import InvalidArgument

SHOW_CHARS = 64


def bad(field: str, why: str) -> InvalidArgument:
    return InvalidArgument(f"{field}: {why}", field=field)


def show(value: object, limit: int = SHOW_CHARS) -> str:
    """`value` for an error message: ASCII, escaped (no newline, no NUL), cut to about `limit` characters."""
    text = ascii(value)
    return text if len(text) <= limit else text[:limit] + "..."


def key(name: str, limit: int = SHOW_CHARS) -> str:
    """A map key as it appears in a field path (`task.env.NAME`): as is when printable, else escaped; cut."""
    if not name:
        return '""'
    shown = name if name.isprintable() and name.isascii() else name.encode("unicode_escape").decode("ascii")
    return shown if len(shown) <= limit else shown[:limit] + "..."


def text(value: str, field: str, *, max_chars: int | None = None, max_bytes: int | None = None) -> int:
    """No NUL, encodable as UTF-8, within the limits. Returns the UTF-8 length in bytes."""
    if "\x00" in value:
        raise bad(field, "must not contain a NUL character")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise bad(field, "is not valid UTF-8 text (lone surrogate)") from None
    if max_chars is not None and len(value) > max_chars:
        raise bad(field, f"longer than {max_chars} characters ({len(value)})")
    if max_bytes is not None and size > max_bytes:
        raise bad(field, f"longer than {max_bytes} bytes in UTF-8 ({size})")
    return size


def number(value: float, field: str, *, minimum: float, maximum: float, granularity: float = 0.0,
           unit: str = "") -> None:
    """Finite, minimum <= value <= maximum, and 0 or at least `granularity` (no denormal or tiny positives)."""
    suffix = f" {unit}" if unit else ""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise bad(field, f"must be a number, got {show(value)}")
    if not math.isfinite(value):
        raise bad(field, f"must be a finite number, got {value}")
    if value < minimum:
        raise bad(field, "must not be negative" if minimum == 0 else f"must be at least {minimum:g}{suffix}, got {value:g}")
    if 0 < value < granularity:
        raise bad(field, f"must be 0 or at least {granularity:g}{suffix}, got {value:g}")
    if value > maximum:
        raise bad(field, f"at most {maximum:g}{suffix}, got {value:g}")


def integer(value: int, field: str, *, minimum: int, maximum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad(field, f"must be an integer, got {show(value)}")
    if value < minimum:
        raise bad(field, "must not be negative" if minimum == 0 else f"must be at least {minimum}, got {value}")
    if value > maximum:
        raise bad(field, f"at most {maximum}, got {value}")


def duration_seconds(seconds: int, nanos: int, field: str) -> float:
    """A protobuf Duration's (seconds, nanos) as float seconds, checked first so nothing can overflow: seconds
    within the Duration range, |nanos| < 1e9 with the sign of seconds. Exact: the nearest float to the value."""
    bound = limits.PROTO_DURATION_MAX_SECONDS
    if not -bound <= seconds <= bound:
        raise bad(field, f"seconds must be within -{bound}..{bound}, got {show(seconds)}")
    if not -limits.PROTO_DURATION_MAX_NANOS <= nanos <= limits.PROTO_DURATION_MAX_NANOS:
        raise bad(field, f"nanos must be within -999999999..999999999, got {nanos}")
    if (seconds > 0 and nanos < 0) or (seconds < 0 and nanos > 0):
        raise bad(field, f"seconds ({seconds}) and nanos ({nanos}) must have the same sign")
    return (seconds * 1_000_000_000 + nanos) / 1_000_000_000  # int / int: correctly rounded
