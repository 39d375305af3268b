"""The cost model: the time of one training step of a placement, as a pure function.

docs/model-aware.md writes the formulas out with their sources. In short, for K GPUs on N hosts, each host h with
g_h of them, a local batch b per GPU and a model of S bytes of gradients:

    compute  T_c = max over hosts (alpha_c + beta_c * b) * rel(reference GPU) / rel(GPU of h) * (1 + kappa (g_h - 1))
    sync     T_s = 0 when K = 1, else by pattern (X counts units of S moved; scales are reference / actual):
      ring all-reduce, one host:   alpha_r + beta_r * link_scale * 2(K-1)/K
      ring all-reduce, N hosts:    alpha_n + beta_n * nic_scale  * 2(K-1) / P + alpha_h * 2(N-1),
                                   P = 1 if N = 2 else N
      hierarchical all-reduce:     [alpha_r + beta_r * link_scale * 2(g-1)/g] + [alpha_n + beta_n * nic_scale
                                   * 2(N-1) / P + alpha_h * 2(N-1)]  (within hosts, then one member per host
                                   across them)
      parameter servers (n):       alpha_n + beta_n * max over hosts (nic_scale_h * traffic_h), traffic_h the
                                   units of S through h's NIC both ways: 2 (w_h (1 - s_h/n) + s_h/n (K - w_h))
    step     T = (T_c^gamma + T_s^gamma)^(1/gamma)   (gamma >= 1: how far synchronisation overlaps compute)

The step form and the compute term are Pollux's throughput model (Qiao et al., OSDI'21, eq. 7-8); the sync term
counts the bytes each member moves over its slowest link (Patarasuk and Yuan 2009 for the ring; Sergeev and Del
Balso 2018 for Horovod's ring). `P` is the number of host pairs the ring's cross-host traffic spreads over: with
two hosts every crossing joins the same pair, so the network term is K/P times each member's ring traffic; fitted
on the bert and cifar10 profiles it explains their two-host placements being the slowest (docs/model-aware.md).
`alpha_h` is the latency term of the alpha-beta model (Thakur, Rabenseifner and Gropp 2005) for the ring's steps
that cross hosts: of a ring all-reduce's 2(K-1) steps, 2(N-1) go over the network and pay its latency instead of
the link's (NCCL's own ring model, src/graph/tuning.cc: (nsteps - nInterSteps) * intraLat + nInterSteps *
interLat). It is what makes a spread over more hosts cost something. `kappa` is the contention of a host's GPUs
for what they share (its CPUs, which decode and augment each GPU's batch, its PCIe root complex and memory
bandwidth): each GPU computes 1 + kappa (g - 1) times slower with g of the plan's GPUs busy on its host. The
first-order form (nothing for a lone GPU, linear in the GPUs beside it, proportional to the compute) of what
Mohan et al. measure (VLDB 2021, "Analyzing and Mitigating Data Stalls in DNN Training": input pipelines stall
when a server's CPUs are too few for its busy GPUs) and of the CPU/GPU ratio Dike models; a synchronous step waits for its slowest
member, so the busiest host counts. It grows with the batch while sync does not, which is how a profile tells it
apart (4 against 1111 at several batches), and it makes the best placement of K move with the batch: fewer,
fuller hosts while sync dominates, a wider spread once compute does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from peloton.errors import InvalidArgument
from peloton.modelaware import hostlabels
from peloton.modelaware.gpus import DEFAULT_TABLE, LINK_GBYTES_S, NIC_EFFICIENCY, GpuTable

RING = "allreduce-ring"
HIERARCHICAL = "allreduce-hierarchical"
PS = "ps"
SYNC_PATTERNS = (RING, HIERARCHICAL, PS)

DEFAULT_NIC_GBPS = hostlabels.DEFAULT_NIC_GBPS
DEFAULT_GPU_LINK = hostlabels.DEFAULT_GPU_LINK
DEFAULT_GPU_MODEL = hostlabels.DEFAULT_GPU_MODEL


@dataclass(frozen=True, slots=True)
class Reference:
    """The hardware the parameters describe: a fitted model's is the profile's cluster."""

    gpu_model: str = "t4"
    nic_gbps: float = DEFAULT_NIC_GBPS
    gpu_link: str = DEFAULT_GPU_LINK


@dataclass(frozen=True, slots=True)
class CostParams:
    alpha_c: float  # s per step of fixed compute (launches, optimizer step), on the reference GPU
    beta_c: float  # s per sample of the local batch, on the reference GPU
    alpha_r: float  # s per all-reduce within one host (latency)
    beta_r: float  # s per unit of S moved over the reference intra-host link
    alpha_n: float  # s per synchronisation across hosts (latency)
    beta_n: float  # s per unit of S through the reference NIC
    gamma: float  # >= 1; 1: synchronisation does not overlap compute
    reference: Reference = Reference()
    # s per step of a ring that crosses hosts (2(N-1) of them) beyond a step within a host (latency). Last, with
    # a default: parameters fitted or stored before it existed describe rings without it (0)
    alpha_h: float = 0.0
    # compute contention: each GPU's compute on a host with g of the plan's GPUs takes (1 + kappa (g - 1)) times
    # its time alone (they share the host's CPUs, PCIe root complex and memory). Last, with a default: parameters
    # fitted or stored before it existed describe GPUs that compute as if alone (0)
    kappa: float = 0.0

    def as_dict(self) -> dict[str, object]:
        return {"alpha_c": self.alpha_c, "beta_c": self.beta_c, "alpha_r": self.alpha_r, "beta_r": self.beta_r,
                "alpha_n": self.alpha_n, "beta_n": self.beta_n, "alpha_h": self.alpha_h, "kappa": self.kappa, "gamma": self.gamma,
                "reference": {"gpu_model": self.reference.gpu_model, "nic_gbps": self.reference.nic_gbps,
                              "gpu_link": self.reference.gpu_link}}


PARAM_NAMES = ("alpha_c", "beta_c", "alpha_r", "beta_r", "alpha_n", "beta_n", "alpha_h", "kappa", "gamma")
OPTIONAL_PARAMS = {"alpha_h": 0.0, "kappa": 0.0}  # a document's params may leave these out (written before they existed)

# The prior's alpha_h: NCCL's own estimate of what a ring step over the network costs beyond one within a host
# (src/graph/tuning.cc, hwLat, Ring/Simple: NET 9.6 us, PCI 5.7 us, NVLink 3.4 us), once per all-reduce call;
# PyTorch DDP makes one call per 25 MiB bucket of gradients (bucket_cap_mb; Li et al., VLDB 2020).
NET_STEP_LATENCY_S = {"pcie": (9.6 - 5.7) * 1e-6, "nvlink": (9.6 - 3.4) * 1e-6}
DDP_BUCKET_BYTES = 25 * 2**20


@dataclass(frozen=True, slots=True)
class HostUse:
    """One host of a placement as the cost model sees it."""

    gpus: int  # GPUs (workers) used on it
    gpu_model: str = DEFAULT_GPU_MODEL
    nic_gbps: float = DEFAULT_NIC_GBPS
    gpu_link: str = DEFAULT_GPU_LINK
    servers: int = 0  # parameter servers on it


@dataclass(frozen=True, slots=True)
class Prediction:
    gpus_per_host: tuple[int, ...]
    local_bsz: float
    step_time: float
    compute_time: float
    sync_time: float

    @property
    def gpus(self) -> int:
        return sum(self.gpus_per_host)

    @property
    def samples_per_s(self) -> float:
        return self.gpus * self.local_bsz / self.step_time


def prior(parameter_bytes: float, flops_per_sample: float, table: GpuTable = DEFAULT_TABLE,
          reference: Reference = Reference()) -> CostParams:
    """Parameters from a model's description alone: compute at half the reference GPU's FP32 peak, gradients at
    the link's effective bandwidth, fixed latencies (alpha_h: NCCL's per network step, per DDP bucket), no overlap
    and no contention (kappa = 0: nothing in a model's description tells how its input pipeline shares a host).
    A profile's fit replaces them."""
    fp32 = table.get(reference.gpu_model).fp32_tflops * 1e12
    link = LINK_GBYTES_S.get(reference.gpu_link, LINK_GBYTES_S[DEFAULT_GPU_LINK]) * 1e9
    nic = reference.nic_gbps * 1e9 / 8 * NIC_EFFICIENCY
    return CostParams(alpha_c=0.005, beta_c=flops_per_sample / (0.5 * fp32), alpha_r=0.0005,
                      beta_r=parameter_bytes / link, alpha_n=0.002, beta_n=parameter_bytes / nic, gamma=1.0,
                      reference=reference, alpha_h=prior_alpha_h(parameter_bytes, reference.gpu_link))


def prior_alpha_h(parameter_bytes: float, gpu_link: str) -> float:
    """Seconds per ring step across hosts: NCCL's network-over-link step latency, once per DDP bucket."""
    buckets = max(1, math.ceil(parameter_bytes / DDP_BUCKET_BYTES))
    return buckets * NET_STEP_LATENCY_S.get(gpu_link, NET_STEP_LATENCY_S[DEFAULT_GPU_LINK])


def pairs(n_hosts: int) -> int:
    """P: the host pairs a ring's cross-host traffic spreads over."""
    return 1 if n_hosts == 2 else n_hosts


def link_scale(p: CostParams, link: str) -> float:
    """How much slower `link` moves gradients than the reference's intra-host link."""
    return LINK_GBYTES_S.get(p.reference.gpu_link, 12.0) / LINK_GBYTES_S.get(link, 12.0)


def sync_time(p: CostParams, hosts: Sequence[HostUse], pattern: str = RING) -> float:
    used = [h for h in hosts if h.gpus > 0]
    k = sum(h.gpus for h in used)
    n = len(used)
    if pattern == PS:
        return _ps_sync(p, hosts, k)
    return _allreduce_sync(p, used, n, k, pattern)


def _allreduce_sync(p: CostParams, used: Sequence[HostUse], n: int, k: int, pattern: str) -> float:
    """An all-reduce's sync time over n hosts holding k GPUs; `used`: those hosts, or one of each alike (every
    term is a min, a max, or of n and k)."""
    if k <= 1:
        return 0.0
    nic_scale = p.reference.nic_gbps / min(h.nic_gbps for h in used)
    if pattern == HIERARCHICAL:
        t = 0.0
        inner = max((2 * (h.gpus - 1) / h.gpus * link_scale(p, h.gpu_link) for h in used if h.gpus > 1),
                    default=0.0)
        if inner:
            t += p.alpha_r + p.beta_r * inner
        if n > 1:
            t += network_time(p, nic_scale, n, 2 * (n - 1))
        return t
    if n == 1:
        return p.alpha_r + p.beta_r * link_scale(p, used[0].gpu_link) * 2 * (k - 1) / k
    return network_time(p, nic_scale, n, 2 * (k - 1))


def network_time(p: CostParams, nic_scale: float, n_hosts: int, units: float) -> float:
    """A ring's time across `n_hosts` hosts (N >= 2): `units` of S spread over P(N) host pairs, and the latency of
    its 2(N-1) host-to-host steps."""
    return p.alpha_n + p.beta_n * nic_scale * units / pairs(n_hosts) + p.alpha_h * 2 * (n_hosts - 1)


def _ps_sync(p: CostParams, hosts: Sequence[HostUse], k: int, servers: int | None = None) -> float:
    """`servers`: the plan's servers, when `hosts` is one of each kind of host (every term is a max)."""
    if servers is None:
        servers = sum(h.servers for h in hosts)
    if servers <= 0 or k <= 0:
        raise InvalidArgument("a parameter-server plan needs at least one server and one worker", field="servers")
    worst = 0.0
    local = 0.0
    for h in hosts:
        share = h.servers / servers
        traffic = 2 * (h.gpus * (1 - share) + share * (k - h.gpus))
        worst = max(worst, traffic * p.reference.nic_gbps / h.nic_gbps)
        local = max(local, 2 * h.gpus * share * link_scale(p, h.gpu_link))
    if worst > 0:
        return p.alpha_n + p.beta_n * worst
    return p.alpha_r + p.beta_r * local  # every worker and server on one host


def compute_time(p: CostParams, hosts: Sequence[HostUse], local_bsz: float, table: GpuTable = DEFAULT_TABLE) -> float:
    """The slowest GPU's: a synchronous step waits for every member."""
    base = p.alpha_c + p.beta_c * local_bsz
    ref = table.relative(p.reference.gpu_model)
    return max(base * ref / table.relative(h.gpu_model) * (1 + p.kappa * (h.gpus - 1)) for h in hosts if h.gpus > 0)


def predict(p: CostParams, hosts: Sequence[HostUse], local_bsz: float, pattern: str = RING,
            table: GpuTable = DEFAULT_TABLE) -> Prediction:
    if not any(h.gpus > 0 for h in hosts):
        raise InvalidArgument("a placement needs at least one GPU", field="placement")
    tc = compute_time(p, hosts, local_bsz, table)
    ts = sync_time(p, hosts, pattern)
    step = combine(tc, ts, p.gamma)
    return Prediction(tuple(h.gpus for h in hosts if h.gpus > 0), local_bsz, step, tc, ts)


def step_time_counted(p: CostParams, uses: Sequence[tuple[HostUse, int]], local_bsz: float, pattern: str = RING,
                      table: GpuTable = DEFAULT_TABLE) -> float:
    """`predict(p, hosts, local_bsz, pattern, table).step_time` for an all-reduce pattern on the hosts `uses` gives
    as (a host, how many hosts like it): the same arithmetic, bit for bit, without a HostUse per host (the plan
    search rates a size of 3,000 GPUs over 750 hosts of a few kinds)."""
    used = [u for u, m in uses if m > 0 and u.gpus > 0]
    if not used:
        raise InvalidArgument("a placement needs at least one GPU", field="placement")
    n = sum(m for u, m in uses if m > 0 and u.gpus > 0)
    k = sum(u.gpus * m for u, m in uses if m > 0 and u.gpus > 0)
    return combine(compute_time(p, used, local_bsz, table), _allreduce_sync(p, used, n, k, pattern), p.gamma)


def ps_step_distinct(p: CostParams, distinct: Sequence[HostUse], k: int, servers: int, local_bsz: float,
                     table: GpuTable = DEFAULT_TABLE) -> float:
    """`predict(p, hosts, local_bsz, PS, table).step_time` given one of each distinct host of `hosts` (with its
    servers), its K workers and its servers: the same arithmetic, bit for bit (the plan search rates a
    parameter-server layout over hundreds of hosts of a few kinds)."""
    return combine(compute_time(p, distinct, local_bsz, table), _ps_sync(p, distinct, k, servers), p.gamma)


def combine(tc: float, ts: float, gamma: float) -> float:
    if ts <= 0:
        return tc
    if gamma == 1.0:
        return tc + ts
    m = max(tc, ts)  # scaled, so a large gamma neither overflows nor underflows
    return m * float(((tc / m) ** gamma + (ts / m) ** gamma) ** (1.0 / gamma))


def uniform_hosts(placement: Sequence[int], reference: Reference) -> list[HostUse]:
    """A placement on hosts like the reference (a profile's own cluster)."""
    return [HostUse(g, reference.gpu_model, reference.nic_gbps, reference.gpu_link) for g in placement]
