"""One retry policy for the whole code base: exponential back-off with jitter.

Two halves, so that a sans-IO core can use the policy without a clock or a sleep:
- `policy` (pure, no time, threading or random import): `Backoff.delay(attempt, rand)` is the wait before try
  `attempt + 1` given one draw of the caller's random source; `Delays` counts the attempts for a caller that
  waits its own way (a condition, a loop's clock).
- `sleeping`: `retry_call(fn, ...)` tries `fn` until it succeeds, raises an error that is not worth retrying, or
  the time budget is spent, sleeping the policy's delays in between.

Jitter spreads the retries of many clients that failed together (a daemon restart) so they do not come back in
step; every policy here has it."""

from peloton.retry.policy import Backoff, Delays

__all__ = ["Backoff", "Delays"]
