"""The CLI as a newcomer meets it, through the real command against the real daemon: usage errors, connection
flags after the command, `job stop` of several jobs and of selections, `--tail` in lines, `job logs`, the
message of a process that does not serve a call (split roles), shell completion."""

from __future__ import annotations

import json
import os
import pty
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from peloton.domain.states import JobState
from tests.e2e.harness import PELOTON, Daemon, kill_sandboxed_processes, wait_until

pytestmark = pytest.mark.e2e
sqlite_only = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
# the tests but the one that lists every job share one daemon per store (`shared_daemon`, tests/e2e/conftest.py)
shared_sqlite_only = pytest.mark.parametrize("module_daemon", ["sqlite"], indirect=True)

SLEEPER = "name: {name}\ninstances: 1\n{owner}task: {{command: 'sleep 600', resources: {{cpu: 0.5, mem: 64Mi}}}}\n"


def one_line(r: subprocess.CompletedProcess[str]) -> str:
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
    return r.stderr.strip()


@shared_sqlite_only
def test_usage_errors_name_the_flag_and_suggest(shared_daemon: Daemon) -> None:
    r = shared_daemon.cli("job", "list", "--state", "running", "--state", "bogus", check=False)
    assert r.returncode == 2 and r.stdout == ""
    states = ", ".join(s.value for s in JobState)
    assert one_line(r) == f"peloton: error: --state: unknown job state 'bogus' (valid: {states})"
    for argv, line in ((["job", "lst"], "peloton: error: job: unknown command 'lst' (did you mean 'list'?)"),
                       (["jb", "list"], "peloton: error: unknown command 'jb' (did you mean 'job'?)")):
        r = shared_daemon.cli(*argv, check=False)
        assert (r.returncode, r.stdout, one_line(r)) == (2, "", line)
    r = shared_daemon.cli("task", "logs", "0123456789ab", "0", "--tail", "0", check=False)
    assert r.returncode == 2 and one_line(r) == "peloton: error: --tail: must be at least 1 line, got 0"


@sqlite_only
def test_connection_flags_after_the_command_and_the_later_one_wins(daemon: Daemon, tmp_path: Path) -> None:
    job = daemon.create(SLEEPER.format(name="flags", owner=""), tmp_path)

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*PELOTON, *argv], capture_output=True, text=True, timeout=60)

    r = run("job", "list", "-o", "json", "--address", daemon.address)
    assert r.returncode == 0 and job in r.stdout, r.stderr
    r = run("--address", "127.0.0.1:1", "job", "list", "-q", "--address", daemon.address)
    assert (r.returncode, r.stdout) == (0, f"{job}\n"), r.stderr
    r = run("--address", daemon.address, "job", "list", "--address", "127.0.0.1:1")
    assert r.returncode == 1 and "cannot reach the peloton daemon at 127.0.0.1:1" in one_line(r)
    # -o too, before the group; after the command it wins; a command that acts prints the record of what it did
    r = run("-o", "json", "job", "list", "--address", daemon.address)
    assert r.returncode == 0 and r.stdout.startswith("{") and job in r.stdout, r.stderr
    r = run("-o", "json", "job", "list", "-o", "table", "--address", daemon.address)
    assert r.returncode == 0 and not r.stdout.startswith("{") and job in r.stdout, r.stderr
    r = run("-o", "json", "db", "upgrade", "--db", "sqlite:///nowhere.db")  # a local command prints no records
    assert (r.returncode, one_line(r)) == (2, "peloton: error: -o/--output: `peloton db upgrade` has no output "
                                              "format to choose")
    r = run("-o", "json", "job", "stop", job, "--address", daemon.address)
    assert r.returncode == 0 and json.loads(r.stdout)["jobs"][0]["job_id"] == job, r.stderr


def test_job_stop_several_ids_finished_and_unknown(shared_daemon: Daemon, tmp_path: Path) -> None:
    a, b = (shared_daemon.create(SLEEPER.format(name=n, owner=""), tmp_path) for n in ("a", "b"))
    done = shared_daemon.create("name: done\ninstances: 1\ntask: {command: 'true', resources: {cpu: 0.5, mem: 64Mi}}\n",
                                tmp_path)
    shared_daemon.wait_state(done, "SUCCEEDED")
    shared_daemon.wait_state(a, "RUNNING")
    r = shared_daemon.cli("job", "stop", a, "0123456789ab", done, b, check=False)
    # every job it can stop is stopped; the unknown one makes the exit code 1
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.splitlines() == [f"stopping job {a}", "peloton: error: job '0123456789ab' not found",
                                     f"job {done} has already finished (SUCCEEDED); nothing to stop",
                                     f"stopping job {b}"]
    shared_daemon.wait_state(a, "KILLED")
    shared_daemon.wait_state(b, "KILLED")
    r = shared_daemon.cli("job", "stop", a)  # finished now: said so, nothing done, exit 0
    assert r.stderr == f"job {a} has already finished (KILLED); nothing to stop\n"
    r = shared_daemon.cli("job", "stop", check=False)
    assert r.returncode == 2 and "give one or more job ids, or a selection" in one_line(r)
    r = shared_daemon.cli("job", "stop", a, "--owner", "x", check=False)
    assert r.returncode == 2 and "--owner: give job ids or a selection, not both" in one_line(r)


def _confirm(daemon: Daemon, answer: bytes, *argv: str) -> subprocess.CompletedProcess[str]:
    """The CLI with a terminal as its stdin, answering the question with `answer`."""
    primary, secondary = pty.openpty()
    try:
        p = subprocess.Popen([*PELOTON, "--address", daemon.address, *argv], stdin=secondary,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        os.write(primary, answer)
        out, err = p.communicate(timeout=60)
    finally:
        os.close(primary)
        os.close(secondary)
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


@shared_sqlite_only
def test_job_stop_a_selection_lists_and_asks(shared_daemon: Daemon, tmp_path: Path) -> None:
    bobs = [shared_daemon.create(SLEEPER.format(name=f"b{i}", owner="owner: bob\n"), tmp_path) for i in range(2)]
    alice = shared_daemon.create(SLEEPER.format(name="a", owner="owner: alice\n"), tmp_path)
    # without a terminal to ask on and without --yes: refused, nothing stopped
    r = shared_daemon.cli("job", "stop", "--owner", "bob", check=False)
    assert r.returncode == 2 and "add --yes (-y)" in r.stderr.splitlines()[-1]
    assert all(bob in r.stderr for bob in bobs) and alice not in r.stderr  # the matching jobs are listed
    # on a terminal: asked; anything but y/yes stops nothing
    r = _confirm(shared_daemon, b"n\n", "job", "stop", "--owner", "bob")
    assert r.returncode == 1 and "stop these 2 job(s)? [y/N]" in r.stderr and "nothing stopped" in r.stderr
    assert {shared_daemon.state(j) for j in (*bobs, alice)} <= {"PENDING", "RUNNING"}
    r = _confirm(shared_daemon, b"y\n", "job", "stop", "--owner", "bob", "--state", "pending,running")
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("stopping job ") == 2 and all(f"stopping job {j}\n" in r.stderr for j in bobs)
    for j in bobs:
        shared_daemon.wait_state(j, "KILLED")
    assert shared_daemon.state(alice) in ("PENDING", "RUNNING")
    r = shared_daemon.cli("job", "stop", "--owner", "bob", "-y")  # nothing unfinished left
    assert r.stderr == "peloton: no unfinished job matches --owner bob\n"
    r = shared_daemon.cli("job", "stop", "--pool", "/", "--yes")
    assert f"stopping job {alice}" in r.stderr.splitlines()
    r = shared_daemon.cli("job", "stop", "--pool", "no pool", "--yes", check=False)
    assert r.returncode == 2 and one_line(r).startswith("peloton: error: --pool: 'no pool' is not a pool path")


LINES_SPEC = """
name: lines
instances: 2
task:
  command: "{python} -c '{code}'"
  resources: {{cpu: 0.5, mem: 64Mi}}
"""
# rank r writes 300 lines of 1000 bytes (300 kB, past the first 64 KiB read back), a line of 100 kB, and a last
# line without its newline
LINES_CODE = ("import os, sys; r = os.environ[\\\"RANK\\\"]; "
              "[sys.stdout.write(f\\\"{r}:{i:04d}:\\\" + \\\"x\\\" * 993 + \\\"\\\\n\\\") for i in range(300)]; "
              "sys.stdout.write(\\\"L\\\" * 100000 + \\\"\\\\n\\\"); sys.stdout.write(f\\\"end of {r}\\\")")


def expected_log(rank: int) -> bytes:
    return b"".join(b"%d:%04d:" % (rank, i) + b"x" * 993 + b"\n" for i in range(300)) + b"L" * 100000 + b"\n" + \
        b"end of %d" % rank


def logs(daemon: Daemon, *argv: str) -> bytes:
    r = subprocess.run([*PELOTON, "--address", daemon.address, *argv], capture_output=True, timeout=90)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_logs_tail_counts_lines_and_job_logs_prefix_every_member(shared_daemon: Daemon, tmp_path: Path) -> None:
    job = shared_daemon.create(LINES_SPEC.format(python=sys.executable, code=LINES_CODE), tmp_path)
    shared_daemon.wait_state(job, "SUCCEEDED")
    whole = expected_log(1)
    assert logs(shared_daemon, "task", "logs", job, "1") == whole
    lines = whole.splitlines(keepends=True)
    for n in (1, 2, 3, 250, 302, 10_000):
        assert logs(shared_daemon, "task", "logs", job, "1", "--tail", str(n)) == b"".join(lines[-n:]), n
    assert logs(shared_daemon, "task", "logs", job, "1", "--tail", "2", "-f") == b"".join(lines[-2:])
    # job logs: member after member, each line with its instance; a last line without a newline gets one
    out = logs(shared_daemon, "job", "logs", job, "--tail", "2")
    assert out == b"".join(b"[%d] " % r + line for r in (0, 1)
                           for line in (b"L" * 100000 + b"\n", b"end of %d\n" % r))
    follow = logs(shared_daemon, "job", "logs", job, "-f")  # the job has ended: the whole logs, then it exits
    for r in (0, 1):
        mine = [line[len(b"[%d] " % r):] for line in follow.splitlines(keepends=True) if line.startswith(b"[%d] " % r)]
        assert b"".join(mine) == expected_log(r) + b"\n"


def test_job_logs_follow_until_the_job_ends(shared_daemon: Daemon, tmp_path: Path) -> None:
    go = tmp_path / "go"
    job = shared_daemon.create(f"""
name: follow
instances: 3
task:
  command: "echo start $RANK; while [ ! -e {go} ]; do sleep 0.1; done; echo end $RANK"
  resources: {{cpu: 0.5, mem: 64Mi}}
""", tmp_path)
    p = shared_daemon.popen("job", "logs", job, "-f")
    assert p.stdout is not None
    started = sorted(p.stdout.readline() for _ in range(3))  # printed while the members run
    assert started == [f"[{r}] start {r}\n" for r in range(3)]
    assert p.poll() is None
    go.touch()
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert sorted(out.splitlines()) == [f"[{r}] end {r}" for r in range(3)]
    assert shared_daemon.state(job) == "SUCCEEDED"


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_a_call_to_a_process_that_does_not_serve_it_says_which_does(db_url: str, tmp_path: Path) -> None:
    class RoleDaemon(Daemon):
        extra: list[str] = []

        def server_args(self) -> list[str]:
            return [*super().server_args(), *self.extra]

    hostmgr = RoleDaemon(tmp_path / "hostmgr", db_url)
    hostmgr.extra = ["--role", "hostmgr"]
    rest = RoleDaemon(tmp_path / "rest", db_url)
    rest.extra = ["--role", "jobmgr,resmgr,placement", "--hostmgr", f"unix:{tmp_path / 'hostmgr' / 'internal.sock'}",
                  "--internal-secret-file", str(tmp_path / "hostmgr" / "internal.secret")]
    try:
        hostmgr.start()
        rest.start()
        # the job manager's process knows from the store who leads hostmgr
        r = wait_until(lambda: (lambda r: r if hostmgr.address in r.stderr else None)(
            rest.cli("host", "list", check=False)), 30, 0.5, "the hostmgr leader in the store")
        assert r.returncode == 1 and one_line(r) == (
            f"peloton: error: the daemon at {rest.address} runs jobmgr, placement, resmgr; `host list` is served by "
            f"the process running hostmgr ({hostmgr.address}, pid {hostmgr.proc.pid} on {os.uname().nodename}): "  # type: ignore[union-attr]
            "give its address with --address")
        r = hostmgr.cli("job", "list", check=False)
        assert r.returncode == 1 and one_line(r).startswith(
            f"peloton: error: the daemon at {hostmgr.address} runs hostmgr; `job list` is served by the process "
            "running jobmgr")
        assert "local-1" in hostmgr.cli("host", "list").stdout
        # a host manager alone dials no empty --resmgr: its log has no gRPC core error
        assert "grpc" not in hostmgr.log().lower() and "Traceback" not in hostmgr.log(), hostmgr.log()[-3000:]
    finally:
        rest.stop()
        hostmgr.stop()
        kill_sandboxed_processes(tmp_path)


def test_completion_scripts_load_in_their_shells(tmp_path: Path) -> None:
    bash = subprocess.run([*PELOTON, "completion", "bash"], capture_output=True, text=True, timeout=60)
    assert bash.returncode == 0 and bash.stderr == ""
    script = tmp_path / "peloton.bash"
    script.write_text(bash.stdout)
    # sourced without errors, registered, and completing: `peloton job l<TAB>`, `peloton job list -o <TAB>`
    r = subprocess.run(["bash", "-c", f'source {script} && complete -p peloton && '
                        'COMP_WORDS=(peloton job l) COMP_CWORD=2 && _peloton && echo "${COMPREPLY[*]}" && '
                        'COMP_WORDS=(peloton --address x jb) COMP_CWORD=3 && _peloton && echo "${COMPREPLY[*]}" && '
                        'COMP_WORDS=(peloton job list -o "") COMP_CWORD=4 && _peloton && echo "${COMPREPLY[*]}"'],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert r.stdout.splitlines() == ["complete -o default -F _peloton peloton", "list ls logs", "",
                                     "table wide json yaml"]
    zsh = shutil.which("zsh")
    if zsh is None:
        pytest.skip("zsh is not installed: the zsh script's check needs it (apt-get install zsh)")
    z = subprocess.run([*PELOTON, "completion", "zsh"], capture_output=True, text=True, timeout=60)
    script = tmp_path / "_peloton"
    script.write_text(z.stdout)
    assert subprocess.run([zsh, "-n", str(script)], capture_output=True, text=True).returncode == 0
    # loaded after compinit it registers itself; its function completes with compadd (here a stand-in printing)
    r = subprocess.run([zsh, "-f", "-c", f"autoload -U compinit && compinit -u -d {tmp_path}/zcompdump && "
                        f"source {script} && print -r -- $_comps[peloton]; "
                        "compadd() { shift; print -r -- \"$@\" }; "
                        "words=(peloton job l); CURRENT=3; _peloton; words=(peloton job list -o ''); CURRENT=5; _peloton"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert r.stdout.splitlines() == ["_peloton", "create plan get describe list ls stop delete rm wait logs",
                                     "table wide json yaml"]
