"""Candidate plans on a cluster, and the search for the best.

A plan is how many GPUs (workers) go on which hosts, the local batch, and for parameter-server models how many
servers go where. The all-reduce search is exact for the cost model without enumerating placements: a ring's step
time depends on the hosts used only through their number, their slowest NIC (and, on one host, its link) and the
largest compute load over them (GPU speed and, with contention kappa, the GPUs busy on the host); a hierarchical
all-reduce's also on the largest within-host term, f(g) * link scale over its hosts. So for every pair of
thresholds (a GPU speed and a NIC bandwidth that some host has), among the hosts at or above both, the n hosts
that can take the most GPUs within a load (and, hierarchical, a level of the within-host term) are the best n
hosts of that class at the least load (and level) that fits; the K GPUs go over them as evenly as those caps allow
(ties go to fewer hosts, then the evenest). Upper bounds on each (K, class) pair's score stop the search
once no pair left can beat the plans kept, and hosts are grouped by type and free GPUs first, so 1,000 hosts cost
what their few kinds cost. Parameter-server plans take the threshold classes' hosts with the most free GPUs and
try the servers' layouts on them (not exhaustive).
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

from peloton.errors import InvalidArgument
from peloton.modelaware import hostlabels
from peloton.modelaware.cost import (
    DEFAULT_GPU_LINK,
    DEFAULT_GPU_MODEL,
    DEFAULT_NIC_GBPS,
    HIERARCHICAL,
    PS,
    RING,
    CostParams,
    HostUse,
    Prediction,
    combine,
    compute_time,
    link_scale,
    network_time,
    pairs,
    predict,
    ps_step_distinct,
    step_time_counted,
)
from peloton.modelaware.gpus import DEFAULT_TABLE, GpuModel, GpuTable

OBJECTIVES = ("throughput", "efficiency")
MAX_PLAN_GPUS = 4096
MAX_SERVERS = 64


@dataclass(frozen=True, slots=True)
class FreeHost:
    name: str
    free_gpus: int
    gpu_model: str = DEFAULT_GPU_MODEL
    nic_gbps: float = DEFAULT_NIC_GBPS
    gpu_link: str = DEFAULT_GPU_LINK
    can_host_server: bool = True  # room for a parameter server (its CPU and memory)


@dataclass(frozen=True, slots=True)
class Plan:
    hosts: tuple[tuple[str, int], ...]  # (host, GPUs on it), most GPUs first
    prediction: Prediction
    servers: tuple[str, ...] = ()  # a parameter server's host, one entry per server

    @property
    def gpus_per_host(self) -> tuple[int, ...]:
        return tuple(g for _, g in self.hosts)

    @property
    def gpus(self) -> int:
        return sum(self.gpus_per_host)

    @property
    def samples_per_s(self) -> float:
        return self.prediction.samples_per_s

    def score(self, objective: str) -> float:
        return self.samples_per_s / self.gpus if objective == "efficiency" else self.samples_per_s


@dataclass(frozen=True, slots=True)
class PlanRequest:
    gpus: int = 0  # exactly this many; 0: choose up to max_gpus
    max_gpus: int = 0  # 0: as many as are free
    min_gpus: int = 1
    local_bsz: float = 0.0  # per GPU; or
    global_bsz: float = 0.0  # over the gang (local = global / K)
    objective: str = "throughput"
    pattern: str = RING
    servers: int = 0  # parameter servers; 0 with the ps pattern: choose 1..min(K, MAX_SERVERS)
    top: int = 5  # plans returned, best first

    def validate(self) -> None:
        if self.objective not in OBJECTIVES:
            raise InvalidArgument(f"objective: must be one of {', '.join(OBJECTIVES)}, got {self.objective!r}",
                                  field="objective")
        if bool(self.local_bsz) == bool(self.global_bsz):
            raise InvalidArgument("local_bsz: give the local batch per GPU or the global batch (one of them)",
                                  field="local_bsz")
        for name in ("gpus", "max_gpus", "min_gpus"):
            v = getattr(self, name)
            if not 0 <= v <= MAX_PLAN_GPUS:
                raise InvalidArgument(f"{name}: must be 0..{MAX_PLAN_GPUS}, got {v}", field=name)
        if self.gpus and self.max_gpus:
            raise InvalidArgument("max_gpus: give gpus or max_gpus, not both", field="max_gpus")
        if self.max_gpus and self.min_gpus > self.max_gpus:
            raise InvalidArgument(f"min_gpus: {self.min_gpus} is more than max_gpus ({self.max_gpus})",
                                  field="min_gpus")
        if not 0 <= self.servers <= MAX_SERVERS:
            raise InvalidArgument(f"servers: must be 0..{MAX_SERVERS}, got {self.servers}", field="servers")
        if self.servers and self.pattern != PS:
            raise InvalidArgument(f"servers: only for the {PS} pattern", field="servers")


@dataclass(frozen=True, slots=True)
class _Kind:
    """Hosts that look the same to the cost model (and have the same free GPUs)."""

    gpu_model: str
    nic_gbps: float
    gpu_link: str
    free: int
    rel: float
    names: tuple[str, ...]


def _kinds(hosts: Sequence[FreeHost], table: GpuTable) -> list[_Kind]:
    groups: dict[tuple[str, float, str, int], list[str]] = {}
    for h in hosts:
        if h.free_gpus > 0:
            groups.setdefault((h.gpu_model.lower(), h.nic_gbps, h.gpu_link, h.free_gpus), []).append(h.name)
    return [_Kind(m, nic, link, free, table.relative(m), tuple(sorted(names)))
            for (m, nic, link, free), names in groups.items()]


def _spread(k: int, frees: Sequence[int]) -> list[int]:
    """k GPUs over hosts with these free GPUs (sorted, most first), one at least on each, as evenly as they allow."""
    n = len(frees)
    out = [1] * n
    left = k - n
    # water-filling: raise the lowest level first, capped by each host's free GPUs
    while left > 0:
        room = [i for i in range(n) if out[i] < frees[i]]
        if not room:
            break
        level = min(out[i] for i in room)
        for i in room:
            if left and out[i] == level:
                out[i] += 1
                left -= 1
    return out


def _candidates(kinds: list[_Kind], k: int) -> list[list[tuple[_Kind, int]]]:
    """For K GPUs: per (GPU speed, NIC) threshold class and host count N, the N hosts with the most free GPUs
    (as (kind, how many of its hosts)), plus each single host able to take all K."""
    out: list[list[tuple[_Kind, int]]] = []
    seen: set[tuple[tuple[str, float, str, int, int], ...]] = set()
    rels = sorted({kd.rel for kd in kinds})
    nics = sorted({kd.nic_gbps for kd in kinds})
    for kd in kinds:
        if kd.free >= k:
            out.append([(kd, 1)])
    for r in rels:
        for u in nics:
            cls = sorted((kd for kd in kinds if kd.rel >= r and kd.nic_gbps >= u), key=lambda kd: -kd.free)
            if not cls:
                continue
            total_hosts = sum(len(kd.names) for kd in cls)
            chosen: list[tuple[_Kind, int]] = []
            free_sum = 0
            for n in range(1, min(k, total_hosts) + 1):
                # add the next host of the class (most free first)
                if chosen and chosen[-1][1] < len(chosen[-1][0].names):
                    kd, c = chosen[-1]
                    chosen[-1] = (kd, c + 1)
                else:
                    chosen.append((cls[len(chosen)], 1))
                free_sum += chosen[-1][0].free
                if n >= 2 and free_sum >= k:
                    key = tuple((kd.gpu_model, kd.nic_gbps, kd.gpu_link, kd.free, c) for kd, c in chosen)
                    if key not in seen:
                        seen.add(key)
                        out.append(list(chosen))
    return out


def _assign(choice: list[tuple[_Kind, int]], k: int) -> list[tuple[str, int, _Kind]]:
    hosts = [(kd.names[i], kd.free, kd) for kd, c in choice for i in range(c)]
    hosts.sort(key=lambda h: (-h[1], h[0]))
    counts = _spread(k, [h[1] for h in hosts])
    return [(name, g, kd) for (name, _, kd), g in zip(hosts, counts, strict=True)]


def _server_layouts(assigned: list[tuple[str, int, _Kind]], pool: Sequence[FreeHost], n: int,
                    ) -> list[tuple[list[HostUse], tuple[str, ...]]]:
    """n parameter servers: spread over the workers' hosts, or on hosts of their own (the best NICs first)."""
    layouts = []
    uses = [HostUse(g, kd.gpu_model, kd.nic_gbps, kd.gpu_link) for _, g, kd in assigned]
    colocated = [0] * len(uses)
    for i in range(n):
        colocated[i % len(uses)] += 1
    layouts.append(([HostUse(u.gpus, u.gpu_model, u.nic_gbps, u.gpu_link, s) for u, s in zip(uses, colocated,
                                                                                                strict=True)],
                    tuple(assigned[i % len(uses)][0] for i in range(n))))
    used = {name for name, _, _ in assigned}
    others: list[FreeHost] = []
    for h in pool:  # the hosts that can take a server, best NIC first
        if len(others) == n:
            break
        if h.name not in used:
            others.append(h)
    if len(others) == n:
        layouts.append((uses + [HostUse(0, h.gpu_model, h.nic_gbps, h.gpu_link, 1) for h in others],
                        tuple(h.name for h in others)))
    return layouts


def search(params: CostParams, hosts: Sequence[FreeHost], req: PlanRequest,
           table: GpuTable = DEFAULT_TABLE) -> list[Plan]:
    """The best plans for `req` on `hosts` (their free GPUs), best first; empty when nothing fits."""
    req.validate()
    kinds = _kinds(hosts, table)
    free_total = sum(len(kd.names) * kd.free for kd in kinds)
    if req.gpus:
        sizes = [req.gpus] if req.gpus <= free_total else []
    else:
        top = min(req.max_gpus or free_total, free_total)
        sizes = list(range(max(req.min_gpus, 1), top + 1))
    if not sizes:
        return []
    if req.pattern == PS:
        return _search_ps(params, hosts, kinds, sizes, req, table)
    return _search_allreduce(params, kinds, sizes, req, table)


def size_rates(params: CostParams, hosts: Sequence[FreeHost], sizes: Sequence[int], req: PlanRequest,
               table: GpuTable = DEFAULT_TABLE) -> list[float]:
    """For each K of `sizes`, the samples/s of the best plan `search` finds for exactly K GPUs with `req` (top 1;
    0.0 where nothing fits): the same numbers, bit for bit, as one search per size (`instances: auto` rates every
    allowed count), but the hosts' kinds and threshold classes are made once, and a plan's prediction is made from
    its kinds of hosts without naming them (a size of 3,000 GPUs takes some 750 hosts)."""
    out: list[float] = []
    for k in sizes:
        replace(req, gpus=k, max_gpus=0, top=1).validate()
    if req.pattern == PS:  # _search_ps's candidates, those that cannot beat the best left out
        kinds = _kinds(hosts, table)
        free_total = sum(len(kd.names) * kd.free for kd in kinds)
        pool = _server_pool(hosts)
        for k in sizes:
            best = _best_ps(params, pool, kinds, k, req, table) if k <= free_total else None
            out.append(best.samples_per_s if best is not None else 0.0)
        return out
    kinds = _kinds(hosts, table)
    free_total = sum(len(kd.names) * kd.free for kd in kinds)
    engine = _AllReduce(params, kinds, req, table) if kinds else None
    for k in sizes:
        top = engine.best([k], 1) if engine is not None and k <= free_total else None
        kept = list(top.kept.values()) if top is not None else []
        out.append(engine.rate(kept[0][2]) if engine is not None and kept else 0.0)
    return out


def _server_pool(hosts: Sequence[FreeHost]) -> list[FreeHost]:
    return sorted((h for h in hosts if h.can_host_server), key=lambda h: (-h.nic_gbps, h.name))


def _ps_plans(params: CostParams, pool: Sequence[FreeHost], assigned: list[tuple[str, int, _Kind]], k: int,
              bsz: float, req: PlanRequest, table: GpuTable) -> Iterator[Plan]:
    """Every servers' count and layout _search_ps tries on these workers."""
    for n in ([req.servers] if req.servers else range(1, min(k, MAX_SERVERS) + 1)):
        for uses, servers in _server_layouts(assigned, pool, n):
            pred = predict(params, uses, bsz, PS, table)
            yield Plan(tuple((name, g) for name, g, _ in assigned), pred, servers)


def _search_ps(params: CostParams, hosts: Sequence[FreeHost], kinds: list[_Kind], sizes: list[int],
               req: PlanRequest, table: GpuTable) -> list[Plan]:
    plans: list[Plan] = []
    pool = _server_pool(hosts)
    for k in sizes:
        bsz = req.local_bsz or req.global_bsz / k
        for choice in _candidates(kinds, k):
            plans.extend(_ps_plans(params, pool, _assign(choice, k), k, bsz, req, table))
    plans.sort(key=lambda p: _rank(p, req.objective))
    return _distinct(plans, req.top)


def _ps_score_bound(params: CostParams, assigned: list[tuple[str, int, _Kind]], k: int, bsz: float,
                    objective: str, table: GpuTable, ns: Sequence[int], pool_nic: float) -> float:
    """An upper bound of the score of every servers' layout on these workers, with n servers for n in `ns`. A host
    with w of the K workers and s of the n servers moves 2 (w + s/n (K - 2w)) units of S through its NIC: a worker
    host at least 2 min(w, K - w) whatever s is; some host holds a server: a worker host then at least 2 (w + (K -
    2w)/n) (or 2 (K - w) when it has more than half the workers), a host of its own 2K/n, at the best NIC of the
    hosts that can take one (`pool_nic`); both fall as n grows. The compute does not depend on the servers. Workers on one host are not
    bounded (with the servers there too, no NIC is crossed)."""
    if len(assigned) < 2:
        return math.inf
    uses = [HostUse(g, kd.gpu_model, kd.nic_gbps, kd.gpu_link) for _, g, kd in assigned]
    tc = compute_time(params, uses, bsz, table)
    ref = params.reference.nic_gbps
    workers = max(2 * min(g, k - g) * ref / kd.nic_gbps for _, g, kd in assigned)
    # the least traffic a host holding a server can have: both terms fall as n grows, so at the most servers
    n = max(ns)
    own = 2 * k / n * ref / pool_nic if pool_nic > 0 else math.inf
    holder = min(own, min((2 * (g + (k - 2 * g) / n) if k >= 2 * g else 2 * (k - g)) * ref / kd.nic_gbps
                          for _, g, kd in assigned))
    ts = params.alpha_n + params.beta_n * max(workers, holder) * (1 - 1e-9)  # below the layouts' own rounding
    samples = k * bsz / combine(tc, ts, params.gamma)
    return samples / k if objective == "efficiency" else samples


def _best_ps(params: CostParams, pool: Sequence[FreeHost], kinds: list[_Kind], k: int, req: PlanRequest,
             table: GpuTable) -> Plan | None:
    """The plan `search` ranks first for exactly K GPUs of a parameter-server request (the same plan, so the same
    samples/s to the bit), without its work: a layout is rated from one of each kind of host in it
    (cost.ps_step_distinct) instead of every host; the candidates are taken best bound first, and one whose bound
    rounds below the best score found is left out (ranks compare scores rounded, so one that rounds equal is still
    tried). Ties keep _search_ps's order: candidates as _candidates gives them, then servers' count, colocated first."""
    bsz = req.local_bsz or req.global_bsz / k
    cands = [_assign(choice, k) for choice in _candidates(kinds, k)]
    ns = [req.servers] if req.servers else list(range(1, min(k, MAX_SERVERS) + 1))
    pool_nic = pool[0].nic_gbps if pool else 0.0  # (best first)
    bounds = [round(_ps_score_bound(params, a, k, bsz, req.objective, table, ns, pool_nic), 9) for a in cands]
    best: tuple[tuple[object, ...], int, int] | None = None  # (rank, candidate, layout within it): the least
    for i in sorted(range(len(cands)), key=lambda i: -bounds[i]):
        if best is not None and bounds[i] < -cast(float, best[0][0]):  # ranks lead with -round(score, 9)
            continue
        assigned = cands[i]
        hosts = tuple((name, g) for name, g, _ in assigned)
        most = max(g for _, g, _ in assigned)
        for j, (step, n) in enumerate(_ps_layout_steps(params, pool, assigned, k, ns, bsz, table)):
            samples = k * bsz / step  # Prediction.samples_per_s's arithmetic
            score = samples / k if req.objective == "efficiency" else samples
            key = ((-round(score, 9), len(hosts), most, n, hosts), i, j)  # _rank's key, then the order of insertion
            if best is None or key < best:
                best = key
    if best is None:
        return None
    _, i, j = best
    return list(_ps_plans(params, pool, cands[i], k, bsz, req, table))[j]


def _ps_layout_steps(params: CostParams, pool: Sequence[FreeHost], assigned: list[tuple[str, int, _Kind]], k: int,
                     ns: Sequence[int], bsz: float, table: GpuTable) -> Iterator[tuple[float, int]]:
    """(step time, servers) of each layout _ps_plans makes on these workers, in its order: for each servers'
    count n, spread over the workers' hosts (the first n mod N hosts take one more), then on hosts of their own."""
    workers = [HostUse(g, kd.gpu_model, kd.nic_gbps, kd.gpu_link) for _, g, kd in assigned]
    count = len(workers)
    # one of each kind of worker host among the first r hosts and among the others, for every r
    prefix: list[frozenset[HostUse]] = [frozenset()]
    for w in workers:
        prefix.append(prefix[-1] | {w})
    suffix: list[frozenset[HostUse]] = [frozenset()]
    for w in reversed(workers):
        suffix.append(suffix[-1] | {w})
    suffix.reverse()
    alone = prefix[-1]
    used = {name for name, _, _ in assigned}
    others: list[HostUse] = []  # _server_layouts' hosts of their own, best NIC first
    for h in pool:
        if len(others) == max(ns):
            break
        if h.name not in used:
            others.append(HostUse(0, h.gpu_model, h.nic_gbps, h.gpu_link, 1))
    for n in ns:
        q, r = divmod(n, count)
        spread = {replace(w, servers=q + 1) for w in prefix[r]} | {replace(w, servers=q) for w in suffix[r]}
        yield ps_step_distinct(params, list(spread), k, n, bsz, table), n
        if len(others) >= n:
            yield ps_step_distinct(params, list(alone | set(others[:n])), k, n, bsz, table), n


def _rank(p: Plan, objective: str) -> tuple[object, ...]:
    """Best first; ties go to fewer hosts, then the fewest GPUs on any one host, then fewer servers."""
    return (-round(p.score(objective), 9), len(p.hosts), max(p.gpus_per_host), len(p.servers), p.hosts)


# All-reduce plans (ring and hierarchical). A plan's step time depends on its hosts through their number n, their
# largest compute load (ref / rel * (1 + kappa (g - 1)); with kappa = 0 their slowest GPU), their slowest NIC and,
# within hosts, the largest per-host ring term f(g) * link scale (hierarchical; a ring on one host too). The search goes through threshold classes: the hosts at or above a GPU speed and a NIC
# bandwidth some host has. Within a class it scores a candidate as if every host were the class's slowest (a
# lower bound of the candidate's own prediction, and exact for the best plan: the best plan's hosts are all in the
# class of its own slowest GPU and NIC, where a candidate at least as good is found). For the hierarchical
# pattern, a level t of the within-host term caps each host at the most GPUs whose term stays within t; the least
# t at which the n hosts of largest caps take K is the best within-host term n hosts of the class can have. A load
# v of the compute caps each host likewise (_Class); a candidate's cap is the least of the two.
# Bounds: each (K, class) pair has an upper bound on its score; pairs are taken best bound first and the search
# stops when a bound falls below the score of the `top`-th plan kept (one per shape). A plan's hosts are named
# only for the plans kept.


def _ring_units(g: int) -> float:
    """Units of S each member of a ring of g moves (2(g-1)/g)."""
    return 2 * (g - 1) / g


class _Class:
    """Hosts at or above a GPU speed and a NIC bandwidth; `rel` and `nic` are their slowest.

    A host's cap is the most GPUs it can take at a pair of levels: j, of the within-host ring term (hierarchical;
    a ring has one level, infinite), and c, of the compute load (a host of relative speed r with g GPUs busy
    computes ref / r * (1 + kappa (g - 1)) times the reference GPU's time alone). The class's loads are those of its
    hosts from its slowest GPU alone up: with kappa = 0 that is one load, and every cap is the host's free GPUs.
    A cap depends on a host's GPU speed, link and free GPUs only: the counts are kept per such group, the hosts are
    named only for the plans kept."""

    def __init__(self, kinds: list[_Kind], scales: dict[str, float], levels: list[float], ref_rel: float,
                 kappa: float) -> None:
        # among hosts of the same cap: the faster GPU, the faster NIC, the better link first
        self.kinds = sorted(kinds, key=lambda kd: (-kd.rel, -kd.nic_gbps, scales[kd.gpu_link], -kd.free,
                                                   kd.names))
        self.rel = min(kd.rel for kd in kinds)
        self.rel_max = max(kd.rel for kd in kinds)
        self.nic = min(kd.nic_gbps for kd in kinds)
        self.hosts = sum(len(kd.names) for kd in kinds)
        self.free = sum(len(kd.names) * kd.free for kd in kinds)
        self.scale_min = min(scales[kd.gpu_link] for kd in kinds)
        self._levels = levels
        self._scales = scales
        self._ref_rel = ref_rel
        self._kappa = kappa
        floor = self.load(self.rel, 1)
        self.loads = [floor] if not kappa else sorted(
            {v for kd in kinds for g in range(1, kd.free + 1) if (v := self.load(kd.rel, g)) >= floor})
        self.top_load = len(self.loads) - 1
        self._groups: list[tuple[int, list[int], list[int]]] | None = None  # made when first needed
        self._runs: dict[tuple[int, int], tuple[list[int], list[int], list[int]]] = {}
        self._ranked: dict[tuple[int, int], list[tuple[_Kind, int]]] = {}  # kind_runs' order at levels (j, c)

    def load(self, rel: float, g: int) -> float:
        """A GPU's compute time on a host of relative speed `rel` with g GPUs busy, in reference GPUs alone."""
        return self._ref_rel / rel * (1 + self._kappa * (g - 1))

    @staticmethod
    def _level_caps(levels: list[float], scale: float, free: int) -> list[int]:
        out = []
        for t in levels:
            g = free
            while g > 1 and _ring_units(g) * scale > t * (1 + 1e-12):
                g -= 1
            out.append(g)
        return out

    def _load_caps(self, rel: float, free: int) -> list[int]:
        out = []
        g = 1
        for v in self.loads:  # rising: so does the cap
            while g < free and self.load(rel, g + 1) <= v * (1 + 1e-12):
                g += 1
            out.append(g)
        return out

    def _at(self, j: int, c: int) -> tuple[list[int], list[int], list[int]]:
        """The caps at levels (j, c), largest first (each once), and prefix sums of hosts and of caps."""
        run = self._runs.get((j, c))
        if run is None:
            if self._groups is None:
                counts: dict[tuple[float, float, int], int] = {}
                for kd in self.kinds:
                    key = (kd.rel, self._scales[kd.gpu_link], kd.free)
                    counts[key] = counts.get(key, 0) + len(kd.names)
                # per group: (hosts, its cap at each within-host level, its cap at each load)
                self._groups = [(n, self._level_caps(self._levels, scale, free), self._load_caps(rel, free))
                                for (rel, scale, free), n in counts.items()]
            hosts_at: dict[int, int] = {}
            for n, by_level, by_load in self._groups:
                cap = min(by_level[j], by_load[c])
                hosts_at[cap] = hosts_at.get(cap, 0) + n
            order = sorted(hosts_at, reverse=True)
            hosts = [0]
            caps = [0]
            for cap in order:
                hosts.append(hosts[-1] + hosts_at[cap])
                caps.append(caps[-1] + cap * hosts_at[cap])
            run = self._runs[(j, c)] = (order, hosts, caps)
        return run

    def capacity(self, j: int, c: int, n: int) -> int:
        """GPUs the n hosts of largest cap at levels (j, c) take."""
        order, hosts, caps = self._at(j, c)
        i = bisect.bisect_right(hosts, n) - 1
        if i >= len(order):
            return caps[-1]
        return caps[i] + (n - hosts[i]) * order[i]

    def fewest_hosts(self, j: int, c: int, k: int) -> int:
        """The fewest hosts whose caps at levels (j, c) add up to k (assumes the class takes k)."""
        order, hosts, caps = self._at(j, c)
        i = bisect.bisect_left(caps, k)  # caps[i-1] < k <= caps[i]
        return hosts[i - 1] + -(-(k - caps[i - 1]) // order[i - 1])

    def least_load(self, j: int, n: int, k: int, lo: int = 0) -> int:
        """The least load c >= lo at which n hosts take k GPUs within level j; top_load + 1 when none does."""
        hi = self.top_load
        if self.capacity(j, hi, n) < k:
            return hi + 1
        while lo < hi:
            mid = (lo + hi) // 2
            if self.capacity(j, mid, n) >= k:
                hi = mid
            else:
                lo = mid + 1
        return lo

    def cap_runs(self, j: int, c: int, n: int) -> list[tuple[int, int]]:
        """The caps of the n hosts of largest cap at levels (j, c), largest first, as (cap, how many hosts)."""
        order, hosts, _ = self._at(j, c)
        out: list[tuple[int, int]] = []
        taken = 0
        for i, cap in enumerate(order):
            m = min(hosts[i + 1] - hosts[i], n - taken)
            out.append((cap, m))
            taken += m
            if taken == n:
                break
        return out

    def shape(self, j: int, c: int, n: int, k: int) -> tuple[int, ...]:
        """The GPUs per host (most first) of K on the n hosts of largest cap at levels (j, c)."""
        pieces = sorted((piece for run in _fill_runs(k, self.cap_runs(j, c, n)) for piece in run), reverse=True)
        return tuple(itertools.chain.from_iterable(itertools.repeat(g, m) for g, m in pieces))

    def kind_runs(self, j: int, c: int, n: int) -> list[tuple[_Kind, int, int]]:
        """The n hosts of largest cap at levels (j, c), in the class's order among equal caps, as (kind, cap, how
        many of its hosts: the first ones of its names)."""
        ranked = self._ranked.get((j, c))
        if ranked is None:
            ranked = []
            for kd in self.kinds:
                cap = min(self._level_caps([self._levels[j]], self._scales[kd.gpu_link], kd.free)[0],
                          self._load_caps(kd.rel, kd.free)[c])
                ranked.append((kd, cap))
            ranked.sort(key=lambda x: -x[1])  # stable: the class's order among equal caps
            self._ranked[(j, c)] = ranked
        out: list[tuple[_Kind, int, int]] = []
        taken = 0
        for kd, cap in ranked:
            m = min(len(kd.names), n - taken)
            if m > 0:
                out.append((kd, cap, m))
                taken += m
            if taken == n:
                break
        return out

    def hosts_of(self, j: int, c: int, n: int) -> list[tuple[str, int, _Kind]]:
        """The n hosts of largest cap at levels (j, c), in the class's order among equal caps."""
        return [(name, cap, kd) for kd, cap, m in self.kind_runs(j, c, n) for name in kd.names[:m]]


def _fill(k: int, caps: Sequence[int]) -> list[int]:
    """k GPUs over hosts with these caps (k between len(caps) and their sum), one at least on each, as evenly as
    the caps allow; the first hosts take the remainder."""
    return [g for run in _fill_runs(k, [(c, 1) for c in caps]) for g, m in run for _ in range(m)]


def _fill_runs(k: int, runs: Sequence[tuple[int, int]]) -> list[list[tuple[int, int]]]:
    """_fill on hosts given as runs (cap, how many hosts in a row with it): per run, the GPUs its hosts take as
    (GPUs, how many hosts), in the run's order."""
    hosts: dict[int, int] = {}  # cap -> hosts (a cluster has few caps, however many runs)
    for c, m in runs:
        hosts[c] = hosts.get(c, 0) + m
    lo, hi = 1, max(hosts)
    while lo < hi:  # the highest level L with sum(min(cap, L)) <= k
        mid = (lo + hi + 1) // 2
        if sum(min(c, mid) * m for c, m in hosts.items()) <= k:
            lo = mid
        else:
            hi = mid - 1
    left = k - sum(min(c, lo) * m for c, m in hosts.items())
    out: list[list[tuple[int, int]]] = []
    for c, m in runs:
        if c > lo and left:  # the first hosts above the level take the remainder, one each
            extra = min(left, m)
            left -= extra
            out.append([(lo + 1, extra)] + ([(lo, m - extra)] if m > extra else []))
        else:
            out.append([(min(c, lo), m)])
    return out


@dataclass(frozen=True, slots=True)
class _Cand:
    """K GPUs on one host of `kind`, or on the n hosts of `cls` with the largest caps at `level` and `load`."""

    k: int
    bsz: float
    kind: _Kind | None = None
    cls: _Class | None = None
    level: int = 0
    load: int = 0
    n: int = 1


class _Top:
    """The best `size` candidates, one per shape (GPUs per host, most first)."""

    def __init__(self, size: int) -> None:
        self.size = max(size, 1)
        self.kept: dict[tuple[int, ...], tuple[tuple[object, ...], float, _Cand]] = {}
        self.bar = -math.inf  # the score a candidate must reach to be kept (once `size` are)

    def offer(self, score: float, shape: tuple[int, ...], cand: _Cand) -> None:
        key = (-round(score, 9), len(shape), shape[0], shape)
        old = self.kept.get(shape)
        if old is not None and old[0] <= key:
            return
        self.kept[shape] = (key, score, cand)
        if len(self.kept) > self.size:
            worst = max(self.kept, key=lambda sh: self.kept[sh][0])
            del self.kept[worst]
        if len(self.kept) >= self.size:
            self.bar = min(v[1] for v in self.kept.values())

    def below(self, score: float) -> bool:
        """Whether `score` cannot reach the kept plans (with room for rounding)."""
        return score < self.bar - 1e-9 * abs(self.bar)


def _search_allreduce(params: CostParams, kinds: list[_Kind], sizes: list[int], req: PlanRequest,
                      table: GpuTable) -> list[Plan]:
    search = _AllReduce(params, kinds, req, table)
    top = search.best(sizes, req.top)
    plans = [_materialize(params, cand, req.pattern, table) for _, _, cand in top.kept.values()]
    plans.sort(key=lambda pl: _rank(pl, req.objective))
    return plans


class _AllReduce:
    """The all-reduce search on a cluster's kinds of hosts: what does not depend on the size (the threshold
    classes, their caps at each level) is made once, and searched for any sizes (size_rates: every size apart)."""

    def __init__(self, params: CostParams, kinds: list[_Kind], req: PlanRequest, table: GpuTable) -> None:
        p = params
        hier = req.pattern == HIERARCHICAL
        ref_rel = table.relative(p.reference.gpu_model)
        scales = {kd.gpu_link: link_scale(p, kd.gpu_link) for kd in kinds}
        max_free = max(kd.free for kd in kinds)
        # within-host levels: every value of f(g) * scale a host can have (hierarchical); a ring caps by free GPUs
        levels = ([0.0] + sorted({_ring_units(g) * s for g in range(2, max_free + 1) for s in set(scales.values())})
                  if hier else [math.inf])
        top_level = len(levels) - 1
        classes: dict[tuple[int, ...], _Class] = {}
        for r in {kd.rel for kd in kinds}:
            for u in {kd.nic_gbps for kd in kinds}:
                members = tuple(i for i, kd in enumerate(kinds) if kd.rel >= r and kd.nic_gbps >= u)
                if members and members not in classes and sum(len(kinds[i].names) for i in members) >= 2:
                    classes[members] = _Class([kinds[i] for i in members], scales, levels, ref_rel, p.kappa)

        self.p, self.req, self.table, self.hier, self.ref_rel = p, req, table, hier, ref_rel
        self.kinds, self.scales, self.levels, self.top_level, self.classes = kinds, scales, levels, top_level, classes
        throughput = req.objective == "throughput"

        def score(k: int, bsz: float, load: float, ts: float) -> float:
            """A plan of K whose busiest GPU computes `load` times the reference GPU alone, and syncs in ts."""
            tc = (p.alpha_c + p.beta_c * bsz) * load
            step = combine(tc, ts, p.gamma)
            return k * bsz / step if throughput else bsz / step

        def net(nic: float, n: int, units: float) -> float:
            return network_time(p, p.reference.nic_gbps / nic, n, units)

        self.score, self.net = score, net

    def items(self, sizes: Sequence[int]) -> list[tuple[float, int, _Cand, float]]:
        """Every single-host candidate of the sizes (exact), and a bound for every (K, class) pair of two hosts or
        more: (bound, order, candidate, least sync time)."""
        p, hier, ref_rel, kinds = self.p, self.hier, self.ref_rel, self.kinds
        scales, classes, score, net = self.scales, self.classes, self.score, self.net
        req = self.req
        items: list[tuple[float, int, _Cand, float]] = []  # (bound, order, candidate, least sync time)
        for k in sizes:
            bsz = float(req.local_bsz or req.global_bsz / k)
            for kd in kinds:
                if kd.free >= k:
                    ts = 0.0 if k == 1 else p.alpha_r + p.beta_r * scales[kd.gpu_link] * 2 * (k - 1) / k
                    load = ref_rel / kd.rel * (1 + p.kappa * (k - 1))
                    items.append((score(k, bsz, load, ts), len(items), _Cand(k, bsz, kind=kd), ts))
            if k < 2:
                continue
            for cl in classes.values():
                if cl.free < k:
                    continue
                n_max = min(k, cl.hosts)
                # some host has ceil(K / n_max) GPUs or more, none computes faster than the class's fastest alone
                # (nor than its slowest: the class's loads start there); the least load is found when it is taken
                load = max(cl.loads[0], ref_rel / cl.rel_max * (1 + p.kappa * (-(-k // n_max) - 1)))
                if hier:
                    # the network ring's term grows with n from n = 3 on (2(n-1)/n and alpha_h 2(n-1)): least at 2 or 3
                    ts = min(net(cl.nic, m, 2 * (m - 1)) for m in (2, 3) if m <= n_max)
                    if n_max < k:  # some host has ceil(K / n_max) GPUs or more
                        ts += p.alpha_r + p.beta_r * _ring_units(-(-k // n_max)) * cl.scale_min
                else:
                    ts = net(cl.nic, _ring_fastest(p, k, n_max, cl.nic), 2 * (k - 1))  # the ring's fastest host count
                items.append((score(k, bsz, load, ts), len(items), _Cand(k, bsz, cls=cl), ts))
        return items

    def best(self, sizes: Sequence[int], size: int) -> _Top:
        """The best `size` candidates of the sizes, one per shape."""
        p, hier, levels, top_level = self.p, self.hier, self.levels, self.top_level
        score, net = self.score, self.net
        items = self.items(sizes)
        items.sort(key=lambda it: (-it[0], it[1]))

        top = _Top(size)
        for bound, _, item, ts_lo in items:
            if top.below(bound):
                break
            k, bsz, c = item.k, item.bsz, item.cls
            if c is None:
                top.offer(bound, (k,), item)
                continue
            n_max = min(k, c.hosts)
            n_lo = max(2, c.fewest_hosts(top_level, c.top_load, k))
            c_lo = c.least_load(top_level, n_max, k)
            v_lo = c.loads[c_lo]  # the least compute load of any n: more hosts never load one more
            if top.below(score(k, bsz, v_lo, ts_lo)):
                continue
            if not hier:
                for n in _ring_hosts(p, k, n_lo, n_max, c.nic):  # fastest ring first: stop at the first kept out
                    ts = net(c.nic, n, 2 * (k - 1))
                    if top.below(score(k, bsz, v_lo, ts)):
                        break
                    ci = c.least_load(top_level, n, k, c_lo)
                    s = score(k, bsz, c.loads[ci], ts)
                    if not top.below(s):
                        top.offer(s, c.shape(top_level, ci, n, k),
                                  _Cand(k, bsz, cls=c, level=top_level, load=ci, n=n))
                continue
            j_top = top_level
            n = n_lo - 1
            while n < n_max:
                n += 1
                # from n = 3 on the network ring's term only grows with n: once it alone is kept out, so is the rest
                ring = net(c.nic, n, 2 * (n - 1))
                if n >= 3 and top.below(score(k, bsz, v_lo, ring)):
                    break
                while j_top > 0 and c.capacity(j_top - 1, c.top_load, n) >= k:
                    j_top -= 1  # the least within-host level n hosts reach (at any load)
                inner_lo = p.alpha_r + p.beta_r * levels[j_top] if levels[j_top] > 0 else 0.0
                if top.below(score(k, bsz, v_lo, inner_lo + ring)):
                    # the staircase below would stop at its first step (its loads are v_lo or more); from n = 3 on
                    # so would every n until j_top falls (the ring only grows): on to the first n where it does
                    if n >= 3:
                        if j_top == 0 or c.capacity(j_top - 1, c.top_load, c.hosts) < k:
                            break
                        n = max(n, c.fewest_hosts(j_top - 1, c.top_load, k) - 1)
                    continue
                # the staircase of (load, within-host level) pairs at which n hosts take K: the least load first,
                # then each greater load with the least level it allows (falling); stop once the compute alone,
                # with the least sync n hosts can have, is kept out
                j = top_level
                for ci in range(c.least_load(top_level, n, k, c_lo), c.top_load + 1):
                    if top.below(score(k, bsz, c.loads[ci], inner_lo + ring)):
                        break
                    while j > j_top and c.capacity(j - 1, ci, n) >= k:
                        j -= 1
                    t = levels[j]
                    ts = (p.alpha_r + p.beta_r * t if t > 0 else 0.0) + ring
                    s = score(k, bsz, c.loads[ci], ts)
                    if not top.below(s):
                        top.offer(s, c.shape(j, ci, n, k),
                                  _Cand(k, bsz, cls=c, level=j, load=ci, n=n))
                    if j == j_top:
                        break  # a greater load cannot lower the within-host term further: only slower

        return top

    def rate(self, cand: _Cand) -> float:
        """The samples/s of the plan `cand` (its prediction's, as _materialize's: the same arithmetic), without
        naming its hosts."""
        if cand.cls is None:
            assert cand.kind is not None
            runs = [(cand.kind, cand.k, 1)]
            pieces = [[(cand.k, 1)]]
        else:
            runs = cand.cls.kind_runs(cand.level, cand.load, cand.n)
            pieces = _fill_runs(cand.k, [(cap, m) for _, cap, m in runs])
        alike: dict[tuple[int, str, float, str], int] = {}  # hosts alike to the cost model, however many kinds
        for (kd, _, _), run in zip(runs, pieces, strict=True):
            for g, m in run:
                key = (g, kd.gpu_model, kd.nic_gbps, kd.gpu_link)
                alike[key] = alike.get(key, 0) + m
        uses = [(HostUse(*key), m) for key, m in alike.items()]
        return cand.k * cand.bsz / step_time_counted(self.p, uses, cand.bsz, self.req.pattern, self.table)


def _ring_costs(p: CostParams, k: int, nic: float) -> tuple[float, float]:
    """(A, B) of the ring's network term over n hosts, A / P(n) + B (n - 1) (beside alpha_n, the same for every
    n): A = beta_n nic_scale 2(K-1), B = 2 alpha_h."""
    return p.beta_n * (p.reference.nic_gbps / nic) * 2 * (k - 1), 2 * p.alpha_h


def _ring_least(a: float, b: float, first: int, hi: int) -> int:
    """The n in [first, hi] (first >= 3) with the least A / n + B (n - 1): a convex function, least near
    sqrt(A / B) (the rounded optimum is a neighbour of the integer one: step to the least)."""
    if a >= b * hi * hi:  # sqrt(A / B) >= hi (or B = 0): falling all the way to hi
        return hi
    best = min(max(int(math.sqrt(a / b) + 0.5), first), hi)
    while best > first and a / (best - 1) + b * (best - 2) < a / best + b * (best - 1):
        best -= 1
    while best < hi and a / (best + 1) + b * best < a / best + b * (best - 1):
        best += 1
    return best


def _ring_fastest(p: CostParams, k: int, hi: int, nic: float) -> int:
    """The number of hosts in [2, hi] over which a ring of K is fastest (more hosts among equals)."""
    a, b = _ring_costs(p, k, nic)
    if hi < 3:
        return 2
    n = _ring_least(a, b, 3, hi)
    return 2 if a + b < a / n + b * (n - 1) else n


def _ring_hosts(p: CostParams, k: int, lo: int, hi: int, nic: float) -> Iterator[int]:
    """The host counts n in [lo, hi] (lo >= 2) of a ring of K whose slowest NIC is `nic`, fastest first (ties:
    more hosts first), lazily: the search stops at the first it keeps out.

    From n = 3 on the ring's network term A / n + B (n - 1) is convex, so the order is a merge of the walks down
    and up from its least, with n = 2 (A + B: P = 1) put in its place. With alpha_h = 0 it is hi, hi - 1, ..., lo."""
    a, b = _ring_costs(p, k, nic)

    def cost(n: int) -> float:
        return a / pairs(n) + b * (n - 1)

    two = lo <= 2 <= hi  # n = 2 still to place
    c2 = a + b
    first = max(lo, 3)
    if first <= hi:
        n = _ring_least(a, b, first, hi)
        down, up = n - 1, n + 1
        while True:
            if two and cost(n) > c2:
                two = False
                yield 2
            yield n
            if down < first and up > hi:
                break
            if up > hi or (down >= first and cost(down) < cost(up)):
                n, down = down, down - 1
            else:
                n, up = up, up + 1
    if two:
        yield 2


def _materialize(params: CostParams, cand: _Cand, pattern: str, table: GpuTable) -> Plan:
    """A kept candidate's hosts by name, and its own prediction."""
    if cand.cls is None:
        assert cand.kind is not None
        chosen = [(cand.kind.names[0], cand.k, cand.kind)]
    else:
        hosts = cand.cls.hosts_of(cand.level, cand.load, cand.n)
        chosen = [(name, g, kd) for (name, _, kd), g in zip(hosts, _fill(cand.k, [cap for _, cap, _ in hosts]),
                                                            strict=True)]
    chosen.sort(key=lambda h: (-h[1], h[0]))
    uses = [HostUse(g, kd.gpu_model, kd.nic_gbps, kd.gpu_link) for _, g, kd in chosen]
    return Plan(tuple((name, g) for name, g, _ in chosen), predict(params, uses, cand.bsz, pattern, table))


def _distinct(plans: list[Plan], top: int) -> list[Plan]:
    """The best `top`, one per shape (GPUs per host and servers' count): the runner-ups are real alternatives."""
    out: list[Plan] = []
    shapes: set[tuple[tuple[int, ...], int]] = set()
    for p in plans:
        shape = (tuple(sorted(p.gpus_per_host, reverse=True)), len(p.servers))
        if shape in shapes:
            continue
        shapes.add(shape)
        out.append(p)
        if len(out) >= top:
            break
    return out


def exhaustive(params: CostParams, hosts: Sequence[FreeHost], k: int, local_bsz: float, pattern: str = RING,
               table: GpuTable = DEFAULT_TABLE) -> Prediction | None:
    """The best prediction over every way to put k GPUs on these hosts (for tests on small clusters)."""
    best: Prediction | None = None

    def rec(i: int, left: int, acc: list[HostUse]) -> None:
        nonlocal best
        if left == 0:
            if acc:
                p = predict(params, acc, local_bsz, pattern, table)
                if best is None or p.step_time < best.step_time:
                    best = p
            return
        if i == len(hosts):
            return
        h = hosts[i]
        for g in range(min(h.free_gpus, left), -1, -1):
            rec(i + 1, left - g, acc + ([HostUse(g, h.gpu_model, h.nic_gbps, h.gpu_link)] if g else []))

    rec(0, k, [])
    return best


@dataclass(frozen=True, slots=True)
class PlanGoal:
    """What the placement engine needs of a model-aware job: its cost model, and the batch it trains with."""

    params: CostParams
    pattern: str = RING
    local_bsz: float = 0.0
    global_bsz: float = 0.0
    objective: str = "throughput"
    # the operator's GPU table where it differs from the built-in one (name, relative throughput): recorded with
    # the job, so that placement rates GPUs the way the job manager did
    gpu_rows: tuple[tuple[str, float], ...] = ()

    def table(self) -> GpuTable:
        return with_rows(self.gpu_rows)


@dataclass(frozen=True, slots=True)
class PlanHost:
    """A host of a chosen plan, with its hardware as the search saw it (its well-known labels, defaults applied):
    what the prediction assumed, and what the members' measurements were made on (`model refit` fits only those
    made on hardware like the model's reference)."""

    name: str
    gpu_model: str
    nic_gbps: float
    gpu_link: str


@dataclass(frozen=True, slots=True)
class PlanChoice:
    """The plan placement chose for a gang, its prediction, and the runner-ups it was preferred to."""

    gpus_per_host: tuple[int, ...]
    step_time: float
    samples_per_s: float
    local_bsz: float
    alternatives: tuple[tuple[tuple[int, ...], float, float], ...] = ()  # (gpus per host, step time, samples/s)
    # its hosts in the order of gpus_per_host; () in a record written before they were kept
    hosts: tuple[PlanHost, ...] = ()


def free_host(name: str, free_gpus: int, labels: dict[str, str]) -> FreeHost:
    """A host as the search sees it, its hardware from the well-known labels (peloton/modelaware/hostlabels.py); a
    label that does not check counts as absent (the host manager refuses bad labels where hosts are declared, and
    reports a Mesos agent's)."""
    model, nic, link = _hardware(labels.get(hostlabels.GPU_MODEL), labels.get(hostlabels.NIC_GBPS),
                                 labels.get(hostlabels.GPU_LINK))
    return FreeHost(name, free_gpus, model, nic, link)


@functools.lru_cache(maxsize=1024)
def _hardware(model: str | None, nic: str | None, link: str | None) -> tuple[str, float, str]:
    """A cluster has few kinds of hosts: each kind's labels are checked once (placing one model-aware gang reads
    every host's)."""
    given = {k: v for k, v in ((hostlabels.GPU_MODEL, model), (hostlabels.NIC_GBPS, nic),
                               (hostlabels.GPU_LINK, link)) if v is not None}
    hw, _ = hostlabels.hardware_lenient(given, has_gpus=True)
    return hw.gpu_model, hw.nic_gbps, hw.gpu_link


def choose(goal: PlanGoal, hosts: Sequence[FreeHost], gpus: int, servers: int = 0,
           table: GpuTable = DEFAULT_TABLE) -> tuple[Plan, PlanChoice] | None:
    """The best plan for a gang of `gpus` one-GPU workers (and `servers` parameter servers, for a ps model) on
    `hosts` (their free worker slots), with the record of why; None when no plan fits. A ps model without server
    members is planned as a ring."""
    ps = goal.pattern == PS and servers > 0
    req = PlanRequest(gpus=gpus, local_bsz=goal.local_bsz, global_bsz=goal.global_bsz, objective=goal.objective,
                      pattern=goal.pattern if goal.pattern != PS or ps else RING, servers=servers if ps else 0,
                      top=4)
    plans = search(goal.params, hosts, req, goal.table() if goal.gpu_rows else table)
    if not plans:
        return None
    best = plans[0]
    names = {name for name, _ in best.hosts}
    seen = {h.name: h for h in hosts if h.name in names}
    choice = PlanChoice(best.gpus_per_host, best.prediction.step_time, best.samples_per_s, best.prediction.local_bsz,
                        tuple((p.gpus_per_host, p.prediction.step_time, p.samples_per_s) for p in plans[1:]),
                        tuple(PlanHost(name, seen[name].gpu_model, seen[name].nic_gbps, seen[name].gpu_link)
                              for name, _ in best.hosts))
    return best, choice


def with_rows(rows: tuple[tuple[str, float], ...]) -> GpuTable:
    """The built-in GPU table with these relative throughputs replacing or adding rows."""
    if not rows:
        return DEFAULT_TABLE
    models = dict(DEFAULT_TABLE.models)
    for name, rel in rows:
        base = models.get(name)
        models[name] = GpuModel(name, base.fp32_tflops if base else 0.0, base.mem_gbps if base else 0.0,
                                base.memory_gib if base else 0.0, rel)
    return GpuTable(models)


def rows_of(table: GpuTable) -> tuple[tuple[str, float], ...]:
    """What `table` says differently from the built-in one, as (name, relative throughput)."""
    return tuple(sorted((name, m.relative) for name, m in table.models.items()
                        if name not in DEFAULT_TABLE.models or DEFAULT_TABLE.models[name].relative != m.relative))


def goal_to_dict(g: PlanGoal) -> dict[str, object]:
    return {"params": g.params.as_dict(), "pattern": g.pattern, "local_bsz": g.local_bsz, "global_bsz": g.global_bsz,
            "objective": g.objective, **({"gpu_table": dict(g.gpu_rows)} if g.gpu_rows else {})}


def goal_from_dict(d: dict[str, Any]) -> PlanGoal:
    """The inverse of goal_to_dict (data the daemon wrote itself: its checks were made when the job was created)."""
    from peloton.modelaware.document import parse_params  # the one parser of a params object (no import cycle)

    return PlanGoal(parse_params(d["params"], "goal.params"), str(d.get("pattern", RING)),
                    float(d.get("local_bsz", 0.0)), float(d.get("global_bsz", 0.0)),
                    str(d.get("objective", "throughput")),
                    tuple(sorted((str(k), float(v)) for k, v in d.get("gpu_table", {}).items())))


def choice_to_dict(c: PlanChoice) -> dict[str, object]:
    return {"gpus_per_host": list(c.gpus_per_host), "step_time": c.step_time, "samples_per_s": c.samples_per_s,
            "local_bsz": c.local_bsz,
            "alternatives": [{"gpus_per_host": list(g), "step_time": t, "samples_per_s": s}
                             for g, t, s in c.alternatives],
            **({"hosts": [{"name": h.name, "gpu_model": h.gpu_model, "nic_gbps": h.nic_gbps, "gpu_link": h.gpu_link}
                          for h in c.hosts]} if c.hosts else {})}


def choice_from_dict(d: dict[str, Any]) -> PlanChoice:
    alts = d.get("alternatives", [])
    assert isinstance(alts, list)
    return PlanChoice(tuple(int(x) for x in d["gpus_per_host"]), float(d["step_time"]),
                      float(d["samples_per_s"]), float(d.get("local_bsz", 0.0)),
                      tuple((tuple(int(x) for x in a["gpus_per_host"]), float(a["step_time"]),
                             float(a["samples_per_s"])) for a in alts),
                      tuple(PlanHost(str(h["name"]), str(h["gpu_model"]), float(h["nic_gbps"]), str(h["gpu_link"]))
                            for h in d.get("hosts", ())))  # absent: a record from before hosts were kept
