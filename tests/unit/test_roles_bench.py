"""The arithmetic of benchmarks/roles_bench.py: CPU per gang and per task, the PostgreSQL processes summed, and
one process's ceiling from its CPU per gang, a process's CPU by thread."""

from __future__ import annotations

import os
import threading

from benchmarks.roles_bench import by_thread, ceiling_gangs_per_s, cpu_delta, per_unit, thread_cpu


def test_cpu_per_gang_and_per_task() -> None:
    got = per_unit({"jobmgr": 2.0, "hostmgr": 0.5}, gangs=100, size=8)
    assert got["jobmgr"] == {"cpu_s": 2.0, "ms_per_gang": 20.0, "us_per_task": 2500.0}
    assert got["hostmgr"]["ms_per_gang"] == 5.0 and got["hostmgr"]["us_per_task"] == 625.0
    assert per_unit({"jobmgr": 1.0}, gangs=0, size=8)["jobmgr"]["ms_per_gang"] == 1000.0  # no division by zero


def test_postgres_processes_are_summed_and_a_new_one_counts_whole() -> None:
    before = {"jobmgr": 1.0, "pg:10": 0.5, "pg:11": 1.0, "pgall:10": 0.5, "pgall:99": 3.0, "clients": 0.2}
    after = {"jobmgr": 1.5, "pg:10": 0.75, "pg:12": 0.25, "pgall:10": 0.75, "pgall:99": 3.5, "clients": 0.4}
    got = cpu_delta(before, after)
    assert got == {"jobmgr": 0.5, "postgres_db": 0.5, "postgres_all": 0.75, "clients": 0.2}


def test_ceiling_of_one_process() -> None:
    got = ceiling_gangs_per_s({"placement": 2.0, "resmgr": 0.0})
    assert got["placement"] == 500.0 and got["resmgr"] is None
    assert ceiling_gangs_per_s({"jobmgr": 4.0}, cores_each=2.0)["jobmgr"] == 500.0


def test_cpu_by_thread_sums_a_pool_and_puts_the_unnamed_under_other() -> None:
    names = {1: "jobmgr-writer-N", 2: "jobmgr-writer-N", 3: "loop-launcher-N"}
    got = by_thread(names, {1: 1.0, 2: 1.0, 3: 0.5, 4: 0.0}, {1: 1.5, 2: 1.25, 3: 0.5, 4: 0.25, 5: 0.5})
    assert got == {"jobmgr-writer-N": 0.75, "loop-launcher-N": 0.0, "other": 0.75}  # 5: a thread started since


def test_thread_cpu_reads_every_thread_of_a_process() -> None:
    done = threading.Event()
    t = threading.Thread(target=done.wait)
    t.start()
    try:
        got = thread_cpu(os.getpid())
        assert os.getpid() in got and t.native_id in got and all(v >= 0 for v in got.values())
    finally:
        done.set()
        t.join()
    assert thread_cpu(2 ** 22 + 1) == {}  # no such process
