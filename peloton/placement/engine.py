"""Placement engine shell: dequeue admitted gangs from resmgr, lease offers from hostmgr, decide with the
pure placer, hold exactly what was chosen, hand the placements back to resmgr. One round = many gangs."""

from __future__ import annotations

import logging

from prometheus_client import Counter, Histogram

from peloton.api import convert
from peloton.api.v1 import internal_pb2, internal_pb2_grpc
from peloton.placement.placer import place

log = logging.getLogger(__name__)

ROUNDS = Histogram("peloton_placement_round_seconds", "Duration of one placement round")
GANGS = Counter("peloton_placement_gangs_total", "Gangs considered by placement", ["result"])

LEASE_SECONDS = 30


class PlacementEngine:
    def __init__(
        self,
        resmgr: internal_pb2_grpc.ResourceManagerInternalStub,
        hostmgr: internal_pb2_grpc.HostManagerInternalStub,
        batch: int = 200,
        poll_ms: int = 1000,
    ) -> None:
        self.resmgr = resmgr
        self.hostmgr = hostmgr
        self.batch = batch
        self.poll_ms = poll_ms

    def run_once(self) -> bool:
        resp = self.resmgr.DequeueGangs(
            internal_pb2.DequeueGangsRequest(max_gangs=self.batch, timeout_ms=self.poll_ms),
            timeout=self.poll_ms / 1000 + 10,
        )
        if not resp.gangs:
            return False
        with ROUNDS.time():
            gangs = [convert.gang_request_from_proto(g) for g in resp.gangs]
            lease = self.hostmgr.AcquireHostOffers(
                internal_pb2.AcquireHostOffersRequest(lease_seconds=LEASE_SECONDS), timeout=10
            )
            offers = [convert.offer_from_proto(o) for o in lease.offers]
            placements, failures = place(gangs, offers, lease.lease_id)
            # hold exactly what was chosen until jobmgr launches it; everything else goes back at once
            self.hostmgr.ReleaseHostOffers(
                internal_pb2.ReleaseHostOffersRequest(
                    lease_id=lease.lease_id, keep=[convert.placement_to_proto(p) for p in placements]
                ),
                timeout=10,
            )
            self.resmgr.SetPlacements(
                internal_pb2.SetPlacementsRequest(
                    placements=[convert.placement_to_proto(p) for p in placements],
                    failures=[convert.failure_to_proto(f) for f in failures],
                ),
                timeout=10,
            )
        GANGS.labels("placed").inc(len(placements))
        GANGS.labels("unplaced").inc(len(failures))
        if placements:
            log.info("placed %d gangs (%d unplaced)", len(placements), len(failures))
        return bool(placements)
