"""What callers without credentials can make the real daemon hold: a flood of requests just under the 4 MiB limit,
many at once on many connections, to a daemon with authentication on. Each is refused before it is read, so the
daemon's peak memory hardly moves. A generous bound (measured: a few MiB; each request read whole first, as before
this bound: ~735 MiB, or ~128 MiB with HTTP/2's BDP probing on; docs/performance.md, benchmarks/edge_bench.py)."""

from __future__ import annotations

import threading
from pathlib import Path

import grpc
import pytest

from peloton.api.v1 import job_pb2
from peloton.domain import limits
from peloton.security.identity import add_token
from tests.e2e.harness import Daemon, serving

pytestmark = pytest.mark.e2e

CONNECTIONS, AT_ONCE, ROUNDS = 16, 8, 3
BOUND_MIB = 64


def peak_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def test_a_flood_without_credentials_costs_the_daemon_next_to_nothing(tmp_path: Path) -> None:
    principals = tmp_path / "principals.json"
    add_token(principals, "alice", ["submitter"])
    d = Daemon(tmp_path / "data", f"sqlite:///{tmp_path}/p.db", hosts=1, extra_args=(
        "--principals-file", str(principals), "--unix-socket", ""))
    body = job_pb2.CreateJobRequest(request_id="x" * (limits.MAX_REQUEST_BYTES - 16)).SerializeToString()
    assert limits.MAX_REQUEST_BYTES - 16 < len(body) <= limits.MAX_REQUEST_BYTES
    codes: list[grpc.StatusCode] = []
    with serving(d):
        assert d.proc is not None
        before = peak_mib(d.proc.pid)

        def client(i: int) -> None:
            ch = grpc.insecure_channel(d.address, options=[("test.connection", i)])  # a connection of its own
            call = ch.unary_unary("/peloton.v1.JobService/CreateJob")
            try:
                for _ in range(ROUNDS):
                    for f in [call.future(body, timeout=60) for _ in range(AT_ONCE)]:
                        try:
                            f.result()
                            codes.append(grpc.StatusCode.OK)
                        except grpc.RpcError as e:
                            codes.append(e.code())
            finally:
                ch.close()

        threads = [threading.Thread(target=client, args=(i,)) for i in range(CONNECTIONS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        grew = peak_mib(d.proc.pid) - before
    assert codes == [grpc.StatusCode.UNAUTHENTICATED] * (CONNECTIONS * AT_ONCE * ROUNDS)
    assert grew < BOUND_MIB, f"{CONNECTIONS * AT_ONCE} requests of 4 MiB at once made the daemon's peak grow " \
                             f"by {grew:.0f} MiB"
