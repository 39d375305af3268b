"""The one retry helper: the pure policy (exponential, capped, jittered within a bound, deterministic under a
seeded random source) and the sleeping wrapper (retries only what it is told to, within its budget)."""

from __future__ import annotations

import random

import pytest

from peloton.errors import InvalidArgument, NotFound, Unavailable
from peloton.retry import Backoff, Delays
from peloton.retry.sleeping import retry_call


def test_the_delay_doubles_from_the_first_up_to_the_cap_and_jitter_takes_at_most_its_fraction_off() -> None:
    b = Backoff(0.25, 5.0)
    assert [b.delay(n, 1.0) for n in range(7)] == [0.25, 0.5, 1.0, 2.0, 4.0, 5.0, 5.0]
    assert [b.delay(n, 0.0) for n in range(7)] == [0.125, 0.25, 0.5, 1.0, 2.0, 2.5, 2.5]
    assert b.delay(10**9, 1.0) == 5.0  # no overflow however long it has failed
    assert Backoff(1.0, 10.0, factor=3.0, jitter=0.0).delay(2, 0.3) == 9.0
    assert Backoff(1.0, 1.0, factor=1.0).delay(50, 1.0) == 1.0


def test_a_seeded_random_source_gives_the_same_delays_every_time_spread_within_the_bounds() -> None:
    b = Backoff(1.0, 8.0)
    first = Delays(b, random.Random(42).random)
    again = Delays(b, random.Random(42).random)
    xs = [first.next() for _ in range(50)]
    assert xs == [again.next() for _ in range(50)]
    for n, x in enumerate(xs):
        base = min(8.0, 2.0 ** n)
        assert base / 2 <= x <= base
    capped = xs[10:]
    assert len(set(capped)) == len(capped)  # jittered: the capped delays are not all one value
    assert min(capped) < 5.0 < max(capped)


def test_delays_reset_after_a_success() -> None:
    d = Delays(Backoff(0.1, 1.0, jitter=0.0), random.random)
    assert [d.next(), d.next(), d.next()] == [0.1, 0.2, 0.4]
    d.reset()
    assert d.next() == 0.1


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"first_s": 0.0, "max_s": 1.0}, "first_s"),
    ({"first_s": 2.0, "max_s": 1.0}, "max_s"),
    ({"first_s": 1.0, "max_s": 2.0, "factor": 0.5}, "factor"),
    ({"first_s": 1.0, "max_s": 2.0, "jitter": 1.5}, "jitter"),
])
def test_a_bad_policy_is_refused_naming_the_field(kwargs: dict[str, float], field: str) -> None:
    with pytest.raises(InvalidArgument, match=field) as e:
        Backoff(**kwargs)
    assert e.value.field == field


def test_a_bad_draw_or_attempt_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="rand"):
        Backoff(1.0, 2.0).delay(0, 1.5)
    with pytest.raises(InvalidArgument, match="attempt"):
        Backoff(1.0, 2.0).delay(-1, 0.5)


class FakeTime:
    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.now += s


def test_retry_call_retries_what_it_is_told_until_it_succeeds() -> None:
    t = FakeTime()
    fails = [Unavailable("away"), Unavailable("away")]
    told: list[tuple[str, float]] = []

    def fn() -> str:
        if fails:
            raise fails.pop(0)
        return "ok"

    got = retry_call(fn, retry_if=lambda e: isinstance(e, Unavailable), backoff=Backoff(1.0, 4.0), budget_s=30.0,
                     on_retry=lambda e, p: told.append((str(e), p)), clock=t.clock, sleep=t.sleep,
                     rand=lambda: 1.0)
    assert got == "ok" and t.sleeps == [1.0, 2.0] and told == [("away", 1.0), ("away", 2.0)]


def test_retry_call_raises_at_once_an_error_not_worth_retrying() -> None:
    t = FakeTime()
    calls = 0

    def fn() -> None:
        nonlocal calls
        calls += 1
        raise NotFound("no such job")

    with pytest.raises(NotFound):
        retry_call(fn, retry_if=lambda e: isinstance(e, Unavailable), backoff=Backoff(1.0, 4.0), budget_s=30.0,
                   clock=t.clock, sleep=t.sleep)
    assert calls == 1 and t.sleeps == []


def test_retry_call_cuts_its_last_pause_to_the_budget_tries_once_more_there_then_gives_up() -> None:
    t = FakeTime()
    tries: list[float] = []

    def fn() -> None:
        tries.append(t.now)
        raise Unavailable("away")

    with pytest.raises(Unavailable):
        retry_call(fn, retry_if=lambda e: True, backoff=Backoff(1.0, 4.0), budget_s=10.0, clock=t.clock,
                   sleep=t.sleep, rand=lambda: 1.0)
    assert t.sleeps == [1.0, 2.0, 4.0, 3.0]  # 1 + 2 + 4, then the 3 s left
    assert tries[-1] == pytest.approx(110.0) and len(tries) == 5
