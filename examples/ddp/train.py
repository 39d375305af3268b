"""A small, real PyTorch DDP training job for CPUs (backend gloo): an MLP learning a fixed random teacher on
synthetic data, each member with its own shard of it.

It reads the rendezvous from the environment a Peloton gang member starts with (MASTER_ADDR, MASTER_PORT, RANK,
WORLD_SIZE, LOCAL_RANK: peloton/jobmgr/training_env.py; MASTER_PORT is the first port of rank 0, so the job asks
for `ports: 1`), and runs alone (world of 1) when they are absent. After a warm-up it times its steps, and every
`--report-every` timed steps and at the end appends one line to $PELOTON_METRICS_FILE:

    step_time=0.0123 samples_per_s=2601.6 local_bsz=32 step=40

(this member's own figures, the mean since the warm-up: peloton/modelaware/metrics.py reads the last line, and
`peloton job get` shows it beside the prediction of a model-aware gang). At the end every member prints a
`ddp-member` line and rank 0 a `ddp-summary` line with the gang's samples/s. `--steps 0` trains until the job is
stopped. `--describe` prints a model document of this MLP for `peloton model create` (the cost model's prior comes
from its parameters and FLOPs per sample) and exits.

    python train.py --steps 40 --local-bsz 32 --width 256
    python train.py --width 256 --local-bsz 32 --describe > mlp.json
"""

from __future__ import annotations

import argparse
import datetime
import gc
import itertools
import json
import os
import sys
import time
import warnings

# torch warns at import when NumPy is absent; this job does not use NumPy
warnings.filterwarnings("ignore", message=".*NumPy.*")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

POOL_BATCHES = 8  # distinct batches per member, used in turn: making data must not be what is timed


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=40, help="timed steps (after the warm-up); 0: until stopped")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    p.add_argument("--local-bsz", type=int, default=32, help="samples per step per member")
    p.add_argument("--width", type=int, default=256, help="hidden units per layer")
    p.add_argument("--depth", type=int, default=2, help="hidden layers")
    p.add_argument("--inputs", type=int, default=64, help="input features")
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch threads per member")
    p.add_argument("--report-every", type=int, default=10, help="timed steps between metrics lines")
    p.add_argument("--metrics-file", default=os.environ.get("PELOTON_METRICS_FILE", ""),
                   help="where the metrics lines go (default: $PELOTON_METRICS_FILE; empty: nowhere)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for the other members")
    p.add_argument("--describe", action="store_true",
                   help="print a model document of this MLP (peloton model create -f) and exit")
    a = p.parse_args(argv)
    for name in ("local_bsz", "width", "depth", "inputs", "classes", "threads", "report_every"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    for name in ("steps", "warmup"):
        if getattr(a, name) < 0:
            p.error(f"--{name} must be at least 0")
    return a


def mlp(inputs: int, width: int, depth: int, classes: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    n = inputs
    for _ in range(depth):
        layers += [nn.Linear(n, width), nn.ReLU()]
        n = width
    layers.append(nn.Linear(n, classes))
    return nn.Sequential(*layers)


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def flops_per_sample(model: nn.Module) -> float:
    """Forward + backward: 2 FLOPs per weight forward, twice that backward (the usual 6 x parameters)."""
    return 6.0 * parameter_count(model)


def describe(a: argparse.Namespace) -> dict[str, object]:
    """The model document (docs/model-aware.md) of the MLP these flags build: FP32 gradients of every parameter,
    synchronised by DDP's ring all-reduce."""
    model = mlp(a.inputs, a.width, a.depth, a.classes)
    return {"kind": "peloton.model/v1", "name": "ddp-mlp",
            "description": {"parameters": parameter_count(model), "flops_per_sample": flops_per_sample(model),
                            "sync": "allreduce-ring", "local_bsz": a.local_bsz}}


def synthetic_batches(a: argparse.Namespace, rank: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """This member's shard: inputs from a generator seeded by rank, labels from one teacher every member shares
    (so the loss can fall)."""
    teacher = torch.Generator().manual_seed(a.seed)
    w = torch.randn(a.inputs, a.classes, generator=teacher)
    g = torch.Generator().manual_seed(a.seed * 1000 + rank + 1)
    out = []
    for _ in range(POOL_BATCHES):
        x = torch.randn(a.local_bsz, a.inputs, generator=g)
        out.append((x, (x @ w).argmax(dim=1)))
    return out


class Metrics:
    """Appends this member's figures to the metrics file (a line each time, flushed: the daemon may read it at any
    moment)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def write(self, step_time: float, local_bsz: int, step: int) -> None:
        if not self.path or step_time <= 0:
            return
        with open(self.path, "a") as f:
            f.write(f"step_time={step_time:.6f} samples_per_s={local_bsz / step_time:.3f} local_bsz={local_bsz} "
                    f"step={step}\n")


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.describe:
        print(json.dumps(describe(a), indent=2))
        return 0
    torch.set_num_threads(a.threads)  # one member per core: more threads per member only fight each other
    torch.set_num_interop_threads(1)
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if world == 1:
        os.environ.setdefault("MASTER_PORT", "0")  # alone: any free port
    elif "MASTER_PORT" not in os.environ:
        sys.exit("MASTER_PORT is not set: give the job `ports: 1` (rank 0's first port is the rendezvous)")

    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=a.timeout))
    train(a, rank, world, local_rank)
    # The DDP model (its reducer holds the process group) is gone before the group is: left to the interpreter's
    # exit, torch 2.13's teardown aborts the process now and then ("terminate called without an active
    # exception", about 1 run in 5 here) after a run that went well.
    gc.collect()
    dist.destroy_process_group()
    return 0


def train(a: argparse.Namespace, rank: int, world: int, local_rank: int) -> None:
    torch.manual_seed(a.seed)  # the same initial weights everywhere (DDP also broadcasts rank 0's)
    model = DistributedDataParallel(mlp(a.inputs, a.width, a.depth, a.classes))
    opt = torch.optim.SGD(model.parameters(), lr=a.lr)
    loss_fn = nn.CrossEntropyLoss()
    batches = synthetic_batches(a, rank)
    metrics = Metrics(a.metrics_file)

    def step(i: int) -> float:
        x, y = batches[i % POOL_BATCHES]
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()  # DDP all-reduces the gradients here
        opt.step()
        return float(loss.detach())

    first_loss = loss = 0.0
    for i in range(a.warmup):
        loss = step(i)
        first_loss = first_loss or loss
    dist.barrier()  # the timing starts together
    start = time.perf_counter()
    i = 0
    for i in itertools.count(1) if a.steps == 0 else range(1, a.steps + 1):
        loss = step(a.warmup + i - 1)
        first_loss = first_loss or loss
        if i % a.report_every == 0 or i == a.steps:
            metrics.write((time.perf_counter() - start) / i, a.local_bsz, i)
    elapsed = time.perf_counter() - start
    step_time = elapsed / i

    # every member's weights after training: the same on all of them when DDP kept them in step
    checksum = float(sum(p.detach().double().sum() for p in model.parameters()))
    params = parameter_count(model.module)
    print(f"ddp-member rank={rank} world={world} local_rank={local_rank} steps={i} local_bsz={a.local_bsz} "
          f"step_time={step_time:.6f} samples_per_s={a.local_bsz / step_time:.3f} loss={first_loss:.4f}->{loss:.4f} "
          f"params={params} checksum={checksum:.6f}", flush=True)
    times = [torch.tensor([step_time], dtype=torch.float64) for _ in range(world)]
    dist.all_gather(times, torch.tensor([step_time], dtype=torch.float64))
    if rank == 0:
        slowest = max(float(t) for t in times)
        # a synchronous step waits for the slowest member: the gang's rate is world x batch / its step time
        print(f"ddp-summary world={world} local_bsz={a.local_bsz} global_bsz={world * a.local_bsz} "
              f"step_time={slowest:.6f} samples_per_s={world * a.local_bsz / slowest:.3f} params={params} "
              f"flops_per_sample={flops_per_sample(model.module):.0f} parameter_bytes={params * 4}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
