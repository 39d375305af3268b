"""Nothing escapes a stop, through the real daemon and CLI (SQLite and PostgreSQL; the local backend, two simulated
hosts of 4 cpu, 4Gi, 2 GPUs). Each member's command leaves four processes behind that its process group cannot
reach (`setsid`, a double fork with setsid, `nohup setsid`, setpgid: tests/escape.py) and every one of them is gone
within the grace period after `job stop`, after its gang failed (another member exited non-zero), after its own
command exited 0, after its gang was preempted, and after a kill -9 of the daemon (the task adopted, then stopped;
a task that ended while no daemon ran: its leftovers killed at the restart). With cgroups (`--task-cgroups auto`:
root with cgroup v2, as on CI) and with the fallback forced (`off`: the wrapper is a child subreaper)."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from peloton.hostmgr.local import cgroups
from tests.dbutil import postgres_database
from tests.e2e.harness import Daemon, serving, wait_until
from tests.escape import escape_command, kill_marked, marked, new_mark, wait_escaped, wait_gone

pytestmark = pytest.mark.e2e

_CGROUPS, _WHY_NOT = cgroups.probe(Path("/nonexistent/peloton-escape-probe-e2e"))
if _CGROUPS is not None:
    cgroups.kill_and_remove_subtree(Path("/nonexistent/peloton-escape-probe-e2e"))
# The mechanism does not depend on the store: cgroups on both stores (adoption reads the journal either way), the
# fallback on SQLite (tests/unit/test_local_escape.py covers it in depth); a third of the runs, for the suite's time.
_NO_CGROUPS = pytest.mark.skipif(_CGROUPS is None, reason=f"no cgroup v2: {_WHY_NOT}")
MODES = [pytest.param(("auto", "sqlite"), marks=_NO_CGROUPS, id="auto-sqlite"),
         pytest.param(("auto", "postgresql"), marks=_NO_CGROUPS, id="auto-postgresql"),
         pytest.param(("off", "sqlite"), id="off-sqlite")]
GRACE_S = 5.0  # a stop's SIGTERM-to-SIGKILL grace (the local backend's default)
SLACK_S = 10.0  # what a loaded 2-core machine may add


@dataclass
class EscapeDaemon(Daemon):
    mode: str = "auto"

    def server_args(self) -> list[str]:
        return [*super().server_args(), "--task-cgroups", self.mode, "--preemption-settle", "1"]


@pytest.fixture(params=MODES)
def ed(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[EscapeDaemon]:
    mode, store = request.param
    with contextlib.ExitStack() as stack:
        url = (f"sqlite:///{tmp_path}/peloton.db" if store == "sqlite" else
               stack.enter_context(postgres_database()))
        yield stack.enter_context(serving(EscapeDaemon(tmp_path / "data", url, mode=mode)))


@pytest.fixture
def marks() -> Iterator[list[str]]:
    made: list[str] = []
    yield made
    for m in made:  # whatever the daemon did: no test leaves them running
        kill_marked(m)


def _mark(marks: list[str]) -> str:
    marks.append(new_mark())
    return marks[-1]


def _spec(name: str, command: str, *, instances: int = 1, gpu: int = 0, priority: int = 0, grace: str = "5s"
          ) -> str:
    """A job spec (JSON is YAML) of one gang; one attempt, so that a failure is the end."""
    return json.dumps({"name": name, "instances": instances, "retry": {"max_attempts": 1},
                       "sla": {"priority": priority, "preemption_grace": grace},
                       "task": {"command": command, "resources": {"cpu": 0.5, "mem": "64Mi", "gpu": gpu}}})


def _work(d: Daemon, job: str, instance: int, run: int = 1) -> Path:
    return d.data_dir / "local" / "sandboxes" / f"{job}-{instance}-{run}" / "work"


def _until_file(path: Path, then: str) -> str:
    return f"while [ ! -e {path} ]; do sleep 0.1; done; {then}"


def _gone_within(mark: str, seconds: float, what: str) -> None:
    took = wait_gone(mark, seconds)
    print(f"{what}: escapees gone {took:.2f}s after it was observed")


def test_nothing_escapes_a_stop_a_failed_gang_or_its_commands_end(ed: EscapeDaemon, tmp_path: Path,
                                                                  marks: list[str]) -> None:
    d = ed
    stop_m, fail_m, done_m = _mark(marks), _mark(marks), _mark(marks)
    go_fail, go_done = tmp_path / "go-fail", tmp_path / "go-done"
    stopped = d.create(_spec("stopped", escape_command(stop_m)), tmp_path)
    # a gang of two: member 1 exits 3 when told, and the gang fails (its one attempt)
    failed = d.create(_spec("failed", escape_command(
        f"{fail_m}-$PELOTON_INSTANCE",
        f'if [ "$PELOTON_INSTANCE" = 1 ]; then {_until_file(go_fail, "exit 3")}; fi; sleep 600'), instances=2),
        tmp_path)
    done = d.create(_spec("done", escape_command(done_m, _until_file(go_done, "exit 0"))), tmp_path)
    for job in (stopped, failed, done):
        d.wait_state(job, "RUNNING")
    wait_escaped(stop_m, _work(d, stopped, 0))
    wait_escaped(f"{fail_m}-0", _work(d, failed, 0))
    wait_escaped(f"{fail_m}-1", _work(d, failed, 1))
    wait_escaped(done_m, _work(d, done, 0))

    t0 = time.monotonic()
    d.cli("job", "stop", stopped)
    wait_gone(stop_m, GRACE_S + SLACK_S)
    print(f"job stop: every escapee gone {time.monotonic() - t0:.2f}s after the stop")
    d.wait_state(stopped, "KILLED")

    go_fail.touch()
    d.wait_state(failed, "FAILED")
    _gone_within(fail_m, GRACE_S + SLACK_S, "gang failed")  # both members' (the killed one's, the failed one's)

    go_done.touch()
    d.wait_state(done, "SUCCEEDED")
    _gone_within(done_m, SLACK_S, "command exited 0")
    assert not marked(stop_m) and not marked(fail_m) and not marked(done_m)


def test_nothing_escapes_a_preemption(ed: EscapeDaemon, tmp_path: Path, marks: list[str]) -> None:
    d = ed
    low_m = _mark(marks)
    # every GPU of both hosts, at priority 1; preempted by a gang of priority 5, with a grace of 2 s
    low = d.create(_spec("low", escape_command(f"{low_m}-$PELOTON_INSTANCE"), instances=2, gpu=2, priority=1,
                         grace="2s"), tmp_path)
    d.wait_state(low, "RUNNING")
    for i in (0, 1):
        wait_escaped(f"{low_m}-{i}", _work(d, low, i))
    high = d.create(_spec("high", "sleep 600", instances=2, gpu=1, priority=5), tmp_path)
    t0 = time.monotonic()
    wait_until(lambda: d.job(low)["status"]["gangs"][0]["preemptions"] == 1, 30, 0.2, "the low gang preempted")
    wait_gone(low_m, 2.0 + SLACK_S)
    print(f"preemption: every escapee gone {time.monotonic() - t0:.2f}s after the preempting job was created")
    d.wait_state(high, "RUNNING")
    assert d.job(low)["status"]["gangs"][0]["state"] in ("PREEMPTED", "QUEUED", "ADMITTED")  # waits for the GPUs
    for job in (low, high):
        d.cli("job", "stop", job)


def test_nothing_escapes_a_kill9_of_the_daemon(ed: EscapeDaemon, tmp_path: Path, marks: list[str]) -> None:
    d = ed
    adopted_m, ended_m = _mark(marks), _mark(marks)
    go = tmp_path / "go-ended"
    adopted = d.create(_spec("adopted", escape_command(adopted_m)), tmp_path)
    ended = d.create(_spec("ended", escape_command(ended_m, _until_file(go, "exit 0"))), tmp_path)
    for job in (adopted, ended):
        d.wait_state(job, "RUNNING")
    wait_escaped(adopted_m, _work(d, adopted, 0))
    wait_escaped(ended_m, _work(d, ended, 0))
    d.kill9()
    go.touch()  # the command of `ended` exits 0 while no daemon runs
    wait_until(lambda: (_work(d, ended, 0).parent / "exit").exists(), 20, 0.1, "the command's end recorded")
    left: dict[int, Any] = {}
    if d.mode == "auto":
        time.sleep(0.5)
        left = marked(ended_m)
        assert len(left) == 4, left  # in their cgroup, waiting for a daemon: the wrapper killed its group only
    else:
        wait_gone(ended_m, SLACK_S)  # the wrapper, their subreaper, killed them itself
    assert len(marked(adopted_m)) == 4
    d.start()
    d.wait_state(ended, "SUCCEEDED")
    wait_gone(ended_m, SLACK_S)
    assert d.state(adopted) == "RUNNING" and {t["attempt"] for t in d.tasks(adopted)} == {1}  # adopted
    assert len(marked(adopted_m)) == 4
    t0 = time.monotonic()
    d.cli("job", "stop", adopted)
    wait_gone(adopted_m, GRACE_S + SLACK_S)
    print(f"adopted, then stopped: every escapee gone {time.monotonic() - t0:.2f}s after the stop")
    d.wait_state(adopted, "KILLED")
