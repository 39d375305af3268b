"""The CLI without a daemon: the reconnect/back-off policy and the resumed watch (fake streams, fake clock),
following a log (fake reads), what start-up imports, the command table."""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import threading
from collections.abc import Generator, Iterator
from typing import Any

import grpc
import pytest

from peloton.api.v1 import job_pb2, task_pb2
from peloton.cli import reconnect as rc
from peloton.cli.reconnect import DaemonUnreachable, Reconnect, WatchTimeout, watch_jobs
from peloton.cli.tasks import follow_log
from peloton.cli.transport import RpcError, StatusCode, UnaryStream, UnaryUnary
from peloton.errors import FailedPrecondition, InvalidArgument, NotFound, Unavailable


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        assert s >= 0
        self.sleeps.append(round(s, 6))
        self.now += s


def reconnect(clock: FakeClock, grace: float = 60.0, deadline: float | None = None,
              notes: list[str] | None = None) -> Reconnect:
    return Reconnect("d:1", grace, deadline, notify=(notes.append if notes is not None else None), clock=clock,
                     sleep=clock.sleep, rand=lambda: 1.0)


class FakeCall:
    """A server-streaming call: its responses, then (optionally) an error."""

    def __init__(self, responses: list[job_pb2.WatchJobsResponse], error: Exception | None = None) -> None:
        self.responses, self.error, self.cancelled = responses, error, False

    def __iter__(self) -> Iterator[job_pb2.WatchJobsResponse]:
        yield from self.responses
        if self.error is not None:
            raise self.error

    def cancel(self) -> bool:
        self.cancelled = True
        return True


class FakeDaemon:
    """Hands out the prepared calls in order, recording each request and its timeout."""

    def __init__(self, *calls: FakeCall | Exception) -> None:
        self.calls = list(calls)
        self.requests: list[tuple[str, int, float | None]] = []

    def __call__(self, req: job_pb2.WatchJobsRequest, timeout: float | None) -> FakeCall:
        self.requests.append((req.stream_id, req.after_revision, timeout))
        assert list(req.job_ids) == ["j1"]
        nxt = self.calls.pop(0)
        return FakeCall([], nxt) if isinstance(nxt, Exception) else nxt


def resp(stream: str, rev: int, state: str = "", snapshot: bool = False) -> job_pb2.WatchJobsResponse:
    r = job_pb2.WatchJobsResponse(stream_id=stream, revision=rev, snapshot=snapshot)
    if state:
        r.changes.add(job_id="j1", state=state)
    return r


UNAVAILABLE = RpcError(StatusCode.UNAVAILABLE, "Socket closed")


# --- Reconnect: back-off and grace ------------------------------------------------------------------------------
def test_backoff_doubles_up_to_its_cap_and_a_success_resets_it() -> None:
    clock = FakeClock()
    r = reconnect(clock)
    for _ in range(7):
        r.failed("down")
    assert clock.sleeps == [0.25, 0.5, 1.0, 2.0, 4.0, 5.0, 5.0]
    r.ok()
    r.failed("down")
    assert clock.sleeps[-1] == 0.25


def test_gives_up_only_after_the_grace_period_without_a_success() -> None:
    clock = FakeClock()
    notes: list[str] = []
    r = reconnect(clock, grace=10.0, notes=notes)
    for _ in range(5):  # 0.25 + 0.5 + 1 + 2 + 4 = 7.75 s
        r.failed("the daemon at d:1 is away")
    r.ok()  # it answered: the grace period starts again at the next failure
    assert notes == ["the daemon at d:1 is away; retrying for up to 10s", "reconnected to the daemon at d:1"]
    start = clock.now
    with pytest.raises(DaemonUnreachable, match="gave up after 10s without the peloton daemon at d:1"):
        while True:
            r.failed("the daemon at d:1 is away")
    assert clock.now - start == pytest.approx(10.0)  # the last pause is cut to end exactly at the grace period


def test_never_sleeps_past_the_callers_deadline() -> None:
    clock = FakeClock()
    r = reconnect(clock, deadline=clock.now + 0.6)
    r.failed("x")
    r.failed("x")
    r.failed("x")
    assert clock.sleeps == [0.25, 0.35, 0.0]


def test_jitter_spreads_the_pause() -> None:
    clock = FakeClock()
    r = Reconnect("d:1", notify=None, clock=clock, sleep=clock.sleep, rand=random.Random(3).random)
    for _ in range(20):
        r.failed("x")
        r.ok()
    assert all(0.125 <= s <= 0.25 for s in clock.sleeps) and len(set(clock.sleeps)) > 10
    # the system's random source when none is given
    r = Reconnect("d:1", notify=None, clock=clock, sleep=clock.sleep)
    r.failed("x")
    assert 0.125 <= clock.sleeps[-1] <= 0.25


# --- watch_jobs: resume, snapshot, errors ------------------------------------------------------------------------
def test_a_broken_stream_is_resumed_after_the_last_revision_received() -> None:
    clock = FakeClock()
    daemon = FakeDaemon(
        FakeCall([resp("s1", 5, "PENDING", snapshot=True), resp("s1", 7, "RUNNING"), resp("s1", 9)], UNAVAILABLE),
        UNAVAILABLE,  # the daemon is restarting
        FakeCall([resp("s2", 0, "SUCCEEDED", snapshot=True)]),  # a new daemon: a snapshot, not the history
    )
    it = watch_jobs(daemon, ["j1"], False, reconnect(clock), clock=clock, silence_s=None)
    states = [(r.changes[0].state if r.changes else "", r.snapshot) for r in (next(it) for _ in range(4))]
    assert states == [("PENDING", True), ("RUNNING", False), ("", False), ("SUCCEEDED", True)]
    # the first stream from scratch; then resumed after revision 9 (a heartbeat's revision counts too)
    assert [(s, rev) for s, rev, _ in daemon.requests] == [("", 0), ("s1", 9), ("s1", 9)]
    assert clock.sleeps == [0.25, 0.5]


def test_a_stream_the_daemon_ends_is_opened_again() -> None:
    clock = FakeClock()
    daemon = FakeDaemon(FakeCall([resp("s1", 3, "RUNNING", snapshot=True)]), FakeCall([resp("s1", 4, "FAILED")]))
    it = watch_jobs(daemon, ["j1"], False, reconnect(clock), clock=clock, silence_s=None)
    assert [r.changes[0].state for r in (next(it), next(it))] == ["RUNNING", "FAILED"]
    assert daemon.requests[1][:2] == ("s1", 3)


def test_unreachable_for_the_grace_period_raises_daemon_unreachable() -> None:
    clock = FakeClock()
    daemon = FakeDaemon(*[UNAVAILABLE] * 100)
    with pytest.raises(DaemonUnreachable, match="d:1"):
        list(watch_jobs(daemon, ["j1"], False, reconnect(clock, grace=20.0), clock=clock, silence_s=None))
    assert 20.0 <= sum(clock.sleeps) <= 20.0 + 1e-6
    assert 6 <= len(daemon.requests) <= 10  # backed off, not a busy loop


def test_a_refused_request_is_not_retried() -> None:
    clock = FakeClock()
    daemon = FakeDaemon(RpcError(StatusCode.INVALID_ARGUMENT, "job_ids: at most 1000 jobs per watch"))
    with pytest.raises(InvalidArgument, match="at most 1000"):
        list(watch_jobs(daemon, ["j1"], False, reconnect(clock), clock=clock, silence_s=None,
                        error=lambda e: InvalidArgument(e.details())))
    assert len(daemon.requests) == 1


def test_the_deadline_bounds_each_stream_and_ends_the_watch() -> None:
    clock = FakeClock()
    deadline = clock.now + 1.0
    expired = RpcError(StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")

    class Expiring(FakeCall):
        def __iter__(self) -> Iterator[job_pb2.WatchJobsResponse]:
            yield resp("s1", 1, "RUNNING", snapshot=True)
            clock.now = deadline  # the call's deadline
            raise expired

    daemon = FakeDaemon(UNAVAILABLE, Expiring([]))
    seen = []
    with pytest.raises(WatchTimeout):
        for r in watch_jobs(daemon, ["j1"], False, reconnect(clock, deadline=deadline), deadline, clock=clock,
                            silence_s=None):
            seen.append(r.changes[0].state)
    assert seen == ["RUNNING"]
    assert [t for _, _, t in daemon.requests] == [pytest.approx(1.0), pytest.approx(0.75)]


def test_a_silent_stream_is_cancelled_and_opened_again() -> None:
    class Silent(FakeCall):
        """Says nothing until cancelled, like a connection that died without a reset."""

        def __init__(self) -> None:
            super().__init__([])
            self.gone = threading.Event()

        def __iter__(self) -> Iterator[job_pb2.WatchJobsResponse]:
            yield resp("s1", 2, "RUNNING", snapshot=True)
            assert self.gone.wait(10)
            raise RpcError(StatusCode.CANCELLED, "Locally cancelled")

        def cancel(self) -> bool:
            self.gone.set()
            return True

    silent = Silent()
    daemon = FakeDaemon(silent, FakeCall([resp("s1", 3, "SUCCEEDED")]))
    notes: list[str] = []
    r = Reconnect("d:1", notify=notes.append, sleep=lambda s: None)
    it = watch_jobs(daemon, ["j1"], False, r, silence_s=0.3)
    assert next(it).changes[0].state == "RUNNING"
    assert next(it).changes[0].state == "SUCCEEDED"
    assert silent.gone.is_set() and daemon.requests[1][:2] == ("s1", 2)
    assert "no word from the daemon at d:1 for 0.3s" in notes[0]


def test_closing_the_watch_cancels_the_call() -> None:
    clock = FakeClock()
    call = FakeCall([resp("s1", 1, "RUNNING", snapshot=True), resp("s1", 2, "SUCCEEDED")])
    it = watch_jobs(FakeDaemon(call), ["j1"], False, reconnect(clock), clock=clock, silence_s=None)
    next(it)
    assert isinstance(it, Generator)  # (so it can be closed)
    it.close()
    assert call.cancelled


# --- task logs -f --------------------------------------------------------------------------------------------------
class FakeLogs:
    """GetTaskLogs of a task whose log grows by the given chunks, one per read, in the given states."""

    def __init__(self, script: list[tuple[bytes | Exception, str]], attempt: int = 2) -> None:
        self.script = script
        self.data = b""
        self.attempt = attempt
        self.requests: list[tuple[int, int | None]] = []

    def __call__(self, req: task_pb2.GetTaskLogsRequest) -> task_pb2.GetTaskLogsResponse:
        self.requests.append((req.attempt, req.offset if req.HasField("offset") else None))
        chunk, state = self.script.pop(0) if self.script else (b"", "SUCCEEDED")
        if isinstance(chunk, Exception):
            raise chunk
        self.data += chunk
        start = req.offset if req.HasField("offset") else max(0, len(self.data) - (req.tail_bytes or 1 << 20))
        return task_pb2.GetTaskLogsResponse(task_id=f"j1-0-{self.attempt}", content=self.data[start:],
                                            next_offset=len(self.data), task_state=state)


def _follow(logs: FakeLogs, task_state: str = "RUNNING", attempt: int = 0) -> tuple[bytes, list[float]]:
    out: list[bytes] = []
    sleeps: list[float] = []
    clock = FakeClock()
    follow_log(logs, task_pb2.GetTaskLogsRequest(job_id="j1", instance=0, attempt=attempt, stream="stdout"),
               reconnect(clock), lambda: task_pb2.TaskInfo(task_id="j1-0-2", attempt=2, state=task_state),
               write=out.append, sleep=sleeps.append)
    return b"".join(out), sleeps


def test_follow_prints_what_is_appended_until_the_attempt_ends() -> None:
    logs = FakeLogs([(b"a\n", "RUNNING"), (b"", "RUNNING"), (b"b\n", "RUNNING"), (b"c\n", "SUCCEEDED"),
                     (b"", "SUCCEEDED")])
    out, sleeps = _follow(logs)
    assert out == b"a\nb\nc\n"
    # the first read is the tail; then from the offset reached, pinned to the attempt the first read named
    assert logs.requests == [(0, None), (2, 2), (2, 2), (2, 4), (2, 6)]
    assert sleeps == [0.5]  # only after a read that found nothing new


def test_follow_of_an_ended_attempt_prints_the_log_once() -> None:
    logs = FakeLogs([(b"all\n", "FAILED")])
    assert _follow(logs) == (b"all\n", [])
    assert len(logs.requests) == 1


def test_follow_waits_for_the_launch_and_rides_out_a_restart() -> None:
    logs = FakeLogs([(FailedPrecondition("attempt 2 of task j1-0 was never launched; no logs"), ""),
                     (NotFound("no sandbox for task 'j1-0-2'"), ""),
                     (b"x\n", "RUNNING"), (Unavailable("daemon restarting"), ""), (Unavailable("still"), ""),
                     (b"y\n", "SUCCEEDED")])
    out, _ = _follow(logs, task_state="LAUNCHING")
    assert out == b"x\ny\n"


def test_follow_of_a_task_that_will_not_start_is_an_error() -> None:
    logs = FakeLogs([(FailedPrecondition("attempt 1 of task j1-0 was never launched; no logs"), "")])
    with pytest.raises(FailedPrecondition, match="never launched"):
        _follow(logs, task_state="KILLED")
    logs = FakeLogs([(FailedPrecondition("attempt 1 of task j1-0 was never launched; no logs"), "")])
    with pytest.raises(FailedPrecondition):
        _follow(logs, task_state="PENDING", attempt=1)  # an older attempt than the current one: never


# --- main: imports, dispatch, closed pipe ------------------------------------------------------------------------
HEAVY = ("grpc", "google", "yaml", "sqlalchemy", "peloton.api", "peloton.domain", "prometheus_client", "logging",
         "json", "typing")


def test_parsing_the_arguments_imports_nothing_heavy() -> None:
    code = ("import sys; before = set(sys.modules); import peloton.cli.main as m; "
            "m.build_parser().parse_args(['job', 'get', 'x', '--watch']); "
            f"print(sorted(n for n in set(sys.modules) - before if n.startswith({HEAVY!r})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_every_command_names_a_function_that_exists() -> None:
    from peloton.cli.main import _command, build_parser

    def walk(p: argparse.ArgumentParser) -> Iterator[Any]:
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    yield from walk(sub)
        if "fn" in p._defaults:
            yield p._defaults["fn"]

    fns = list(walk(build_parser()))
    assert len(fns) >= 16
    assert all(callable(_command(f)) for f in fns)


def test_retry_codes_are_grpc_codes() -> None:
    assert rc.RETRY_CODES.issubset(c.name for c in grpc.StatusCode)


def test_no_client_command_imports_grpc() -> None:
    """grpcio costs ~60 ms to import: the CLI speaks gRPC through its own transport (transport.py)."""
    code = ("import sys; import peloton.cli.main as m; "
            "import peloton.cli.client, peloton.cli.jobs, peloton.cli.tasks, peloton.cli.admin, peloton.cli.render; "
            "c = peloton.cli.client.Client('127.0.0.1:1'); c.jobs.GetJob; c.tasks.ListTasks; c.pools; c.hosts; "
            "m.main(['--address', '127.0.0.1:1', 'job', 'list']); "
            "print(sorted(n for n in sys.modules if n == 'grpc' or n.startswith(('grpc.', 'asyncio'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("mem", ["", "0", "0Mi", "0Gi", "64Mi", "1024Mi", "1.5Gi", "0.5Mi", "2048", "16Gi", "1Ti", "0064Mi",
                                 "24105.1328125Mi"])
def test_quantities_print_the_same_however_they_are_written(mem: str) -> None:
    """The tables' rounding is tests/unit/test_json_output.py's; the daemon's form and any other read alike."""
    from peloton.cli.render import quantity
    from peloton.domain.resources import format_mib, parse_mib

    written = format_mib(parse_mib(mem or "0", "mem"))
    assert quantity(mem) == quantity(written)


def test_the_client_stubs_have_the_generated_stubs_methods() -> None:
    from peloton.api.v1 import host_pb2_grpc, job_pb2_grpc, respool_pb2_grpc, task_pb2_grpc
    from peloton.cli.client import Client

    c = Client("127.0.0.1:1")  # nothing is sent
    for ours, generated in ((c.jobs, job_pb2_grpc.JobServiceStub), (c.tasks, task_pb2_grpc.TaskServiceStub),
                            (c.pools, respool_pb2_grpc.ResourcePoolServiceStub),
                            (c.hosts, host_pb2_grpc.HostServiceStub)):
        names = [n for n in vars(generated(grpc.insecure_channel("127.0.0.1:1"))) if n[0].isupper()]
        assert names and all(callable(getattr(ours, n)) for n in names)
        assert set(ours._service.methods_by_name) == set(names)
    assert isinstance(c.jobs.WatchJobs, UnaryStream)
    assert isinstance(c.jobs.GetJob, UnaryUnary)
    assert c.jobs.GetJob.path == "/peloton.v1.JobService/GetJob"
    with pytest.raises(AttributeError):
        c.jobs.NoSuchCall  # noqa: B018


def test_main_called_with_arguments_returns(capsys: pytest.CaptureFixture[str]) -> None:
    """Only the program (no argv given) ends its process itself (os._exit, after flushing)."""
    from peloton.cli.main import main

    assert main(["--address", "127.0.0.1:1", "--rpc-timeout", "5", "job", "list"]) == 1
    assert "cannot reach the peloton daemon at 127.0.0.1:1" in capsys.readouterr().err


def test_task_get_says_when_it_shows_only_the_newest_events(capsys: pytest.CaptureFixture[str]) -> None:
    from types import SimpleNamespace

    from peloton.api.v1 import task_pb2
    from peloton.cli.tasks import cmd_task_get

    def client(shown: int, total: int) -> Any:
        t = task_pb2.TaskInfo(task_id="j-0-1", state="RUNNING", attempt=1, events_total=total)
        for _ in range(shown):
            t.events.add(attempt=1, state="RUNNING", time=0.0)
        return SimpleNamespace(tasks=SimpleNamespace(GetTask=None),
                               call=lambda fn, req: task_pb2.GetTaskResponse(task=t))

    args = argparse.Namespace(job_id="j", instance=0, output="table")
    assert cmd_task_get(client(3, 2500), args) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "(the newest 3 of 2500 events)"
    assert cmd_task_get(client(3, 3), args) == 0
    assert "newest" not in capsys.readouterr().out


# --- job logs -f across a gang restart ----------------------------------------------------------------------------
class FakeJobDaemon:
    """The calls `job logs -f` makes, of a job of two members whose logs live in `logs` ((instance, attempt) ->
    bytes). The second time the job is asked for, the gang has restarted: the member 1's first attempt wrote its
    last line after `job logs -f` had read it, and ended; both members are at attempt 2 (a line each), and the job
    then succeeds."""

    def __init__(self) -> None:
        self.logs = {(0, 1): b"a0\n", (1, 1): b"a1\n"}
        self.attempt = 1
        self.state = "RUNNING"
        self.gets = 0
        self.address = "d:1"
        self.jobs = argparse.Namespace(GetJob="GetJob")
        self.tasks = argparse.Namespace(GetTaskLogs="GetTaskLogs", ListTasks="ListTasks")

    def call(self, method: str, req: Any) -> Any:
        if method == "GetJob":
            self.gets += 1
            if self.gets == 2:  # between a round's reads and this refresh: the last words, the restart
                self.logs[(1, 1)] += b"dying\n"
                self.logs.update({(0, 2): b"b0\n", (1, 2): b"b1\n"})
                self.attempt = 2
            elif self.gets > 2:
                self.state = "SUCCEEDED"
            return job_pb2.GetJobResponse(job=job_pb2.Job(id="j1", status=job_pb2.JobStatus(state=self.state)))
        if method == "ListTasks":
            return task_pb2.ListTasksResponse(tasks=[
                task_pb2.TaskInfo(instance=i, attempt=self.attempt, task_id=f"j1-{i}-{self.attempt}") for i in (0, 1)])
        attempt = req.attempt or self.attempt
        data = self.logs[(req.instance, attempt)]
        ended = attempt < self.attempt or self.state == "SUCCEEDED"
        start = req.offset if req.HasField("offset") else max(0, len(data) - (req.tail_bytes or 1 << 20))
        return task_pb2.GetTaskLogsResponse(task_id=f"j1-{req.instance}-{attempt}", content=data[start:],
                                            next_offset=len(data), task_state="KILLED" if ended and attempt == 1
                                            else "SUCCEEDED" if ended else "RUNNING")


def test_job_logs_follow_prints_an_attempt_to_its_end_before_the_gang_restarts_next(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from peloton.cli import tasks

    written: list[bytes] = []
    monkeypatch.setattr(tasks, "_write", written.append)
    daemon = FakeJobDaemon()
    a = argparse.Namespace(job_id="j1", tail=None, reconnect_grace=60.0)
    assert tasks._follow_job_logs(daemon, a, "stdout", sleep=lambda s: None) == 0  # type: ignore[arg-type]
    out = b"".join(written).decode().splitlines()
    assert sorted(out) == ["[0] a0", "[0] b0", "[1] a1", "[1] b1", "[1] dying"], out
    assert out.index("[1] dying") < out.index("[1] b1")
    assert "[1] attempt 2 (j1-1-2)" in capsys.readouterr().err


class _UntilDeadline(FakeCall):
    """RUNNING, then a stream that stays open until the caller's deadline ends it (DEADLINE_EXCEEDED)."""

    def __init__(self, deadline: list[float]) -> None:
        super().__init__([resp("s", 1, "RUNNING")])
        self.deadline = deadline

    def __iter__(self) -> Iterator[job_pb2.WatchJobsResponse]:
        yield from self.responses
        import time

        while time.monotonic() < self.deadline[0]:
            time.sleep(0.01)
        raise RpcError(StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")


class _WaitClient:
    """What `job wait` uses of a Client, over prepared streams (the real resumed watch and Reconnect)."""

    address = "d:1"

    def __init__(self, *calls: FakeCall | Exception) -> None:
        self.daemon = FakeDaemon(*calls)
        self.deadline: list[float] = [0.0]

    def watch_jobs(self, job_ids: list[str], tasks: bool, reconnect: Reconnect, deadline: float | None = None
                   ) -> Iterator[job_pb2.WatchJobsResponse]:
        self.deadline[0] = deadline or 0.0
        return watch_jobs(self.daemon, job_ids, tasks, reconnect, deadline)


class _Interrupt(FakeCall):
    def __iter__(self) -> Iterator[job_pb2.WatchJobsResponse]:
        yield from self.responses
        raise KeyboardInterrupt


@pytest.mark.parametrize("ending", ["unreachable", "timed_out", "interrupted"])
def test_job_wait_prints_its_document_with_the_states_seen_however_it_ends(
        ending: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`job wait -o json` that gave up on the daemon (69), timed out (124) or was interrupted (130) still prints
    its document, with the states seen so far and what ended it: a script keeps what was seen."""
    import json

    from peloton.cli.exits import EXIT_INTERRUPTED, EXIT_TIMEOUT, EXIT_UNAVAILABLE
    from peloton.cli.jobs import cmd_job_wait

    first = [resp("s", 1, "PENDING"), resp("s", 2, "RUNNING")]
    if ending == "unreachable":  # no grace: the first failure after the last word gives up
        c = _WaitClient(FakeCall(first, UNAVAILABLE))
    elif ending == "timed_out":
        c = _WaitClient(FakeCall(first[:1], UNAVAILABLE))
        c.daemon.calls.append(_UntilDeadline(c.deadline))
    else:
        c = _WaitClient(_Interrupt(first))
    a = argparse.Namespace(job_id="j1", wait_timeout=0.3 if ending == "timed_out" else 0.0,
                           reconnect_grace=0.0 if ending == "unreachable" else 60.0, output="json")
    code = cmd_job_wait(c, a)  # type: ignore[arg-type]
    out, err = capsys.readouterr()
    assert code == {"unreachable": EXIT_UNAVAILABLE, "timed_out": EXIT_TIMEOUT, "interrupted": EXIT_INTERRUPTED}[ending]
    doc = json.loads(out)
    assert doc == {"job_id": "j1", "state": "RUNNING", "states": ["PENDING", "RUNNING"], "succeeded": False,
                   "timed_out": ending == "timed_out", "unreachable": ending == "unreachable",
                   "interrupted": ending == "interrupted"}, out
    if ending == "unreachable":
        assert "peloton: error: gave up after 0s without the peloton daemon at d:1" in err


# --- a job's view read in two calls at once ---------------------------------------------------------------------
class _Answered:
    def __init__(self, value: Any) -> None:
        self.value = value

    def result(self) -> Any:
        return self.value

    def cancel(self) -> None:
        pass


class TornReadDaemon:
    """GetJob and ListTasks answered from either side of a commit: the tasks from before the job's last member
    ended (one still RUNNING), the job from after it (SUCCEEDED); a ListTasks asked later sees the commit."""

    def __init__(self) -> None:
        self.timeout = 5.0
        self.lists = 0
        done = task_pb2.TaskInfo(instance=0, state="SUCCEEDED")
        self.before = task_pb2.ListTasksResponse(tasks=[done, task_pb2.TaskInfo(instance=1, state="RUNNING")])
        self.after = task_pb2.ListTasksResponse(tasks=[done, task_pb2.TaskInfo(instance=1, state="SUCCEEDED")])
        self.jobs = argparse.Namespace(GetJob=argparse.Namespace(future=lambda req, timeout: _Answered(
            job_pb2.GetJobResponse(job=job_pb2.Job(id="j1", status=job_pb2.JobStatus(state="SUCCEEDED"))))))
        self.tasks = argparse.Namespace(ListTasks=argparse.Namespace(future=lambda req, timeout: self._list()))

    def _list(self) -> _Answered:
        self.lists += 1
        return _Answered(self.before if self.lists == 1 else self.after)

    def call(self, method: Any, req: Any) -> Any:
        return method.future(req, self.timeout).result()


def test_an_ended_job_is_not_shown_with_a_task_read_from_before_its_end() -> None:
    """`job get --watch` printed, as its last view, a job SUCCEEDED beside a member RUNNING (seen in CI): its two
    reads went out together and the daemon answered the tasks from before the last member's end."""
    from peloton.cli.jobs import fetch_job

    daemon = TornReadDaemon()
    job, tasks = fetch_job(daemon, "j1")  # type: ignore[arg-type]
    assert job.status.state == "SUCCEEDED"
    assert [t.state for t in tasks] == ["SUCCEEDED", "SUCCEEDED"]
