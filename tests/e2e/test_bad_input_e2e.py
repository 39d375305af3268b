"""Bad input gets one clear line naming the field, a non-zero exit, and writes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.harness import Daemon

pytestmark = pytest.mark.e2e
# the tests but the first (which finds no job at all) share one daemon per store (tests/e2e/conftest.py)

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
    # the library's words never reach the user: the field, what it expects, what it got
    ("instances as a word", "name: x\ninstances: four\ntask: {command: 'true', resources: {cpu: 1}}\n",
     "bad.yaml: instances: expected a whole number, got 'four'"),
    ("only a name", "name: x\n", "bad.yaml: instances: required (how many members, 1 to 100000); also missing: "
                                  "task.command, task.resources.cpu"),
    ("no command", "name: x\ninstances: 1\ntask: {resources: {cpu: 1}}\n", "bad.yaml: task.command: required"),
    ("a duration in words", GOOD + "gang: {launch_timeout: five minutes}\n",
     "bad.yaml: gang.launch_timeout: expected a duration like 90s, 5m, 1h30m or 2d, got 'five minutes'"),
    ("a duration too long", GOOD + "gang: {launch_timeout: 8d}\n", "gang.launch_timeout: at most 7d, got 8d"),
    ("a boolean in words", GOOD + "sla: {preemptible: maybe}\n",
     "bad.yaml: sla.preemptible: expected true or false, got 'maybe'"),
    ("cpu as a word", "name: x\ninstances: 1\ntask: {command: 'true', resources: {cpu: lots}}\n",
     "bad.yaml: task.resources.cpu: expected a number, got 'lots'"),
    ("a list for a name", "name: [a, b]\ninstances: 1\ntask: {command: 'true', resources: {cpu: 1}}\n",
     "bad.yaml: name: expected text, got a list"),
]


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


@pytest.mark.parametrize("module_daemon", ["sqlite"], indirect=True)
def test_cli_errors_are_one_line(shared_daemon: Daemon, tmp_path: Path) -> None:
    r = shared_daemon.cli("job", "get", "0123456789ab", check=False)
    assert r.returncode == 1 and "not found" in r.stderr.lower() and len(r.stderr.strip().splitlines()) == 1
    r = shared_daemon.cli("job", "create", "-f", str(tmp_path / "missing.yaml"), check=False)
    assert r.returncode == 2 and "cannot read" in r.stderr
    import subprocess
    import sys
    r2 = subprocess.run([sys.executable, "-m", "peloton.cli.main", "--address", "127.0.0.1:1", "job", "list"],
                        capture_output=True, text=True, timeout=60)
    assert r2.returncode == 1 and "cannot reach" in r2.stderr and "Traceback" not in r2.stderr


def test_durations_in_the_units_people_write_and_a_job_named_on_are_accepted(shared_daemon: Daemon, tmp_path: Path) -> None:
    """`5m`, `1h30m`, `90s` are durations; `on` (YAML 1.1's boolean) is a name like any other."""
    job = shared_daemon.create("name: on\ninstances: 1\ngang: {launch_timeout: 5m}\n"
                        "sla: {max_runtime: 1h30m, preemption_grace: 90s}\n"
                        "task: {command: 'true', resources: {cpu: 0.5}, env: {MASK: 0x10}}\n", tmp_path)
    spec = shared_daemon.job(job)["spec"]
    assert spec["name"] == "on"
    seconds = {k: float(v.rstrip("s")) for k, v in ((("launch", spec["gang"]["launch_timeout"]),
                                                     ("runtime", spec["sla"]["max_runtime"]),
                                                     ("grace", spec["sla"]["preemption_grace"])))}
    assert seconds == {"launch": 300.0, "runtime": 5400.0, "grace": 90.0}
    assert spec["task"]["env"]["MASK"] == "0x10"  # as written, not the number 16
    assert "on" in shared_daemon.cli("job", "list").stdout.split()


def test_a_setting_the_backend_ignores_is_warned_about_at_create(shared_daemon: Daemon, tmp_path: Path) -> None:
    """container.image means nothing to the local backend: the job is created, and the CLI says so on stderr."""
    f = tmp_path / "image.yaml"
    f.write_text("name: img\ninstances: 1\n"
                 "task: {command: 'true', resources: {cpu: 0.5}, container: {image: 'pytorch:2.3'}}\n")
    r = shared_daemon.cli("job", "create", "-f", str(f))
    job = r.stdout.strip()
    assert len(job) == 12 and shared_daemon.job(job)["spec"]["task"]["container"]["image"] == "pytorch:2.3"
    assert r.stderr.splitlines() == [
        "peloton: warning: task.container.image: ignored by the local backend, which runs each task as a process on "
        "its host, in no container (only the mesos backend runs a task in an image)"]
    f.write_text("name: plain\ninstances: 1\ntask: {command: 'true', resources: {cpu: 0.5}}\n")
    assert shared_daemon.cli("job", "create", "-f", str(f)).stderr == ""
