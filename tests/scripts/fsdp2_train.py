"""A tiny FSDP2 training script (``fully_shard`` on a 1-D CPU mesh, gloo) for torchrepro's distributed tests.

    torchrepro check --nproc-per-node 2 -- python tests/scripts/fsdp2_train.py [--steps N]
        [--noise-rank R --noise-step K]   rank R adds noise drawn from os.urandom to its shard of fc1.weight just
                                          before optimizer step K: a different nudge in every run, on that rank only
        [--noise-runs 2,3 --counter FILE] only the Nth launches that find FILE add the noise (FILE counts the
                                          launches of rank R; it must lie outside the working directory)
        [--nudge-rank R --nudge-step K]   the same nudge (1e-3) in every run: the runs repeat each other
        [--nudge-tensor NAME]             which parameter the nudge changes (default fc1.weight)
        [--hsdp]                          HSDP: a 2-D mesh (replicate=world, shard=1), placements (Replicate(),
                                          Shard(0)): every rank holds a replica of the same (whole) shard
        [--reseed-dropout]                every rank calls torch.manual_seed(0) in the forward, just before the
                                          dropout: the ranks drop the same positions of their different activations
                                          (correlated random numbers, reported by the ranks check)
        [--tp]                            FSDP x TP: a 2-D mesh (dp=world/2, tp=2); fc1 ColwiseParallel and fc2
                                          RowwiseParallel on tp, then fully_shard on dp (fc2.bias: (Shard(0),
                                          Replicate())); the ranks of a tp group see the same batches
        [--global-batch]                  every step draws one batch of 8 rows from one generator, the same on
                                          every rank, and each rank trains on its own rows of it, dropout off:
                                          the same model and data whatever the world size (1, 2, 4 or 8 ranks),
                                          for `torchrepro compare --full-tensors` across world sizes
        [--compile]                       torch.compile the FSDP2 model (inductor, CPU)

Each ``nn.Linear`` is ``fully_shard``-ed, then the root: every parameter is a DTensor ``Shard(0)`` on the mesh, its
gradient and AdamW's ``exp_avg``/``exp_avg_sq`` too. The model has dropout (per-rank masks after
``torchrepro.seed_everything``), and each rank trains on its own batches.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

import torchrepro


class Net(nn.Module):
    reseed = False  # --reseed-dropout

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.drop = nn.Dropout(0.25)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.fc1(x))
        if self.reseed:
            torch.manual_seed(0)  # the same generator state on every rank: the same dropout mask
        return self.fc2(self.drop(h))


def launch_number(path: str) -> int:
    n = int(open(path).read() or 0) + 1 if os.path.exists(path) else 1
    with open(path, "w") as f:
        f.write(str(n))
    return n


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--noise-rank", type=int, default=-1)
    p.add_argument("--noise-step", type=int, default=-1)
    p.add_argument("--noise-runs")
    p.add_argument("--counter")
    p.add_argument("--nudge-rank", type=int, default=-1)
    p.add_argument("--nudge-step", type=int, default=-1)
    p.add_argument("--nudge-tensor", default="fc1.weight")
    p.add_argument("--hsdp", action="store_true")
    p.add_argument("--tp", action="store_true")
    p.add_argument("--reseed-dropout", action="store_true")
    p.add_argument("--global-batch", action="store_true")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--timeout", type=float, default=60.0)
    args = p.parse_args()

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    noisy = rank == args.noise_rank
    if noisy and args.counter:
        noisy = str(launch_number(args.counter)) in (args.noise_runs or "").split(",")
    if args.tp:
        mesh2 = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("dp", "tp"))
        mesh, data_rank = mesh2["dp"], mesh2["dp"].get_local_rank()
    else:
        mesh = (init_device_mesh("cpu", (world, 1), mesh_dim_names=("replicate", "shard")) if args.hsdp
                else init_device_mesh("cpu", (world,), mesh_dim_names=("dp",)))
        data_rank = rank
    torchrepro.seed_everything(args.seed)  # the same initial weights on every rank, per-rank dropout masks
    model = Net()
    model.reseed = args.reseed_dropout
    if args.tp:
        parallelize_module(model, mesh2["tp"], {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
    for layer in (model.fc1, model.fc2):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    if args.compile:
        model = torch.compile(model)  # type: ignore[assignment]
    gen = torch.Generator().manual_seed(1000 + (0 if args.global_batch else data_rank))  # per rank: its own data
    if args.global_batch:
        model.drop.p = 0.0  # dropout masks would depend on the world size (each rank draws its own)
    for step in range(1, args.steps + 1):
        x, y = torch.randn(4, 8, generator=gen), torch.randn(4, 4, generator=gen)
        if args.global_batch:  # one global batch of 8 rows; this rank's share of it
            x, y = torch.cat([x, torch.randn(4, 8, generator=gen)]), torch.cat([y, torch.randn(4, 4, generator=gen)])
            rows = 8 // world
            x, y = x[rank * rows:(rank + 1) * rows], y[rank * rows:(rank + 1) * rows]
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        with torch.no_grad():  # this rank's shard: changing it changes no other rank's memory
            if noisy and step == args.noise_step:
                model.fc1.weight.to_local().view(-1)[0] += (int.from_bytes(os.urandom(2), "little") + 1) * 1e-6
            if rank == args.nudge_rank and step == args.nudge_step:
                model.get_parameter(args.nudge_tensor).to_local().view(-1)[0] += 1e-3
        opt.step()
    sys.stdout.write(f"rank {rank} done: loss {loss.item():.6f}\n")
    sys.stdout.flush()
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
