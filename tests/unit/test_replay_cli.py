"""`peloton sim replay`, run as a user runs it: a subprocess, no daemon (peloton/cli/replay.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.public_data import require

PELOTON = str(Path(sys.executable).parent / "peloton")
PUBLIC = require()
HEADER = "name,submit_s,gpus,application,work,unit,batch_size,pool,priority,min_gpus,max_gpus\n"
ROWS = ("a,0,4,resnet50,600,seconds,,,,,\n"
        "b,10,8,vgg16,300,seconds,,,,,\n"
        "c,20,2,cifar10,100000,samples,512,,,,\n"
        "d,30,1,bert,20,iterations,12,,,1,4\n"
        "e,40,6,alexnet,900,seconds,,,,,\n"
        "f,45,3,resnet50,400,seconds,,,,,\n")
KEYS = ("jobs", "jct_mean_s", "jct_p99_s", "makespan_s", "gpu_alloc_frac", "partial_gang_gpu_s")


def _trace(tmp_path: Path, rows: str = ROWS) -> str:
    path = tmp_path / "t.csv"
    path.write_text(HEADER + rows)
    return str(path)


def _replay(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PELOTON, "sim", "replay", *args], capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "PELOTON_ADDRESS": "127.0.0.1:1"})  # no daemon there


def _json(*args: str) -> dict[str, Any]:
    r = _replay(*args, "-o", "json")
    assert r.returncode == 0, r.stderr
    doc: dict[str, Any] = json.loads(r.stdout)
    return doc


def test_every_policy_by_default_with_the_report_keys_and_no_partial_gang(tmp_path: Path) -> None:
    doc = _json(_trace(tmp_path), "--format", "peloton", "--cluster", "4x4")
    assert sorted(doc["policies"]) == ["auto", "default", "fifo", "model-aware"]  # (keys sorted in JSON)
    assert (doc["trace"], doc["jobs"], doc["cluster"]) == ("t.csv", 6, {"hosts": 4, "gpus_per_host": 4, "racks": 1})
    assert doc["pools"] == {"/a": 8, "/b": 8}
    for name, m in doc["policies"].items():
        assert all(k in m for k in KEYS), name
        assert (m["jobs"], m["finished"], m["partial_gang_gpu_s"], m["runs_over_max_runtime"]) == (6, 6, 0.0, 0)
        assert 0 < m["gpu_alloc_frac"] <= 1 and m["jct_mean_s"] <= m["jct_p99_s"] <= m["makespan_s"]
    # the spec's tiresias-like durations: a job alone on its reference placement takes exactly its duration
    assert doc["policies"]["default"]["makespan_s"] >= 600


def test_two_runs_of_one_seed_agree_and_the_table_names_each_policy(tmp_path: Path) -> None:
    args = (_trace(tmp_path), "--format", "peloton", "--cluster", "4x4", "--racks", "2", "--seed", "9",
            "--policy", "default", "--policy", "auto,default", "--preemption", "both")
    a, b = _json(*args), _json(*args)
    for doc in (a, b):
        for m in doc["policies"].values():
            del m["wall_s"]
    assert a == b
    columns = ["default/preempt", "default/no-preempt", "auto/preempt", "auto/no-preempt"]
    assert sorted(a["policies"]) == sorted(columns)
    r = _replay(*args)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["metric", *columns]  # in the order given
    assert any(line.split()[:1] == ["partial_gang_gpu_s"] and set(line.split()[1:]) == {"0.0"} for line in lines)
    assert "replaying t.csv: 6 jobs on 4 hosts x 4 GPUs (2 rack(s))" in r.stderr


def test_plots_are_written_as_svg(tmp_path: Path) -> None:
    out = tmp_path / "plots"
    r = _replay(_trace(tmp_path), "--format", "peloton", "--cluster", "4x4", "--policy", "fifo,auto",
                "--plots", str(out))
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in out.iterdir()) == ["allocation.svg", "jct-by-size.svg", "queue.svg"]
    for p in out.iterdir():
        text = p.read_text()
        assert text.startswith("<svg xmlns=\"http://www.w3.org/2000/svg\"") and text.rstrip().endswith("</svg>")
        assert 'data-policy="fifo"' in text and 'data-policy="auto"' in text
        assert f"wrote {p}" in r.stderr


def test_a_bad_row_is_named_exit_2_no_traceback_nothing_written(tmp_path: Path) -> None:
    trace = _trace(tmp_path, ROWS + "g,50,-3,resnet50,10,seconds,,,,,\n")
    out = tmp_path / "plots"
    r = _replay(trace, "--format", "peloton", "--cluster", "4x4", "--plots", str(out))
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == ("peloton: error: t.csv: row 7 (line 8), column gpus: expected a positive number, got "
                        "'-3'\n")
    assert not out.exists()
    r = _replay(str(PUBLIC / "tiresias" / "60_job.csv"), "--format", "pollux", "--cluster", "16x4")
    assert r.returncode == 2 and "column" in r.stderr and "Traceback" not in r.stderr
    r = _replay(trace, "--format", "peloton", "--cluster", "4x4", "--policy", "fastest")
    assert (r.returncode, r.stderr) == (2, "peloton: error: --policy: unknown policy 'fastest' (one of fifo, "
                                           "default, model-aware, auto)\n")
    r = _replay(trace, "--format", "peloton", "--cluster", "4x4", "--queue-order", "lifo")
    assert (r.returncode, r.stderr) == (2, "peloton: error: --queue-order: must be one of arrival, gpu-time, got "
                                           "'lifo'\n")
    r = _replay(trace, "--format", "peloton", "--cluster", "4x4", "--seed", "-1")
    assert (r.returncode, r.stderr) == (2, "peloton: error: --seed: -1 is not within 0..2^63-1\n")
    r = _replay(trace, "--format", "peloton")
    assert r.returncode == 2 and "one of the arguments --cluster --cluster-file is required" in r.stderr


def test_a_pools_file_as_pool_create_takes_them(tmp_path: Path) -> None:
    pools = tmp_path / "pools.yaml"
    pools.write_text("- {path: /research, reservation: 'gpu=12,cpu=144,mem=576Gi'}\n"
                     "- path: /prod\n  reservation: {gpu: 4, cpu: 48, mem: 192Gi}\n  share: 2\n")
    rows = ROWS.replace("a,0,4,resnet50,600,seconds,,,,,", "a,0,4,resnet50,600,seconds,,prod,,,")
    doc = _json(_trace(tmp_path, rows), "--format", "peloton", "--cluster", "4x4", "--pools", str(pools),
                "--policy", "default")
    assert doc["pools"] == {"/research": 12, "/prod": 4}
    m = doc["policies"]["default"]
    # a is prod's; the others are dealt in turn: b research, c prod, d research, e prod, f research
    assert {p: v["jobs"] for p, v in m["pools"].items()} == {"/prod": 3, "/research": 3}
    assert m["pools"]["/prod"]["reserved_gpus"] == 4
    pools.write_text("- {path: /research, reservation: {gpu: 12}}\n- {path: /prod, reservation: {gpus: 4}}\n")
    r = _replay(_trace(tmp_path), "--format", "peloton", "--cluster", "4x4", "--pools", str(pools))
    assert r.returncode == 2 and r.stderr.startswith(f"peloton: error: --pools: {pools}: pools[1]: ")
    assert "gpus" in r.stderr and "Traceback" not in r.stderr
    pools.write_text("- {path: /x/y}\n")
    r = _replay(_trace(tmp_path), "--format", "peloton", "--cluster", "4x4", "--pools", str(pools))
    assert (r.returncode, r.stderr) == (2, f"peloton: error: --pools: {pools}: pools[0]: pool.path: the parent "
                                           "pool /x of /x/y does not exist\n")


def test_a_scheduler_that_cannot_go_on_is_reported_not_a_traceback(tmp_path: Path) -> None:
    """Two static pools reserving 8 GPUs each (held even while idle: never lent, docs/pools.md), each with a 12-GPU
    gang at its head and nothing running: each pool is entitled to its 8 and neither may borrow the other's, so
    neither gang is ever admitted. The replay says so and exits 1."""
    pools = tmp_path / "pools.yaml"
    pools.write_text("- {path: /a, reservation: {gpu: 8}, reservation_type: static}\n"
                     "- {path: /b, reservation: {gpu: 8}, reservation_type: static}\n")
    r = _replay(_trace(tmp_path, "x,0,12,resnet50,60,seconds,,a,,,\ny,0,12,resnet50,60,seconds,,b,,,\n"),
                "--format", "peloton", "--cluster", "4x4", "--policy", "default", "--pools", str(pools))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "peloton: error: default: replay stalled at virtual second" in r.stderr
    assert "x (/a): waiting for admission: over pool /a's entitlement" in r.stderr
    assert "y (/b): waiting for admission: over pool /b's entitlement" in r.stderr


def test_two_elastic_pools_whose_first_gangs_are_wider_than_their_shares_both_run(tmp_path: Path) -> None:
    """The admission deadlock the replays found (docs/scheduling-quality.md): each elastic pool entitled to 8 of
    16 GPUs, each first gang 12 wide. One borrows beyond its pool's share, then the other: both finish."""
    for policy in ("fifo", "default"):
        doc = _json(_trace(tmp_path, "x,0,12,resnet50,60,seconds,,,,,\ny,0,12,resnet50,60,seconds,,,,,\n"),
                    "--format", "peloton", "--cluster", "4x4", "--policy", policy)
        m = doc["policies"][policy]
        assert doc["pools"] == {"/a": 8, "/b": 8} and m["jobs"] == 2 and m["partial_gang_gpu_s"] == 0


def test_pollux_workload_5_in_two_pools_no_longer_stalls() -> None:
    """It stalled at 38,221 virtual seconds (two 48-GPU imagenet gangs at the heads of /a and /b): every job now
    finishes."""
    p = PUBLIC / "adaptdl"
    doc = _json(str(p / "workloads" / "workload-5.csv"), "--format", "pollux", "--cluster", "16x4", "--profiles",
                str(p / "traces"), "--policy", "default")
    m = doc["policies"]["default"]
    assert doc["jobs"] == m["jobs"] > 100 and m["partial_gang_gpu_s"] == 0 and m["runs_over_max_runtime"] == 0
