"""The hosts map's words (pure): a host's status, what each of its GPUs is now, and when free GPUs are *stranded*.

Definitions (docs/ui.md, "The hosts map"):

- A host's **status**: `drained` or `draining` (an operator's drain or a maintenance window; drained once no task is
  left), else `unhealthy` (launches kept failing there: skipped for a back-off), else `down` (the backend lost it),
  else `up`.
- Each GPU is **used** when a task holds it; a free GPU of a host that is not up takes the host's status
  (draining, drained, unhealthy, down); a free GPU of a host that is up is **reserved** when the host is kept for a
  waiting gang (the head-of-line reservation, placement/reservation.py), else **stranded** when it is stranded
  (below), else **free**.
- A host's free GPUs are **stranded** when the host is up, has a free GPU and is kept for no gang, at least one gang
  in the queue (waiting for admission or for placement) asks for GPUs, and no member of any such gang fits on the
  host: for each, either the host's free GPUs are fewer than the member asks, or its free cpu, memory or disk are
  less than the member asks, or the host's labels fail one of its gang's constraints. Free GPUs with no gang
  waiting for GPUs are idle, not stranded: nobody asks for them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from peloton.domain.resources import Resources
from peloton.domain.spec import Constraint

HOST_STATUSES = ("up", "draining", "drained", "unhealthy", "down")


@dataclass(frozen=True, slots=True)
class GpuAsk:
    """What one member of a waiting gang asks of a host (gpu > 0), with its gang's constraints."""

    resources: Resources
    constraints: tuple[Constraint, ...] = ()


@dataclass(frozen=True, slots=True)
class Waiting:
    """What the queue says of the hosts: the distinct member asks of the gangs waiting for GPUs, and the hosts kept
    for a waiting gang (host -> "<job_id>/<gang_index>")."""

    asks: tuple[GpuAsk, ...] = ()
    reserved: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class GpuSlot:
    id: int
    state: str
    task_id: str = ""


def host_status(drain: str, health: str, state: str) -> str:
    """`drain`: "", draining or drained; `health`: "" or why the host is skipped; `state`: the backend's (UP...)."""
    if drain:
        return drain
    if health:
        return "unhealthy"
    return "down" if state not in ("", "UP") else "up"


def fits(ask: GpuAsk, free: Resources, labels: Mapping[str, str]) -> bool:
    """Whether one member asking `ask` could go on a host with `free` and these labels."""
    r = ask.resources
    if r.gpu > free.gpu or r.cpu > free.cpu + 1e-9 or r.mem > free.mem + 1e-9 or r.disk > free.disk + 1e-9:
        return False
    plain = dict(labels)
    return all(c.matches(plain) for c in ask.constraints)


def stranded(status: str, free: Resources, labels: Mapping[str, str], reserved: bool, asks: Sequence[GpuAsk]) -> bool:
    """Whether a host's free GPUs are stranded (module docstring)."""
    if status != "up" or free.gpu <= 0 or reserved or not asks:
        return False
    return not any(fits(a, free, labels) for a in asks)


def gpu_slots(gpu_ids: Sequence[int], count: int, used: int, holders: Mapping[int, str], status: str,
              reserved: bool, is_stranded: bool) -> list[GpuSlot]:
    """Each GPU of a host and its state. `gpu_ids`: the host's GPU ids where the backend knows them (else
    positions 0..count-1); `holders`: GPU id -> the task that holds it; `used`: how many are used (a backend that
    counts GPUs without ids: the first `used` positions)."""
    ids = list(gpu_ids) if gpu_ids else list(range(count))
    idle = status if status != "up" else "reserved" if reserved else "stranded" if is_stranded else "free"
    out = []
    if holders or gpu_ids:
        for g in ids:
            task = holders.get(g, "")
            out.append(GpuSlot(g, "used" if task else idle, task))
    else:
        out = [GpuSlot(g, "used" if i < used else idle) for i, g in enumerate(ids)]
    return out


def count_states(slots: Iterable[GpuSlot], into: dict[str, int]) -> None:
    for s in slots:
        into[s.state] = into.get(s.state, 0) + 1


def distinct_asks(asks: Iterable[GpuAsk]) -> tuple[GpuAsk, ...]:
    """The asks without repeats (a gang of 512 alike members is one ask), first seen first."""
    return tuple(dict.fromkeys(asks))
