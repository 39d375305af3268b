"""Trace and cluster-shape readers (peloton/replay/traces.py): the real public files, and hostile ones."""

from __future__ import annotations

import csv
import io

import pytest

from peloton.errors import InvalidArgument
from peloton.replay.traces import check_fits, parse_cluster, read_cluster_file, read_trace
from peloton.replay.work import KNOWN
from tests.public_data import require

PUBLIC = require()
WORKLOADS = sorted((PUBLIC / "adaptdl" / "workloads").glob("workload-*.csv"))
TIRESIAS = PUBLIC / "tiresias" / "60_job.csv"


def _raw_rows(path_text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(path_text)))


def test_the_eight_pollux_workloads_read_whole_and_sorted() -> None:
    assert len(WORKLOADS) == 8
    for path in WORKLOADS:
        text = path.read_text()
        jobs = read_trace(text, "pollux", str(path), KNOWN)
        raw = _raw_rows(text)
        assert len(jobs) == len(raw) == 160
        assert [j.submit_s for j in jobs] == sorted(j.submit_s for j in jobs)
        by_name = {r["name"]: r for r in raw}
        for j in jobs:
            r = by_name[j.name]
            assert (j.submit_s, j.application, j.gpus, j.batch_size) == (
                float(r["time"]), r["application"], int(r["num_replicas"]), int(r["batch_size"]))
            assert j.work is None and j.unit is None  # work.py's per-application rule gives it
            assert 0 <= j.submit_s <= 8 * 3600
        apps = {j.application for j in jobs}
        assert apps <= {"bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3"}
        assert ("imagenet" in apps) == (path.name != "workload-3.csv")  # SOURCES.md: workload-3 has none


@pytest.mark.parametrize("newline", [None, ""])  # text mode turns CRLF into LF; newline="" keeps it
def test_the_tiresias_trace_reads_with_its_crlf(newline: str | None) -> None:
    with open(TIRESIAS, newline=newline) as f:
        text = f.read()
    assert ("\r\n" in text) == (newline == "")
    jobs = read_trace(text, "tiresias", str(TIRESIAS), KNOWN)
    raw = _raw_rows(TIRESIAS.read_text())
    assert len(jobs) == 60
    assert sum(j.work or 0 for j in jobs) == sum(float(r["duration"]) for r in raw)
    assert sum(j.gpus for j in jobs) == sum(int(r["num_gpu"]) for r in raw)
    assert {j.unit for j in jobs} == {"seconds"}
    assert [j.name for j in jobs][:3] == ["job-0", "job-1", "job-2"]
    assert jobs[1].application == "vgg11" and jobs[1].gpus == 8 and jobs[1].submit_s == 30


@pytest.mark.parametrize(("name", "hosts", "gpus", "racks", "cpus", "mem"), [
    ("n1g4", 1, 4, 1, 40, 256), ("n32g4", 32, 4, 1, 40, 256), ("n160g8", 160, 8, 5, 128, 256),
    ("n256g8", 256, 8, 8, 64, 256), ("cluster_spec", 16, 4, 1, 128, 254)])
def test_the_tiresias_cluster_files(name: str, hosts: int, gpus: int, racks: int, cpus: int, mem: int) -> None:
    shape = read_cluster_file((PUBLIC / "tiresias" / f"{name}.csv").read_text(), name)
    assert (shape.hosts, shape.gpus_per_host, shape.racks, shape.cpus_per_host, shape.mem_gb_per_host) == (
        hosts, gpus, racks, cpus, mem)
    if racks > 1:  # a switch is a rack of num_node_p_switch hosts
        assert [shape.rack_of(h) for h in (0, 31, 32, hosts - 1)] == [0, 0, 1, racks - 1]


def test_cluster_shapes_from_the_command_line() -> None:
    s = parse_cluster("16x4")
    assert (s.hosts, s.gpus_per_host, s.gpus, s.racks) == (16, 4, 64, 1)
    assert (s.cpus_per_host, s.mem_gb_per_host, s.gpu_model, s.nic_gbps) == (48, 192.0, "t4", 50.0)
    three = parse_cluster(" 16X4 ", racks=3)
    assert [sum(1 for h in range(16) if three.rack_of(h) == r) for r in range(3)] == [6, 5, 5]
    assert [three.rack_of(h) for h in range(16)] == sorted(three.rack_of(h) for h in range(16))
    with pytest.raises(InvalidArgument, match="host 16 is not"):
        three.rack_of(16)


@pytest.mark.parametrize(("text", "racks", "match"), [
    ("16", 1, "not HOSTSxGPUS"), ("16x4x2", 1, "not HOSTSxGPUS"), ("0x4", 1, "at least one host"),
    ("16x0", 1, "at least one host"), ("-1x4", 1, "not HOSTSxGPUS"), ("16x4", 0, "racks: 0"),
    ("16x4", 17, "racks: 17"), ("", 1, "not HOSTSxGPUS")])
def test_bad_cluster_shapes(text: str, racks: int, match: str) -> None:
    with pytest.raises(InvalidArgument, match=match):
        parse_cluster(text, racks)


def test_bad_cluster_file_names_the_column() -> None:
    with pytest.raises(InvalidArgument, match=r"c.csv: row 1 \(line 2\), column num_gpu_p_node: expected a positive"):
        read_cluster_file("num_switch,num_node_p_switch,num_gpu_p_node,num_cpu_p_node,mem_p_node\n1,2,0,4,8", "c.csv")
    with pytest.raises(InvalidArgument, match="more than 1 rows"):
        read_cluster_file("num_switch,num_node_p_switch,num_gpu_p_node,num_cpu_p_node,mem_p_node\n1,2,3,4,8\n"
                          "1,2,3,4,8\n", "c.csv")


POLLUX_HEADER = "name,time,application,num_replicas,batch_size\n"


@pytest.mark.parametrize(("body", "match"), [
    ("a,-1,bert,4,384\n", r"t.csv: row 1 \(line 2\), column time: expected a non-negative number, got '-1'"),
    ("a,1,bert,x,384\n", r"row 1 \(line 2\), column num_replicas: expected a number, got 'x'"),
    ("a,1,bert,0,384\n", "column num_replicas: expected a positive number"),
    ("a,1,bert,2.5,384\n", "column num_replicas: expected a whole number"),
    ("a,nan,bert,2,384\n", "column time: expected a non-negative number, got 'nan'"),
    ("a,inf,bert,2,384\n", "column time: expected a non-negative number, got 'inf'"),
    ("a,1000000000.5,bert,2,384\n", r"row 1 \(line 2\), column time: 1000000000.5 seconds is more than the "
                                   r"1000000000 \(about 31.7 years\)"),
    ("a,1,gpt5,2,384\n", "column application: unknown application 'gpt5' .known: alexnet, bert"),
    ("a,1,bert,2\n", r"row 1 \(line 2\): 4 columns, the header has 5"),
    ("a,1,bert,2,384\nb,2,bert,2,384\na,3,bert,2,384\n",
     r"row 3 \(line 4\), column name: 'a' is already the name of row 1 \(line 2\)"),
    (",1,bert,2,384\n", "column name: empty"),
    ("a\x07b,1,bert,2,384\n", "column name: .* printable"),
    ("a,1,bert,2,99999999999\n", "column batch_size: 99999999999 is more than"),
    ("a,1,bert,70000,384\n", "column num_replicas: 70000 is more than 4096"),
    ("a,1,bert,4097,384\n", "column num_replicas: 4097 is more than 4096"),  # a gang's most members (the spec's)
    # a cell larger than the csv module's field limit: refused naming the file and line, not a csv.Error
    ("a,1,bert,2,384\nb,2,bert,2," + "1" * 200_000 + "\n", r"t.csv: row 2 \(line 3\): .*field larger than"),
    ("", "no rows after the header"),
])
def test_bad_pollux_rows_name_the_row_and_column(body: str, match: str) -> None:
    with pytest.raises(InvalidArgument, match=match):
        read_trace(POLLUX_HEADER + body, "pollux", "t.csv", KNOWN)


@pytest.mark.parametrize(("text", "match"), [
    ("", "t.csv: empty"),
    ("name,time,application,num_replicas\na,1,bert,2\n", "header has no batch_size column"),
    ("name,time,app,num_replicas,batch_size\n", "unknown column 'app'"),
    # two `time` columns: which one is the submit time? (the last one was taken, silently)
    ("name,time,application,num_replicas,batch_size,time\na,5,bert,1,12,7\n", "header: column 'time' twice"),
])
def test_bad_pollux_files(text: str, match: str) -> None:
    with pytest.raises(InvalidArgument, match=match):
        read_trace(text, "pollux", "t.csv", KNOWN)


def test_bom_crlf_blank_lines_and_unsorted_rows() -> None:
    text = "\ufeff" + POLLUX_HEADER.replace("\n", "\r\n") + "b,20,bert,2,384\r\n\r\na,10,cifar10,4,2048\r\nc,10,ncf,1,32768\r\n"
    jobs = read_trace(text, "pollux", "t.csv", KNOWN)
    # sorted by submit time, ties in the file's order; `row` is the file's (the blank line counts as one)
    assert [(j.name, j.row) for j in jobs] == [("a", 3), ("c", 4), ("b", 1)]


TIRESIAS_HEADER = "job_id,num_gpu,submit_time,iterations,model_name,duration,interval\n"


@pytest.mark.parametrize(("body", "match"), [
    ("0,1,0,606,vgg19,0,30\n", "column duration: expected a positive number, got '0'"),
    ("0,1,0,6.5,vgg19,10,30\n", "column iterations: expected a whole number"),
    ("0,1,0,606,vgg99,10,30\n", "column model_name: unknown application 'vgg99'"),
    ("0,1,-3,606,vgg19,10,30\n", "column submit_time: expected a non-negative"),
    ("0,1,0,606,vgg19,10,-1\n", "column interval: expected a non-negative"),
    ("0,1,0,606,vgg19,10,30\n0,2,5,606,vgg16,10,30\n", r"row 2 \(line 3\), column job_id: '0' is already the job of "
                                                     r"row 1 \(line 2\)$"),
    # Tiresias reads a job_id of digits as a number: "1" and "01" are one job (were two: job-1 and job-01)
    ("1,1,0,606,vgg19,10,30\n01,2,5,606,vgg16,10,30\n", r"row 2 \(line 3\), column job_id: '01' is already the job of "
                                                      r"row 1 \(line 2\) \('1': Tiresias reads both as the number 1\)"),
    # times past 1e9 s: the replay's float clock rounded them (near 1e15, to 1/8 s: a 0.3 s run lasted 0.25 s)
    ("0,1,1e15,606,vgg19,10,30\n", r"row 1 \(line 2\), column submit_time: 1e15 seconds is more than the 1000000000 "),
    ("0,1,0,606,vgg19,1000000001,30\n", r"row 1 \(line 2\), column duration: 1000000001 seconds is more than "),
])
def test_bad_tiresias_rows(body: str, match: str) -> None:
    with pytest.raises(InvalidArgument, match=match):
        read_trace(TIRESIAS_HEADER + body, "tiresias", "t.csv", KNOWN)


def test_tiresias_ids_are_names_as_given_and_one_job_as_tiresias_reads_them() -> None:
    jobs = read_trace(TIRESIAS_HEADER + "a1,1,0,606,vgg19,10,30\na01,1,0,606,vgg19,10,30\n007,1,1,606,vgg19,10,30\n"
                      "1000000000,1,1000000000,606,vgg19,1000000000,30\n", "tiresias", "t.csv", KNOWN)
    # not digits: compared as given; digits: named as given (job-007), one job with any other spelling of 7
    assert [j.name for j in jobs] == ["job-a1", "job-a01", "job-007", "job-1000000000"]
    assert (jobs[-1].submit_s, jobs[-1].work) == (1e9, 1e9)  # the bound itself is taken
    with pytest.raises(InvalidArgument, match=r"'7' is already the job of row 3 \(line 4\) \('007'"):
        read_trace(TIRESIAS_HEADER + "a1,1,0,606,vgg19,10,30\na01,1,0,606,vgg19,10,30\n007,1,1,606,vgg19,10,30\n"
                   "7,1,1,606,vgg19,10,30\n", "tiresias", "t.csv", KNOWN)


PELOTON_HEADER = "name,submit_s,gpus,application,work,unit,batch_size,pool,priority,min_gpus,max_gpus\n"


def test_peloton_format_all_columns_and_the_short_form() -> None:
    jobs = read_trace(PELOTON_HEADER + "a,5,8,bert,1000,iterations,384,research,2,4,16\n"
                      "b,0,1,ncf,3600,seconds,,,,,\n", "peloton", "p.csv", KNOWN)
    assert [j.name for j in jobs] == ["b", "a"]
    a = jobs[1]
    assert (a.work, a.unit, a.batch_size, a.pool, a.priority, a.min_gpus, a.max_gpus) == (
        1000, "iterations", 384, "research", 2, 4, 16)
    assert (jobs[0].pool, jobs[0].priority, jobs[0].batch_size, jobs[0].min_gpus) == (None, None, None, None)
    short = read_trace("name,submit_s,gpus,application,work,unit\nx,0,4,cifar10,5e6,samples\n", "peloton", "p", KNOWN)
    assert short[0].work == 5e6 and short[0].unit == "samples"


@pytest.mark.parametrize(("row", "match"), [
    ("a,0,4,bert,100,epochs,,,,,", "column unit: 'epochs' is not one of samples, iterations, seconds"),
    ("a,0,4,bert,100,iterations,,,,,", "column batch_size: needed when unit is iterations"),
    ("a,0,4,bert,0,samples,,,,,", "column work: expected a positive number"),
    ("a,2e9,4,bert,100,samples,,,,,", r"row 1 \(line 2\), column submit_s: 2e9 seconds is more than the 1000000000"),
    ("a,0,4,bert,1e10,seconds,,,,,", r"row 1 \(line 2\), column work: 1e10 seconds is more than the 1000000000"),
    ("a,0,4,bert,100,samples,,,high,,", "column priority: expected a whole number, got 'high'"),
    # sla.priority is an int32: refused here, naming the row, not by the spec once the replay has begun
    ("a,0,4,bert,100,samples,,,2147483648,,", r"row 1 \(line 2\), column priority: 2147483648 is not within "
                                              r"-2147483648..2147483647"),
    ("a,0,4,bert,100,samples,,,,,5000", "column max_gpus: 5000 is more than 4096"),
    # a pool the replay could not create: refused when read, naming the row (it failed once the replay began)
    ("a,0,4,bert,100,samples,,c d,,,", r"row 1 \(line 2\), column pool: 'c d' is not a pool path"),
    ("a,0,4,bert,100,samples,,,,8,", r"column min_gpus: gpus \(4\) must lie within min_gpus..max_gpus \(8..4\)"),
    ("a,0,4,bert,100,samples,,,,,2", r"column max_gpus: gpus \(4\) must lie within min_gpus..max_gpus \(4..2\)"),
])
def test_bad_peloton_rows(row: str, match: str) -> None:
    with pytest.raises(InvalidArgument, match=match):
        read_trace(PELOTON_HEADER + row + "\n", "peloton", "p.csv", KNOWN)


def test_unknown_format() -> None:
    with pytest.raises(InvalidArgument, match="format: 'philly' is not one of pollux, tiresias, peloton"):
        read_trace(POLLUX_HEADER, "philly", "t.csv", KNOWN)



def test_a_gang_larger_than_the_cluster_is_refused_naming_its_row() -> None:
    jobs = read_trace((PUBLIC / "tiresias" / "60_job.csv").read_text(), "tiresias", "60_job.csv", KNOWN)
    check_fits(jobs, parse_cluster("16x4"), "60_job.csv")  # the largest gang is 8
    with pytest.raises(InvalidArgument, match=r"60_job.csv: row 2, job job-1: 8 GPUs, more than the cluster's 4 "
                                              r"\(1 x 4\)"):
        check_fits(jobs, read_cluster_file((PUBLIC / "tiresias" / "n1g4.csv").read_text(), "n1g4"), "60_job.csv")
