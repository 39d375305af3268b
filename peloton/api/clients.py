"""The internal services as the components call them: typed Python methods over domain values, raising only the
error hierarchy (peloton/errors.py). Protobuf and grpcio stay behind these interfaces.

Two implementations of each: over gRPC to another process (`api/grpc_clients.py`: converts with convert.py, maps a
failed call to an error by its status code), and in one process straight to the component (`resmgr/inprocess.py`,
`hostmgr/inprocess.py`: no message is built, the same frozen values pass by reference). server.py picks one per
role. This module imports neither grpc nor protobuf, so the components that use it do not either (.importlinter).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from peloton import errors
from peloton.domain.allocation import AdmissionPreview, GangAsk
from peloton.domain.launch import GangLaunch, LaunchResult, TaskStatus
from peloton.domain.model import ResourcePool
from peloton.domain.placement import GangPlacement, GangRequest, HostOffer, PlacementFailure
from peloton.domain.resources import Resources

log = logging.getLogger(__name__)

GangKey = tuple[str, int]  # (gang id, attempt)
Preemption = tuple[GangKey, list[GangKey]]  # a waiting gang and the victims that make room for it
Reserved = tuple[GangKey, list[str], float]  # a waiting gang, the hosts kept for it, its expected start


@dataclass(frozen=True, slots=True)
class Victim:
    """A gang holding resources, as a preemption probe names it: where it holds what, and when it ends at the
    latest (0: no max_runtime)."""

    gang_id: str
    attempt: int
    usage: tuple[tuple[str, Resources], ...]
    ends_at: float = 0.0


@dataclass(frozen=True, slots=True)
class Probe:
    """A waiting gang only preemption can start: its candidate victims (most preferred first), what they must
    free besides hosts, and the placed gangs that end by a max_runtime (earliest first) for a reservation."""

    gang: GangRequest
    need: Resources
    candidates: tuple[Victim, ...]
    ending: tuple[Victim, ...] = ()


@dataclass(frozen=True, slots=True)
class Dequeued:
    """One DequeueGangs answer: admitted gangs to place, orphaned claims to release first, preemption probes, and
    the gangs whose reservations are still live."""

    gangs: list[GangRequest]
    release_claims: list[GangKey]
    probes: list[Probe]
    reserving: list[GangKey]
    placement_order: str = ""  # resmgr's --placement-order ("": not said; the engine's own)
    # resmgr holds no gang (queued, being placed, placed and not launched): the cluster's resources are not
    # wanted (the engine tells the host manager: SyncHosts' idle). False when not said: as if work waited
    idle: bool = False


@dataclass(frozen=True, slots=True)
class Placed:
    """One GetPlacements answer: claimed placements to launch, why some gangs still wait, the gangs to preempt
    (gang id, attempt, reason), and resmgr's incarnation (a new one forgot every gang)."""

    placements: list[GangPlacement]
    pending: list[PlacementFailure]
    preempt: list[tuple[str, int, str]]
    incarnation: str


@dataclass(frozen=True, slots=True)
class HostChanges:
    """SyncHosts: the free state of every host that changed since a version (`full`: of every host)."""

    stream_id: str
    version: int
    full: bool
    offers: list[HostOffer]
    removed: list[str]


@dataclass(frozen=True, slots=True)
class TaskEvents:
    """WaitTaskEvents: (sequence number, status) updates, the stream they belong to, and whether some were lost."""

    events: list[tuple[int, TaskStatus]]
    stream_id: str
    gap: bool


class ResourceManagerClient(Protocol):
    def enqueue(self, gangs: Sequence[GangRequest], running: Sequence[GangRequest],
                remove: Sequence[GangKey] = (), call_id: str = "") -> None:
        """Forget `remove` first (as remove_gangs), then queue `gangs` and register `running` (adopted after a
        restart) as holding their resources: one call for what one batch of side effects sends to resmgr. Applied
        once per non-empty `call_id`: every try of one call carries the same."""

    def dequeue(self, max_gangs: int, timeout_s: float, capacity: Resources | None, engine: str) -> Dequeued:
        """Long poll for admitted gangs (placement engine `engine`; `capacity`: the cluster's total)."""

    def set_placements(self, placements: Sequence[GangPlacement], failures: Sequence[PlacementFailure],
                       stale: Sequence[PlacementFailure], preemptions: Sequence[Preemption],
                       reservations: Sequence[Reserved], engine: str) -> None:
        """A placement round's outcome (`stale`: gangs that go back to their queue at once)."""

    def get_placements(self, max_placements: int, timeout_s: float, consumer: str,
                       ack_done: Sequence[GangKey] = ()) -> Placed:
        """Long poll for claimed placements (launcher `consumer`); first, as ack_placements' `done`, forget
        `ack_done` (their launch intents are durable)."""

    def ack_placements(self, done: Sequence[GangKey], retry: Sequence[GangKey]) -> None:
        """Placements whose launch intent is durable (`done`), and those to queue again (`retry`)."""

    def unknown_gangs(self, gangs: Sequence[GangKey]) -> list[GangKey]:
        """Those of `gangs` resmgr neither queues nor holds an allocation for."""

    def remove_gangs(self, gangs: Sequence[GangKey], call_id: str = "") -> None:
        """Forget these gangs: out of their queue, their allocation released (once per `call_id`, as enqueue)."""

    def held_gangs(self, page_token: str) -> tuple[list[GangKey], str]:
        """A page of the gang attempts resmgr holds in any state or counts an allocation for (the newest of each
        gang, by gang id after `page_token`), and the next page's token ("": the last page). A resmgr of an earlier
        release, which does not serve it, answers with none."""

    def entitled_gpus(self, pool: str, extra_demand: Resources) -> int | None:
        """The whole GPUs `pool` would be entitled to if it also asked for `extra_demand`; None while unknown."""

    def preview_admission(self, pool: str, gangs: Sequence[GangAsk]) -> list[AdmissionPreview]:
        """Whether each gang of a job not yet created would be admitted in `pool` now (a dry run), in order, as if
        the earlier ones were; and how many of the pool's waiting gangs are ahead of it. Nothing changes."""

    def held_pools(self) -> Mapping[str, ResourcePool] | None:
        """The pools as resmgr holds them, by path, when it runs in this process: current with the store as of
        its last pool write (it reads them again after each one it makes, and when its process leads again). None
        from another process (a split deployment): the caller reads the store."""


class HostManagerClient(Protocol):
    def sync_hosts(self, since_version: int, stream_id: str = "", timeout_s: float = 30,
                   idle: bool = False) -> HostChanges:
        """The hosts' free state changed since `since_version` of stream `stream_id` (0: all of it)."""

    def claim(self, placements: Sequence[GangPlacement]) -> tuple[list[GangPlacement], list[PlacementFailure]]:
        """Claim each placement whole: (claimed, with concrete GPUs and ports; refused, stale)."""

    def release_claims(self, gangs: Sequence[GangKey]) -> None:
        """Release the claims of these gangs."""

    def cluster_capacity(self, if_version: int) -> tuple[int, list[HostOffer] | None]:
        """(version, every host's full capacity), or (version, None) when unchanged since `if_version`."""

    def launch(self, gangs: Sequence[GangLaunch]) -> list[LaunchResult]:
        """Start each gang whole. errors.Unreachable: never sent, nothing started; any other error: the outcome is
        unknown."""

    def kill(self, task_ids: Sequence[str], grace_s: float | None = None) -> None:
        """Kill these tasks (after `grace_s` of SIGTERM, where given)."""

    def wait_events(self, after_seq: int, max_events: int, timeout_s: float, ack_up_to_seq: int = 0,
                    ack_stream_id: str = "") -> TaskEvents:
        """Long poll for status updates after `after_seq`; first, as AckTaskEvents, the updates up to
        `ack_up_to_seq` (0: none) are durable, if `ack_stream_id` is still the stream (a restarted host manager's
        new stream ignores it)."""

    def reconcile(self, task_ids: Sequence[str]) -> list[TaskStatus]:
        """What the backend knows of these tasks now."""

    def running_tasks(self, page_token: str) -> tuple[list[str], str]:
        """A page of the ids of the tasks running on the backend, and the next page's token ("": the last)."""

    def read_log(self, task_id: str, stream: str, offset: int, max_bytes: int,
                 timeout_s: float = 30) -> tuple[bytes, int]:
        """(content, offset after it) of a task's stdout, stderr or metrics file."""

    def drains(self) -> dict[str, float]:
        """hostname -> drain deadline (0: none) of every draining host."""

    def remove_sandboxes(self, job_ids: Sequence[str]) -> int:
        """Remove these jobs' sandboxes; how many were removed."""


F = TypeVar("F", bound=Callable[..., object])


def service_errors(fn: F) -> F:
    """An in-process call raises what a remote one would: its own PelotonError as it is, anything else as an
    internal error (logged here, as the servicers do), so callers handle one error hierarchy either way."""

    @functools.wraps(fn)
    def wrapper(*args: object, **kwargs: object) -> object:
        try:
            return fn(*args, **kwargs)
        except errors.PelotonError:
            raise
        except Exception as e:  # noqa: BLE001 - mapped, never lost
            log.exception("internal error in %s", fn.__qualname__)
            raise errors.PelotonError(f"internal error in {fn.__name__}; see the daemon log") from e

    return wrapper  # type: ignore[return-value]
