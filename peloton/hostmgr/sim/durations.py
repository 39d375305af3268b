"""Pure rules of the sim backend: how long a member runs and how it ends, read from its environment.

No clock, no threads, no I/O: the same (seed, task id, env) always gives the same behaviour, in any process, so a
scale test or benchmark can be repeated exactly.

Environment variables (from the job's `task.env`):
  PELOTON_SIM_DURATION   how long the member runs: `30s`, `1.5` (seconds), `500ms`, `2m`, `1h30m`, or a range
                         `10s-60s` from which each task draws its own duration, deterministically from
                         (seed, task id). Absent or empty: it runs until killed (or its host fails).
  PELOTON_SIM_EXIT_CODE  0..255 (default 0): 0 ends SUCCEEDED, anything else FAILED with that exit code.
  PELOTON_SIM_START      `fail`: the member cannot be started (the launch of its gang FAILS, like a sandbox that
                         cannot be prepared); `fail-permanent`: the same, marked permanent (like a command that can
                         never be executed). Absent, empty or `ok`: it starts.
  PELOTON_SIM_METRICS    what the member reports of its speed, as a real one appends to $PELOTON_METRICS_FILE:
                         `step_time=1.25 local_bsz=8` (peloton/modelaware/metrics.py). The daemon reads it back as
                         the member's metrics file. Absent or empty: it measures nothing.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

from peloton.domain.durations import parse_duration as _parse_duration
from peloton.errors import InvalidArgument

DURATION_VAR = "PELOTON_SIM_DURATION"
EXIT_CODE_VAR = "PELOTON_SIM_EXIT_CODE"
START_VAR = "PELOTON_SIM_START"
METRICS_VAR = "PELOTON_SIM_METRICS"
MAX_METRICS_CHARS = 1024  # a few lines of figures; the daemon reads 4 KiB from the end of a metrics file

_START_VALUES = ("", "ok", "fail", "fail-permanent")


def parse_duration(text: str, field: str = DURATION_VAR) -> float:
    """`30s`, `1.5`, `500ms`, `2m`, `1h30m` -> seconds (a bare number is seconds): the shared parser of
    peloton/domain/durations.py. InvalidArgument naming `field`."""
    return _parse_duration(text, field)


@functools.lru_cache(maxsize=1024)  # every member of a job carries the same text
def parse_duration_range(text: str, field: str = DURATION_VAR) -> tuple[float, float]:
    """A duration (`30s`: lo == hi) or a range `10s-60s` (lo <= hi) in seconds."""
    lo_text, sep, hi_text = text.partition("-")
    lo = parse_duration(lo_text, field)
    if not sep:
        return lo, lo
    hi = parse_duration(hi_text, field)
    if hi < lo:
        raise InvalidArgument(f"{field}: the range {text!r} ends before it starts", field=field)
    return lo, hi


def unit_draw(seed: int, key: str) -> float:
    """A number in [0, 1) that depends only on (seed, key): the first 8 bytes of BLAKE2b of "seed:key". Stable
    across processes and Python versions (unlike hash())."""
    digest = hashlib.blake2b(f"{seed}:{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def draw_duration(seed: int, task_id: str, lo: float, hi: float) -> float:
    """The duration of `task_id` within [lo, hi], the same for the same seed every time."""
    if hi <= lo:
        return lo
    return lo + (hi - lo) * unit_draw(seed, task_id)


@dataclass(frozen=True, slots=True)
class Behaviour:
    """How a simulated member behaves: runs `duration` seconds (None: until killed), then exits `exit_code`."""

    duration: float | None = None
    exit_code: int = 0
    start_fails: bool = False
    permanent: bool = False  # a start failure that another try cannot fix
    metrics: str = ""  # its metrics file's text (PELOTON_SIM_METRICS); "": it measures nothing


def behaviour(env: Mapping[str, str], seed: int, task_id: str) -> Behaviour:
    """The behaviour `env` asks for. InvalidArgument (naming the variable) when a variable cannot be read: the
    backend fails the launch with it, permanently, since the same spec would fail the same way again."""
    start = env.get(START_VAR, "").strip()
    if start not in _START_VALUES:
        raise InvalidArgument(f"{START_VAR}: expected fail or fail-permanent, got {start!r}", field=START_VAR)
    duration: float | None = None
    text = env.get(DURATION_VAR, "").strip()
    if text:
        lo, hi = parse_duration_range(text)
        duration = draw_duration(seed, task_id, lo, hi)
    code_text = env.get(EXIT_CODE_VAR, "").strip() or "0"
    try:
        exit_code = int(code_text)
    except ValueError:
        raise InvalidArgument(f"{EXIT_CODE_VAR}: expected an integer 0..255, got {code_text!r}",
                              field=EXIT_CODE_VAR) from None
    if not 0 <= exit_code <= 255:
        raise InvalidArgument(f"{EXIT_CODE_VAR}: must be 0..255, got {exit_code}", field=EXIT_CODE_VAR)
    metrics = env.get(METRICS_VAR, "").strip()
    if len(metrics) > MAX_METRICS_CHARS or not metrics.isascii() or not metrics.isprintable():
        raise InvalidArgument(f"{METRICS_VAR}: expected one line of at most {MAX_METRICS_CHARS} printable ASCII "
                              "characters, like step_time=1.25 local_bsz=8", field=METRICS_VAR)
    return Behaviour(duration, exit_code, start_fails=start.startswith("fail"), permanent=start == "fail-permanent",
                     metrics=metrics)


def format_duration(seconds: float) -> str:
    """A short human form: `500ms`, `1.5s`, `2m30s`."""
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.3g}s" if seconds != int(seconds) else f"{int(seconds)}s"
    m, s = divmod(seconds, 60)
    return f"{int(m)}m{s:.0f}s" if s >= 0.5 else f"{int(m)}m"
