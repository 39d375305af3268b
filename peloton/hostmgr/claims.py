"""Claims: the resources a placed gang holds on its hosts between its placement and its launch.

Pure bookkeeping over plain data; the clock is passed in. This is the commit check of an optimistic plan (Nomad's
plan applier): placement decides on its own copy of the cluster; `claim` re-checks each gang, whole, against the
backend's free resources minus everything already claimed, and either holds it (choosing the concrete GPU ids and
ports) or refuses it. A claim is keyed by (gang id, attempt). While its launch is in progress it cannot expire,
and the host manager drops it only after the backend accounts for the launched members, so there is no moment
when a gang's resources are neither claimed nor in use.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from peloton.domain.launch import LaunchSpec
from peloton.domain.placement import GangPlacement, HostOffer, MemberAssignment
from peloton.domain.resources import Resources

ClaimKey = tuple[str, int]  # (gang id, attempt)
_EPS = 1e-9


@dataclass(slots=True)
class Hold:
    """What the claims on one host hold together."""

    resources: Resources = Resources()
    gpu_ids: set[int] = field(default_factory=set)
    ports: set[int] = field(default_factory=set)
    members: int = 0  # claimed members on the host; the hold goes when it drops to 0


@dataclass(slots=True)
class Claim:
    placement: GangPlacement  # with the concrete GPU ids and ports
    expires_at: float
    launching: bool = False

    @property
    def key(self) -> ClaimKey:
        return self.placement.gang_id, self.placement.attempt

    def hosts(self) -> set[str]:
        return {m.hostname for m in self.placement.members}


def _first_free(ids: Sequence[int], held: set[int], n: int) -> list[int]:
    """The first `n` of `ids` (lowest first) not in `held`; fewer when there are not that many."""
    out: list[int] = []
    if n <= 0:
        return out
    for i in ids:
        if i not in held:
            out.append(i)
            if len(out) == n:
                break
    return out


class ClaimBook:
    def __init__(self) -> None:
        self._claims: dict[ClaimKey, Claim] = {}
        self._held: dict[str, Hold] = {}

    def __len__(self) -> int:
        return len(self._claims)

    def get(self, key: ClaimKey) -> Claim | None:
        return self._claims.get(key)

    def held(self, hostname: str) -> Hold | None:
        return self._held.get(hostname)

    def held_hosts(self) -> set[str]:
        return set(self._held)

    def launching_on(self, hostname: str) -> bool:
        """Whether a claim with a member on the host is being launched (its members may be starting there)."""
        return any(c.launching and hostname in c.hosts() for c in self._claims.values())

    def free(self, offer: HostOffer) -> HostOffer:
        """`offer` (the backend's free resources) minus what claims hold on that host; counts only."""
        h = self._held.get(offer.hostname)
        if h is None:
            return offer
        f = offer.free
        return HostOffer(
            hostname=offer.hostname, address=offer.address,
            free=Resources(max(0.0, f.cpu - h.resources.cpu), max(0.0, f.mem - h.resources.mem),
                           max(0.0, f.disk - h.resources.disk), max(0, f.gpu - len(h.gpu_ids)),
                           max(0, f.ports - len(h.ports))),
            labels=offer.labels, capacity=offer.capacity, has_gpus=offer.has_gpus,
        )

    def claim(self, p: GangPlacement, offers: Mapping[str, HostOffer], now: float, ttl_s: float
              ) -> GangPlacement | str:
        """Hold every member of `p`, or nothing. `offers` has the backend's free resources WITH concrete ids for
        each host of `p`. Returns the placement with the GPU ids and ports chosen (lowest free first), or why it
        was refused."""
        if p.gang_id and (p.gang_id, p.attempt) in self._claims:
            return f"gang {p.gang_id} attempt {p.attempt} is already claimed"
        by_host: dict[str, list[MemberAssignment]] = {}
        for m in p.members:
            by_host.setdefault(m.hostname, []).append(m)
        chosen: dict[int, tuple[tuple[int, ...], tuple[int, ...]]] = {}
        for host, members in by_host.items():
            offer = offers.get(host)
            if offer is None:
                return f"host {host} is gone"
            h = self._held.get(host) or Hold()
            need = Resources()
            for m in members:
                need = need + m.resources
            f = offer.free
            free = Resources(f.cpu - h.resources.cpu, f.mem - h.resources.mem, f.disk - h.resources.disk)
            # only as many free ids as the members ask for (an offer lists up to 1,000 ports, most gangs ask none)
            gpus = _first_free(offer.gpu_ids, h.gpu_ids, need.gpu)
            ports = _first_free(offer.ports, h.ports, need.ports)
            short = Resources(need.cpu, need.mem, need.disk).short_of(free)
            if need.gpu > len(gpus):
                short.append("gpu")
            if need.ports > len(ports):
                short.append("ports")
            if short:
                return (f"host {host} changed since placement: the gang needs {need.describe()} there, "
                        f"short of {', '.join(short)}")
            gi = pi = 0
            for m in members:
                g, q = m.resources.gpu, m.resources.ports
                chosen[m.instance] = (tuple(gpus[gi:gi + g]), tuple(ports[pi:pi + q]))
                gi += g
                pi += q
        assigned = tuple(
            MemberAssignment(m.instance, m.task_id, m.hostname, offers[m.hostname].address or m.address,
                             m.resources, *chosen[m.instance])
            for m in p.members
        )
        out = GangPlacement(p.gang_id, p.job_id, p.attempt, assigned, p.plan)
        self._add(Claim(out, now + ttl_s))
        return out

    def _add(self, c: Claim) -> None:
        self._claims[c.key] = c
        for m in c.placement.members:
            h = self._held.setdefault(m.hostname, Hold())
            h.resources = h.resources + Resources(m.resources.cpu, m.resources.mem, m.resources.disk)
            h.gpu_ids.update(m.gpu_ids)
            h.ports.update(m.ports)
            h.members += 1

    def release(self, key: ClaimKey) -> set[str]:
        """Drop the claim; the hosts whose free resources changed."""
        c = self._claims.pop(key, None)
        if c is None:
            return set()
        for m in c.placement.members:
            h = self._held[m.hostname]
            rest = h.resources - Resources(m.resources.cpu, m.resources.mem, m.resources.disk)
            h.resources = Resources(max(rest.cpu, 0.0), max(rest.mem, 0.0), max(rest.disk, 0.0))
            h.gpu_ids.difference_update(m.gpu_ids)
            h.ports.difference_update(m.ports)
            h.members -= 1
            if h.members <= 0:
                del self._held[m.hostname]
        return c.hosts()

    def expire(self, now: float) -> set[str]:
        """Drop claims past their expiry (a launch in progress never expires); the hosts that changed."""
        hosts: set[str] = set()
        for key in [k for k, c in self._claims.items() if not c.launching and c.expires_at <= now]:
            hosts |= self.release(key)
        return hosts

    def begin_launch(self, key: ClaimKey, tasks: Sequence[LaunchSpec], now: float) -> str | None:
        """Check that the claim is live and that `tasks` use exactly what it holds, and pin it until `release`.
        None when the launch may go ahead, else why not (the launch is refused)."""
        c = self._claims.get(key)
        if c is None or (not c.launching and c.expires_at <= now):
            if c is not None:
                self.release(key)
            return f"the claim of gang {key[0]} attempt {key[1]} expired or is unknown"
        if c.launching:
            return f"gang {key[0]} attempt {key[1]} is already being launched"
        held = {m.task_id: m for m in c.placement.members}
        if len(tasks) != len(held):
            return f"the launch has {len(tasks)} members, the claim {len(held)}"
        for t in tasks:
            m = held.get(t.task_id)
            if m is None or (m.hostname, tuple(m.gpu_ids), tuple(m.ports)) != (t.hostname, tuple(t.gpu_ids),
                                                                               tuple(t.ports)):
                return f"{t.task_id} does not match its claim (host, GPUs or ports)"
            if t.resources.cpu > m.resources.cpu + _EPS or t.resources.mem > m.resources.mem + _EPS:
                return f"{t.task_id} asks for more than its claim holds"
        c.launching = True
        return None
