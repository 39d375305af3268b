"""JobManager's cluster-capacity index (CreateJob's "can this gang ever fit?"): one refresh at a time, and no lock
held across its RPC to the host manager."""

from __future__ import annotations

import threading
import time
from typing import Any

from peloton.domain.placement import HostOffer
from peloton.domain.resources import Resources
from peloton.jobmgr.manager import CAPACITY_TTL_S, JobManager


class SlowHostManager:
    """cluster_capacity answers one host once `go` is set; it notes whether any lock of the manager is held."""

    def __init__(self, mgr: JobManager) -> None:
        self.mgr = mgr
        self.go = threading.Event()
        self.calls = 0
        self.lock_free_during_call: list[bool] = []

    def cluster_capacity(self, if_version: int) -> tuple[int, list[HostOffer] | None]:
        self.calls += 1
        locks = [v for v in vars(self.mgr).values() if callable(getattr(v, "locked", None))]
        self.lock_free_during_call.append(bool(locks) and not any(lk.locked() for lk in locks))
        assert self.go.wait(60)
        return self.calls, [HostOffer(f"h{self.calls}", "127.0.0.1", Resources(cpu=1, mem=1))]


def bare_manager() -> tuple[JobManager, SlowHostManager]:
    """Only what `_capacity` uses (the rest of JobManager needs a store)."""
    mgr = JobManager.__new__(JobManager)
    mgr._cap_lock = threading.Lock()
    mgr._cap_done = threading.Condition(mgr._cap_lock)
    mgr._cap_refreshing = False
    mgr._cap = (0, None, 0.0)
    hm = SlowHostManager(mgr)
    mgr.hostmgr = hm  # type: ignore[assignment]
    return mgr, hm


def test_creates_with_no_index_share_one_refresh_run_with_no_lock_held() -> None:
    mgr, hm = bare_manager()
    got: list[Any] = []
    threads = [threading.Thread(target=lambda: got.append(mgr._capacity())) for _ in range(4)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 5
    while hm.calls == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)  # the others are waiting for that refresh by now
    assert hm.calls == 1 and hm.lock_free_during_call == [True]
    hm.go.set()
    for t in threads:
        t.join(10)
    assert len(got) == 4 and all(i is got[0] for i in got) and got[0] is not None
    assert hm.calls == 1  # one RPC for all four


def test_a_stale_index_is_used_while_another_thread_refreshes_it() -> None:
    mgr, hm = bare_manager()
    hm.go.set()
    first = mgr._capacity()
    assert first is not None and hm.calls == 1
    hm.go.clear()
    mgr._cap = (mgr._cap[0], first, time.monotonic() - CAPACITY_TTL_S - 1)  # stale
    refresher = threading.Thread(target=mgr._capacity)
    refresher.start()
    deadline = time.monotonic() + 5
    while hm.calls < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    got: list[Any] = []  # not held up by the refresh in flight (waiting for `go`, a minute away)
    reader = threading.Thread(target=lambda: got.append(mgr._capacity()), daemon=True)
    reader.start()
    reader.join(30)
    assert got and got[0] is first
    hm.go.set()
    refresher.join(10)
    assert hm.calls == 2 and mgr._cap[1] is not first
