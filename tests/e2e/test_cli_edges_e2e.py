"""The CLI's edges against a real daemon, on SQLite and PostgreSQL: `job create --dry-run` checks, admits and
places without writing a row (with authentication on, not even an audit record); a unique id prefix works where
an id is taken, an ambiguous one is refused naming the candidates; `-o json|yaml` of commands that act;
`queue list`; the aliases."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
import yaml

from peloton.security.identity import add_token
from tests.e2e.harness import Daemon, serving, wait_until

pytestmark = pytest.mark.e2e

TABLES = ("jobs", "gangs", "tasks", "task_events", "audit_events", "task_uids")


@pytest.fixture
def cli(db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Daemon]:
    """A daemon with authentication (so that a change would be audited), and the CLI holding an admin's token."""
    principals = tmp_path / "principals.json"
    monkeypatch.setenv("PELOTON_TOKEN", add_token(principals, "alice", ["admin"]))
    with serving(Daemon(tmp_path / "data", db_url, hosts=2, host_resources="cpu=4,mem=4Gi,gpu=2",
                        extra_args=("--principals-file", str(principals), "--unix-socket", ""))) as d:
        yield d


def _rows(db_url: str) -> dict[str, int]:
    engine = sa.create_engine(db_url)
    try:
        with engine.connect() as c:
            return {t: c.execute(sa.text(f"SELECT count(*) FROM {t}")).scalar_one() for t in TABLES}
    finally:
        engine.dispose()


def _spec(tmp_path: Path, text: str) -> str:
    f = tmp_path / f"spec-{abs(hash(text))}.yaml"
    f.write_text(text)
    return str(f)


def test_dry_run_admits_and_places_and_writes_nothing(cli: Daemon, db_url: str, tmp_path: Path) -> None:
    d = cli
    before = _rows(db_url)
    fits = _spec(tmp_path, "name: fits\ninstances: 2\ntask: {command: 'true', resources: {cpu: 3, mem: 1Gi}}\n")
    r = d.cli("job", "create", "-f", fits, "--dry-run", "-o", "json")
    doc = json.loads(r.stdout)
    assert doc["admitted"] is True and len(doc["gangs"]) == 1, doc
    gang = doc["gangs"][0]
    assert gang["waits"] == "" and gang["instances"] == [0, 1] and len(set(gang["hosts"])) == 2, gang  # cpu 3 of 4
    table = d.cli("job", "create", "-f", fits, "--dry-run").stdout
    assert "nothing was created" in table and "placed" in table, table
    assert yaml.safe_load(d.cli("job", "create", "-f", fits, "--dry-run", "-o", "yaml").stdout)["admitted"]
    # refused as a create would be, naming the field
    never = _spec(tmp_path, "name: never\ninstances: 1\ntask: {command: 'true', resources: {cpu: 64}}\n")
    r = d.cli("job", "create", "-f", never, "--dry-run", check=False)
    assert r.returncode != 0 and "can never fit" in r.stderr and r.stdout == "", r
    # a real create next: once its audit record is there, any of the dry runs' (written before it) would be too
    d.create("name: hog\ninstances: 2\ntask: {command: 'sleep 60', resources: {cpu: 3, mem: 1Gi}}\n", tmp_path)
    wait_until(lambda: _rows(db_url)["audit_events"] > before["audit_events"], what="the create's audit record")
    after = _rows(db_url)
    assert after["audit_events"] == before["audit_events"] + 1 and after["jobs"] == before["jobs"] + 1, after
    # a gang that fits the cluster but not its free hosts now: admitted, and said to wait; still nothing written
    gang = json.loads(d.cli("job", "create", "-f", fits, "--dry-run", "-o", "json").stdout)["gangs"][0]
    assert gang["hosts"] == [] and gang["waits"], gang
    assert {t: n for t, n in _rows(db_url).items() if t != "task_events"} == \
        {t: n for t, n in after.items() if t != "task_events"}


def test_dry_run_says_a_gang_placed_now_would_wait_for_its_pools_limit(cli: Daemon, db_url: str,
                                                                      tmp_path: Path) -> None:
    """The resource manager is asked too: the job's second gang fits the free hosts but not the pool's limit once
    the first is counted, so it would wait for admission; nothing is written or queued."""
    d = cli
    d.cli("pool", "create", "/capped", "--limit", "cpu=4")
    # the audit log is written behind the call: the pool's record first, so that it is not counted as the dry run's
    wait_until(lambda: _rows(db_url)["audit_events"] >= 1, what="the pool create's audit record")
    before = _rows(db_url)
    spec = _spec(tmp_path, "name: two\ninstances: 2\nrespool: /capped\ngang: {min_available: 1}\n"
                           "task: {command: 'true', resources: {cpu: 3, mem: 1Gi}}\n")
    doc = json.loads(d.cli("job", "create", "-f", spec, "--dry-run", "-o", "json").stdout)
    first, second = doc["gangs"]
    assert first["admission_waits"] == "" and first["queued_ahead"] == 0 and first["hosts"], first
    assert "pool /capped limit cpu=4 would be exceeded in cpu" in second["admission_waits"], second
    assert second["hosts"] and second["waits"] == "", second  # the hosts have room: only admission holds it
    table = d.cli("job", "create", "-f", spec, "--dry-run").stdout
    assert "1 of 2 gang(s) would be admitted" in table and "would find hosts free but wait for admission" in table
    assert "would be admitted now" in table and "would wait: pool /capped limit cpu=4" in table, table
    assert json.loads(d.cli("queue", "list", "-o", "json").stdout)["gangs"] == []
    # an audited change next: once its record is there, any of the dry runs' (written before it) would be too
    d.cli("pool", "create", "/other")
    wait_until(lambda: _rows(db_url)["audit_events"] > before["audit_events"], what="the second pool's audit record")
    assert _rows(db_url) == {**before, "audit_events": before["audit_events"] + 1}


def test_unique_prefixes_work_where_an_id_is_taken_and_ambiguous_ones_are_refused(cli: Daemon,
                                                                                   tmp_path: Path) -> None:
    d = cli
    ids = [d.create(f"name: p{i}\ninstances: 1\ntask: {{command: 'true', resources: {{cpu: 0.1, mem: 16Mi}}}}\n", tmp_path) for i in range(18)]
    by_first: dict[str, list[str]] = {}
    for i in ids:
        by_first.setdefault(i[0], []).append(i)
    shared = next(k for k, v in by_first.items() if len(v) > 1)  # 18 ids over 16 first characters: one is shared
    one = ids[0]
    unique = next(one[:n] for n in range(1, 12) if sum(i.startswith(one[:n]) for i in ids) == 1)
    assert json.loads(d.cli("job", "get", unique, "-o", "json").stdout)["id"] == one
    assert json.loads(d.cli("task", "list", unique, "-o", "json").stdout)["tasks"][0]["job_id"] == one
    r = d.cli("job", "get", shared, check=False)
    assert r.returncode == 2 and f"is the start of {len(by_first[shared])} job ids" in r.stderr, r.stderr
    assert all(i in r.stderr for i in by_first[shared])
    r = d.cli("job", "get", "fffffffffff", check=False)  # 11 characters: a prefix, of no job
    assert r.returncode == 1 and "no job's id starts with" in r.stderr, r.stderr
    d.wait_state(one, "SUCCEEDED")
    assert json.loads(d.cli("job", "rm", unique, "-o", "json").stdout) == {"job_id": one, "deleted": True}


def test_commands_that_act_print_a_record_and_the_verbs_users_expect_work(cli: Daemon, tmp_path: Path) -> None:
    d = cli
    job = d.create("name: s\ninstances: 1\ntask: {command: 'sleep 60', resources: {cpu: 0.1, mem: 16Mi}}\n", tmp_path)
    doc = json.loads(d.cli("job", "stop", job, "-o", "json").stdout)  # was "unknown flag -o"
    assert doc == {"jobs": [{"job_id": job, "result": "stopping", "state": doc["jobs"][0]["state"], "error": None}]}
    assert json.loads(d.cli("job", "wait", job, "-o", "json", check=False).stdout)["state"] == "KILLED"
    assert job in d.cli("job", "ls").stdout and job in d.cli("job", "list", "-o", "wide").stdout
    assert "RUNS AS" in d.cli("job", "ls", "-o", "wide").stdout
    assert json.loads(d.cli("job", "describe", job, "-o", "json").stdout)["id"] == job
    assert d.cli("queue", "list").returncode == 0 and d.cli("queue", "ls", "/").returncode == 0
    assert json.loads(d.cli("pool", "create", "/edge", "-o", "json").stdout)["path"] == "/edge"
    assert yaml.safe_load(d.cli("pool", "rm", "/edge", "-o", "yaml").stdout) == {"path": "/edge", "deleted": True}
    assert "hostname:" in d.cli("host", "ls", "-o", "yaml").stdout
