"""Per-principal token buckets (the clock passed in)."""

from __future__ import annotations

import pytest

from peloton.security import ratelimit
from peloton.security.ratelimit import RateLimiter


def test_a_burst_then_the_rate() -> None:
    r = RateLimiter(rate_per_s=2, burst=4)
    assert [r.allow("a", 0.0) for _ in range(4)] == [None] * 4
    assert r.allow("a", 0.0) == pytest.approx(0.5)  # one token comes back in 1/rate
    assert r.allow("b", 0.0) is None  # another principal has its own bucket
    assert r.allow("a", 0.5) is None
    assert r.allow("a", 0.5) == pytest.approx(0.5)
    assert [r.allow("a", 100.0) for _ in range(5)].count(None) == 4  # refilled, never beyond the burst


def test_memory_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ratelimit, "MAX_KEYS", 3)
    r = RateLimiter(1, 1)
    for k in "abcd":
        assert r.allow(k, 0.0) is None
    assert len(r._buckets) == 3 and "a" not in r._buckets
    assert r.allow("a", 0.0) is None  # forgotten: a full bucket again (errs towards allowing)


@pytest.mark.parametrize(("rate", "burst"), [(0, 1), (-1, 5), (1, 0.5)])
def test_nonsense_is_refused(rate: float, burst: float) -> None:
    with pytest.raises(ValueError):
        RateLimiter(rate, burst)
