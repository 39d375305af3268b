"""Several placement engines at once (--placement-engines shared), as separate `--role placement` processes beside
one process of the job manager, resource manager and host manager (sim backend), on SQLite and on PostgreSQL. A
placement process keeps no store of its own (on SQLite it locks only its data dir), so the store is shared the same
way on both. Many gangs compete for a small cluster: every gang runs whole, no GPU is ever given to two tasks at
once, and each engine places some of them. Killed mid-run, an engine's gangs go back to the queue (after its lease)
and the others place them. Claim conflicts between the engines are rare here (an engine dequeues every admitted gang
at once, so one engine usually holds a whole wave; printed with -s): tests/unit/test_placement_engines_shared.py
makes one on purpose."""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from benchmarks.harness import JobWatch, gang_spec
from peloton.api.v1 import job_pb2, job_pb2_grpc, task_pb2, task_pb2_grpc
from tests.e2e.harness import Daemon, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

HOSTS, GPUS = 4, 8  # 32 GPUs: four 4-member gangs of 2 GPUs a member at once
ENGINE_LEASE_S = 3  # --placement-engine-lease (default 10): a killed engine is declared gone sooner
MEMBERS = 4
ENDED = ("SUCCEEDED", "FAILED", "KILLED", "LOST")


@dataclass
class Proc(Daemon):
    role_args: list[str] = field(default_factory=list)

    def server_args(self) -> list[str]:
        return list(self.role_args)


class Cluster:
    def __init__(self, tmp: Path, db_url: str, engines: int) -> None:
        core_dir = tmp / "core"
        sock, secret = f"unix:{core_dir / 'internal.sock'}", str(core_dir / "internal.secret")
        self.core = Proc(core_dir, db_url, role_args=[
            "--role", "jobmgr,resmgr,hostmgr", "--placement-engines", "shared", "--placement-engine-lease",
            str(ENGINE_LEASE_S), "--backend", "sim",
            # one writer: a task's started_at and finished_at are when the job manager wrote its RUNNING and its
            # end, and with a writer per shard of jobs (PostgreSQL's default is 2) one shard may write a gang's
            # RUNNING on a GPU a moment before another writes the end of the task that held it before (seen: 1.2
            # ms), which the double-booking check below would take for two tasks on one GPU at once
            "--jobmgr-writers", "1",
            "--sim-hosts", str(HOSTS), "--sim-host-resources", f"cpu=64,mem=256Gi,gpu={GPUS}", "--sim-seed", "1"])
        self.engines = [Proc(tmp / f"engine-{i}", db_url, role_args=[
            "--role", "placement", "--placement-engines", "shared", "--resmgr", sock, "--hostmgr", sock,
            "--internal-secret-file", secret, "--log-level", "debug"]) for i in range(engines)]

    def start(self) -> None:
        self.core.start()  # first: it serves the internal services and makes the secret
        for e in self.engines:
            e.start()

    def stop(self) -> None:
        for d in (*self.engines, self.core):
            d.stop()


def submit(stub: job_pb2_grpc.JobServiceStub, n: int, name: str) -> list[str]:
    spec = gang_spec(MEMBERS, "train.py", gpu=2, env={"PELOTON_SIM_DURATION": "0.5s"}, name=name)
    return [str(stub.CreateJob(job_pb2.CreateJobRequest(spec=spec), timeout=60).job_id) for _ in range(n)]


def tasks(ch: grpc.Channel, job: str) -> list[task_pb2.TaskInfo]:
    return list(task_pb2_grpc.TaskServiceStub(ch).ListTasks(task_pb2.ListTasksRequest(job_id=job), timeout=60).tasks)


def check_whole_and_never_double_booked(ch: grpc.Channel, jobs: list[str]) -> None:
    """Every gang ran whole (all its members at once, of one attempt) and no (host, GPU) held two tasks at once."""
    held: dict[tuple[str, int], list[tuple[float, float, str]]] = {}
    for job in jobs:
        ts = tasks(ch, job)
        assert [t.state for t in ts] == ["SUCCEEDED"] * MEMBERS, [(t.state, t.reason, t.message) for t in ts]
        assert len({t.attempt for t in ts}) == 1
        assert max(t.started_at for t in ts) < min(t.finished_at for t in ts)  # together, as a gang
        for t in ts:
            assert len(t.gpus) == 2
            for g in t.gpus:
                held.setdefault((t.host, g), []).append((t.started_at, t.finished_at, t.task_id))
    for (host, gpu), spans in held.items():
        spans.sort()
        for (_, end, a), (start, _, b) in zip(spans, spans[1:], strict=False):
            assert start >= end, f"GPU {gpu} of {host} held by {a} and {b} at once"
    assert len(held) == HOSTS * GPUS  # the whole cluster was used


def placed_by(engine: Proc) -> int:
    """Gangs the engine placed (its debug log: `placed N gangs`)."""
    return sum(int(n) for n in re.findall(r"placed (\d+) gangs", engine.log()))


def stale(c: Cluster) -> int:
    """Claims the host manager refused the engines (another engine had taken the hosts), from their debug logs."""
    return sum(int(n) for e in c.engines for n in re.findall(r"placed \d+ gangs \(\d+ unplaced, (\d+) stale\)",
                                                              e.log()))


@contextlib.contextmanager
def cluster_with_watch(tmp: Path, db_url: str, engines: int) -> Iterator[tuple[Cluster, grpc.Channel, JobWatch]]:
    """A started cluster, a channel to its core and a watch of every job; all closed and stopped after the block."""
    c = Cluster(tmp, db_url, engines)
    try:
        c.start()
        with grpc.insecure_channel(c.core.address) as ch:
            watch = JobWatch(ch)
            try:
                yield c, ch, watch
            finally:
                watch.close()
    finally:
        c.stop()


def check_all_succeeded_whole(c: Cluster, ch: grpc.Channel, watch: JobWatch, jobs: list[str]) -> None:
    """Every job ends SUCCEEDED, having run whole and never double-booked a GPU."""
    for j in jobs:
        state, _ = watch.when(j, *ENDED).result(240)
        assert state == "SUCCEEDED", (j, c.core.log()[-3000:])
    check_whole_and_never_double_booked(ch, jobs)


@pytest.mark.parametrize("db_url", ["sqlite", "postgresql"], indirect=True)
def test_two_engines_place_many_gangs_whole_and_never_book_a_gpu_twice(db_url: str, tmp_path: Path) -> None:
    with cluster_with_watch(tmp_path, db_url, engines=2) as (c, ch, watch):
        jobs = submit(job_pb2_grpc.JobServiceStub(ch), 40, "shared")
        check_all_succeeded_whole(c, ch, watch, jobs)
        assert all(placed_by(e) > 0 for e in c.engines), [placed_by(e) for e in c.engines]  # both acted
        assert "2 engines act" in c.core.log()
        print(f"\n{stale(c)} claims refused (engines' conflicts), each a gang placed again")


@pytest.mark.parametrize("db_url", ["sqlite", "postgresql"], indirect=True)
def test_an_engine_killed_mid_run_leaves_its_gangs_to_the_others(db_url: str, tmp_path: Path) -> None:
    with cluster_with_watch(tmp_path, db_url, engines=2) as (c, ch, watch):
        stub = job_pb2_grpc.JobServiceStub(ch)
        jobs = submit(stub, 30, "before")
        wait_until(lambda: placed_by(c.engines[0]) > 0 and placed_by(c.engines[1]) > 0, 120, 0.2,
                   "both engines placing")
        more: list[str] = []
        t = threading.Thread(target=lambda: more.extend(submit(stub, 10, "during")))
        t.start()
        c.engines[0].kill9()  # mid-run: gangs queued, some dequeued by it and not answered for
        t.join()
        survivor = placed_by(c.engines[1])
        check_all_succeeded_whole(c, ch, watch, jobs + more)
        assert placed_by(c.engines[1]) > survivor  # the other engine carried on
        assert "2 engines act" in c.core.log()
        # the dead engine's long poll ended with its connection (it took nothing more); its lease
        # (--placement-engine-lease) runs out after it was last heard from, which may be after every gang has ended
        wait_until(lambda: re.search(rf"placement engine\(s\) \w+ silent for {ENGINE_LEASE_S} s: \d+ gangs",
                                     c.core.log()), 60, 0.5, "the killed engine to be declared gone")
        log = c.core.log()
        print(f"\n{stale(c)} claims refused (engines' conflicts); {log.count('go back to the queue')} engine gone")
