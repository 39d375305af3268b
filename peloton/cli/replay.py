"""`peloton sim replay`: a trace replayed by the production scheduler on the sim backend in virtual time, in this
process (no daemon), once per policy; the report as a table or JSON, and plots (docs/cli.md, docs/scheduling-
quality.md). Bad input (a trace row, a flag, the pools file) is one line naming it, exit code 2, nothing written.

Start-up: nothing heavy is imported until the command runs.
"""

from __future__ import annotations

import argparse
import sys

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see main.py)
if TYPE_CHECKING:
    from typing import Any

    from peloton.domain.model import ResourcePool

MAX_POOLS = 1000


def register(sm: Any) -> None:
    """Add `replay` to the subparsers of the `sim` group."""
    from peloton.cli.parser import output_flag

    x = sm.add_parser("replay", help="replay a trace on the real scheduler in virtual time, here (no daemon): "
                                     "job completion time, queueing, makespan and GPU allocation per policy")
    x.add_argument("trace", metavar="TRACE", help="the trace's CSV file")
    x.add_argument("--format", required=True, choices=["pollux", "tiresias", "peloton"],
                   help="the trace's columns (docs/scheduling-quality.md, Traces and their formats)")
    where = x.add_mutually_exclusive_group(required=True)
    where.add_argument("--cluster", default=None, metavar="HxG", help="H hosts of G GPUs (e.g. 16x4)")
    where.add_argument("--cluster-file", default=None, metavar="FILE",
                       help="a Tiresias cluster file (num_switch,num_node_p_switch,num_gpu_p_node,...)")
    x.add_argument("--racks", type=int, default=1, metavar="N", help="deal the hosts of --cluster to N racks "
                                                                      "(default 1)")
    x.add_argument("--pools", default=None, metavar="FILE",
                   help="the pools, a YAML or JSON list of pools as `pool create` takes them ({path, reservation, "
                        "limit, share, reservation_type}); default: two pools /a and /b, half the cluster each, "
                        "jobs without a pool dealt to them in turn")
    x.add_argument("--policy", action="append", default=[], metavar="P",
                   help="fifo, default, model-aware or auto; again or comma-separated for several (default: all "
                        "four)")
    x.add_argument("--preemption", choices=["on", "off", "both"], default="on",
                   help="preemption between pools on (default), off, or both (each policy twice)")
    x.add_argument("--queue-order", default="arrival", metavar="ORDER",
                   help="the daemon's --queue-order for every policy: arrival (default) or gpu-time (least expected "
                        "GPU-time first, with aging; docs/pools.md)")
    x.add_argument("--queue-promote-after", default="4h", metavar="DURATION",
                   help="the daemon's --queue-promote-after: under gpu-time, a gang waiting this long goes to the "
                        "first queue (default %(default)s)")
    x.add_argument("--seed", type=int, default=0, metavar="N",
                   help="which hosts share a rack, and the sim backend's draws (default 0); a seed replays the "
                        "same")
    x.add_argument("--profiles", default=None, metavar="DIR",
                   help="DIR/bert/placements.csv and DIR/cifar10/placements.csv: fit those applications' cost "
                        "models to their public profiles (default: every application's prior)")
    x.add_argument("--plots", default=None, metavar="DIR",
                   help="write queue.svg, allocation.svg and jct-by-size.svg into DIR")
    output_flag(x, "table (default; wide: the same), json or yaml: the report (docs/scheduling-quality.md)")
    x.set_defaults(server_fn=cmd_sim_replay, prints_records=True)


def cmd_sim_replay(a: argparse.Namespace) -> int:
    """Bad input raises InvalidArgument: main prints it as one line and exits 2."""
    from peloton.cli import render
    from peloton.errors import InvalidArgument
    from peloton.hostmgr.sim.durations import parse_duration
    from peloton.replay import policies, report, run
    from peloton.resmgr.ordering import QueueOrder

    chosen = policies.parse_policies(a.policy)
    if not 0 <= a.seed < 2**63:
        raise InvalidArgument(f"--seed: {a.seed} is not within 0..2^63-1", field="seed")
    queue_order = QueueOrder(a.queue_order, parse_duration(a.queue_promote_after.strip(), "--queue-promote-after"))
    pools = read_pools(a.pools) if a.pools is not None else None
    s = run.setup(a.trace, a.format, cluster=a.cluster, cluster_file=a.cluster_file, racks=a.racks,
                  profiles=a.profiles, pools=pools, seed=a.seed, queue_order=queue_order)
    preemption = {"on": [True], "off": [False], "both": [True, False]}[a.preemption]
    c = s.cluster
    print(f"replaying {s.source}: {len(s.jobs)} jobs on {c.hosts} hosts x {c.gpus_per_host} GPUs "
          f"({c.racks} rack(s)), pools {', '.join(f'{p.path} ({p.reservation.gpu} GPUs)' for p in s.pools)}, "
          f"queue order {queue_order.kind}",
          file=sys.stderr)

    def said(o: run.Outcome) -> None:
        print(f"  {o.label}: {o.result.instants} virtual instants in {o.result.wall_s:.1f}s", file=sys.stderr)

    outcomes = run.replay_all(s, chosen, preemption, said)
    if a.plots is not None:
        for path in run.write_plots(outcomes, a.plots):
            print(f"wrote {path}", file=sys.stderr)
    if a.output in render.DOCUMENTS:
        print(render.dumps(run.document(s, outcomes)))
    else:
        print(report.table(run.results(outcomes)))
    return 0


def read_pools(path: str) -> list[ResourcePool]:
    """A pools file: a YAML or JSON list (or {"pools": [...]}) of pools as `peloton pool create` takes them: `path`,
    `reservation` and `limit` (a mapping {cpu, mem, disk, gpu} or the flags' `cpu=N,mem=Q,gpu=N`), `share`,
    `reservation_type`; parents before their children. Errors name the file, the pool's index and the field."""
    import yaml
    from google.protobuf import json_format

    from peloton.api.convert import pool_from_proto
    from peloton.api.v1 import respool_pb2
    from peloton.cli.admin import _set_res
    from peloton.domain.model import ResourcePool
    from peloton.domain.pools import check_pool, validate_pool
    from peloton.errors import InvalidArgument, PelotonError
    from peloton.replay.run import read_text

    text = read_text(path, "--pools")
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise InvalidArgument(f"--pools: {path}: not YAML or JSON: {str(e).splitlines()[0]}", field="pools") from None
    if isinstance(doc, dict) and set(doc) == {"pools"}:
        doc = doc["pools"]
    if not isinstance(doc, list) or not doc or len(doc) > MAX_POOLS:
        raise InvalidArgument(f"--pools: {path}: expected a list of 1 to {MAX_POOLS} pools", field="pools")
    known: dict[str, ResourcePool] = {"/": ResourcePool("/")}
    out = []
    for i, item in enumerate(doc):
        where = f"--pools: {path}: pools[{i}]"
        try:
            if not isinstance(item, dict):
                raise InvalidArgument("expected a mapping {path, reservation, limit, share, reservation_type}")
            flags = {k: item[k] for k in ("reservation", "limit") if isinstance(item.get(k), str)}
            rest = {k: v for k, v in item.items() if k not in flags}
            msg = json_format.ParseDict(rest, respool_pb2.ResourcePool())
            for k, v in flags.items():
                _set_res(getattr(msg, k), v, k)
            pool = validate_pool(pool_from_proto(msg))
            if pool.path in known:
                raise InvalidArgument(f"pool.path: {pool.path} is given twice (or is the root)", field="pool.path")
            check_pool(known, pool)
        except json_format.ParseError as e:
            raise InvalidArgument(f"{where}: {e}", field="pools") from None
        except PelotonError as e:
            raise InvalidArgument(f"{where}: {e.message}", field="pools") from None
        known[pool.path] = pool
        out.append(pool)
    return out
