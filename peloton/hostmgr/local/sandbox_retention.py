"""Which ended tasks' sandboxes go: a pure decision over plain data (the clock passed in), applied by the local
backend's `local-sandboxes` loop off the launch path.

A sandbox is kept for the retention after its task ended, and the kept ones are bounded in number and in bytes:
past a bound the oldest go first, those of tasks that succeeded or were stopped before those of tasks that failed
(a failure's logs are what an operator comes back for)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class EndedSandbox:
    name: str  # the task id
    ended_at: float  # as the wrapper recorded it (else the sandbox's last change)
    size: int  # bytes on disk
    failed: bool  # the command exited non-zero: kept longest


def to_remove(ended: Sequence[EndedSandbox], now: float, retention_s: float, max_count: int,
              max_bytes: int) -> list[str]:
    """The names to remove: every one that ended more than `retention_s` ago (0: no age limit), then, while more
    than `max_count` remain or they hold more than `max_bytes` (0: no bound), the first in the order above."""
    gone: list[str] = []
    kept: list[EndedSandbox] = []
    for e in ended:
        if retention_s > 0 and now - e.ended_at > retention_s:
            gone.append(e.name)
        else:
            kept.append(e)
    count, total = len(kept), sum(e.size for e in kept)
    if not (max_count and count > max_count) and not (max_bytes and total > max_bytes):
        return gone
    kept.sort(key=lambda e: (e.failed, e.ended_at, e.name))
    for e in kept:
        if not (max_count and count > max_count) and not (max_bytes and total > max_bytes):
            break
        gone.append(e.name)
        count -= 1
        total -= e.size
    return gone
