"""End to end: the real daemon (SQLite and PostgreSQL), driven through the real CLI, running real processes."""

from __future__ import annotations

import json
import os
import pwd
import random
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.asroot import let_others_pass
from tests.e2e.harness import Daemon, pid_alive, serving, wait_until

pytestmark = pytest.mark.e2e
RENDEZVOUS = Path(__file__).parent / "rendezvous.py"


def test_four_member_gang_rendezvous_across_two_hosts(shared_daemon: Daemon, tmp_path: Path) -> None:
    job = shared_daemon.create(f"""
name: rendezvous
instances: 4
placement: {{strategy: spread}}
task:
  command: {sys.executable} {RENDEZVOUS}
  resources: {{cpu: 1, mem: 64Mi, ports: 1}}
""", tmp_path)
    r = shared_daemon.cli("job", "wait", job, "--timeout", "120", check=False, timeout=150)
    assert r.returncode == 0, (r.stderr, shared_daemon.job(job), shared_daemon.log()[-3000:])
    tasks = shared_daemon.tasks(job)
    assert {t["state"] for t in tasks} == {"SUCCEEDED"}
    assert len({t["host"] for t in tasks}) == 2  # spread across both simulated hosts
    logs = {t["instance"]: shared_daemon.cli("task", "logs", job, str(t["instance"])).stdout for t in tasks}
    assert "all peers connected" in logs[0]
    for i in (1, 2, 3):
        assert "released by rank 0" in logs[i]
    # every member saw the same master, one world, and distinct ranks
    masters = {line.split("master=")[1].split()[0] for log in logs.values() for line in log.splitlines()
               if line.startswith("rank=")}
    assert len(masters) == 1 and masters.pop().startswith("127.0.0.1:")
    assert "hosts=127.0.0.1:4" in logs[0]
    assert "hostfile: 127.0.0.1 slots=4" in logs[0]
    # job list shows it
    assert job in shared_daemon.cli("job", "list").stdout



def test_a_port_another_program_holds_is_never_handed_to_a_member(db_url: str, tmp_path: Path) -> None:
    # the first port of each simulated host's range is held by a listening socket of this test (as an outgoing
    # connection's ephemeral port would be): the members get other ports, bind them, and the job succeeds
    holders: list[socket.socket] = []
    while not holders:
        base = random.randrange(20000, 30000, 2000)
        try:
            for p in (base, base + 1000):
                s = socket.socket()
                holders.append(s)
                s.bind(("127.0.0.1", p))
                s.listen()
        except OSError:  # (someone holds it already: another base)
            for s in holders:
                s.close()
            holders = []
    try:
        with serving(Daemon(tmp_path / "data", db_url, port_base=base)) as d:
            job = d.create(f"""
name: ports
instances: 2
placement: {{strategy: spread}}
task:
  command: {sys.executable} -c "import os, socket; socket.socket().bind(('127.0.0.1', int(os.environ['PELOTON_PORTS']))); print('bound')"
  resources: {{cpu: 0.5, mem: 64Mi, ports: 1}}
""", tmp_path)
            d.wait_state(job, "SUCCEEDED")
            tasks = d.tasks(job)
            assert {t["host"] for t in tasks} == {"local-0", "local-1"}
            for t in tasks:
                assert t["ports"] and not set(t["ports"]) & {base, base + 1000}, t
                assert d.cli("task", "logs", job, str(t["instance"])).stdout.strip() == "bound"
                assert t["attempt"] == 1  # a refused launch uses up no attempt
            assert "held by another socket on this machine" in d.log()
    finally:
        for s in holders:
            s.close()


def test_distinct_gpus_per_member_on_each_host(shared_daemon: Daemon, tmp_path: Path) -> None:
    job = shared_daemon.create("""
name: gpus
instances: 4
task:
  command: echo "gpus=[$CUDA_VISIBLE_DEVICES]"
  resources: {cpu: 0.5, mem: 64Mi, gpu: 1}
""", tmp_path)
    shared_daemon.wait_state(job, "SUCCEEDED")
    tasks = shared_daemon.tasks(job)
    by_host: dict[str, list[str]] = {}
    for t in tasks:
        out = shared_daemon.cli("task", "logs", job, str(t["instance"])).stdout.strip()
        assert out == f"gpus=[{t['gpus'][0]}]", (out, t)
        by_host.setdefault(t["host"], []).append(out)
    assert sum(len(v) for v in by_host.values()) == 4
    for host, gpus in by_host.items():
        assert len(set(gpus)) == len(gpus), f"GPU handed out twice on {host}: {gpus}"


def test_gang_that_does_not_fit_now_stays_pending_and_starts_nothing(shared_daemon: Daemon, tmp_path: Path) -> None:
    # 2 hosts x 4 cpu: a 3-member job of 2 cpu each leaves room for only one more 2-cpu member
    blocker = shared_daemon.create("""
name: blocker
instances: 3
task: {command: sleep 300, resources: {cpu: 2, mem: 64Mi}}
""", tmp_path)
    shared_daemon.wait_state(blocker, "RUNNING")
    big = shared_daemon.create("""
name: big
instances: 2
task: {command: echo ran, resources: {cpu: 2, mem: 64Mi}}
""", tmp_path)
    def pending_reason() -> dict | None:
        x = shared_daemon.job(big)
        return x if "short of" in x["status"]["gangs"][0].get("reason", "") else None

    j = wait_until(pending_reason, 30, 0.3, "a pending reason")
    # how many hosts fit and by how much the nearest other one falls short, not `hosts short of: cpu 1`
    assert re.search(r"placed 1 of 2; 1 of 2 hosts has cpu 2, mem 64Mi free, room for 1 of the 2 members; the best "
                     r"other, local-[01], is short of cpu 2$", j["status"]["gangs"][0]["reason"]), j["status"]
    assert j["status"]["state"] == "PENDING"
    assert {t["state"] for t in j["tasks"]} == {"PENDING"}
    human = shared_daemon.cli("job", "get", big).stdout
    assert "why:" in human and "cpu" in human
    time.sleep(2)  # still nothing started while capacity is short
    assert {t["state"] for t in shared_daemon.tasks(big)} == {"PENDING"}
    shared_daemon.cli("job", "stop", blocker)
    shared_daemon.wait_state(blocker, "KILLED")
    shared_daemon.wait_state(big, "SUCCEEDED")


def test_member_failure_restarts_the_whole_gang(shared_daemon: Daemon, tmp_path: Path) -> None:
    marker = tmp_path / "pids"
    marker.mkdir()
    job = shared_daemon.create(f"""
name: flaky
instances: 3
retry: {{max_attempts: 3}}
task:
  command: >-
    echo $$ > {marker}/$PELOTON_TASK_ID;
    if [ "$PELOTON_ATTEMPT" = 1 ]; then
      if [ "$PELOTON_RANK" = 1 ]; then sleep 1; exit 7; fi; sleep 300;
    fi; echo done
  resources: {{cpu: 0.5, mem: 64Mi}}
""", tmp_path)
    r = shared_daemon.cli("job", "wait", job, "--timeout", "90", check=False, timeout=120)
    assert r.returncode == 0, (r.stderr, shared_daemon.job(job))
    j = shared_daemon.job(job)
    assert j["status"]["gangs"][0]["attempt"] == 2
    assert {t["attempt"] for t in j["tasks"]} == {2}
    # the attempt-1 survivors were killed, not left running
    for inst in (0, 2):
        pid = int((marker / f"{job}-{inst}-1").read_text())
        assert not pid_alive(pid)
    hist = shared_daemon.cli("task", "get", job, "0", "-o", "json").stdout
    assert '"KILLED"' in hist and '"attempt": 2' in hist
    hist1 = shared_daemon.cli("task", "get", job, "1", "-o", "json").stdout
    assert '"exit_code": 7' in hist1


def test_stop_kills_every_member(shared_daemon: Daemon, tmp_path: Path) -> None:
    marker = tmp_path / "pids"
    marker.mkdir()
    job = shared_daemon.create(f"""
name: sleepers
instances: 4
task: {{command: "echo $$ > {marker}/$PELOTON_INSTANCE; sleep 300", resources: {{cpu: 0.5, mem: 64Mi}}}}
""", tmp_path)
    shared_daemon.wait_state(job, "RUNNING")
    wait_until(lambda: len(list(marker.iterdir())) == 4, 20, what="4 pid files")
    pids = [int(p.read_text()) for p in marker.iterdir()]
    assert all(pid_alive(p) for p in pids)
    shared_daemon.cli("job", "stop", job)
    shared_daemon.wait_state(job, "KILLED", timeout=30)
    wait_until(lambda: not any(pid_alive(p) for p in pids), 15, what="members gone")
    assert {t["state"] for t in shared_daemon.tasks(job)} == {"KILLED"}
    # a finished job can be deleted, with its members' sandboxes; a running one cannot
    sandboxes = shared_daemon.data_dir / "local" / "sandboxes"
    assert len(list(sandboxes.glob(f"{job}-*"))) == 4
    shared_daemon.cli("job", "delete", job)
    assert shared_daemon.cli("job", "get", job, check=False).returncode != 0
    # removed by the local backend's sandbox loop, woken by the delete (not in the DeleteJob call)
    wait_until(lambda: list(sandboxes.glob(f"{job}-*")) == [], 15, what="the deleted job's sandboxes removed")


def test_kill9_mid_run_adopts_whole_gang(daemon: Daemon, tmp_path: Path) -> None:
    job = daemon.create("""
name: survivor
instances: 3
task: {command: "sleep 6; echo finished", resources: {cpu: 0.5, mem: 64Mi}}
""", tmp_path)
    daemon.wait_state(job, "RUNNING")
    daemon.kill9()
    time.sleep(1)
    daemon.start()
    j = daemon.wait_state(job, "SUCCEEDED", timeout=60)
    assert {t["attempt"] for t in j["tasks"]} == {1}  # adopted, not restarted
    assert "finished" in daemon.cli("task", "logs", job, "2").stdout


def test_kill9_with_a_member_lost_while_down_restarts_gang_whole(daemon: Daemon, tmp_path: Path) -> None:
    marker = tmp_path / "pids"
    marker.mkdir()
    job = daemon.create(f"""
name: partial
instances: 3
task:
  command: >-
    echo $$ > {marker}/$PELOTON_TASK_ID; if [ "$PELOTON_ATTEMPT" = 1 ]; then sleep 300; fi; echo ok
  resources: {{cpu: 0.5, mem: 64Mi}}
""", tmp_path)
    daemon.wait_state(job, "RUNNING")
    wait_until(lambda: len(list(marker.iterdir())) == 3, 20, what="3 pid files")
    pids = {p.name: int(p.read_text()) for p in marker.iterdir()}
    daemon.kill9()
    # while the daemon is down, one member's whole process group dies
    import os
    import signal
    victim = pids[f"{job}-1-1"]
    os.killpg(os.getpgid(victim), signal.SIGKILL)
    daemon.start()
    j = daemon.wait_state(job, "SUCCEEDED", timeout=60)
    assert j["status"]["gangs"][0]["attempt"] == 2
    # the attempt-1 survivors were killed: never a partial gang
    for name, pid in pids.items():
        if name.endswith("-1"):
            def gone(pid: int = pid) -> bool:
                return not pid_alive(pid)

            wait_until(gone, 15, what=f"{name} gone")


def test_the_cli_uses_the_daemons_unix_socket_by_default(shared_daemon: Daemon, tmp_path: Path) -> None:
    """The daemon serves its API on <data-dir>/peloton.sock too, owner-only; the same user's CLI, given no address,
    finds it through the data dir (the daemon's TCP port here is a random one the CLI could not guess)."""
    import os
    import stat

    from tests.e2e.harness import PELOTON

    sock = shared_daemon.data_dir / "peloton.sock"
    assert stat.S_ISSOCK(sock.stat().st_mode) and stat.S_IMODE(sock.stat().st_mode) == 0o600
    env = {k: v for k, v in os.environ.items() if k not in ("PELOTON_ADDRESS", "PELOTON_CONTEXT")}
    env |= {"PELOTON_DATA_DIR": str(shared_daemon.data_dir), "PELOTON_CONFIG": str(tmp_path / "none.toml")}
    r = subprocess.run([*PELOTON, "host", "list"], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0 and "local-0" in r.stdout, r.stderr


def test_a_secret_comes_from_a_file_the_member_reads(shared_daemon: Daemon, tmp_path: Path) -> None:
    """task.env_files: the member sets the variable from the file when it starts; the spec, the store and the API
    hold only the path."""
    secret = tmp_path / "api-key"
    secret.write_text("hunter2\n")
    job = shared_daemon.create(f"""
name: secret
instances: 2
task:
  command: 'echo "key=$API_KEY"'
  env_files: {{API_KEY: "{secret}"}}
  resources: {{cpu: 1, mem: 64Mi}}
""", tmp_path)
    assert shared_daemon.cli("job", "wait", job, "--timeout", "60", check=False).returncode == 0
    assert shared_daemon.cli("task", "logs", job, "1").stdout == "key=hunter2\n"
    shown = shared_daemon.cli("job", "get", job, "-o", "json").stdout
    assert str(secret) in shown and "hunter2" not in shown
    if shared_daemon.db_url.startswith("sqlite:///"):  # the store holds the path only
        db = Path(shared_daemon.db_url.removeprefix("sqlite:///"))
        assert str(secret).encode() in db.read_bytes() + Path(f"{db}-wal").read_bytes()
        assert b"hunter2" not in db.read_bytes() + Path(f"{db}-wal").read_bytes()
    missing = shared_daemon.create(f"""
name: no-secret
instances: 1
retry: {{max_attempts: 1}}
task: {{command: "echo never", env_files: {{TOKEN: "{tmp_path / 'absent'}"}}, resources: {{cpu: 1, mem: 64Mi}}}}
""", tmp_path)
    assert shared_daemon.cli("job", "wait", missing, "--timeout", "60", check=False).returncode != 0
    assert "peloton: cannot read TOKEN from" in shared_daemon.cli("task", "logs", missing, "0", "--stderr").stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="a daemon switches a task's user only when it runs as root")
def test_members_run_as_the_user_the_job_names(shared_daemon: Daemon, tmp_path: Path) -> None:
    """task.user through the CLI and the daemon: the members run as that user (its uid, groups and home), the
    job's `peloton task logs` still read their output."""
    let_others_pass(shared_daemon.data_dir)  # the members enter their sandboxes as nobody
    job = shared_daemon.create("""
name: as-nobody
instances: 2
task:
  user: nobody
  command: 'echo "$(id -un) $HOME"; test -w . && echo writable'
  resources: {cpu: 1, mem: 64Mi}
""", tmp_path)
    assert shared_daemon.cli("job", "wait", job, "--timeout", "60", check=False).returncode == 0
    home = pwd.getpwnam("nobody").pw_dir
    for i in ("0", "1"):
        assert shared_daemon.cli("task", "logs", job, i).stdout == f"nobody {home}\nwritable\n"
    assert json.loads(shared_daemon.cli("job", "get", job, "-o", "json").stdout)["spec"]["task"]["user"] == "nobody"


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)  # the gang policy's rule: one store
def test_a_gang_past_its_max_runtime_is_killed_whole_and_the_job_says_why(daemon: Daemon, tmp_path: Path) -> None:
    job = daemon.create("""
name: too-long
instances: 2
sla: {max_runtime: 2s}
task: {command: 'sleep 120', resources: {cpu: 1, mem: 64Mi}}
""", tmp_path)
    daemon.wait_state(job, "RUNNING")
    j = daemon.wait_state(job, "FAILED", timeout=30)  # the reconciler looks every 5 s (the command runs 120 s)
    assert "sla.max_runtime exceeded" in j["status"]["reason"], j["status"]
    assert {t["state"] for t in daemon.tasks(job)} == {"KILLED"}


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # the gang policy's rule: one store
def test_a_job_whose_last_attempt_failed_is_failing_while_torn_down_never_pending(daemon: Daemon,
                                                                                 tmp_path: Path) -> None:
    """`job wait` prints each state: the restart is PENDING (its next attempt is queued), the last failure FAILING
    while the survivor is killed (it ignores SIGTERM, so that lasts until the SIGKILL 5 s later), then FAILED."""
    marks = tmp_path / "marks"
    marks.mkdir()
    job = daemon.create(f"""
name: fails-twice
instances: 2
retry: {{max_attempts: 2}}
task:
  command: >-
    if [ "$PELOTON_RANK" = 0 ]; then trap '' TERM; touch {marks}/$PELOTON_ATTEMPT; sleep 300; fi;
    while [ ! -e {marks}/$PELOTON_ATTEMPT ]; do sleep 0.1; done; sleep 1; exit 3
  resources: {{cpu: 0.5, mem: 64Mi}}
""", tmp_path)
    r = daemon.cli("job", "wait", job, "--timeout", "120", check=False, timeout=150)
    assert r.returncode == 1, r.stderr
    lines = [line.removeprefix(f"{job}: ") for line in r.stderr.strip().splitlines()]
    states, reason = lines[:-1], lines[-1]
    if states[0] == "PENDING":  # the first view of the watch came before the first attempt ran
        states = states[1:]
    assert states == ["RUNNING", "PENDING", "RUNNING", "FAILING", "FAILED"], r.stderr
    assert reason == "gang 0 failed on attempt 2 of 2: member 1 FAILED: exit code 3", r.stderr
    assert daemon.cli("job", "list", "--state", "failed").stdout.count(job) == 1
