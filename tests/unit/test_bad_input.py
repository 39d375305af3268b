"""Input that once escaped the rule "bad input gets a clear error naming the field, exit 2, nothing done": a spec
file's lone surrogates and null variable names, a spec or config file that is not UTF-8, flags whose values
protobuf or the transport could not hold; and a WatchJobs answer too large for a client to receive."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest

from peloton.api.specfile import parse_spec
from peloton.api.v1 import job_pb2
from peloton.domain import limits as L
from peloton.errors import InvalidArgument
from peloton.jobmgr.service import _change_to_proto
from peloton.jobmgr.watch import JobChange, TaskChange, WatchHub

PELOTON = [sys.executable, "-m", "peloton.cli.main"]
TASK = 'task: {command: "true", resources: {cpu: 1}}'
UNREACHABLE = "127.0.0.1:1"  # every case below is refused before any call
JOB = "0123456789ab"  # a whole id: the CLI looks nothing up


def refused(text: str) -> InvalidArgument:
    with pytest.raises(InvalidArgument) as e:
        parse_spec(text, "f.yaml")
    assert e.value.message.startswith("f.yaml: "), e.value.message
    return e.value


# --- the spec file ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("text", "field"), [
    ('name: "\\ud800"\ninstances: 1\n' + TASK, "name"),
    ('name: x\ninstances: 1\ntask: {command: "a\\udfff", resources: {cpu: 1}}', "task.command"),
    ('name: x\ninstances: 1\ntask: {command: x, resources: {cpu: 1, mem: "\\ud800"}}', "task.resources.mem"),
    ('name: x\ninstances: 1\ntask: {command: x, env: {A: "\\ud800"}, resources: {cpu: 1}}', "task.env.A"),
    ('name: x\ninstances: 1\ntask: {command: x, env: {"\\ud800": a}, resources: {cpu: 1}}', "task.env.\\ud800"),
    ('name: x\ninstances: 1\ntask: {command: x, env_files: {A: "/\\ud800"}, resources: {cpu: 1}}',
     "task.env_files.A"),
    ('"\\ud800": 1\nname: x\ninstances: 1\n' + TASK, "\\ud800"),
])
def test_a_lone_surrogate_in_a_spec_file_is_refused_naming_its_field(text: str, field: str) -> None:
    # YAML's "\ud800" escape makes a string no UTF-8 text holds: protobuf raised UnicodeEncodeError (a field name:
    # SystemError), a traceback from `job create -f`
    e = refused(text)
    assert e.field == field and "lone surrogate" in e.message, e.message


@pytest.mark.parametrize("key", ["NULL", "null", "Null", "~"])
def test_an_environment_variable_named_like_yaml_null_is_refused_not_renamed(key: str) -> None:
    # `NULL: 1` under task.env was the variable `None`: YAML reads the name as null, and str(None) named it
    e = refused(f"name: x\ninstances: 1\ntask: {{command: x, env: {{{key}: 1}}, resources: {{cpu: 1}}}}")
    assert e.field == "task.env" and "quote it" in e.message, e.message
    e = refused(f"name: x\ninstances: 1\ntask: {{command: x, env_files: {{{key}: /a}}, resources: {{cpu: 1}}}}")
    assert e.field == "task.env_files", e.message
    quoted = parse_spec(f'name: x\ninstances: 1\ntask: {{command: x, env: {{"{key}": 1}}, resources: {{cpu: 1}}}}')
    assert dict(quoted.task.env) == {key: "1"}


def test_a_character_yaml_refuses_is_named_with_its_position() -> None:
    e = refused("name: a\x00b\ninstances: 1\n" + TASK)  # once "not valid YAML: syntax error", nothing more
    assert e.message == "f.yaml: not valid YAML: character #x0000 at position 8: special characters are not allowed"


def cli(*argv: str, stdin: bytes = b"") -> subprocess.CompletedProcess[str]:
    r = subprocess.run([*PELOTON, "--address", UNREACHABLE, *argv], input=stdin.decode("latin-1"),
                       capture_output=True, text=True, timeout=60, encoding="latin-1")
    assert "Traceback" not in r.stderr, r.stderr
    return r


def test_a_spec_file_not_in_utf8_is_refused_in_one_line(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_bytes(b"name: caf\xe9\ninstances: 1\n" + TASK.encode())  # Latin-1
    r = cli("job", "create", "-f", str(spec))
    assert (r.returncode, r.stderr) == (2, f"peloton: error: {spec}: not UTF-8 text (at byte 10)\n")
    r = cli("job", "create", "-f", "-", stdin=spec.read_bytes())
    assert (r.returncode, r.stderr) == (2, "peloton: error: -: not UTF-8 text (at byte 10)\n")


def test_a_spec_with_a_lone_surrogate_is_refused_by_the_cli_in_one_line(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text('name: "\\ud800"\ninstances: 1\n' + TASK)
    r = cli("job", "create", "-f", str(spec))
    assert (r.returncode, r.stderr) == (2, f"peloton: error: {spec}: name: is not valid UTF-8 text (lone "
                                           "surrogate)\n")


SPEC_FILE_LIMIT = f"larger than the {L.MAX_SPEC_FILE_BYTES} bytes (4 MiB) a spec file may have"


def bounded(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[bytes]:
    """The CLI with 1 GiB of memory at most: a reader without a limit fails with MemoryError, not the machine."""
    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    r = subprocess.run([*PELOTON, "--address", UNREACHABLE, *argv], capture_output=True, timeout=60,
                       preexec_fn=cap, **kw)  # noqa: PLW1509 - only setrlimit, before exec
    assert b"Traceback" not in r.stderr, r.stderr.decode(errors="replace")[-2000:]
    return r


@pytest.mark.parametrize("command", [("job", "create"), ("job", "plan")])
@pytest.mark.parametrize("source", ["/dev/zero", "/dev/urandom", "big"])
def test_a_spec_file_larger_than_a_request_is_refused_promptly_naming_it(tmp_path: Path, command: tuple[str, ...],
                                                                        source: str) -> None:
    # job create -f read the whole file: /dev/zero or /dev/urandom (no end) took memory until the machine had none
    if source == "big":
        source = str(tmp_path / "big.yaml")
        Path(source).write_text("name: x\ninstances: 1\n" + TASK + "\n" + "#" * L.MAX_SPEC_FILE_BYTES)
    r = bounded([*command, "-f", source])  # (within its 60 s: reading /dev/zero to its end never returns)
    assert (r.returncode, r.stderr.decode()) == (2, f"peloton: error: {source}: {SPEC_FILE_LIMIT}\n")


def test_an_endless_pipe_as_a_spec_file_is_refused_promptly(tmp_path: Path) -> None:
    fifo = tmp_path / "spec.fifo"
    os.mkfifo(fifo)
    writer = subprocess.Popen(["sh", "-c", f"exec yes 'name: x' > {fifo}"], stderr=subprocess.DEVNULL)
    try:
        r = bounded(["job", "create", "-f", str(fifo)])
    finally:
        writer.kill()
        writer.wait()
    assert (r.returncode, r.stderr.decode()) == (2, f"peloton: error: {fifo}: {SPEC_FILE_LIMIT}\n")
    with open("/dev/zero", "rb") as zero:  # `-f -`: stdin, without end
        r = bounded(["job", "create", "-f", "-"], stdin=zero)
    assert (r.returncode, r.stderr.decode()) == (2, f"peloton: error: -: {SPEC_FILE_LIMIT}\n")


def test_a_spec_file_of_the_limit_is_read(tmp_path: Path) -> None:
    """Read, parsed and sent: the call reaches a server, which implements nothing. (Not an address nothing
    listens on: `job create` tries an unreachable daemon again for 30 s before it gives up.)"""
    spec = tmp_path / "spec.yaml"
    head = "name: x\ninstances: 1\n" + TASK + "\n#"
    spec.write_text(head + "#" * (L.MAX_SPEC_FILE_BYTES - len(head)))
    assert spec.stat().st_size == L.MAX_SPEC_FILE_BYTES
    called: list[str] = []

    class Nothing(grpc.GenericRpcHandler):
        def service(self, details: grpc.HandlerCallDetails) -> None:
            called.append(details.method)

    server = grpc.server(ThreadPoolExecutor(1), handlers=[Nothing()])
    address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    server.start()
    try:
        r = subprocess.run([*PELOTON, "--address", address, "job", "create", "-f", str(spec)], capture_output=True,
                           text=True, timeout=60)
    finally:
        server.stop(None)
    assert "Traceback" not in r.stderr, r.stderr
    assert r.returncode == 1 and SPEC_FILE_LIMIT not in r.stderr and "does not implement `job create`" in r.stderr, (
        r.stderr)
    assert called[:1] == ["/peloton.v1.JobService/CreateJob"], called  # (then what the server is: GetClusterInfo)


def test_a_server_config_not_in_utf8_is_refused_in_one_line(tmp_path: Path) -> None:
    config = tmp_path / "peloton.toml"
    config.write_bytes(b'listen = "\xff"\n')
    r = cli("server", "--config", str(config))
    assert (r.returncode, r.stderr) == (2, f"peloton: error: {config}: not valid TOML: not UTF-8 text (at byte "
                                           "11)\n")


# --- the operator's files: read up to a bound, never whole ----------------------------------------------------------
# The server's --config, --gpu-table and principals file, and the client's config.toml were read whole: /dev/zero
# (or a file named by mistake) took memory until the machine had none, and the daemon never started nor said why.
# Each is read up to its limit now (limits.py; files.read_bounded, as the spec file is) and refused naming the file
# and the limit, before anything is started or written.

def limit_text(most: int, kind: str) -> str:
    return f"larger than the {most} bytes ({most >> 20} MiB) {kind} may have"


def a_file_over(tmp_path: Path, most: int, name: str, mode: int = 0o600) -> Path:
    path = tmp_path / name
    path.write_bytes(b" " * (most + 1))
    path.chmod(mode)
    return path


def server_refused(tmp_path: Path, *argv: str, env: dict[str, str] | None = None) -> str:
    """`peloton server` with `argv`, refused at once (exit 2, one line, no traceback): nothing of the data dir or
    the store was made."""
    data = tmp_path / "data"
    r = bounded(["server", "--backend", "sim", "--data-dir", str(data), "--db", f"sqlite:///{tmp_path}/x.db",
                 "--listen", "127.0.0.1:0", "--metrics-listen", "", "--ui-listen", "", *argv],
                env={**os.environ, **(env or {})})
    err = r.stderr.decode()
    assert r.returncode == 2 and err.startswith("peloton: error: ") and err.count("\n") == 1, err
    assert not data.exists() and not (tmp_path / "x.db").exists()
    return err.removeprefix("peloton: error: ").rstrip("\n")


@pytest.mark.parametrize("source", ["/dev/zero", "big"])
def test_a_server_config_file_over_its_limit_is_refused_naming_it(tmp_path: Path, source: str) -> None:
    if source == "big":
        source = str(a_file_over(tmp_path, L.MAX_CONFIG_FILE_BYTES, "peloton.toml"))
    want = f"--config: {source}: {limit_text(L.MAX_CONFIG_FILE_BYTES, 'a server config file')}"
    assert server_refused(tmp_path, "--config", source) == want
    assert server_refused(tmp_path, env={"PELOTON_SERVER_CONFIG": source}) == want  # the same file by its variable


@pytest.mark.parametrize("source", ["/dev/zero", "big"])
def test_a_gpu_table_over_its_limit_is_refused_naming_it(tmp_path: Path, source: str) -> None:
    if source == "big":
        source = str(a_file_over(tmp_path, L.MAX_GPU_TABLE_BYTES, "gpus.json"))
    assert server_refused(tmp_path, "--gpu-table", source) == (
        f"--gpu-table: {source}: {limit_text(L.MAX_GPU_TABLE_BYTES, 'a GPU table')}")


def test_a_principals_file_over_its_limit_is_refused_naming_it(tmp_path: Path) -> None:
    big = a_file_over(tmp_path, L.MAX_PRINCIPALS_FILE_BYTES, "principals.json")
    want = f"--principals-file: {big}: {limit_text(L.MAX_PRINCIPALS_FILE_BYTES, 'a principals file')}"
    assert server_refused(tmp_path, "--principals-file", str(big)) == want  # (was refused only after the store)
    fifo = tmp_path / "principals.fifo"  # owner-only, without end
    os.mkfifo(fifo, 0o600)
    writer = subprocess.Popen(["sh", "-c", f"exec yes '{{}}' > {fifo}"], stderr=subprocess.DEVNULL)
    try:
        assert server_refused(tmp_path, "--principals-file", str(fifo)) == (
            f"--principals-file: {fifo}: {limit_text(L.MAX_PRINCIPALS_FILE_BYTES, 'a principals file')}")
    finally:
        writer.kill()
        writer.wait()
    r = bounded(["token", "create", "alice", "--role", "admin", "--principals-file", str(big)])
    assert (r.returncode, r.stderr.decode()) == (2, f"peloton: error: {want}\n")
    assert big.stat().st_size == L.MAX_PRINCIPALS_FILE_BYTES + 1  # not rewritten


@pytest.mark.parametrize("source", ["/dev/zero", "big"])
def test_a_client_config_over_its_limit_is_refused_naming_it(tmp_path: Path, source: str) -> None:
    if source == "big":
        source = str(a_file_over(tmp_path, L.MAX_CONFIG_FILE_BYTES, "config.toml"))
    r = bounded(["job", "list"], env={**os.environ, "PELOTON_CONFIG": source})
    assert (r.returncode, r.stderr.decode()) == (
        2, f"peloton: error: {source}: {limit_text(L.MAX_CONFIG_FILE_BYTES, 'a client config file')}\n")


def test_a_config_file_of_the_limit_is_read(tmp_path: Path) -> None:
    config = tmp_path / "peloton.toml"
    head = 'listen = "127.0.0.1:0"\n#'
    config.write_text(head + "#" * (L.MAX_CONFIG_FILE_BYTES - len(head)))
    r = cli("server", "--config", str(config), "--print-config")
    assert r.returncode == 0 and "127.0.0.1:0" in r.stdout, r.stderr


# --- flags --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("argv", "message"), [
    # an int32 field of a request: protobuf raised ValueError ("Value out of range"), a traceback
    (("task", "get", JOB, "99999999999"), "task get: INSTANCE: at most 2147483647, got 99999999999"),
    (("task", "logs", JOB, "0", "--attempt", "2147483648"), "task logs: --attempt: at most 2147483647, got "
                                                            "2147483648"),
    (("job", "plan", "-f", "-", "--top", "99999999999"), "job plan: --top: at most 2147483647, got 99999999999"),
    (("host", "list", "--free-gpus", "99999999999"), "host list: --free-gpus: at most 2147483647, got 99999999999"),
    (("queue", "--limit", "-99999999999"), "queue: --limit: at least -2147483648, got -99999999999"),
    # seconds: nan and inf reached the transport's deadline (int(nan * 1000), a traceback); a negative or nan
    # grace was taken as it was
    (("job", "wait", JOB, "--timeout", "nan"), "job wait: --timeout: must be a finite number of seconds, got 'nan'"),
    (("job", "wait", JOB, "--timeout", "1e309"), "job wait: --timeout: must be a finite number of seconds, got "
                                                 "'1e309'"),
    (("job", "wait", JOB, "--timeout", "-1"), "job wait: --timeout: must not be negative, got -1"),
    (("job", "wait", JOB, "--reconnect-grace", "nan"), "job wait: --reconnect-grace: must be a finite number of "
                                                       "seconds, got 'nan'"),
    (("job", "get", JOB, "--watch", "--reconnect-grace", "-5"), "job get: --reconnect-grace: must not be negative, "
                                                                "got -5"),
    (("job", "list", "--rpc-timeout", "inf"), "job list: --rpc-timeout: must be a finite number of seconds, got "
                                              "'inf'"),
    (("--rpc-timeout", "0", "job", "list"), "--rpc-timeout: must be more than 0 seconds, got 0"),
])
def test_a_flag_value_a_request_cannot_hold_is_a_usage_error(argv: tuple[str, ...], message: str) -> None:
    r = cli(*argv)
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith(f"peloton: error: {message} ("), r.stderr
    assert len(r.stderr.splitlines()) == 1, r.stderr


# --- the watch hub ------------------------------------------------------------------------------------------------
def big_change(n: int) -> JobChange:
    """A commit's change of a job of 200 members, each task with a 200-character message: about 60 KB."""
    tasks = tuple(TaskChange(i, f"job{n:07d}-{i}-1", 1, "FAILED", f"host-{i:04d}", 1, "exited 1", "m" * 200)
                  for i in range(200))
    return JobChange(f"job{n:07d}", "RUNNING", "SUCCEEDED", "", tasks)


CLIENT_LIMIT = 4 * 1024 * 1024  # what a gRPC client receives in one message by default (the CLI too)


def test_a_watcher_far_behind_gets_every_change_once_in_messages_a_client_can_receive() -> None:
    # A watcher of every job with tasks that fell behind (a slow reader, a reconnect) got everything since in one
    # WatchJobsResponse: here 120 commits, ~7 MB, over a client's 4 MiB. The client refuses it (RESOURCE_EXHAUSTED),
    # resumes from the same revision, and is sent the same message again: it never gets past it.
    hub = WatchHub()
    for n in range(120):
        hub.append([big_change(n)])
    got: list[str] = []
    after, messages = 0, 0
    while after < hub.revision:
        changes, rev, lost = hub.wait(after, 0.0, (), tasks=True)
        assert not lost and rev > after and changes
        resp = job_pb2.WatchJobsResponse(stream_id=hub.stream_id, revision=rev,
                                          changes=[_change_to_proto(c) for c in changes])
        assert resp.ByteSize() < CLIENT_LIMIT, (messages, resp.ByteSize())
        got += [c.job_id for c in changes]
        after, messages = rev, messages + 1
    assert got == [f"job{n:07d}" for n in range(120)]  # every change, once, in order
    assert messages > 1
    # resuming from a revision in the middle of a batch sends what is after it, nothing before
    changes, rev, _ = hub.wait(100, 0.0, (), tasks=True)
    assert changes[0].job_id == "job0000100" and rev == 100 + len(changes)


def test_the_batches_of_a_filtered_watcher_skip_others_changes() -> None:
    hub = WatchHub()
    for n in range(120):
        hub.append([big_change(n)])
    wanted = {f"job{n:07d}" for n in (3, 60, 119)}
    changes, rev, lost = hub.wait(0, 0.0, wanted, tasks=True)
    assert [c.job_id for c in changes] == sorted(wanted) and rev == 120 and not lost
    changes, rev, _ = hub.wait(0, 0.0, (), tasks=False)  # without tasks a change is small: all of them at once
    assert len(changes) == 120 and rev == 120 and all(not c.tasks for c in changes)


# The CLI's model document (`model create|refit -f`), the offline commands' inputs (`model fit|predict|plan`: the
# profile, --gpu-table, --input, --hosts) and the replay's trace, profiles and cluster file had readers of their own;
# they read through files.read_bounded now, each with its limit, refused naming the flag, the file and the limit.

@pytest.mark.parametrize("source", ["/dev/zero", "big"])
def test_a_model_document_over_its_limit_is_refused_naming_it(tmp_path: Path, source: str) -> None:
    from peloton.cli import model

    if source == "big":
        source = str(a_file_over(tmp_path, model.MAX_FILE_BYTES, "model.json"))
    with pytest.raises(InvalidArgument) as e:
        model.read_document(source)
    assert (e.value.message, e.value.field) == (
        f"-f: {source}: {limit_text(model.MAX_FILE_BYTES, 'a model document')}", "-f")


@pytest.mark.parametrize("source", ["/dev/zero", "big"])
def test_an_offline_gpu_table_over_its_limit_is_refused_naming_it(tmp_path: Path, source: str) -> None:
    from peloton.cli import model_offline

    assert model_offline.MAX_INPUT_BYTES == 64 << 20
    if source == "big":
        source = str(a_file_over(tmp_path, model_offline.MAX_INPUT_BYTES, "gpus.json"))
    with pytest.raises(InvalidArgument) as e:
        model_offline._read(source, "--gpu-table")
    assert (e.value.message, e.value.field) == (
        f"--gpu-table: {source}: {limit_text(model_offline.MAX_INPUT_BYTES, 'an input file')}", "--gpu-table")


@pytest.mark.parametrize("source", ["/dev/zero", "big"])
def test_a_replay_input_over_its_limit_is_refused_naming_it(tmp_path: Path, source: str,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from peloton.replay import run

    assert run.MAX_FILE_BYTES == 256 << 20
    monkeypatch.setattr(run, "MAX_FILE_BYTES", 1 << 20)  # (256 MiB of /dev/zero in the test's memory: no need)
    if source == "big":
        source = str(a_file_over(tmp_path, 1 << 20, "trace.csv"))
    with pytest.raises(InvalidArgument) as e:
        run.read_text(source, "TRACE")
    want = limit_text(1 << 20, "a replay's input file")
    assert (e.value.message, e.value.field) == (f"TRACE: {source}: {want}", "TRACE")
