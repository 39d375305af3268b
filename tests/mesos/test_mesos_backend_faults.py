"""The Mesos backend when a call fails halfway: a gang's ACCEPT refused after the first agent's went (the offers
it took and did not use declined, the members never sent dropped), a framework id the store cannot save yet (the
subscription set up all the same, launches waiting for the save). The backend is driven through the recording
transport of test_mesos_backend_unit.py with the offers of the recorded transcript 05; each test failed before its
fix."""

from __future__ import annotations

from typing import Any

import pytest

from peloton.domain.launch import LaunchOutcome
from peloton.hostmgr.backend import LaunchError
from tests.mesos.test_mesos_backend_unit import H0, H1, H2, S1, Harness, _transcript_offers, launch, spec


def _ids(offers: list[dict[str, Any]]) -> set[str]:
    return {o["id"]["value"] for o in offers}


def test_a_gang_whose_accept_fails_midway_declines_the_offers_it_took_and_did_not_use() -> None:
    """A gang over three agents, the second ACCEPT refused: the third agent's offers were taken out of the pool
    but never sent in any call, so the master kept them allocated to us (no --offer_timeout: for ever), and
    nobody, us included, could use that agent again until the next subscription."""
    h = Harness()
    first = h.ready()
    h.t.fail_nth["ACCEPT"] = 2
    with pytest.raises(LaunchError) as e:
        launch(h.b, [spec("job-0-1", H0), spec("job-1-1", H2, instance=1), spec("job-2-1", H1, instance=2)])
    assert e.value.outcome == LaunchOutcome.FAILED  # type: ignore[attr-defined]
    accepted = {o["value"] for o in h.t.of("ACCEPT")[0]["accept"]["offer_ids"]}
    declined = {o["value"] for d in h.t.of("DECLINE") for o in d["decline"]["offer_ids"]}
    assert _ids(first) - accepted <= declined, "offers taken for the gang and never used must go back"
    assert not accepted & declined


def test_a_gang_member_never_sent_is_not_left_running_on_its_agent() -> None:
    """The member whose ACCEPT was never sent stayed TASK_STAGING in the backend's book until the next
    SUBSCRIBED: listed as running, its resources counted as allocated on its agent, and the agent held busy (a
    maintenance inverse offer for it declined again and again)."""
    h = Harness()
    h.ready()
    h.t.fail_nth["ACCEPT"] = 2
    with pytest.raises(LaunchError):
        launch(h.b, [spec("job-0-1", H0), spec("job-1-1", H2, instance=1), spec("job-2-1", H1, instance=2)])
    assert "job-2-1" not in {t.task_id for t in h.b.running()}
    (gpu_host,) = [x for x in h.b.hosts() if x.hostname == H1]
    assert gpu_host.task_ids == () and gpu_host.allocated.cpu == 0
    h.event({"type": "INVERSE_OFFERS", "inverse_offers": {"inverse_offers": [
        {"id": {"value": "io-1"}, "agent_id": {"value": S1}, "unavailability": {"start": {"nanoseconds": 1}},
         "resources": []}]}})
    assert h.t.of("ACCEPT_INVERSE_OFFERS"), "nothing of ours runs on that agent: it may be vacated"


class _StoreDown:
    """The framework id's store, unreachable until `up` is set."""

    def __init__(self) -> None:
        self.up = False
        self.saved: list[str | None] = []

    def __call__(self, fid: str | None) -> None:
        if not self.up:
            raise ConnectionError("the store does not answer")
        self.saved.append(fid)


def _harness_with(store: _StoreDown, fid: str | None = None) -> Harness:
    h = Harness(fid=fid)
    h.b._save_fid = store
    return h


def _emit(h: Harness, ev: dict[str, Any]) -> None:
    """As client.MesosClient._emit delivers an event: a handler's exception is logged, the stream goes on."""
    try:
        h.event(ev)
    except Exception:  # noqa: BLE001
        pass


def test_framework_removed_while_the_store_is_down_still_registers_anew() -> None:
    """ERROR "Framework has been removed" with the store unreachable: the handler raised at clearing the saved id
    and never resumed the client, which stays halted (never subscribes again) until the daemon is restarted."""
    store = _StoreDown()
    h = _harness_with(store, fid="dead-id")
    h.subscribed("dead-id")
    _emit(h, {"type": "ERROR", "error": {"message": "Framework has been removed"}})
    assert h.t.resumed == [True], "the client must re-register as a new framework"
    assert h.t.protocol.framework_id is None and h.t.protocol.halted is None


def test_a_new_framework_id_that_cannot_be_saved_yet_is_saved_later_and_the_ticker_still_runs() -> None:
    """SUBSCRIBED with a new framework id while the store is unreachable: the handler raised before the backend
    was set up, so for the whole subscription the ticker did nothing (no kill re-sent, no reconciliation, held
    offers never declined) and the id was never saved (a restart would register a new framework, orphaning
    every task launched meanwhile)."""
    store = _StoreDown()
    h = _harness_with(store)
    _emit(h, {"type": "SUBSCRIBED", "subscribed": {"framework_id": {"value": "new-id"},
                                                   "heartbeat_interval_seconds": 15.0}})
    h.offers(_transcript_offers()[0])
    h.b.offers()  # demand: the offers are kept
    h.b.kill(["job-0-1"])
    h.tick(h.b.opts.kill_retry_s + 0.1)
    assert len(h.t.of("KILL")) == 2, "the kill is re-sent: the ticker acts on this subscription"
    assert h.t.of("RECONCILE"), "the subscription is reconciled"
    with pytest.raises(LaunchError) as e:  # tasks launched under an id a restart would not know: not yet
        launch(h.b, [spec("job-1-1", H0)])
    assert e.value.outcome == LaunchOutcome.REFUSED  # type: ignore[attr-defined]
    assert "framework id" in e.value.message
    store.up = True
    h.tick(0.5)
    assert store.saved == ["new-id"]
    launch(h.b, [spec("job-1-1", H0)])
    assert h.t.of("ACCEPT")
