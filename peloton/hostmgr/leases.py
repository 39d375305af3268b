"""Offer leases: what a placement round holds on each host until it launches or the lease expires.

Pure bookkeeping over plain data; the clock is passed in. Two rounds never see the same resources: an offer is
a host's free resources minus everything held by live leases.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from peloton.domain.placement import HostOffer, MemberAssignment
from peloton.domain.resources import Resources
from peloton.errors import Conflict


@dataclass(slots=True)
class Hold:
    resources: Resources = Resources()
    gpu_ids: set[int] = field(default_factory=set)
    ports: set[int] = field(default_factory=set)

    def add(self, r: Resources, gpus: Iterable[int], ports: Iterable[int]) -> None:
        self.resources = self.resources + r
        self.gpu_ids.update(gpus)
        self.ports.update(ports)

    @property
    def empty(self) -> bool:
        return not self.gpu_ids and not self.ports and self.resources.cpu <= 1e-9 and self.resources.mem <= 1e-9


@dataclass(slots=True)
class Lease:
    lease_id: str
    expires_at: float
    holds: dict[str, Hold] = field(default_factory=dict)


class LeaseBook:
    def __init__(self) -> None:
        self._leases: dict[str, Lease] = {}

    def expire(self, now: float) -> list[str]:
        gone = [lid for lid, lease in self._leases.items() if lease.expires_at <= now]
        for lid in gone:
            del self._leases[lid]
        return gone

    def held_hosts(self) -> set[str]:
        return {h for lease in self._leases.values() for h, hold in lease.holds.items() if not hold.empty}

    def _held(self) -> dict[str, Hold]:
        total: dict[str, Hold] = {}
        for lease in self._leases.values():
            for host, hold in lease.holds.items():
                total.setdefault(host, Hold()).add(hold.resources, hold.gpu_ids, hold.ports)
        return total

    def acquire(self, free: Sequence[HostOffer], now: float, lease_s: float) -> tuple[str, list[HostOffer]]:
        """Offers = free minus held; the new lease holds all it was offered."""
        self.expire(now)
        held = self._held()
        lease = Lease(uuid.uuid4().hex, now + lease_s)
        offers = []
        for o in free:
            h = held.get(o.hostname)
            if h is not None:
                gpus = tuple(g for g in o.gpu_ids if g not in h.gpu_ids)
                ports = tuple(p for p in o.ports if p not in h.ports)
                rest = o.free - h.resources
                o = replace(
                    o,
                    free=Resources(max(rest.cpu, 0.0), max(rest.mem, 0.0), max(rest.disk, 0.0), len(gpus), len(ports)),
                    gpu_ids=gpus,
                    ports=ports,
                )
            offers.append(o)
            lease.holds[o.hostname] = Hold(o.free, set(o.gpu_ids), set(o.ports))
        self._leases[lease.lease_id] = lease
        return lease.lease_id, offers

    def retain(self, lease_id: str, keep: Sequence[MemberAssignment], now: float) -> None:
        """Shrink the lease to exactly `keep`; drop it when `keep` is empty."""
        lease = self._leases.get(lease_id)
        if lease is None or lease.expires_at <= now:
            self._leases.pop(lease_id, None)
            return
        if not keep:
            del self._leases[lease_id]
            return
        holds: dict[str, Hold] = {}
        for m in keep:
            holds.setdefault(m.hostname, Hold()).add(m.resources, m.gpu_ids, m.ports)
        lease.holds = holds

    def consume(self, lease_id: str, members: Sequence[MemberAssignment], now: float) -> None:
        """Check that the lease is live and holds what `members` use, then stop holding it (the backend now
        accounts for it). Conflict when the lease is stale: the caller re-queues the gang."""
        lease = self._leases.get(lease_id)
        if lease is None or lease.expires_at <= now:
            self._leases.pop(lease_id, None)
            raise Conflict(f"offer lease {lease_id[:8]} expired or unknown")
        need: dict[str, Resources] = {}
        for m in members:
            hold = lease.holds.get(m.hostname)
            if hold is None or not set(m.gpu_ids) <= hold.gpu_ids or not set(m.ports) <= hold.ports:
                raise Conflict(f"offer lease {lease_id[:8]} does not hold {m.task_id}'s resources on {m.hostname}")
            need[m.hostname] = need.get(m.hostname, Resources()) + m.resources
        for host, r in need.items():
            held = lease.holds[host].resources
            if Resources(r.cpu, r.mem, r.disk).short_of(Resources(held.cpu, held.mem, held.disk)):
                raise Conflict(f"offer lease {lease_id[:8]} holds less than the gang needs on {host}")
        for m in members:
            hold = lease.holds[m.hostname]
            rest = hold.resources - m.resources
            hold.resources = Resources(max(rest.cpu, 0.0), max(rest.mem, 0.0), max(rest.disk, 0.0), 0, 0)
            hold.gpu_ids -= set(m.gpu_ids)
            hold.ports -= set(m.ports)
        if all(h.empty for h in lease.holds.values()):
            del self._leases[lease_id]

    def release(self, lease_id: str, members: Sequence[MemberAssignment] = ()) -> None:
        """Give back what `members` hold (all of the lease when empty)."""
        lease = self._leases.get(lease_id)
        if lease is None:
            return
        if not members:
            del self._leases[lease_id]
            return
        try:
            self.consume(lease_id, members, float("-inf"))
        except Conflict:
            pass
