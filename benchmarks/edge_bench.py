"""What a flood of unauthenticated big requests costs the daemon: its resident memory (peak, VmHWM) while
`--connections` clients, each on a connection of its own, send `--streams` requests at once of `--size` bytes
without credentials, `--rounds` times over, to a daemon with authentication on (a principals file; loopback, no
TLS). Prints a table and writes JSON; asserts nothing (tests/api/test_edge.py holds the bound, generously).

    .venv/bin/python benchmarks/edge_bench.py [--connections 16] [--streams 1] [--size 60000000] [--rounds 3]

Also the answers the clients saw (their status codes), and, with `--authenticated`, the same flood with a valid
token of a viewer (who may not create jobs: every request is read, then refused), for comparison."""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from grpc_health.v1 import health_pb2  # noqa: E402

from benchmarks.harness import Daemon, table, write_results  # noqa: E402
from peloton.api.v1 import job_pb2  # noqa: E402
from peloton.identity import add_token  # noqa: E402

METHODS = {"create": "/peloton.v1.JobService/CreateJob", "health": "/grpc.health.v1.Health/Check"}


def payload(method: str, size: int) -> bytes:
    """A valid request of about `size` bytes: a CreateJobRequest with a long request_id (the daemon refuses it, but
    only after reading and parsing it, and only once the caller is known), or a health check of a long service
    name (health needs no credentials: read by anyone)."""
    if method == "health":
        return health_pb2.HealthCheckRequest(service="x" * max(0, size - 8)).SerializeToString()
    return job_pb2.CreateJobRequest(request_id="x" * max(0, size - 8)).SerializeToString()


def flood(address: str, method: str, connections: int, streams: int, body: bytes, rounds: int,
          metadata: tuple[tuple[str, str], ...]) -> tuple[Counter[str], float]:
    """Every connection sends `streams` requests at once, `rounds` times; the codes seen and the seconds taken."""
    codes: Counter[str] = Counter()
    lock = threading.Lock()

    def client(i: int) -> None:
        # a connection of its own: channels with different arguments share no subchannel
        ch = grpc.insecure_channel(address, options=[("peloton.bench.connection", i),
                                                     ("grpc.max_send_message_length", -1)])
        call = ch.unary_unary(method)
        try:
            for _ in range(rounds):
                futs = [call.future(body, timeout=120, metadata=metadata) for _ in range(streams)]
                for f in futs:
                    try:
                        f.result()
                        code = "OK"
                    except grpc.RpcError as e:
                        code = e.code().name  # type: ignore[attr-defined]
                    with lock:
                        codes[code] += 1
        finally:
            ch.close()

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(connections)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return codes, time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--connections", type=int, default=16)
    p.add_argument("--streams", type=int, default=1, help="requests at once on each connection")
    p.add_argument("--size", type=int, default=60_000_000, help="bytes of each request")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--method", choices=sorted(METHODS), default="create",
                   help="create: CreateJob (needs credentials); health: a health check (open to anyone)")
    p.add_argument("--authenticated", action="store_true", help="also the same flood with a viewer's token")
    p.add_argument("--json", default=None, help="default: benchmarks/results/edge.json")
    a = p.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="peloton-bench-edge-"))
    principals = tmp / "principals.json"
    viewer = add_token(principals, "viewer", ["viewer"])
    d = Daemon(["--backend", "sim", "--sim-hosts", "4", "--principals-file", str(principals), "--unix-socket", ""])
    d.start()
    body = payload(a.method, a.size)
    results: dict[str, Any] = {"parameters": vars(a), "request_bytes": len(body)}
    rows: list[tuple[str, str]] = []
    try:
        time.sleep(1)
        idle = d.rss_mib()
        results["rss_idle_mib"] = idle
        rows.append(("RSS idle", f"{idle:.0f} MiB"))
        floods = [("unauthenticated", ())]
        if a.authenticated:
            floods.append(("viewer (token, refused after reading)", (("authorization", f"Bearer {viewer}"),)))
        for name, md in floods:
            codes, took = flood(d.address, METHODS[a.method], a.connections, a.streams, body, a.rounds, md)
            peak, now = d.rss_peak_mib(), d.rss_mib()
            results[name] = {"codes": dict(codes), "seconds": took, "rss_peak_mib": peak, "rss_after_mib": now}
            rows += [(f"{name}: answers", ", ".join(f"{k} {v}" for k, v in sorted(codes.items()))),
                     (f"{name}: took", f"{took:.1f} s"),
                     (f"{name}: RSS peak (since start)", f"{peak:.0f} MiB (+{peak - idle:.0f})"),
                     (f"{name}: RSS after", f"{now:.0f} MiB")]
    finally:
        d.stop()
    total = a.connections * a.streams * a.rounds
    print(f"Edge: {a.method}, {a.connections} connections x {a.streams} requests at once x {a.rounds} rounds ({total} requests) "
          f"of {len(body):,} bytes")
    print(table(rows))
    write_results("edge", results, a.json)


if __name__ == "__main__":
    main()
