"""The pure parts of benchmarks/peers_bench.py: the fill's seeded gangs and its bound, the lines of salloc and
`srun -v` it reads, and the skip (with how to install) when Slurm is missing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.peers_bench import FILL_SIZES, fill_bound, fill_plan, main, slurm_granted, slurm_started


def test_the_fill_is_the_same_for_every_peer_and_varies_with_the_seed() -> None:
    plan = fill_plan(200, seed=0)
    assert plan == fill_plan(200, seed=0) and plan != fill_plan(200, seed=1)
    assert len(plan) == 200 and {s for s, _ in plan} == set(FILL_SIZES)
    assert all(0.5 <= d <= 1.5 for _, d in plan)


def test_the_fill_bound_is_the_busier_of_all_gpus_and_the_longest_gang() -> None:
    assert fill_bound([(8, 1.0), (8, 1.0)], gpus=8) == 2.0  # 16 GPU-seconds on 8 GPUs
    assert fill_bound([(1, 3.0), (1, 0.5)], gpus=64) == 3.0  # the longest gang
    assert fill_bound([], gpus=64) == 0.0


def test_salloc_and_srun_lines() -> None:
    assert slurm_granted("salloc: Granted job allocation 21\n") == 21
    assert slurm_granted("salloc: Pending job allocation 21\n") is None
    assert slurm_granted("salloc: Relinquishing job allocation 21\n") is None
    assert slurm_started("srun: launch/slurm: _task_start: Node n3, 4 tasks started\n") == 4
    assert slurm_started("srun: launching StepId=5.0 on host n2, 8 tasks: [0-7]\n") == 0
    assert slurm_started("srun: launch/slurm: _task_finish: n3: tasks 8-11: Completed\n") == 0


def test_without_slurm_the_peer_is_skipped_saying_how_to_install_it(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no slurmctld, salloc, ... here
    out = tmp_path / "peers.json"
    main(["--peers", "slurm", "--json", str(out)])
    why = json.loads(out.read_text())["peers"]["slurm"]["skipped"]
    assert "not installed" in why and "apt-get install -y slurmctld slurmd slurm-client munge" in why


def test_an_unknown_peer_is_refused_naming_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--peers", "peloton-sqlite,lsf"])
    assert "--peers" in capsys.readouterr().err
