"""Whole-gang preemption through the CLI and the real daemon (SQLite and PostgreSQL; the local backend with two
simulated hosts of 4 cpu, 4Gi, 2 GPUs: 4 GPUs in all). The settling window is 1 s here (10 s by default).

- reclaim: pool /b fills the cluster while /a is idle; /a submits and gets its reservation back within settling
  window + grace + a few seconds; /b's victim is preempted whole (no gang is ever seen RUNNING with a member that
  is not), its members had their grace (they trap SIGTERM, "checkpoint" for 6 s, longer than a plain kill allows,
  and write a file), and it runs again later as a new run that used up no attempt (its job allows one);
- priority: a high-priority gang preempts the lower-priority gang of its pool that has run the shortest time;
- kill -9 of the daemon while a victim is in its grace period: the preemption is finished after the restart;
- starvation: a gang needing every GPU of both hosts starts within a stated bound despite a stream of 1-GPU gangs
  (head-of-line reservation);
- backfill: a short gang with a max_runtime runs on the hosts reserved for the waiting big gang, one without does
  not.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.harness import Daemon, serving, wait_until

pytestmark = pytest.mark.e2e


@dataclass
class PreemptDaemon(Daemon):
    def server_args(self) -> list[str]:
        return [*super().server_args(), "--preemption-settle", "1"]


@pytest.fixture
def pd(db_url: str, tmp_path: Path) -> Iterator[PreemptDaemon]:
    with serving(PreemptDaemon(tmp_path / "data", db_url)) as d:
        yield d


def _job(pool: str, name: str, command: str, *, priority: int = 0, grace: str = "5s", attempts: int = 1) -> str:
    return (f"name: {name}\nrespool: {pool}\ninstances: 2\n"
            f"sla: {{priority: {priority}, preemption_grace: {grace}}}\nretry: {{max_attempts: {attempts}}}\n"
            f"task: {{command: '{command}', resources: {{cpu: 0.5, mem: 64Mi, gpu: 1}}}}\n")


BEFORE_RUNNING = ("PENDING", "LAUNCHING", "LAUNCHED", "STARTING")


class GangSampler:
    """Samples every job's gangs until stopped; records any gang seen RUNNING with a member of the same run that
    has not started yet. The gangs are read first and the tasks after them (`job get` asks for both at once, so
    its tasks may be older than its gangs): a member of that run seen before RUNNING then really was, while the
    gang already said RUNNING. (A member that ended meanwhile, a preemption's, is no partial gang.)"""

    def __init__(self, d: Daemon, jobs: list[str]) -> None:
        self.d, self.jobs, self.samples = d, jobs, 0
        self.partial: list[tuple[str, Any, list[tuple[Any, Any]]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for j in list(self.jobs):
                r = self.d.cli("job", "get", j, "-o", "json", check=False)
                after = self.d.cli("task", "list", j, "-o", "json", check=False)
                if r.returncode != 0 or after.returncode != 0:
                    continue  # the daemon is restarting
                got: dict[str, Any] = json.loads(r.stdout)
                tasks = json.loads(after.stdout).get("tasks", [])
                for g in got["status"].get("gangs", []):
                    members = [t for t in tasks if t["instance"] in g["instances"]]
                    if g["state"] == "RUNNING" and any(t["attempt"] == g["run"] and t["state"] in BEFORE_RUNNING
                                                       for t in members):
                        self.partial.append((j, g, [(t["attempt"], t["state"]) for t in members]))
                self.samples += 1
            time.sleep(0.1)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


def _preempted_because(d: Daemon, job: str) -> str:
    """The reason member 0's history gives for its preemption."""
    events = json.loads(d.cli("task", "get", job, "0", "-o", "json").stdout)["events"]
    why = [e["reason"] for e in events if e["state"] == "PREEMPTING"]
    assert why, events
    return str(why[0])


def _gang(d: Daemon, job: str) -> dict[str, Any]:
    return d.job(job)["status"]["gangs"][0]


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)  # resmgr's rule, not the store's: one store
def test_reclaim_preempts_whole_gangs_with_their_grace_and_costs_no_attempt(pd: PreemptDaemon,
                                                                            tmp_path: Path) -> None:
    d = pd
    wait_until(lambda: json.loads(d.cli("pool", "get", "/", "-o", "json").stdout)["entitlement"],  # null until known
               what="the cluster's capacity reported")
    d.cli("pool", "create", "/a", "--reservation", "gpu=2")
    d.cli("pool", "create", "/b")
    marks = tmp_path / "marks"
    marks.mkdir()
    marks.chmod(0o777)
    # each /b member, on SIGTERM, "checkpoints" for 6 s (longer than a plain kill's 5 s grace), then writes a file
    # with the grace it was told and exits
    trap = (f"trap \"sleep 6; echo $PELOTON_PREEMPTION_GRACE > {marks}/term-$PELOTON_TASK_ID; exit 0\" TERM; "
            f"echo up > {marks}/up-$PELOTON_TASK_ID; sleep 300 & wait")
    b1 = d.create(_job("/b", "b1", trap, grace="9s"), tmp_path)
    d.wait_state(b1, "RUNNING")
    b2 = d.create(_job("/b", "b2", trap, grace="9s"), tmp_path)
    d.wait_state(b2, "RUNNING")  # /b holds all 4 GPUs: /a is idle, so /b is entitled to them
    sampler = GangSampler(d, [b1, b2])
    try:
        t0 = time.monotonic()
        # /a runs until the test has looked at it: a gang that ended by itself (it once slept 4 s) releases its
        # allocation, and on a loaded machine the checks below can take longer than that
        a = d.create(_job("/a", "a", f"until [ -e {marks}/a-may-end ]; do sleep 0.2; done"), tmp_path)
        sampler.jobs.append(a)
        d.wait_state(a, "RUNNING", timeout=1 + 9 + 20)
        took = time.monotonic() - t0
        # the shortest-running of /b's gangs (b2) was preempted, whole; b1 runs on
        g2 = _gang(d, b2)
        assert g2["state"] in ("PREEMPTED", "ADMITTED", "LAUNCHING", "RUNNING"), g2
        assert (g2["attempt"], g2["run"], g2["preemptions"]) == (1, 2, 1), g2  # the same attempt, a new run
        assert _gang(d, b1)["state"] == "RUNNING" and _gang(d, b1)["attempt"] == 1
        # its members had SIGTERM and were told their grace
        for i in (0, 1):
            assert (marks / f"term-{b2}-{i}-1").read_text().strip() == "9"
        assert not list(marks.glob(f"term-{b1}-*"))
        assert _gang(d, b2)["reason"].startswith("preempted, queued again; waiting for admission: over pool /b's "
                                                 "entitlement"), _gang(d, b2)
        # the history says why
        assert _preempted_because(d, b2) == (f"preempted: pool /b is over its entitlement and pool /a needs its "
                                             f"share back for gang {a}/0")
        # /a runs at its reservation
        pool_a = json.loads(d.cli("pool", "get", "/a", "-o", "json").stdout)
        assert pool_a["allocated"]["gpu"] == 2
        # once /a is done, b2 runs again as run 2, although its job allows a single attempt
        (marks / "a-may-end").touch()
        d.wait_state(a, "SUCCEEDED", timeout=30)
        wait_until(lambda: (marks / f"up-{b2}-0-2").exists() and (marks / f"up-{b2}-1-2").exists(), 30,
                   what="b2's second run")
        d.wait_state(b2, "RUNNING")
        assert {t["attempt"] for t in d.tasks(b2)} == {2}  # a task's attempt is its gang's run (its task id's)
        assert _gang(d, b2)["attempt"] == 1
        assert "RUNNING, attempt 1 (run 2: preempted 1x, which uses up no attempt)" in d.cli("job", "get", b2).stdout
    finally:
        sampler.stop()
    assert sampler.samples > 10 and not sampler.partial, sampler.partial
    print(f"reclaim: /a running {took:.1f}s after its submission (settle 1s, the victims' checkpoint 6s)")
    for j in (b1, b2):
        d.cli("job", "stop", j)


def test_priority_preempts_the_lower_priority_gang_that_ran_shortest(pd: PreemptDaemon, tmp_path: Path) -> None:
    d = pd
    low1 = d.create(_job("/", "low1", "sleep 300", priority=1), tmp_path)
    d.wait_state(low1, "RUNNING")
    low2 = d.create(_job("/", "low2", "sleep 300", priority=1), tmp_path)
    d.wait_state(low2, "RUNNING")
    # equal priority waits: it never preempts
    same = d.create(_job("/", "same", "sleep 300", priority=1), tmp_path)
    high = d.create(_job("/", "high", "sleep 300", priority=5, grace="1s"), tmp_path)
    d.wait_state(high, "RUNNING", timeout=20)
    assert _gang(d, low2)["preemptions"] == 1 and _gang(d, low2)["state"] == "PREEMPTED"
    assert _gang(d, low1)["state"] == "RUNNING" and _gang(d, same)["state"] == "QUEUED"
    assert _gang(d, low2)["reason"].startswith("preempted, queued again; "), _gang(d, low2)
    assert _preempted_because(d, low2) == f"preempted: for gang {high}/0 of pool / (priority 5)"
    queue = d.cli("queue").stdout
    assert low2 in queue and same in queue, queue
    for j in (low1, low2, same, high):
        d.cli("job", "stop", j)


def test_kill9_during_a_preemption_finishes_it_after_the_restart(pd: PreemptDaemon, tmp_path: Path) -> None:
    d = pd
    # the victim ignores SIGTERM: it holds its GPUs for its whole grace, and is then killed
    victim = d.create(_job("/", "victim", "trap \"\" TERM; sleep 300", grace="8s"), tmp_path)
    d.wait_state(victim, "RUNNING")
    filler = d.create(_job("/", "filler", "sleep 300", priority=0), tmp_path)
    d.wait_state(filler, "RUNNING")
    # the filler ran shorter, so it would go first: make the victim the only lower-priority gang
    d.cli("job", "stop", filler)
    d.wait_state(filler, "KILLED")
    other = d.create(_job("/", "other", "sleep 300", priority=9), tmp_path)
    d.wait_state(other, "RUNNING")
    high = d.create(_job("/", "high", "sleep 300", priority=5), tmp_path)
    wait_until(lambda: _gang(d, victim)["state"] == "PREEMPTING", 20, what="the victim preempting")
    d.kill9()
    d.start()
    sampler = GangSampler(d, [victim, high, other])
    try:
        d.wait_state(high, "RUNNING", timeout=30)
        g = _gang(d, victim)
        assert g["state"] == "PREEMPTED" and g["preemptions"] == 1, g
        assert {t["state"] for t in d.tasks(victim)} == {"PENDING"}
        assert _gang(d, other)["attempt"] == 1
    finally:
        sampler.stop()
    assert not sampler.partial, sampler.partial
    for j in (victim, high, other):
        d.cli("job", "stop", j)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # resmgr's rule, not the store's: one store
def test_a_big_gang_is_not_starved_by_a_stream_of_small_ones(pd: PreemptDaemon, tmp_path: Path) -> None:
    """Every GPU of both hosts for one gang, while 1-GPU gangs (3 s each) keep arriving: the hosts are reserved for
    it and it starts within settle + the small gangs' run + a few seconds."""
    d = pd
    small = "name: small\ninstances: 1\ntask: {command: 'sleep 3', resources: {cpu: 0.5, mem: 32Mi, gpu: 1}}\n"
    stop = threading.Event()
    smalls: list[str] = []

    def stream() -> None:
        while not stop.is_set():
            smalls.append(d.create(small, tmp_path))
            time.sleep(0.5)

    feeder = threading.Thread(target=stream, daemon=True)
    feeder.start()
    try:
        wait_until(lambda: len(smalls) >= 6, 20, what="the stream going")
        big = d.create(_job("/", "big", "sleep 2").replace("gpu: 1", "gpu: 2"), tmp_path)
        t0, before = time.monotonic(), len(smalls)
        # the bound: the settling window (1 s), then the small gangs on its hosts end (3 s), plus 12 s of slack for
        # this 2-core machine's polling and launches; without the reservation it never starts (the stream goes on)
        bound = 1 + 3 + 12
        wait_until(lambda: "waiting for reserved hosts" in d.cli("queue").stdout, bound, what="the reservation")
        d.wait_state(big, "RUNNING", "SUCCEEDED", timeout=bound - (time.monotonic() - t0))
        took = time.monotonic() - t0
        assert len(smalls) >= before + 3  # the stream went on meanwhile
    finally:
        stop.set()
        feeder.join(30)
    print(f"starvation: the big gang ran {took:.1f}s after its submission (settle 1s, small gangs of 3s)")
    for j in smalls:
        d.cli("job", "stop", j)


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)  # placement's rule: one store
def test_backfill_uses_reserved_hosts_only_for_gangs_that_end_in_time(pd: PreemptDaemon, tmp_path: Path) -> None:
    d = pd
    one = "instances: 1\ntask: {{command: 'sleep {s}', resources: {{cpu: 0.5, mem: 32Mi, gpu: 1}}}}\n"
    blocker = d.create("name: blocker\nsla: {max_runtime: 14s}\n" + one.format(s=10), tmp_path)
    d.wait_state(blocker, "RUNNING")
    big = d.create(_job("/", "big", "sleep 1").replace("gpu: 1", "gpu: 2"), tmp_path)  # every GPU of both hosts
    wait_until(lambda: "expected to start in" in d.cli("queue").stdout, 15, what="the reservation with a start")
    quick = d.create("name: quick\nsla: {max_runtime: 2s}\n" + one.format(s=1), tmp_path)
    slow = d.create("name: slow\n" + one.format(s=1), tmp_path)  # no max_runtime: never backfills
    d.wait_state(quick, "SUCCEEDED", timeout=15)
    assert d.state(big) == "PENDING" and d.state(slow) == "PENDING"
    assert "kept for gangs ahead in their queues" in _gang(d, slow)["reason"], _gang(d, slow)
    d.wait_state(big, "RUNNING", "SUCCEEDED", timeout=20)  # once the blocker ends
    d.wait_state(slow, "SUCCEEDED", timeout=20)
    first = {j: json.loads(d.cli("task", "get", j, "0", "-o", "json").stdout)["events"] for j in (big, slow)}
    started = {j: min(e["time"] for e in ev if e["state"] == "RUNNING") for j, ev in first.items()}
    assert started[slow] > started[big]


@dataclass
class FifoDaemon(PreemptDaemon):
    def server_args(self) -> list[str]:
        return [*super().server_args(), "--placement-order", "fifo"]


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # placement's rule: one store
def test_under_placement_order_fifo_nothing_starts_before_the_gang_that_waits(db_url: str, tmp_path: Path) -> None:
    """The backfill test's setting under `--placement-order fifo`: the short gang that backfill would place on
    the hosts kept for the big one waits behind it instead, says so, and starts only after it."""
    one = "instances: 1\ntask: {{command: 'sleep {s}', resources: {{cpu: 0.5, mem: 32Mi, gpu: 1}}}}\n"
    with serving(FifoDaemon(tmp_path / "data", db_url)) as d:
        blocker = d.create("name: blocker\nsla: {max_runtime: 14s}\n" + one.format(s=8), tmp_path)
        d.wait_state(blocker, "RUNNING")
        big = d.create(_job("/", "big", "sleep 1").replace("gpu: 1", "gpu: 2"), tmp_path)  # every GPU
        wait_until(lambda: _gang(d, big).get("reason"), 15, what="big's reason")
        quick = d.create("name: quick\nsla: {max_runtime: 2s}\n" + one.format(s=1), tmp_path)
        wait_until(lambda: "waiting behind gang" in _gang(d, quick).get("reason", ""), 15, what="quick's reason")
        assert d.state(blocker) == "RUNNING" and d.state(big) == "PENDING" and d.state(quick) == "PENDING"
        assert f"{big}/0" in _gang(d, quick)["reason"], _gang(d, quick)
        d.wait_state(big, "SUCCEEDED", timeout=30)  # once the blocker ends
        d.wait_state(quick, "SUCCEEDED", timeout=20)
        events = {j: json.loads(d.cli("task", "get", j, "0", "-o", "json").stdout)["events"] for j in (big, quick)}
        started = {j: min(e["time"] for e in ev if e["state"] == "RUNNING") for j, ev in events.items()}
        assert started[quick] > started[big]
