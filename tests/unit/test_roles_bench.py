"""The arithmetic of benchmarks/roles_bench.py: CPU per gang and per task, the PostgreSQL processes summed, and
one process's ceiling from its CPU per gang."""

from __future__ import annotations

from benchmarks.roles_bench import ceiling_gangs_per_s, cpu_delta, per_unit


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
