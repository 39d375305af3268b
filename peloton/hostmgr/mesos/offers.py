"""The offer pool per agent, as plain data. Pure (no I/O, no clock): times are passed in.

Offers arrive parsed (events.Offer); an agent's free resources are the sum of its pooled offers for one role.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from peloton.domain.placement import HostOffer
from peloton.domain.resources import Resources
from peloton.hostmgr.mesos.events import Offer
from peloton.hostmgr.mesos.protocol import offers_to_host_offer


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
    lost: bool = False  # the master removed the agent (FAILURE without an executor): `host list` says LOST
    address: str = ""  # url.address.ip (or hostname) of the agent: where its HTTP API answers, with agent_port

    def add(self, o: Offer, now: float) -> None:
        self.offers[o.id] = o
        self.received[o.id] = now

    def drop(self, offer_id: str) -> None:
        self.offers.pop(offer_id, None)
        self.received.pop(offer_id, None)

    def clear(self) -> None:
        self.offers.clear()
        self.received.clear()

    def host_offer(self, name: str) -> HostOffer | None:
        """The pooled offers as one HostOffer named `name` (None without offers)."""
        if not self.offers:
            return None
        return offers_to_host_offer(name, list(self.offers.values()), capacity=self.capacity,
                                    has_gpus=self.has_gpus)

    def free(self) -> tuple[Resources, list[int]]:
        ho = self.host_offer(self.hostname)
        return (ho.free, list(ho.ports)) if ho is not None else (Resources(), [])


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
