from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from peloton.api.v1 import job_pb2, job_pb2_grpc
from tests.dbutil import postgres_database
from tests.e2e.harness import Daemon, serving, wait_until

ENDED = ("SUCCEEDED", "FAILED", "KILLED")


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database. PostgreSQL unreachable: the test fails (skips with PELOTON_TEST_ALLOW_NO_PG=1)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/peloton.db"
        return
    with postgres_database() as url:
        yield url


@pytest.fixture
def daemon(db_url: str, tmp_path: Path) -> Iterator[Daemon]:
    with serving(Daemon(tmp_path / "data", db_url)) as d:
        yield d


@pytest.fixture(scope="module")
def shared_daemon_settings() -> dict[str, Any]:
    """Daemon's settings for the module's shared daemon, beyond its data dir and store (a module overrides this
    fixture for other hosts: `hosts`, `host_resources`, ...)."""
    return {}


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def module_daemon(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
                  shared_daemon_settings: dict[str, Any]) -> Iterator[Daemon]:
    """One daemon (the `daemon` fixture's settings, or the module's `shared_daemon_settings`) for every test of a
    module that takes `shared_daemon`, on each store: a daemon's start and stop cost a test 1 to 2 s. Only for tests
    that neither restart the daemon nor look at what other tests leave in the store (each names its own jobs)."""
    tmp = tmp_path_factory.mktemp("shared-daemon")
    with contextlib.ExitStack() as stack:
        url = (f"sqlite:///{tmp}/peloton.db" if request.param == "sqlite"
               else stack.enter_context(postgres_database()))
        yield stack.enter_context(serving(Daemon(tmp / "data", url, **shared_daemon_settings)))


@pytest.fixture
def shared_daemon(module_daemon: Daemon) -> Iterator[Daemon]:
    """The module's daemon for one test; afterwards whatever job the test left unfinished (a failed test's) is
    stopped and waited for, so that the next test starts on an idle cluster."""
    yield module_daemon
    with grpc.insecure_channel(module_daemon.address) as ch:
        stub = job_pb2_grpc.JobServiceStub(ch)

        def unfinished() -> list[str]:
            jobs = stub.ListJobs(job_pb2.ListJobsRequest(page_size=1000), timeout=30).jobs
            return [j.id for j in jobs if j.status.state not in ENDED]

        for job_id in unfinished():
            with contextlib.suppress(grpc.RpcError):  # (one ending meanwhile)
                stub.StopJob(job_pb2.StopJobRequest(job_id=job_id), timeout=30)
        wait_until(lambda: not unfinished(), 60, 0.2, "the jobs a test left to end")
