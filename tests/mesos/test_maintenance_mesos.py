"""Mesos maintenance windows: an agent the master announces maintenance on (INVERSE_OFFERS, and `unavailability`
in its offers) is drained like `peloton host drain --deadline <window start>`: no new gangs, the gangs still
there preempted whole when the window starts (no attempt used) and placed elsewhere; the inverse offer is left
unanswered while our tasks are there and accepted once none is; a lifted window (RESCIND_INVERSE_OFFER, or offers
without `unavailability`) puts it back."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from peloton.cli import render
from peloton.domain.launch import TaskStatus
from peloton.domain.states import TaskState
from peloton.hostmgr.mesos.backend import MesosBackend, MesosOptions
from peloton.hostmgr.mesos.client import MesosClient
from tests.e2e.harness import wait_until
from tests.mesos.fake_master import FakeMaster
from tests.mesos.test_mesos_backend_e2e import (
    Factory,
    MesosDaemon,
    agent_of,
    cpu_agents,
    daemons,  # noqa: F401 - fixture
    fid_of,
    start_daemon,  # noqa: F401 - fixture
    wait_whole,
)
from tests.mesos.test_mesos_backend_unit import launch, spec

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

BIG = """
name: big
instances: 2
sla: {{preemption_grace: 1s}}
task:
  command: sleep 1000
  resources: {{cpu: 8, mem: 64Mi}}
"""


def _hosts(d: MesosDaemon) -> dict[str, dict[str, object]]:
    return {h["hostname"]: h for h in json.loads(d.cli("host", "list", "-o", "json").stdout)["hosts"]}


def _answers(fake: object, kind: str) -> list[dict[str, Any]]:
    return [c["body"][kind.lower()] for c in fake.calls_of(kind)]  # type: ignore[attr-defined]


def _inverse_offers(fake: FakeMaster, agent_id: str) -> list[str]:
    """The ids of the inverse offers the master sent for the agent so far."""
    return [io["id"]["value"] for _, e in list(fake.events) if e["type"] == "INVERSE_OFFERS"
            for io in e["inverse_offers"]["inverse_offers"] if io["agent_id"]["value"] == agent_id]


def _answered(fake: FakeMaster, kind: str, agent_id: str) -> list[dict[str, Any]]:
    ids = set(_inverse_offers(fake, agent_id))
    return [a for a in _answers(fake, kind) if ids & {i["value"] for i in a["inverse_offer_ids"]}]


def test_a_maintenance_window_drains_the_agent_and_moves_its_gang_when_it_starts(
        fake_master_factory: Factory, start_daemon: Callable[..., MesosDaemon], tmp_path: Path) -> None:  # noqa: F811
    fake = fake_master_factory(cpu_agents(3, ids=True))
    d = start_daemon(fake.url)
    fid_of(fake)
    job = d.create(BIG.format(), tmp_path)
    before = wait_whole(fake, d, job)
    busy = {agent_of(fake, t["task_id"]) for t in before}
    victim_agent = sorted(busy)[0]
    idle_agent = ({"agent-S0", "agent-S1", "agent-S2"} - busy).pop()
    victim_host = next(t["host"] for t in before if agent_of(fake, t["task_id"]) == victim_agent)

    # maintenance on the idle agent: no task of ours there (an offer held), the inverse offer is accepted at once
    fake.schedule_maintenance(idle_agent, time.time() + 3600)
    wait_until(lambda: _answered(fake, "ACCEPT_INVERSE_OFFERS", idle_agent), 10, 0.1,
               "the idle agent's inverse offer accepted")
    idle_host = f"127.0.0.1:{next(a.port for a in fake.agents if a.agent_id == idle_agent)}"
    wait_until(lambda: _hosts(d)[idle_host].get("maintenance"), 10, 0.2, "the idle agent drained")
    fake.cancel_maintenance(idle_agent)  # lifted (RESCIND_INVERSE_OFFER): in service again
    wait_until(lambda: not _hosts(d)[idle_host].get("maintenance") and not _hosts(d)[idle_host].get("drain"), 10,
               0.2, "the idle agent back in service")
    # ... and on the busy one, starting in 4 s: left unanswered while our member is there (so that the master can
    # rescind it), drained
    fake.schedule_maintenance(victim_agent, time.time() + 4)
    wait_until(lambda: [i for i in fake.inverse_offers() if i["agent_id"] == victim_agent], 10, 0.1,
               "the busy agent's inverse offer sent")
    h = wait_until(lambda: (lambda h: h if h.get("maintenance") else None)(_hosts(d)[victim_host]), 10, 0.2,
                   "host list showing the window")
    assert h["drain"] == "draining" and h["drain_deadline"] > render.rfc3339(time.time())  # RFC 3339 strings sort
    assert "draining for maintenance (preempts in" in d.cli("host", "list").stdout

    # the window starts: the gang is preempted whole, and runs again on the two agents in service (same attempt)
    def moved() -> list[dict[str, object]] | None:
        ts = wait_whole(fake, d, job, timeout=60)
        fresh = {t["task_id"] for t in ts}.isdisjoint({t["task_id"] for t in before})
        return ts if fresh and victim_agent not in {agent_of(fake, str(t["task_id"])) for t in ts} else None

    wait_until(moved, 60, 0.5, "the gang moved off the agent in maintenance")
    wait_until(lambda: _answered(fake, "ACCEPT_INVERSE_OFFERS", victim_agent), 10, 0.1,
               "the vacated agent's inverse offer accepted")
    assert not _answered(fake, "DECLINE_INVERSE_OFFERS", victim_agent)
    gang = d.job(job)["status"]["gangs"][0]
    assert gang["attempt"] == 1 and gang["preemptions"] == 1, gang

    # the window is lifted: the agent takes gangs again
    fake.cancel_maintenance(victim_agent)
    wait_until(lambda: not _hosts(d)[victim_host].get("maintenance"), 10, 0.2, "the window lifted")
    assert _hosts(d)[victim_host].get("drain", "") == ""



def test_a_window_lifted_while_our_task_is_on_the_agent_and_we_are_suppressed_puts_it_back_in_service(
        fake_master_factory: Factory) -> None:
    """The backend with its real client, suppressed (no demand), so the master offers it nothing: what tells it that
    a window on an agent its task runs on was lifted is the master rescinding the inverse offer, which a master does
    only for one still outstanding. The backend declined it (and kept every answered id as if outstanding): the
    master sent nothing when the window was lifted, and the agent stayed draining for maintenance (its gang to be
    preempted at the old window's start)."""
    fake = fake_master_factory(cpu_agents(2, ids=True))
    b = MesosBackend(MesosOptions(idle_suppress_s=0.5, reconcile_wait_s=0.5),
                     lambda c, f, ev: MesosClient([fake.url], c, ev, framework_id=f), lambda: None, lambda f: None)
    statuses: list[TaskStatus] = []
    b.start(statuses.append)
    try:
        host = wait_until(lambda: sorted(o.hostname for o in b.offers()), 10, 0.1, "offers")[0]
        launch(b, [spec("job-0-1", host)])

        def running() -> bool:  # (updates acknowledged as the host manager does once the job manager has them)
            acks = [st.ack for st in statuses if st.ack]
            if acks:
                b.acknowledge(acks)
            return any(st.state == TaskState.RUNNING for st in statuses)

        wait_until(running, 10, 0.1, "the task running")
        wait_until(lambda: fake.calls_of("SUPPRESS"), 10, 0.1, "the idle backend suppressed")
        agent = agent_of(fake, "job-0-1")
        fake.schedule_maintenance(agent, time.time() + 3600)
        wait_until(lambda: host in b.maintenance(), 10, 0.1, "the agent draining for maintenance")
        fake.cancel_maintenance(agent)
        wait_until(lambda: host not in b.maintenance(), 10, 0.1, "the agent back in service")
        assert not _answered(fake, "DECLINE_INVERSE_OFFERS", agent)
    finally:
        b.stop()
