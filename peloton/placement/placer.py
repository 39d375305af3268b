"""The placement decision: gangs onto host offers, every member or none.

Pure: no I/O, no clock. Given the same gangs and offers it returns the same answer.

Per call, each host's free resources, GPU ids and ports live in a mutable `_Host`; a gang that cannot be placed
whole is rolled back from an undo log holding only the hosts it touched, so a call costs about
O(gangs x members x hosts) and never copies every host per gang.
"""

from __future__ import annotations

from collections.abc import Sequence

from peloton.domain.placement import GangPlacement, GangRequest, HostOffer, MemberAssignment, PlacementFailure
from peloton.domain.resources import Resources
from peloton.domain.spec import Constraint

__all__ = ["place", "can_ever_fit", "SHORT_DIMENSIONS"]

_EPS = 1e-9
SHORT_DIMENSIONS = ("cpu", "mem", "disk", "gpu", "ports", "constraint")

_Snapshot = tuple[float, float, float, int, int, int, int]


class _Host:
    """Mutable free state of one host for the duration of one `place` call."""

    __slots__ = (
        "idx",
        "offer",
        "name",
        "cpu",
        "mem",
        "disk",
        "gpu",
        "ports",
        "gpu_ids",
        "gpu_next",
        "port_list",
        "port_next",
        "has_gpus",
    )

    def __init__(self, idx: int, offer: HostOffer) -> None:
        self.idx = idx
        self.offer = offer
        self.name = offer.hostname
        free = offer.free
        self.cpu = free.cpu
        self.mem = free.mem
        self.disk = free.disk
        # Only concrete ids can be handed out: the usable count is the smaller of the count and the id list.
        # The sorted lists are built on first use (most hosts of a big cluster are never touched in a call).
        self.gpu = max(0, min(free.gpu, len(offer.gpu_ids)))
        self.ports = max(0, min(free.ports, len(offer.ports)))
        self.gpu_ids: list[int] | None = None
        self.port_list: list[int] | None = None
        self.gpu_next = 0
        self.port_next = 0
        self.has_gpus = offer.has_gpus or free.gpu > 0 or offer.capacity.gpu > 0 or bool(offer.gpu_ids)

    def materialize(self) -> bool:
        """Build the sorted id lists; True if duplicates in the offer lowered a count (the caller re-checks)."""
        if self.gpu_ids is not None and self.port_list is not None:
            return False
        offer = self.offer
        self.gpu_ids = sorted(set(offer.gpu_ids))
        self.port_list = sorted(set(offer.ports))
        gpu = max(0, min(self.gpu, len(self.gpu_ids)))
        ports = max(0, min(self.ports, len(self.port_list)))
        changed = gpu != self.gpu or ports != self.ports
        self.gpu, self.ports = gpu, ports
        return changed

    def snapshot(self) -> _Snapshot:
        return (self.cpu, self.mem, self.disk, self.gpu, self.ports, self.gpu_next, self.port_next)

    def restore(self, s: _Snapshot) -> None:
        self.cpu, self.mem, self.disk, self.gpu, self.ports, self.gpu_next, self.port_next = s

    def fits(self, r: Resources) -> bool:
        return (
            r.cpu <= self.cpu + _EPS
            and r.mem <= self.mem + _EPS
            and r.disk <= self.disk + _EPS
            and r.gpu <= self.gpu
            and r.ports <= self.ports
        )

    def short_of(self, r: Resources) -> list[str]:
        out = []
        if r.cpu > self.cpu + _EPS:
            out.append("cpu")
        if r.mem > self.mem + _EPS:
            out.append("mem")
        if r.disk > self.disk + _EPS:
            out.append("disk")
        if r.gpu > self.gpu:
            out.append("gpu")
        if r.ports > self.ports:
            out.append("ports")
        return out


class _Norm:
    """Per-call scale of each dimension so that cores, MiB and GPUs can be summed into one score."""

    __slots__ = ("cpu", "mem", "disk", "gpu")

    def __init__(self, offers: Sequence[HostOffer]) -> None:
        mc = mm = md = mg = 0.0
        for o in offers:
            mc = max(mc, o.capacity.cpu, o.free.cpu)
            mm = max(mm, o.capacity.mem, o.free.mem)
            md = max(md, o.capacity.disk, o.free.disk)
            mg = max(mg, o.capacity.gpu, o.free.gpu)
        self.cpu = 1.0 / mc if mc > 0 else 0.0
        self.mem = 1.0 / mm if mm > 0 else 0.0
        self.disk = 1.0 / md if md > 0 else 0.0
        self.gpu = 1.0 / mg if mg > 0 else 0.0

    def free_score(self, h: _Host) -> float:
        return h.cpu * self.cpu + h.mem * self.mem + h.disk * self.disk + h.gpu * self.gpu


class _Attempt:
    """One gang being tried: its tentative assignments and the undo log of the hosts it touched."""

    __slots__ = ("gang", "undo", "count", "used", "assignments")

    def __init__(self, gang: GangRequest) -> None:
        self.gang = gang
        self.undo: dict[int, _Snapshot] = {}
        self.count: dict[int, int] = {}  # host idx -> members of this gang on it
        self.used: list[_Host] = []  # hosts in order of first use
        self.assignments: list[MemberAssignment] = []

    def assign(self, h: _Host, instance: int, task_id: str, r: Resources) -> None:
        if h.idx not in self.undo:
            self.undo[h.idx] = h.snapshot()
            self.used.append(h)
        h.materialize()
        assert h.gpu_ids is not None and h.port_list is not None
        h.cpu -= r.cpu
        h.mem -= r.mem
        h.disk -= r.disk
        gpu_ids: tuple[int, ...] = ()
        ports: tuple[int, ...] = ()
        if r.gpu > 0:
            gpu_ids = tuple(h.gpu_ids[h.gpu_next : h.gpu_next + r.gpu])
            h.gpu_next += r.gpu
            h.gpu -= r.gpu
        if r.ports > 0:
            ports = tuple(h.port_list[h.port_next : h.port_next + r.ports])
            h.port_next += r.ports
            h.ports -= r.ports
        self.count[h.idx] = self.count.get(h.idx, 0) + 1
        self.assignments.append(
            MemberAssignment(
                instance=instance,
                task_id=task_id,
                hostname=h.name,
                address=h.offer.address,
                resources=r,
                gpu_ids=gpu_ids,
                ports=ports,
            )
        )

    def rollback(self, hosts: list[_Host]) -> None:
        for idx, snap in self.undo.items():
            hosts[idx].restore(snap)
        self.undo.clear()


def _satisfies(offer: HostOffer, constraints: tuple[Constraint, ...]) -> bool:
    return all(c.matches(offer.labels) for c in constraints)


def _how_many(h: _Host, members: list[Resources], start: int) -> tuple[int, float, float, float, int]:
    """How many of members[start:] fit on `h` one after the other, and what the host has left after them."""
    cpu, mem, disk, gpu, ports = h.cpu, h.mem, h.disk, h.gpu, h.ports
    k = 0
    for j in range(start, len(members)):
        r = members[j]
        if not (
            r.cpu <= cpu + _EPS and r.mem <= mem + _EPS and r.disk <= disk + _EPS and r.gpu <= gpu and r.ports <= ports
        ):
            break
        cpu -= r.cpu
        mem -= r.mem
        disk -= r.disk
        gpu -= r.gpu
        ports -= r.ports
        k += 1
    return max(k, 1), cpu, mem, disk, gpu


class _Tiers:
    """The hosts a gang may use (its constraints hold there), split so that GPU hosts are kept for GPU work."""

    __slots__ = ("cpu_hosts", "gpu_hosts")

    def __init__(self, eligible: list[_Host]) -> None:
        self.cpu_hosts = [h for h in eligible if not h.has_gpus]
        self.gpu_hosts = [h for h in eligible if h.has_gpus]

    def levels(self, r: Resources) -> list[tuple[bool, list[_Host]]]:
        """(GPU hosts?, hosts) in order of preference for a member of size `r`."""
        if r.gpu > 0:
            return [(True, self.gpu_hosts)]
        return [(False, self.cpu_hosts), (True, self.gpu_hosts)]


def _pack_pick(
    att: _Attempt,
    tiers: _Tiers,
    norm: _Norm,
    reqs: list[Resources],
    i: int,
    homogeneous: bool,
    current: _Host | None,
    exhausted: set[bool],
) -> _Host | None:
    r = reqs[i]
    for gpu_level, tier in tiers.levels(r):
        if gpu_level in exhausted:
            continue
        # Locality first: the host this gang is filling, then the other hosts it already uses.
        if current is not None and current.has_gpus == gpu_level and current.fits(r):
            return current
        for h in att.used:
            if h.has_gpus == gpu_level and h.fits(r):
                return h
        chosen: _Host | None = None
        best_key: tuple[int, int, float, str, int] | None = None
        rc, rm, rd, rg, rp = r.cpu, r.mem, r.disk, r.gpu, r.ports
        ncpu, nmem, ndisk = norm.cpu, norm.mem, norm.disk
        cap = len(reqs) - i
        for h in tier:
            if not (
                rc <= h.cpu + _EPS and rm <= h.mem + _EPS and rd <= h.disk + _EPS and rg <= h.gpu and rp <= h.ports
            ):
                continue
            if homogeneous:
                k = cap
                if rc > 0:
                    k = min(k, int((h.cpu + _EPS) / rc))
                if rm > 0:
                    k = min(k, int((h.mem + _EPS) / rm))
                if rd > 0:
                    k = min(k, int((h.disk + _EPS) / rd))
                if rg > 0:
                    k = min(k, h.gpu // rg)
                if rp > 0:
                    k = min(k, h.ports // rp)
                if k < 1:
                    k = 1
                left = (h.cpu - k * rc) * ncpu + (h.mem - k * rm) * nmem + (h.disk - k * rd) * ndisk
                gpu_left = h.gpu - k * rg if rg > 0 else 0
            else:
                k, cpu, mem, disk, gpu = _how_many(h, reqs, i)
                left = cpu * ncpu + mem * nmem + disk * ndisk
                gpu_left = gpu if rg > 0 else 0
            key = (-k, gpu_left, left, h.name, h.idx)
            if best_key is None or key < best_key:
                best_key, chosen = key, h
        if chosen is not None:
            return chosen
        if homogeneous:
            exhausted.add(gpu_level)  # hosts only shrink: no later member of this gang fits this level either
    return None


def _pack(att: _Attempt, tiers: _Tiers, norm: _Norm, homogeneous: bool) -> int | None:
    """Fill as few hosts as possible; returns None when every member was placed, else the first unplaceable index.

    For each member: stay on the host this gang is filling while the member fits, then any other host the gang
    already uses, then the host that can take the most of the remaining members, tie-broken by the least
    capacity left afterwards (best fit; for GPU work the fewest GPUs left first), then by hostname.
    """
    members = att.gang.members
    reqs = [m.resources for m in members]
    current: _Host | None = None
    exhausted: set[bool] = set()
    for i, r in enumerate(reqs):
        while True:
            chosen = _pack_pick(att, tiers, norm, reqs, i, homogeneous, current, exhausted)
            if chosen is None:
                return i
            if not chosen.materialize() or chosen.fits(r):
                break
        current = chosen
        att.assign(chosen, members[i].instance, members[i].task_id, r)
    return None


def _spread_pick(
    att: _Attempt,
    tiers: _Tiers,
    norm: _Norm,
    r: Resources,
    homogeneous: bool,
    ordered: dict[bool, list[_Host]],
    cursor: dict[bool, int],
) -> _Host | None:
    for gpu_level, tier in tiers.levels(r):
        hosts = ordered.get(gpu_level)
        if hosts is None:
            # Hosts this gang has not used yet do not change while it is placed, so one sort serves the gang.
            hosts = sorted(tier, key=lambda h: (-norm.free_score(h), h.name, h.idx))
            ordered[gpu_level] = hosts
        j = cursor.get(gpu_level, 0) if homogeneous else 0
        count = att.count
        while j < len(hosts):
            h = hosts[j]
            if h.idx not in count and h.fits(r):
                break
            j += 1
        if homogeneous:
            # Unused hosts before the cursor cannot take this size, and they do not change during this gang.
            cursor[gpu_level] = j
        if j < len(hosts):
            return hosts[j]
        chosen: _Host | None = None
        best_key: tuple[int, float, str, int] | None = None
        for h in att.used:
            if h.has_gpus == gpu_level and h.fits(r):
                key = (count[h.idx], -norm.free_score(h), h.name, h.idx)
                if best_key is None or key < best_key:
                    best_key, chosen = key, h
        if chosen is not None:
            return chosen
    return None


def _spread(att: _Attempt, tiers: _Tiers, norm: _Norm, homogeneous: bool) -> int | None:
    """Each member on the host with the fewest members of this gang so far, then the most free resources, then
    hostname. Returns None when every member was placed, else the first unplaceable index."""
    ordered: dict[bool, list[_Host]] = {}
    cursor: dict[bool, int] = {}
    for i, m in enumerate(att.gang.members):
        r = m.resources
        while True:
            chosen = _spread_pick(att, tiers, norm, r, homogeneous, ordered, cursor)
            if chosen is None:
                return i
            if not chosen.materialize() or chosen.fits(r):
                break
        att.assign(chosen, m.instance, m.task_id, r)
    return None


def _explain(
    gang: GangRequest, failed_at: int, placed: int, hosts: list[_Host], eligible_flags: list[bool]
) -> PlacementFailure:
    member = gang.members[failed_at].resources
    counts: dict[str, int] = {}
    failed_constraints: list[Constraint] = []
    for h, ok in zip(hosts, eligible_flags, strict=True):
        dims = h.short_of(member)
        if not ok:
            dims.append("constraint")
            for c in gang.constraints:
                if not c.matches(h.offer.labels) and c not in failed_constraints:
                    failed_constraints.append(c)
        for d in dims:
            counts[d] = counts.get(d, 0) + 1
    short = {d: counts[d] for d in SHORT_DIMENSIONS if d in counts}
    n = len(gang.members)
    if all(m.resources == member for m in gang.members):
        need = f"gang of {n} needs {member.describe()} each"
    else:
        need = f"gang of {n}: instance {gang.members[failed_at].instance} needs {member.describe()}"
    if not hosts:
        why = "no hosts offered"
    elif short:
        parts = []
        for d, k in short.items():
            if d == "constraint":
                parts.append(f"constraint {k} ({', '.join(x.describe() for x in failed_constraints)})")
            else:
                parts.append(f"{d} {k}")
        why = "hosts short of: " + ", ".join(parts)
    else:  # cannot happen: a member that fits no host is short somewhere on every host
        why = "no host fits"
    return PlacementFailure(
        gang_id=gang.gang_id,
        job_id=gang.job_id,
        attempt=gang.attempt,
        reason=f"{need}; placed {placed} of {n}; {why}",
        short_hosts=short,
    )


def place(
    gangs: Sequence[GangRequest], offers: Sequence[HostOffer], lease_id: str
) -> tuple[list[GangPlacement], list[PlacementFailure]]:
    """Place each gang whole or not at all, in the given order; a placed gang's resources are gone for later ones."""
    hosts = [_Host(i, o) for i, o in enumerate(offers)]
    norm = _Norm(offers)
    all_tiers: _Tiers | None = None
    placements: list[GangPlacement] = []
    failures: list[PlacementFailure] = []
    for gang in gangs:
        if gang.constraints:
            flags = [_satisfies(h.offer, gang.constraints) for h in hosts]
            tiers = _Tiers([h for h, ok in zip(hosts, flags, strict=True) if ok])
        else:
            flags = []
            if all_tiers is None:
                all_tiers = _Tiers(hosts)
            tiers = all_tiers
        first = gang.members[0].resources if gang.members else Resources()
        homogeneous = all(m.resources == first for m in gang.members)
        att = _Attempt(gang)
        if gang.strategy == "spread":
            failed_at = _spread(att, tiers, norm, homogeneous)
        else:
            failed_at = _pack(att, tiers, norm, homogeneous)
        if failed_at is None:
            placements.append(
                GangPlacement(
                    gang_id=gang.gang_id,
                    job_id=gang.job_id,
                    attempt=gang.attempt,
                    lease_id=lease_id,
                    members=tuple(att.assignments),
                )
            )
            continue
        failures.append(_explain(gang, failed_at, len(att.assignments), hosts, flags or [True] * len(hosts)))
        att.rollback(hosts)
    return placements, failures


def can_ever_fit(gang: GangRequest, capacities: Sequence[HostOffer]) -> PlacementFailure | None:
    """Whether `gang` fits the cluster when it is empty (offers at full capacity): None if so, else why not."""
    _, failures = place([gang], capacities, lease_id="")
    return failures[0] if failures else None
