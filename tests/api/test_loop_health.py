"""Health that means something, through a real daemon with the default settings (in-process, over real gRPC) and
every one of its loops running under a clock the test moves by hand (tests/clocks.py):

- idle for three hours of that clock, it is SERVING throughout, and no loop is reported stuck (the retention and
  sandbox loops run every 10 minutes: an idle loop is not a stuck one);
- each loop in turn stalled in a pass (a pass that blocks): once the stall outlasts that loop's patience the daemon
  and the health service of the loop's role turn NOT_SERVING (and `peloton_loop_stuck` says which loop), the other
  roles stay SERVING, and all is SERVING again once the pass returns.

The test moves its clock by STEP_S at a time, and only once every loop has done what the time so far asked of it
(each waits for its next pass), so a pass never looks longer than it was. The long polls of the launcher, task-events
and placement loops (a second of real time each) are shortened, which changes nothing but how long the test takes.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import REGISTRY

from peloton import server
from peloton.loop import Loop
from peloton.observability.health import loop_roles, patience_s
from peloton.server import Daemon
from peloton.settings import ServerConfig
from tests.clocks import ManualClock, settle
from tests.dbutil import postgres_database

STEP_S = 55.0  # under the shortest patience (90 s): no wait for a due pass ever looks overdue while a step settles
HOURS = 3
SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
ROLES = ("jobmgr", "resmgr", "placement", "hostmgr")
# every loop of the all-in-one daemon on the local backend with the default settings
EVERY_LOOP = {"launcher-0", "launcher-1", "launcher-2", "launcher-3", "task-events", "reconciler", "retention",
              "store", "placement", "health", "local-logrotate", "local-sandboxes"}


@contextlib.contextmanager
def _daemon(tmp_path: Path, db_url: str | None, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Daemon, ManualClock]]:
    monkeypatch.setattr(server, "LONG_POLL_MS", 2)
    clock = ManualClock()
    # the defaults but for where it listens, its store and its data dir (no metrics port: tests share the machine)
    d = Daemon(ServerConfig(listen="127.0.0.1:0", db_url=db_url, data_dir=tmp_path / "data", metrics_listen=""),
               clock)
    d.start()
    try:
        yield d, clock
    finally:
        d.stop()


def _status(d: Daemon, service: str) -> int:
    with grpc.insecure_channel(d.address) as ch:
        return int(health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=service),
                                                        timeout=10).status)


def _stuck_metric(name: str) -> float | None:
    return REGISTRY.get_sample_value("peloton_loop_stuck", {"loop": name})


def _step(clock: ManualClock, loops: list[Loop], stalled: Loop | None = None,
          entered: threading.Event | None = None) -> None:
    """Move the clock one step, then wait until every loop waits for its next pass (a stalled one: or is in its
    stalled pass)."""
    clock.advance(STEP_S)
    names = {f"loop-{lp.name}" for lp in loops if lp is not stalled}
    settle(lambda: clock.idle(names), f"every loop but {stalled and stalled.name} waiting")
    if stalled is not None:
        assert entered is not None
        settle(lambda: entered.is_set() or clock.idle({f"loop-{stalled.name}"}), f"{stalled.name} waiting or stalled")


@pytest.mark.parametrize("store", ["sqlite", "postgresql"])
def test_an_idle_daemon_with_the_default_settings_is_serving_for_hours(
        store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(postgres_database()) if store == "postgresql" else None
        d, clock = stack.enter_context(_daemon(tmp_path, url, monkeypatch))
        loops = d.all_loops()
        assert {lp.name for lp in loops} == EVERY_LOOP
        runs_before = REGISTRY.get_sample_value("peloton_loop_runs_total", {"loop": "retention"}) or 0.0

        seen: list[tuple[float, int]] = []  # (clock, status) of every check a watcher made meanwhile
        done = threading.Event()

        def watch() -> None:
            with grpc.insecure_channel(d.address) as ch:
                stub = health_pb2_grpc.HealthStub(ch)
                while not done.is_set():
                    st = stub.Check(health_pb2.HealthCheckRequest(service="peloton"), timeout=10).status
                    seen.append((clock.now(), int(st)))
                    done.wait(0.01)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        start = clock.now()
        try:
            while clock.now() - start < HOURS * 3600:
                _step(clock, loops)
                assert _status(d, "peloton") == SERVING, (clock.now() - start, d._stuck)  # noqa: SLF001
                for role in ROLES:
                    assert _status(d, f"peloton.{role}") == SERVING, (role, clock.now() - start)
                assert {lp.name: _stuck_metric(lp.name) for lp in loops} == dict.fromkeys(EVERY_LOOP, 0.0)
        finally:
            done.set()
            watcher.join(10)
        assert seen and all(st == SERVING for _, st in seen), [(t - start, st) for t, st in seen if st != SERVING][:5]
        # the slow loops did run, each when its period said: every 600 s of the clock (at the first step after)
        runs = (REGISTRY.get_sample_value("peloton_loop_runs_total", {"loop": "retention"}) or 0.0) - runs_before
        assert runs >= HOURS * 3600 // (600 + STEP_S)


def test_each_loop_stalled_in_a_pass_turns_the_daemon_and_its_role_not_serving_until_it_moves(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with _daemon(tmp_path, None, monkeypatch) as (d, clock):
        loops = d.all_loops()
        assert {lp.name for lp in loops} == EVERY_LOOP
        for lp in loops:
            entered, release = threading.Event(), threading.Event()
            began: list[float] = []
            real = lp._run_once  # noqa: SLF001

            def stalled(lp: Loop = lp, real=real, entered=entered, release=release, began=began) -> bool:  # type: ignore[no-untyped-def]
                lp._run_once = real  # noqa: SLF001 - stalls once
                began.append(clock.now())
                entered.set()
                release.wait(60)
                return False

            lp._run_once = stalled  # noqa: SLF001
            while not entered.is_set():  # its next pass, when its period says
                _step(clock, loops, lp, entered)
            patience = patience_s(lp.interval_s)
            while clock.now() + STEP_S - began[0] <= patience:  # stalled, but not past its patience yet
                _step(clock, loops, lp, entered)
                assert _status(d, "peloton") == SERVING, (lp.name, clock.now() - began[0])
            _step(clock, loops, lp, entered)
            mine = loop_roles(lp.name, ROLES)
            assert mine, lp.name
            assert _status(d, "peloton") == NOT_SERVING, lp.name
            assert _status(d, "") == NOT_SERVING, lp.name
            for role in ROLES:
                assert _status(d, f"peloton.{role}") == (NOT_SERVING if role in mine else SERVING), (lp.name, role)
            assert {x.name for x in loops if _stuck_metric(x.name)} == {lp.name}

            release.set()
            settle(lambda: clock.idle({f"loop-{x.name}" for x in loops}), f"{lp.name} waiting again")
            assert _status(d, "peloton") == SERVING, lp.name
            for role in ROLES:
                assert _status(d, f"peloton.{role}") == SERVING, (lp.name, role)
            assert not any(_stuck_metric(x.name) for x in loops), lp.name
