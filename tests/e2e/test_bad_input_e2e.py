"""Bad input gets one clear line naming the field, a non-zero exit, and writes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.harness import Daemon

pytestmark = pytest.mark.e2e

GOOD = "name: ok\ninstances: 2\ntask: {command: 'true', resources: {cpu: 0.5, mem: 64Mi}}\n"

CASES = [
    ("unknown field", GOOD + "bogus: 1\n", "bogus"),
    ("unknown nested field", "name: x\ninstances: 1\ntask: {command: 'true', colour: red, resources: {cpu: 1}}\n",
     "colour"),
    ("negative cpu", "name: x\ninstances: 1\ntask: {command: 'true', resources: {cpu: -1}}\n", "task.resources.cpu"),
    ("negative mem", "name: x\ninstances: 1\ntask: {command: 'true', resources: {cpu: 1, mem: -5Gi}}\n",
     "task.resources.mem"),
    ("zero instances", "name: x\ninstances: 0\ntask: {command: 'true', resources: {cpu: 1}}\n", "instances"),
    ("min_available > instances",
     "name: x\ninstances: 2\ngang: {min_available: 3}\ntask: {command: 'true', resources: {cpu: 1}}\n",
     "gang.min_available"),
    ("never fits", "name: x\ninstances: 2\ntask: {command: 'true', resources: {cpu: 1, gpu: 100}}\n", "never fit"),
    ("gang never fits cluster", "name: x\ninstances: 9\ntask: {command: 'true', resources: {cpu: 1, gpu: 1}}\n",
     "never fit"),
    ("bad strategy", GOOD + "placement: {strategy: random}\n", "placement.strategy"),
    ("missing pool", GOOD + "respool: /nope\n", "respool"),
    ("not yaml", "name: [unclosed\n", "YAML"),
]


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_invalid_specs_are_rejected_and_write_nothing(daemon: Daemon, tmp_path: Path) -> None:
    for what, spec, needle in CASES:
        f = tmp_path / "bad.yaml"
        f.write_text(spec)
        r = daemon.cli("job", "create", "-f", str(f), check=False)
        assert r.returncode != 0, what
        assert r.stdout == "", what
        assert needle in r.stderr, (what, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1, (what, r.stderr)
        assert "Traceback" not in r.stderr
    assert daemon.cli("job", "list", "-o", "json").stdout.strip() in ("{}", '{\n  "jobs": []\n}')


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_cli_errors_are_one_line(daemon: Daemon, tmp_path: Path) -> None:
    r = daemon.cli("job", "get", "0123456789ab", check=False)
    assert r.returncode == 1 and "not found" in r.stderr.lower() and len(r.stderr.strip().splitlines()) == 1
    r = daemon.cli("job", "create", "-f", str(tmp_path / "missing.yaml"), check=False)
    assert r.returncode == 2 and "cannot read" in r.stderr
    import subprocess
    import sys
    r2 = subprocess.run([sys.executable, "-m", "peloton.cli.main", "--address", "127.0.0.1:1", "job", "list"],
                        capture_output=True, text=True, timeout=60)
    assert r2.returncode == 1 and "cannot reach" in r2.stderr and "Traceback" not in r2.stderr
