"""The side effects of committed changes, sent on their own thread in commit order: kills to the host manager;
releases, enqueues and adoptions to resmgr. Everything that arrived since the last send goes in one call per
kind (in bounded chunks), and the releases' last chunk rides with the first chunk of enqueues (EnqueueGangs
forgets its `remove` first): one round trip to resmgr where a batch has both, in the same order as two. Across
batches sent together, a release would overtake an enqueue of its gang from an earlier batch (a job created and
stopped while a send was on its way): the release takes that enqueue back instead (Outbox.merge). A call
that fails is retried with back-off until it goes through: a lost enqueue would leave a gang waiting for the periodic
check, a lost release would keep its allocation. Kills are idempotent. A call to resmgr is tried again as it was,
with the id of its first try, and resmgr applies it once: a call that went through and whose answer was lost,
applied again after its gangs were placed and launched, would release what they hold and queue them again.

A call resmgr refuses for good (`refused_for_good`: the request itself is at fault, a bug or a version skew; sent
again unchanged it would be refused again, for ever, and every later release and enqueue would wait behind it) is
not tried again: it was not applied (resmgr checks a request before it applies it, and a try again of a call
already applied is answered by its id before any check), so it is split in halves, each a new call with a new id,
sent in order, and a half refused again is split again, down to the one release or gang it refuses. That one is
dropped, counted (`peloton_jobmgr_side_effects_refused_total{kind}`) and logged; a refused enqueue or adoption is
handed back to the job manager (`take_refused`), which fails the gang's job saying why (gang_policy.refused_by_resmgr):
never tried unchanged again, and the queue check finds it no more. The rest of the call goes through. Kills (and
preemptions) the host manager refuses for good are split the same way (`_send_kills`), the task it refuses dropped,
counted (kind `kill` or `preempt`) and logged: else every later kill, release and enqueue would wait behind them."""

from __future__ import annotations

import logging
import random
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client import Counter, Gauge

from peloton.api.clients import HostManagerClient, ResourceManagerClient
from peloton.domain.placement import GangRequest
from peloton.errors import InvalidArgument, PelotonError, ResourceExhausted
from peloton.loop import LOOP_ERRORS
from peloton.retry import Backoff, Delays

log = logging.getLogger(__name__)

PENDING = Gauge("peloton_jobmgr_pending_side_effects", "Kills, releases and enqueues not yet sent")
REFUSED = Counter("peloton_jobmgr_side_effects_refused_total",
                  "Kills and preemptions the host manager, releases, enqueues and adoptions resmgr refused for good "
                  "(dropped; an enqueue's or adoption's gang's job fails)", ["kind"])
MAX_REFUSAL_MESSAGE = 500  # characters of resmgr's message kept in a refused gang's reason
CHUNK = 1000
SEND_BACKOFF = Backoff(0.05, 5.0)  # a failed send is tried again after 0.05 s, doubling, at most 5 s


@dataclass(slots=True)
class Outbox:
    kill: list[str] = field(default_factory=list)
    preempt: list[tuple[str, float]] = field(default_factory=list)  # (task id, grace seconds): a gentler kill
    release: list[tuple[str, int]] = field(default_factory=list)
    enqueue: list[tuple[GangRequest, bool]] = field(default_factory=list)  # (gang, running: an adoption)

    def __len__(self) -> int:
        return len(self.kill) + len(self.preempt) + len(self.release) + len(self.enqueue)

    def merge(self, o: Outbox, keep: int = 0) -> None:
        """Append `o`, a later batch. A call sends its releases before its enqueues, so a release of `o` would
        overtake an enqueue of the same gang attempt (or an older one) waiting here: that enqueue is taken back
        instead (sent in their order, the release would undo it). Not the first `keep` enqueues: a call tried
        already carries them, and its try again must be the same call (its release follows in the next)."""
        if o.release and len(self.enqueue) > keep:
            released: dict[str, int] = {}
            for gid, attempt in o.release:
                released[gid] = max(attempt, released.get(gid, attempt))
            self.enqueue[keep:] = [e for e in self.enqueue[keep:]
                                   if e[0].gang_id not in released or e[0].attempt > released[e[0].gang_id]]
        self.kill += o.kill
        self.preempt += o.preempt
        self.release += o.release
        self.enqueue += o.enqueue


@dataclass(frozen=True, slots=True)
class Refusal:
    """A gang attempt whose enqueue (or, `running`, its adoption) resmgr refused for good, and what it said."""

    gang_id: str
    attempt: int
    running: bool
    message: str


def refused_for_good(e: Exception) -> bool:
    """resmgr refused the request itself, so the same call would be refused again, and applied none of it:
    INVALID_ARGUMENT (OUT_OF_RANGE too: errors.OutOfRange is one), a request it cannot take or a client could not
    encode; RESOURCE_EXHAUSTED, which the internal services never answer themselves (they have no rate limit), is
    gRPC's bound on a message's size, the sender's or the receiver's. Everything else is worth another try:
    UNAVAILABLE and DEADLINE_EXCEEDED (down, not the leader, slow), UNAUTHENTICATED (the shared secret, which every
    call carries: no gang's fault), INTERNAL, UNIMPLEMENTED (an upgrade under way), and what is not the project's."""
    return isinstance(e, (InvalidArgument, ResourceExhausted))


class SideEffects:
    def __init__(self, resmgr: ResourceManagerClient, hostmgr: HostManagerClient, on_error: Callable[[], None] | None = None):
        self.resmgr = resmgr
        self.hostmgr = hostmgr
        self._on_error = on_error
        self._cond = threading.Condition()
        self._pending = Outbox()
        self._keep = 0  # the first enqueues of _pending that a call tried already carries (Outbox.merge)
        self._stop = False
        self._busy = False
        self._submitted = 0  # submits so far (each a batch's outbox)
        self._sent = 0  # of those, how many went through
        # the resmgr call being tried (sender thread only): its id and how many of the outbox's first releases and
        # enqueues it carries (a retry's outbox starts with them: what arrived meanwhile is appended)
        self._call: tuple[str, int, int] | None = None
        # after a refusal for good (sender thread only): how many releases and enqueues, from the outbox's first, the
        # next calls take, one size a call: the halves of the refused call, then their halves... (a bisection)
        self._sizes: list[int] = []
        self._refused: list[Refusal] = []  # enqueues and adoptions refused for good, for take_refused
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="jobmgr-side-effects", daemon=True)
        self._thread.start()

    def stop(self, grace_s: float = 0.0) -> None:
        """End the sender, after up to `grace_s` for what is pending to go out (a graceful stop: else a kill or a
        release not yet sent waits for the next leader's recovery and queue check)."""
        if grace_s > 0 and self._thread is not None and not self.drain(grace_s):
            log.warning("stopping with %d side effects not sent (the next start's recovery derives them again)",
                        len(self._pending))
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(5)

    def submit(self, out: Outbox) -> None:
        if not len(out):
            return
        with self._cond:
            self._pending.merge(out, self._keep)
            self._submitted += 1
            PENDING.set(len(self._pending))
            self._cond.notify()

    def mark(self) -> int:
        """A point in the stream of submits, for `wait_sent`."""
        with self._cond:
            return self._submitted

    def wait_sent(self, mark: int, timeout: float) -> bool:
        """Wait until everything submitted up to `mark` was sent; False when it was not within `timeout` (sends
        failing, or stopping). What the cache shows was submitted by then: a check that asks resmgr about it asks
        after its enqueue went, not while it is on its way."""
        with self._cond:
            return self._cond.wait_for(lambda: self._sent >= mark or self._stop, timeout) and self._sent >= mark

    def drain(self, timeout: float) -> bool:
        """Wait until everything submitted so far was sent (tests, shutdown)."""
        with self._cond:
            return self._cond.wait_for(lambda: not len(self._pending) and not self._busy, timeout)

    def take_refused(self) -> list[Refusal]:
        """The gang attempts resmgr refused to queue (or to adopt) for good since the last take: each gang's job is
        to fail (the job manager's reconciler takes them)."""
        with self._cond:
            out, self._refused = self._refused, []
            return out

    def _run(self) -> None:
        delays = Delays(SEND_BACKOFF, random.random)
        while True:
            with self._cond:
                while not len(self._pending) and not self._stop:
                    self._cond.wait()
                if self._stop:
                    return
                out, self._pending, self._keep = self._pending, Outbox(), 0
                upto = self._submitted
                self._busy = True
            try:
                self._send(out)
                delays.reset()
            except Exception as e:  # noqa: BLE001 - the thread must live on: nothing else sends side effects
                pause = delays.next()
                if isinstance(e, PelotonError):
                    log.warning("side effects not sent yet (retrying in %.1fs): %s", pause, e.message)
                else:  # (a bug, or a client library's surprise: logged whole and counted, and tried again)
                    LOOP_ERRORS.labels("jobmgr-side-effects").inc()
                    log.exception("side effects not sent yet (retrying in %.1fs)", pause)
                with self._cond:
                    self._keep = self._call[2] if self._call is not None else 0
                    out.merge(self._pending, self._keep)
                    self._pending = out
                if self._on_error is not None:
                    self._on_error()
                with self._cond:
                    self._busy = False
                    self._cond.wait(pause)
                continue
            with self._cond:
                self._busy = False
                self._sent = upto
                PENDING.set(len(self._pending))
                self._cond.notify_all()

    def _send(self, out: Outbox) -> None:
        """Each part is removed from `out` once sent, so a retry sends only what is left."""
        self._send_kills(out.kill, None, "kill")
        while out.preempt:
            grace = out.preempt[0][1]
            batch = [tid for tid, g in out.preempt if g == grace]
            todo = set(batch)
            try:
                self._send_kills(batch, grace, "preempt")
            finally:  # what went (or was refused for good) is not sent again, with this grace or another
                gone = todo.difference(batch)
                out.preempt = [x for x in out.preempt if x[0] not in gone]
        while out.release or out.enqueue:
            if self._call is None:
                release, chunk = resmgr_call(out.release, out.enqueue, CHUNK, self._sizes[0] if self._sizes else None)
                self._call = (uuid.uuid4().hex, len(release), len(chunk))
            call_id, n_release, n_enqueue = self._call
            release, chunk = out.release[:n_release], out.enqueue[:n_enqueue]
            try:
                if chunk:
                    self.resmgr.enqueue([g for g, running in chunk if not running],
                                        [g for g, running in chunk if running], remove=release, call_id=call_id)
                else:
                    self.resmgr.remove_gangs(release, call_id=call_id)
            except PelotonError as e:
                if not refused_for_good(e):
                    raise
                self._call = None
                self._refused_call(out, n_release, n_enqueue, e)
                continue
            self._call = None
            del out.release[:len(release)]
            del out.enqueue[:len(chunk)]
            if self._sizes:
                self._sizes.pop(0)

    def _send_kills(self, ids: list[str], grace: float | None, kind: str) -> None:
        """Kill `ids` (with `grace`), in calls of at most CHUNK, each removed from `ids` once sent. Kills carry no
        call id: they are idempotent, and the host manager refuses a request for good before it kills any of it (a
        client that cannot encode it, a message over gRPC's bound; a try again of a part already killed does no
        harm). A call refused for good is split in halves, each sent in turn, down to the one task it refuses,
        which is dropped, counted and logged: tried again unchanged it would be refused for ever, and every later
        kill, release and enqueue would wait behind it."""
        sizes: list[int] = []  # the next calls' sizes after a refusal: its halves, their halves...
        while ids:
            n = sizes.pop(0) if sizes else min(CHUNK, len(ids))
            part = ids[:n]
            try:
                self.hostmgr.kill(part, grace)
            except PelotonError as e:
                if not refused_for_good(e):
                    raise
                if n > 1:
                    log.warning("the host manager refused a call of %d kills for good (%s): sending it in halves, to "
                                "find what it refuses", n, e.message)
                    sizes[:0] = [(n + 1) // 2, n // 2]
                    continue
                REFUSED.labels(kind).inc()
                log.error("the host manager refused to %s task %s for good: dropped (%s)", kind, part[0], e.message,
                          extra={"task_id": part[0]})
            del ids[:n]

    def _refused_call(self, out: Outbox, n_release: int, n_enqueue: int, e: PelotonError) -> None:
        """resmgr refused the call of `out`'s first `n_release` releases and `n_enqueue` enqueues for good (it
        applied none of them): its halves go next, each a call of its own; the one it refuses alone is dropped (and
        reported)."""
        if self._sizes:
            self._sizes.pop(0)  # (the refused call's own size)
        n = n_release + n_enqueue
        if n > 1:
            log.warning("resmgr refused a call of %d releases and enqueues for good (%s): sending it in halves, to "
                        "find what it refuses", n, e.message)
            self._sizes[:0] = [(n + 1) // 2, n // 2]
            return
        if n_release:
            gid, attempt = out.release.pop(0)
            REFUSED.labels("release").inc()
            log.error("resmgr refused the release of gang %s attempt %d for good: dropped (%s)", gid, attempt,
                      e.message, extra={"gang_id": gid})
            return
        g, running = out.enqueue.pop(0)
        REFUSED.labels("adoption" if running else "enqueue").inc()
        log.error("resmgr refused %s gang %s attempt %d for good: its job fails (%s)",
                  "to adopt running" if running else "to queue", g.gang_id, g.attempt, e.message,
                  extra={"job_id": g.job_id, "gang_id": g.gang_id})
        with self._cond:
            self._refused.append(Refusal(g.gang_id, g.attempt, running, e.message[:MAX_REFUSAL_MESSAGE]))


def resmgr_call(release: list[tuple[str, int]], enqueue: list[tuple[GangRequest, bool]], chunk: int,
                most: int | None = None) -> tuple[list[tuple[str, int]], list[tuple[GangRequest, bool]]]:
    """The next call to resmgr of a batch's releases and enqueues, in their order (every release before any
    enqueue): (releases, enqueues), at most `chunk` of each and `most` in all. The enqueues start only with the
    releases' last chunk, which they join: one call where the batch has both and each fits a chunk."""
    first = release[:chunk if most is None else min(chunk, most)]
    if len(first) < len(release):
        return first, []
    return first, enqueue[:chunk if most is None else min(chunk, most - len(first))]
