"""The sim backend: its pure rules (durations, deterministic draws, hosts) and the backend itself, driven by an
injected clock and `run_due` (no timer thread) except where the thread itself is under test."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection
from typing import Any

import pytest

from peloton.domain.hostgroups import HostGroup
from peloton.domain.launch import GangLaunch, LaunchOutcome, LaunchResult, LaunchSpec, TaskStatus
from peloton.domain.resources import Resources
from peloton.domain.states import TaskState
from peloton.errors import InvalidArgument, NotFound
from peloton.hostmgr.sim.backend import (
    SimBackend,
    SimSettings,
    make_sim_backend,
    make_sim_host_groups,
    make_sim_hosts,
    sim_address,
)
from peloton.hostmgr.sim.durations import (
    Behaviour,
    behaviour,
    draw_duration,
    format_duration,
    parse_duration,
    parse_duration_range,
    unit_draw,
)
from peloton.hostmgr.usage import MAX_OFFER_PORTS, HostConfig, HostUsage, accounted

HOST_RES = Resources(cpu=8, mem=32 * 1024, gpu=4)


# --------------------------------------------------------------------------------------------------- pure rules

@pytest.mark.parametrize(("text", "seconds"), [
    ("30s", 30.0), ("1.5", 1.5), ("500ms", 0.5), ("2m", 120.0), ("1h", 3600.0), (" 2s ", 2.0), ("0", 0.0),
    (".25s", 0.25), ("10", 10.0), ("5d", 432000.0), ("1h30m", 5400.0), ("1.5h", 5400.0),
])
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "s", "abc", "-1s", "5w", "1e3", "1.5.2s", "30 s s", "inf", "1h30"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(InvalidArgument) as e:
        parse_duration(text)
    assert e.value.field == "PELOTON_SIM_DURATION"
    assert "PELOTON_SIM_DURATION" in e.value.message


def test_parse_duration_range() -> None:
    assert parse_duration_range("10s-60s") == (10.0, 60.0)
    assert parse_duration_range("30s") == (30.0, 30.0)
    assert parse_duration_range("500ms - 2") == (0.5, 2.0)
    for bad in ("60s-10s", "10s-", "-10s", "1s-2s-3s"):
        with pytest.raises(InvalidArgument):
            parse_duration_range(bad)


def test_draws_depend_only_on_seed_and_key() -> None:
    assert unit_draw(1, "a") == unit_draw(1, "a")
    assert unit_draw(1, "a") != unit_draw(2, "a")
    assert unit_draw(1, "a") != unit_draw(1, "b")
    # a fixed value: the draw must not change between releases (or benchmarks stop being comparable)
    assert unit_draw(0, "job-0-1") == 0.405360333877974
    draws = [draw_duration(7, f"j-{i}-1", 10.0, 60.0) for i in range(2000)]
    assert all(10.0 <= d < 60.0 for d in draws)
    assert min(draws) < 11.0 and max(draws) > 59.0  # spread over the whole range
    assert abs(sum(draws) / len(draws) - 35.0) < 1.5
    assert draw_duration(7, "x", 5.0, 5.0) == 5.0


def test_unit_draw_is_stable_across_processes() -> None:
    """BLAKE2b, not hash(): the same number in every process (PYTHONHASHSEED does not matter)."""
    import subprocess
    import sys

    code = "from peloton.hostmgr.sim.durations import unit_draw; print(repr(unit_draw(3, 'job-1-1')))"
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": str(s), "PATH": ""}).stdout.strip() for s in (1, 2)}
    assert outs == {repr(unit_draw(3, "job-1-1"))}


def test_behaviour_from_env() -> None:
    assert behaviour({}, 0, "t") == Behaviour(None, 0)
    assert behaviour({"PELOTON_SIM_DURATION": "2m", "PELOTON_SIM_EXIT_CODE": "3"}, 0, "t") == Behaviour(120.0, 3)
    b = behaviour({"PELOTON_SIM_DURATION": "10s-20s"}, 5, "t")
    assert b.duration == draw_duration(5, "t", 10.0, 20.0)
    assert behaviour({"PELOTON_SIM_START": "fail"}, 0, "t") == Behaviour(start_fails=True)
    assert behaviour({"PELOTON_SIM_START": "fail-permanent"}, 0, "t") == Behaviour(start_fails=True, permanent=True)
    assert behaviour({"PELOTON_SIM_START": "ok", "PELOTON_SIM_DURATION": ""}, 0, "t") == Behaviour()
    assert behaviour({"PELOTON_SIM_METRICS": " step_time=1.25 local_bsz=8 "}, 0, "t") == \
        Behaviour(metrics="step_time=1.25 local_bsz=8")
    for env, var in [({"PELOTON_SIM_EXIT_CODE": "x"}, "PELOTON_SIM_EXIT_CODE"),
                     ({"PELOTON_SIM_EXIT_CODE": "256"}, "PELOTON_SIM_EXIT_CODE"),
                     ({"PELOTON_SIM_EXIT_CODE": "-1"}, "PELOTON_SIM_EXIT_CODE"),
                     ({"PELOTON_SIM_START": "maybe"}, "PELOTON_SIM_START"),
                     ({"PELOTON_SIM_METRICS": "step_time=1\nstep_time=2"}, "PELOTON_SIM_METRICS"),
                     ({"PELOTON_SIM_METRICS": "x" * 1025}, "PELOTON_SIM_METRICS"),
                     ({"PELOTON_SIM_DURATION": "soon"}, "PELOTON_SIM_DURATION")]:
        with pytest.raises(InvalidArgument) as e:
            behaviour(env, 0, "t")
        assert e.value.field == var


def test_format_duration() -> None:
    assert [format_duration(s) for s in (0.5, 1.0, 1.5, 30.0, 60.0, 150.0)] == \
        ["500ms", "1s", "1.5s", "30s", "1m", "2m30s"]


def test_make_sim_hosts() -> None:
    hosts = make_sim_hosts(100, HOST_RES, racks=8, ports_per_host=500, seed=1)
    assert [h.hostname for h in hosts[:2]] == ["sim-00000", "sim-00001"]
    assert hosts[0].address == "10.0.0.1" and hosts[99].hostname == "sim-00099"
    assert len({h.address for h in hosts}) == 100
    assert sim_address(0) == "10.0.0.1" and sim_address(255) == "10.0.1.0" and sim_address(70000) == "10.1.17.113"
    h = hosts[3]
    assert h.capacity == Resources(cpu=8, mem=32 * 1024, gpu=4, ports=500)
    assert h.gpu_ids == (0, 1, 2, 3) and h.port_range == (31000, 31499)
    assert h.labels["host"] == h.hostname and h.labels["gpu_model"] == "sim-gpu"
    sizes: dict[str, int] = {}
    for x in hosts:
        sizes[x.labels["rack"]] = sizes.get(x.labels["rack"], 0) + 1
    assert sorted(sizes) == [f"r{k}" for k in range(8)]
    assert set(sizes.values()) <= {12, 13}  # 100 hosts over 8 racks, balanced
    # deterministic for a seed; another seed spreads hosts over racks differently
    assert make_sim_hosts(100, HOST_RES, racks=8, ports_per_host=500, seed=1) == hosts
    other = make_sim_hosts(100, HOST_RES, racks=8, ports_per_host=500, seed=2)
    assert [x.labels["rack"] for x in other] != [x.labels["rack"] for x in hosts]
    assert "gpu_model" not in make_sim_hosts(1, Resources(cpu=1, mem=1))[0].labels


def test_make_sim_host_groups() -> None:
    t4 = HostGroup(3, Resources(cpu=48, mem=192 * 1024, gpu=4), (("gpu_model", "t4"), ("nic_gbps", "50")))
    cpu = HostGroup(2, Resources(cpu=16, mem=64 * 1024), (("zone", "b"),))
    a100 = HostGroup(1, Resources(cpu=96, mem=1024 * 1024, gpu=8), (("gpu_link", "nvlink"), ("gpu_model", "a100"),
                                                                     ("rack", "fast")))
    hosts = make_sim_host_groups([t4, cpu, a100], racks=2, ports_per_host=10, seed=3)
    assert [h.hostname for h in hosts] == [f"sim-0000{i}" for i in range(6)]
    assert [h.address for h in hosts] == [sim_address(i) for i in range(6)]
    assert [h.capacity.gpu for h in hosts] == [4, 4, 4, 0, 0, 8] and hosts[5].capacity.cpu == 96
    assert hosts[0].labels == {"host": "sim-00000", "rack": hosts[0].labels["rack"], "gpu_model": "t4",
                               "nic_gbps": "50"}
    assert "gpu_model" not in hosts[3].labels and hosts[3].labels["zone"] == "b"
    # a group's labels come last: they may set the rack, and a gpu_model other than sim-gpu
    assert hosts[5].labels["rack"] == "fast" and hosts[5].labels["gpu_model"] == "a100"
    assert {h.labels["rack"] for h in hosts[:5]} == {"r0", "r1"}
    # one group is make_sim_hosts
    plain = HostGroup(4, HOST_RES, (("nic_gbps", "100"),))
    assert make_sim_host_groups([plain], 2, 10, 1) == make_sim_hosts(4, HOST_RES, 2, 10, 1, {"nic_gbps": "100"})
    assert make_sim_hosts(4, HOST_RES, 2, 10, 1)[0].labels["gpu_model"] == "sim-gpu"


@pytest.mark.parametrize(("args", "flag"), [
    ((0, 1, 1000), "--sim-hosts"), ((10, 0, 1000), "--sim-racks"), ((10, 11, 1000), "--sim-racks"),
    ((10, 2, 0), "--sim-ports-per-host"), ((10, 2, 40000), "--sim-ports-per-host"),
])
def test_make_sim_hosts_validates(args: tuple[int, int, int], flag: str) -> None:
    n, racks, ports = args
    with pytest.raises(InvalidArgument) as e:
        make_sim_hosts(n, HOST_RES, racks, ports)
    assert e.value.message.startswith(flag + ":")


# --------------------------------------------------------------------------------------------------- the backend

class Recorder:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.statuses: list[TaskStatus] = []
        self.changed: list[list[str]] = []
        self.hook: Callable[[TaskStatus], None] | None = None

    def __call__(self, st: TaskStatus) -> None:
        with self.lock:
            self.statuses.append(st)
        if self.hook is not None:
            self.hook(st)

    def hosts_changed(self, names: Collection[str]) -> None:
        self.changed.append(list(names))

    def states(self, task_id: str) -> list[TaskState]:
        with self.lock:
            return [s.state for s in self.statuses if s.task_id == task_id]

    def last(self, task_id: str) -> TaskStatus:
        with self.lock:
            return [s for s in self.statuses if s.task_id == task_id][-1]


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def spec(task_id: str, host: str = "sim-00000", *, cpu: float = 1.0, gpu_ids: tuple[int, ...] = (),
         ports: tuple[int, ...] = (), env: dict[str, str] | None = None) -> LaunchSpec:
    return LaunchSpec(task_id=task_id, job_id="job1", instance=0, attempt=1, hostname=host, command="",
                      env=env or {}, resources=Resources(cpu=cpu, mem=1024, gpu=len(gpu_ids), ports=len(ports)),
                      gpu_ids=gpu_ids, ports=ports)


def gang(*specs: LaunchSpec, gang_id: str = "job1/0") -> GangLaunch:
    return GangLaunch(gang_id, 1, tuple(specs))


def make(n: int = 4, seed: int = 0, clock: Clock | None = None) -> tuple[SimBackend, Recorder, Clock]:
    clock = clock or Clock()
    b = SimBackend(make_sim_hosts(n, HOST_RES, racks=2, ports_per_host=100), seed=seed, clock=clock,
                   timer_thread=False)
    rec = Recorder()
    b.start(rec, rec.hosts_changed)
    return b, rec, clock


def launch(b: SimBackend, *specs: LaunchSpec) -> LaunchResult:
    (r,) = b.launch([gang(*specs)])
    return r


def free(b: SimBackend, host: str = "sim-00000") -> Resources:
    (o,) = b.offers([host])
    return o.free


def test_launch_accounts_and_reports_running_for_every_member() -> None:
    b, rec, clock = make()
    r = launch(b, spec("t0", gpu_ids=(0, 1), ports=(31000,)), spec("t1", gpu_ids=(2,), ports=(31001, 31002)),
               spec("t2", "sim-00001", cpu=2))
    assert r == LaunchResult("job1/0", 1, LaunchOutcome.OK)
    assert [(s.task_id, s.state, s.hostname, s.time) for s in rec.statuses] == [
        ("t0", TaskState.RUNNING, "sim-00000", 1000.0), ("t1", TaskState.RUNNING, "sim-00000", 1000.0),
        ("t2", TaskState.RUNNING, "sim-00001", 1000.0)]
    assert free(b) == Resources(cpu=6, mem=30 * 1024, gpu=1, ports=97)
    (o,) = b.offers(["sim-00000"], with_ids=True)
    assert o.gpu_ids == (3,) and o.ports[:2] == (31003, 31004) and len(o.ports) == 97
    hosts = {h.hostname: h for h in b.hosts()}
    assert hosts["sim-00000"].task_ids == ("t0", "t1") and hosts["sim-00000"].state == "UP"
    assert hosts["sim-00000"].allocated == Resources(cpu=2, mem=2048, gpu=3, ports=3)
    assert hosts["sim-00001"].address == "10.0.0.2" and hosts["sim-00001"].labels["rack"] in ("r0", "r1")
    assert sorted(t.task_id for t in b.running()) == ["t0", "t1", "t2"]
    assert b.offers(["nope", "sim-00003"])[0].hostname == "sim-00003"
    assert len(b.offers()) == 4
    assert b.run_due(clock.t + 1e9) is None  # no duration: runs until killed
    assert len(rec.statuses) == 3


def test_a_gang_that_cannot_be_accounted_for_is_refused_whole() -> None:
    b, rec, _ = make()
    r = launch(b, spec("a", cpu=4), spec("b", cpu=5))  # 9 cpu on an 8-cpu host
    assert r.outcome == LaunchOutcome.REFUSED and r.task_id == "b" and "cpu" in r.message
    r = launch(b, spec("a"), spec("b", "sim-99999"))
    assert r.outcome == LaunchOutcome.REFUSED and "unknown host" in r.message
    r = launch(b, spec("a", gpu_ids=(0,)), spec("b", gpu_ids=(0,)))
    assert r.outcome == LaunchOutcome.REFUSED and "GPU 0" in r.message
    assert rec.statuses == [] and b.running() == [] and free(b) == Resources(cpu=8, mem=32 * 1024, gpu=4, ports=100)
    assert launch(b, spec("a")).outcome == LaunchOutcome.OK
    r = launch(b, spec("c"), spec("a"))
    assert (r.outcome, r.task_id, r.message) == (LaunchOutcome.REFUSED, "a", "task is already running")
    assert [t.task_id for t in b.running()] == ["a"]


def test_a_batch_accounts_for_earlier_gangs_and_answers_in_order() -> None:
    b, rec, _ = make()
    rs = b.launch([gang(spec("a", cpu=6), gang_id="j/0"), gang(spec("b", cpu=6), gang_id="j/1"),
                   gang(spec("c", "sim-00001", cpu=6), gang_id="j/2")])
    assert [r.outcome for r in rs] == [LaunchOutcome.OK, LaunchOutcome.REFUSED, LaunchOutcome.OK]
    assert [r.gang_id for r in rs] == ["j/0", "j/1", "j/2"]
    assert [s.task_id for s in rec.statuses] == ["a", "c"]


def test_start_failure_fails_the_launch_and_leaves_nothing_registered() -> None:
    b, rec, _ = make()
    r = launch(b, spec("a"), spec("b", env={"PELOTON_SIM_START": "fail"}), spec("c"))
    assert r == LaunchResult("job1/0", 1, LaunchOutcome.FAILED, "b", "simulated start failure (PELOTON_SIM_START)")
    assert rec.statuses == [] and b.running() == [] and free(b).cpu == 8
    r = launch(b, spec("a", env={"PELOTON_SIM_START": "fail-permanent"}))
    assert r.outcome == LaunchOutcome.FAILED and r.permanent
    r = launch(b, spec("a", env={"PELOTON_SIM_DURATION": "soon"}))
    assert r.outcome == LaunchOutcome.FAILED and r.permanent and r.message.startswith("PELOTON_SIM_DURATION:")
    # a refusal comes first: nothing would be accounted for anyway
    r = launch(b, spec("a", cpu=100, env={"PELOTON_SIM_START": "fail"}))
    assert r.outcome == LaunchOutcome.REFUSED
    assert b.running() == []


def test_members_end_after_their_duration_with_their_exit_code() -> None:
    b, rec, clock = make()
    launch(b, spec("ok", env={"PELOTON_SIM_DURATION": "30s"}),
           spec("bad", env={"PELOTON_SIM_DURATION": "500ms", "PELOTON_SIM_EXIT_CODE": "3"}),
           spec("forever"))
    assert b.run_due(clock.t + 0.4) == pytest.approx(clock.t + 0.5)
    assert rec.states("bad") == [TaskState.RUNNING]
    assert b.run_due(clock.t + 0.5) == pytest.approx(clock.t + 30)
    bad = rec.last("bad")
    assert (bad.state, bad.exit_code, bad.reason, bad.message, bad.time, bad.hostname) == (
        TaskState.FAILED, 3, "failed", "exit code 3", clock.t + 0.5, "sim-00000")
    assert free(b).cpu == 6
    clock.t += 100  # the timer woke late: the status carries the simulated end, not the wake-up time
    assert b.run_due() is None
    ok = rec.last("ok")
    assert (ok.state, ok.exit_code, ok.time) == (TaskState.SUCCEEDED, 0, 1030.0)
    assert rec.states("forever") == [TaskState.RUNNING]
    assert [t.task_id for t in b.running()] == ["forever"] and free(b).cpu == 7


def test_ranges_draw_the_same_durations_for_the_same_seed() -> None:
    def ends(seed: int) -> dict[str, float]:
        b, rec, clock = make(seed=seed)
        env = {"PELOTON_SIM_DURATION": "10s-60s"}
        launch(b, *[spec(f"j-{i}-1", f"sim-0000{i % 4}", env=env) for i in range(8)])
        b.run_due(clock.t + 61)
        out = {s.task_id: s.time - 1000.0 for s in rec.statuses if s.state == TaskState.SUCCEEDED}
        assert len(out) == 8 and all(10 <= d <= 60 for d in out.values())
        return out

    first = ends(1)
    assert ends(1) == first
    assert ends(2) != first
    assert first["j-3-1"] == pytest.approx(draw_duration(1, "j-3-1", 10, 60))


def test_kill_after_start_ends_at_once_and_frees_the_host() -> None:
    b, rec, clock = make()
    launch(b, spec("a", env={"PELOTON_SIM_DURATION": "10s"}), spec("b"))
    clock.t += 1
    b.kill(["a", "unknown"])
    st = rec.last("a")
    assert (st.state, st.reason, st.time) == (TaskState.KILLED, "killed", 1001.0)
    assert [t.task_id for t in b.running()] == ["b"] and free(b).cpu == 7
    b.kill(["a"])  # twice: nothing more
    assert b.run_due(clock.t + 20) is None  # the dead timer entry is skipped
    assert rec.states("a") == [TaskState.RUNNING, TaskState.KILLED]


def test_member_killed_before_its_gang_starts_is_never_started() -> None:
    b, rec, _ = make()

    def kill_second_gang(st: TaskStatus) -> None:
        if st.task_id == "a0" and st.state == TaskState.RUNNING:
            b.kill(["b1"])  # gang j/1 is registered (accounted for) but not started yet

    rec.hook = kill_second_gang
    rs = b.launch([gang(spec("a0"), gang_id="j/0"), gang(spec("b0"), spec("b1", "sim-00001"), gang_id="j/1")])
    assert rs[0].outcome == LaunchOutcome.OK
    assert (rs[1].outcome, rs[1].message) == (LaunchOutcome.REFUSED, "killed before it started")
    for tid in ("b0", "b1"):
        assert rec.states(tid) == [TaskState.KILLED]
        assert rec.last(tid).message == "killed before the gang started"
    assert [t.task_id for t in b.running()] == ["a0"] and free(b, "sim-00001").cpu == 8


def test_member_killed_before_running_is_reported_ends_after_it() -> None:
    b, rec, clock = make()

    def kill_peer(st: TaskStatus) -> None:
        if st.task_id == "m0" and st.state == TaskState.RUNNING:
            b.kill(["m1"])  # m1 has started but its RUNNING is not reported yet

    rec.hook = kill_peer
    assert launch(b, spec("m0"), spec("m1", env={"PELOTON_SIM_DURATION": "1s"})).outcome == LaunchOutcome.OK
    assert rec.states("m1") == [TaskState.RUNNING, TaskState.KILLED]
    assert b.reconcile(["m1"])["m1"].state == TaskState.KILLED
    assert b.run_due(clock.t + 5) is None
    assert rec.states("m1") == [TaskState.RUNNING, TaskState.KILLED]


def test_host_failure_loses_its_tasks_until_it_recovers() -> None:
    b, rec, clock = make()
    launch(b, spec("a", env={"PELOTON_SIM_DURATION": "10s"}), spec("b"), spec("c", "sim-00001"))
    assert b.fail_host("sim-00000") == 2
    for tid in ("a", "b"):
        st = rec.last(tid)
        assert (st.state, st.reason, st.message, st.hostname) == (TaskState.LOST, "host failed",
                                                                 "host sim-00000 failed", "sim-00000")
    assert rec.states("c") == [TaskState.RUNNING]
    assert rec.changed == [["sim-00000"]]
    assert free(b) == Resources()
    (o,) = b.offers(["sim-00000"], with_ids=True)
    assert o.gpu_ids == () and o.ports == ()
    h = {x.hostname: x for x in b.hosts()}["sim-00000"]
    assert (h.state, h.task_ids, h.capacity.cpu) == ("DOWN", (), 8)
    r = launch(b, spec("d"))
    assert r.outcome == LaunchOutcome.REFUSED and "down" in r.message
    assert b.run_due(clock.t + 20) is None  # a's end is moot
    assert rec.states("a") == [TaskState.RUNNING, TaskState.LOST]
    assert b.recover_host("sim-00000") is True
    assert rec.changed == [["sim-00000"], ["sim-00000"]]
    assert free(b).cpu == 8 and {x.hostname: x for x in b.hosts()}["sim-00000"].state == "UP"
    assert b.recover_host("sim-00000") is False and len(rec.changed) == 2
    assert launch(b, spec("d")).outcome == LaunchOutcome.OK
    with pytest.raises(NotFound):
        b.fail_host("sim-77777")
    with pytest.raises(NotFound):
        b.recover_host("sim-77777")
    with pytest.raises(InvalidArgument):
        b.fail_host("sim-00001", recover_after_s=0)


def test_a_failed_host_recovers_by_itself_after_the_given_time() -> None:
    b, rec, clock = make()
    b.fail_host("sim-00002", recover_after_s=30)
    assert b.run_due(clock.t + 29) == pytest.approx(clock.t + 30)
    assert free(b, "sim-00002") == Resources()
    assert b.run_due(clock.t + 30) is None
    assert free(b, "sim-00002").cpu == 8 and rec.changed == [["sim-00002"], ["sim-00002"]]
    # failed again meanwhile: only the latest failure's recovery counts
    b.fail_host("sim-00002", recover_after_s=10)
    b.fail_host("sim-00002")  # no recovery this time
    assert b.run_due(clock.t + 100) is None and free(b, "sim-00002") == Resources()
    # recovered by hand: a pending recovery must not matter later
    b.fail_host("sim-00003", recover_after_s=10)
    b.recover_host("sim-00003")
    b.fail_host("sim-00003")
    b.run_due(clock.t + 100)
    assert free(b, "sim-00003") == Resources()


def test_host_failing_before_its_gang_starts_refuses_the_gang() -> None:
    b, rec, _ = make()

    def fail_host(st: TaskStatus) -> None:
        if st.task_id == "a0" and st.state == TaskState.RUNNING:
            b.fail_host("sim-00001")

    rec.hook = fail_host
    rs = b.launch([gang(spec("a0"), gang_id="j/0"), gang(spec("b0"), spec("b1", "sim-00001"), gang_id="j/1")])
    assert rs[1].outcome == LaunchOutcome.REFUSED and rs[1].message == "host sim-00001 failed before the gang started"
    assert rec.states("b0") == [] and rec.states("b1") == []
    assert [t.task_id for t in b.running()] == ["a0"] and free(b).cpu == 7


def test_reconcile() -> None:
    b, rec, clock = make()
    launch(b, spec("run"), spec("done", env={"PELOTON_SIM_DURATION": "1s"}))
    b.run_due(clock.t + 1)
    out = b.reconcile(["run", "done", "never"])
    assert out["run"].state == TaskState.RUNNING and out["run"].hostname == "sim-00000"
    assert out["done"] == rec.last("done")
    assert out["never"].state == TaskState.LOST and out["never"].reason == "unknown to the sim backend"


def test_read_log_is_synthetic_and_honours_offsets() -> None:
    b, rec, clock = make()
    launch(b, spec("t", gpu_ids=(1,), ports=(31005,), env={"PELOTON_SIM_DURATION": "2s",
                                                           "PELOTON_SIM_EXIT_CODE": "9"}))
    out, end = b.read_log("t", "stdout", 0, 1 << 20)
    assert out.decode() == ("1970-01-01T00:16:40.000Z RUNNING on sim-00000 (10.0.0.1): gpus=[1] ports=[31005], "
                            "runs 2s\n")
    assert end == len(out)
    assert b.read_log("t", "stderr", 0, 100) == (b"", 0)
    b.run_due(clock.t + 2)
    full, end = b.read_log("t", "stdout", 0, 1 << 20)
    assert full.decode().splitlines()[1] == "1970-01-01T00:16:42.000Z FAILED: exit code 9"
    assert b.read_log("t", "stdout", 10, 5) == (full[10:15], 15)
    assert b.read_log("t", "stdout", -10, 100) == (full[-10:], len(full))
    assert b.read_log("t", "stdout", len(full) + 50, 100) == (b"", len(full))
    assert b.read_log("t", "stderr", 0, 100)[0] == b"1970-01-01T00:16:42.000Z FAILED: exit code 9\n"
    with pytest.raises(NotFound):
        b.read_log("nope", "stdout", 0, 10)
    with pytest.raises(InvalidArgument):
        b.read_log("t", "stdin", 0, 10)


def test_a_member_reports_the_speed_its_env_says_and_others_measure_nothing() -> None:
    """PELOTON_SIM_METRICS is read back as the member's $PELOTON_METRICS_FILE (what `job get` and `model refit`
    read of a real member): simulated members measure nothing by themselves."""
    b, _, clock = make()
    launch(b, spec("m", env={"PELOTON_SIM_METRICS": "step_time=1.25 local_bsz=8", "PELOTON_SIM_DURATION": "1s"}),
           spec("q"))
    assert b.read_log("m", "metrics", -4096, 4096) == (b"step_time=1.25 local_bsz=8\n", 27)
    assert b.read_log("q", "metrics", -4096, 4096) == (b"", 0)
    b.run_due(clock.t + 1)  # ended: still readable while the backend remembers it
    assert b.read_log("m", "metrics", 0, 9) == (b"step_time", 9)
    with pytest.raises(NotFound):
        b.read_log("nope", "metrics", 0, 10)


def test_the_timer_thread_ends_tasks_on_time_and_stops() -> None:
    b = SimBackend(make_sim_hosts(2, HOST_RES), seed=0)
    rec = Recorder()
    ended = threading.Event()
    rec.hook = lambda st: ended.set() if st.state.terminal else None
    b.start(rec, rec.hosts_changed)
    try:
        t0 = time.time()
        launch(b, spec("long", env={"PELOTON_SIM_DURATION": "1h"}))  # the timer sleeps until then...
        launch(b, spec("short", env={"PELOTON_SIM_DURATION": "50ms"}))  # ...and is woken for an earlier end
        assert ended.wait(5)
        st = rec.last("short")
        assert st.state == TaskState.SUCCEEDED and st.time == pytest.approx(t0 + 0.05, abs=0.5)
        b.fail_host("sim-00001", recover_after_s=0.05)
        deadline = time.monotonic() + 5
        while len(rec.changed) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert rec.changed == [["sim-00001"], ["sim-00001"]]
    finally:
        b.stop()
    assert b._thread is not None and not b._thread.is_alive()


def test_a_timer_step_that_raises_is_counted_and_the_timer_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """The timer already outlived a step that raised (a bug), but only said so in its log: a task whose end was
    lost went past the alert on peloton_loop_errors_total."""
    from prometheus_client import REGISTRY

    def errors() -> float:
        return REGISTRY.get_sample_value("peloton_loop_errors_total", {"loop": "sim-timer"}) or 0.0

    b = SimBackend(make_sim_hosts(2, HOST_RES), seed=0)
    rec = Recorder()
    ended = threading.Event()
    rec.hook = lambda st: ended.set() if st.state.terminal else None
    end_locked = b._end_locked
    failed: list[str] = []

    def failing_once(t: Any, st: TaskStatus, **kw: Any) -> Any:
        if not failed:
            failed.append(t.task_id)
            raise RuntimeError("a bug in ending it")
        return end_locked(t, st, **kw)

    monkeypatch.setattr(b, "_end_locked", failing_once)
    before = errors()
    b.start(rec, rec.hosts_changed)
    try:
        launch(b, spec("first", env={"PELOTON_SIM_DURATION": "20ms"}))
        deadline = time.monotonic() + 5
        while not failed:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        launch(b, spec("second", env={"PELOTON_SIM_DURATION": "20ms"}))
        assert ended.wait(5)
        assert rec.last("second").state == TaskState.SUCCEEDED and errors() - before == 1
    finally:
        b.stop()


def test_make_sim_backend_from_settings() -> None:
    b = make_sim_backend(SimSettings(hosts=3, resources=Resources(cpu=2, mem=10), racks=3, seed=4,
                                     ports_per_host=10))
    assert [h.hostname for h in b.hosts()] == ["sim-00000", "sim-00001", "sim-00002"]
    assert sorted(h.labels["rack"] for h in b.hosts()) == ["r0", "r1", "r2"]
    assert b.seed == 4


def test_a_cluster_full_of_running_tasks_is_accounted_on_every_host() -> None:
    """10,000 running tasks on 1,000 hosts (each with a GPU, a port and a duration): every launch accepted, every
    task listed, and offers() for a few hosts shows what they take (the daemon's memory at scale is measured by
    benchmarks/memory_bench.py, not here)."""
    n_hosts, per_host = 1_000, 10
    b = SimBackend(make_sim_hosts(n_hosts, Resources(cpu=64, mem=256 * 1024, gpu=8), racks=40), seed=1,
                   clock=Clock(), timer_thread=False)
    b.start(lambda st: None, lambda names: None)
    env = {"PELOTON_SIM_DURATION": "10m-20m"}
    gangs = [GangLaunch(f"job{h}/0", 1, tuple(
        LaunchSpec(task_id=f"{h:06x}abcdef-{i}-1", job_id=f"{h:06x}abcdef", instance=i, attempt=1,
                   hostname=f"sim-{h:05d}", command="", env=env,
                   resources=Resources(cpu=1, mem=1024, gpu=1 if i < 8 else 0, ports=1),
                   gpu_ids=(i,) if i < 8 else (), ports=(31000 + i,))
        for i in range(per_host))) for h in range(n_hosts)]
    for k in range(0, len(gangs), 100):
        assert {r.outcome for r in b.launch(gangs[k:k + 100])} == {LaunchOutcome.OK}
    assert len(b.running()) == n_hosts * per_host
    offers = b.offers([f"sim-{h:05d}" for h in range(0, n_hosts, 100)], with_ids=True)
    assert [o.free.cpu for o in offers] == [54.0] * 10
    assert all(o.free.gpu == 0 and o.gpu_ids == () and 31000 not in o.ports for o in offers)


# --------------------------------------------------------------------------------------------------- server flags

def _settings(*flags: str) -> SimSettings | None:
    from peloton.cli.groups.server import _sim_settings
    from peloton.cli.main import build_parser

    return _sim_settings(build_parser().parse_args(["server", *flags]))


def test_server_sim_flags() -> None:
    assert _settings() is None
    assert _settings("--backend", "sim") == SimSettings()
    assert _settings("--backend", "sim", "--sim-hosts", "3") == SimSettings(hosts=3, racks=3)
    assert _settings("--backend", "sim", "--sim-hosts", "10000", "--sim-host-resources", "cpu=64,mem=256Gi,gpu=8",
                     "--sim-racks", "40", "--sim-seed", "1", "--sim-ports-per-host", "200") == SimSettings(
        hosts=10000, resources=Resources(cpu=64, mem=256 * 1024, gpu=8), racks=40, seed=1, ports_per_host=200)


def test_server_sim_host_labels_and_groups() -> None:
    s = _settings("--backend", "sim", "--sim-hosts", "3", "--sim-host-labels", "gpu_model=V100,nic_gbps=10")
    assert s == SimSettings(hosts=3, racks=3, labels=(("gpu_model", "v100"), ("nic_gbps", "10")))
    assert {h.labels["gpu_model"] for h in make_sim_backend(s).hosts()} == {"v100"}
    s = _settings("--backend", "sim", "--sim-host-group", "8:cpu=48,mem=192Gi,gpu=4:gpu_model=t4,nic_gbps=50",
                  "--sim-host-group", "4:cpu=96,mem=1Ti,gpu=8:gpu_model=a100,nic_gbps=400,gpu_link=nvlink")
    assert s is not None and s.total_hosts() == 12 and s.racks == 10
    assert s.groups == (
        HostGroup(8, Resources(cpu=48, mem=192 * 1024, gpu=4), (("gpu_model", "t4"), ("nic_gbps", "50"))),
        HostGroup(4, Resources(cpu=96, mem=1024 * 1024, gpu=8),
                  (("gpu_link", "nvlink"), ("gpu_model", "a100"), ("nic_gbps", "400"))))
    hosts = make_sim_backend(s).hosts()
    assert [h.labels["gpu_model"] for h in hosts] == ["t4"] * 8 + ["a100"] * 4
    assert [h.capacity.gpu for h in hosts] == [4] * 8 + [8] * 4
    assert _settings("--backend", "sim", "--sim-host-group", "2:cpu=1").racks == 2  # type: ignore[union-attr]


@pytest.mark.parametrize(("flags", "error"), [
    (["--sim-hosts", "5"], "--sim-hosts: only with --backend sim"),
    (["--sim-host-group", "1:cpu=1"], "--sim-host-group: only with --backend sim"),
    (["--sim-host-labels", "a=b"], "--sim-host-labels: only with --backend sim"),
    (["--backend", "sim", "--sim-host-labels", "nic_gbps=fast"],
     "--sim-host-labels: labels.nic_gbps: expected a positive number of Gbit/s, got 'fast'"),
    (["--backend", "sim", "--sim-host-resources", "cpu=4", "--sim-host-labels", "gpu_model=t4"],
     "--sim-host-labels: labels.gpu_model: the hosts have no GPUs (gpu=0)"),
    (["--backend", "sim", "--sim-host-group", "1:cpu=1", "--sim-hosts", "4"],
     "--sim-host-group: not with --sim-hosts: the hosts are the groups' (make those hosts a group of their own: "
     "--sim-host-group COUNT:RESOURCES[:LABELS])"),
    (["--backend", "sim", "--sim-host-group", "1:cpu=1", "--sim-host-resources", "cpu=2", "--sim-host-labels",
      "a=b"], "--sim-host-group: not with --sim-host-resources, --sim-host-labels: the hosts are the groups'"),
    (["--backend", "sim", "--sim-host-group", "1:cpu=1", "--sim-host-group", "2:cpu=1:gpu_link=nvlink"],
     "--sim-host-group[1]: labels.gpu_link: the hosts have no GPUs (gpu=0)"),
    (["--backend", "sim", "--sim-host-group", "3:cpu=1", "--sim-racks", "4"],
     "--sim-racks: must be 1..3 (the number of hosts), got 4"),
    (["--backend", "sim", "--local-host-group", "1:cpu=1"], "--local-host-group: only with --backend local"),
    (["--backend", "sim", "--local-host-labels", "a=b"], "--local-host-labels: only with --backend local"),
    (["--backend", "mesos", "--sim-seed", "1"], "--sim-seed: only with --backend sim"),
    (["--backend", "sim", "--sim-hosts", "0"], "--sim-hosts: must be 1..1000000, got 0"),
    (["--backend", "sim", "--sim-hosts", "3", "--sim-racks", "4"], "--sim-racks: must be 1..3 (the number of hosts), got 4"),
    (["--backend", "sim", "--sim-ports-per-host", "0"], "--sim-ports-per-host: must be 1..34536, got 0"),
    (["--backend", "sim", "--sim-host-resources", "mem=1Gi"], "--sim-host-resources: cpu must be greater than 0"),
    (["--backend", "sim", "--sim-host-resources", "cpu=x"], "--sim-host-resources: could not convert string to float: 'x'"),
    (["--backend", "sim", "--local-hosts", "2"], "--local-hosts: only with --backend local"),
    (["--backend", "sim", "--local-host-resources", "cpu=1"], "--local-host-resources: only with --backend local"),
])
def test_server_sim_flags_are_checked(flags: list[str], error: str) -> None:
    with pytest.raises(InvalidArgument) as e:
        _settings(*flags)
    assert e.value.message.startswith(error)


def test_statuses_go_to_the_host_manager_as_one_batch_per_gang_and_per_timer_step() -> None:
    """With a batch callback (the host manager's: one wake of its event long poll), a gang's RUNNING statuses are
    one call, and so are the ends of one timer step; in order, and none is also reported one at a time."""
    clock = Clock()
    b = SimBackend(make_sim_hosts(4, HOST_RES, racks=2, ports_per_host=100), seed=0, clock=clock,
                   timer_thread=False)
    single = Recorder()
    batches: list[list[tuple[str, TaskState]]] = []
    b.start(single, single.hosts_changed, lambda sts: batches.append([(s.task_id, s.state) for s in sts]))
    r = launch(b, spec("a", env={"PELOTON_SIM_DURATION": "1s"}), spec("b", env={"PELOTON_SIM_DURATION": "1s"}),
               spec("c", host="sim-00001"))
    assert r.outcome == LaunchOutcome.OK
    assert batches == [[("a", TaskState.RUNNING), ("b", TaskState.RUNNING), ("c", TaskState.RUNNING)]]
    b.run_due(clock.t + 1)
    assert batches[1:] == [[("a", TaskState.SUCCEEDED), ("b", TaskState.SUCCEEDED)]]
    b.kill(["c"])
    assert batches[2:] == [[("c", TaskState.KILLED)]]
    assert single.statuses == []


def test_a_gang_killed_before_its_start_is_reported_killed_in_one_batch() -> None:
    clock = Clock()
    b = SimBackend(make_sim_hosts(2, HOST_RES, racks=1, ports_per_host=100), seed=0, clock=clock,
                   timer_thread=False)
    batches: list[list[tuple[str, TaskState]]] = []
    rec = Recorder()
    b.start(rec, rec.hosts_changed, lambda sts: batches.append([(s.task_id, s.state) for s in sts]))
    # the kill lands between the gang's registration and its start (the window a launch leaves unlocked)
    original = b._start_gang

    def kill_first(g: GangLaunch, tasks: list) -> LaunchResult:
        b.kill(["x"])
        return original(g, tasks)

    b._start_gang = kill_first  # type: ignore[method-assign]
    r = launch(b, spec("x"), spec("y"))
    assert r.outcome == LaunchOutcome.REFUSED
    assert batches == [[("x", TaskState.KILLED), ("y", TaskState.KILLED)]]
    assert b.running() == [] and free(b).cpu == HOST_RES.cpu


def test_offers_with_ids_list_the_free_ports_lowest_first_up_to_the_cap() -> None:
    wide = HostUsage(HostConfig("w", HOST_RES, (0, 1), port_range=(20000, 22999)))
    o = wide.offer(True)
    assert o.ports == tuple(range(20000, 20000 + MAX_OFFER_PORTS)) and o.free.ports == MAX_OFFER_PORTS
    assert wide.offer(True, taken={20001}).ports[:3] == (20000, 20002, 20003)
    narrow = HostUsage(HostConfig("n", HOST_RES, (0, 1), port_range=(31000, 31004)))
    assert narrow.offer(True).ports == (31000, 31001, 31002, 31003, 31004)
    narrow.add(accounted(spec("t", host="n", gpu_ids=(1,), ports=(31000, 31002))))
    o = narrow.offer(True)
    assert (o.ports, o.gpu_ids, o.free.ports, o.free.gpu) == ((31001, 31003, 31004), (0,), 3, 1)
    assert narrow.offer(False).ports == ()
