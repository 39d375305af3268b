"""Host drains and preemption: the placement engine's preemption probes neither free a victim's share of a draining
host (stopping it there makes no room) nor keep a draining host for the waiting gang (no new gang goes there)."""

from __future__ import annotations

from peloton.api.clients import Probe, Victim
from peloton.domain.placement import GangRequest, HostOffer, MemberRequest
from peloton.domain.resources import Resources
from peloton.placement.engine import PlacementEngine
from peloton.placement.index import HostIndex

CAP = Resources(cpu=4, mem=1024, gpu=2)
TWO_GPUS = Resources(cpu=1, mem=10, gpu=2)


class _Hosts:
    """The host manager as the engine's probes see it: h1 is draining."""

    def drains(self) -> dict[str, float]:
        return {"h1": 0.0}


def _engine() -> PlacementEngine:
    e = PlacementEngine(None, _Hosts(), poll_ms=50)  # type: ignore[arg-type]
    # both hosts full (h1 shows nothing free because it drains, as the host manager's sync reports a closed host)
    e.index = HostIndex([HostOffer(h, "", Resources(), labels={"rack": "r1"}, capacity=CAP, has_gpus=True)
                         for h in ("h1", "h2")])
    return e


def test_a_preemption_probe_neither_preempts_nor_reserves_for_a_draining_host() -> None:
    """A running gang on a draining host frees nothing the waiting gang can use (no new gang goes there): preempting
    it would stop it for nothing (a drain without deadline lets it finish), and keeping the host for the waiting gang
    would hold it back for a host it never gets. The gang on the open host is the victim."""
    e = _engine()
    waiting = GangRequest("w/0", "w", 1, (MemberRequest(0, "w-0-1", TWO_GPUS),))
    on_drained = Victim("a/0", 1, (("h1", TWO_GPUS),))
    on_open = Victim("b/0", 1, (("h2", TWO_GPUS),))
    preemptions, reservations = e._probe([Probe(waiting, Resources(), (on_drained, on_open))])
    assert preemptions == [(("w/0", 1), [("b/0", 1)])]
    assert reservations == [(("w/0", 1), ["h2"], 0.0)]
    # only a gang on the draining host (ending there too): no victim, and the host kept for it is the open one
    preemptions, reservations = e._probe([Probe(waiting, Resources(), (on_drained,), ending=(on_drained,))])
    assert preemptions == [] and reservations == [(("w/0", 1), ["h2"], 0.0)]
