"""The local backend: runs every task as processes on this machine, split into one or more simulated hosts.

Files under `data_dir`:
  sandboxes/<task_id>/   one per task: stdout, stderr, pids (the wrapper's pid), exit (the command's exit status),
                         the files of the launch (hostfile), and work/ (the command's cwd)
  journal                what was started and how it ended (see journal.py); a restarted daemon replays it and
                         adopts the tasks still running

A task's environment is the allow-listed part of the daemon's (task_env.py: PATH, HOME, LANG, ... and
`--task-env-allow`) plus spec.env, CUDA_VISIBLE_DEVICES (its GPU ids; empty when it has none),
PELOTON_SANDBOX, and PELOTON_HOSTFILE when the launch carries a "hostfile"; its cwd is <sandbox>/work. The task runs
under a small `/bin/sh` wrapper started in a new session by a spawner process (spawner.py, spawn.py), so the
wrapper leads the task's process group and survives the daemon being killed; the daemon watches it through a
pidfd (monitor.py) and reads how it ended from its sandbox (wrapper.py).

A task is everything it started, not just its process group: where this process can make cgroup v2 cgroups
(`task_cgroups="auto"`), each task runs in one of its own (cgroups.py), recorded in the journal; a stop SIGTERMs
every process in it and, after the grace, kills the cgroup; when the wrapper ends the cgroup is killed and removed
once empty (its cgroup.events, watched by the monitor), and at start the cgroups of tasks not adopted are. Elsewhere
(`off`, no cgroup v2, not root) the wrapper is a child subreaper and a stop signals the tree below it
(descendants.py).

Concurrency: `_lock` guards the in-memory book (hosts' usage, tasks) only. Spawning, sandbox files, journal writes
and signals to finished groups happen outside it; status callbacks are made with no lock held. A launch registers
every member of a gang in the book first (so its resources are never free in between), makes the journal durable
once for the whole batch, then has the spawners start the members of every gang of the batch in parallel, and
hands the batch's RUNNING statuses over at once (one wake of the host manager), an end seen meanwhile after them.
The monitor hands over the exits one poll found the same way: one journal append, one report.

Users: a task runs as its spec's `user`, else as the backend's default user (`nobody` when the daemon runs as root,
the daemon's own user otherwise). A root daemon gives the sandbox to that user and keeps the directories above it
traversable (files.py); it reads the sandbox's files without following links (wrapper.open_task_file).
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import select
import shutil
import signal
import socket
import stat
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from prometheus_client import Counter

from peloton.domain.hostgroups import HostGroup
from peloton.domain.launch import GangLaunch, HostInfo, LaunchOutcome, LaunchResult, LaunchSpec, RunningTask, TaskStatus
from peloton.domain.placement import HostOffer
from peloton.domain.resources import Resources
from peloton.domain.states import TaskState
from peloton.errors import FailedPrecondition, InvalidArgument, NotFound
from peloton.files import private_dir, tasks_run_as_others
from peloton.hostmgr.backend import HostsCallback, StatusCallback, StatusesCallback
from peloton.hostmgr.local import cgroups, descendants, gpus, logrotate, sockets, wrapper
from peloton.hostmgr.local.journal import Journal, Record
from peloton.hostmgr.local.monitor import ProcessMonitor
from peloton.hostmgr.local.sandbox_retention import EndedSandbox, to_remove
from peloton.hostmgr.local.spawn import NotStarted, SpawnerDied, SpawnerPool, Started, Unknown
from peloton.hostmgr.local.task_env import inherited
from peloton.hostmgr.usage import HostConfig, HostUsage, accounted, check_gang, offers_of
from peloton.loop import LOOP_ERRORS, SYSTEM_CLOCK, Clock, Loop, progress
from peloton.modelaware import hostlabels, metrics
from peloton.retry import Backoff
from peloton.security.unix_accounts import unvetted_system_account

log = logging.getLogger(__name__)

LOCAL_ADDRESS = "127.0.0.1"
JOURNAL_FILE = "journal"
OLD_INDEX_FILE = "local-running.json"  # the index of releases before the journal: read once, then removed
SANDBOXES_DIR = "sandboxes"
DEFAULT_ROOT_TASK_USER = "nobody"  # who runs a task that names no user when the daemon runs as root
_FINISHED_CACHE = 10_000
_STREAMS = ("stdout", "stderr")
DEFAULT_LOG_MAX_BYTES = 100 << 20  # a stream's current file; with DEFAULT_LOG_KEEP rotated ones, 300 MiB a stream
DEFAULT_LOG_KEEP = 2
LOG_CHECK_S = 10.0
LOG_READ_TRIES = 3  # a log read overlapped by rotations this many times in a row returns its last try
TAKEN_PORT_HOLD_S = 60.0  # a port found held by another socket is not offered for this long (TCP's TIME_WAIT)
LOG_ROTATION_WAIT_S = 10.0  # a read waits at most this long for a rotation of its log to end
DEFAULT_SANDBOX_RETENTION_S = 7 * 86400.0
# ...and at most this many ended tasks' sandboxes, holding at most this many bytes, are kept (the oldest go first,
# failed tasks' last): a busy daemon ends thousands of tasks an hour, which 7 days alone would all keep
DEFAULT_SANDBOX_MAX_COUNT = 1000
DEFAULT_SANDBOX_MAX_BYTES = 10 << 30
SANDBOX_SWEEP_S = 600.0  # how often ended tasks' sandboxes are looked at for --sandbox-retention
LOGS_ROTATED = Counter("peloton_local_task_logs_rotated_total", "Task stdout/stderr files rotated past the cap")
SANDBOXES_EXPIRED = Counter("peloton_local_sandboxes_expired_total",
                            "Sandboxes of ended tasks removed after --sandbox-retention")
MEMBER_STARTS = Counter("peloton_local_member_starts_total",
                        "Members started, by how: handed a warm wrapper, or their wrapper spawned (cold)", ["how"])
_STARTED_WARM, _STARTED_COLD = MEMBER_STARTS.labels(how="warm"), MEMBER_STARTS.labels(how="cold")
_RESERVED_FILES = frozenset({wrapper.PIDS_FILE, wrapper.EXIT_FILE, wrapper.STDOUT_FILE, wrapper.STDERR_FILE,
                             wrapper.WORK_DIR})
DEFAULT_WARM_WRAPPERS = 8  # a spawner's warm wrappers per user: an 8-member launch asks it for 2, 32 for 8
PID_WAIT_S = 2.0  # at adoption, how long to wait for a just-spawned wrapper to write its pid
TERM_AGAIN_S = 0.2  # a kill's SIGTERM is sent again after this long (see kill)
TERM_SOON_S = 0.02  # and after this long: a kill right after a launch meets wrappers just let go (spawner.py)
_TERM_AGAIN = "\0term"  # timer key suffix (task ids never contain NUL)
_CGROUP = "\0cgroup:"  # monitor key prefix (a task cgroup being emptied): its path follows
CGROUP_RETRY = Backoff(0.05, 5.0)  # an emptied cgroup's rmdir is retried after this, doubling up to 5 s
TASK_CGROUPS = ("auto", "off")


def _job_of(task_id: str) -> str:
    """The job id of a task id (`<job>-<instance>-<attempt>`); "" for a name of another shape."""
    return task_id.rsplit("-", 2)[0] if task_id.count("-") >= 2 else ""


def _disk_usage(path: Path) -> int:
    """Bytes on disk under `path` (allocated blocks; symlinks not followed); what cannot be read counts 0."""
    total = 0
    stack = [str(path)]
    while stack:
        try:
            with os.scandir(stack.pop()) as it:
                for entry in it:
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    total += st.st_blocks * 512
                    if stat.S_ISDIR(st.st_mode):
                        stack.append(entry.path)
        except OSError:
            continue
    return total


def make_local_hosts(
    n: int | None,
    resources: Resources | None,
    port_base: int = 31000,
    ports_per_host: int = 1000,
    *,
    data_dir: Path | None = None,
    labels: dict[str, str] | None = None,
    groups: Sequence[HostGroup] = (),
) -> list[HostConfig]:
    """The hosts of the local backend.

    n None (and no groups): the one real host, named after this machine, with its resources (or `resources`) and
    detected GPUs.
    n given: simulated hosts local-0..local-{n-1}, each with `resources` (this machine's if None) and its own GPU
    index space 0..gpu-1, and non-overlapping port ranges of `ports_per_host` ports from `port_base`.
    groups given (`--local-host-group`): simulated hosts of each group in turn, numbered on from local-0.
    Labels: `host`, `rack=local`, then `labels` (or each group's)."""
    if n is not None and n < 1:
        raise InvalidArgument(f"number of local hosts must be at least 1, got {n}", field="local_hosts")
    if ports_per_host < 1:
        raise InvalidArgument(f"ports per host must be at least 1, got {ports_per_host}", field="ports_per_host")
    count = sum(g.count for g in groups) if groups else 1 if n is None else n
    if port_base < 1 or port_base + count * ports_per_host - 1 > 65535:
        raise InvalidArgument(
            f"port ranges {port_base}..{port_base + count * ports_per_host - 1} do not fit in 1..65535",
            field="port_base",
        )
    extra = dict(labels or {})
    if n is None and not groups:
        found = gpus.detect()
        detected = found.indices
        if resources is None:
            res = gpus.machine_resources(data_dir, gpu_count=len(detected))
            gpu_ids = tuple(detected)
        else:
            res = resources
            gpu_ids = tuple(detected[: res.gpu]) if len(detected) >= res.gpu else tuple(range(res.gpu))
        name = socket.gethostname() or "local-0"
        if gpu_ids and found.gpu_model is not None and "gpu_model" not in extra:
            extra["gpu_model"] = found.gpu_model  # what nvidia-smi names, unless the operator said otherwise
        _check_labels(extra, bool(gpu_ids), found.problem)  # (its GPUs are known only now)
        return [HostConfig(hostname=name, resources=replace(res, gpu=len(gpu_ids), ports=0), gpu_ids=gpu_ids,
                           port_range=(port_base, port_base + ports_per_host - 1),
                           labels={"host": name, "rack": "local", **extra, **_gpu_error(found)},
                           address=LOCAL_ADDRESS)]
    if not groups:
        if resources is None:  # simulated hosts the size of this machine: its GPUs, as nvidia-smi counts them
            found = gpus.detect()
            resources = gpus.machine_resources(data_dir, gpu_count=len(found.indices))
            extra.update(_gpu_error(found))
        groups = (HostGroup(count, resources, tuple(extra.items())),)
    hosts: list[HostConfig] = []
    for g in groups:
        for _ in range(g.count):
            i = len(hosts)
            name = f"local-{i}"
            lo = port_base + i * ports_per_host
            hosts.append(HostConfig(hostname=name, resources=replace(g.resources, ports=0),
                                    gpu_ids=tuple(range(g.resources.gpu)), port_range=(lo, lo + ports_per_host - 1),
                                    labels={"host": name, "rack": "local", **dict(g.labels)}, address=LOCAL_ADDRESS))
    return hosts


def _gpu_error(found: gpus.Detected) -> dict[str, str]:
    """The label saying why an nvidia-smi that is there gave no GPU; none when it gave some, or is not there."""
    return {hostlabels.GPU_ERROR: found.problem} if found.problem else {}


def _check_labels(labels: dict[str, str], has_gpus: bool, gpu_problem: str) -> None:
    """hostlabels.check_for_hosts for hosts whose GPUs nvidia-smi counted: a refusal of a GPU label for want of GPUs
    says why nvidia-smi gave none, when it failed."""
    try:
        hostlabels.check_for_hosts(labels, has_gpus, "--local-host-labels")
    except InvalidArgument as e:
        if not gpu_problem:
            raise
        raise InvalidArgument(f"{e.message} ({gpu_problem}; the daemon's log says more)", field=e.field) from None


@dataclass(slots=True)
class _Task:
    """The book's record of one task of this backend."""

    task_id: str
    job_id: str
    instance: int
    attempt: int
    hostname: str
    sandbox: Path
    usage: RunningTask
    pid: int = 0  # the wrapper's pid == the task's process group id (0: not spawned yet)
    announced: bool = True  # RUNNING reported; a terminal status waits for it
    deferred: TaskStatus | None = None  # a terminal status that arrived before RUNNING was reported
    aborted: bool = False  # stopped as part of a failed launch: its end is not reported
    kill_wall: float | None = None  # time.time() of the kill request
    kill_grace: float | None = None  # its SIGTERM-to-SIGKILL grace (None: the backend's default)
    sigkill_sent: bool = False
    exited: bool = False
    cgroup: str | None = None  # the task's cgroup directory (cgroups.py); None: its wrapper is a child subreaper

    def record(self) -> Record:
        r = self.usage.resources
        rec: Record = {"op": "start", "task": self.task_id, "job": self.job_id, "instance": self.instance,
                       "attempt": self.attempt, "host": self.hostname, "sandbox": str(self.sandbox),
                       "res": [r.cpu, r.mem, r.disk, r.gpu, r.ports], "gpus": list(self.usage.gpu_ids),
                       "ports": list(self.usage.ports)}
        if self.cgroup:
            rec["cg"] = self.cgroup
        if self.pid:
            rec["pid"] = self.pid
        if self.kill_wall is not None:
            rec["kill"] = self.kill_wall
        if self.kill_grace is not None:
            rec["grace"] = self.kill_grace
        return rec


@dataclass(slots=True)
class _Launch:
    gang: GangLaunch
    tasks: list[_Task] = field(default_factory=list)


class LocalBackend:
    """Backend running tasks as local processes. Thread-safe."""

    def __init__(
        self,
        data_dir: Path,
        hosts: list[HostConfig],
        *,
        clock: Callable[[], float] = time.time,
        kill_grace_s: float = 5.0,
        spawners: int = 4,
        env_allow: tuple[str, ...] = (),
        default_user: str | None = None,
        log_max_bytes: int = DEFAULT_LOG_MAX_BYTES,
        log_keep: int = DEFAULT_LOG_KEEP,
        log_check_s: float = LOG_CHECK_S,
        sandbox_retention_s: float = DEFAULT_SANDBOX_RETENTION_S,
        sandbox_max_count: int = DEFAULT_SANDBOX_MAX_COUNT,
        sandbox_max_bytes: int = DEFAULT_SANDBOX_MAX_BYTES,
        sandbox_sweep_s: float = SANDBOX_SWEEP_S,
        loop_clock: Clock = SYSTEM_CLOCK,
        task_cgroups: str = "auto",
        warm_wrappers: int = DEFAULT_WARM_WRAPPERS,
    ) -> None:
        """`env_allow`: variables of the daemon's environment tasks inherit besides task_env.DEFAULT_ALLOW.
        `default_user`: who runs a task that names no user (None: `nobody` when the daemon is root, else the
        daemon's own user); `root` here is the operator's explicit choice to run such tasks as root.
        `log_max_bytes`, `log_keep`: a running task's stdout or stderr larger than this is rotated (checked every
        `log_check_s`), keeping that many rotated files (logrotate.py); 0: never rotated.
        `sandbox_retention_s`: the sandbox of a task that ended longer ago than this is removed (looked at every
        `sandbox_sweep_s`), whether or not its job is still there; 0: kept until its job is deleted.
        `sandbox_max_count`, `sandbox_max_bytes`: past these the oldest ended sandboxes go, failed tasks' last
        (sandbox_retention.py; looked at again as soon as a tenth of the count more have ended); 0: no bound.
        The sandboxes go on the `local-sandboxes` loop, those of deleted jobs too: never on a launch's or a
        request's way.
        `loop_clock`: what those two loops wait on (and health judges them by).
        `task_cgroups`: `auto`, a cgroup v2 per task where this process can make them (cgroups.py), else (and with
        `off`) each task's wrapper is a child subreaper (descendants.py).
        `warm_wrappers`: the wrappers each spawner may start ahead of launches, per user (spawner.py: a member
        with a cgroup is handed one instead of being started); 0: none."""
        if not hosts:
            raise InvalidArgument("the local backend needs at least one host", field="hosts")
        if task_cgroups not in TASK_CGROUPS:
            raise InvalidArgument(f"task cgroups must be one of {', '.join(TASK_CGROUPS)}, got {task_cgroups!r}",
                                  field="task_cgroups")
        self._hosts: dict[str, HostUsage] = {}
        for h in hosts:
            if h.hostname in self._hosts:
                raise InvalidArgument(f"duplicate local host name {h.hostname!r}", field="hosts")
            self._hosts[h.hostname] = HostUsage(h)
        self._default_user = (DEFAULT_ROOT_TASK_USER if tasks_run_as_others() else "") if default_user is None \
            else default_user
        # absolute: a sandbox's path is what its task is given ($PELOTON_SANDBOX, $PELOTON_HOSTFILE: the task runs
        # in its work/, not in the daemon's directory) and what names it on its wrapper's command line (adoption)
        self._data_dir = Path(os.path.abspath(data_dir))
        # as given: a task started by a release that kept it relative names its sandbox so on its command line
        self._data_dir_given = Path(data_dir)
        self._sandboxes = self._data_dir / SANDBOXES_DIR
        for d in (self._data_dir, self._sandboxes):  # owner-only (tasks' logs and files), or traversable by a task
            private_dir(d, traversable=tasks_run_as_others())  # user to its own sandbox (files.py)
        self._clock = clock
        self._kill_grace_s = kill_grace_s
        self._lock = threading.Lock()
        self._tasks: dict[str, _Task] = {}
        self._finished: OrderedDict[str, TaskStatus] = OrderedDict()
        self._on_status: StatusCallback | None = None
        self._on_statuses: StatusesCallback | None = None
        self._journal = Journal(self._data_dir / JOURNAL_FILE, self._snapshot)
        self._monitor = ProcessMonitor(self._on_exit, self._on_timer, self._on_exits)
        self._cgroups: cgroups.TaskCgroups | None = None
        if task_cgroups == "auto":
            self._cgroups, why = cgroups.probe(self._data_dir)
            self._containment = (f"a cgroup per task under {self._cgroups.subtree} (cgroup v2"
                                 f"{'' if self._cgroups.has_kill else ', no cgroup.kill: freeze and kill'})"
                                 if self._cgroups is not None else
                                 f"a child subreaper per task: cgroup v2 cannot be used ({why})")
        else:
            self._containment = "a child subreaper per task (--task-cgroups off)"
        self._releasing: dict[str, int] = {}  # task cgroups being emptied and removed -> tries so far
        self._spawners = SpawnerPool(spawners, inherited(os.environ, env_allow), warm=warm_wrappers)
        self._started = False
        self._log_max, self._log_keep = log_max_bytes, log_keep
        # a read of a log that overlapped a rotation of it is done again (no lock is held across either): the
        # condition guards which logs are being rotated and how many rotations have begun (memory only)
        self._logs_cond = threading.Condition()
        self._rotating: set[tuple[Path, str]] = set()
        self._rotations = 0
        for value, flag in ((sandbox_max_count, "sandbox_max_count"), (sandbox_max_bytes, "sandbox_max_bytes")):
            if value < 0:
                raise InvalidArgument(f"{flag} must not be negative, got {value}", field=flag)
        self._sandbox_retention_s = sandbox_retention_s
        self._sandbox_max_count, self._sandbox_max_bytes = sandbox_max_count, sandbox_max_bytes
        # what is known of ended sandboxes (an ended task's sandbox no longer changes: its size is measured once,
        # outside the lock); guarded by _lock
        self._ended_sandboxes: dict[str, EndedSandbox] = {}
        self._ended_since_sweep = 0  # guarded by _lock
        self._doomed_jobs: set[str] = set()  # deleted jobs whose sandboxes the sweep removes; guarded by _lock
        # ports some socket other than our tasks' held when a gang was to get them -> until when none is offered
        # (sockets.py: this machine's network is shared); guarded by _lock
        self._taken_ports: dict[int, float] = {}
        # its periodic housekeeping, as loops: the daemon's health watches them with its own (hostmgr's)
        self.loops: list[Loop] = []
        if log_max_bytes > 0:
            self.loops.append(Loop("local-logrotate", self._rotate_logs, log_check_s, loop_clock))
        self._sandbox_loop: Loop | None = None
        if sandbox_retention_s > 0 or sandbox_max_count > 0 or sandbox_max_bytes > 0:
            self._sandbox_loop = Loop("local-sandboxes", self._sweep_sandboxes, sandbox_sweep_s, loop_clock)
            self.loops.append(self._sandbox_loop)

    # ----------------------------------------------------------------------------------------------- lifecycle

    def start(self, on_status: StatusCallback, on_hosts_changed: HostsCallback | None = None,
              on_statuses: StatusesCallback | None = None) -> None:
        """Adopt the tasks a previous daemon left, report how the others ended while it was down, then monitor."""
        if self._started:
            raise RuntimeError("LocalBackend already started")
        self._started = True
        self._on_status = on_status
        self._on_statuses = on_statuses
        log.info("local backend: what a task starts is contained by %s", self._containment)
        statuses, release = self._adopt()
        self._journal.start()  # compacts: only the live tasks remain
        self._monitor.start()
        if self._cgroups is not None:  # the cgroups of tasks no longer known: ended while no daemon cleaned up
            with self._lock:
                live = {t.cgroup for t in self._tasks.values()}
            release += [p for p in self._cgroups.existing() if p not in live]
        for path in dict.fromkeys(release):
            self._release_cgroup(path)
        for lp in self.loops:
            lp.start()
        for st in statuses:
            self._report(st)

    def lead_again(self) -> None:
        pass  # no other daemon can have acted on this backend's hosts meanwhile

    def demand(self) -> None:
        pass  # its hosts are this daemon's alone: nothing to give back while idle, nothing to ask for again

    def maintenance(self) -> dict[str, float]:
        return {}  # no cluster manager schedules maintenance here: operators drain (`peloton host drain`)

    def stop(self) -> None:
        """Stop monitoring. Tasks keep running; a new LocalBackend on the same data_dir adopts them."""
        for lp in self.loops:
            lp.signal_stop()
        for lp in self.loops:
            lp.join(5)
        self._spawners.close()
        self._monitor.stop()
        self._journal.stop()
        with self._lock:
            releasing, self._releasing = list(self._releasing), {}
        for path in releasing:  # one last try; what is still busy is found at the next start
            cgroups.kill(path)
            cgroups.remove(path)
        if self._cgroups is not None:
            self._cgroups.remove_subtree_if_empty()

    # ----------------------------------------------------------------------------------------------- queries

    def offers(self, hostnames: Collection[str] | None = None, *, with_ids: bool = False) -> list[HostOffer]:
        now = self._clock()
        with self._lock:
            return offers_of(self._hosts, hostnames, with_ids, self._taken_ports_locked(now))

    def _taken_ports_locked(self, now: float) -> Collection[int]:
        if self._taken_ports:
            for p in [p for p, until in self._taken_ports.items() if until <= now]:
                del self._taken_ports[p]
        return self._taken_ports.keys()

    def hosts(self) -> list[HostInfo]:
        with self._lock:
            return [h.info() for h in self._hosts.values()]

    def running(self) -> list[RunningTask]:
        with self._lock:
            return [t.usage for t in self._tasks.values() if not t.aborted]

    def acknowledge(self, acks: Sequence[str]) -> None:
        """Nothing to acknowledge: local statuses are not resent."""

    def reconcile(self, task_ids: Sequence[str]) -> dict[str, TaskStatus]:
        now = self._clock()
        out: dict[str, TaskStatus] = {}
        unknown: list[str] = []
        with self._lock:
            for tid in task_ids:
                t = self._tasks.get(tid)
                if t is not None:
                    if t.pid and t.announced and not t.aborted:
                        out[tid] = TaskStatus(tid, TaskState.RUNNING, now, t.hostname)
                    continue  # being launched: its status is on its way
                done = self._finished.get(tid)
                if done is not None:
                    out[tid] = done
                else:
                    unknown.append(tid)
        for tid in unknown:  # ended long ago (or before a restart): the sandbox may still tell
            sandbox = self._sandbox_path(tid)
            rec = wrapper.read_exit(sandbox) if sandbox is not None else None
            out[tid] = (self._status_from_exit(tid, "", rec, None) if rec is not None
                        else TaskStatus(tid, TaskState.LOST, now, reason="unknown to the local backend"))
        return out

    def _sandboxes_not_running(self) -> Iterator[tuple[str, Path]]:
        """(task id, sandbox) of every sandbox whose task is not in this backend's book (a stray the job manager is
        killing keeps its sandbox). Not even one whose wrapper has exited: the monitor reads how it ended from the
        sandbox after it marked it so, and takes it out of the book only then (a sweep in between removed what it
        was to read, and the task was reported LOST)."""
        try:
            names = os.listdir(self._sandboxes)
        except OSError:
            return
        for name in names:
            sandbox = self._sandbox_path(name)
            if sandbox is None:
                continue
            with self._lock:
                if name in self._tasks:
                    continue
            yield name, sandbox

    def _remove_sandbox(self, name: str, sandbox: Path) -> bool:
        """Remove an ended task's sandbox, unless its task id is in the book again (launched anew since the sweep
        listed it, after measuring every sandbox: seconds for thousands). What is left is a launch of that task id
        registered while the sandbox is being removed (a launch refused whose spawn had begun, its gang placed
        again as the same attempt: docs/running.md), whose spawner then makes the sandbox anew."""
        with self._lock:
            if name in self._tasks:
                return False
        shutil.rmtree(sandbox, ignore_errors=True)
        return True

    def remove_sandboxes(self, job_ids: Collection[str]) -> int:
        """The jobs' ended tasks' sandboxes are handed to the `local-sandboxes` loop, which removes them in the
        background (a job of thousands of tasks took its DeleteJob tens of seconds); how many it will remove. A
        crash first leaves them to the bounds. Without that loop they go here."""
        if self._sandbox_loop is not None:
            wanted = set(job_ids)
            found = sum(1 for name, _ in self._sandboxes_not_running() if _job_of(name) in wanted) if wanted else 0
            with self._lock:
                self._doomed_jobs |= wanted
            self._sandbox_loop.wake()
            return found
        return self._remove_job_sandboxes(set(job_ids))

    def _remove_job_sandboxes(self, wanted: set[str]) -> int:
        removed = 0
        for name, sandbox in self._sandboxes_not_running() if wanted else ():
            if _job_of(name) in wanted and self._remove_sandbox(name, sandbox):
                removed += 1
                progress()  # (the retention loop's pass, when it deletes jobs in this process)
        return removed

    def expire_sandboxes(self, now: float) -> int:
        """Remove the sandboxes of tasks that ended more than the retention ago (by the time the wrapper recorded
        the end, else the sandbox's last change when it recorded none), then the oldest past the count and bytes
        bounds (sandbox_retention.py); a task still running, or whose wrapper is still alive, keeps its sandbox.
        How many went."""
        ended: list[EndedSandbox] = []
        seen: set[str] = set()
        for name, sandbox in self._sandboxes_not_running():
            progress()  # a sweep of many sandboxes, some large, is a long pass that moves
            seen.add(name)
            with self._lock:
                known = self._ended_sandboxes.get(name)
            if known is None:
                known = self._ended_sandbox(name, sandbox)
                if known is None:
                    continue
            ended.append(known)
        with self._lock:  # forget what is gone (a deleted job's)
            for name in [n for n in self._ended_sandboxes if n not in seen]:
                del self._ended_sandboxes[name]
        gone = to_remove(ended, now, self._sandbox_retention_s, self._sandbox_max_count, self._sandbox_max_bytes)
        for name in list(gone):
            progress()
            path = self._sandbox_path(name)
            if path is not None and not self._remove_sandbox(name, path):
                gone.remove(name)  # launched again since it was listed: its own now
                continue
            with self._lock:
                self._ended_sandboxes.pop(name, None)
        if gone:
            SANDBOXES_EXPIRED.inc(len(gone))
            log.info("removed %d sandboxes of ended tasks (--sandbox-retention %.0f s, at most %d kept, %d bytes)",
                     len(gone), self._sandbox_retention_s, self._sandbox_max_count, self._sandbox_max_bytes)
        return len(gone)

    def _ended_sandbox(self, name: str, sandbox: Path) -> EndedSandbox | None:
        """What the sweep needs of an ended task's sandbox (None: not judged, as its wrapper still lives, or it is
        gone). Remembered once the end is recorded (nothing changes it after)."""
        ended = wrapper.read_exit(sandbox)
        try:
            ended_at = ended.finished_at if ended is not None else sandbox.stat().st_mtime
        except OSError:
            return None
        if ended is None:
            pid = wrapper.read_pid(sandbox)
            if pid and wrapper.is_wrapper(pid, sandbox):
                return None  # no end recorded and its wrapper lives: not ours to judge
        e = EndedSandbox(name, ended_at, _disk_usage(sandbox),
                         failed=ended is not None and ended.exit_code not in (None, 0))
        if ended is not None:
            with self._lock:
                self._ended_sandboxes[name] = e
        return e

    def _sweep_sandboxes(self) -> bool:
        """The `local-sandboxes` loop's pass (a failure is logged and tried again at the next one): deleted jobs'
        sandboxes first, then those past the retention or the bounds."""
        with self._lock:
            doomed, self._doomed_jobs = self._doomed_jobs, set()
            self._ended_since_sweep = 0
        if doomed:
            self._remove_job_sandboxes(doomed)
        self.expire_sandboxes(self._clock())
        return False

    def read_log(self, task_id: str, stream: str, offset: int, max_bytes: int) -> tuple[bytes, int]:
        if stream == "metrics":
            return self._read_metrics(task_id, max_bytes)
        if stream not in _STREAMS:
            raise InvalidArgument(f"stream must be one of {', '.join(_STREAMS)}, got {stream!r}", field="stream")
        sandbox = self._sandbox_path(task_id)
        if sandbox is None or not sandbox.is_dir():
            raise NotFound(f"no sandbox for task {task_id!r} (removed with its job or after --sandbox-retention, "
                           "or never made)")
        try:
            return self._read_rotated(sandbox, stream, offset, max_bytes)
        except FileNotFoundError:
            return b"", 0
        except OSError as e:  # the task replaced its log with a symlink, a FIFO, ...
            raise FailedPrecondition(f"the {stream} of task {task_id} cannot be read: "
                                     f"{e.strerror or e}") from None

    def _read_metrics(self, task_id: str, max_bytes: int) -> tuple[bytes, int]:
        """The tail of the member's $PELOTON_METRICS_FILE. The file and its `work/` are the member's: a symlink is
        followed at neither (a `work` made a link to another task's sandbox would read that task's numbers, as
        root), and anything but a regular file reads as nothing (only numbers of it are shown, modelaware/metrics.py)."""
        sandbox = self._sandbox_path(task_id)
        if sandbox is None:
            return b"", 0
        try:
            work = os.open(sandbox / wrapper.WORK_DIR, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return b"", 0
        try:
            fd = os.open(metrics.FILE_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=work)
        except OSError:
            return b"", 0
        finally:
            os.close(work)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return b"", 0
            start = max(0, st.st_size - max_bytes)
            return os.pread(fd, max_bytes, start), st.st_size
        finally:
            os.close(fd)

    def _read_rotated(self, sandbox: Path, stream: str, offset: int, max_bytes: int) -> tuple[bytes, int]:
        """logrotate.read, done again when a rotation of that log began meanwhile (its files moved under it)."""
        key = (sandbox, stream)
        for _ in range(LOG_READ_TRIES):
            with self._logs_cond:
                self._logs_cond.wait_for(lambda: key not in self._rotating, LOG_ROTATION_WAIT_S)
                begun = self._rotations
            out = logrotate.read(sandbox, stream, offset, max_bytes, self._log_keep)
            with self._logs_cond:
                if self._rotations == begun and key not in self._rotating:
                    return out
        return out  # rotations without end (a task writing past its cap faster than it is rotated): the last read

    def _rotate_logs(self) -> bool:
        """The `local-logrotate` loop's pass, every `log_check_s`: the logs of running tasks grown past the cap are
        rotated (logrotate.py)."""
        with self._lock:
            sandboxes = [t.sandbox for t in self._tasks.values() if not t.exited]
        for sandbox in sandboxes:
            for stream in _STREAMS:
                if not logrotate.due(sandbox, stream, self._log_max):
                    continue
                key = (sandbox, stream)
                with self._logs_cond:
                    self._rotating.add(key)
                    self._rotations += 1
                try:
                    moved = logrotate.rotate(sandbox, stream, self._log_max, self._log_keep)
                finally:
                    with self._logs_cond:
                        self._rotating.discard(key)
                        self._logs_cond.notify_all()
                if moved:
                    LOGS_ROTATED.inc()
                    log.info("rotated %s/%s: %d bytes to %s.1", sandbox.name, stream, moved, stream)
            progress()
        return False

    # ----------------------------------------------------------------------------------------------- launch / kill

    def launch(self, gangs: Sequence[GangLaunch]) -> list[LaunchResult]:
        results: dict[int, LaunchResult] = {}
        launches: dict[int, _Launch] = {}
        # the sockets of this machine, read once a batch and outside the lock: only when some member takes ports
        held = sockets.ports_in_use() if any(s.ports for g in gangs for s in g.tasks) else frozenset()
        now = self._clock()
        with self._lock:
            for i, g in enumerate(gangs):
                why = self._refusal_locked(g) or self._port_held_locked(g, held, now)
                if why is not None:
                    tid, msg = why
                    results[i] = LaunchResult(g.gang_id, g.attempt, LaunchOutcome.REFUSED, tid, msg)
                    continue
                lg = _Launch(g)
                for spec in g.tasks:
                    t = _Task(spec.task_id, spec.job_id, spec.instance, spec.attempt, spec.hostname,
                              self._sandboxes / spec.task_id, accounted(spec), announced=False,
                              cgroup=self._cgroups.new_path(spec.task_id) if self._cgroups is not None else None)
                    self._tasks[t.task_id] = t
                    self._hosts[t.hostname].add(t.usage)
                    self._finished.pop(t.task_id, None)
                    lg.tasks.append(t)
                launches[i] = lg
        if launches:
            # one fsync for the whole batch: a daemon killed from here on knows what it may have started
            try:
                self._journal.append([t.record() for lg in launches.values() for t in lg.tasks], durable=True)
            except OSError as e:
                for i, lg in launches.items():
                    self._unregister(lg.tasks)
                    results[i] = LaunchResult(lg.gang.gang_id, lg.gang.attempt, LaunchOutcome.REFUSED,
                                              message=f"cannot record the launch: {e}")
                launches = {}
        reports: list[TaskStatus] = []
        ready: list[tuple[int, _Launch]] = []
        for i, lg in launches.items():
            refused = self._before_start(lg, reports)
            if refused is None:
                ready.append((i, lg))
            else:
                results[i] = refused
        if ready:
            for (i, _), r in zip(ready, self._start_gangs([lg for _, lg in ready], reports), strict=True):
                results[i] = r
        self._report_all(reports)  # RUNNING of every gang started (KILLED of those stopped): one hand-over, one wake
        # only now may an end be reported as it comes (a member that ended meanwhile left its end for here: after
        # its RUNNING, whichever thread saw it)
        deferred: list[TaskStatus] = []
        with self._lock:
            for i, lg in ready:
                if results[i].outcome == LaunchOutcome.OK:
                    for t in lg.tasks:
                        t.announced = True
                        if t.deferred is not None:
                            deferred.append(t.deferred)
                            t.deferred = None
        self._report_all(deferred)
        return [results[i] for i in range(len(gangs))]

    def _refusal_locked(self, g: GangLaunch) -> tuple[str, str] | None:
        for spec in g.tasks:
            if self._sandbox_path(spec.task_id) is None:
                return spec.task_id, "invalid task id for a sandbox directory name"
            if spec.task_id in self._tasks:
                return spec.task_id, "task is already running"
            for name in spec.files:
                if self._bad_file_name(name):
                    return spec.task_id, f"invalid sandbox file name {name!r}"
        return check_gang(self._hosts, g.tasks)

    def _port_held_locked(self, g: GangLaunch, held: frozenset[int], now: float) -> tuple[str, str] | None:
        """A member's port that some other socket on this machine holds: the gang is refused (and placed again),
        and the port is not offered for a while, rather than its task failing to bind it."""
        for spec in g.tasks:
            for p in spec.ports:
                if p in held:
                    self._taken_ports[p] = now + TAKEN_PORT_HOLD_S
                    log.info("local backend: port %d is held by another socket on this machine: gang %s is "
                             "placed again on other ports", p, g.gang_id)
                    return spec.task_id, f"port {p} on host {spec.hostname} is held by another socket on this machine"
        return None

    def _before_start(self, lg: _Launch, reports: list[TaskStatus]) -> LaunchResult | None:
        """A gang that must not start after all (killed meanwhile, a system account nobody vetted): its result."""
        with self._lock:
            killed = any(t.kill_wall is not None for t in lg.tasks)
        if killed:
            return self._abort(lg, None, reports)
        specs = {s.task_id: s for s in lg.gang.tasks}
        for t in lg.tasks:
            why = unvetted_system_account(specs[t.task_id])
            if why:
                return self._abort(lg, (t.task_id, why, True), reports)
        return None

    def _start_gangs(self, lgs: list[_Launch], reports: list[TaskStatus]) -> list[LaunchResult]:
        """Start the members of every gang at once, in parallel over the spawners (spawn.py: each takes a share;
        a member that cannot start makes its spawner skip the rest of its gang there), then settle each gang:
        whole, or stopped (_abort)."""
        tasks: list[dict[str, object]] = []
        for g, lg in enumerate(lgs):
            specs = {s.task_id: s for s in lg.gang.tasks}
            for t in lg.tasks:
                spec = specs[t.task_id]
                tasks.append({"sandbox": str(t.sandbox), "command": spec.command, "env": self._env(t, spec),
                              "files": spec.files, "group": g,
                              **({"cgroup": t.cgroup} if t.cgroup else {"subreaper": True}), **self._user(spec)})
        try:
            results = self._spawners.spawn_many(tasks)
        except SpawnerDied as e:  # no spawner to be had (the backend is stopping)
            results = [Unknown(str(e))] * len(tasks)
        out: list[LaunchResult] = []
        pids: list[Record] = []
        # a spawner that died mid-request may have started a wrapper that has not written its pid yet (it does so
        # first thing): the members it had are looked for until one deadline for the whole launch
        pid_deadline = time.monotonic() + PID_WAIT_S
        k = 0
        for lg in lgs:
            out.append(self._settle(lg, results[k:k + len(lg.tasks)], pids, reports, pid_deadline))
            k += len(lg.tasks)
            progress()  # (a launcher loop's pass, in-process: a batch of big gangs moves gang by gang)
        self._journal.append(pids)  # (not durable: a wrapper writes its pid into its sandbox as well)
        return out

    def _settle(self, lg: _Launch, results: Sequence[Started | NotStarted | Unknown | None], pids: list[Record],
                reports: list[TaskStatus], pid_deadline: float) -> LaunchResult:
        """What the spawners did with one gang's members: watch what started (its pid record into `pids`), then
        the gang runs whole or is stopped. A member whose spawner died (Unknown) is looked for by the pid its
        wrapper writes (until `pid_deadline`): one found is watched as if started, so that the gang's teardown
        stops it and the book holds its resources until it is gone."""
        failure: tuple[str, str, bool] | None = None
        lost: Unknown | None = None
        killed = False
        for t, r in zip(lg.tasks, results, strict=True):
            if isinstance(r, Unknown):
                lost = lost or r
                found = self._started_unknown(t, pid_deadline)
                if found is None:
                    if t.cgroup:
                        cgroups.kill(t.cgroup)  # (removed by _abort: this one has no pid)
                    continue
                r = found
            if isinstance(r, Started):
                with self._lock:
                    t.pid = r.pid
                    killed = killed or t.kill_wall is not None
                    if r.pidfd is not None:  # watched as its pid is known: a kill signals it through its pidfd's
                        self._monitor.watch_fd(t.task_id, r.pidfd)  # watch (_signal), never by a number alone
                pids.append({"op": "pid", "task": t.task_id, "pid": r.pid})
                (_STARTED_WARM if r.warm else _STARTED_COLD).inc()
                if r.pidfd is None:
                    self._on_exit(t.task_id)  # over already: handled like any exit
            elif isinstance(r, NotStarted):
                failure = failure or (t.task_id, r.message, r.permanent)
        if lost is not None:
            log.error("local backend: gang %s: %s", lg.gang.gang_id, lost.message)
            failure = failure or (lg.tasks[0].task_id, lost.message, False)
        if failure is None and not killed:
            return self._announce(lg, reports)
        return self._abort(lg, failure, reports)

    @staticmethod
    def _started_unknown(t: _Task, deadline: float) -> Started | None:
        """The wrapper of a member whose spawner died in the middle of its request, if it was started: its pid is
        in its sandbox's `pids` as soon as its shell runs (a wrapper started a moment before the spawner died has
        not written it yet: waited for until `deadline`, and only where the spawner made the sandbox), and a pidfd
        is opened before the pid is checked to be that wrapper's. None: not started, or over already."""
        if not t.sandbox.is_dir():
            return None  # the spawner did not get to this member
        pid = LocalBackend._wait_for_pid(t.sandbox, deadline)
        pidfd = _open_wrapper(pid, t.sandbox) if pid > 0 else None
        if pidfd is None and pid > 0 and wrapper.is_wrapper(pid, t.sandbox, attempts=1):
            with contextlib.suppress(OSError):  # alive, yet no pidfd (out of descriptors): stopped at least
                os.killpg(pid, signal.SIGKILL)
        return Started(pid, pidfd) if pidfd is not None else None

    def _announce(self, lg: _Launch, reports: list[TaskStatus]) -> LaunchResult:
        """Every member's command has started: RUNNING (into `reports`; launch() reports what ended meanwhile
        once these are out)."""
        now = self._clock()
        reports += [TaskStatus(t.task_id, TaskState.RUNNING, now, t.hostname) for t in lg.tasks]
        return LaunchResult(lg.gang.gang_id, lg.gang.attempt, LaunchOutcome.OK)

    def _abort(self, lg: _Launch, failure: tuple[str, str, bool] | None,
               reports: list[TaskStatus]) -> LaunchResult:
        """Stop what was started of a gang that cannot start whole. A failed member: the gang FAILED, nothing of it
        reported. A kill that came first: REFUSED, and every member reported KILLED (it never ran, or was stopped
        before the gang came up; into `reports`)."""
        now = self._clock()
        with self._lock:
            spawned = [t for t in lg.tasks if t.pid and not t.exited]
            for t in lg.tasks:
                t.aborted = True
            never = [t for t in lg.tasks if not t.pid or t.exited]
        for t in spawned:
            self._signal(t, signal.SIGKILL)  # its exit is handled (and unregistered) by the monitor
        for t in never:
            if t.cgroup and not t.exited:  # (an exited one's was released at its exit)
                self._release_cgroup(t.cgroup)
        self._unregister(never)
        # over, and never to be reported (the launch's result says it): a replay must not take it for a task that
        # ended while no daemon watched (reported LOST) or is still starting (its pid waited for). The spawned ones
        # are recorded so as their ends are seen (_on_exits)
        self._journal.append([_aborted_end(t) for t in never if not t.exited])
        if failure is not None:
            tid, msg, permanent = failure
            return LaunchResult(lg.gang.gang_id, lg.gang.attempt, LaunchOutcome.FAILED, tid, msg, permanent)
        reports += [TaskStatus(t.task_id, TaskState.KILLED, now, t.hostname, reason="killed",
                               message="killed before the gang started") for t in lg.tasks]
        return LaunchResult(lg.gang.gang_id, lg.gang.attempt, LaunchOutcome.REFUSED,
                            message="killed before it started")

    def kill(self, task_ids: Sequence[str], grace_s: float | None = None) -> None:
        records: list[Record] = []
        signal_now: list[_Task] = []
        wall, mono = time.time(), time.monotonic()
        grace = self._kill_grace_s if grace_s is None else grace_s
        with self._lock:
            for tid in task_ids:
                t = self._tasks.get(tid)
                if t is None or t.kill_wall is not None or t.aborted:
                    continue
                t.kill_wall, t.kill_grace = wall, grace_s
                records.append({"op": "kill", "task": tid, "kill": wall, "grace": grace})
                if t.pid:
                    signal_now.append(t)
        for t in signal_now:
            self._signal(t, signal.SIGTERM)
            # a SIGTERM that lands while the wrapper is forking the command's shell is caught by the wrapper's
            # inherited handler in the child and lost; the window is microseconds wide, but a gated wrapper is let go
            # a moment after its launch returned (when a kill that follows the launch at once arrives too): a repeat
            # soon, and one later for a loaded machine
            self._monitor.call_at(mono + min(TERM_SOON_S, TERM_AGAIN_S), t.task_id + _TERM_AGAIN)
            self._monitor.call_at(mono + TERM_AGAIN_S, t.task_id + _TERM_AGAIN)
            self._monitor.call_at(mono + grace, t.task_id)
        self._journal.append(records)

    # ----------------------------------------------------------------------------------------------- internals

    def _user(self, spec: LaunchSpec) -> dict[str, object]:
        """Who the spawner runs the task as, and whether that may be uid 0: when the job names root (its pool
        allowed it at submit), or when the operator made root the default user."""
        user = spec.user or self._default_user
        return {"user": user, "root_allowed": spec.user == "root" or (not spec.user and user == "root")}

    @staticmethod
    def _env(t: _Task, spec: LaunchSpec) -> dict[str, str]:
        """What the task's environment adds to the daemon's (the spawner has the daemon's)."""
        env = dict(spec.env)
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in spec.gpu_ids)
        env["PELOTON_SANDBOX"] = str(t.sandbox)
        env["PELOTON_METRICS_FILE"] = str(t.sandbox / "work" / metrics.FILE_NAME)
        if "hostfile" in spec.files and "PELOTON_HOSTFILE" not in spec.env:
            env["PELOTON_HOSTFILE"] = str(t.sandbox / "hostfile")
        return env

    def _report(self, st: TaskStatus) -> None:
        cb = self._on_status
        if cb is None:
            return
        try:
            cb(st)
        except Exception:  # noqa: BLE001 - a failing callback must not kill the monitor
            log.exception("local backend: status callback failed for %s", st.task_id)

    def _report_all(self, statuses: list[TaskStatus]) -> None:
        """Several statuses, in order: handed over at once where the receiver takes batches (one wake)."""
        cb = self._on_statuses
        if cb is None or len(statuses) < 2:
            for st in statuses:
                self._report(st)
            return
        try:
            cb(statuses)
        except Exception:  # noqa: BLE001 - a failing callback must not fail the launch
            log.exception("local backend: status callback failed for %d statuses", len(statuses))

    def _signal(self, t: _Task, sig: int) -> None:
        """Signal every process of the task, unless its wrapper is gone (its pid may belong to a stranger now):
        the wrapper's process group, and every other process in the task's cgroup or, without one, of the tree
        below the wrapper (a child subreaper). SIGKILL: the whole cgroup; without one, the tree stopped and
        killed, then the group. The group only while the wrapper's pidfd says it lives (ProcessMonitor.
        signal_group): from its end until the monitor has handled it the task is not `exited` yet, and its number
        may already be another process's."""
        if t.exited or not t.pid:
            return
        if sig == signal.SIGKILL:
            if t.cgroup:
                cgroups.kill(t.cgroup)
            elif wrapper.is_wrapper(t.pid, t.sandbox, attempts=1):
                with contextlib.suppress(OSError):
                    os.kill(t.pid, signal.SIGSTOP)  # the wrapper too: it reaps and kills no more meanwhile
                if not descendants.kill_tree(t.pid):
                    log.warning("local backend: task %s: some processes below its wrapper did not die", t.task_id)
            self._monitor.signal_group(t.task_id, t.pid, signal.SIGKILL)
            return
        self._monitor.signal_group(t.task_id, t.pid, sig)
        if t.cgroup:
            cgroups.signal_all(t.cgroup, sig, skip_pgid=t.pid)
        elif wrapper.is_wrapper(t.pid, t.sandbox, attempts=1):
            descendants.signal_tree(t.pid, sig, skip_pgid=t.pid)

    def _on_timer(self, key: str) -> None:
        if key.startswith(_CGROUP):
            self._continue_release(key[len(_CGROUP):])
            return
        again = key.endswith(_TERM_AGAIN)
        task_id = key[: -len(_TERM_AGAIN)] if again else key
        with self._lock:
            t = self._tasks.get(task_id)
            if t is None or t.exited or t.sigkill_sent:
                return
            if not again:
                t.sigkill_sent = True
        self._signal(t, signal.SIGTERM if again else signal.SIGKILL)

    def _on_exit(self, task_id: str) -> None:
        """The wrapper has exited: reap it, read how the command ended, report."""
        self._on_exits([task_id])

    def _on_exits(self, keys: list[str]) -> None:
        """Wrappers that have exited (and task cgroups being emptied that changed): for each, how its command
        ended; then one journal hand-over and one report for them all."""
        ends: list[Record] = []
        reports: list[TaskStatus] = []
        for key in keys:
            if key.startswith(_CGROUP):  # not a task: a task cgroup being emptied changed
                try:
                    self._continue_release(key[len(_CGROUP):])
                except Exception:  # noqa: BLE001 - the other exits of this batch are still to be handled
                    LOOP_ERRORS.labels("local-monitor").inc()
                    log.exception("local backend: releasing cgroup %s failed", key[len(_CGROUP):])
                continue
            with self._lock:
                t = self._tasks.get(key)
                if t is None or t.exited:
                    continue
                t.exited = True
            try:
                st = self._ended(t)
            except Exception as e:  # noqa: BLE001 - marked exited, it must leave the book and be reported all the same
                # (else the backend says RUNNING for it for ever, and the other exits of this batch are lost with it)
                LOOP_ERRORS.labels("local-monitor").inc()
                log.exception("local backend: handling the end of task %s failed; reported LOST", t.task_id)
                st = TaskStatus(t.task_id, TaskState.LOST, self._clock(), t.hostname, reason="end not read",
                                message=f"the backend could not tell how the task ended: {e}")
            self._unregister([t])
            if t.aborted:
                ends.append(_aborted_end(t))
                continue
            ends.append({"op": "end", "task": t.task_id, "final": _status_to_json(st)})
            with self._lock:
                self._remember_locked(st)
                if not t.announced:
                    t.deferred = st  # reported right after RUNNING
                    continue
            reports.append(st)
        self._journal.append(ends)
        self._report_all(reports)

    def _ended(self, t: _Task) -> TaskStatus:
        """A wrapper that exited: what its command left goes, and how it ended is read."""
        # anything the command left in its group goes (the wrapper does this itself when it can), and in its
        # cgroup: whatever session or group it moved to. Not when the pid is a live process's: the wrapper was
        # reaped as it ended, and its pid given to another since, which may lead a group of that number (another
        # task's wrapper); our group was empty then (a pid is not given out while a group has its number)
        if not _alive(t.pid):
            with contextlib.suppress(OSError):
                os.killpg(t.pid, signal.SIGKILL)
        if t.cgroup:
            self._release_cgroup(t.cgroup)
        ended = wrapper.read_exit(t.sandbox)
        if ended is None:
            _mark_ended(t.sandbox)
        return self._status_from_exit(t.task_id, t.hostname, ended, t.kill_wall)

    def _release_cgroup(self, path: str) -> None:
        """Kill whatever is left in a task's cgroup and remove the cgroup once it is empty: its cgroup.events
        file, watched by the monitor, says when (with timers as a backstop), so nothing polls."""
        with self._lock:
            self._releasing.setdefault(path, 0)
        self._continue_release(path)

    def _continue_release(self, path: str) -> None:
        with self._lock:
            tries = self._releasing.get(path)
            if tries is None:
                return  # removed already (a late event or timer)
            self._releasing[path] = tries + 1
        key = _CGROUP + path
        for _ in range(2):
            cgroups.kill(path)
            if cgroups.remove(path):
                break
            fd = cgroups.events_fd(path)  # armed before `populated` is read: no change is missed
            if fd is None:
                break  # gone
            if cgroups.populated(path) is not False:
                self._monitor.watch_fd(key, fd, select.EPOLLPRI)
                delay = CGROUP_RETRY.delay(tries, random.random())
                self._monitor.call_at(time.monotonic() + delay, key)
                if tries == 20:
                    log.warning("local backend: cgroup %s is still not empty after its processes were killed",
                                path)
                return
            os.close(fd)  # emptied meanwhile: remove it now
        else:
            self._monitor.call_at(time.monotonic() + CGROUP_RETRY.max_s, key)  # empty, and yet busy: later
            return
        with self._lock:
            self._releasing.pop(path, None)
        self._monitor.unwatch(key)

    def _unregister(self, tasks: Sequence[_Task]) -> None:
        with self._lock:
            for t in tasks:
                if self._tasks.get(t.task_id) is t:
                    del self._tasks[t.task_id]
                    h = self._hosts.get(t.hostname)
                    if h is not None:
                        h.remove(t.task_id)

    def _remember_locked(self, st: TaskStatus) -> None:
        self._ended_sandboxes.pop(st.task_id, None)  # a task id launched again ended again: measured anew
        if self._sandbox_loop is not None and self._sandbox_max_count:
            self._ended_since_sweep += 1
            if self._ended_since_sweep >= max(1, self._sandbox_max_count // 10):  # the count bound, soon not 10 min
                self._ended_since_sweep = 0
                self._sandbox_loop.wake()
        self._finished[st.task_id] = st
        self._finished.move_to_end(st.task_id)
        while len(self._finished) > _FINISHED_CACHE:
            self._finished.popitem(last=False)

    def _status_from_exit(self, task_id: str, hostname: str, rec: wrapper.ExitRecord | None,
                          kill_requested: float | None) -> TaskStatus:
        now = self._clock()
        if rec is None:
            if kill_requested is not None:
                return TaskStatus(task_id, TaskState.KILLED, now, hostname, reason="killed", message="killed")
            return TaskStatus(task_id, TaskState.LOST, now, hostname, reason="process vanished",
                              message="the task's process ended without a result")
        if kill_requested is not None:
            if rec.exit_code == 0 and rec.finished_at < kill_requested:
                return TaskStatus(task_id, TaskState.SUCCEEDED, now, hostname, exit_code=0)
            return TaskStatus(task_id, TaskState.KILLED, now, hostname, exit_code=rec.exit_code, reason="killed",
                              message="killed")
        if rec.exit_code is not None:
            if rec.exit_code == 0:
                return TaskStatus(task_id, TaskState.SUCCEEDED, now, hostname, exit_code=0)
            msg = f"exit code {rec.exit_code}"
            if rec.exit_code == 127:
                msg += " (command not found)"
            elif rec.exit_code == 126:
                msg += " (command not executable)"
            return TaskStatus(task_id, TaskState.FAILED, now, hostname, exit_code=rec.exit_code, reason="failed",
                              message=msg)
        return TaskStatus(task_id, TaskState.FAILED, now, hostname, reason="signaled",
                          message=f"killed by signal {rec.signal}")

    def _sandbox_path(self, task_id: str) -> Path | None:
        if not task_id or "/" in task_id or "\\" in task_id or task_id in (".", "..") or "\0" in task_id:
            return None
        return self._sandboxes / task_id

    @staticmethod
    def _bad_file_name(name: str) -> bool:
        if not name or name.startswith("/") or "\0" in name or "\\" in name:
            return True
        parts = name.split("/")
        if any(p in ("", ".", "..") for p in parts):
            return True
        return parts[0] in _RESERVED_FILES

    def _snapshot(self) -> list[Record]:
        with self._lock:
            return [t.record() for t in self._tasks.values() if not t.aborted]

    # ----------------------------------------------------------------------------------------------- adoption

    def _adopt(self) -> tuple[list[TaskStatus], list[str]]:
        """Replay the journal: adopt live tasks, and work out how the others ended while no daemon watched. Also
        the cgroups of the tasks not adopted, whose leftovers are to be killed (once the monitor runs)."""
        entries = self._journal.replay()
        entries.update(self._old_index_entries())
        now = self._clock()
        out: list[TaskStatus] = []
        release: list[str] = []
        # the wrappers that may still be about to write their pid were all spawned before the restart: they are
        # waited for together, not PID_WAIT_S each in turn (a launch cut short leaves many that never will)
        pid_deadline = time.monotonic() + PID_WAIT_S
        for tid, e in entries.items():
            cg = e.get("cg")
            if not isinstance(cg, str) or not cgroups.is_task_cgroup(cg):
                if cg is not None:
                    log.warning("local backend: task %s: ignoring the journal's cgroup %r (not a task cgroup)",
                                tid, cg)
                cg = None  # a record of a release before cgroups, or of a daemon that used none
            if "final" in e:  # ended and reported before (its cgroup may not have been emptied yet)
                final = _status_from_json(tid, str(e.get("host") or ""), e["final"], now)
                if final is not None:
                    self._remember_locked(final)
                if cg:
                    release.append(cg)
                continue
            sandbox = self._sandbox_path(tid)
            if sandbox is None:
                continue
            hostname = str(e.get("host") or "")
            pid = int(e.get("pid") or 0)
            if pid == 0 and sandbox.is_dir():
                pid = self._wait_for_pid(sandbox, pid_deadline)
            kill_wall = float(e["kill"]) if isinstance(e.get("kill"), (int, float)) else None
            kill_grace = float(e["grace"]) if isinstance(e.get("grace"), (int, float)) else None
            pidfd = _open_wrapper(pid, sandbox) if pid > 0 else None
            if pidfd is None and pid > 0 and not self._data_dir_given.is_absolute():
                pidfd = _open_wrapper(pid, self._data_dir_given / SANDBOXES_DIR / tid)  # (started by a release before)
            host = self._hosts.get(hostname)
            st: TaskStatus | None = None
            if pidfd is None:  # its wrapper is gone
                ended = wrapper.read_exit(sandbox)
                if ended is None:
                    _mark_ended(sandbox)  # (when is not known: it counts from now)
                st = self._status_from_exit(tid, hostname, ended, kill_wall)
                if st.state == TaskState.LOST:
                    st = replace(st, message="the task's process ended while the daemon was down" if pid else
                                 "never started: the daemon stopped while launching it")
            elif host is None:
                if cg is None:  # the tree below the wrapper first: once the wrapper is gone, it is out of reach
                    descendants.kill_tree(pid)
                with contextlib.suppress(OSError):
                    os.killpg(pid, signal.SIGKILL)
                os.close(pidfd)
                st = TaskStatus(tid, TaskState.KILLED, now, hostname, reason="host removed",
                                message=f"host {hostname!r} is no longer configured")
            if st is not None:
                out.append(st)
                self._remember_locked(st)
                if cg:  # what the command left behind while no daemon watched goes now
                    release.append(cg)
                continue
            res = e.get("res") or [0, 0, 0, 0, 0]
            usage = RunningTask(tid, hostname, Resources(float(res[0]), float(res[1]), float(res[2]), int(res[3]),
                                                         int(res[4])),
                                tuple(int(g) for g in e.get("gpus") or ()), tuple(int(p) for p in e.get("ports") or ()))
            t = _Task(tid, str(e.get("job", "")), int(e.get("instance", 0)), int(e.get("attempt", 0)), hostname,
                      sandbox, usage, pid=pid, kill_wall=kill_wall, kill_grace=kill_grace, cgroup=cg)
            self._tasks[tid] = t
            assert host is not None and pidfd is not None
            host.add(usage)
            self._monitor.watch_fd(tid, pidfd)  # an end meanwhile is seen as soon as the monitor runs
            if kill_wall is not None:  # what is left of its grace (the daemon was down for part of it)
                grace = self._kill_grace_s if kill_grace is None else kill_grace
                self._monitor.call_at(time.monotonic() + max(0.0, kill_wall + grace - time.time()), tid)
            log.info("local backend: adopted running task %s (pid %d%s) on %s", tid, pid,
                     f", cgroup {cg}" if cg else "", hostname)
        return out, release

    @staticmethod
    def _wait_for_pid(sandbox: Path, deadline: float) -> int:
        while True:
            pid = wrapper.read_pid(sandbox)
            if pid or time.monotonic() >= deadline:
                return pid
            time.sleep(0.05)

    def _old_index_entries(self) -> dict[str, Record]:
        """Tasks listed by the index file of earlier releases (local-running.json), as journal entries."""
        import json

        path = self._data_dir / OLD_INDEX_FILE
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        out: dict[str, Record] = {}
        for tid, e in (doc.get("tasks") or {}).items() if isinstance(doc, dict) else ():
            if not isinstance(e, dict):
                continue
            sandbox = self._sandbox_path(str(tid))
            task_doc: dict[str, Any] = {}
            with contextlib.suppress(OSError, ValueError):
                task_doc = json.loads((sandbox / "task.json").read_text()) if sandbox else {}
            r = task_doc.get("resources") or {}
            out[str(tid)] = {
                "task": str(tid), "job": task_doc.get("job_id", ""), "instance": task_doc.get("instance", 0),
                "attempt": task_doc.get("attempt", 0), "host": e.get("hostname") or task_doc.get("hostname", ""),
                "res": [r.get("cpu", 0.0), r.get("mem", 0.0), r.get("disk", 0.0), r.get("gpu", 0), r.get("ports", 0)],
                "gpus": task_doc.get("gpu_ids") or [], "ports": task_doc.get("ports") or [],
                "pid": e.get("pid") or 0, "kill": e.get("kill_requested"),
            }
        with contextlib.suppress(OSError):
            path.rename(path.with_name(OLD_INDEX_FILE + ".migrated"))
        return out


def _aborted_end(t: _Task) -> Record:
    """The journal's `end` of a member of a launch that was stopped (_abort): no status (`final` null), as none was
    reported; a replay forgets it (and releases its cgroup, if any)."""
    return {"op": "end", "task": t.task_id, "final": None}


def _mark_ended(sandbox: Path) -> None:
    """A task ended without an `exit` (SIGKILLed at the end of its grace, its wrapper killed): the retention counts
    such a sandbox's age from its directory's last change, which is otherwise the task's start (when its last file
    was made there), so the end is made that change."""
    with contextlib.suppress(OSError):
        os.utime(sandbox, follow_symlinks=False)


def _alive(pid: int) -> bool:
    """Process `pid` exists and is not a zombie (one of an ended wrapper not reaped yet is still its)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text(errors="replace").rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _open_wrapper(pid: int, sandbox: Path) -> int | None:
    """A pidfd of `pid` if it is (still) the wrapper of `sandbox`, else None. Opened before the check, so that the
    descriptor refers to the very process checked, whatever happens to the pid later."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return None
    if wrapper.is_wrapper(pid, sandbox):
        return fd
    os.close(fd)
    return None


def _status_to_json(st: TaskStatus) -> dict[str, Any]:
    return {"state": st.state.value, "exit_code": st.exit_code, "reason": st.reason, "message": st.message}


def _status_from_json(task_id: str, hostname: str, d: Any, now: float) -> TaskStatus | None:
    if not isinstance(d, dict):
        return None
    try:
        code = d.get("exit_code")
        return TaskStatus(task_id, TaskState(str(d["state"])), now, hostname,
                          exit_code=code if isinstance(code, int) else None, reason=str(d.get("reason", "")),
                          message=str(d.get("message", "")))
    except (KeyError, ValueError):
        return None
