"""The console's query parameters (peloton/console/params.py, pure): what a list asks for, and each wrong
parameter refused with its name."""

from __future__ import annotations

import pytest

from peloton.console import params
from peloton.errors import InvalidArgument


def test_a_job_query_reads_filters_and_page() -> None:
    q = params.job_query({"state": ["running,PENDING", "RUNNING"], "owner": ["alice"], "pool": ["/research"],
                          "q": ["resnet"], "page_size": ["20"], "page_token": ["eyJhIjoxfQ=="]})
    assert q == params.JobQuery(("RUNNING", "PENDING"), "alice", "/research", "resnet", 20, "eyJhIjoxfQ==")
    assert params.job_query({}) == params.JobQuery(page_size=params.DEFAULT_PAGE_SIZE)


@pytest.mark.parametrize(("query", "field"), [
    ({"state": ["RUNNING,NAPPING"]}, "state"),
    ({"page_size": ["501"]}, "page_size"),
    ({"page_size": ["1.5"]}, "page_size"),
    ({"page_token": ["a b"]}, "page_token"),
    ({"owner": ["a\x00b"]}, "owner"),
    ({"owner": ["a", "b"]}, "owner"),
    ({"pool": ["x"]}, "pool"),
    ({"sort": ["name"]}, "sort"),
])
def test_a_wrong_job_query_names_its_parameter(query: dict[str, list[str]], field: str) -> None:
    with pytest.raises(InvalidArgument) as e:
        params.job_query(query)
    assert e.value.field == field and str(e.value).startswith(field + ":")


def test_a_host_query_and_its_bounds() -> None:
    assert params.host_query({"rack": ["r1"], "status": ["drained"], "page_token": ["WyJyMSIsICJoIl0="],
                              "page_size": ["10"], "label": ["gpu_model=a100"], "q": ["sim-"],
                              "free_gpus": ["2"]}) == \
        params.HostQuery("r1", "drained", "gpu_model=a100", "sim-", 2, 10, "WyJyMSIsICJoIl0=")
    assert params.host_query({}) == params.HostQuery()
    for query, field in (({"status": ["asleep"]}, "status"), ({"page": ["1"]}, "page"),
                         ({"page_token": ["a b"]}, "page_token"), ({"free_gpus": ["-1"]}, "free_gpus"),
                         ({"label": ["=x"]}, "label"), ({"q": ["a\x01"]}, "q"),
                         ({"page_size": [str(params.MAX_HOST_PAGE + 1)]}, "page_size")):
        with pytest.raises(InvalidArgument) as e:
            params.host_query(query)
        assert e.value.field == field


def test_watched_jobs_are_job_ids_and_bounded() -> None:
    assert params.watch_jobs({"job": ["0123456789ab,0123456789ab", "ba9876543210"]}) == ("0123456789ab",
                                                                                          "ba9876543210")
    with pytest.raises(InvalidArgument, match="job: a job id"):
        params.watch_jobs({"job": ["../etc"]})
    many = ",".join(f"{i:012x}" for i in range(params.MAX_WATCH_JOBS + 1))
    with pytest.raises(InvalidArgument, match="at most"):
        params.watch_jobs({"job": [many]})


@pytest.mark.parametrize(("header", "point"), [
    ("3f2a:17", ("3f2a", 17)),
    ("", ("", 0)),
    ("17", ("", 0)),
    ("3f2a:", ("", 0)),
    ("3f2a:-1", ("", 0)),
    ("a b:1", ("", 0)),
    ("3f2a:" + "9" * 30, ("", 0)),
])
def test_a_last_event_id_resumes_only_when_it_is_one_the_console_sent(header: str, point: tuple[str, int]) -> None:
    assert params.resume_point(header) == point


def test_host_names() -> None:
    assert params.hostname("sim-00001.rack-2") == "sim-00001.rack-2"
    for bad in ("", "-x", "a/b", "a b", "x" * 300):
        with pytest.raises(InvalidArgument):
            params.hostname(bad)


def test_an_audit_query_and_its_bounds() -> None:
    assert params.audit_query({"principal": ["victor"], "denied": ["1"], "limit": ["10"], "before": ["77"]}) == \
        params.AuditQuery("victor", "", True, 10, 77)
    assert params.audit_query({}) == params.AuditQuery()
    for query, field in (({"denied": ["true"]}, "denied"), ({"limit": ["1001"]}, "limit"),
                         ({"before": ["x"]}, "before"), ({"since": ["1"]}, "since")):
        with pytest.raises(InvalidArgument) as e:
            params.audit_query(query)
        assert e.value.field == field


def test_a_log_query_reads_from_the_tail_or_an_offset() -> None:
    assert params.log_query({}) == params.LogQuery("stdout", None, 0)
    assert params.log_query({"stream": ["stderr"], "offset": ["0"], "run": ["2"]}) == params.LogQuery("stderr", 0, 2)
    for query, field in (({"stream": ["metrics"]}, "stream"), ({"offset": ["-1"]}, "offset"),
                         ({"offset": ["x"]}, "offset"), ({"run": ["-2"]}, "run"), ({"tail": ["5"]}, "tail"),
                         ({"offset": ["1", "2"]}, "offset")):
        with pytest.raises(InvalidArgument) as e:
            params.log_query(query)
        assert e.value.field == field, query


def test_a_job_events_limit_and_a_gang_index() -> None:
    assert params.events_limit({}) == 200 and params.events_limit({"limit": ["1000"]}) == 1000
    assert params.gang_index("12") == 12
    for bad, fn, field in (({"limit": ["0"]}, params.events_limit, "limit"), ({"limit": ["1001"]},
                           params.events_limit, "limit"), ({"since": ["1"]}, params.events_limit, "since")):
        with pytest.raises(InvalidArgument) as e:
            fn(bad)
        assert e.value.field == field
    for text in ("x", "-1", "12345678"):
        with pytest.raises(InvalidArgument) as e:
            params.gang_index(text)
        assert e.value.field == "gang"


def test_a_drain_deadline_is_a_duration_from_now_or_none() -> None:
    assert params.drain_deadline({}) is None and params.drain_deadline({"deadline": [" "]}) is None
    assert params.drain_deadline({"deadline": ["1h30m"]}) == 5400.0
    for bad in (["soon"], ["0s"], ["400d"], ["1h", "2h"]):
        with pytest.raises(InvalidArgument) as e:
            params.drain_deadline({"deadline": bad})
        assert e.value.field == "deadline", bad
    with pytest.raises(InvalidArgument) as e:
        params.drain_deadline({"at": ["1h"]})
    assert e.value.field == "at"
