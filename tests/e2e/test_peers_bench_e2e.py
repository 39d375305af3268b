"""benchmarks/peers_bench.py's peloton side runs end to end with tiny settings, on both stores (a real daemon on
the local backend, members running sleep): every scenario produces its figures and every gang succeeds. Nothing
about the figures themselves is asserted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.peers_bench import main

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]


def test_the_peloton_peers_run_every_scenario(tmp_path: Path) -> None:
    out = tmp_path / "peers.json"
    main(["--peers", "peloton-sqlite,peloton-postgresql", "--hosts", "2", "--sizes", "1,4", "--samples", "2",
          "--seconds", "1", "--submitters", "2", "--size", "4", "--fill-gangs", "4", "--stop-samples", "1",
          "--json", str(out)])
    res = json.loads(out.read_text())
    assert res["benchmark"] == "peers" and list(res["peers"]) == ["peloton-sqlite", "peloton-postgresql"]
    for peer in res["peers"].values():
        assert {s: v["n"] for s, v in peer["latency_by_size"].items()} == {"1": 2, "4": 2}
        assert peer["throughput"]["gangs"] >= 1 and peer["throughput"]["failed"] == 0
        assert peer["fill"]["gangs"] == 4 and peer["fill"]["failed"] == 0
        assert peer["fill"]["makespan_s"] >= peer["fill"]["bound_s"] > 0
        assert peer["stop"]["n"] == 1
