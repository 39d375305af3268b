"""The watch hub's wakes: a commit wakes the watchers it has something for, once each, and no others; what a
watcher reads (order, filters, a history it fell behind) is as before."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from peloton.jobmgr.watch import MAX_BATCH_CHARS, JobChange, TaskChange, Waiter, WatchHub, in_parts, woken


def job(jid: str, state: str = "RUNNING") -> JobChange:
    return JobChange(jid, state, "RUNNING", "")


def task_only(jid: str) -> JobChange:
    t = TaskChange(0, f"{jid}-0-1", 1, "RUNNING", "h1", None, "", "")
    return JobChange(jid, "RUNNING", "RUNNING", "", (t,), job_changed=False)


def until(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.001)


class Waiting:
    """A watcher in `hub.wait` on a thread of its own."""

    def __init__(self, hub: WatchHub, after: int, job_ids: tuple[str, ...] = (), tasks: bool = False,
                 timeout_s: float = 30.0) -> None:
        self.result: tuple[list[JobChange], int, bool] | None = None
        self._t = threading.Thread(target=self._run, args=(hub, after, timeout_s, job_ids, tasks), daemon=True)
        self._t.start()

    def _run(self, hub: WatchHub, after: int, timeout_s: float, job_ids: tuple[str, ...], tasks: bool) -> None:
        self.result = hub.wait(after, timeout_s, job_ids, tasks)

    def join(self) -> tuple[list[JobChange], int, bool]:
        self._t.join(10)
        assert self.result is not None
        return self.result


def test_a_commit_wakes_only_the_watchers_it_concerns() -> None:
    hub = WatchHub()
    of_a, of_b, of_all = Waiting(hub, 0, ("a",)), Waiting(hub, 0, ("b",)), Waiting(hub, 0)
    until(lambda: hub.waiting == 3)
    hub.append([job("a")])
    assert [c.job_id for c in of_a.join()[0]] == ["a"]
    assert [c.job_id for c in of_all.join()[0]] == ["a"]
    assert hub.waiting == 1  # b's watcher sleeps on
    hub.append([job("b", "SUCCEEDED")])
    changes, rev, lost = of_b.join()
    assert [(c.job_id, c.state) for c in changes] == [("b", "SUCCEEDED")] and rev == 2 and not lost
    assert hub.waiting == 0


def test_task_changes_do_not_wake_a_job_level_watcher() -> None:
    hub = WatchHub()
    jobs, tasks = Waiting(hub, 0, ("a",)), Waiting(hub, 0, ("a",), tasks=True)
    until(lambda: hub.waiting == 2)
    hub.append([task_only("a")])
    changes, rev, _ = tasks.join()
    assert [len(c.tasks) for c in changes] == [1] and rev == 1
    assert hub.waiting == 1
    hub.append([job("a", "SUCCEEDED")])
    changes, rev, _ = jobs.join()
    assert [(c.job_id, c.state, c.tasks) for c in changes] == [("a", "SUCCEEDED", ())] and rev == 2


def test_one_wake_per_commit_and_the_changes_in_order() -> None:
    hub = WatchHub()
    w = Waiting(hub, 0)
    until(lambda: hub.waiting == 1)
    hub.append([job("a", "PENDING"), job("b"), job("a", "RUNNING")])
    changes, rev, lost = w.join()
    assert [(c.job_id, c.state) for c in changes] == [("a", "PENDING"), ("b", "RUNNING"), ("a", "RUNNING")]
    assert rev == 3 and not lost


def test_a_watcher_the_history_left_behind_is_told_at_once() -> None:
    hub = WatchHub(history=2)
    w = Waiting(hub, 0, ("a",))
    until(lambda: hub.waiting == 1)
    hub.append([job("x"), job("y"), job("z")])  # nothing of a's, but revision 1 is gone from the history
    changes, rev, lost = w.join()
    assert lost and changes == [] and rev == 3


def test_a_wait_times_out_and_leaves_the_hub() -> None:
    hub = WatchHub()
    hub.append([job("b")])
    assert hub.wait(0, 0.01, ("a",)) == ([], 1, False)  # b's change is passed over: the revision moves on
    assert hub.waiting == 0


def test_close_wakes_every_watcher() -> None:
    hub = WatchHub()
    ws = [Waiting(hub, 0, ("a",)), Waiting(hub, 0), Waiting(hub, 0, ("b", "c"), tasks=True)]
    until(lambda: hub.waiting == 3)
    hub.close()
    assert [w.join() for w in ws] == [([], 0, False)] * 3
    assert hub.waiting == 0


def test_wake_all_returns_every_wait_now_and_the_hub_goes_on() -> None:
    """The daemon stopped acting: each watcher's wait returns at once with nothing (its stream is then ended by
    the caller); the hub is not closed, and later waits wait as before."""
    hub = WatchHub()
    hub.append([job("a")])
    ws = [Waiting(hub, 1, ("a",)), Waiting(hub, 1), Waiting(hub, 1, ("b",), tasks=True)]
    until(lambda: hub.waiting == 3)
    hub.wake_all()
    assert [w.join() for w in ws] == [([], 1, False)] * 3
    assert not hub.closed and hub.wait(1, 0.01) == ([], 1, False)
    later = Waiting(hub, 1, ("a",))
    until(lambda: hub.waiting == 1)
    hub.append([job("a", "SUCCEEDED")])
    assert [(c.job_id, c.state) for c in later.join()[0]] == [("a", "SUCCEEDED")]


def test_after_forget_every_watcher_is_lost_and_no_stream_resumes_from_before() -> None:
    """The daemon acts again after another may have acted: what happened meanwhile is not in the history, so
    every watcher learns it as a `lost` (the caller sends a snapshot), and a resume from before is refused."""
    hub = WatchHub()
    hub.append([job("a"), job("b")])
    assert hub.can_resume(hub.stream_id, 1) and hub.can_resume(hub.stream_id, 2)
    waiting = Waiting(hub, 2, ("a",))
    until(lambda: hub.waiting == 1)
    hub.forget()
    changes, rev, lost = waiting.join()
    assert lost and changes == [] and rev == 3 == hub.revision
    assert hub.wait(1, 0.01) == ([], 3, True)  # (any revision of before)
    assert not hub.can_resume(hub.stream_id, 2) and hub.can_resume(hub.stream_id, 3)
    hub.append([job("a", "SUCCEEDED")])
    assert hub.wait(3, 0.01, ("a",)) == ([job("a", "SUCCEEDED")], 4, False)


def test_woken_matches_by_job_and_kind() -> None:
    every_jobs, every_tasks = Waiter((), False, 0, threading.Lock()), Waiter((), True, 0, threading.Lock())
    of_a, of_b = Waiter({"a"}, False, 0, threading.Lock()), Waiter({"b"}, True, 0, threading.Lock())
    by_job = {"a": [of_a], "b": [of_b]}
    assert woken([every_jobs, every_tasks], by_job, [task_only("a")]) == {every_tasks}
    assert woken([every_jobs, every_tasks], by_job, [task_only("b")]) == {every_tasks, of_b}
    assert woken([every_jobs, every_tasks], by_job, [job("a")]) == {every_jobs, every_tasks, of_a}
    assert woken([], by_job, [JobChange("c", "", "", "", deleted=True)]) == set()


# --- a revision in messages a client can receive (in_parts) ---------------------------------------------------------

def big(jid: str, n: int, reason: str = "") -> JobChange:
    return JobChange(jid, "RUNNING", "RUNNING", reason,
                     tuple(TaskChange(i, f"{jid}-{i}-1", 1, "RUNNING", f"host-{i % 500:05d}", None, "", "")
                           for i in range(n)))


def test_small_changes_go_in_one_message() -> None:
    changes = [job("a"), task_only("b"), job("c")]
    assert in_parts(changes) == [changes]
    assert in_parts([]) == [[]]  # a heartbeat, a resync: one empty message


def test_a_change_too_large_for_one_message_is_split_over_parts_of_its_job_every_task_once_in_order() -> None:
    # a snapshot of a 100,000-task job was one message of ~5 MB: over a client's default 4 MiB, the stream failed
    huge = big("j1", 100_000, reason="why")
    assert huge.size() > 4 * MAX_BATCH_CHARS
    parts = in_parts([job("before"), huge, job("after")])
    assert len(parts) >= 5
    assert all(sum(c.size() for c in p) <= MAX_BATCH_CHARS for p in parts)
    pieces = [c for p in parts for c in p]
    assert pieces[0] == job("before") and pieces[-1] == job("after")
    for c in pieces[1:-1]:  # each piece: the job's own fields, and some of its tasks
        assert (c.job_id, c.state, c.desired, c.reason, c.job_changed, c.deleted) == ("j1", "RUNNING", "RUNNING",
                                                                                       "why", True, False)
        assert c.tasks
    assert [t for c in pieces[1:-1] for t in c.tasks] == list(huge.tasks)


def test_a_lone_task_over_the_limit_still_goes_alone() -> None:
    t = TaskChange(0, "j-0-1", 1, "FAILED", "h", 1, "", "m" * (MAX_BATCH_CHARS + 10))
    c = JobChange("j", "FAILED", "RUNNING", "", (t,))
    assert in_parts([job("a"), c, job("b")]) == [[job("a")], [c], [job("b")]]
