"""The resource manager's scheduling round on a shared cluster: 100 pools, 10,000 waiting gangs, the capacity of
1,000 hosts. Prints a table and writes JSON; asserts nothing (tests never time anything).

    .venv/bin/python benchmarks/scheduling_bench.py [--pools 100] [--gangs 10000] [--hosts 1000]

The pools are 10 top-level pools (each reserving a tenth of the cluster's GPUs, some static) with 9 leaves each
(reserving part of their parent's, shares 1-3). Gangs of 1-16 members of one GPU each, priorities 0-3, wait spread
over the leaves; a quarter of the cluster is already allocated. Measures, each the median of repeated runs:
- the entitlement of every pool (entitlement.py) from scratch;
- one admission round as the placement engine asks for it (`dequeue` of 500 gangs, entitlements recomputed since a
  gang was enqueued): the gangs admitted and the time;
- a round in which nothing can be admitted (every pool at its entitlement): the first gang of each pool's queue
  is looked at (the gangs behind it wait);
- a round on a full cluster (the gangs placed on 1,000 hosts of 8 GPUs by the placer, a third with a max_runtime)
  in which the first gangs of the pools' queues fit no host: admission, the probes for preemption and
  reservation (resmgr), and the victim choice and reservation for each probe with the placer (placement
  engine), as one round does them. The gangs placed are timed in placement_bench.py;
- the scheduling pipeline of the all-in-one daemon on the sim backend, in this one thread (no store, no gRPC, no
  job manager): gangs of 8 one-GPU members enqueued in resmgr (one pool), a placement engine round (dequeue,
  sync, place, claim, set_placements), taken and acknowledged as the launcher does, launched by the host manager
  on the sim backend, their RUNNING statuses taken from the host manager's event log, then ended (the sim's
  timer step) and removed from resmgr: the CPU time per gang, `--pipeline-gangs` gangs, 2 and 32 a round.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import table, write_results  # noqa: E402
from peloton.api.clients import ResourceManagerClient  # noqa: E402
from peloton.domain.launch import GangLaunch, LaunchSpec  # noqa: E402
from peloton.domain.model import ResourcePool  # noqa: E402
from peloton.domain.placement import (  # noqa: E402
    GangPlacement,
    GangRequest,
    HostOffer,
    MemberRequest,
    PlacementFailure,
)
from peloton.domain.resources import Resources  # noqa: E402
from peloton.hostmgr.inprocess import InProcessHostManager  # noqa: E402
from peloton.hostmgr.manager import HostManager  # noqa: E402
from peloton.hostmgr.sim.backend import SimBackend, make_sim_hosts  # noqa: E402
from peloton.placement.engine import PlacementEngine  # noqa: E402
from peloton.placement.index import HostIndex  # noqa: E402
from peloton.placement.placer import place  # noqa: E402
from peloton.placement.reservation import reserve, reserve_after  # noqa: E402
from peloton.placement.victims import Candidate, choose_victims  # noqa: E402
from peloton.resmgr import manager as resmgr_manager  # noqa: E402
from peloton.resmgr.entitlement import PoolPolicy, entitlements  # noqa: E402
from peloton.resmgr.inprocess import InProcessResourceManager  # noqa: E402
from peloton.resmgr.manager import ResourceManager  # noqa: E402

HOST = Resources(cpu=64, mem=256 * 1024, gpu=8)
MEMBER = Resources(cpu=8, mem=32 * 1024, gpu=1)


def tree(n_pools: int, capacity: Resources, rng: random.Random) -> list[ResourcePool]:
    tops = max(1, n_pools // 10)
    leaves_per = max(1, n_pools // tops - 1)
    pools = [ResourcePool("/")]
    top_gpu = capacity.gpu // (tops + 1)
    for t in range(tops):
        static = t % 4 == 0
        pools.append(ResourcePool(f"/t{t}", reservation=Resources(gpu=top_gpu), share=rng.choice([1.0, 2.0]),
                                  reservation_type="static" if static else "elastic"))
        leaf_gpu = top_gpu // (leaves_per + 1)
        for leaf in range(leaves_per):
            pools.append(ResourcePool(f"/t{t}/l{leaf}", reservation=Resources(gpu=leaf_gpu),
                                      share=float(rng.randint(1, 3))))
    return pools[:n_pools + 1]


def gangs(n: int, leaves: list[str], rng: random.Random, start: int = 0) -> list[GangRequest]:
    out = []
    for i in range(start, start + n):
        size = rng.choice([1, 1, 2, 4, 8, 16])
        out.append(GangRequest(gang_id=f"j{i}/0", job_id=f"j{i}", attempt=1,
                               members=tuple(MemberRequest(m, f"j{i}-{m}-1", MEMBER) for m in range(size)),
                               priority=rng.randint(0, 3), respool=rng.choice(leaves), enqueued_at=float(i)))
    return out


def median_ms(fn, repeat: int) -> float:  # type: ignore[no-untyped-def]
    xs = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        xs.append(time.perf_counter() - t0)
    return statistics.median(xs) * 1000


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pools", type=int, default=100)
    ap.add_argument("--gangs", type=int, default=10_000)
    ap.add_argument("--hosts", type=int, default=1_000)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--json", default=None)
    ap.add_argument("--pipeline-gangs", type=int, default=2000, help="gangs through the pipeline, each batch size")
    ap.add_argument("--pipeline-hosts", type=int, default=10_000)
    a = ap.parse_args()
    pipeline = {per: _pipeline(a.pipeline_gangs, per, a.pipeline_hosts) for per in (2, 32)}
    rng = random.Random(7)
    capacity = HOST.scale(a.hosts)
    pools = tree(a.pools, capacity, rng)
    leaves = [p.path for p in pools if not any(q.parent == p.path for q in pools)]
    # a quarter of the cluster already runs (so entitlements are not all demand)
    running = []
    budget = capacity.gpu // 4
    for g in gangs(10 * a.gangs, leaves, rng, start=10**7):
        if g.total.gpu > budget:
            continue
        budget -= g.total.gpu
        running.append(g)
        if budget <= 0:
            break
    waiting = gangs(a.gangs, leaves, rng)

    policies = {p.path: PoolPolicy(p.path, p.reservation, p.limit, p.share, p.reservation_type == "static")
                for p in pools}
    demand: dict[str, Resources] = {}
    alloc: dict[str, Resources] = {}
    for g in waiting:
        demand[g.respool] = demand.get(g.respool, Resources()) + g.total
    for g in running:
        alloc[g.respool] = alloc.get(g.respool, Resources()) + g.total
    ent_ms = median_ms(lambda: entitlements(policies, capacity, demand, alloc), a.repeat)

    resmgr_manager.RETRY_AFTER_FAILED_PLACEMENT_S = 1e-6  # every round looks at every waiting gang again
    resmgr_manager.UNPARK_EVERY_S = 0.0
    def launched(rm: ResourceManager, got: list[GangRequest]) -> None:
        """What the placement engine and the job manager do with admitted gangs: they run, and hold their
        allocation (leaving the in-flight window)."""
        rm.set_placements([GangPlacement(g.gang_id, g.job_id, g.attempt, ()) for g in got], [])
        placed, _ = rm.take_placements(len(got), 0.0)
        rm.ack_placements([(p.gang_id, p.attempt) for p in placed], [])

    admitted, round_ms, blocked_ms, looked_at = [], [], [], []
    for _ in range(max(3, a.repeat // 4)):
        rm = ResourceManager(lambda: pools)
        rm.enqueue(waiting, running)
        t0 = time.perf_counter()
        got = rm.dequeue(500, 0.0, capacity)
        round_ms.append((time.perf_counter() - t0) * 1000)
        admitted.append(len(got))
        launched(rm, got)
        while got := rm.dequeue(500, 0.0, capacity):  # admit what fits, until every pool is at its entitlement
            launched(rm, got)
        looked_at.append(len(rm._q.waiting_pools()))
        rm.enqueue(gangs(1, leaves, rng, start=10**8))  # an input changed: entitlements are recomputed
        t0 = time.perf_counter()
        rm.dequeue(500, 0.0, capacity)
        blocked_ms.append((time.perf_counter() - t0) * 1000)
    probe_ms, admission_part, probes_n, victims_n, reserved_n = _full_cluster_round(a, pools, leaves, rng)
    results = {
        "full_round_ms": statistics.median(probe_ms), "full_round_admission_ms": statistics.median(admission_part),
        "full_round_probes": statistics.median(probes_n), "full_round_victim_sets": statistics.median(victims_n),
        "full_round_reservations": statistics.median(reserved_n),
        "pools": len(pools), "waiting_gangs": len(waiting), "running_gangs": len(running), "hosts": a.hosts,
        "entitlement_ms": ent_ms,
        "admission_round_ms": statistics.median(round_ms), "admitted_in_round": statistics.median(admitted),
        "blocked_round_ms": statistics.median(blocked_ms), "blocked_round_gangs": statistics.median(looked_at),
        "pipeline_cpu_ms_per_gang_2": pipeline[2], "pipeline_cpu_ms_per_gang_32": pipeline[32],
    }
    print(f"scheduling round: {len(pools)} pools, {len(waiting)} waiting gangs, {len(running)} running, "
          f"{a.hosts} hosts")
    print(table([
        ("entitlement of every pool", f"{ent_ms:.2f} ms"),
        ("admission round (dequeue of 500)", f"{results['admission_round_ms']:.1f} ms, "
                                             f"{results['admitted_in_round']:.0f} gangs admitted"),
        ("round with every pool at its entitlement", f"{results['blocked_round_ms']:.1f} ms "
                                                     f"({results['blocked_round_gangs']:.0f} pools' first gangs "
                                                     f"looked at)"),
        ("full cluster: admission, probes, victims, reservations",
         f"{results['full_round_ms']:.1f} ms ({results['full_round_admission_ms']:.1f} ms in resmgr; "
         f"{results['full_round_probes']:.0f} probes: {results['full_round_victim_sets']:.0f} victim sets, "
         f"{results['full_round_reservations']:.0f} reservations)"),
        (f"pipeline on the sim backend ({a.pipeline_hosts} hosts), CPU per gang of 8",
         f"{pipeline[2]:.3f} ms at 2 gangs a round, {pipeline[32]:.3f} ms at 32"),
    ]))
    print(f"  json: {write_results('scheduling', results, a.json)}")
    return 0


def _pipeline(n: int, per_round: int, hosts: int) -> float:
    """CPU ms per gang of the scheduling pipeline (module docstring), `n` gangs, `per_round` a round."""
    clock = [1000.0]
    backend = SimBackend(make_sim_hosts(hosts, HOST, racks=40, ports_per_host=1000), clock=lambda: clock[0],
                         timer_thread=False)
    hm = HostManager(backend, clock=lambda: clock[0])
    hm.start()
    rm = ResourceManager(lambda: [ResourcePool("/")], clock=lambda: clock[0])
    resmgr: ResourceManagerClient = InProcessResourceManager(rm)
    engine = PlacementEngine(resmgr, InProcessHostManager(hm), poll_ms=0, clock=lambda: clock[0])
    one_gpu = Resources(cpu=1, mem=1024, gpu=1)
    engine.run_once()  # the first sync copies every host: not part of a gang's cost
    seq, done, t0 = hm.last_seq, 0, time.process_time()
    while done < n:
        batch = [GangRequest(gang_id=f"j{done + i}/0", job_id=f"j{done + i}", attempt=1,
                             members=tuple(MemberRequest(m, f"j{done + i}-{m}-1", one_gpu) for m in range(8)),
                             enqueued_at=clock[0]) for i in range(per_round)]
        rm.enqueue(batch)
        while engine.run_once() and rm.queue()[1]:  # (a round takes what was admitted)
            pass
        placed, _ = rm.take_placements(per_round, 0.0)
        rm.ack_placements([(p.gang_id, p.attempt) for p in placed], [])
        hm.launch([GangLaunch(p.gang_id, p.attempt, tuple(
            LaunchSpec(m.task_id, p.job_id, m.instance, p.attempt, m.hostname, "", {}, m.resources, m.gpu_ids,
                       m.ports) for m in p.members)) for p in placed])
        clock[0] += 1.0
        backend.kill([m.task_id for p in placed for m in p.members])  # (they end: their hosts are free again)
        events, _ = hm.wait_events(seq, 100_000, 0.0)
        seq = events[-1][0] if events else seq
        hm.ack_events(seq)
        rm.remove([(p.gang_id, p.attempt) for p in placed])
        if len(placed) != per_round:
            raise RuntimeError(f"pipeline: {len(placed)} of {per_round} gangs placed")
        done += per_round
    return (time.process_time() - t0) * 1000 / done


def _full_cluster_round(a: argparse.Namespace, pools: list[ResourcePool], leaves: list[str], rng: random.Random
                        ) -> tuple[list[float], list[float], list[int], list[int], list[int]]:
    offers = [HostOffer(f"h{i:04d}", "10.0.0.1", HOST, capacity=HOST, has_gpus=True) for i in range(a.hosts)]
    index = HostIndex(offers)
    running: list[GangRequest] = []
    for g in gangs(20 * a.gangs, leaves, rng, start=10**9):  # fill the cluster
        placed, _ = place([g], index)
        if not placed:
            if sum(o.free.gpu for o in index.offers()) < 16:
                break
            continue
        members = tuple(MemberRequest(m.instance, m.task_id, m.resources, m.hostname) for m in placed[0].members)
        running.append(GangRequest(g.gang_id, g.job_id, 1, members, g.priority, g.respool, enqueued_at=g.enqueued_at,
                                   running_since=1000.0 + len(running) % 97,
                                   max_runtime_s=3600.0 if len(running) % 3 == 0 else 0.0))
    waiting = gangs(a.gangs, leaves, rng, start=10**10)
    total_ms, admission_ms, probes_n, victims_n, reserved_n = [], [], [], [], []
    clock = [5000.0]
    for _ in range(max(3, a.repeat // 4)):
        clock[0] = 5000.0
        rm = ResourceManager(lambda: pools, clock=lambda: clock[0], preemption_settle_s=0.0)
        rm.enqueue(waiting, running)
        got = rm.dequeue(500, 0.0, HOST.scale(a.hosts))  # what fits its pool's entitlement: no host fits it
        rm.set_placements([], [PlacementFailure(g.gang_id, g.job_id, g.attempt, "no hosts") for g in got])
        rm.take_probes()
        clock[0] += 10.0
        for e in rm._q.entries.values():
            e.not_before = 0.0
        t0 = time.perf_counter()
        rm.dequeue(500, 0.0, HOST.scale(a.hosts))
        probes = rm.take_probes()
        t1 = time.perf_counter()
        v = r = 0
        for p in probes:
            cands = [Candidate(gid, h.attempt, h.usage, h.total) for gid, h in p.candidates]
            victims = choose_victims(p.gang, cands, p.need, index) if cands else None
            if victims:
                v += 1
                res = reserve_after(p.gang, victims, index)
            else:
                res = reserve(p.gang, [(Candidate(gid, h.attempt, h.usage, h.total), h.ends_at or 0.0)
                                       for gid, h in p.ending], index)
            r += res is not None
        t2 = time.perf_counter()
        total_ms.append((t2 - t0) * 1000)
        admission_ms.append((t1 - t0) * 1000)
        probes_n.append(len(probes))
        victims_n.append(v)
        reserved_n.append(r)
    return total_ms, admission_ms, probes_n, victims_n, reserved_n


if __name__ == "__main__":
    sys.exit(main())
