"""What a flood of unauthenticated big requests costs the daemon: its resident memory (peak, VmHWM) while
`--connections` clients, each on a connection of its own, send `--streams` requests at once of `--size` bytes
without credentials, `--rounds` times over, to a daemon with authentication on (a principals file; loopback, no
TLS). Prints a table and writes JSON; asserts nothing (tests/api/test_edge.py holds the bound, generously).

    .venv/bin/python benchmarks/edge_bench.py [--connections 16] [--streams 1] [--size 60000000] [--rounds 3]

Also the answers the clients saw (their status codes), and, with `--authenticated`, the same flood with a valid
token of a viewer (who may not create jobs: every request is read, then refused), for comparison (its peak is
since the daemon started: at least the first flood's).

`--rtt-ms N` measures instead what turning HTTP/2's BDP probing off (as the public port does) costs a big request
over a link with N ms each way: a gRPC server with the public port's options, with and without BDP probing, behind
a proxy that delays every chunk by N ms, read as Authorize reads a request; a request of 1 KB, 1 MiB and 4 MB."""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from grpc_health.v1 import health_pb2  # noqa: E402

from benchmarks.harness import Daemon, run_clients, table, write_results  # noqa: E402
from peloton.api.v1 import job_pb2  # noqa: E402
from peloton.security.identity import add_token  # noqa: E402

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
                        code = e.code().name
                    with lock:
                        codes[code] += 1
        finally:
            ch.close()

    return codes, run_clients(client, connections)


def delaying_proxy(target_port: int, delay_s: float) -> int:
    """A TCP proxy to 127.0.0.1:`target_port` that delays every chunk by `delay_s`, each way (a link's latency,
    no bandwidth limit); its port."""
    loop = asyncio.new_event_loop()
    ready: list[int] = []

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        q: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def read() -> None:
            while True:
                data = await reader.read(65536)
                await q.put((loop.time() + delay_s, data))
                if not data:
                    return

        async def write() -> None:
            while True:
                at, data = await q.get()
                await asyncio.sleep(max(0.0, at - loop.time()))
                if not data:
                    writer.close()
                    return
                writer.write(data)
                await writer.drain()

        await asyncio.gather(read(), write())

    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        r2, w2 = await asyncio.open_connection("127.0.0.1", target_port)
        await asyncio.gather(pipe(r, w2), pipe(r2, w), return_exceptions=True)

    async def serve() -> None:
        srv = await asyncio.start_server(handle, "127.0.0.1", 0)
        ready.append(srv.sockets[0].getsockname()[1])
        await srv.serve_forever()

    threading.Thread(target=lambda: loop.run_until_complete(serve()), daemon=True).start()
    while not ready:
        time.sleep(0.01)
    return ready[0]


def window_cost(rtt_ms: float, tries: int = 5) -> tuple[list[tuple[str, str]], dict[str, Any]]:
    """The time of one call with a request of each size, with and without BDP probing, through the proxy."""
    from peloton.api.edge import PUBLIC_PORT_OPTIONS  # (here: the flood also runs against older trees)

    rows, out = [], {}
    for name, bdp in (("BDP probing on (gRPC's default)", 1), ("BDP probing off (the public port)", 0)):
        opts = [(k, v) for k, v in PUBLIC_PORT_OPTIONS if k != "grpc.http2.bdp_probe"] + [("grpc.http2.bdp_probe", bdp)]
        server = grpc.server(futures.ThreadPoolExecutor(4), options=opts)
        handler = grpc.stream_unary_rpc_method_handler(lambda requests, context: b"%d" % len(next(requests)))
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("b.B", {"M": handler}),))
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        ch = grpc.insecure_channel(f"127.0.0.1:{delaying_proxy(port, rtt_ms / 2000)}")
        call = ch.unary_unary("/b.B/M")
        call(b"x", timeout=60)  # connected
        for size in (1000, 1 << 20, 4_000_000):
            times = []
            for _ in range(tries):
                t0 = time.perf_counter()
                call(b"x" * size, timeout=60)
                times.append(time.perf_counter() - t0)
            best = min(times) * 1000
            rows.append((f"{name}: {size:,} bytes", f"best of {tries} {best:.1f} ms"))
            out[f"bdp{bdp}_{size}_ms"] = best
        ch.close()
        server.stop(0)
    return rows, out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--connections", type=int, default=16)
    p.add_argument("--streams", type=int, default=1, help="requests at once on each connection")
    p.add_argument("--size", type=int, default=60_000_000, help="bytes of each request")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--method", choices=sorted(METHODS), default="create",
                   help="create: CreateJob (needs credentials); health: a health check (open to anyone)")
    p.add_argument("--authenticated", action="store_true", help="also the same flood with a viewer's token")
    p.add_argument("--rtt-ms", type=float, default=0, help="measure BDP probing's worth at this round trip instead")
    p.add_argument("--json", default=None, help="default: benchmarks/results/edge.json")
    a = p.parse_args()
    if a.rtt_ms:
        window_rows, out = window_cost(a.rtt_ms)
        print(f"A request's time over a {a.rtt_ms:g} ms round trip")
        print(table(window_rows))
        write_results("edge-window", {"parameters": vars(a), **out}, a.json)
        return

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
        floods: list[tuple[str, tuple[tuple[str, str], ...]]] = [("unauthenticated", ())]
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
    print(f"Edge: {a.method}, {a.connections} connections x {a.streams} requests at once x {a.rounds} rounds "
          f"({total} requests) of {len(body):,} bytes")
    print(table(rows))
    write_results("edge", results, a.json)


if __name__ == "__main__":
    main()
