"""What one host of a backend that runs tasks itself (local, sim) has given out: resources, GPU ids, ports.

Pure bookkeeping, updated incrementally as tasks are registered and end, so a host's free resources cost O(1) to
read (O(ports) only when the concrete free ports are asked for).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace

from peloton.domain.launch import HostInfo, LaunchSpec, RunningTask
from peloton.domain.placement import HostOffer
from peloton.domain.resources import Resources

MAX_OFFER_PORTS = 1000  # concrete free ports listed per host: a gang may need many ports on one host


@dataclass(frozen=True, slots=True)
class HostConfig:
    """One host of a backend that runs tasks itself. `port_range` is inclusive."""

    hostname: str
    resources: Resources
    gpu_ids: tuple[int, ...] = ()
    port_range: tuple[int, int] = (31000, 31999)
    labels: dict[str, str] = field(default_factory=dict)
    address: str = "127.0.0.1"

    @property
    def capacity(self) -> Resources:
        lo, hi = self.port_range
        return replace(self.resources, gpu=len(self.gpu_ids), ports=max(0, hi - lo + 1))


class HostUsage:
    """A host's configuration and what its tasks use now."""

    __slots__ = ("config", "capacity", "cpu", "mem", "disk", "gpus_used", "ports_used", "tasks", "_up", "_info")

    def __init__(self, config: HostConfig) -> None:
        self.config = config
        self.capacity = config.capacity
        self.cpu = self.mem = self.disk = 0.0
        self.gpus_used: set[int] = set()
        self.ports_used: set[int] = set()
        self.tasks: dict[str, RunningTask] = {}
        self._up = True
        # the last info(), kept until the host changes: a list of 10,000 hosts is then a list of references
        # (building each anew took 40-80 us a host: half a second at 10,000)
        self._info: HostInfo | None = None

    @property
    def up(self) -> bool:
        return self._up

    @up.setter
    def up(self, value: bool) -> None:
        self._up = value
        self._info = None

    @property
    def allocated(self) -> Resources:
        return Resources(self.cpu, self.mem, self.disk, len(self.gpus_used), len(self.ports_used))

    def add(self, t: RunningTask) -> None:
        self._info = None
        self.tasks[t.task_id] = t
        self.cpu += t.resources.cpu
        self.mem += t.resources.mem
        self.disk += t.resources.disk
        self.gpus_used.update(t.gpu_ids)
        self.ports_used.update(t.ports)

    def remove(self, task_id: str) -> RunningTask | None:
        t = self.tasks.pop(task_id, None)
        if t is None:
            return None
        self._info = None
        self.cpu -= t.resources.cpu
        self.mem -= t.resources.mem
        self.disk -= t.resources.disk
        self.gpus_used.difference_update(t.gpu_ids)
        self.ports_used.difference_update(t.ports)
        if not self.tasks:  # no float drift on an idle host
            self.cpu = self.mem = self.disk = 0.0
        return t

    def offer(self, with_ids: bool, taken: Collection[int] = frozenset()) -> HostOffer:
        """`taken`: ports of this host's range that something other than its tasks holds: not offered."""
        cfg, cap = self.config, self.capacity
        lo, hi = cfg.port_range
        gpu_ids: tuple[int, ...] = ()
        ports: tuple[int, ...] = ()
        if with_ids:
            gpu_ids = tuple(g for g in cfg.gpu_ids if g not in self.gpus_used)
            if not self.ports_used and not taken:  # (the common case: the range from its start, no test per port)
                ports = tuple(range(lo, min(hi, lo + MAX_OFFER_PORTS - 1) + 1))
            else:
                free_ports: list[int] = []
                for p in range(lo, hi + 1):
                    if p not in self.ports_used and p not in taken:
                        free_ports.append(p)
                        if len(free_ports) >= MAX_OFFER_PORTS:
                            break
                ports = tuple(free_ports)
        free = Resources(
            cpu=max(0.0, cap.cpu - self.cpu),
            mem=max(0.0, cap.mem - self.mem),
            disk=max(0.0, cap.disk - self.disk),
            gpu=len(cfg.gpu_ids) - len(self.gpus_used) if self.up else 0,
            ports=min(MAX_OFFER_PORTS, cap.ports - len(self.ports_used)
                      - sum(1 for p in taken if lo <= p <= hi and p not in self.ports_used)) if self.up else 0,
        )
        if not self.up:
            free = Resources()
            gpu_ids, ports = (), ()
        return HostOffer(
            hostname=cfg.hostname, address=cfg.address, free=free, gpu_ids=gpu_ids, ports=ports,
            labels=dict(cfg.labels), capacity=cap, has_gpus=bool(cfg.gpu_ids),
        )

    def info(self) -> HostInfo:
        """The host as the host list shows it (the same object until the host changes: read-only)."""
        if self._info is not None:
            return self._info
        cfg = self.config
        self._info = HostInfo(hostname=cfg.hostname, address=cfg.address, capacity=self.capacity,
                        allocated=self.allocated, labels=dict(cfg.labels), state="UP" if self.up else "DOWN",
                        task_ids=tuple(sorted(self.tasks)), gpu_ids=cfg.gpu_ids,
                        gpu_holders=tuple((g, t.task_id) for t in self.tasks.values() for g in t.gpu_ids))
        return self._info

    def conflict(self, spec: LaunchSpec, batch: Resources, batch_gpus: set[int], batch_ports: set[int]) -> str | None:
        """Why `spec` cannot be accounted for on this host on top of what it uses and what the rest of its batch
        (`batch`, `batch_gpus`, `batch_ports`) takes; None when it can."""
        cfg, cap = self.config, self.capacity
        if not self.up:
            return f"host {cfg.hostname} is down"
        if len(spec.gpu_ids) != spec.resources.gpu:
            return f"asks for {spec.resources.gpu} GPUs but was given {len(spec.gpu_ids)} GPU ids"
        if len(set(spec.gpu_ids)) != len(spec.gpu_ids):
            return f"duplicate GPU ids {list(spec.gpu_ids)}"
        for g in spec.gpu_ids:
            if g not in cfg.gpu_ids:
                return f"host {cfg.hostname} has no GPU {g}"
            if g in self.gpus_used or g in batch_gpus:
                return f"GPU {g} on host {cfg.hostname} is already in use"
        if len(set(spec.ports)) != len(spec.ports):
            return f"duplicate ports {list(spec.ports)}"
        if len(spec.ports) < spec.resources.ports:
            return f"asks for {spec.resources.ports} ports but was given {len(spec.ports)}"
        lo, hi = cfg.port_range
        for p in spec.ports:
            if not lo <= p <= hi:
                return f"port {p} is outside the range {lo}-{hi} of host {cfg.hostname}"
            if p in self.ports_used or p in batch_ports:
                return f"port {p} on host {cfg.hostname} is already in use"
        need = Resources(spec.resources.cpu, spec.resources.mem, spec.resources.disk)
        free = Resources(cap.cpu - self.cpu - batch.cpu, cap.mem - self.mem - batch.mem,
                         cap.disk - self.disk - batch.disk)
        if not need.fits_in(free):
            short = ",".join(need.short_of(free))
            return f"needs {need.describe()} but host {cfg.hostname} has only {free.describe()} free ({short})"
        return None


def offers_of(hosts: Mapping[str, HostUsage], hostnames: Collection[str] | None, with_ids: bool,
              taken: Collection[int] = frozenset()) -> list[HostOffer]:
    """The offers of the named hosts that exist (every host when None), for a backend's `offers`; `taken`: ports
    something else holds (HostUsage.offer)."""
    if hostnames is None:
        return [h.offer(with_ids, taken) for h in hosts.values()]
    return [hosts[n].offer(with_ids, taken) for n in hostnames if n in hosts]


def check_gang(hosts: dict[str, HostUsage], tasks: tuple[LaunchSpec, ...]) -> tuple[str, str] | None:
    """(task id, why) of the first member that cannot be accounted for on its host, with the members before it
    in the same gang counted; None when every member can be."""
    seen: set[str] = set()
    batch: dict[str, tuple[Resources, set[int], set[int]]] = {}
    for spec in tasks:
        if spec.task_id in seen:
            return spec.task_id, "task id appears twice in the launch"
        seen.add(spec.task_id)
        h = hosts.get(spec.hostname)
        if h is None:
            return spec.task_id, f"unknown host {spec.hostname!r}"
        res, gpus, ports = batch.get(spec.hostname, (Resources(), set(), set()))
        why = h.conflict(spec, res, gpus, ports)
        if why is not None:
            return spec.task_id, why
        r = spec.resources
        batch[spec.hostname] = (res + Resources(r.cpu, r.mem, r.disk), gpus | set(spec.gpu_ids),
                                ports | set(spec.ports))
    return None


def accounted(spec: LaunchSpec) -> RunningTask:
    """What a launched member takes on its host: gpu and ports count what it was actually given."""
    s = spec.resources
    r = Resources(s.cpu, s.mem, s.disk, len(spec.gpu_ids), len(spec.ports))  # (dataclasses.replace: 4x the cost)
    return RunningTask(spec.task_id, spec.hostname, r, tuple(spec.gpu_ids), tuple(spec.ports))
