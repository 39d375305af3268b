"""The CLI's parser and its pure pieces, without a daemon: help everywhere, one-line usage errors with "did you
mean", connection flags after the command, `--tail` in lines, the prefixed lines of `job logs`, the completion
script's tables. What needs a daemon is in tests/e2e/test_cli_usage_e2e.py."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from peloton.api.v1 import task_pb2
from peloton.cli import tasks
from peloton.cli.main import build_parser
from peloton.cli.parser import CONNECTION_DESTS
from peloton.cli.tasks import _Prefixed, last_lines, write_log


def commands(p: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    yield p
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from commands(sub)


def parse_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, err
    return err.strip()


# --- help --------------------------------------------------------------------------------------------------------
def test_every_flag_positional_and_command_has_help() -> None:
    missing = []
    for p in commands(build_parser()):
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                helped = {c.dest for c in a._choices_actions if c.help}
                aliased = {id(a.choices[h]) for h in helped}  # `job ls` is `job list`: helped there
                missing += [f"{p.prog} {name}" for name, sp in a.choices.items()
                            if name not in helped and id(sp) not in aliased]
            elif not a.help:
                missing.append(f"{p.prog} {'/'.join(a.option_strings) or a.dest}")
    assert missing == []


def test_metavars_say_what_to_give() -> None:
    text = next(p for p in commands(build_parser()) if p.prog == "peloton job wait").format_help()
    assert "--timeout SECONDS" in text and "WAIT_TIMEOUT" not in text and "JOB_ID" in text
    for p in commands(build_parser()):
        for a in p._actions:
            if not a.option_strings and not isinstance(a, argparse._SubParsersAction) and not a.choices:
                # a positional without a metavar would show its dest (job_id) in the usage line
                assert isinstance(a.metavar, str) and a.metavar.isupper(), (p.prog, a.dest)


def test_the_state_list_in_help_is_the_daemons() -> None:
    from peloton.domain.states import JobState

    for p in commands(build_parser()):
        if p.prog == "peloton job list":
            state = next(a for a in p._actions if a.dest == "state")
            assert state.help is not None and state.help.endswith(", ".join(s.value for s in JobState))


def test_address_help_says_how_the_socket_of_another_data_dir_is_found() -> None:
    """A daemon started with --data-dir DIR is reached through $PELOTON_DATA_DIR (the tutorial's way as root):
    `peloton --help` said only "the local socket", naming no way to point it elsewhere."""
    address = next(a for a in build_parser()._actions if a.dest == "address")
    assert address.help is not None and "socket in the data dir ($PELOTON_DATA_DIR" in address.help


def test_pool_delete_help_names_the_jobs_that_refuse_it() -> None:
    """The daemon refuses to delete a pool with unfinished jobs only (docs/cli.md; a finished job's pool goes): the
    help said "without children, jobs or queued gangs", as if any job kept it."""
    group = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    pool = group.choices["pool"]
    sub = next(a for a in pool._actions if isinstance(a, argparse._SubParsersAction))
    helps = {c.dest: c.help for c in sub._choices_actions}
    assert helps["delete"] == "delete a pool without child pools, unfinished jobs or queued gangs"


def test_server_help_warns_of_what_a_new_user_trips_on() -> None:
    """Two flags whose help left out what the README and docs/cli.md warn of: --local-host-resources' example had
    no disk (a dimension left out is 0: a job asking for disk never fits), and --insecure named only the network
    address, not that a root daemon then serves without authentication."""
    server = next(p for p in commands(build_parser()) if p.prog == "peloton server")
    helps = {a.dest: a.help or "" for a in server._actions}
    assert "disk=" in helps["local_host_resources"] and "left out is 0" in helps["local_host_resources"]
    assert "as root" in helps["insecure"] and "without authentication" in helps["insecure"]


# --- errors ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("argv", "expected"), [
    (["job", "lst"], "peloton: error: job: unknown command 'lst' (did you mean 'list'?)"),
    (["jb", "list"], "peloton: error: unknown command 'jb' (did you mean 'job'?)"),
    (["task", "lgos", "j", "0"], "peloton: error: task: unknown command 'lgos' (did you mean 'logs'?)"),
    (["job", "list", "--adress", "x"], "peloton: error: job list: unknown flag --adress (did you mean --address?)"),
    (["job", "list", "-o", "jsn"], "peloton: error: job list: -o/--output: invalid choice 'jsn' (did you mean "
                                   "'json'?)"),
    (["zzz"], "peloton: error: unknown command 'zzz' (one of server, certs, token, db, job, task, pool, model, queue, "
              "cluster, host, audit, sim, completion)"),
    (["job"], "peloton: error: job: missing COMMAND (one of create, plan, get, list, stop, delete, wait, logs)"),
    (["job", "get"], "peloton: error: job get: missing JOB_ID (see `peloton job get --help`)"),
    (["task", "logs", "j", "x"], "peloton: error: task logs: INSTANCE: invalid int value: 'x' (see `peloton task "
                                 "logs --help`)"),
])
def test_usage_errors_are_one_line_naming_what_is_wrong(capsys: pytest.CaptureFixture[str], argv: list[str],
                                                        expected: str) -> None:
    assert parse_error(capsys, *argv) == expected


# --- connection flags after the command --------------------------------------------------------------------------
def test_connection_flags_go_before_or_after_the_command_and_the_later_wins() -> None:
    p = build_parser()
    a = p.parse_args(["job", "list", "-o", "json", "--address", "x:1", "--token", "t", "--context", "c"])
    assert (a.address, a.token, a.context, a.output) == ("x:1", "t", "c", "json")
    a = p.parse_args(["--address", "before:1", "--tls-ca", "ca.pem", "task", "logs", "j", "0", "--address", "after:1"])
    assert (a.address, a.tls_ca) == ("after:1", "ca.pem")
    a = p.parse_args(["--address", "before:1", "job", "get", "j"])
    assert a.address == "before:1" and a.rpc_timeout == 30.0
    for prog in ("server", "certs init d", "db upgrade"):  # not client commands: no connection flags
        with pytest.raises(SystemExit):
            p.parse_args([*prog.split(), "--address", "x:1"])


# --- --tail in lines ---------------------------------------------------------------------------------------------
def test_last_lines() -> None:
    assert last_lines(b"a\nb\nc\n", 2, False) == b"b\nc\n"
    assert last_lines(b"a\nb\nc", 2, False) == b"b\nc"  # an unfinished last line is a line
    assert last_lines(b"a\nb\nc\n", 3, False) is None  # "a" may be the end of a longer line: read more
    assert last_lines(b"a\nb\nc\n", 3, True) == b"a\nb\nc\n"
    assert last_lines(b"a\nb\n", 9, True) == b"a\nb\n"
    assert last_lines(b"", 1, True) == b""
    assert last_lines(b"\n\n", 1, False) == b"\n"


class Log:
    """GetTaskLogs over `data` as the daemon reads it: bytes before `oldest` rotated away; without an offset the
    last tail_bytes; with one, from there (the oldest byte kept if it is older), at most tail_bytes."""

    def __init__(self, data: bytes, oldest: int = 0) -> None:
        self.data, self.oldest = data, oldest
        self.reads: list[tuple[int | None, int]] = []

    def __call__(self, req: task_pb2.GetTaskLogsRequest) -> task_pb2.GetTaskLogsResponse:
        size = req.tail_bytes or tasks.LOG_PAGE
        assert 0 < size <= tasks.LOG_PAGE
        end = len(self.data)
        if req.HasField("offset"):
            self.reads.append((req.offset, size))
            start = max(self.oldest, min(req.offset, end))
        else:
            self.reads.append((None, size))
            start = max(self.oldest, end - size)
        content = self.data[start:start + size]
        return task_pb2.GetTaskLogsResponse(task_id="j-0-3", content=content, next_offset=start + len(content),
                                            task_state="RUNNING")


def written(log: Log, tail: int | None) -> bytes:
    out: list[bytes] = []
    req = task_pb2.GetTaskLogsRequest(job_id="j", instance=0)
    offset, state = write_log(log, req, tail, out.append)
    assert (offset, state, req.attempt) == (len(log.data), "RUNNING", 3)
    return b"".join(out)


def expected_tail(data: bytes, n: int | None) -> bytes:
    """As `tail -n`: lines end at \\n only (bytes.splitlines would split at \\r too)."""
    lines = [line + b"\n" for line in data.split(b"\n")]
    lines[-1] = lines[-1][:-1]  # after the last newline: an unfinished line, or nothing
    lines = [line for line in lines if line]
    return b"".join(lines if n is None else lines[-n:])


@settings(max_examples=300, deadline=None)
@given(lines=st.lists(st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")), max_size=60),
       end_newline=st.booleans(), n=st.one_of(st.none(), st.integers(1, 80)), chunk=st.integers(1, 64),
       rotated=st.integers(0, 200))
def test_tail_reads_back_until_it_has_the_lines_never_cutting_one(lines: list[bytes], end_newline: bool,
                                                                  n: int | None, chunk: int, rotated: int) -> None:
    data = b"\n".join(lines) + (b"\n" if end_newline and lines else b"")
    oldest = min(rotated, len(data))
    # what is kept begins at a line start (rotation moves whole files; the first line kept may be a part: it is
    # all the daemon has of that line)
    log = Log(data, oldest)
    patch = pytest.MonkeyPatch()
    patch.setattr(tasks, "TAIL_CHUNK", chunk)
    patch.setattr(tasks, "LOG_PAGE", max(chunk, 50))
    try:
        assert written(log, n) == expected_tail(data[oldest:], n)
    finally:
        patch.undo()


def test_a_tail_of_long_lines_grows_its_reads_and_a_whole_log_is_read_by_pages() -> None:
    line = b"x" * 100_000 + b"\n"
    log = Log(b"short\n" + line * 3)
    assert written(log, 2) == line * 2
    # 64 KiB from the end, then back twice as far each time, within the 1 MiB a call may read
    assert [size for _, size in log.reads] == [65536, 65536, 131072]
    big = b"".join(b"%07d\n" % i for i in range(300_000))  # 2.4 MB
    log = Log(big)
    assert written(log, None) == big
    assert len(log.reads) == 3 and all(size <= tasks.LOG_PAGE for _, size in log.reads)


def test_job_logs_prefix_whole_lines_with_the_instance() -> None:
    out: list[bytes] = []
    p = _Prefixed(7, out.append)
    p.write(b"a\nb")
    p.write(b"c\n\nd")
    assert b"".join(out) == b"[7] a\n[7] bc\n[7] \n"
    p.end()
    assert out[-1] == b"[7] d\n"
    p.end()
    assert out[-1] == b"[7] d\n"


# --- completion --------------------------------------------------------------------------------------------------
def test_the_completion_script_knows_every_command_and_flag() -> None:
    from peloton.cli.completion import script

    for shell in ("bash", "zsh"):
        text = script(build_parser(), shell)
        for p in commands(build_parser()):
            path = p.prog.removeprefix("peloton").strip()
            flags = [o for a in p._actions for o in a.option_strings
                     if a.help != argparse.SUPPRESS or a.dest in CONNECTION_DESTS]
            assert f'"{path}") echo "{" ".join(flags)}" ;;' in text, (shell, path)
        assert '"job get") echo "@jobid" ;;' in text and '"job list -o") echo "table wide json yaml" ;;' in text
        assert '"job ls") echo "' in text and '"job describe") echo "@jobid" ;;' in text  # aliases complete too
        assert '"job get") echo "-h --help -w --watch --all --reconnect-grace -o --output --address' in text


def test_every_public_service_says_which_component_serves_it() -> None:
    from peloton.api.v1 import audit_pb2, host_pb2, job_pb2, model_pb2, respool_pb2, task_pb2
    from peloton.cli.client import SERVED_BY

    services = {s for m in (audit_pb2, host_pb2, job_pb2, respool_pb2, task_pb2, model_pb2)
                for s in m.DESCRIPTOR.services_by_name}
    assert set(SERVED_BY) == services
