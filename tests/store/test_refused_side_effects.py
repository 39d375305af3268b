"""A gang resmgr refuses to queue for good, through the real components on both stores: the job manager calls
resmgr over real gRPC (a split deployment's client and servicer), and resmgr's server takes messages up to a small
bound (the daemon's is 64 MiB: the same refusal, cheaper to provoke), so a gang of many members is refused by
gRPC itself (RESOURCE_EXHAUSTED). Before the fix the job manager tried that call again for ever, and every later
release and enqueue waited behind it: the small job created after it never ran. Now the refused gang is isolated
and its job fails saying why, and the rest goes (jobmgr/effects.py)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest
from sqlalchemy import Engine

from peloton.api.grpc_clients import GrpcResourceManager
from peloton.api.v1 import internal_pb2_grpc
from peloton.domain.resources import Resources
from peloton.domain.spec import JobSpec
from peloton.domain.states import JobState, TaskState
from peloton.hostmgr.inprocess import InProcessHostManager
from peloton.jobmgr.manager import JobManager
from peloton.resmgr.service import ResourceManagerServicer
from peloton.store import db, repo
from tests.store.test_lost_side_effects import TEAM, Away, Cluster, spec
from tests.unit.test_internal_batching import refused_total

MAX_MESSAGE = 16 * 1024  # resmgr's bound on a request here: a gang of 1,000 members passes it, of 2 does not


class OverGrpc(Cluster):
    """The cluster of test_lost_side_effects, its job manager calling resmgr over gRPC."""

    def __init__(self, engine: Engine) -> None:
        self.server: grpc.Server | None = None
        super().__init__(engine)

    def _new_jobmgr(self) -> JobManager:
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4),
                                  options=[("grpc.max_receive_message_length", MAX_MESSAGE)])
        internal_pb2_grpc.add_ResourceManagerInternalServicer_to_server(ResourceManagerServicer(self.resmgr),
                                                                        self.server)
        port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self.rm = Away(GrpcResourceManager(internal_pb2_grpc.ResourceManagerInternalStub(self.channel)))
        self.hm = Away(InProcessHostManager(self.hostmgr))
        jm = JobManager(self.sessions, self.read, self.rm, self.hm, clock=self.clock)  # type: ignore[arg-type]
        jm.start()
        jm.recover()
        return jm

    def close(self) -> None:
        super().close()
        self.channel.close()
        if self.server is not None:
            self.server.stop(None)

    def reason(self, job_id: str) -> str:
        with db.transaction(self.read) as s:
            return repo.get_job(s, job_id).reason


@pytest.fixture
def cluster(engine: Engine) -> Iterator[OverGrpc]:
    c = OverGrpc(engine)
    try:
        yield c
    finally:
        c.close()


def test_a_gang_resmgr_refuses_for_good_fails_its_job_and_holds_nothing_up(cluster: OverGrpc) -> None:
    c = cluster
    refused_before = refused_total("enqueue")
    big = c.jm.create_job(JobSpec(name="big", instances=1000, command="train.py", respool=TEAM,
                                  resources=Resources(cpu=0.001, mem=1)))  # one gang of 1,000: too big a message
    small = c.jm.create_job(spec("small"))
    assert c.jm.effects.drain(10)  # before the fix: False (the big gang's call tried again for ever)
    c.reconcile()  # the reconciler takes the refusal: the job fails
    c.settle()
    assert c.state(small) == JobState.RUNNING
    assert c.state(big) == JobState.FAILED
    assert c.reason(big).startswith("gang 0 was refused by the resource manager: ")
    assert "larger than max" in c.reason(big)
    assert set(c.task_states(big)) == {TaskState.FAILED}
    assert refused_total("enqueue") == refused_before + 1
    c.clock.now += 60
    c.reconcile()  # the queue check does not queue it again
    assert [g.gang_id for g in c.resmgr.queue()[0]] == [] and c.state(big) == JobState.FAILED
