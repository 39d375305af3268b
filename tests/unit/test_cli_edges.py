"""The CLI's edges (issue 21): the parser built per group, `-o` on every client command with a rule for the
contradictions, the verbs users expect, the connection flags described once, `queue list`, id prefixes."""

from __future__ import annotations

import argparse
import json
from types import SimpleNamespace
from typing import Any

import pytest

from peloton.api.v1 import job_pb2
from peloton.cli import ids, render
from peloton.cli.admin import queue_pool
from peloton.cli.main import main
from peloton.cli.parser import GROUPS, build_parser, group_of, leaf_parser
from peloton.errors import InvalidArgument, NotFound
from tests.unit.test_cli_usage import commands


def _leaves(p: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    return [sp for sp in commands(p) if "fn" in sp._defaults]


# --- the parser, per group -------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv", [
    ["job", "list"], ["--address", "x:1", "job", "get", "abc"], ["-o", "json", "host", "ls"],
    ["--token=t", "pool", "get", "/"], ["--context", "job", "task", "list", "j"], ["queue", "list"],
    ["model", "plan", "--help-not-a-flag"], ["server", "--listen", "x"],
])
def test_the_group_named_is_found_without_parsing(argv: list[str]) -> None:
    words = [w for i, w in enumerate(argv) if not w.startswith("-") and (i == 0 or argv[i - 1] not in
                                                                            ("--address", "--context", "-o"))]
    assert group_of(argv) == words[0]


def test_a_command_line_parses_the_same_with_only_its_group_built() -> None:
    full = build_parser()
    for argv in (["job", "ls", "--state", "running", "-o", "wide"], ["--address", "a:1", "task", "get", "j", "3"],
                 ["pool", "create", "/x", "--limit", "cpu=2", "--static"], ["host", "drain", "h", "--deadline", "1h"],
                 ["server", "--backend", "sim", "--sim-hosts", "3"], ["model", "list", "-o", "yaml"],
                 ["queue", "list", "/p"], ["audit", "--denied"], ["sim", "fail-host", "sim-1"]):
        a, b = vars(full.parse_args(argv)), vars(build_parser(argv).parse_args(argv))
        a.pop("server_parser", None), b.pop("server_parser", None)
        assert a == b, argv
    partial = build_parser(["job", "list"])
    assert not _leaves(leaf_parser(partial, argparse.Namespace(group="pool")))  # a stub: its name, its help only
    assert set(GROUPS) == {sp.prog.split()[1] for sp in commands(full) if sp.prog.count(" ") == 1}


# --- -o everywhere, and its rule -------------------------------------------------------------------------------
def test_every_client_command_takes_every_output_format() -> None:
    for leaf in _leaves(build_parser()):
        out = next((a for a in leaf._actions if a.dest == "output"), None)
        assert out is not None and list(out.choices or ()) == ["table", "wide", "json", "yaml"], leaf.prog


@pytest.mark.parametrize(("argv", "said"), [
    (["job", "list", "-q", "-o", "json"], "job list: -q/--quiet prints only ids, one a line: not with -o json"),
    (["-o", "wide", "job", "ls", "-q"], "job list: -q/--quiet prints only ids, one a line: not with -o wide"),
    (["job", "logs", "abc", "-o", "json"], "job logs: -o json: a log is printed as written, not as a record"),
    (["task", "logs", "abc", "0", "-o", "yaml"], "task logs: -o yaml: a log is printed as written"),
    (["-o", "json", "db", "upgrade"], "-o/--output: `peloton db upgrade` has no output format to choose"),
    (["token", "create", "x", "-o", "yaml"], "-o/--output: `peloton token create` has no output format to choose"),
    (["completion", "bash", "-o", "json"], "-o/--output: `peloton completion` has no output format to choose"),
])
def test_contradictions_of_o_are_refused_before_any_call(capsys: pytest.CaptureFixture[str], argv: list[str],
                                                         said: str) -> None:
    with pytest.raises(SystemExit) as e:
        main(["--address", "127.0.0.1:1", *argv])
    assert e.value.code == 2
    assert said in capsys.readouterr().err


def test_yaml_is_the_json_document_written_as_yaml(monkeypatch: pytest.MonkeyPatch) -> None:
    import yaml

    doc = {"jobs": [{"id": "abc", "exit_code": None, "ports": [1, 2]}], "n": 1.5}
    monkeypatch.setattr(render, "FORMAT", "yaml")
    assert yaml.safe_load(render.dumps(doc)) == doc
    assert render.dumps(doc, compact=True).startswith("---\n")  # `job get -w`: a stream of documents
    monkeypatch.setattr(render, "FORMAT", "json")
    assert json.loads(render.dumps(doc)) == doc


def test_a_command_that_acts_prints_its_record_only_when_asked(capsys: pytest.CaptureFixture[str]) -> None:
    render.done(SimpleNamespace(output="json"), {"job_id": "a", "deleted": True}, "line")
    assert json.loads(capsys.readouterr().out) == {"job_id": "a", "deleted": True}
    render.done(SimpleNamespace(output="wide"), {"job_id": "a"}, "line")
    render.done(SimpleNamespace(output="table"), {"job_id": "a"})
    assert capsys.readouterr().out == "line\n"


# --- verbs, help, queue ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(("alias", "verb"), [("ls", "list"), ("rm", "delete"), ("describe", "get")])
def test_the_verbs_users_expect_are_the_commands_they_mean(alias: str, verb: str) -> None:
    p = build_parser()
    for group, args in (("job", ["j"]), ("pool", ["/p"]), ("model", ["m"]), ("host", ["h"]), ("task", ["j", "0"])):
        try:
            want = p.parse_args([group, verb, *args][:2 if verb == "list" and group != "task" else None])
        except SystemExit:  # the group has no such verb (host delete): nor the alias
            with pytest.raises(SystemExit):
                p.parse_args([group, alias, *args])
            continue
        got = p.parse_args([group, alias, *args][:2 if verb == "list" and group != "task" else None])
        assert got.fn == want.fn, (group, alias)


def test_job_ls_is_not_taken_for_logs(capsys: pytest.CaptureFixture[str]) -> None:
    assert build_parser().parse_args(["job", "ls"]).fn == "jobs:cmd_job_list"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["host", "lst"])
    assert "did you mean 'list'?" in capsys.readouterr().err


def test_a_commands_help_names_the_connection_flags_once_and_the_top_help_describes_them(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["job", "get", "--help"])
    text = capsys.readouterr().out
    assert "--address, --context, --tls-ca, --client-cert, --client-key, --token" in text
    assert "daemon HOST:PORT" not in text and "--tls-ca FILE" not in text
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    text = capsys.readouterr().out
    assert "daemon HOST:PORT" in text and "connection" in text


@pytest.mark.parametrize(("words", "pool"), [
    ([], ""), (["list"], ""), (["ls"], ""), (["/research"], "/research"), (["list", "/a/b"], "/a/b"), (None, ""),
    ("/x", "/x"),
])
def test_queue_list_is_the_queue(words: Any, pool: str) -> None:
    assert queue_pool(words) == pool


def test_queue_takes_one_pool() -> None:
    with pytest.raises(InvalidArgument, match="one pool path at most"):
        queue_pool(["list", "/a", "/b"])
    assert build_parser().parse_args(["queue", "list"]).pool == ["list"]


# --- id prefixes -----------------------------------------------------------------------------------------------
class _Jobs:
    """A daemon's ListJobs over these ids, in pages of the size asked, filtered by id_prefix unless `old` (a
    daemon from before that filter, which ignores the field)."""

    def __init__(self, job_ids: list[str], old: bool = False) -> None:
        self.ids, self.calls, self.old = job_ids, 0, old

    def call(self, method: Any, req: job_pb2.ListJobsRequest) -> job_pb2.ListJobsResponse:
        self.calls += 1
        start = int(req.page_token or 0)
        ids = self.ids if self.old else [i for i in self.ids if i.startswith(req.id_prefix)]
        page = ids[start:start + req.page_size]
        nxt = str(start + req.page_size) if start + req.page_size < len(ids) else ""
        return job_pb2.ListJobsResponse(jobs=[job_pb2.Job(id=i) for i in page], next_page_token=nxt)

    jobs = SimpleNamespace(ListJobs=None)


@pytest.mark.parametrize(("old", "calls"), [(False, 1), (True, 1 + 3)])
def test_a_unique_prefix_is_the_job_and_a_whole_id_costs_no_call(old: bool, calls: int) -> None:
    # one filtered page per prefix; a daemon that ignores id_prefix: every job listed (2500: three pages)
    c = _Jobs([f"{i:03x}" + "0" * 9 for i in range(2500)], old=old)
    assert ids.resolve(c, "4d2") == "4d2000000000"  # type: ignore[arg-type]
    a = argparse.Namespace(job_id="abcdef012345", job_ids=["4d2", "0ff000000000"], jobs=None)
    c.calls = 0
    ids.resolve_args(c, a)  # type: ignore[arg-type]
    assert a.job_id == "abcdef012345" and a.job_ids == ["4d2000000000", "0ff000000000"] and c.calls == calls
    c.calls = 0
    ids.resolve_args(c, argparse.Namespace(job_id="abcdef012345"))  # type: ignore[arg-type]
    assert c.calls == 0


def test_an_ambiguous_prefix_names_its_candidates_and_an_unknown_one_is_not_found() -> None:
    c = _Jobs(["aa0000000001", "aa0000000002", "ab0000000003"] + [f"c{i:011x}" for i in range(12)])
    with pytest.raises(InvalidArgument, match=r"'aa' is the start of 2 job ids: aa0000000001, aa0000000002 \(give"):
        ids.resolve(c, "aa")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match=r"more than 10 job ids: c0{11}, c0{10}1, .*, c0{10}9, \.\.\. \(give"):
        ids.resolve(c, "c")  # type: ignore[arg-type]
    with pytest.raises(NotFound, match="no job's id starts with 'dd'"):
        ids.resolve(c, "dd")  # type: ignore[arg-type]


@pytest.mark.parametrize(("given", "prefix"), [
    ("3f2a", True), ("3f2a0b1c9d8", True), ("3f2a0b1c9d8e", False), ("", False), ("XYZ", False), ("my-job", False),
])
def test_only_a_short_hex_id_is_taken_for_a_prefix(given: str, prefix: bool) -> None:
    assert ids.is_prefix(given) is prefix
