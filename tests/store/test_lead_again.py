"""A daemon that leads the store again after another led it (the store lock lost and regained): the job manager's
first changes are made on its jobs as the store has them, not on the views it cached before (both stores)."""

from __future__ import annotations

import grpc
from sqlalchemy import text

from peloton.api.v1 import job_pb2, job_pb2_grpc
from peloton.jobmgr.manager import JobManager
from peloton.server import Daemon
from peloton.store import db


def desired(jm: JobManager, job_id: str) -> str:
    """The job's desired state as the job manager's writer (its shard's cache) has it."""
    (d,) = [x for x in jm.writer.read_each(lambda views: views[job_id].job.desired if job_id in views else None,
                                           [job_id]) if x is not None]
    return str(d)


def test_a_job_changed_while_this_daemon_did_not_lead_is_read_afresh_once_it_acts_again(daemon: Daemon) -> None:
    jm = daemon.jobmgr
    assert jm is not None and daemon.sessions is not None
    s = job_pb2.JobSpec(name="j", instances=1)
    s.task.command = "train.py"
    s.task.resources.cpu = 1
    s.task.resources.mem = "64Mi"
    with grpc.insecure_channel(daemon.address) as ch:
        job_id = str(job_pb2_grpc.JobServiceStub(ch).CreateJob(job_pb2.CreateJobRequest(spec=s), timeout=10).job_id)
    assert desired(jm, job_id) == "RUNNING"  # cached
    jm.stop_acting("another daemon leads (test)")
    with db.transaction(daemon.sessions) as tx:  # what that daemon did meanwhile: it stopped the job
        tx.execute(text("UPDATE jobs SET desired = 'KILLED' WHERE id = :id"), {"id": job_id})
    jm.act_again()
    # before recovery has run: a status or a stop taken now must not be applied to (and written back from) the
    # view cached before the lock was lost
    assert desired(jm, job_id) == "KILLED"
