"""The interface every cluster backend (local, sim, mesos) implements. The plain data it speaks is
domain/launch.py."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Protocol

from peloton.domain.launch import GangLaunch, HostInfo, LaunchResult, RunningTask, TaskStatus
from peloton.domain.placement import HostOffer


class LaunchError(Exception):
    """A member could not be started; `task_id` names it."""

    def __init__(self, task_id: str, message: str, *, permanent: bool = False) -> None:
        super().__init__(f"{task_id}: {message}")
        self.task_id = task_id
        self.message = message
        self.permanent = permanent


StatusCallback = Callable[[TaskStatus], None]
StatusesCallback = Callable[[Sequence[TaskStatus]], None]  # several at once, in order (one wake for the batch)
HostsCallback = Callable[[Collection[str]], None]


class Backend(Protocol):
    """A cluster backend. Thread-safe; it calls its callbacks from its own threads, never while holding a lock
    of its own, so the callee may call back into it."""

    def start(self, on_status: StatusCallback, on_hosts_changed: HostsCallback,
              on_statuses: StatusesCallback | None = None) -> None:
        """Begin monitoring (and adopt tasks a previous daemon left running). `on_hosts_changed(names)` tells the
        host manager that the free resources of these hosts changed for a reason it cannot see itself (offers
        arriving or rescinded, a host lost or added); launches and status updates need no such call.
        `on_statuses(list)`: several statuses at once (a launch's RUNNING), one hand-over and one wake instead of
        one each; a backend may use it or report one at a time through `on_status`."""

    def stop(self) -> None:
        """Stop monitoring. Running tasks are NOT killed: a restarted daemon adopts them."""

    def maintenance(self) -> dict[str, float]:
        """Hosts the cluster manager scheduled maintenance on (Mesos maintenance windows), and when each window
        starts (Unix seconds). They are drained: no new gangs, and the gangs still there are preempted at that
        time."""

    def lead_again(self) -> None:
        """This daemon holds the store lock again after another daemon held it: act for the cluster again (on
        Mesos, subscribe again after the other one's subscription failed ours over)."""

    def demand(self) -> None:
        """Work waits for hosts (the resource manager holds gangs): a backend that gives the cluster's resources
        back while nothing waits (Mesos: declines its offers and SUPPRESSes them) asks for them again (REVIVE).
        Called under the host manager's lock: in memory only. Not calling it is what "idle" means: `offers` does
        not count as demand (the placement engine syncs hosts every poll, busy or not)."""

    def offers(self, hostnames: Collection[str] | None = None, *, with_ids: bool = False) -> list[HostOffer]:
        """The free resources of these hosts (all when None) as the backend accounts for them now: capacity minus
        every task it runs or has registered. `with_ids` fills the concrete free GPU ids and ports (costly on
        hosts with large port ranges: only for the few hosts being claimed)."""

    def hosts(self) -> list[HostInfo]:
        ...

    def launch(self, gangs: Sequence[GangLaunch]) -> list[LaunchResult]:
        """Start every member of each gang, or none of that gang; one result per gang, in order. Before anything
        is started the backend accounts for all members (so their resources are never free in between); a gang it
        cannot account for is REFUSED, one with a member that will not start is FAILED (the others stopped). A
        member killed before it started is never started. RUNNING is reported for each member once its command
        has started."""

    def kill(self, task_ids: Sequence[str], grace_s: float | None = None) -> None:
        """Ask each task to stop (SIGTERM to its process group, SIGKILL after `grace_s`, or the backend's default
        grace period when None: a preemption gives the job's sla.preemption_grace). A task registered but
        not started yet is never started. Unknown ids are ignored. Each task's end is reported (KILLED)."""

    def reconcile(self, task_ids: Sequence[str]) -> dict[str, TaskStatus]:
        """Current status of each id: RUNNING, a terminal state, or LOST if the backend knows nothing of it."""

    def running(self) -> list[RunningTask]:
        """Every task the backend accounts for (running, or registered and about to start)."""

    def acknowledge(self, acks: Sequence[str]) -> None:
        """The updates carrying these `ack` tokens are persisted; the backend may acknowledge them upstream."""

    def remove_sandboxes(self, job_ids: Collection[str]) -> int:
        """Remove what this machine keeps of these jobs' tasks (their sandboxes: logs and files) once the tasks have
        ended; a task still running is left alone. How many sandboxes went. (A Mesos agent collects its own.)"""

    def read_log(self, task_id: str, stream: str, offset: int, max_bytes: int) -> tuple[bytes, int]:
        """Up to `max_bytes` of the task's stdout or stderr from byte `offset` (negative: that many bytes before the
        end), and the offset just after what was returned. NotFound if the task is unknown."""
