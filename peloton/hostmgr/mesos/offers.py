"""The offer pool per agent, as plain data. Pure (no I/O, no clock): times are passed in.

Offers arrive parsed (events.Offer); an agent's free resources are the sum of its pooled offers for one role.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from peloton.domain.resources import Resources
from peloton.hostmgr.mesos.events import Offer

MAX_PORTS_PER_OFFER = 1000


def flatten_ports(ranges: Iterable[tuple[int, int]], limit: int = MAX_PORTS_PER_OFFER) -> list[int]:
    out: list[int] = []
    for b, e in ranges:
        for p in range(b, e + 1):
            out.append(p)
            if len(out) >= limit:
                return out
    return out


@dataclass(slots=True)
class AgentView:
    """What the pool knows of one agent: its offers (with when each arrived), attributes, estimated capacity."""

    agent_id: str
    hostname: str
    agent_port: int
    attributes: dict[str, str]
    offers: dict[str, Offer] = field(default_factory=dict)
    received: dict[str, float] = field(default_factory=dict)  # offer id -> arrival time
    capacity: Resources = Resources()
    has_gpus: bool = False
    reachable: bool = True

    def add(self, o: Offer, now: float) -> None:
        self.offers[o.id] = o
        self.received[o.id] = now

    def drop(self, offer_id: str) -> None:
        self.offers.pop(offer_id, None)
        self.received.pop(offer_id, None)

    def clear(self) -> None:
        self.offers.clear()
        self.received.clear()

    def free(self) -> tuple[Resources, list[int]]:
        cpu = sum(o.cpus for o in self.offers.values())
        mem = sum(o.mem for o in self.offers.values())
        disk = sum(o.disk for o in self.offers.values())
        gpus = int(sum(o.gpus for o in self.offers.values()))
        ports = flatten_ports(r for o in self.offers.values() for r in o.ports)
        return Resources(cpu, mem, disk, gpus, len(ports)), ports


def covers(agent: AgentView, demand: Resources, ports: Sequence[int]) -> str | None:
    """None when the agent's pooled offers hold `demand` and every port; else why not."""
    free, free_ports = agent.free()
    short = Resources(demand.cpu, demand.mem, demand.disk, demand.gpu, 0).short_of(
        Resources(free.cpu, free.mem, free.disk, free.gpu, 0)
    )
    if short:
        return f"offers on {agent.hostname} no longer hold {', '.join(short)} (rescinded or expired)"
    missing = set(ports) - set(free_ports)
    if missing:
        return f"ports {sorted(missing)[:5]} are no longer offered on {agent.hostname}"
    return None
