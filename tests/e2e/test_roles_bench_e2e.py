"""benchmarks/roles_bench.py end to end with tiny settings: the four `--role` processes (and the all-in-one daemon)
on one PostgreSQL database (a split deployment shares one; SQLite has no place here), gangs submitted over the API
and run on the sim backend, each process's CPU read. Nothing about the figures is asserted, only that every
process was measured and every gang ran."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.roles_bench import ROLES, main

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]


def test_every_role_process_is_measured(tmp_path: Path) -> None:
    out = tmp_path / "roles.json"
    main(["--seconds", "1", "--clients", "2", "--size", "2", "--hosts", "20", "--idle", "0.5", "--json", str(out)])
    res = json.loads(out.read_text())
    (one,), (split,) = res["runs"]["all-in-one"], res["runs"]["split"]
    for run in (one, split):
        assert run["gangs"] >= 1 and run["error_count"] == 0 and run["tasks"] == 2 * run["gangs"]
        assert run["store_commits_per_gang"] > 0
    assert set(ROLES) <= set(split["cpu"]) and "all-in-one" in one["cpu"]
    assert all(split["cpu"][r]["cpu_s"] > 0 for r in ROLES)  # each process did some of the work
    assert set(split["ceiling_gangs_per_s"]) == set(ROLES)
