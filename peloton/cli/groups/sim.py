"""`peloton sim fail-host|recover-host`: failure injection into a daemon that runs the sim backend; `peloton sim
replay`: a trace replayed on the sim backend in this process (peloton/cli/replay.py)."""

from __future__ import annotations

import argparse
import sys

from peloton.errors import FailedPrecondition, InvalidArgument

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up time: see parser.py)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from google.protobuf.message import Message

    from peloton.cli.client import Client


def register(name: str, g: argparse.ArgumentParser) -> None:
    sm = g.add_subparsers(dest="cmd", required=True)
    x = sm.add_parser("fail-host", help="fail a simulated host: its tasks end LOST and it offers nothing until it "
                                        "recovers")
    x.add_argument("hostname", metavar="HOST", help="e.g. sim-00042")
    x.add_argument("--recover-after", default=None, metavar="DURATION",
                   help="bring the host back by itself after this long (30s, 2m, 500ms, 1.5); default: it stays "
                        "down until `peloton sim recover-host`")
    x.set_defaults(fn="groups.sim:cmd_sim_fail_host")
    x = sm.add_parser("recover-host", help="bring a failed simulated host back, empty")
    x.add_argument("hostname", metavar="HOST")
    x.set_defaults(fn="groups.sim:cmd_sim_recover_host")
    from peloton.cli import replay

    replay.register(sm)


def cmd_sim_fail_host(c: Client, a: argparse.Namespace) -> int:
    from google.protobuf import duration_pb2

    from peloton.api.v1 import sim_pb2

    req = sim_pb2.FailHostRequest(hostname=a.hostname)
    after = ""
    if a.recover_after is not None:
        from peloton.hostmgr.sim.durations import format_duration, parse_duration

        seconds = parse_duration(a.recover_after, "--recover-after")
        if seconds <= 0:
            raise InvalidArgument("--recover-after: must be greater than 0")
        d = duration_pb2.Duration()
        d.FromNanoseconds(round(seconds * 1e9))
        req.recover_after.CopyFrom(d)
        after = f"; it recovers in {format_duration(seconds)}"
    r = c.call(_sim_method(c, "FailHost"), req)
    print(f"failed host {a.hostname}: {r.tasks_lost} task(s) lost{after}", file=sys.stderr)
    _done(a, {"hostname": a.hostname, "failed": True, "tasks_lost": r.tasks_lost})
    return 0


def cmd_sim_recover_host(c: Client, a: argparse.Namespace) -> int:
    from peloton.api.v1 import sim_pb2

    r = c.call(_sim_method(c, "RecoverHost"), sim_pb2.RecoverHostRequest(hostname=a.hostname))
    print(f"recovered host {a.hostname}" if r.was_down else f"host {a.hostname} was not down", file=sys.stderr)
    _done(a, {"hostname": a.hostname, "recovered": r.was_down})
    return 0


def _done(a: argparse.Namespace, record: dict[str, Any]) -> None:
    from peloton.cli import render

    render.done(a, record)


def _sim_method(c: Client, name: str) -> Callable[..., Any]:
    """A SimService method whose UNIMPLEMENTED (a daemon without the sim backend) reads as such."""
    from peloton.api.v1 import sim_pb2
    from peloton.cli.client import Stub
    from peloton.cli.transport import RpcError, StatusCode

    method = getattr(Stub(c.channel, sim_pb2, "SimService"), name)

    def call(request: Message, timeout: float) -> Any:
        try:
            return method(request, timeout=timeout)
        except RpcError as e:
            if e.code() == StatusCode.UNIMPLEMENTED:
                raise FailedPrecondition("the daemon does not run the sim backend") from None
            raise

    return call

