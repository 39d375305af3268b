"""The internal services of a role with standbys: a caller keeps to one address until a call to it ends
UNAVAILABLE or is not answered in time, then calls the next one (leadership/failover.py)."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from peloton.leadership.failover import FailoverStub, split_addresses


class LocalRpcError(grpc.RpcError):
    """A failed call as grpcio raises it: its status code and details."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


class FakeStub:
    def __init__(self, name: str, fails: list[grpc.StatusCode]) -> None:
        self.name, self.fails, self.calls = name, fails, 0

    def Check(self, request: Any, timeout: float | None = None) -> str:  # noqa: N802 - a gRPC method
        self.calls += 1
        if self.fails:
            raise LocalRpcError(self.fails.pop(0), f"{self.name} says no")
        return f"{self.name}:{request}"


def test_addresses_are_split_in_order_without_blanks_or_repeats() -> None:
    assert split_addresses(" a:1, ,b:2,a:1,unix:/x.sock ") == ["a:1", "b:2", "unix:/x.sock"]
    assert split_addresses("") == []


def test_a_caller_moves_on_after_an_unavailable_or_late_answer_and_stays_there() -> None:
    a = FakeStub("a", [grpc.StatusCode.UNAVAILABLE])
    b = FakeStub("b", [grpc.StatusCode.DEADLINE_EXCEEDED])
    stub = FailoverStub([a, b], ["a:1", "b:2"], "resmgr")
    with pytest.raises(grpc.RpcError):  # the failed call is not sent again here: its caller retries
        stub.Check(1, timeout=5)
    assert stub.address == "b:2"
    with pytest.raises(grpc.RpcError):
        stub.Check(2)
    assert stub.address == "a:1"  # round the list
    assert stub.Check(3) == "a:3" and stub.Check(4) == "a:4"
    assert (a.calls, b.calls) == (3, 1)


def test_a_refusal_is_not_a_reason_to_move_on() -> None:
    a = FakeStub("a", [grpc.StatusCode.INVALID_ARGUMENT])
    stub = FailoverStub([a, FakeStub("b", [])], ["a:1", "b:2"], "hostmgr")
    with pytest.raises(grpc.RpcError):
        stub.Check(1)
    assert stub.address == "a:1" and stub.Check(2) == "a:2"
