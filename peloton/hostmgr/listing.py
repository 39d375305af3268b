"""ListHosts and the cluster summary over plain data (pure): each host's status and GPUs (domain/gpumap.py), the
filters, the order (by rack, then name) and the pages, and the sums of the summary. The servicer (service.py)
reads the host manager and the queue, and converts."""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from peloton.domain import gpumap
from peloton.domain.launch import HostInfo
from peloton.domain.resources import Resources

MAX_PAGE = 1000


@dataclass(frozen=True, slots=True)
class HostFilter:
    states: frozenset[str] = frozenset()  # Host.status values; empty: any
    rack: str = ""  # "": any
    labels: tuple[tuple[str, str | None], ...] = ()  # (key, value), or (key, None): any value
    min_free_gpus: int = 0
    name_contains: str = ""


NO_FILTER = HostFilter()


@dataclass(slots=True)
class HostRow:
    """One host as ListHosts shows it (read-only: the servicer may hand the same rows to several calls)."""
    key: tuple[str, str]  # (rack, hostname): the order, and where a page token says to go on from
    info: HostInfo
    held: bool  # an offer held or leased (Host.offer_held)
    status: str
    drain_deadline: float | None  # None: in service
    health: str
    maintenance: bool
    reserved_for: str
    stranded: bool

    @property
    def rack(self) -> str:
        return self.key[0]

    def gpus(self) -> list[gpumap.GpuSlot]:
        h = self.info
        return gpumap.gpu_slots(h.gpu_ids, h.capacity.gpu, h.allocated.gpu, dict(h.gpu_holders), self.status,
                                bool(self.reserved_for), self.stranded)


def rows(hosts: Sequence[tuple[HostInfo, bool]], drains: Mapping[str, float], health: Mapping[str, str],
         windows: set[str], waiting: gpumap.Waiting) -> list[HostRow]:
    """Every host with its status, reservation and whether its free GPUs are stranded, by rack then name."""
    out = []
    asks, kept = waiting.asks, waiting.reserved
    for h, held in hosts:  # (10,000 hosts: kept to plain lookups, a Resources only where a gang might fit)
        name = h.hostname
        deadline = drains.get(name)
        reason = health.get(name, "")
        if deadline is not None:
            status = "draining" if h.task_ids else "drained"
        elif reason:
            status = "unhealthy"
        else:
            status = "down" if h.state not in ("", "UP") else "up"
        reserved = kept.get(name, "")
        c, a = h.capacity, h.allocated
        strand = False
        if asks and status == "up" and c.gpu > a.gpu and not reserved:
            free = Resources(c.cpu - a.cpu, c.mem - a.mem, c.disk - a.disk, c.gpu - a.gpu)
            strand = gpumap.stranded(status, free, h.labels, False, asks)
        out.append(HostRow((h.labels.get("rack", ""), name), h, held, status, deadline, reason, name in windows,
                           reserved, strand))
    out.sort(key=_key)
    return out


def _key(r: HostRow) -> tuple[str, str]:
    return r.key


def matches(r: HostRow, f: HostFilter) -> bool:
    if f.states and r.status not in f.states:
        return False
    if f.rack and r.rack != f.rack:
        return False
    if f.name_contains and f.name_contains not in r.info.hostname:
        return False
    labels = r.info.labels
    for k, v in f.labels:
        if k not in labels or (v is not None and labels[k] != v):
            return False
    return not f.min_free_gpus or (r.status == "up" and r.info.capacity.gpu - r.info.allocated.gpu >= f.min_free_gpus)


def page(all_rows: Sequence[HostRow], f: HostFilter, size: int,
         after: tuple[str, str] | None) -> tuple[list[HostRow], tuple[str, str] | None, int]:
    """The rows that match `f` after the key `after` (None: from the first), at most `size` (0: all); the key to
    go on from (None: the last page); how many match in all."""
    chosen = list(all_rows) if f == NO_FILTER else [r for r in all_rows if matches(r, f)]
    start = 0 if after is None else bisect.bisect_right(chosen, after, key=_key)  # (in key order)
    if not size:
        return chosen[start:], None, len(chosen)
    out = chosen[start:start + size]
    more = start + size < len(chosen)
    return out, (out[-1].key if more and out else None), len(chosen)


@dataclass
class Summary:
    hosts: int = 0
    host_states: dict[str, int] = field(default_factory=dict)
    capacity: Resources = Resources()
    allocated: Resources = Resources()
    gpus: dict[str, int] = field(default_factory=dict)
    racks: int = 0


def summarize(all_rows: Sequence[HostRow]) -> Summary:
    """The sums of every host: by status, capacity and allocation, GPUs by state (gpumap's words)."""
    s = Summary(hosts=len(all_rows))
    cap, alloc = [0.0] * 5, [0.0] * 5
    racks: set[str] = set()
    for r in all_rows:
        s.host_states[r.status] = s.host_states.get(r.status, 0) + 1
        c, a = r.info.capacity, r.info.allocated
        for i, (x, y) in enumerate(((c.cpu, a.cpu), (c.mem, a.mem), (c.disk, a.disk), (c.gpu, a.gpu),
                                    (c.ports, a.ports))):
            cap[i] += x
            alloc[i] += y
        racks.add(r.rack)
        used = min(a.gpu, c.gpu)
        if used:
            s.gpus["used"] = s.gpus.get("used", 0) + used
        idle = c.gpu - used
        if idle:
            state = r.status if r.status != "up" else (
                "reserved" if r.reserved_for else "stranded" if r.stranded else "free")
            s.gpus[state] = s.gpus.get(state, 0) + idle
    s.capacity = Resources(cap[0], cap[1], cap[2], int(cap[3]), int(cap[4]))
    s.allocated = Resources(alloc[0], alloc[1], alloc[2], int(alloc[3]), int(alloc[4]))
    s.racks = len(racks)
    return s
