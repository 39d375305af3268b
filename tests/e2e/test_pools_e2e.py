"""Resource pools through the CLI and the real daemon (SQLite and PostgreSQL, local backend with two simulated
hosts of 4 cpu, 4Gi, 2 GPUs): create, update, get, list, the tree's rules, and jobs in leaf pools."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.harness import Daemon, wait_until

pytestmark = pytest.mark.e2e


def test_pools_from_the_cli(daemon: Daemon, tmp_path: Path) -> None:
    d = daemon
    wait_until(lambda: json.loads(d.cli("pool", "get", "/", "-o", "json").stdout)["entitlement"],  # null until known
               what="the cluster's capacity reported to the resource manager")
    assert d.cli("pool", "create", "/research", "--reservation", "cpu=2,gpu=2", "--limit", "gpu=4",
                 "--share", "2").stdout == "/research\n"
    # refused, naming the field, and nothing written
    bad = d.cli("pool", "create", "/research/vision", "--reservation", "gpu=3", check=False)
    assert bad.returncode == 2, bad
    assert bad.stderr.strip() == ("peloton: error: pool.reservation.gpu: /research/vision and its siblings would "
                                  "reserve 3 in all, more than /research reserves (2)")
    assert "/research/vision" not in d.cli("pool", "list").stdout
    bad = d.cli("pool", "update", "/research", "--limit", "gpu=1", check=False)
    assert bad.returncode == 2 and "pool.limit.gpu: 1 is below the pool's reservation 2" in bad.stderr
    # accepted with a warning: more than the cluster has
    big = d.cli("pool", "create", "/big", "--reservation", "cpu=100")
    assert big.stdout == "/big\n"
    assert big.stderr.startswith("peloton: warning: the top-level pools reserve 102 cpu in all, more than the "
                                 "cluster has now (8)")
    d.cli("pool", "delete", "/big")

    # update changes what its flags name, per dimension, and keeps the rest
    d.cli("pool", "update", "/research", "--static", "--share", "3", "--reservation", "cpu=4")
    got = json.loads(d.cli("pool", "get", "/research", "-o", "json").stdout)
    assert (got["reservation_type"], got["share"], got["reservation"]["cpu"], got["reservation"]["gpu"],
            got["limit"]["gpu"]) == ("static", 3, 4, 2, 4)
    assert got["entitlement"]["gpu"] == 2 and got["entitlement"]["cpu"] == 4  # static: held while idle
    listed = d.cli("pool", "list").stdout.splitlines()
    assert listed[0].split() == ["PATH", "RESERVATION", "LIMIT", "SHARE", "ALLOCATED", "DEMAND", "ENTITLEMENT",
                                 "QUEUED"]
    assert any(line.startswith("/research ") and " static " in line for line in listed), listed

    # a job in the leaf pool: its allocation shows
    job = d.create("name: in-pool\nrespool: /research\ninstances: 2\n"
                   "task: {command: 'sleep 30', resources: {cpu: 1, mem: 64Mi, gpu: 1}}\n", tmp_path)
    d.wait_state(job, "RUNNING")
    table = d.cli("pool", "get", "/research").stdout.splitlines()
    assert table[0].startswith("pool /research: share 3, reservation static, 0 gang(s) queued")
    rows = {line.split()[0]: line.split() for line in table[2:]}
    assert table[1].split() == ["RESOURCE", "RESERVATION", "LIMIT", "DEMAND", "ALLOCATED", "ENTITLEMENT"]
    assert rows["gpu"] == ["gpu", "2", "4", "0", "2", "2"] and rows["cpu"][:5] == ["cpu", "4", "-", "0", "2"]

    # jobs go to leaf pools (or the root, a cluster's default pool)
    d.cli("pool", "create", "/team")
    d.cli("pool", "create", "/team/a")
    refused = d.cli("job", "create", "-f", str(_spec(tmp_path, "/team")), check=False)
    assert refused.returncode == 2 and "respool: /team has child pools (/team/a); jobs go to a leaf pool" in \
        refused.stderr
    sleeper = d.cli("job", "create", "-f", str(_spec(tmp_path, "/team/a", "sleep 30"))).stdout.strip()
    assert d.cli("job", "create", "-f", str(_spec(tmp_path, "/"))).returncode == 0
    # a pool with unfinished jobs gets no children; one with children or jobs is not deleted
    bad = d.cli("pool", "create", "/team/a/sub", check=False)
    assert bad.returncode == 1 and "/team/a has 1 unfinished job(s)" in bad.stderr, bad.stderr
    assert d.cli("pool", "delete", "/team", check=False).returncode == 1
    assert d.cli("pool", "delete", "/team/a", check=False).returncode == 1
    for j in (job, sleeper):
        d.cli("job", "stop", j)


def _spec(tmp: Path, pool: str, command: str = "true") -> Path:
    f = tmp / f"job{pool.replace('/', '_')}.yaml"
    f.write_text(f"name: p\nrespool: {pool}\ninstances: 1\n"
                 f"task: {{command: '{command}', resources: {{cpu: 1, mem: 64Mi}}}}\n")
    return f


def test_the_queue_shows_who_waits_in_order_and_why(daemon: Daemon, tmp_path: Path) -> None:
    d = daemon
    d.cli("pool", "create", "/q", "--limit", "cpu=1")
    first = d.cli("job", "create", "-f", str(_spec(tmp_path, "/q", "sleep 60"))).stdout.strip()
    d.wait_state(first, "RUNNING")
    waiting = [d.cli("job", "create", "-f", str(_spec(tmp_path, "/q", "sleep 60"))).stdout.strip() for _ in range(2)]

    def rows() -> list[list[str]]:
        out = d.cli("queue", "/q").stdout.splitlines()
        return [line.split(None, 11) for line in out[1:]]

    got = wait_until(lambda: rows() if len(rows()) == 2 and all(r[8] == "waiting" for r in rows()) else None,
                     what="two gangs waiting in /q")
    assert [(r[0], r[1], r[2]) for r in got] == [("/q", "1", waiting[0]), ("/q", "2", waiting[1])]
    assert (got[0][9], got[0][10]) == ("-", "-"), got  # over its limit: no hosts held for it, no expected start
    assert got[0][11].startswith("waiting for admission: pool /q limit"), got
    # the second waits behind the first (it does not overtake it, though it is no bigger)
    assert got[1][11] == f"waiting behind {waiting[0]}/0, the first gang of pool /q's queue", got
    assert json.loads(d.cli("queue", "-o", "json").stdout)["total"] == 2
    missing = d.cli("queue", "/nope", check=False)
    assert missing.returncode == 1 and "pool: resource pool /nope does not exist" in missing.stderr
    for j in (first, *waiting):
        d.cli("job", "stop", j)
