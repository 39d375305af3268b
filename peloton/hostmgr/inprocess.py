"""The host manager as a component of this process calls it (api/clients.py's HostManagerClient): straight to the
HostManager, with the values the caller holds; no message is built. The servicer (service.py) serves the same calls
over gRPC to the other processes of a split deployment, with the same bounds on what a caller asks."""

from __future__ import annotations

from collections.abc import Sequence

from peloton.api.clients import GangKey, HostChanges, TaskEvents, service_errors
from peloton.domain.launch import GangLaunch, LaunchResult, TaskStatus
from peloton.domain.placement import GangPlacement, HostOffer, PlacementFailure
from peloton.hostmgr.manager import HostManager

MAX_LOG_BYTES = 4 * 1024 * 1024  # one ReadTaskLog answer, at most
MAX_WAIT_S = 30.0  # a long poll's wait, at most


class InProcessHostManager:
    def __init__(self, hm: HostManager) -> None:
        self.hm = hm

    @service_errors
    def sync_hosts(self, since_version: int, stream_id: str = "", timeout_s: float = 30,
                   idle: bool = False) -> HostChanges:
        r = self.hm.sync(since_version, stream_id, idle=idle)
        return HostChanges(r.stream_id, r.version, r.full, r.offers, r.removed)

    @service_errors
    def claim(self, placements: Sequence[GangPlacement]) -> tuple[list[GangPlacement], list[PlacementFailure]]:
        return self.hm.claim(placements)

    @service_errors
    def release_claims(self, gangs: Sequence[GangKey]) -> None:
        self.hm.release_claims(gangs)

    @service_errors
    def cluster_capacity(self, if_version: int) -> tuple[int, list[HostOffer] | None]:
        return self.hm.capacity(if_version)

    @service_errors
    def launch(self, gangs: Sequence[GangLaunch]) -> list[LaunchResult]:
        return self.hm.launch(gangs)

    @service_errors
    def kill(self, task_ids: Sequence[str], grace_s: float | None = None) -> None:
        self.hm.kill(list(task_ids), grace_s or None)

    @service_errors
    def wait_events(self, after_seq: int, max_events: int, timeout_s: float, ack_up_to_seq: int = 0,
                    ack_stream_id: str = "") -> TaskEvents:
        if ack_up_to_seq > 0 and ack_stream_id == self.hm.stream_id:
            self.hm.ack_events(ack_up_to_seq)
        events, gap = self.hm.wait_events(after_seq, max_events or 1000, min(max(timeout_s, 0.0), MAX_WAIT_S))
        return TaskEvents(events, self.hm.stream_id, gap)

    @service_errors
    def reconcile(self, task_ids: Sequence[str]) -> list[TaskStatus]:
        return list(self.hm.reconcile(list(task_ids)).values())

    @service_errors
    def running_tasks(self, page_token: str) -> tuple[list[str], str]:
        return [t for t in self.hm.running_task_ids() if t > page_token], ""  # one page: no message to bound

    @service_errors
    def read_log(self, task_id: str, stream: str, offset: int, max_bytes: int,
                 timeout_s: float = 30) -> tuple[bytes, int]:
        size = max_bytes if 0 < max_bytes <= MAX_LOG_BYTES else MAX_LOG_BYTES
        return self.hm.read_log(task_id, stream or "stdout", offset, size)

    @service_errors
    def drains(self) -> dict[str, float]:
        return self.hm.drains()

    @service_errors
    def remove_sandboxes(self, job_ids: Sequence[str]) -> int:
        return self.hm.remove_sandboxes(list(job_ids))
