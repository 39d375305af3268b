"""The back-off policy as plain arithmetic: the random draw is passed in, so it is deterministic under test and
usable from the sans-IO Mesos protocol core (see the package docstring)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from peloton.errors import InvalidArgument


@dataclass(frozen=True)
class Backoff:
    """Exponential back-off with jitter. The un-jittered delay of attempt n (0-based) is
    `min(max_s, first_s * factor**n)`; jitter takes up to the fraction `jitter` off it at random, so a delay lies
    in [base * (1 - jitter), base]: `max_s` stays a true bound (a caller's deadline or a health check's patience
    can count on it), and the default 0.5 is "equal jitter" (half fixed, half random)."""

    first_s: float
    max_s: float
    factor: float = 2.0
    jitter: float = 0.5

    def __post_init__(self) -> None:
        if not self.first_s > 0:
            raise InvalidArgument(f"first_s must be > 0, got {self.first_s}", field="first_s")
        if not self.max_s >= self.first_s:
            raise InvalidArgument(f"max_s ({self.max_s}) must be >= first_s ({self.first_s})", field="max_s")
        if not self.factor >= 1:
            raise InvalidArgument(f"factor must be >= 1, got {self.factor}", field="factor")
        if not 0 <= self.jitter <= 1:
            raise InvalidArgument(f"jitter must be in [0, 1], got {self.jitter}", field="jitter")

    def base(self, attempt: int) -> float:
        """The delay of `attempt` before jitter."""
        if attempt < 0:
            raise InvalidArgument(f"attempt must be >= 0, got {attempt}", field="attempt")
        if self.factor == 1:
            return self.first_s
        # past the cap the power only grows: stop computing it there (and never overflow a float)
        n = 0
        d = self.first_s
        while n < attempt and d < self.max_s:
            d *= self.factor
            n += 1
        return min(d, self.max_s)

    def delay(self, attempt: int, rand: float) -> float:
        """The wait after failed try number `attempt` (0: the first failure). `rand`: one draw in [0, 1) of the
        caller's random source; 1.0 gives the un-jittered delay (tests)."""
        if not 0 <= rand <= 1:
            raise InvalidArgument(f"rand must be in [0, 1], got {rand}", field="rand")
        return self.base(attempt) * (1 - self.jitter * (1 - rand))


class Delays:
    """The delays of one retrying caller: `next()` after each failure, `reset()` after a success. For a caller
    that waits its own way (a condition it can be woken from, a loop's clock); others use `sleeping.retry_call`.
    Not thread-safe: one per caller thread."""

    def __init__(self, policy: Backoff, rand: Callable[[], float]) -> None:
        self.policy = policy
        self.rand = rand
        self.attempt = 0

    def next(self) -> float:
        d = self.policy.delay(self.attempt, self.rand())
        self.attempt += 1
        return d

    def reset(self) -> None:
        self.attempt = 0
