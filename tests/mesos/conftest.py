"""Fixtures for the fake Mesos master (tests/mesos/fake_master.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.mesos.fake_master import FakeAgent, FakeMaster


def default_agents() -> list[FakeAgent]:
    """The recorded cluster: two CPU agents and one agent with 4 (accounting-only) GPUs."""
    base = {"cpus": 8, "mem": 16384, "disk": 100000, "ports": [(31000, 32000)]}
    return [
        FakeAgent(None, "127.0.0.1", dict(base, gpus=0), {"rack": "r1", "agent": "agent1"}, port=5051),
        FakeAgent(None, "127.0.0.1", dict(base, gpus=0), {"rack": "r2", "agent": "agent2"}, port=5052),
        FakeAgent(None, "127.0.0.1", dict(base, gpus=4), {"rack": "r1", "agent": "agent3"}, port=5053),
    ]


FAST = {"heartbeat_interval": 0.5, "allocation_interval": 0.05, "update_retry_interval": 0.3,
        "client_time_scale": 0.05, "agent_removal_timeout": 0.3}


@pytest.fixture
def fake_master_factory() -> Iterator[Callable[..., FakeMaster]]:
    """Build started FakeMasters (fast timings by default, recorded 3-agent cluster); all stopped afterwards."""
    made: list[FakeMaster] = []

    def make(agents: list[FakeAgent] | None = None, **kw: Any) -> FakeMaster:
        opts: dict[str, Any] = dict(FAST)
        opts.update(kw)
        m = FakeMaster(agents if agents is not None else default_agents(), **opts).start()
        made.append(m)
        return m

    yield make
    for m in made:
        m.stop()


@pytest.fixture
def fake_master(fake_master_factory: Callable[..., FakeMaster]) -> FakeMaster:
    return fake_master_factory()
