"""The resource manager as a component of this process calls it (api/clients.py's ResourceManagerClient): straight
to the ResourceManager, with the values the caller holds; no message is built. The servicer (service.py) serves the
same calls over gRPC to the other processes of a split deployment, with the same bounds on what a caller asks."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from peloton.api.clients import Dequeued, GangKey, Placed, Preemption, Probe, Reserved, Victim, service_errors
from peloton.domain.allocation import AdmissionPreview, GangAsk
from peloton.domain.model import ResourcePool
from peloton.domain.placement import GangPlacement, GangRequest, PlacementFailure
from peloton.domain.resources import Resources
from peloton.resmgr.manager import Probe as HeldProbe
from peloton.resmgr.manager import ResourceManager
from peloton.resmgr.preemption import Holding

MAX_WAIT_S = 30.0  # a long poll's wait, at most (as the servicer bounds it)


def _wait(timeout_s: float) -> float:
    return min(max(timeout_s, 0.0), MAX_WAIT_S)


def _victim(gang_id: str, h: Holding) -> Victim:
    return Victim(gang_id, h.attempt, h.usage, h.ends_at or 0.0)


def _probe(p: HeldProbe) -> Probe:
    return Probe(p.gang, p.need, tuple(_victim(g, h) for g, h in p.candidates),
                 tuple(_victim(g, h) for g, h in p.ending))


class InProcessResourceManager:
    def __init__(self, rm: ResourceManager) -> None:
        self.rm = rm

    @service_errors
    def enqueue(self, gangs: Sequence[GangRequest], running: Sequence[GangRequest],
                remove: Sequence[GangKey] = (), call_id: str = "") -> None:
        self.rm.apply_call(call_id, remove, gangs, running)

    @service_errors
    def dequeue(self, max_gangs: int, timeout_s: float, capacity: Resources | None, engine: str) -> Dequeued:
        gangs = self.rm.dequeue(max_gangs or 100, _wait(timeout_s), capacity, engine=engine)
        return Dequeued(gangs, self.rm.take_orphaned_claims(engine), [_probe(p) for p in self.rm.take_probes()],
                        self.rm.reserving(), self.rm.placement_order, self.rm.idle)

    @service_errors
    def set_placements(self, placements: Sequence[GangPlacement], failures: Sequence[PlacementFailure],
                       stale: Sequence[PlacementFailure], preemptions: Sequence[Preemption],
                       reservations: Sequence[Reserved], engine: str) -> None:
        self.rm.set_placements(placements, failures, stale, preemptions, reservations, engine=engine)

    @service_errors
    def get_placements(self, max_placements: int, timeout_s: float, consumer: str,
                       ack_done: Sequence[GangKey] = ()) -> Placed:
        if ack_done:
            self.rm.ack_placements(ack_done, [])
        placements, pending = self.rm.take_placements(max_placements or 100, _wait(timeout_s), consumer=consumer)
        return Placed(placements, pending, self.rm.take_preemptions(), self.rm.incarnation)

    @service_errors
    def ack_placements(self, done: Sequence[GangKey], retry: Sequence[GangKey]) -> None:
        self.rm.ack_placements(done, retry)

    @service_errors
    def unknown_gangs(self, gangs: Sequence[GangKey]) -> list[GangKey]:
        return self.rm.unknown(gangs)

    @service_errors
    def remove_gangs(self, gangs: Sequence[GangKey], call_id: str = "") -> None:
        self.rm.apply_call(call_id, gangs)

    @service_errors
    def held_gangs(self, page_token: str) -> tuple[list[GangKey], str]:
        return [k for k in self.rm.gangs() if k[0] > page_token], ""  # one page: no message to bound

    @service_errors
    def entitled_gpus(self, pool: str, extra_demand: Resources) -> int | None:
        ent = self.rm.entitlement_if(pool, extra_demand)
        return ent.whole().gpu if ent is not None else None

    @service_errors
    def preview_admission(self, pool: str, gangs: Sequence[GangAsk]) -> list[AdmissionPreview]:
        return self.rm.admission_if(pool, gangs)

    def held_pools(self) -> Mapping[str, ResourcePool]:
        return self.rm.held_pools()
