"""Mesos offers as plain data: parsing, the per-agent pool, and the TaskInfo resources a launch takes from them.

Pure (no I/O, no clock): the backend passes `now` in.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from peloton.domain.resources import Resources

MAX_PORTS_PER_OFFER = 1000


@dataclass(frozen=True, slots=True)
class ParsedOffer:
    offer_id: str
    agent_id: str
    hostname: str
    agent_port: int
    role: str
    cpus: float = 0.0
    mem: float = 0.0
    disk: float = 0.0
    gpus: int = 0
    ports: tuple[tuple[int, int], ...] = ()
    attributes: dict[str, str] = field(default_factory=dict)
    received_at: float = 0.0


def _attr_value(a: dict[str, Any]) -> str:
    t = a.get("type")
    if t == "TEXT":
        return str(a.get("text", {}).get("value", ""))
    if t == "SCALAR":
        v = float(a.get("scalar", {}).get("value", 0))
        return str(int(v)) if v == int(v) else str(v)
    if t == "RANGES":
        return ",".join(f"[{r['begin']}-{r['end']}]" for r in a.get("ranges", {}).get("range", []))
    if t == "SET":
        return ",".join(a.get("set", {}).get("item", []))
    return ""


def parse_offer(o: dict[str, Any], now: float) -> ParsedOffer:
    """One Mesos Offer JSON object -> ParsedOffer (unreserved and reserved resources alike, one role)."""
    scalars: dict[str, float] = {}
    ports: list[tuple[int, int]] = []
    role = str(o.get("allocation_info", {}).get("role", "*"))
    for r in o.get("resources", []):
        name = r.get("name")
        if r.get("type") == "SCALAR":
            scalars[name] = scalars.get(name, 0.0) + float(r.get("scalar", {}).get("value", 0.0))
        elif r.get("type") == "RANGES" and name == "ports":
            ports += [(int(x["begin"]), int(x["end"])) for x in r.get("ranges", {}).get("range", [])]
        if "allocation_info" in r:
            role = str(r["allocation_info"].get("role", role))
    url = o.get("url", {}).get("address", {})
    return ParsedOffer(
        offer_id=o["id"]["value"],
        agent_id=o["agent_id"]["value"],
        hostname=str(o.get("hostname", url.get("hostname", ""))),
        agent_port=int(url.get("port", 5051)),
        role=role,
        cpus=scalars.get("cpus", 0.0),
        mem=scalars.get("mem", 0.0),
        disk=scalars.get("disk", 0.0),
        gpus=int(scalars.get("gpus", 0.0)),
        ports=tuple(sorted(ports)),
        attributes={str(a["name"]): _attr_value(a) for a in o.get("attributes", [])},
        received_at=now,
    )


def flatten_ports(ranges: Iterable[tuple[int, int]], limit: int = MAX_PORTS_PER_OFFER) -> list[int]:
    out: list[int] = []
    for b, e in ranges:
        for p in range(b, e + 1):
            out.append(p)
            if len(out) >= limit:
                return out
    return out


def port_ranges(ports: Sequence[int]) -> list[dict[str, int]]:
    """[31000, 31001, 31005] -> [{begin: 31000, end: 31001}, {begin: 31005, end: 31005}]"""
    out: list[dict[str, int]] = []
    for p in sorted(ports):
        if out and out[-1]["end"] == p - 1:
            out[-1]["end"] = p
        else:
            out.append({"begin": p, "end": p})
    return out


@dataclass(slots=True)
class AgentView:
    """What the pool knows of one agent: its offers, attributes, and our tasks' resources on it."""

    agent_id: str
    hostname: str
    agent_port: int
    attributes: dict[str, str]
    offers: dict[str, ParsedOffer] = field(default_factory=dict)
    capacity: Resources = Resources()
    has_gpus: bool = False
    reachable: bool = True

    def free(self) -> tuple[Resources, list[int]]:
        cpu = sum(o.cpus for o in self.offers.values())
        mem = sum(o.mem for o in self.offers.values())
        disk = sum(o.disk for o in self.offers.values())
        gpus = sum(o.gpus for o in self.offers.values())
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


def task_resources(role: str, r: Resources, ports: Sequence[int]) -> list[dict[str, Any]]:
    """The `resources` of a TaskInfo: taken from the offered (unreserved) resources of `role`, as offered."""

    def scalar(name: str, value: float) -> dict[str, Any]:
        return {"name": name, "type": "SCALAR", "scalar": {"value": round(value, 3)}, "role": "*",
                "allocation_info": {"role": role}}

    out = [scalar("cpus", r.cpu), scalar("mem", r.mem)]
    if r.disk > 0:
        out.append(scalar("disk", r.disk))
    if r.gpu > 0:
        out.append(scalar("gpus", float(r.gpu)))
    if ports:
        out.append({"name": "ports", "type": "RANGES", "ranges": {"range": port_ranges(ports)}, "role": "*",
                    "allocation_info": {"role": role}})
    return out
