"""Fuzzing the Mesos protocol core with what a broken or hostile master could send: records that are not JSON
(truncated, not UTF-8, nested too deep, numbers too long), and offers whose quantities are NaN, infinite,
negative or huge, or whose port ranges are backwards or out of range. Nothing raises, nothing takes the daemon's
memory, and what reaches placement is finite, non-negative and bounded."""

from __future__ import annotations

import json
import math
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from peloton.hostmgr.mesos.calls import FrameworkConfig
from peloton.hostmgr.mesos.events import MAX_GPUS_PER_AGENT, Offers, Unknown
from peloton.hostmgr.mesos.protocol import SchedulerProtocol, offers_to_host_offer

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def protocol() -> SchedulerProtocol:
    return SchedulerProtocol(FrameworkConfig(name="peloton", user="svc"))


@FUZZ
@given(st.binary(max_size=2000))
@example(b"[" * 100_000 + b"]" * 100_000)  # nested deeper than the parser's recursion
@example(b'{"type": "HEARTBEAT", "n": ' + b"9" * 5000 + b"}")  # an integer longer than int() takes
@example(b'{"type": "OFFERS", "offers": {"offers": [{"id": {"value": "o"}, "agent_id": {"value": "a"}')  # truncated
@example(b"\xff\xfe{}")  # not UTF-8
@example(b'{"type": "SUBSCRIBED", "subscribed": {"framework_id": {"value": "F"}, '
         b'"heartbeat_interval_seconds": NaN}}')
def test_any_record_is_an_event_or_unknown(record: bytes) -> None:
    evs = protocol().on_record(record, 1.0)
    assert len(evs) == 1


quantities = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(min_value=-10**30, max_value=10**30),
                       st.text(max_size=4), st.none())
port_bounds = st.one_of(st.integers(min_value=-10**20, max_value=10**20), st.floats(), st.text(max_size=3))


def resource(name: str, value: Any) -> dict[str, Any]:
    return {"name": name, "type": "SCALAR", "scalar": {"value": value}}


@st.composite
def offer(draw: st.DrawFn, i: int = 0) -> dict[str, Any]:
    res = [resource(n, draw(quantities)) for n in draw(st.lists(st.sampled_from(["cpus", "mem", "disk", "gpus"]),
                                                                max_size=6))]
    if draw(st.booleans()):
        ranges = [{"begin": draw(port_bounds), "end": draw(port_bounds)} for _ in range(draw(st.integers(0, 4)))]
        res.append({"name": "ports", "type": "RANGES", "ranges": {"range": ranges}})
    return {"id": {"value": f"o{i}"}, "agent_id": {"value": "agent"}, "hostname": "h", "resources": res}


@FUZZ
@given(st.lists(offer(), min_size=1, max_size=4))
@example([{"id": {"value": "o"}, "agent_id": {"value": "a"}, "resources": [resource("gpus", 1e12)]}])
@example([{"id": {"value": "o"}, "agent_id": {"value": "a"}, "resources": [resource("gpus", 1.0),  # a total past the
                                                                               resource("gpus", 1024.0)]}])  # bound
@example([{"id": {"value": "o"}, "agent_id": {"value": "a"}, "resources": [resource("cpus", math.inf)]}])
@example([{"id": {"value": "o"}, "agent_id": {"value": "a"}, "resources": [
    {"name": "ports", "type": "RANGES", "ranges": {"range": [{"begin": -5, "end": 10**18}]}}]}])
def test_hostile_offers_never_reach_placement_unbounded(raw: list[dict[str, Any]]) -> None:
    text = json.dumps({"type": "OFFERS", "offers": {"offers": raw}}, allow_nan=True).encode()
    (ev,) = protocol().on_record(text, 1.0)
    assert isinstance(ev, (Offers, Unknown))
    if not isinstance(ev, Offers) or not ev.offers:
        return
    for o in ev.offers:  # what was kept is sane
        for q in (o.cpus, o.mem, o.disk, o.gpus):
            assert math.isfinite(q) and q >= 0
        assert all(1 <= b <= e <= 65535 for b, e in o.ports)
    by_id = {o.id: o for o in ev.offers}
    host = offers_to_host_offer("h", list(by_id.values()))
    f = host.free
    assert all(math.isfinite(x) and x >= 0 for x in (f.cpu, f.mem, f.disk))
    assert 0 <= f.gpu <= MAX_GPUS_PER_AGENT and len(host.gpu_ids) == f.gpu
    assert len(host.ports) == f.ports and all(1 <= p <= 65535 for p in host.ports)
