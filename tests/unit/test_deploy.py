"""deploy/: the alert rules and the dashboard name only metrics the daemon exports; the systemd units pass
`systemd-analyze verify` (where it exists) and the alert rules `promtool check rules` (where it exists); the
container files are at least well-formed."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client import REGISTRY

import peloton.hostmgr.mesos.backend  # noqa: F401 - the Mesos backend's metrics (imported when it is used)
import peloton.server  # noqa: F401 - defines (imports) every metric the daemon exports

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
PROMETHEUS_OWN = {"up"}  # series Prometheus makes itself
_NAME = re.compile(r"\bpeloton_[a-zA-Z0-9_]+")


def exported() -> set[str]:
    """Every series name the daemon can expose: a counter `x` as x_total (and x_created), a histogram as
    x_bucket, x_sum, x_count."""
    out: set[str] = set()
    for m in REGISTRY.collect():
        if not m.name.startswith("peloton_"):
            continue
        if m.type == "counter":
            out |= {m.name + "_total", m.name + "_created"}
        elif m.type == "histogram":
            out |= {m.name + s for s in ("_bucket", "_sum", "_count", "_created")}
        else:
            out.add(m.name)
    return out


def names_in(expr: str) -> set[str]:
    return set(_NAME.findall(expr))


def test_the_registry_is_what_the_docs_list() -> None:
    names = exported()
    assert {"peloton_preemptions_total", "peloton_loop_heartbeat_timestamp_seconds", "peloton_loop_stuck",
            "peloton_leader",
            "peloton_gangs", "peloton_tasks", "peloton_jobs", "peloton_hosts", "peloton_cluster_capacity",
            "peloton_hostmgr_launch_failures_total", "peloton_store_transaction_seconds_bucket",
            "peloton_mesos_connected", "peloton_mesos_events_total",
            "peloton_resmgr_queue_wait_seconds_bucket"} <= names


def test_every_alert_rule_names_only_exported_metrics() -> None:
    doc = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    rules = [r for g in doc["groups"] for r in g["rules"]]
    assert len(rules) >= 5
    known = exported()
    for r in rules:
        assert set(r) <= {"alert", "expr", "for", "labels", "annotations"}, r
        assert r["alert"] and r["expr"] and r["annotations"]["summary"], r
        used = names_in(r["expr"])
        assert used or set(re.findall(r"\b[a-z_]+\b", r["expr"])) & PROMETHEUS_OWN, r
        assert used <= known, f"{r['alert']}: {sorted(used - known)} not exported"
    assert {r["alert"] for r in rules} >= {"PelotonDown", "PelotonNoLeader", "PelotonLoopStuck", "PelotonLaunchFailures",
                                           "PelotonQueueWaitHigh", "PelotonStoreErrors"}


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed here")
def test_promtool_accepts_the_rules() -> None:  # pragma: no cover - where promtool exists
    r = subprocess.run(["promtool", "check", "rules", str(DEPLOY / "prometheus" / "alerts.yml")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed here")
def test_the_alerts_fire_when_they_should_and_not_on_an_idle_daemon() -> None:  # pragma: no cover - with promtool
    """alerts_test.yml: an idle daemon with the default settings (loops that pass every 10 minutes) pages nobody
    for hours; a loop the daemon judges stuck pages."""
    r = subprocess.run(["promtool", "test", "rules", str(DEPLOY / "prometheus" / "alerts_test.yml")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_dashboard_is_valid_json_and_names_only_exported_metrics() -> None:
    dash = json.loads((DEPLOY / "grafana" / "peloton.json").read_text())
    panels = dash["panels"]
    assert len({p["id"] for p in panels}) == len(panels) >= 10
    known = exported()
    for p in panels:
        assert p["targets"], p["title"]
        for t in p["targets"]:
            used = names_in(t["expr"])
            assert used and used <= known, f"{p['title']}: {sorted(used - known)} not exported"
    shown = {n for p in panels for t in p["targets"] for n in names_in(t["expr"])}
    # queue, stage latencies, allocation per pool, hosts' task updates, loops
    assert {"peloton_resmgr_queued_gangs", "peloton_pool_allocation", "peloton_placement_round_seconds_bucket",
            "peloton_jobmgr_launch_seconds_bucket", "peloton_hostmgr_task_status_total",
            "peloton_loop_heartbeat_timestamp_seconds", "peloton_loop_stuck", "peloton_gang_stage_seconds_bucket"} <= shown


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed here")
@pytest.mark.parametrize("unit,instance", [("peloton.service", "peloton.service"),
                                           ("peloton-role@.service", "peloton-role@jobmgr.service")])
def test_systemd_verifies_the_units(tmp_path: Path, unit: str, instance: str) -> None:
    """Verified as installed, but for the paths: this checkout's peloton and environment file."""
    peloton_bin = shutil.which("peloton") or str(ROOT / ".venv" / "bin" / "peloton")
    text = (DEPLOY / "systemd" / unit).read_text()
    assert "ExecStart=/usr/local/bin/peloton server" in text and "EnvironmentFile=/etc/peloton/peloton.env" in text
    text = text.replace("/usr/local/bin/peloton", peloton_bin).replace("/etc/peloton/peloton.env",
                                                                          str(DEPLOY / "systemd" / "peloton.env"))
    (tmp_path / unit).write_text(text)
    r = subprocess.run(["systemd-analyze", "verify", str(tmp_path / instance)], capture_output=True, text=True,
                       timeout=60)
    complaints = [line for line in (r.stdout + r.stderr).splitlines() if "peloton" in line]
    assert r.returncode == 0 and not complaints, complaints


def test_the_units_are_hardened() -> None:
    role = (DEPLOY / "systemd" / "peloton-role@.service").read_text()
    for line in ("User=peloton", "NoNewPrivileges=yes", "ProtectSystem=strict", "CapabilityBoundingSet=\n"):
        assert line in role, line
    main = (DEPLOY / "systemd" / "peloton.service").read_text()
    assert "ProtectSystem=full" in main and "CapabilityBoundingSet=CAP_SETUID" in main
    # a stop or restart signals the daemon only: the local backend's tasks share its cgroup and are adopted later
    assert "KillMode=process" in main
    # its cgroup is delegated to the daemon, which makes a cgroup per task below it (cgroups.py)
    assert "\nDelegate=yes\n" in main and "\nProtectControlGroups=no\n" in main
    # each role its own data dir (a second process in one data dir is refused by its lock)
    assert "--data-dir /var/lib/peloton/%i" in role and "StateDirectory=peloton/%i" in role
    assert "PELOTON_ARGS=" in (DEPLOY / "systemd" / "peloton.env").read_text()


def test_the_container_files_are_well_formed() -> None:
    docker = (DEPLOY / "container" / "Dockerfile").read_text()
    assert "USER peloton" in docker and "pip wheel" in docker and "COPY migrations" in docker
    compose = yaml.safe_load((DEPLOY / "container" / "compose.yml").read_text())
    assert set(compose["services"]) == {"postgres", "peloton-a", "peloton-b", "prometheus", "grafana"}
    assert "--standby" in compose["services"]["peloton-b"]["command"]
    prom = yaml.safe_load((DEPLOY / "container" / "prometheus.yml").read_text())
    assert prom["rule_files"] == ["/etc/prometheus/alerts.yml"]
