"""The `-o json` form (docs/cli.md#json-output) and the tables' quantities and compact job view: pure, on messages
built here. The e2e side is tests/e2e/test_cli_output_e2e.py."""

from __future__ import annotations

import json
import re

import pytest
from google.protobuf import duration_pb2, json_format
from google.protobuf.descriptor import FieldDescriptor

from peloton.api.v1 import audit_pb2, cluster_pb2, host_pb2, job_pb2, model_pb2, respool_pb2, task_pb2
from peloton.cli import render

PUBLIC = (job_pb2, task_pb2, host_pb2, respool_pb2, cluster_pb2, audit_pb2, model_pb2)
# double fields that are plain numbers (cores, shares, MiB of an entitlement, request bounds)
NUMBERS = {
    "peloton.v1.Resources": {"cpu"}, "peloton.v1.ResourcePool": {"share"},
    "peloton.v1.Entitlement": {"cpu", "mem_mib", "disk_mib", "gpu"}, "peloton.v1.HostHardware": {"nic_gbps"},
    "peloton.v1.PlanHostHardware": {"nic_gbps"},
    "peloton.v1.ListAuditEventsRequest": {"since", "until"},  # a request: never printed
    "peloton.v1.ModelSpec": {"local_bsz", "global_bsz", "min_efficiency"},  # samples per step; a fraction (auto)
    # a plan's predictions and measurements: seconds and samples/s as plain numbers (as `-o json` prints them)
    "peloton.v1.PlanAlternative": {"step_time", "samples_per_s"},
    "peloton.v1.PlanInfo": {"step_time", "samples_per_s", "local_bsz", "measured_step_time",
                            "measured_samples_per_s"},
}
RFC3339 = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


def _messages() -> list[object]:
    out = []
    for mod in PUBLIC:
        stack = list(mod.DESCRIPTOR.message_types_by_name.values())
        while stack:
            d = stack.pop()
            out.append(d)
            stack += [n for n in d.nested_types if not n.GetOptions().map_entry]
    return out


def test_every_double_of_the_public_api_is_a_time_a_duration_or_a_number() -> None:
    """A new double field must be classified, or `-o json` would print a time as a float again."""
    unclassified = []
    for d in _messages():
        for f in d.fields:  # type: ignore[attr-defined]
            if f.type != FieldDescriptor.TYPE_DOUBLE:
                continue
            name = d.full_name  # type: ignore[attr-defined]
            if not any(f.name in table.get(name, ()) for table in (render.TIMESTAMPS, render.SECONDS, NUMBERS)):
                unclassified.append(f"{name}.{f.name}")
    assert unclassified == []
    assert all(name in {d.full_name for d in _messages()}  # type: ignore[attr-defined]
               for name in (*render.TIMESTAMPS, *render.SECONDS))  # no stale entry


def test_times_are_rfc3339_utc_to_the_millisecond_and_sort_as_they_happen() -> None:
    assert render.rfc3339(0.0) is None
    assert render.rfc3339(1795630031.8436778) == "2026-11-25T18:07:11.843Z"
    assert render.rfc3339(1795630031.9999) == "2026-11-25T18:07:11.999Z"  # truncated, never the next second
    assert render.rfc3339(1.0) == "1970-01-01T00:00:01.000Z"
    stamps = [1795630031.0, 1795630031.0005, 1795630031.0015, 1795630032.0, 1895630032.25]
    shown = [render.rfc3339(t) for t in stamps]
    assert all(s is not None and RFC3339.fullmatch(s) for s in shown)
    assert shown == sorted(shown)  # type: ignore[type-var]


@pytest.mark.parametrize(("seconds", "nanos"), [(0, 0), (300, 0), (1, 500_000_000), (0, 1000), (0, 1),
                                                (315_576_000_000, 999_999_999), (-1, -500_000_000)])
def test_durations_are_written_as_protobuf_writes_a_duration(seconds: int, nanos: int) -> None:
    d = duration_pb2.Duration(seconds=seconds, nanos=nanos)
    assert render.duration(seconds, nanos) == json_format.MessageToJson(d).strip('"')


def test_spans_of_float_seconds_are_durations_to_the_millisecond() -> None:
    assert [render.span(s) for s in (6.0, 0.5234567, 0.0, 90.25)] == ["6s", "0.523s", "0s", "90.250s"]


def test_every_field_is_there_with_null_for_what_is_not_set() -> None:
    job = job_pb2.Job(id="j", spec=job_pb2.JobSpec(name="n", instances=2))
    job.spec.gang.launch_timeout.FromSeconds(300)
    job.status.created_at = 1795630031.8436778
    job.status.task_states["RUNNING"] = 2
    d = render.to_dict(job)
    assert d["spec"]["sla"] is None  # an unset section (the daemon sets every one but max_runtime)
    assert d["spec"]["gang"]["launch_timeout"] == "300s"
    assert d["status"]["created_at"] == "2026-11-25T18:07:11.843Z" and d["status"]["completed_at"] is None
    assert d["status"]["task_states"] == {"RUNNING": 2} and d["status"]["gangs"] == []
    sla = render.to_dict(job_pb2.SlaSpec(priority=1))
    assert sla == {"priority": 1, "preemptible": None, "max_runtime": None, "preemption_grace": None}
    task = render.to_dict(task_pb2.TaskInfo(task_id="j-0-1", started_at=1795630031.5))
    assert task["exit_code"] is None and task["finished_at"] is None and task["started_at"].endswith(":11.500Z")
    assert render.to_dict(task_pb2.TaskInfo(exit_code=0))["exit_code"] == 0  # set to 0 is not null
    pool = render.to_dict(respool_pb2.ResourcePool(path="/"))
    assert pool["limit"] is None and pool["entitlement"] is None  # no limit; not computed yet
    # the same keys as protobuf's own JSON form, and nothing it would not name
    ours = set(render.to_dict(job.status))
    theirs = set(json_format.MessageToDict(job.status, preserving_proto_field_name=True,
                                           always_print_fields_with_no_presence=True))
    assert ours == theirs


def test_64_bit_integers_are_numbers_and_times_of_other_messages_are_converted_too() -> None:
    info = cluster_pb2.GetClusterInfoResponse(started_at=1795630031.25)
    info.leadership.epoch = 7
    info.leadership.lease_seconds = 6
    info.leadership.roles.add(role="jobmgr", since=1795630031.0, silent_seconds=0.4)
    d = json.loads(render.json_message(info))
    assert d["leadership"]["epoch"] == 7 and d["leadership"]["lease_seconds"] == "6s"
    assert d["leadership"]["roles"][0]["since"] == "2026-11-25T18:07:11.000Z"
    assert d["leadership"]["roles"][0]["silent_seconds"] == "0.400s"
    assert d["leadership"]["leading_since"] is None  # 0: not known
    audit = json.loads(render.json_message(audit_pb2.AuditEvent(id=2**40, at=1795630031.0)))
    assert audit["id"] == 2**40 and audit["at"] == "2026-11-25T18:07:11.000Z"
    host = render.to_dict(host_pb2.Host(hostname="h", drain="draining", drain_deadline=1795630031.0))
    assert host["drain_deadline"] == "2026-11-25T18:07:11.000Z"
    assert render.to_dict(host_pb2.Host(hostname="h"))["drain_deadline"] is None


@pytest.mark.parametrize(("mib", "shown"), [
    (0, "0Mi"), (0.5, "0.5Mi"), (0.3333, "0.3Mi"), (64, "64Mi"), (1000, "1000Mi"), (1023.99, "1Gi"), (1024, "1Gi"),
    (1152, "1.1Gi"), (24105.1328125, "23.5Gi"), (16384, "16Gi"), (196608, "192Gi"), (1572864, "1.5Ti"),
    (1048575.9, "1Ti")])
def test_tables_show_quantities_rounded_in_the_largest_unit(mib: float, shown: str) -> None:
    assert render.mib(mib) == shown


@pytest.mark.parametrize(("written", "shown"), [
    ("", "0Mi"), ("0", "0Mi"), ("0Mi", "0Mi"), ("64Mi", "64Mi"), ("4Gi", "4Gi"), ("24105.1328125Mi", "23.5Gi"),
    ("1Ti", "1Ti"), ("0064Mi", "64Mi"), ("1.5Gi", "1.5Gi"), ("2048", "2Gi"), ("1048576Mi", "1Ti")])
def test_quantities_the_daemon_writes_show_the_same_way(written: str, shown: str) -> None:
    assert render.quantity(written) == shown


def test_resources_show_disk_when_there_is_some_or_when_asked() -> None:
    r = job_pb2.Resources(cpu=4, mem="24105.1328125Mi", disk="0Mi", gpu=2)
    assert render.resources(r) == "cpu=4,mem=23.5Gi,gpu=2"
    assert render.resources(r, disk=True) == "cpu=4,mem=23.5Gi,disk=0Mi,gpu=2"
    assert render.resources(job_pb2.Resources(cpu=1, mem="1Gi", disk="100Gi")) == "cpu=1,mem=1Gi,disk=100Gi"
    # a GPU host's allocation shows its GPUs even when none is in use
    none_held = job_pb2.Resources(cpu=0, mem="0Mi", disk="0Mi")
    assert render.resources(none_held, disk=True, gpu=True) == "cpu=0,mem=0Mi,disk=0Mi,gpu=0"


@pytest.mark.parametrize(("reason", "message", "shown"), [
    ("killed", "killed", "killed"), ("failed", "exit code 3", "failed: exit code 3"), ("", "exit code 1", "exit code 1"),
    ("lost", "", "lost"), ("preempted", "preempted by /a", "preempted by /a"), ("", "", "")])
def test_an_event_detail_says_a_thing_once(reason: str, message: str, shown: str) -> None:
    assert render.detail(reason, message) == shown


def test_ranges() -> None:
    assert render.ranges([]) == ""
    assert render.ranges([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    assert render.ranges(list(range(0, 40, 2))) == "0,2,4,6,8,10,12,14,... (+12 ranges)"


def _job(states: list[str], gang_size: int) -> tuple[job_pb2.Job, list[task_pb2.TaskInfo]]:
    job = job_pb2.Job(id="j", spec=job_pb2.JobSpec(name="n", instances=len(states)))
    job.status.state = "RUNNING"
    gangs = [list(range(gang_size))] + [[i] for i in range(gang_size, len(states))]
    for idx, members in enumerate(gangs):
        job.status.gangs.add(index=idx, instances=members, state="RUNNING" if states[members[0]] == "RUNNING"
                             else "QUEUED", attempt=1, run=1, reason="" if states[members[0]] == "RUNNING" else "busy")
    tasks = [task_pb2.TaskInfo(instance=i, state=s, attempt=1, host=f"h{i % 3}" if s == "RUNNING" else "")
             for i, s in enumerate(states)]
    return job, tasks


def test_a_small_job_has_a_row_per_task() -> None:
    view = render.job_view(*_job(["RUNNING"] * 4, 4))
    assert "Tasks:\nINSTANCE  STATE" in view and view.count("\n0  ") + view.count("\n3  ") == 2
    assert "--all" not in view


def test_a_big_job_is_summarised_by_state_in_ranges_and_all_shows_every_row() -> None:
    states = ["RUNNING"] * 16 + ["PENDING"] * 10 + ["SUCCEEDED"] * 4
    states[20] = "RUNNING"
    job, tasks = _job(states, 10)
    tasks[28].exit_code = 0
    tasks[28].message = tasks[29].message = "exit code 0"
    tasks[29].exit_code = 0
    tasks[26].exit_code, tasks[26].message = 0, "exit code 0"
    tasks[27].exit_code, tasks[27].message = 0, "exit code 0"
    view = render.job_view(job, tasks)
    assert "Tasks:     30 (9 PENDING, 17 RUNNING, 4 SUCCEEDED); by state and outcome (--all: a row per task):" in view
    rows = view.split("INSTANCES  ")[1].splitlines()[1:]
    assert [r.split()[:4] for r in rows] == [["0-15,20", "RUNNING", "17", "3"], ["16-19,21-25", "PENDING", "9", "-"],
                                             ["26-29", "SUCCEEDED", "4", "-"]]
    assert rows[2].split()[-3:] == ["exit", "code", "0"]
    assert "  gang 0 (instances 0-9): RUNNING, attempt 1" in view
    assert "  gangs 1-6,11 (7 gangs, instances 10-15,20): RUNNING, attempt 1" in view
    assert "  gangs 7-10,12-20 (13 gangs, instances 16-19,21-29): QUEUED, attempt 1\n    why: busy" in view
    every = render.job_view(job, tasks, every_row=True)
    assert "Tasks:\nINSTANCE" in every and len(every.split("Tasks:\n")[1].splitlines()) == 31
    assert every.count("  gang ") == 21


def test_varied_outcomes_are_grouped_by_state_alone() -> None:
    job, tasks = _job(["FAILED"] * 30, 30)
    for t in tasks:
        t.exit_code, t.message = t.instance, f"exit code {t.instance}"
    rows = render.job_view(job, tasks).split("INSTANCES  ")[1].splitlines()[1:]
    assert len(rows) == 1 and rows[0].split()[:3] == ["0-29", "FAILED", "30"]
    assert rows[0].endswith("*     (30 different outcomes)")


def _planned(gang_state: str) -> str:
    job = job_pb2.Job(id="j", spec=job_pb2.JobSpec(name="n", instances=2))
    job.status.state = "SUCCEEDED" if gang_state == "DONE" else "RUNNING"
    g = job.status.gangs.add(index=0, instances=[0, 1], state=gang_state, attempt=1, run=1)
    g.plan.gpus_per_host.append(2)
    g.plan.local_bsz, g.plan.step_time, g.plan.samples_per_s = 8, 0.715, 22.4
    return render.job_view(job, [task_pb2.TaskInfo(instance=i, state="RUNNING", attempt=1) for i in range(2)])


def test_a_plans_speed_is_not_reported_yet_only_while_the_gang_has_not_ended() -> None:
    """The daemon reads the members' $PELOTON_METRICS_FILE only while the gang runs: a finished gang whose members
    did report (the tutorial's bert-small) must not read as if they never wrote, and `model refit --from-job`
    refuses it, so the view says when to measure instead."""
    assert "measured: not reported yet (a member writes step_time=SECONDS to $PELOTON_METRICS_FILE)" in \
        _planned("RUNNING")
    done = _planned("DONE")
    assert "not reported yet" not in done
    assert "measured: read only while the gang runs (model refit --from-job then)" in done
