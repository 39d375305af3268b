"""The thin sleeping half of the retry helper: try a call again after the policy's delays until it succeeds, fails
in a way not worth retrying, or its time budget is spent. The clock, the sleep and the random source are
parameters (tests pass their own); `random` is imported only once a retry happens, as the CLI counts its start-up
in milliseconds."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from peloton.retry.policy import Backoff, Delays

T = TypeVar("T")


def system_random() -> Callable[[], float]:
    import random

    return random.random


def retry_call(fn: Callable[[], T], *, retry_if: Callable[[Exception], bool], backoff: Backoff, budget_s: float,
               on_retry: Callable[[Exception, float], None] | None = None,
               clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
               rand: Callable[[], float] | None = None) -> T:
    """`fn()`, tried again while it raises an error for which `retry_if` is true, for up to `budget_s` seconds
    (on `clock`) from the first try. The last pause is cut to end at the budget, and one last try is made there;
    after it, or on an error `retry_if` refuses, the error is raised. `on_retry(error, pause)` is told of each
    pause before it is taken (to log or print it)."""
    deadline = clock() + budget_s
    delays: Delays | None = None
    while True:
        try:
            return fn()
        except Exception as e:
            left = deadline - clock()
            if not retry_if(e) or left <= 0:
                raise
            if delays is None:
                delays = Delays(backoff, rand or system_random())
            pause = min(delays.next(), left)
            if on_retry is not None:
                on_retry(e, pause)
            sleep(pause)
