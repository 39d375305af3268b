"""The typed clients of the internal services (api/clients.py): over gRPC a failed call becomes the error hierarchy
by its status code, never by its text; a launch is sent only over a connected channel, so "never sent" is known;
in one process a component's own error passes as it is and any other becomes an internal error."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from peloton import errors
from peloton.api.grpc_clients import ConnectedStub, GrpcHostManager, GrpcResourceManager, NotSent
from peloton.api.v1 import internal_pb2
from peloton.domain.model import ResourcePool
from peloton.domain.resources import Resources
from peloton.hostmgr.inprocess import InProcessHostManager
from peloton.hostmgr.manager import HostManager
from peloton.leadership.failover import FailoverStub
from peloton.resmgr.inprocess import InProcessResourceManager
from peloton.resmgr.manager import ResourceManager
from tests.unit.test_failover import LocalRpcError
from tests.unit.test_hostmgr_manager import FakeBackend


@contextlib.contextmanager
def resmgr_over_grpc(rm: ResourceManager) -> Iterator[GrpcResourceManager]:
    """`rm` served by its real servicer on a loopback port, and the job manager's client of it."""
    from concurrent import futures

    from peloton.api.v1 import internal_pb2_grpc
    from peloton.resmgr.service import ResourceManagerServicer

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    internal_pb2_grpc.add_ResourceManagerInternalServicer_to_server(ResourceManagerServicer(rm), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            yield GrpcResourceManager(internal_pb2_grpc.ResourceManagerInternalStub(ch))
    finally:
        server.stop(None)


class FailingStub:
    def __init__(self, error: grpc.RpcError) -> None:
        self.error = error
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        def call(request: Any, timeout: float | None = None) -> Any:
            self.calls.append(name)
            raise self.error

        return call


@pytest.mark.parametrize(("code", "cls"), [
    (grpc.StatusCode.NOT_FOUND, errors.NotFound),
    (grpc.StatusCode.INVALID_ARGUMENT, errors.InvalidArgument),
    (grpc.StatusCode.ABORTED, errors.Conflict),
    (grpc.StatusCode.DEADLINE_EXCEEDED, errors.Unavailable),
    (grpc.StatusCode.INTERNAL, errors.PelotonError),
])
def test_a_failed_call_is_the_error_of_its_code(code: grpc.StatusCode, cls: type[errors.PelotonError]) -> None:
    with pytest.raises(errors.PelotonError) as e:
        GrpcResourceManager(FailingStub(LocalRpcError(code, "the details"))).remove_gangs([("j/0", 1)])
    assert type(e.value) is cls and e.value.message == "the details"


def test_unavailable_is_never_taken_for_not_sent_by_its_text() -> None:
    """gRPC's words for a connection it could not make, on a call that was sent: the outcome is unknown."""
    stub = FailingStub(LocalRpcError(grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses"))
    with pytest.raises(errors.Unavailable) as e:
        GrpcHostManager(stub).launch([])
    assert not isinstance(e.value, errors.Unreachable) and stub.calls == ["LaunchGangs"]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again: connections are refused


def test_a_launch_over_a_channel_without_connection_is_not_sent_and_says_so() -> None:
    sent: list[str] = []

    class Recording:
        def __getattr__(self, name: str) -> Any:
            return lambda request, timeout=None: sent.append(name)

    with grpc.insecure_channel(f"127.0.0.1:{_closed_port()}") as ch:
        hm = GrpcHostManager(ConnectedStub(Recording(), ch))
        with pytest.raises(errors.Unreachable):
            hm.launch([])
        hm.kill(["t-0-1"])  # other calls go as they are (and fail as gRPC says: here the fake records them)
    assert sent == ["KillTasks"]


def test_a_call_not_sent_moves_a_failover_stub_on_like_any_unavailable_one() -> None:
    class Answering:
        def LaunchGangs(self, request: Any, timeout: float | None = None) -> Any:
            return internal_pb2.LaunchGangsResponse()

    with grpc.insecure_channel(f"127.0.0.1:{_closed_port()}") as ch:
        failover = FailoverStub([ConnectedStub(FailingStub(NotSent("LaunchGangs")), ch), Answering()],
                                ["a:1", "b:2"], "hostmgr")
        hm = GrpcHostManager(failover)
        with pytest.raises(errors.Unreachable):
            hm.launch([])
        assert failover.address == "b:2"
        assert hm.launch([]) == []


def test_in_process_a_components_own_error_passes_as_it_is_and_any_other_becomes_internal() -> None:
    rm = InProcessResourceManager(ResourceManager(lambda: [ResourcePool("/")], clock=lambda: 1000.0))
    assert rm.entitled_gpus("/nope", Resources(gpu=1)) is None

    class Broken(HostManager):
        def drains(self) -> dict[str, float]:
            raise KeyError("bug")

        def remove_sandboxes(self, job_ids: Any) -> int:
            raise errors.NotFound("job x: no sandbox", field="job_ids")

    hm = InProcessHostManager(Broken(FakeBackend(), clock=lambda: 1000.0))
    with pytest.raises(errors.PelotonError, match="internal error in drains") as e:
        hm.drains()
    assert type(e.value) is errors.PelotonError
    with pytest.raises(errors.NotFound) as nf:
        hm.remove_sandboxes(["x"])
    assert nf.value.field == "job_ids"


def test_a_dry_runs_admission_question_goes_over_grpc_to_the_servicer_and_back() -> None:
    """The --role path: GrpcResourceManager -> PreviewAdmission -> ResourceManagerServicer -> the what-if, each
    gang's reason and gangs ahead back in order; a bad pool path is refused naming the field."""

    from peloton.domain.allocation import GangAsk

    rm = ResourceManager(lambda: [ResourcePool("/"), ResourcePool("/a", limit=Resources(cpu=4))], clock=lambda: 1000.0)
    with resmgr_over_grpc(rm) as client:
        asks = [GangAsk(Resources(cpu=3, mem=512), priority=2), GangAsk(Resources(cpu=3, mem=512), False, 2)]
        out = client.preview_admission("/a", asks)
        assert out == InProcessResourceManager(rm).preview_admission("/a", asks)
        assert out[0].reason == "" and "pool /a limit cpu=4 would be exceeded" in out[1].reason
        with pytest.raises(errors.InvalidArgument) as e:
            client.preview_admission("a//b", asks)
        assert e.value.message.startswith("pool: ")


def test_the_gpus_a_pool_is_entitled_to_are_counted_as_admission_counts_them() -> None:
    """An entitlement is fractional: admission counted 499.9999995 GPUs as 500 whole ones (within 1e-6), while the
    answer to "how many is this pool entitled to" (autosize's bound) said 499 (within 1e-9), in process and over
    gRPC: a job sized to it asked one GPU less than admission would give."""

    from tests.unit.test_resmgr import SHORT, gang

    # shares 1e6 and 0.001 over 500 GPUs: /a's entitlement comes to 499.9999995
    rm = ResourceManager(lambda: [ResourcePool("/"), ResourcePool("/a", share=1_000_000.0),
                                  ResourcePool("/b", share=0.001)], clock=lambda: 1000.0)
    rm.enqueue([gang("b0", n=1, gpu=500, pool="/b")])
    rm.dequeue(10, SHORT, Resources(cpu=10**4, mem=10**8, gpu=500))
    asking = Resources(gpu=500)
    ent = rm.entitlement_if("/a", asking)
    assert ent is not None and 499 < ent.gpu < 500 and ent.whole().gpu == 500
    assert InProcessResourceManager(rm).entitled_gpus("/a", asking) == 500
    with resmgr_over_grpc(rm) as client:
        assert client.entitled_gpus("/a", asking) == 500
