"""HostManager: the status-event log, acknowledgement after persistence, host versions for placement, claims,
launches (refused when stale or killed first) over a fake backend."""

from __future__ import annotations

import threading
import time
from collections.abc import Collection, Sequence

from peloton.domain.launch import GangLaunch, HostInfo, LaunchOutcome, LaunchResult, LaunchSpec, RunningTask, TaskStatus
from peloton.domain.placement import GangPlacement, HostOffer, MemberAssignment, PlacementFailure
from peloton.domain.resources import Resources
from peloton.domain.states import TaskState
from peloton.hostmgr.backend import HostsCallback, StatusCallback, StatusesCallback
from peloton.hostmgr.manager import HostManager


class FakeBackend:
    """Two hosts with 2 GPUs and ports 31000-31001 each; launches register what they take."""

    def __init__(self) -> None:
        self.cb: StatusCallback | None = None
        self.hosts_cb: HostsCallback | None = None
        self.acked: list[list[str]] = []
        self.launched: list[str] = []
        self.killed: list[str] = []
        self.used: dict[str, list[RunningTask]] = {"h1": [], "h2": []}
        self.during_launch: list[object] = []  # run while "starting" (to interleave other calls)
        self.windows: dict[str, float] = {}  # maintenance the cluster manager announced
        self.demanded = 0  # demand() calls: work waited for hosts

    def start(self, on_status: StatusCallback, on_hosts_changed: HostsCallback,
              on_statuses: StatusesCallback | None = None) -> None:
        self.cb, self.hosts_cb, self.batch_cb = on_status, on_hosts_changed, on_statuses

    def stop(self) -> None:
        pass

    def lead_again(self) -> None:
        pass

    def demand(self) -> None:
        self.demanded += 1

    def maintenance(self) -> dict[str, float]:
        return dict(self.windows)

    def offers(self, hostnames: Collection[str] | None = None, *, with_ids: bool = False) -> list[HostOffer]:
        out = []
        for h in sorted(self.used):
            if hostnames is not None and h not in hostnames:
                continue
            taken = self.used[h]
            gpus = tuple(g for g in (0, 1) if not any(g in t.gpu_ids for t in taken))
            ports = tuple(p for p in (31000, 31001) if not any(p in t.ports for t in taken))
            cap = Resources(cpu=4, mem=1024, gpu=2, ports=2)
            free = Resources(4 - sum(t.resources.cpu for t in taken), 1024, 0, len(gpus), len(ports))
            out.append(HostOffer(h, f"10.0.0.{h[1]}", free, gpus if with_ids else (), ports if with_ids else (),
                                 {"rack": "r1"}, cap, True))
        return out

    def hosts(self) -> list[HostInfo]:
        cap = Resources(cpu=4, mem=1024, gpu=2, ports=2)
        return [HostInfo(h, "", cap, Resources(), {"rack": "r1"}) for h in sorted(self.used)]

    def launch(self, gangs: Sequence[GangLaunch]) -> list[LaunchResult]:
        for fn in self.during_launch:
            fn()  # type: ignore[operator]
        for g in gangs:
            for t in g.tasks:
                self.used[t.hostname].append(RunningTask(t.task_id, t.hostname, t.resources, t.gpu_ids, t.ports))
                self.launched.append(t.task_id)
        return [LaunchResult(g.gang_id, g.attempt, LaunchOutcome.OK) for g in gangs]

    def kill(self, task_ids: Sequence[str], grace_s: float | None = None) -> None:
        self.killed += task_ids

    def reconcile(self, task_ids: Sequence[str]) -> dict[str, TaskStatus]:
        return {}

    def running(self) -> list[RunningTask]:
        return [t for ts in self.used.values() for t in ts]

    def acknowledge(self, acks: Sequence[str]) -> None:
        self.acked.append(list(acks))

    def read_log(self, task_id: str, stream: str, offset: int, max_bytes: int) -> tuple[bytes, int]:
        return b"", 0

    def remove_sandboxes(self, job_ids: Collection[str]) -> int:
        return 0

    def end(self, task_id: str) -> None:
        for h, ts in self.used.items():
            for t in ts:
                if t.task_id == task_id:
                    ts.remove(t)
                    assert self.cb is not None
                    self.cb(TaskStatus(task_id, TaskState.SUCCEEDED, 1.0, h))
                    return


def make(now: list[float] | None = None) -> tuple[HostManager, FakeBackend]:
    be = FakeBackend()
    clock = now or [100.0]
    hm = HostManager(be, clock=lambda: clock[0], claim_ttl_s=30)
    hm.start()
    return hm, be


def placed(gang: str, hosts: list[str], gpu: int = 1, attempt: int = 1) -> GangPlacement:
    job = gang.split("/")[0]
    r = Resources(1, 10, 0, gpu, 1)
    return GangPlacement(gang, job, attempt, tuple(MemberAssignment(i, f"{job}-{i}-{attempt}", h, "", r)
                                                   for i, h in enumerate(hosts)))


def launch_of(p: GangPlacement) -> GangLaunch:
    return GangLaunch(p.gang_id, p.attempt, tuple(
        LaunchSpec(m.task_id, p.job_id, m.instance, p.attempt, m.hostname, "true", {}, m.resources, m.gpu_ids,
                   m.ports) for m in p.members))


def test_a_batch_of_statuses_is_logged_in_order_and_answers_a_waiting_poll_at_once() -> None:
    hm, be = make()
    assert be.batch_cb is not None
    got: list[list[tuple[int, TaskStatus]]] = []
    poll = threading.Thread(target=lambda: got.append(hm.wait_events(0, 10, 10.0)[0]))
    poll.start()
    be.batch_cb([TaskStatus(f"j-{i}-1", TaskState.RUNNING, 1.0, "h1") for i in range(3)]
                + [TaskStatus("j-3-1", TaskState.SUCCEEDED, 1.0, "h2")])
    poll.join(10)
    # one wake, once the whole batch is in: the poll answers all of it (a wake per status could answer the first alone)
    assert [[(seq, st.task_id) for seq, st in got[0]]] == [[(1, "j-0-1"), (2, "j-1-1"), (3, "j-2-1"), (4, "j-3-1")]]


def test_updates_are_acknowledged_only_after_the_caller_says_they_are_persisted() -> None:
    hm, be = make()
    assert be.cb is not None
    be.cb(TaskStatus("j-0-1", TaskState.RUNNING, 1.0, ack="a1"))
    be.cb(TaskStatus("j-1-1", TaskState.RUNNING, 1.0))  # nothing to acknowledge (no uuid)
    be.cb(TaskStatus("j-2-1", TaskState.RUNNING, 1.0, ack="a3"))
    events, gap = hm.wait_events(0, 10, 0.1)
    assert [seq for seq, _ in events] == [1, 2, 3] and not gap
    assert [seq for seq, _ in hm.wait_events(1, 1, 0.1)[0]] == [2]
    assert be.acked == []
    assert hm.ack_events(2) == 1
    assert be.acked == [["a1"]]
    assert hm.ack_events(2) == 0  # never twice
    assert [seq for seq, _ in hm.wait_events(0, 10, 0.1)[0]] == [3]  # acknowledged events are forgotten
    assert hm.ack_events(3) == 1
    assert be.acked == [["a1"], ["a3"]]
    assert hm.wait_events(3, 10, 0.05) == ([], False)


def test_a_consumer_behind_the_dropped_events_is_told_of_the_gap(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import peloton.hostmgr.manager as mod

    monkeypatch.setattr(mod, "EVENT_LOG_LIMIT", 3)
    hm, be = make()
    assert be.cb is not None
    for i in range(5):
        be.cb(TaskStatus(f"j-{i}-1", TaskState.RUNNING, 1.0))
    events, gap = hm.wait_events(0, 10, 0.1)
    assert gap and [seq for seq, _ in events] == [3, 4, 5]
    assert hm.wait_events(3, 10, 0.1)[1] is False


def test_a_new_consumer_after_everything_was_acknowledged_waits_without_a_gap() -> None:
    """A job manager that takes over from another starts from 0: what the other acknowledged was persisted (not
    lost), so it is told of no gap, and its long poll waits for the next event instead of answering at once."""
    hm, be = make()
    assert be.cb is not None
    for i in range(3):
        be.cb(TaskStatus(f"j-{i}-1", TaskState.RUNNING, 1.0))
    assert hm.ack_events(3) == 0
    began = time.monotonic()
    assert hm.wait_events(0, 10, 0.2) == ([], False)
    assert time.monotonic() - began >= 0.15  # it waited
    be.cb(TaskStatus("j-3-1", TaskState.RUNNING, 1.0))
    events, gap = hm.wait_events(0, 10, 0.1)
    assert [seq for seq, _ in events] == [4] and not gap


def test_wait_events_wakes_on_a_new_event() -> None:
    hm, be = make()
    assert be.cb is not None
    threading.Timer(0.05, be.cb, args=(TaskStatus("j-0-1", TaskState.RUNNING, 1.0),)).start()
    events, _ = hm.wait_events(0, 10, 5.0)
    assert [st.task_id for _, st in events] == ["j-0-1"]


def test_sync_sends_every_host_first_then_only_what_changed() -> None:
    hm, be = make()
    first = hm.sync(0, "")
    assert first.full and sorted(o.hostname for o in first.offers) == ["h1", "h2"]
    assert all(o.gpu_ids == () and o.free.gpu == 2 for o in first.offers)  # counts only
    assert hm.sync(first.version, first.stream_id).offers == []
    claimed, refused = hm.claim([placed("a/0", ["h1"])])
    assert refused == [] and len(claimed) == 1
    d = hm.sync(first.version, first.stream_id)
    assert not d.full and [(o.hostname, o.free.gpu, o.free.cpu) for o in d.offers] == [("h1", 1, 3)]
    assert hm.sync(d.version, "another-stream").full  # a host manager that restarted: everything again
    assert be.hosts_cb is not None
    be.hosts_cb(["h2"])  # a change the backend saw (offers, a host lost)
    assert [o.hostname for o in hm.sync(d.version, d.stream_id).offers] == ["h2"]


def test_a_sync_is_demand_unless_the_caller_is_idle() -> None:
    """The placement engine syncs every poll, busy or not: only a sync that says gangs wait is demand (a Mesos
    backend suppresses offers while there is none)."""
    b = FakeBackend()
    hm = HostManager(b)
    first = hm.sync(0, "", idle=True)
    hm.sync(first.version, first.stream_id, idle=True)
    assert b.demanded == 0
    hm.sync(first.version, first.stream_id)
    assert b.demanded == 1


def test_claims_hold_whole_gangs_with_concrete_ids_and_refuse_what_no_longer_fits() -> None:
    hm, _ = make()
    claimed, refused = hm.claim([placed("a/0", ["h1", "h1"]), placed("b/0", ["h1"]), placed("c/0", ["h2", "h1"])])
    assert [p.gang_id for p in claimed] == ["a/0"] and {f.gang_id for f in refused} == {"b/0", "c/0"}
    assert [m.gpu_ids for m in claimed[0].members] == [(0,), (1,)]
    assert [m.ports for m in claimed[0].members] == [(31000,), (31001,)]
    assert claimed[0].members[0].address == "10.0.0.1"
    assert "h1" in refused[0].reason


def test_launch_drops_the_claim_only_after_the_backend_accounts_for_the_members() -> None:
    """No moment where a gang's GPUs are neither claimed nor in use: a claim racing the launch never gets them."""
    hm, be = make()
    (a,), _ = hm.claim([placed("a/0", ["h1", "h1"])])
    racing: list[tuple[list[GangPlacement], list[object]]] = []
    be.during_launch.append(lambda: racing.append(hm.claim([placed("x/0", ["h1"])])))  # type: ignore[arg-type]
    (r,) = hm.launch([launch_of(a)])
    assert r.outcome == LaunchOutcome.OK and be.launched == ["a-0-1", "a-1-1"]
    assert racing[0][0] == [] and len(racing[0][1]) == 1  # refused: the GPUs were still claimed
    assert hm.claim([placed("y/0", ["h1"])])[0] == []  # and now they are in use
    be.end("a-0-1")
    assert len(hm.claim([placed("z/0", ["h1"])])[0]) == 1


def test_releasing_a_claim_frees_its_hosts_but_not_while_its_launch_is_in_progress() -> None:
    hm, be = make()
    (a,), _ = hm.claim([placed("a/0", ["h1", "h1"])])
    assert hm.claim([placed("x/0", ["h1"])])[0] == []  # both GPUs of h1 are claimed
    hm.release_claims([("a/0", 1), ("unknown/0", 1)])
    (a,), _ = hm.claim([placed("a/0", ["h1", "h1"])])  # free again: claimed anew under the same key
    # a late release (of an earlier placement with the same key) arrives while this one is being launched
    be.during_launch.append(lambda: hm.release_claims([("a/0", 1)]))
    racing: list[tuple[list[GangPlacement], list[object]]] = []
    be.during_launch.append(lambda: racing.append(hm.claim([placed("y/0", ["h1"])])))  # type: ignore[arg-type]
    assert hm.launch([launch_of(a)])[0].outcome == LaunchOutcome.OK
    assert racing[0][0] == []  # the launching claim still held h1's GPUs


def _failures(reason: str) -> float:
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value("peloton_hostmgr_launch_failures_total", {"reason": reason}) or 0.0


def test_a_stale_or_unknown_claim_is_refused_and_nothing_starts() -> None:
    now = [100.0]
    hm, be = make(now)
    stale = _failures("stale_claim")
    (a,), _ = hm.claim([placed("a/0", ["h1"])])
    now[0] += 31  # the claim expired
    (r,) = hm.launch([launch_of(a)])
    assert r.outcome == LaunchOutcome.REFUSED and "expired" in r.message and be.launched == []
    (b,), _ = hm.claim([placed("b/0", ["h2"])])
    hm.release_claims([("b/0", 1)])
    assert hm.launch([launch_of(b)])[0].outcome == LaunchOutcome.REFUSED
    (c,), _ = hm.claim([placed("c/0", ["h2"])])
    assert hm.launch([launch_of(c)])[0].outcome == LaunchOutcome.OK
    assert hm.launch([launch_of(c)])[0].outcome == LaunchOutcome.REFUSED  # never launched twice
    assert _failures("stale_claim") == stale + 3  # counted by reason


def test_a_task_killed_before_its_launch_is_never_started() -> None:
    hm, be = make()
    (a,), _ = hm.claim([placed("a/0", ["h1", "h2"])])
    hm.kill(["a-1-1"])  # the job was stopped while its placement was on its way
    killed = _failures("killed_before_launch")
    (r,) = hm.launch([launch_of(a)])
    assert r.outcome == LaunchOutcome.REFUSED and "killed before its launch" in r.message
    assert _failures("killed_before_launch") == killed + 1
    assert be.launched == [] and hm.held_hosts() == set()


def test_a_kill_racing_the_launch_stops_what_was_started() -> None:
    hm, be = make()
    (a,), _ = hm.claim([placed("a/0", ["h1"])])
    be.during_launch.append(lambda: hm.kill(["a-0-1"]))
    (r,) = hm.launch([launch_of(a)])
    assert r.outcome == LaunchOutcome.OK
    assert be.killed.count("a-0-1") == 2  # once by the kill itself (unknown then), once after the launch


def test_capacity_is_sent_again_only_when_it_changed() -> None:
    hm, be = make()
    v, hosts = hm.capacity(0)
    assert hosts is not None and [h.hostname for h in hosts] == ["h1", "h2"] and hosts[0].free.gpu == 2
    assert hm.capacity(v) == (v, None)
    assert be.hosts_cb is not None
    be.hosts_cb(["h1"])
    v2, hosts2 = hm.capacity(v)
    assert v2 != v and hosts2 is not None


def test_a_permanent_member_failure_fails_the_job_instead_of_restarting() -> None:
    from peloton.domain.resources import Resources as R
    from peloton.domain.spec import JobSpec
    from peloton.jobmgr import gang_policy as policy

    spec = JobSpec(name="x", instances=2, command="true", resources=R(cpu=1), max_attempts=3)
    job, gangs, tasks = policy.new_job_records("abc", spec, 1.0)
    jv = policy.new_job_view(job, gangs, tasks)
    members = tuple(MemberAssignment(t.instance, t.task_id, "h", "", spec.resources) for t in tasks)
    assert policy.launch_intent(jv, GangPlacement("abc/0", "abc", 1, members), 1.5) is not None
    eff = policy.apply_status(jv, TaskStatus("abc-0-1", TaskState.FAILED, 2.0, "h", reason="TASK_ERROR",
                                             message="invalid", permanent=True), 2.0)
    assert gangs[0].attempt == 1 and not eff.enqueue
    assert eff.kill == ["abc-1-1"]
    assert "will not be retried" in job.reason
    policy.apply_status(jv, TaskStatus("abc-1-1", TaskState.KILLED, 3.0, "h"), 3.0)
    assert job.state.value == "FAILED"


def test_close_answers_a_waiting_event_poll_at_once() -> None:
    import threading
    import time

    hm, _ = make()
    got: list[object] = []
    t = threading.Thread(target=lambda: got.append(hm.wait_events(0, 10, 30.0)))
    t.start()
    time.sleep(0.1)
    hm.close()
    t.join(5)
    assert got == [([], False)]
    assert hm.wait_events(0, 10, 30.0) == ([], False)  # later ones at once


def test_a_draining_host_offers_nothing_refuses_claims_and_is_saved_before_it_counts() -> None:
    import pytest

    from peloton.errors import NotFound

    saved: list[dict[str, float]] = []
    hm = HostManager(FakeBackend(), clock=lambda: 100.0, save_drains=lambda d: saved.append(d))
    hm.start()
    first = hm.sync(0, "")
    hm.drain("h1", 160.0)
    assert saved == [{"h1": 160.0}] and hm.drains() == {"h1": 160.0}
    s = hm.sync(first.version, first.stream_id)  # the drained host is reported again, with nothing free
    assert [(o.hostname, o.free.gpu, o.free.cpu) for o in s.offers] == [("h1", 0, 0)]
    claimed, refused = hm.claim([placed("j/0", ["h1"]), placed("k/0", ["h2"])])
    assert [p.gang_id for p in claimed] == ["k/0"]
    assert [(f.gang_id, f.reason) for f in refused] == [("j/0", "host h1 is draining")]
    with pytest.raises(NotFound, match="hostname: no host h9"):
        hm.drain("h9", 0.0)
    hm.undrain("h1")
    hm.undrain("h1")  # not draining: nothing to save
    assert saved == [{"h1": 160.0}, {}] and hm.drains() == {}
    assert {o.hostname: o.free.gpu for o in hm.sync(0, "").offers}["h1"] == 2
    # a failing store: the drain does not take effect
    def fail(d: dict[str, float]) -> None:
        raise OSError("store down")
    hm2 = HostManager(FakeBackend(), save_drains=fail)
    with pytest.raises(OSError):
        hm2.drain("h1", 0.0)
    assert hm2.drains() == {}


def test_a_drain_being_written_holds_up_no_claim_and_loses_no_other_drain() -> None:
    """The store write of a drain runs outside the host manager's lock: claims and syncs go on meanwhile, the
    drain counts only once written, and a second drain waits for the first (each writes the whole map)."""
    entered, release = threading.Event(), threading.Event()
    saved: list[dict[str, float]] = []

    def slow_save(d: dict[str, float]) -> None:
        saved.append(d)
        if len(saved) == 1:
            entered.set()
            assert release.wait(60)

    hm = HostManager(FakeBackend(), clock=lambda: 100.0, save_drains=slow_save)
    hm.start()
    first = threading.Thread(target=hm.drain, args=("h1", 0.0))
    first.start()
    assert entered.wait(10)
    second = threading.Thread(target=hm.drain, args=("h2", 0.0))
    second.start()
    # the store write is in flight (until `release`, a minute away): the claim is not blocked by it
    got: list[tuple[list[GangPlacement], list[PlacementFailure]]] = []
    claim = threading.Thread(target=lambda: got.append(hm.claim([placed("j/0", ["h1"])])), daemon=True)
    claim.start()
    claim.join(30)
    assert got, "the claim waited for the drain's store write"
    claimed, refused = got[0]
    assert [p.gang_id for p in claimed] == ["j/0"] and not refused  # not drained until written
    assert hm.drains() == {}
    release.set()
    first.join(10)
    second.join(10)
    assert saved == [{"h1": 0.0}, {"h1": 0.0, "h2": 0.0}]  # the second saw the first: nothing lost
    assert hm.drains() == {"h1": 0.0, "h2": 0.0}


def test_a_host_in_a_maintenance_window_is_drained_until_the_window_is_lifted() -> None:
    be = FakeBackend()
    hm = HostManager(be, clock=lambda: 100.0, save_drains=lambda d: None)
    hm.start()
    be.windows = {"h1": 500.0}  # the cluster manager announced it (Mesos: inverse offers, unavailability)
    assert {o.hostname: o.free.gpu for o in hm.sync(0, "").offers} == {"h1": 0, "h2": 2}
    _, refused = hm.claim([placed("j/0", ["h1"])])
    assert [f.reason for f in refused] == ["host h1 is draining for maintenance"]
    assert hm.drains() == {"h1": 500.0} and hm.maintenance() == {"h1"}  # the job manager preempts at 500
    hm.drain("h1", 300.0)  # an operator's drain too: the earlier deadline counts
    assert hm.drains() == {"h1": 300.0}
    hm.undrain("h1")  # lifts the operator's drain, not the window
    assert hm.drains() == {"h1": 500.0}
    assert [(h.hostname, state) for h, state in hm.census()] == [("h1", "drained"), ("h2", "up")]
    be.windows = {}
    assert hm.drains() == {} and {o.hostname: o.free.gpu for o in hm.sync(0, "").offers}["h1"] == 2


class FailingBackend(FakeBackend):
    def __init__(self) -> None:
        super().__init__()
        self.fail = True
        self.permanent = False

    def launch(self, gangs: Sequence[GangLaunch]) -> list[LaunchResult]:
        if not self.fail:
            return super().launch(gangs)
        return [LaunchResult(g.gang_id, g.attempt, LaunchOutcome.FAILED, g.tasks[0].task_id, "exec: no such file",
                             self.permanent) for g in gangs]


def test_a_host_whose_launches_keep_failing_is_skipped_for_a_growing_back_off() -> None:
    be = FailingBackend()
    now = [100.0]
    hm = HostManager(be, clock=lambda: now[0], claim_ttl_s=30)
    hm.start()

    def attempt(n: int) -> list[LaunchResult]:
        p = placed(f"g{n}/0", ["h1"], attempt=1)
        claimed, refused = hm.claim([p])
        assert claimed, refused
        return hm.launch([launch_of(claimed[0])])

    be.permanent = True
    task_errors, host_errors = _failures("task_error"), _failures("host_error")
    for n in range(3):  # the task's own fault (a bad spec): not the host's
        attempt(n)
    assert hm.health() == {}
    be.permanent = False
    for n in range(3, 6):
        attempt(n)
    assert (_failures("task_error"), _failures("host_error")) == (task_errors + 3, host_errors + 3)
    assert [(h.hostname, state) for h, state in hm.census()] == [("h1", "unhealthy"), ("h2", "up")]
    assert list(hm.health()) == ["h1"] and "launches kept failing (last: exec: no such file)" in hm.health()["h1"]
    s = hm.sync(0, "")
    assert {o.hostname: o.free.gpu for o in s.offers} == {"h1": 0, "h2": 2}
    _, refused = hm.claim([placed("x/0", ["h1"])])
    assert [f.reason for f in refused] == ["host h1 is unhealthy"]
    now[0] += 61  # the back-off is over: placement hears of the host again
    s2 = hm.sync(s.version, s.stream_id)
    assert [(o.hostname, o.free.gpu) for o in s2.offers] == [("h1", 2)] and hm.health() == {}
    for n in range(6, 9):
        attempt(n)
    assert "unhealthy for 120s more" in hm.health()["h1"]  # failing again: twice as long
    now[0] += 121
    be.fail = False
    attempt(9)  # a launch that starts: healthy again
    assert hm.health() == {} and not hm._health


def test_a_gang_claimed_before_its_host_was_drained_is_refused_at_launch_and_starts_nothing() -> None:
    """Once a drain is accepted nothing new starts on the host: a gang placed and claimed there just before (its
    launch was on its way) is refused, its claim let go, so that the job manager queues it again whole, to be
    placed elsewhere. The same for a host a maintenance window closed meanwhile."""
    now = [100.0]
    be = FakeBackend()
    hm = HostManager(be, clock=lambda: now[0], claim_ttl_s=30, save_drains=lambda d: None)
    hm.start()
    (a,), _ = hm.claim([placed("a/0", ["h1", "h2"])])
    (b,), _ = hm.claim([placed("b/0", ["h2"])])
    closed = _failures("host_closed")
    hm.drain("h1", 0.0)
    ra, rb = hm.launch([launch_of(a), launch_of(b)])
    assert ra.outcome == LaunchOutcome.REFUSED and ra.message == "host h1 is draining"
    assert rb.outcome == LaunchOutcome.OK
    assert be.launched == ["b-0-1"] and hm.held_hosts() == set()  # a's claim let go, on both hosts
    (c,), _ = hm.claim([placed("c/0", ["h2"])])
    be.windows = {"h2": 500.0}
    (rc,) = hm.launch([launch_of(c)])
    assert rc.outcome == LaunchOutcome.REFUSED and rc.message == "host h2 is draining for maintenance"
    assert be.launched == ["b-0-1"] and hm.held_hosts() == set()
    assert _failures("host_closed") == closed + 2  # counted by reason


def test_a_drain_returns_only_once_the_launches_already_under_way_on_its_host_have_started() -> None:
    """A launch that began before the drain took effect is let finish (the gang then runs there, and the drain's
    deadline applies to it as to any running gang), but the drain does not return before it: once it has
    returned, nothing starts on the host any more."""
    be = FakeBackend()
    hm = HostManager(be, clock=lambda: 100.0, claim_ttl_s=30, save_drains=lambda d: None)
    hm.start()
    (a,), _ = hm.claim([placed("a/0", ["h1"])])
    in_launch, go_on = threading.Event(), threading.Event()

    def starting() -> None:
        in_launch.set()
        assert go_on.wait(10)

    be.during_launch.append(starting)
    launching = threading.Thread(target=hm.launch, args=([launch_of(a)],))
    launching.start()
    assert in_launch.wait(10)
    draining = threading.Thread(target=hm.drain, args=("h1", 0.0))
    draining.start()
    draining.join(0.3)
    assert draining.is_alive()  # waits for the launch under way
    assert hm.drains() == {"h1": 0.0}  # (which took effect already: new claims are refused)
    assert [f.reason for f in hm.claim([placed("x/0", ["h1"])])[1]] == ["host h1 is draining"]
    go_on.set()
    launching.join(10)
    draining.join(10)
    assert not draining.is_alive() and be.launched == ["a-0-1"]


def test_hosts_gone_from_the_cluster_are_forgotten_and_a_consumer_behind_that_syncs_everything() -> None:
    """A host that left the cluster (an agent removed, an autoscaled node) kept its version entry, and its launch
    health once a launch had failed on it, for the host manager's life: a cluster whose nodes come and go grew
    both for ever (and every sync walked the health of every host ever unhealthy). Hosts a sync reported removed
    are now forgotten past the last GONE_REMEMBERED; a consumer behind a forgotten removal gets every host
    again, as after a restart."""
    from peloton.hostmgr.manager import GONE_REMEMBERED

    be = FailingBackend()
    hm = HostManager(be, clock=lambda: 100.0, claim_ttl_s=30)
    hm.start()
    assert be.hosts_cb is not None
    first = s = hm.sync(0, "")
    for i in range(GONE_REMEMBERED * 2):
        name = f"n{i}"
        be.used[name] = []  # a node joins
        be.hosts_cb([name])
        s = hm.sync(s.version, s.stream_id)
        assert [o.hostname for o in s.offers] == [name]
        claimed, refused = hm.claim([placed(f"g{i}/0", [name])])
        assert claimed, refused
        assert hm.launch([launch_of(claimed[0])])[0].outcome == LaunchOutcome.FAILED  # the host's fault
        del be.used[name]  # and leaves
        be.hosts_cb([name])
        s = hm.sync(s.version, s.stream_id)
        assert s.removed == [name] and not s.full
    assert len(hm._versions) <= 2 + GONE_REMEMBERED  # noqa: SLF001 - the structure under test
    assert len(hm._health) <= GONE_REMEMBERED  # noqa: SLF001
    assert hm.sync(first.version, first.stream_id).full  # it missed a removal no longer remembered
    recent = hm.sync(s.version, s.stream_id)
    assert not recent.full and recent.offers == []
