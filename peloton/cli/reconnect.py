"""Riding out a daemon restart in the commands that follow something (`job wait`, `job get --watch`,
`task logs -f`): retry with back-off, resume the WatchJobs stream where it broke (the daemon answers a resume it
cannot serve with a snapshot), and give up only when the daemon stayed unreachable for a grace period.

Pure apart from the clock, the sleep and the stream opener, which tests replace."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from peloton.errors import PelotonError
from peloton.retry import Backoff, Delays
from peloton.retry.sleeping import system_random

if TYPE_CHECKING:
    from peloton.api.v1 import job_pb2

GRACE_S = 60.0  # how long the daemon may stay unreachable before a follower gives up (exit 69)
SILENCE_S = 20.0  # the daemon sends a heartbeat every ~5 s: a stream silent this long is dead
BACKOFF = Backoff(0.25, 5.0)  # between a follower's tries: from 0.25 s, doubling, at most 5 s, with jitter
# Codes of a stream that broke or a daemon that went away or is restarting, rather than of a refused request.
RETRY_CODES = frozenset({"UNAVAILABLE", "CANCELLED", "ABORTED", "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED"})


class DaemonUnreachable(PelotonError):
    """The daemon could not be reached (or would not serve) for the whole grace period."""


class WatchTimeout(Exception):  # noqa: N818 - a deadline reached, not a failure
    """The caller's deadline passed."""


def _stderr(line: str) -> None:
    print(f"peloton: {line}", file=sys.stderr, flush=True)


class Reconnect:
    """The retry policy of one follower. Call `ok()` after each success and `failed(why)` after each failure:
    `failed` sleeps before the next attempt (BACKOFF: from 0.25 s, doubling, at most 5 s, with jitter), or raises
    DaemonUnreachable once the daemon has been unreachable for `grace_s` since the last success (`ok`). It never sleeps
    past `deadline` (a monotonic time), so the caller sees its own timeout in time."""

    def __init__(self, address: str, grace_s: float = GRACE_S, deadline: float | None = None,
                 notify: Callable[[str], None] | None = _stderr, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep, rand: Callable[[], float] | None = None) -> None:
        self.address = address
        self.grace_s = grace_s
        self.deadline = deadline
        self.notify = notify
        self.clock = clock
        self.sleep = sleep
        self.rand = rand
        self._delays: Delays | None = None  # made at the first failure: `random` is not imported to start up
        self.down_since: float | None = None
        self.heard: float | None = None  # when the daemon last answered (None: not yet)
        self.failures = 0

    def ok(self) -> None:
        if self.down_since is not None and self.notify:
            self.notify(f"reconnected to the daemon at {self.address}")
        self.down_since = None
        self.heard = self.clock()
        if self._delays is not None:
            self._delays.reset()

    def failed(self, why: str) -> None:
        """`why`: what failed, a sentence that names the daemon's address."""
        now = self.clock()
        self.failures += 1
        if self.down_since is None:
            # the grace counts from the last word heard: a stream found silent (SILENCE_S) was gone that long before
            self.down_since = now if self.heard is None else self.heard
            if self.notify and self.down_since + self.grace_s > now:
                self.notify(f"{why}; retrying for up to {self.grace_s:g}s")
        left = self.down_since + self.grace_s - now
        if left <= 0:
            raise DaemonUnreachable(f"gave up after {self.grace_s:g}s without the peloton daemon at {self.address}: "
                                    f"{why}")
        if self._delays is None:
            self._delays = Delays(BACKOFF, self.rand or system_random())
        pause = min(self._delays.next(), left)
        if self.deadline is not None:
            pause = min(pause, max(0.0, self.deadline - now))
        self.sleep(pause)


class Call(Protocol):
    """What a server-streaming call returns: its responses, and a way to end it."""

    def __iter__(self) -> Iterator[Any]: ...

    def cancel(self) -> bool: ...


class _SilenceGuard:
    """Cancels `call` when no response arrived for `limit` seconds (a connection that died without a word)."""

    def __init__(self, call: Call, limit: float, clock: Callable[[], float]) -> None:
        self.call = call
        self.limit = limit
        self.clock = clock
        self.last = clock()
        self.fired = False
        self._stop = threading.Event()
        threading.Thread(target=self._run, name="watch-silence", daemon=True).start()

    def feed(self) -> None:
        self.last = self.clock()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(min(1.0, self.limit / 4)):
            if self.clock() - self.last > self.limit:
                self.fired = True
                self.call.cancel()
                return


def watch_jobs(open_stream: Callable[[job_pb2.WatchJobsRequest, float | None], Call], job_ids: Iterable[str],
               tasks: bool, reconnect: Reconnect, deadline: float | None = None,
               error: Callable[[Any], Exception] | None = None, silence_s: float | None = SILENCE_S,
               clock: Callable[[], float] = time.monotonic) -> Iterator[job_pb2.WatchJobsResponse]:
    """Every response of a WatchJobs stream on `job_ids` (heartbeats included), across broken streams: each new
    stream resumes after the stream id and revision last received, so the daemon sends what was missed, or a
    snapshot of the jobs when it cannot (it restarted, or the history moved on). A code in RETRY_CODES, a stream
    the daemon ended, or one silent for `silence_s` is retried through `reconnect` (DaemonUnreachable in the end);
    any other error is raised as `error(e)` makes it. WatchTimeout once `deadline` (monotonic) passes."""
    from peloton.api.v1 import job_pb2
    from peloton.cli.transport import RpcError

    ids = list(job_ids)
    stream_id, revision = "", 0
    while True:
        timeout = None
        if deadline is not None:
            timeout = deadline - clock()
            if timeout <= 0:
                raise WatchTimeout
        call = open_stream(job_pb2.WatchJobsRequest(job_ids=ids, tasks=tasks, stream_id=stream_id,
                                                    after_revision=revision), timeout)
        guard = _SilenceGuard(call, silence_s, clock) if silence_s else None
        try:
            for resp in call:
                if guard is not None:
                    guard.feed()
                reconnect.ok()
                if resp.stream_id:
                    stream_id, revision = resp.stream_id, resp.revision
                yield resp
            why = f"the daemon at {reconnect.address} ended the stream"
        except RpcError as e:
            if deadline is not None and clock() >= deadline - 0.01:
                raise WatchTimeout from None
            code = e.code()
            if guard is not None and guard.fired:
                why = f"no word from the daemon at {reconnect.address} for {silence_s:g}s"
            elif code is not None and code.name in RETRY_CODES:
                details = e.details() or code.name
                why = f"the watch stream from the daemon at {reconnect.address} failed ({details})"
            else:
                raise (error(e) if error is not None else e) from None
        finally:
            if guard is not None:
                guard.stop()
            call.cancel()
        reconnect.failed(why)
