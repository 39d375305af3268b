"""Host manager shell: one backend, the lease book, and the ordered log of task status events that jobmgr
long-polls. Thread-safe."""

from __future__ import annotations

import collections
import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence

from prometheus_client import Counter

from peloton.domain.placement import HostOffer, MemberAssignment
from peloton.hostmgr.backend import Backend, HostInfo, LaunchError, LaunchSpec, TaskStatus
from peloton.hostmgr.leases import LeaseBook

log = logging.getLogger(__name__)

TASK_STATUSES = Counter("peloton_hostmgr_task_status_total", "Task status updates from the backend", ["state"])
LAUNCHES = Counter("peloton_hostmgr_gang_launches_total", "Gang launches", ["result"])

EVENT_LOG_SIZE = 200_000


class HostManager:
    def __init__(self, backend: Backend, clock: Callable[[], float] = time.time) -> None:
        self.backend = backend
        self.clock = clock
        self.stream_id = uuid.uuid4().hex
        self._leases = LeaseBook()
        self._lock = threading.Lock()
        self._events: collections.deque[tuple[int, TaskStatus]] = collections.deque(maxlen=EVENT_LOG_SIZE)
        self._seq = 0
        self._acked_seq = 0
        self._cond = threading.Condition()

    def start(self) -> None:
        self.backend.start(self._on_status)

    def stop(self) -> None:
        self.backend.stop()

    # --- status events ------------------------------------------------------------------------------------
    def _on_status(self, status: TaskStatus) -> None:
        TASK_STATUSES.labels(status.state.value).inc()
        with self._cond:
            self._seq += 1
            self._events.append((self._seq, status))
            self._cond.notify_all()

    def wait_events(self, after_seq: int, max_events: int, timeout_s: float) -> list[tuple[int, TaskStatus]]:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._seq <= after_seq:
                left = deadline - time.monotonic()
                if left <= 0:
                    return []
                self._cond.wait(left)
            out = []
            for seq, st in self._events:
                if seq > after_seq:
                    out.append((seq, st))
                    if len(out) >= max_events:
                        break
            return out

    def ack_events(self, up_to_seq: int) -> int:
        """Acknowledge upstream every update up to `up_to_seq` (they are persisted). Returns how many."""
        with self._cond:
            if up_to_seq <= self._acked_seq:
                return 0
            acks = [st.ack for seq, st in self._events if self._acked_seq < seq <= up_to_seq and st.ack]
            self._acked_seq = up_to_seq
        if acks:
            self.backend.acknowledge(acks)
        return len(acks)

    # --- offers and leases --------------------------------------------------------------------------------
    def acquire_offers(self, lease_s: float) -> tuple[str, list[HostOffer]]:
        free = self.backend.offers()
        with self._lock:
            return self._leases.acquire(free, self.clock(), lease_s)

    def retain(self, lease_id: str, keep: Sequence[MemberAssignment]) -> None:
        with self._lock:
            self._leases.retain(lease_id, keep, self.clock())

    def capacity(self) -> list[HostOffer]:
        return [
            HostOffer(
                hostname=h.hostname,
                address=h.address,
                free=h.capacity,
                gpu_ids=tuple(range(h.capacity.gpu)),
                ports=tuple(range(h.capacity.ports)),
                labels=dict(h.labels),
                capacity=h.capacity,
                has_gpus=h.capacity.gpu > 0,
            )
            for h in self.backend.hosts()
        ]

    def hosts(self) -> list[tuple[HostInfo, bool]]:
        with self._lock:
            self._leases.expire(self.clock())
            held = self._leases.held_hosts()
        return [(h, h.holds_offer or h.hostname in held) for h in self.backend.hosts()]

    # --- launch and kill ----------------------------------------------------------------------------------
    def launch_gang(self, lease_id: str, tasks: Sequence[LaunchSpec]) -> None:
        """All members or none. Raises Conflict (stale lease) or LaunchError (a member could not start)."""
        members = [
            MemberAssignment(t.instance, t.task_id, t.hostname, "", t.resources, t.gpu_ids, t.ports) for t in tasks
        ]
        with self._lock:
            self._leases.consume(lease_id, members, self.clock())
        try:
            self.backend.launch(tasks)
        except LaunchError:
            LAUNCHES.labels("failed").inc()
            raise
        LAUNCHES.labels("ok").inc()

    def kill(self, task_ids: Sequence[str]) -> None:
        if task_ids:
            self.backend.kill(task_ids)

    def reconcile(self, task_ids: Sequence[str], kill_unknown: bool) -> dict[str, TaskStatus]:
        if kill_unknown:
            wanted = set(task_ids)
            strays = sorted(self.backend.running_task_ids() - wanted)
            if strays:
                log.warning("killing %d tasks no job claims: %s", len(strays), ", ".join(strays[:10]))
                self.backend.kill(strays)
        return self.backend.reconcile(task_ids)

    def read_log(self, task_id: str, stream: str, tail_bytes: int) -> bytes:
        return self.backend.read_log(task_id, stream, tail_bytes)
