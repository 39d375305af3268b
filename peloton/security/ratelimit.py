"""Per-principal token buckets for the mutating calls of the public API (`--rate-limit`). Pure: the clock is
passed in. Memory is bounded: at most MAX_KEYS principals are tracked, the least recently seen forgotten first
(a forgotten principal starts again with a full bucket, which only ever errs towards allowing)."""

from __future__ import annotations

from collections import OrderedDict

MAX_KEYS = 10_000


class RateLimiter:
    def __init__(self, rate_per_s: float, burst: float) -> None:
        if rate_per_s <= 0 or burst < 1:
            raise ValueError("rate and burst must be positive")
        self.rate = rate_per_s
        self.burst = burst
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # key -> (tokens, at)

    def allow(self, key: str, now: float) -> float | None:
        """Take one token of `key`'s bucket: None when there was one, else the seconds until there is."""
        tokens, at = self._buckets.pop(key, (self.burst, now))
        tokens = min(self.burst, tokens + max(0.0, now - at) * self.rate)
        wait = None
        if tokens >= 1:
            tokens -= 1
        else:
            wait = (1 - tokens) / self.rate
        self._buckets[key] = (tokens, now)
        while len(self._buckets) > MAX_KEYS:
            self._buckets.popitem(last=False)
        return wait
