"""The Mesos backend's hosts() (what `host list` and the host manager's census read) on a large cluster held in
memory: AGENTS agents offered, TASKS tasks of any state on them (tests/mesos/test_mesos_backend_unit.py's
random_cluster, seed 1). Prints the CPU time (time.thread_time) of each call and the median of all but the first;
asserts nothing.

    .venv/bin/python scripts/mesos_hosts_cpu.py [AGENTS=1000] [TASKS=10000] [CALLS=5]

Run it from the tree to measure (its peloton is imported from the working directory).
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, ".")
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))
from tests.mesos.test_mesos_backend_unit import Harness, random_cluster  # noqa: E402


def main() -> int:
    agents = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    tasks = int(sys.argv[2]) if len(sys.argv) > 2 else 10_000
    calls = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    h = Harness()
    h.subscribed()
    random_cluster(h, agents, tasks, random.Random(1))
    ms = []
    for _ in range(calls):
        c0 = time.thread_time()
        h.b.hosts()
        ms.append(1000 * (time.thread_time() - c0))
    print(f"hosts() of {agents} agents, {tasks} tasks: ms CPU per call {[round(x, 1) for x in ms]}, median "
          f"{statistics.median(ms[1:] or ms):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
