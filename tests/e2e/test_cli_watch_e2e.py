"""End to end: the commands that follow something through the daemon's watch stream (`job wait`, `job get
--watch`, `task logs -f`), against the real daemon, across a kill -9 and restart of it; and the exits of the CLI
(codes, Ctrl-C, a closed pipe; lists)."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.e2e.harness import Daemon, wait_until

pytestmark = pytest.mark.e2e
sqlite_only = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


def finish(p: subprocess.Popen[str], timeout: float = 90) -> tuple[int, str, str]:
    out, err = p.communicate(timeout=timeout)
    return p.returncode, out, err


@sqlite_only
def test_job_wait_exit_codes(daemon: Daemon, tmp_path: Path) -> None:
    ok = daemon.create("name: ok\ninstances: 2\ntask: {command: 'sleep 1; echo ok', resources: {cpu: 0.5, mem: 64Mi}}\n",
                       tmp_path)
    bad = daemon.create("name: bad\ninstances: 1\nretry: {max_attempts: 1}\n"
                        "task: {command: 'sleep 1; exit 3', resources: {cpu: 0.5, mem: 64Mi}}\n", tmp_path)
    slow = daemon.create("name: slow\ninstances: 1\ntask: {command: 'sleep 300', resources: {cpu: 0.5, mem: 64Mi}}\n",
                         tmp_path)
    waits = {job: daemon.popen("job", "wait", job, "--timeout", t) for job, t in ((ok, "60"), (bad, "60"),
                                                                                 (slow, "3"))}
    code, out, err = finish(waits[ok])
    assert (code, out) == (0, ""), err
    assert f"{ok}: SUCCEEDED" in err.splitlines()
    code, out, err = finish(waits[bad])
    assert code == 1, err
    assert f"{bad}: FAILED" in err and "exit code 3" in err
    code, out, err = finish(waits[slow])
    assert code == 124, err
    assert f"timed out after 3s waiting for job {slow} (state RUNNING)" in err
    # an ended job answers at once; an unknown one is an error
    assert daemon.cli("job", "wait", ok).returncode == 0
    r = daemon.cli("job", "wait", "0123456789ab", check=False)
    assert r.returncode == 1 and "not found" in r.stderr
    # Ctrl-C: exit 130, quietly
    followers = [daemon.popen(*args, ctrl_c=True) for args in (("job", "wait", slow), ("job", "get", slow, "--watch"),
                                                              ("task", "logs", slow, "0", "-f"))]
    time.sleep(2)
    for p in followers:
        p.send_signal(signal.SIGINT)
    for p in followers:
        code, _, err = finish(p, 30)
        assert code == 130 and "Traceback" not in err and "KeyboardInterrupt" not in err, (p.args, err)
    daemon.cli("job", "stop", slow)
    # every page in one document; --limit 0: every job
    assert {j["id"] for j in json.loads(daemon.cli("job", "list", "--limit", "0", "-o", "json").stdout)["jobs"]} \
        == {ok, bad, slow}
    assert len(json.loads(daemon.cli("job", "list", "--limit", "2", "-o", "json").stdout)["jobs"]) == 2
    assert daemon.cli("job", "list", "--limit", "-1", check=False).returncode == 2

    # a reader that goes away: no traceback, the exit status of a process ended by SIGPIPE
    for args in (["job", "get", ok], ["job", "list", "-o", "json"], ["task", "logs", ok, "0", "-f"]):
        p = daemon.popen(*args)
        assert p.stdout is not None
        p.stdout.close()  # before it writes
        _, err = p.communicate(timeout=60)
        assert p.returncode == 141 and "Traceback" not in err and "Exception" not in err, (args, err)


@sqlite_only
def test_job_get_watch_shows_the_job_until_it_ends(daemon: Daemon, tmp_path: Path) -> None:
    job = daemon.create("name: w\ninstances: 2\ntask: {command: 'sleep 2; echo ok', resources: {cpu: 0.5, mem: 64Mi}}\n",
                        tmp_path)
    text = daemon.popen("job", "get", job, "--watch")
    as_json = daemon.popen("job", "get", job, "--watch", "-o", "json")
    code, out, err = finish(text)
    assert code == 0, err
    views = out.split("\n\n")  # not a terminal: each view appended after a blank line
    assert len(views) >= 2, out
    assert all(v.startswith(f"Job:       {job}  w\n") for v in views)
    assert "State:     SUCCEEDED" in views[-1] and "State:     SUCCEEDED" not in views[0]
    assert views[-1].count("SUCCEEDED  local-") == 2 and "gang 0 (instances 0-1): DONE" in views[-1]
    assert len(set(views)) == len(views)  # a view is printed again only when something in it changed
    code, out, err = finish(as_json)
    assert code == 0, err
    docs = [json.loads(line) for line in out.splitlines()]  # one document a line
    assert docs[-1]["status"]["state"] == "SUCCEEDED" and len(docs[-1]["tasks"]) == 2
    # an ended job: one view, at once
    r = daemon.cli("job", "get", job, "--watch", timeout=30)
    assert r.stdout.count("Job:") == 1


@sqlite_only
def test_task_logs_follow_prints_output_as_it_appears(daemon: Daemon, tmp_path: Path) -> None:
    job = daemon.create("name: talk\ninstances: 1\ntask:\n  command: "
                        "'for i in 1 2 3; do echo line$i; echo err$i >&2; sleep 2; done'\n"
                        "  resources: {cpu: 0.5, mem: 64Mi}\n", tmp_path)
    out = daemon.popen("task", "logs", job, "0", "-f")  # at once: it waits for the launch
    err = daemon.popen("task", "logs", job, "0", "--follow", "--stderr")
    arrived: list[tuple[float, str]] = []

    def read() -> None:
        assert out.stdout is not None
        for line in out.stdout:
            arrived.append((time.monotonic(), line.rstrip("\n")))

    reader = threading.Thread(target=read)
    reader.start()
    reader.join(60)
    assert out.wait(10) == 0, out.stderr.read() if out.stderr else ""
    ended = time.monotonic()
    assert [line for _, line in arrived] == ["line1", "line2", "line3"]
    assert arrived[2][0] - arrived[0][0] >= 1.0  # printed as the task wrote them, not all at the end
    assert ended - arrived[2][0] < 10  # and it stopped once the task ended
    code, stderr_out, _ = finish(err)
    assert (code, stderr_out) == (0, "err1\nerr2\nerr3\n")
    daemon.wait_state(job, "SUCCEEDED")
    # an attempt that has ended: its log, and done
    r = daemon.cli("task", "logs", job, "0", "-f", "--attempt", "1", timeout=30)
    assert r.stdout == "line1\nline2\nline3\n"
    # an attempt past the last: said so, with how many there were (not "has not been launched")
    r = daemon.cli("task", "logs", job, "0", "--attempt", "5", check=False)
    assert (r.returncode, r.stderr.strip()) == (1, f"peloton: error: task {job}-0 has no attempt 5 (attempts so far: 1)")


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # the CLI's reconnects, not the store's: one store
def test_followers_survive_a_daemon_restart(daemon: Daemon, tmp_path: Path) -> None:
    """kill -9 of the daemon and a restart on the same address: `job wait` still answers with the job's real
    outcome, `job get --watch` and `task logs -f` carry on to the end."""
    good = daemon.create("name: good\ninstances: 2\n"
                         "task: {command: 'echo start; sleep 10; echo done', resources: {cpu: 0.5, mem: 64Mi}}\n", tmp_path)
    bad = daemon.create("name: bad\ninstances: 1\nretry: {max_attempts: 1}\n"
                        "task: {command: 'sleep 10; exit 3', resources: {cpu: 0.5, mem: 64Mi}}\n", tmp_path)
    daemon.wait_state(good, "RUNNING")
    daemon.wait_state(bad, "RUNNING")
    wait_good = daemon.popen("job", "wait", good, "--timeout", "120")
    wait_bad = daemon.popen("job", "wait", bad, "--timeout", "120")
    watch = daemon.popen("job", "get", good, "--watch")
    follow = daemon.popen("task", "logs", good, "1", "-f")
    time.sleep(3)  # they are all following
    assert all(p.poll() is None for p in (wait_good, wait_bad, watch, follow))
    daemon.kill9()
    time.sleep(2)  # down for a while: they retry
    daemon.start(same_address=True)
    code, out, err = finish(wait_good, 120)
    assert code == 0, (err, daemon.job(good))
    assert "retrying for up to 60s" in err and "reconnected to the daemon" in err
    assert err.splitlines()[-1] == f"{good}: SUCCEEDED"
    code, out, err = finish(wait_bad, 120)
    assert code == 1, (err, daemon.job(bad))
    assert f"{bad}: FAILED" in err and "exit code 3" in err
    code, out, err = finish(watch, 60)
    assert code == 0, err
    assert "State:     SUCCEEDED" in out.split("\n\n")[-1]
    code, out, err = finish(follow, 60)
    assert (code, out) == (0, "start\ndone\n"), err
    wait_until(lambda: daemon.state(good) == "SUCCEEDED", 10)


@sqlite_only
def test_job_wait_gives_up_on_a_daemon_that_stays_away(daemon: Daemon, tmp_path: Path) -> None:
    job = daemon.create("name: s\ninstances: 1\ntask: {command: 'sleep 300', resources: {cpu: 0.5, mem: 64Mi}}\n",
                        tmp_path)
    daemon.wait_state(job, "RUNNING")
    p = daemon.popen("job", "wait", job, "--reconnect-grace", "3", "-o", "json")
    time.sleep(1)
    started = time.monotonic()
    daemon.stop()
    code, out, err = finish(p, 60)
    assert code == 69, err
    assert time.monotonic() - started >= 3  # not before the grace (the daemon never comes back: finish bounds it)
    assert "gave up after 3s without the peloton daemon" in err.splitlines()[-1]
    assert f"{job}: FAILED" not in err
    # -o json: the document all the same, with the states seen and that it gave up
    doc = json.loads(out)
    assert (doc["state"], doc["states"], doc["unreachable"], doc["timed_out"], doc["succeeded"]) == (
        "RUNNING", ["RUNNING"], True, False, False), out


@sqlite_only
def test_task_logs_follow_ends_with_its_attempt_on_a_gang_restart(daemon: Daemon, tmp_path: Path) -> None:
    """`task logs -f` on a member whose peer fails: the gang restarts, and the follower prints its attempt's log and
    exits 0 once that attempt is torn down (it does not hang, nor print the next attempt's lines). `job logs -f`
    prints every attempt of every member, the failed member's last line before its next attempt's."""
    job = daemon.create("name: flaky\ninstances: 2\nretry: {max_attempts: 2}\ntask:\n  command: >-\n"
                        "    echo a$PELOTON_ATTEMPT; if [ \"$PELOTON_ATTEMPT\" = 1 ]; then\n"
                        "      if [ \"$PELOTON_RANK\" = 1 ]; then sleep 4; echo dying; exit 7; fi; sleep 300; fi; echo end\n"
                        "  resources: {cpu: 0.5, mem: 64Mi}\n", tmp_path)
    follow = daemon.popen("task", "logs", job, "0", "-f")
    every = daemon.popen("job", "logs", job, "-f")  # every member, every attempt: the first to its end, then the next
    code, out, err = finish(follow, 90)
    assert (code, out) == (0, "a1\n"), err
    code, out, err = finish(every, 90)
    assert code == 0, err
    lines = out.splitlines()
    assert sorted(lines) == ["[0] a1", "[0] a2", "[0] end", "[1] a1", "[1] a2", "[1] dying", "[1] end"], out
    assert lines.index("[1] dying") < lines.index("[1] a2") and "[1] attempt 2" in err, (out, err)
    daemon.wait_state(job, "SUCCEEDED")
    r = daemon.cli("task", "logs", job, "0", "-f", timeout=30)
    assert r.stdout == "a2\nend\n"


def test_followers_carry_on_to_a_standby_that_takes_over(daemon: Daemon, db_url: str, tmp_path: Path) -> None:
    """kill -9 of the leader while `job wait` and `job get --watch` follow (given the leader's and the standby's
    addresses): the standby takes over, adopts the tasks, and the followers, resuming a stream of another daemon,
    get the jobs' state from it and answer with their real outcome (a job that ended while no daemon acted too)."""
    from tests.e2e.harness import PELOTON

    standby = Daemon(daemon.data_dir, db_url, port_base=daemon.port_base)  # same machine, data dir and flags
    try:
        standby.start(standby=True)
        good = daemon.create("name: good\ninstances: 2\n"
                             "task: {command: 'sleep 6; echo done', resources: {cpu: 0.5, mem: 64Mi}}\n", tmp_path)
        bad = daemon.create("name: bad\ninstances: 1\nretry: {max_attempts: 1}\n"
                            "task: {command: 'sleep 6; exit 3', resources: {cpu: 0.5, mem: 64Mi}}\n", tmp_path)
        daemon.wait_state(good, "RUNNING")
        daemon.wait_state(bad, "RUNNING")
        both = f"{daemon.address},{standby.address}"

        def follow(*args: str) -> subprocess.Popen[str]:
            return subprocess.Popen([*PELOTON, "--address", both, *args], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)

        wait_good = follow("job", "wait", good, "--timeout", "150")
        wait_bad = follow("job", "wait", bad, "--timeout", "150")
        watch = follow("job", "get", good, "--watch", "-o", "json")
        time.sleep(2)  # they are all following
        assert all(p.poll() is None for p in (wait_good, wait_bad, watch))
        daemon.kill9()
        standby.wait_serving(90)
        code, out, err = finish(wait_good, 150)
        assert code == 0, (err, standby.job(good))
        assert err.splitlines()[-1] == f"{good}: SUCCEEDED", err
        code, out, err = finish(wait_bad, 150)
        assert code == 1, (err, standby.job(bad))
        assert f"{bad}: FAILED" in err and "exit code 3" in err, err
        code, out, err = finish(watch, 60)
        assert code == 0, err
        assert json.loads(out.splitlines()[-1])["status"]["state"] == "SUCCEEDED", out
    finally:
        standby.stop()


@sqlite_only
def test_task_logs_follow_waiting_for_a_start_rides_out_each_restart(daemon: Daemon, tmp_path: Path) -> None:
    """`task logs -f` of a task that waits for room, begun while the daemon was down: it reaches the daemon and
    waits; a restart long after is a new absence, given the whole grace period again (not counted from the first
    one, which the daemon's answers since ended), and the log is printed once the task runs."""
    blocker = daemon.create("name: blocker\ninstances: 2\n"
                            "task: {command: 'sleep 600', resources: {cpu: 4, mem: 64Mi}}\n", tmp_path)
    daemon.wait_state(blocker, "RUNNING")
    job = daemon.create("name: later\ninstances: 1\ntask: {command: 'echo hello', resources: {cpu: 1, mem: 64Mi}}\n",
                        tmp_path)
    daemon.wait_state(job, "PENDING")
    daemon.kill9()
    follow = daemon.popen("task", "logs", job, "0", "-f", "--reconnect-grace", "8")
    time.sleep(1)  # it retries
    daemon.start(same_address=True)
    time.sleep(10)  # it waits for the start, the daemon answering, past the grace since the first absence
    daemon.kill9()
    daemon.start(same_address=True)
    daemon.cli("job", "stop", blocker)
    code, out, err = finish(follow, 90)
    assert (code, out) == (0, "hello\n"), err
    assert err.count("reconnected to the daemon") == 2, err


@sqlite_only
def test_job_wait_counts_the_grace_from_the_last_word_of_a_daemon_gone_silent(daemon: Daemon, tmp_path: Path) -> None:
    """A daemon that stops answering without closing its socket (SIGSTOP: a hung host) is noticed once its stream is
    silent for 20 s; the grace counts from its last word, so with a grace shorter than that `job wait` gives up
    then, rather than try again for the whole grace after it."""
    job = daemon.create("name: s\ninstances: 1\ntask: {command: 'sleep 300', resources: {cpu: 0.5, mem: 64Mi}}\n",
                        tmp_path)
    daemon.wait_state(job, "RUNNING")
    p = daemon.popen("job", "wait", job, "--reconnect-grace", "5")
    time.sleep(2)  # it follows
    assert daemon.proc is not None
    daemon.proc.send_signal(signal.SIGSTOP)
    try:
        code, out, err = finish(p, 90)
    finally:
        daemon.proc.send_signal(signal.SIGCONT)
    assert code == 69, err
    assert "gave up after 5s without the peloton daemon" in err and "no word from the daemon" in err, err
    assert "retrying for up to" not in err, err  # not tried again: the grace was over when the silence was noticed


def test_watch_jobs_resumes_only_what_its_own_history_holds(daemon: Daemon, tmp_path: Path) -> None:
    """The WatchJobs API as docs/running.md has it, against the real daemon on both stores: a resume after a
    revision of this daemon's stream gets exactly what was missed; one naming another daemon's stream, a revision
    past the newest, or (after a restart) the stream of the daemon before gets a snapshot of the watched jobs, or,
    watching every job, a `resync` notice."""
    import grpc

    from peloton.api.v1 import job_pb2, job_pb2_grpc

    def first(req: job_pb2.WatchJobsRequest) -> job_pb2.WatchJobsResponse:
        with grpc.insecure_channel(daemon.address) as ch:
            call = job_pb2_grpc.JobServiceStub(ch).WatchJobs(req, timeout=30)
            r = next(iter(call))
            call.cancel()
            return r

    def states(r: job_pb2.WatchJobsResponse) -> list[tuple[str, str]]:
        return [(c.job_id, c.state) for c in r.changes]

    job = daemon.create("name: w\ninstances: 1\ntask: {command: 'sleep 2', resources: {cpu: 0.5, mem: 64Mi}}\n",
                        tmp_path)
    start = first(job_pb2.WatchJobsRequest(job_ids=[job]))
    assert start.snapshot and start.stream_id and states(start) == [(job, start.changes[0].state)]
    daemon.wait_state(job, "SUCCEEDED")
    missed = first(job_pb2.WatchJobsRequest(job_ids=[job], stream_id=start.stream_id,
                                            after_revision=start.revision))
    assert not missed.snapshot and missed.stream_id == start.stream_id and missed.revision > start.revision
    assert states(missed)[-1] == (job, "SUCCEEDED")
    for stream_id, after in (("f" * 32, start.revision), (start.stream_id, missed.revision + 1000)):
        r = first(job_pb2.WatchJobsRequest(job_ids=[job], stream_id=stream_id, after_revision=after))
        assert r.snapshot and states(r) == [(job, "SUCCEEDED")], (stream_id, after, r)
        r = first(job_pb2.WatchJobsRequest(stream_id=stream_id, after_revision=after))
        assert r.resync and not r.changes and r.stream_id == start.stream_id, (stream_id, after, r)
    daemon.kill9()
    daemon.start(same_address=True)
    r = first(job_pb2.WatchJobsRequest(job_ids=[job], stream_id=start.stream_id, after_revision=start.revision))
    assert r.snapshot and r.stream_id != start.stream_id and states(r) == [(job, "SUCCEEDED")], r
    r = first(job_pb2.WatchJobsRequest(stream_id=start.stream_id, after_revision=start.revision))
    assert r.resync and r.stream_id != start.stream_id, r
