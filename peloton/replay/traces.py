"""Traces and cluster shapes as plain data (docs/scheduling-quality.md, "Traces and their formats").

Three trace formats become one list of `TraceJob`, sorted by submit time (ties keep the file's order):
- `pollux`: the Pollux artifact's `name,time,application,num_replicas,batch_size` (adaptdl/workloads); no work
  amount: work.py's per-application rule gives it.
- `tiresias`: `job_id,num_gpu,submit_time,iterations,model_name,duration,interval` (Tiresias's 60_job.csv); the
  duration becomes work at a reference placement (work.py).
- `peloton`: `name,submit_s,gpus,application,work,unit[,batch_size,pool,priority,min_gpus,max_gpus]`, ours.

Cluster shapes: `HxG` (hosts x GPUs per host) or a Tiresias cluster file
(`num_switch,num_node_p_switch,num_gpu_p_node,num_cpu_p_node,mem_p_node`; a switch is a rack).

A bad row is refused with InvalidArgument naming the source, the row (1 = the first after the header; the file's
line is shown too) and the column; nothing is returned in part. The text is handed in: no file is opened here.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

from peloton.domain import limits
from peloton.domain.spec import validate_pool_path
from peloton.errors import InvalidArgument
from peloton.modelaware.profile import csv_rows

FORMATS = ("pollux", "tiresias", "peloton")
UNITS = ("samples", "iterations", "seconds")
MAX_TRACE_ROWS = 1_000_000
MAX_NAME_CHARS = 128
MAX_GPUS_PER_JOB = limits.MAX_GANG_SIZE  # a trace job is one gang of one-GPU members: the most a gang may have
# A submit time, and a duration, in seconds: at most 1e9 (about 31.7 years). The replay's clock is a float of
# seconds from an epoch (driver.EPOCH, 1.7e9), and orders jobs submitted together a microsecond apart: past ~8.6e9
# in all a float's step is over 2 us, and near 1e15 it is 1/8 s, so durations came out rounded (0.3 s ran 0.25 s).
MAX_TRACE_SECONDS = 1e9

POLLUX_COLUMNS = ("name", "time", "application", "num_replicas", "batch_size")
TIRESIAS_COLUMNS = ("job_id", "num_gpu", "submit_time", "iterations", "model_name", "duration", "interval")
PELOTON_COLUMNS = ("name", "submit_s", "gpus", "application", "work", "unit", "batch_size", "pool", "priority",
                   "min_gpus", "max_gpus")
PELOTON_REQUIRED = 6
CLUSTER_COLUMNS = ("num_switch", "num_node_p_switch", "num_gpu_p_node", "num_cpu_p_node", "mem_p_node")

# `--cluster HxG` hosts: the Pollux testbed's worker, an AWS g4dn.12xlarge (4 x T4, 48 vCPUs, 192 GiB, 50 Gb/s;
# shared/data/public/SOURCES.md).
DEFAULT_CPUS_PER_HOST = 48
DEFAULT_MEM_GB_PER_HOST = 192.0
DEFAULT_GPU_MODEL = "t4"
DEFAULT_NIC_GBPS = 50.0
DEFAULT_GPU_LINK = "pcie"


@dataclass(frozen=True, slots=True)
class TraceJob:
    name: str
    submit_s: float  # seconds from the trace's start
    application: str  # a key of work.APPLICATIONS
    gpus: int  # the gang the trace asked for
    batch_size: int | None = None  # global batch (samples per step over the gang); None: the application's default
    work: float | None = None  # in `unit`; None: work.py's per-application rule (Pollux)
    unit: str | None = None  # samples, iterations (steps of batch_size) or seconds (at the reference placement)
    pool: str | None = None
    priority: int | None = None
    min_gpus: int | None = None  # elastic bounds (policy `auto`); None: exactly `gpus`
    max_gpus: int | None = None
    row: int = 0  # the row of the file it came from (1 = the first after the header)


@dataclass(frozen=True, slots=True)
class ClusterShape:
    hosts: int
    gpus_per_host: int
    racks: int = 1  # hosts are dealt to racks in order, as evenly as they go
    cpus_per_host: int = DEFAULT_CPUS_PER_HOST
    mem_gb_per_host: float = DEFAULT_MEM_GB_PER_HOST
    gpu_model: str = DEFAULT_GPU_MODEL
    nic_gbps: float = DEFAULT_NIC_GBPS
    gpu_link: str = DEFAULT_GPU_LINK

    @property
    def gpus(self) -> int:
        return self.hosts * self.gpus_per_host

    def rack_of(self, host: int) -> int:
        """The rack of host `host` (0-based): contiguous blocks, the first `hosts % racks` one host larger."""
        if not 0 <= host < self.hosts:
            raise InvalidArgument(f"host {host} is not in a cluster of {self.hosts} hosts", field="host")
        size, extra = divmod(self.hosts, self.racks)
        big = extra * (size + 1)
        return host // (size + 1) if host < big else extra + (host - big) // size


def _text(raw: str) -> str:
    return raw[1:] if raw.startswith("\ufeff") else raw  # a BOM (spreadsheets write one) is not part of the header


def _number(where: str, column: str, text: str, *, integer: bool = False, positive: bool = False) -> float:
    try:
        v = float(text)
    except ValueError:
        raise InvalidArgument(f"{where}, column {column}: expected a number, got {text!r}", field=column) from None
    if not math.isfinite(v) or v < 0 or (positive and v == 0):
        raise InvalidArgument(f"{where}, column {column}: expected a {'positive' if positive else 'non-negative'} "
                              f"number, got {text!r}", field=column)
    if integer and v != int(v):
        raise InvalidArgument(f"{where}, column {column}: expected a whole number, got {text!r}", field=column)
    return v


def _seconds(where: str, column: str, text: str, *, positive: bool = False) -> float:
    """A time in seconds (a submit time from the trace's start, a duration): a number up to MAX_TRACE_SECONDS."""
    v = _number(where, column, text, positive=positive)
    if v > MAX_TRACE_SECONDS:
        raise InvalidArgument(f"{where}, column {column}: {text} seconds is more than the {MAX_TRACE_SECONDS:.0f} "
                              "(about 31.7 years) a trace's times may have (submit times count from the trace's "
                              "start: a trace of Unix times needs its first subtracted)", field=column)
    return v


def _count(where: str, column: str, text: str, *, limit: int = MAX_GPUS_PER_JOB) -> int:
    n = int(_number(where, column, text, integer=True, positive=True))
    if n > limit:
        raise InvalidArgument(f"{where}, column {column}: {n} is more than {limit}", field=column)
    return n


def _name(where: str, column: str, text: str) -> str:
    if not text:
        raise InvalidArgument(f"{where}, column {column}: empty", field=column)
    if len(text) > MAX_NAME_CHARS or not text.isprintable():
        raise InvalidArgument(f"{where}, column {column}: {text[:40]!r} is not a name of at most {MAX_NAME_CHARS} "
                              "printable characters", field=column)
    return text


def _pool(where: str, text: str) -> str:
    """A pool's name (`research`) or path (`/research`, `/team/sub`): what the replay can create or find."""
    name = _name(where, "pool", text)
    try:
        validate_pool_path(name if name.startswith("/") else f"/{name}", "pool")
    except InvalidArgument:
        raise InvalidArgument(f"{where}, column pool: {name!r} is not a pool path (letters, digits, _ . - "
                              "between slashes)", field="pool") from None
    if name.strip("/") == "":
        raise InvalidArgument(f"{where}, column pool: the root pool takes no jobs", field="pool")
    return name


def _application(where: str, column: str, text: str, known: frozenset[str]) -> str:
    if text not in known:
        raise InvalidArgument(f"{where}, column {column}: unknown application {text!r} (known: "
                              f"{', '.join(sorted(known))})", field=column)
    return text


def _row(where: str) -> int:
    m = re.search(r": row (\d+) \(line", where)
    return int(m.group(1)) if m else 0


def _finish(jobs: list[TraceJob], wheres: list[str], source: str) -> list[TraceJob]:
    """Duplicate names refused (naming both rows); sorted by submit time, ties in the file's order."""
    first: dict[str, str] = {}
    for job, where in zip(jobs, wheres, strict=True):
        if job.name in first:
            raise InvalidArgument(f"{where}, column name: {job.name!r} is already the name of {first[job.name]}",
                                  field="name")
        first[job.name] = where.removeprefix(f"{source}: ")
    return sorted(jobs, key=lambda j: j.submit_s)


def read_pollux(text: str, source: str, known: frozenset[str]) -> list[TraceJob]:
    jobs: list[TraceJob] = []
    wheres: list[str] = []
    for where, cell in csv_rows(_text(text), source, POLLUX_COLUMNS, len(POLLUX_COLUMNS),
                                               MAX_TRACE_ROWS):
        jobs.append(TraceJob(
            name=_name(where, "name", cell["name"]),
            submit_s=_seconds(where, "time", cell["time"]),
            application=_application(where, "application", cell["application"], known),
            gpus=_count(where, "num_replicas", cell["num_replicas"]),
            batch_size=_count(where, "batch_size", cell["batch_size"], limit=2**31 - 1),
            row=_row(where)))
        wheres.append(where)
    return _finish(jobs, wheres, source)


def tiresias_job(job_id: str) -> str:
    """The job a Tiresias `job_id` names, as Tiresias's simulator reads it (jobs.py: a value of ASCII digits
    becomes an int): "01" and "1" are one job, "a1" is itself."""
    return str(int(job_id)) if job_id.isascii() and job_id.isdigit() else job_id


def read_tiresias(text: str, source: str, known: frozenset[str]) -> list[TraceJob]:
    """Each job named `job-<job_id>`, the id as given; two rows whose ids name one job (`tiresias_job`: "1",
    "01") are refused, naming both rows."""
    jobs: list[TraceJob] = []
    wheres: list[str] = []
    first: dict[str, tuple[str, str]] = {}  # the job an id names -> (the id as first given, where)
    for where, cell in csv_rows(_text(text), source, TIRESIAS_COLUMNS, len(TIRESIAS_COLUMNS),
                                               MAX_TRACE_ROWS):
        job_id = _name(where, "job_id", cell["job_id"])
        seen = first.setdefault(tiresias_job(job_id), (job_id, where.removeprefix(f"{source}: ")))
        if seen[1] != where.removeprefix(f"{source}: "):
            same = "" if seen[0] == job_id else f" ({seen[0]!r}: Tiresias reads both as the number {int(job_id)})"
            raise InvalidArgument(f"{where}, column job_id: {job_id!r} is already the job of {seen[1]}{same}",
                                  field="job_id")
        gpus = _count(where, "num_gpu", cell["num_gpu"])
        submit = _seconds(where, "submit_time", cell["submit_time"])
        _number(where, "iterations", cell["iterations"], integer=True)  # checked; the duration is what is used
        app = _application(where, "model_name", cell["model_name"], known)
        duration = _seconds(where, "duration", cell["duration"], positive=True)
        _number(where, "interval", cell["interval"])
        jobs.append(TraceJob(name=f"job-{job_id}", submit_s=submit, application=app, gpus=gpus, work=duration,
                             unit="seconds", row=_row(where)))
        wheres.append(where)
    return _finish(jobs, wheres, source)


def read_peloton(text: str, source: str, known: frozenset[str]) -> list[TraceJob]:
    jobs: list[TraceJob] = []
    wheres: list[str] = []
    for where, cell in csv_rows(_text(text), source, PELOTON_COLUMNS, PELOTON_REQUIRED,
                                               MAX_TRACE_ROWS):
        name = _name(where, "name", cell["name"])
        submit = _seconds(where, "submit_s", cell["submit_s"])
        gpus = _count(where, "gpus", cell["gpus"])
        app = _application(where, "application", cell["application"], known)
        unit = cell["unit"]
        if unit not in UNITS:
            raise InvalidArgument(f"{where}, column unit: {unit!r} is not one of {', '.join(UNITS)}", field="unit")
        work = (_seconds if unit == "seconds" else _number)(where, "work", cell["work"], positive=True)
        batch = _count(where, "batch_size", cell["batch_size"], limit=2**31 - 1) if cell.get("batch_size") else None
        if unit == "iterations" and batch is None:
            raise InvalidArgument(f"{where}, column batch_size: needed when unit is iterations (samples = "
                                  "iterations x batch_size)", field="batch_size")
        pool = _pool(where, cell["pool"]) if cell.get("pool") else None
        priority = None
        if cell.get("priority"):
            try:
                priority = int(cell["priority"])
            except ValueError:
                raise InvalidArgument(f"{where}, column priority: expected a whole number, got "
                                      f"{cell['priority']!r}", field="priority") from None
            if not limits.INT32_MIN <= priority <= limits.INT32_MAX:  # sla.priority's range
                raise InvalidArgument(f"{where}, column priority: {priority} is not within {limits.INT32_MIN}.."
                                      f"{limits.INT32_MAX}", field="priority")
        lo = _count(where, "min_gpus", cell["min_gpus"]) if cell.get("min_gpus") else None
        hi = _count(where, "max_gpus", cell["max_gpus"]) if cell.get("max_gpus") else None
        if (lo is not None and lo > gpus) or (hi is not None and hi < gpus):
            col = "min_gpus" if lo is not None and lo > gpus else "max_gpus"
            raise InvalidArgument(f"{where}, column {col}: gpus ({gpus}) must lie within min_gpus..max_gpus "
                                  f"({lo or gpus}..{hi or gpus})", field=col)
        jobs.append(TraceJob(name=name, submit_s=submit, application=app, gpus=gpus, batch_size=batch, work=work,
                             unit=unit, pool=pool, priority=priority, min_gpus=lo, max_gpus=hi, row=_row(where)))
        wheres.append(where)
    return _finish(jobs, wheres, source)


READERS: dict[str, Callable[[str, str, frozenset[str]], list[TraceJob]]] = {
    "pollux": read_pollux, "tiresias": read_tiresias, "peloton": read_peloton}


def read_trace(text: str, fmt: str, source: str, known: frozenset[str]) -> list[TraceJob]:
    """The jobs of a trace's CSV `text` in format `fmt`, sorted by submit time; `known`: the applications
    work.py has a cost model for (work.APPLICATIONS)."""
    reader = READERS.get(fmt)
    if reader is None:
        raise InvalidArgument(f"format: {fmt!r} is not one of {', '.join(FORMATS)}", field="format")
    return reader(text, source, known)


_SHAPE = re.compile(r"\s*(\d{1,6})\s*[xX]\s*(\d{1,4})\s*")


def parse_cluster(text: str, racks: int = 1, field: str = "cluster") -> ClusterShape:
    """`16x4`: 16 hosts of 4 GPUs each, the default host hardware, dealt to `racks` racks."""
    m = _SHAPE.fullmatch(text)
    if m is None:
        raise InvalidArgument(f"{field}: {text!r} is not HOSTSxGPUS (like 16x4)", field=field)
    hosts, gpus = int(m.group(1)), int(m.group(2))
    if hosts < 1 or gpus < 1:
        raise InvalidArgument(f"{field}: {text!r} needs at least one host and one GPU per host", field=field)
    if not 1 <= racks <= hosts:
        raise InvalidArgument(f"racks: {racks} is not within 1..{hosts} (the hosts)", field="racks")
    return ClusterShape(hosts=hosts, gpus_per_host=gpus, racks=racks)


def read_cluster_file(text: str, source: str) -> ClusterShape:
    """A Tiresias cluster file: one row; each switch is a rack of `num_node_p_switch` hosts."""
    rows = list(csv_rows(_text(text), source, CLUSTER_COLUMNS, len(CLUSTER_COLUMNS), 1))
    where, cell = rows[0]
    switches = _count(where, "num_switch", cell["num_switch"], limit=100_000)
    per = _count(where, "num_node_p_switch", cell["num_node_p_switch"], limit=100_000)
    gpus = _count(where, "num_gpu_p_node", cell["num_gpu_p_node"], limit=256)
    cpus = _count(where, "num_cpu_p_node", cell["num_cpu_p_node"], limit=100_000)
    mem = _number(where, "mem_p_node", cell["mem_p_node"], positive=True)
    return ClusterShape(hosts=switches * per, gpus_per_host=gpus, racks=switches, cpus_per_host=cpus,
                        mem_gb_per_host=mem)


def check_fits(jobs: list[TraceJob], cluster: ClusterShape, source: str) -> None:
    """A gang larger than the whole cluster would wait forever: refused up front, naming its row."""
    for j in jobs:
        if j.gpus > cluster.gpus:
            raise InvalidArgument(f"{source}: row {j.row}, job {j.name}: {j.gpus} GPUs, more than the cluster's "
                                  f"{cluster.gpus} ({cluster.hosts} x {cluster.gpus_per_host})", field="gpus")
