"""The job manager's writer alone: its thread's CPU time per 8-member gang life (create, launch intent, eight
RUNNING, eight SUCCEEDED: four group commits of one mutation each, with the watch hub's publish) on a real store,
measured inside the writer thread (time.thread_time, read by a query before and after each round). The kernel's
count for that one thread: less swayed by a loaded machine than the daemon's CPU per gang in sim_bench, which is
every thread's. Prints each round's figure and the median of all but the first (warm-up); asserts nothing.

    .venv/bin/python scripts/writer_cpu.py postgresql|sqlite [LIVES_PER_ROUND=100] [ROUNDS=4]

Run it from the tree to measure (its peloton is imported from the working directory).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, ".")
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))
from peloton.domain.launch import TaskStatus  # noqa: E402
from peloton.domain.model import TaskEvent  # noqa: E402
from peloton.domain.placement import GangPlacement, MemberAssignment  # noqa: E402
from peloton.domain.resources import Resources  # noqa: E402
from peloton.domain.spec import JobSpec  # noqa: E402
from peloton.domain.states import TaskState  # noqa: E402
from peloton.jobmgr import gang_policy as policy  # noqa: E402
from peloton.jobmgr.watch import WatchHub  # noqa: E402
from peloton.jobmgr.writer import Kind, Mutation, Writer  # noqa: E402
from peloton.store import db  # noqa: E402
from tests.dbutil import scratch_database  # noqa: E402


def life(w: Writer, jid: str, t0: float) -> None:
    spec = JobSpec(name=jid, instances=8, command="true", resources=Resources(cpu=1, gpu=1), min_available=8)
    job, gangs, tasks = policy.new_job_records(jid, spec, t0)
    jv = policy.new_job_view(job, gangs, tasks)
    events = [TaskEvent(jid, t.instance, 1, TaskState.PENDING, t0) for t in tasks]
    w.run(Mutation(Kind.CREATE, view=jv, events=events, rows=17))
    def intent(v: Any, now: float) -> policy.Effects:
        view = v[jid]
        p = GangPlacement(f"{jid}/0", jid, 1, tuple(MemberAssignment(t.instance, t.task_id, "h1", "", Resources(cpu=1, gpu=1))
                                                    for t in view.tasks.values()))
        e = policy.launch_intent(view, p, now)
        assert e is not None
        return e

    w.run(Mutation(Kind.APPLY, [jid], apply=intent))
    for state in (TaskState.RUNNING, TaskState.SUCCEEDED):
        def st(v: Any, now: float, state: TaskState = state) -> policy.Effects:
            eff = policy.Effects()
            for t in list(v[jid].tasks.values()):
                code = 0 if state == TaskState.SUCCEEDED else None
                eff.merge(policy.apply_status(v[jid], TaskStatus(t.task_id, state, now, "h1", exit_code=code), now))
            return eff
        w.run(Mutation(Kind.APPLY, [jid], apply=st))


def main() -> int:
    store = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 100
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 4
    with scratch_database(store) as url:
        res = measure(url, n, rounds)
    print(store, "writer thread CPU ms per gang life:", [round(x, 3) for x in res], "median",
          round(statistics.median(res[1:] or res), 3))
    return 0


def measure(url: str, n: int, rounds: int) -> list[float]:
    db.upgrade(url)
    eng = db.make_engine(url)
    hub = WatchHub()
    w = Writer(db.make_sessions(eng), hub.publish, lambda eff, views: None)
    w.start()
    res: list[float] = []
    try:
        for r in range(rounds):
            c0 = w.run(Mutation(Kind.QUERY, query=lambda v: time.thread_time()))
            for i in range(n):
                life(w, f"r{r}j{i}", 100.0 + i)
            c1 = w.run(Mutation(Kind.QUERY, query=lambda v: time.thread_time()))
            res.append(1000 * (c1 - c0) / n)
    finally:
        w.stop()
        eng.dispose()
    return res


if __name__ == "__main__":
    sys.exit(main())
