"""Host drain through the CLI and the real daemon (SQLite and PostgreSQL; the local backend with two simulated
hosts of 4 cpu, 4Gi, 2 GPUs): no new gangs on a draining host; at the deadline its gangs are preempted whole and
placed elsewhere without losing an attempt; the drain survives a restart; undrain puts the host back."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.harness import Daemon, wait_until

pytestmark = pytest.mark.e2e

GANG = ("name: {name}\ninstances: 2\nretry: {{max_attempts: 1}}\nsla: {{preemption_grace: 2s, preemptible: false}}\n"
        "task: {{command: 'sleep 300', resources: {{cpu: 0.5, mem: 32Mi, gpu: 1}}}}\n")


def hosts(d: Daemon) -> dict[str, dict[str, Any]]:
    return {h["hostname"]: h for h in json.loads(d.cli("host", "list", "-o", "json").stdout)["hosts"]}


def where(d: Daemon, job: str) -> set[str]:
    return {t["host"] for t in d.tasks(job)}


def test_drain_moves_gangs_off_a_host_at_the_deadline_and_survives_a_restart(daemon: Daemon, tmp_path: Path) -> None:
    d = daemon
    a = d.create(GANG.format(name="a"), tmp_path)  # both members on one host (pack), and not preemptible
    d.wait_state(a, "RUNNING")
    (busy,) = where(d, a)
    (idle,) = set(hosts(d)) - {busy}
    # without a deadline the gangs on it run on; nothing new goes there
    out = d.cli("host", "drain", busy).stdout
    assert out == f"{busy}: draining, 2 task(s) on it\n"
    b = d.create(GANG.format(name="b"), tmp_path)
    d.wait_state(b, "RUNNING")
    assert where(d, b) == {idle} and where(d, a) == {busy}
    line = next(x for x in d.cli("host", "list").stdout.splitlines() if x.startswith(busy))
    assert " draining " in line
    # the drain is kept in the store: a restart keeps the host out of service
    d.kill9()
    d.start()
    assert hosts(d)[busy]["drain"] == "draining"
    d.cli("job", "stop", b)
    d.wait_state(b, "KILLED")
    # a deadline: the gang still there is preempted whole, and goes where there is room, as the same attempt
    d.cli("host", "drain", busy, "--deadline", "1s")
    wait_until(lambda: where(d, a) == {idle} and d.state(a) == "RUNNING", 30, what="gang a moved off the host")
    g = d.job(a)["status"]["gangs"][0]
    assert (g["attempt"], g["run"], g["preemptions"]) == (1, 2, 1), g
    wait_until(lambda: hosts(d)[busy]["drain"] == "drained", 15, what="the host drained")
    # back in service
    assert d.cli("host", "undrain", busy).stdout == f"{busy}: in service\n"
    assert hosts(d)[busy]["drain"] == ""
    c = d.create(GANG.format(name="c"), tmp_path)
    d.wait_state(c, "RUNNING")
    assert where(d, c) == {busy}
    # a host that does not exist, a bad deadline: refused, naming the field
    bad = d.cli("host", "drain", "nohost", check=False)
    assert bad.returncode == 1 and "hostname: no host nohost" in bad.stderr, bad.stderr
    bad = d.cli("host", "drain", busy, "--deadline", "soon", check=False)
    assert bad.returncode == 2 and "--deadline" in bad.stderr, bad.stderr
    for j in (a, c):
        d.cli("job", "stop", j)


def test_without_a_deadline_the_gangs_finish_there_and_then_the_host_is_drained(daemon: Daemon,
                                                                                 tmp_path: Path) -> None:
    d = daemon
    short = GANG.format(name="short").replace("sleep 300", "sleep 3")
    j = d.create(short, tmp_path)
    d.wait_state(j, "RUNNING")
    (busy,) = where(d, j)
    assert d.cli("host", "drain", busy).stdout == f"{busy}: draining, 2 task(s) on it\n"
    d.wait_state(j, "SUCCEEDED", timeout=30)  # ran to its end where it was: never preempted
    g = d.job(j)["status"]["gangs"][0]
    assert (g["attempt"], g["run"], g["preemptions"]) == (1, 1, 0), g
    wait_until(lambda: hosts(d)[busy]["drain"] == "drained", 15, what="the host drained once its gangs ended")
    d.cli("host", "undrain", busy)


def test_host_list_filters_on_the_daemon_and_host_get_says_which_task_holds_each_gpu(daemon: Daemon,
                                                                                   tmp_path: Path) -> None:
    d = daemon
    a = d.create(GANG.format(name="filters"), tmp_path)  # both members on one host (pack): its 2 GPUs used
    d.wait_state(a, "RUNNING")
    (busy,) = where(d, a)
    (idle,) = set(hosts(d)) - {busy}
    d.cli("host", "drain", idle)
    try:
        def names(*args: str) -> list[str]:
            return [h["hostname"] for h in json.loads(d.cli("host", "list", "-o", "json", *args).stdout)["hosts"]]

        assert names("--state", "drained") == [idle]
        assert names("--state", "up") == [busy]
        assert sorted(names("--state", "up", "--state", "drained")) == sorted([busy, idle])
        assert names("--free-gpus", "1") == []  # the busy host's GPUs are used, the idle one is drained
        assert names("--name", idle) == [idle] and names("--label", "no-such-label") == []
        assert names("--label", f"host={busy}") == [busy]
        out = d.cli("host", "list", "--limit", "1")
        assert len(out.stdout.splitlines()) == 2 and "(1 more; --limit)" in out.stderr
        bad = d.cli("host", "list", "--limit", "0", check=False)
        assert bad.returncode != 0 and "--limit" in bad.stderr
        bad = d.cli("host", "list", "--label", "=x", check=False)
        assert bad.returncode != 0 and "labels" in bad.stderr
        doc = json.loads(d.cli("host", "get", busy, "-o", "json").stdout)
        assert doc["status"] == "up" and [g["state"] for g in doc["gpus"]] == ["used", "used"]
        assert {g["task_id"].split("-")[0] for g in doc["gpus"]} == {a}
        text = d.cli("host", "get", busy).stdout
        assert f"gpus:       0 used ({a}-" in text and "kept for:   -" in text
        drained = json.loads(d.cli("host", "get", idle, "-o", "json").stdout)
        assert [g["state"] for g in drained["gpus"]] == ["drained", "drained"]
    finally:
        d.cli("host", "undrain", idle)
        d.cli("job", "stop", a)
