"""`peloton model fit|predict|plan` (peloton/cli/model_offline.py) run as a user runs them: the installed
`peloton` in a subprocess, no daemon, on the public bert profile. JSON shapes, and errors that exit 2 naming the
flag or the file's row and column."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from peloton.modelaware.document import parse_document
from tests.unit.modelaware_data import profile_path

PELOTON = str(Path(sys.executable).parent / "peloton")
SMALL = "1,4,11,1111,44,4444"


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PELOTON, "model", *args], capture_output=True, text=True, cwd=cwd, timeout=60)


def ok(*args: str) -> str:
    r = run(*args)
    assert r.returncode == 0, r.stderr
    return r.stdout


def refused(*args: str, code: int = 2) -> str:
    r = run(*args)
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    assert r.stdout == "" and len(r.stderr.splitlines()) == 1, r.stderr
    return r.stderr.strip()


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("model") / "bert.json"
    r = run("fit", str(profile_path("bert")), "--out", str(out), "--name", "bert", "--nic-gbps", "50",
            "--placements", SMALL)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "30 of 540 rows (placements 1,4,11,1111,44,4444)" in lines[0] and "t4, 50 Gb/s, pcie" in lines[0]
    assert lines[1].startswith("  error on the fitted rows: median ")
    assert lines[2].startswith("  error on the other 510 rows: median 4.3%, p90 11.7%")
    assert lines[-1] == f"wrote {out}"
    return out


def test_fit_writes_a_model_document(bert: Path) -> None:
    doc = parse_document(json.loads(bert.read_text()))
    assert doc.name == "bert" and doc.description.sync == "allreduce-ring"
    assert doc.params is not None and doc.params.reference.nic_gbps == 50 and doc.params.gamma > 1
    assert doc.fit is not None and doc.fit.rows == 30 and doc.fit.source.endswith("bert/placements.csv")


def test_fit_writes_its_document_whole_with_the_umask_and_leaves_nothing_beside_it(bert: Path) -> None:
    # written to a temporary file and renamed over --out (a model is never half written)
    assert [p.name for p in bert.parent.iterdir()] == ["bert.json"]
    assert bert.stat().st_mode & 0o777 == 0o666 & ~_umask()


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def test_fit_to_stdout_on_every_row(tmp_path: Path) -> None:
    r = run("fit", str(profile_path("bert")), "--out", "-", "--gpu-link", "nvlink")
    assert r.returncode == 0, r.stderr
    doc = parse_document(json.loads(r.stdout))
    assert doc.name == "placements" and doc.fit is not None and doc.fit.rows == 540  # the file's name; every row
    assert doc.params is not None and doc.params.reference.gpu_link == "nvlink"
    assert "540 of 540 rows" in r.stderr and "other" not in r.stderr


def test_predict_one_placement(bert: Path) -> None:
    out = json.loads(ok("predict", str(bert), "--placement", "1,1,3,4", "--local-bsz", "8", "-o", "json"))
    assert len(out) == 1
    p: dict[str, Any] = out[0]
    assert set(p) == {"placement", "gpus_per_host", "local_bsz", "step_time", "sync_time", "compute_time",
                      "samples_per_s"}
    assert p["placement"] == "1,1,3,4" and p["gpus_per_host"] == [1, 1, 3, 4] and p["local_bsz"] == 8
    assert 0 < p["sync_time"] < p["step_time"] and p["samples_per_s"] == pytest.approx(9 * 8 / p["step_time"])
    # the same on hosts with faster NICs: less time synchronising
    fast = json.loads(ok("predict", str(bert), "--placement", "1134", "--local-bsz", "8", "--nic-gbps", "100",
                         "-o", "json"))[0]
    assert fast["sync_time"] < p["sync_time"] and fast["gpus_per_host"] == [1, 1, 3, 4]
    table = ok("predict", str(bert), "--placement", "1134", "--local-bsz", "8").splitlines()
    assert table[0].split() == ["PLACEMENT", "LOCAL_BSZ", "STEP_TIME(S)", "SYNC_TIME(S)", "SAMPLES/S"]
    assert table[1].split()[:2] == ["1134", "8"]


def test_predict_rows_in_input_order(bert: Path, tmp_path: Path) -> None:
    rows = tmp_path / "rows.csv"
    rows.write_text('placement,local_bsz\n4444,12\n1,4\n"2,2",6\n')
    out = json.loads(ok("predict", str(bert), "--input", str(rows), "-o", "json"))
    assert [(p["placement"], p["local_bsz"]) for p in out] == [("4444", 12), ("1", 4), ("2,2", 6)]
    assert out[1]["sync_time"] == 0 and out[0]["gpus_per_host"] == [4, 4, 4, 4]
    # a profile as input: its measurements beside the predictions
    measured = json.loads(ok("predict", str(bert), "--input", str(profile_path("bert")), "-o", "json"))
    assert len(measured) == 540 and all("measured_step_time" in p for p in measured)
    errs = sorted(abs(p["step_time"] - p["measured_step_time"]) / p["measured_step_time"] for p in measured)
    assert errs[len(errs) // 2] < 0.10


@pytest.mark.parametrize(("text", "words"), [
    ("placement,local_bsz\n11,4\n1x1,4\n", "row 2 (line 3), column placement: '1x1' is not GPUs per host"),
    ("placement,local_bsz\n11,4\n11,0\n", "row 2 (line 3), column local_bsz: expected a positive number, got '0'"),
    ("placement,local_bsz\n11\n", "row 1 (line 2): 1 columns, the header has 2"),
    ("placement,bsz\n11,4\n", "header: unknown column 'bsz'"),
    ("placement\n11\n", "header has no local_bsz column"),
    ("placement,local_bsz\n", "no rows after the header"),
])
def test_predict_input_errors_name_the_row_and_column(bert: Path, tmp_path: Path, text: str, words: str) -> None:
    rows = tmp_path / "rows.csv"
    rows.write_text(text)
    err = refused("predict", str(bert), "--input", str(rows))
    assert err.startswith(f"peloton: error: --input: {rows}") and words in err, err


def test_plan_on_free_hosts(bert: Path) -> None:
    plans = json.loads(ok("plan", str(bert), "--free", "4,4,4,4", "--gpus", "8", "--local-bsz", "8", "-o", "json"))
    assert 1 <= len(plans) <= 5
    for i, p in enumerate(plans, start=1):
        assert set(p) == {"rank", "gpus", "gpus_per_host", "hosts", "local_bsz", "step_time", "sync_time",
                          "compute_time", "samples_per_s", "servers"}
        assert p["rank"] == i and p["gpus"] == 8 and sum(p["gpus_per_host"]) == 8 and p["servers"] == []
        assert [h["gpus"] for h in p["hosts"]] == p["gpus_per_host"]
        assert {h["name"] for h in p["hosts"]} <= {"h0", "h1", "h2", "h3"}
    assert [p["samples_per_s"] for p in plans] == sorted((p["samples_per_s"] for p in plans), reverse=True)
    assert plans[0]["gpus_per_host"] == [2, 2, 2, 2]
    # the size chosen, by throughput and by efficiency; --top
    assert json.loads(ok("plan", str(bert), "--free", "4,4,4,4", "--max-gpus", "16", "--global-bsz", "64",
                         "--top", "1", "-o", "json"))[0]["gpus"] > 1
    eff = json.loads(ok("plan", str(bert), "--free", "4,4,4,4", "--local-bsz", "8", "--objective", "efficiency",
                        "-o", "json"))
    assert eff[0]["gpus"] == 1
    table = ok("plan", str(bert), "--free", "4,4,4,4", "--gpus", "8", "--local-bsz", "8").splitlines()
    assert table[0].split() == ["#", "GPUS", "PER", "HOST", "LOCAL_BSZ", "STEP_TIME(S)", "SAMPLES/S", "PER", "GPU",
                                "HOSTS"]
    assert table[1].split()[:3] == ["1", "8", "2,2,2,2"]


def test_plan_on_heterogeneous_hosts(bert: Path, tmp_path: Path) -> None:
    hosts = tmp_path / "hosts.csv"
    hosts.write_text("name,free_gpus,gpu_model,nic_gbps,gpu_link\nslow,4,t4,10,pcie\nfast1,4,a100,100,nvlink\n"
                     "fast2,4,a100,100,nvlink\nbusy,0,a100,100,nvlink\nref,4,,,\nfast3,4,a100,100,nvlink\n")
    plans = json.loads(ok("plan", str(bert), "--hosts", str(hosts), "--gpus", "8", "--local-bsz", "8", "-o", "json"))
    # bert's fit makes two-host rings slow (docs/model-aware.md): three hosts, all A100s on 100 Gb/s
    assert {h["name"] for h in plans[0]["hosts"]} == {"fast1", "fast2", "fast3"}
    assert "busy" not in {h["name"] for p in plans for h in p["hosts"]}


@pytest.mark.parametrize(("text", "words"), [
    ("name,free_gpus\na,4\na,2\n", "row 2 (line 3), column name: 'a' is also in row 1 (line 2)"),
    ("name,free_gpus\na,four\n", "row 1 (line 2), column free_gpus: expected 0..256, got 'four'"),
    ("name,free_gpus,gpu_model\na,4,t5\n", "row 1 (line 2), column gpu_model: unknown GPU model 't5'"),
    ("name,free_gpus,nic_gbps\na,4,-1\n", "row 1 (line 2), column nic_gbps: expected a positive number"),
    ("name,free_gpus,gpu_link\na,4,ib\n", "row 1 (line 2), column gpu_link: expected one of pcie, nvlink"),
    ("name,free_gpus,rack\na,4,r1\n", "header: unknown column 'rack'"),
    ("name\na\n", "header has no free_gpus column"),
])
def test_plan_hosts_errors_name_the_row_and_column(bert: Path, tmp_path: Path, text: str, words: str) -> None:
    hosts = tmp_path / "hosts.csv"
    hosts.write_text(text)
    err = refused("plan", str(bert), "--hosts", str(hosts), "--gpus", "2", "--local-bsz", "8")
    assert err.startswith(f"peloton: error: --hosts: {hosts}") and words in err, err


@pytest.mark.parametrize(("args", "words"), [
    (["plan", "{m}", "--free", "4,4", "--gpus", "2"], "--local-bsz: required, or --global-bsz"),
    (["plan", "{m}", "--free", "4,x", "--gpus", "2", "--local-bsz", "8"], "--free: host 2: 'x' is not a number"),
    (["plan", "{m}", "--free", "4,4", "--gpus", "0", "--local-bsz", "8"], "--gpus: must be 1..4096, got 0"),
    (["plan", "{m}", "--free", "4,4", "--gpus", "2", "--local-bsz", "-8"], "--local-bsz: must be greater than 0"),
    (["plan", "{m}", "--free", "4,4", "--gpus", "2", "--local-bsz", "8", "--top", "0"], "--top: must be 1..100"),
    (["plan", "{m}", "--free", "4,4", "--gpus", "2", "--local-bsz", "8", "--servers", "2"],
     "--servers: only for a ps model"),
    (["plan", "{m}", "--free", "4,4", "--max-gpus", "2", "--min-gpus", "3", "--local-bsz", "8"],
     "--min-gpus: 3 is more than max_gpus (2)"),
    (["plan", "{m}", "--free", "4,4", "--gpus", "2", "--local-bsz", "8", "--gpu-model", "h200"],
     "--gpu-model: unknown GPU model 'h200'"),
    (["predict", "{m}", "--placement", "1x"], "--placement: '1x' is not GPUs per host"),
    (["predict", "{m}", "--placement", "11"], "--local-bsz: required"),
    (["predict", "{m}", "--placement", "11", "--local-bsz", "4", "--nic-gbps", "0"], "--nic-gbps: expected a positive"),
    (["predict", "/nonexistent/m.json", "--placement", "11"], "MODEL: cannot read /nonexistent/m.json"),
    (["fit", "{p}", "--out", "-", "--placements", "1,4,9"], "--placements: 9 has no row in"),
    (["fit", "{p}", "--out", "-", "--placements", "1,,4"], "--placements: '' is not a placement"),
    (["fit", "/nonexistent.csv", "--out", "-"], "PROFILE: cannot read /nonexistent.csv"),
    (["fit", "{p}", "--out", "/nonexistent/dir/m.json"], "--out: cannot write /nonexistent/dir/m.json"),
    (["fit", "{p}", "--out", "/tmp"], "--out: cannot write /tmp: Is a directory"),
])
def test_bad_arguments_exit_2_naming_the_flag(bert: Path, args: list[str], words: str) -> None:
    argv = [a.format(m=bert, p=profile_path("bert")) for a in args]
    err = refused(*argv)
    assert err.startswith("peloton: error: ") and words in err, err


def test_a_bad_model_document_names_its_field(tmp_path: Path) -> None:
    m = tmp_path / "m.json"
    m.write_text('{"kind": "peloton.model/v1", "params": {"alpha_c": 1}}')
    assert f"{m}: model.params.beta_c: required" in refused("predict", str(m), "--placement", "1", "--local-bsz", "1")
    m.write_text("{")
    assert f"{m}: not JSON" in refused("predict", str(m), "--placement", "1", "--local-bsz", "1")


def test_no_plan_fits_exits_1(bert: Path) -> None:
    err = refused("plan", str(bert), "--free", "4,4", "--gpus", "9", "--local-bsz", "8", code=1)
    assert err == "peloton: error: no plan fits: the hosts have 8 free GPU(s), the request needs 9"


def test_a_parameter_server_model_from_its_description(tmp_path: Path) -> None:
    m = tmp_path / "ps.json"
    m.write_text(json.dumps({"kind": "peloton.model/v1", "name": "r50", "description": {
        "parameters": 25_000_000, "flops_per_sample": 1.2e10, "sync": "ps", "ps_count": 2, "local_bsz": 32}}))
    pred = json.loads(ok("predict", str(m), "--placement", "2,2", "-o", "json"))[0]
    assert pred["local_bsz"] == 32 and pred["sync_time"] > 0
    plans = json.loads(ok("plan", str(m), "--free", "4,4,4,0", "--gpus", "8", "-o", "json"))
    assert plans and all(len(p["servers"]) == 2 and p["gpus"] == 8 for p in plans)


def test_the_offline_commands_import_no_grpc(bert: Path) -> None:
    code = ("import sys; from peloton.cli.main import main; "
            f"rc = main(['model', 'plan', {str(bert)!r}, '--free', '4,4', '--gpus', '4', '--local-bsz', '8']); "
            "print(rc, sorted(n for n in sys.modules if n == 'grpc' or n.startswith(('grpc.', 'google.', "
            "'peloton.api', 'sqlalchemy'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[-1] == "0 []"
