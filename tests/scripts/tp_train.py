"""A tiny tensor-parallel training script (Colwise/Rowwise ``parallelize_module`` on a 1-D CPU mesh, gloo) for
torchrepro's distributed tests.

    torchrepro check --nproc-per-node 2 -- python tests/scripts/tp_train.py [--steps N]
        [--nudge-rank R --nudge-step K]   rank R adds 1e-3 to its replica of fc2.bias (a Replicate() parameter)
                                          just before optimizer step K, in every run: the ranks' replicas part
        [--noise-rank R --noise-step K]   rank R adds noise drawn from os.urandom to its shard of fc1.weight
                                          (Shard(0)) just before optimizer step K: the runs differ on that rank
        [--init-after-shard]              every rank re-initialises fc1.weight (a Shard(0) DTensor) with
                                          nn.init.uniform_ after parallelize_module from the same generator state:
                                          on CPU every shard gets the same values (a broken shard, correlated draws)
        [--replicated-dropout]            a dropout on fc2's output, which is replicated (equal on every rank):
                                          each rank's own dropout stream makes the replicas part
        [--print-layouts]                 rank 0 prints each parameter's and gradient's placements after step 1

``fc1`` is ``ColwiseParallel`` (weight and bias ``Shard(0)``), ``fc2`` ``RowwiseParallel`` (weight ``Shard(1)``,
bias ``Replicate()``), ``head`` is not parallelised (plain tensors, the same on every rank). Every rank of the
tensor-parallel group sees the same batches; dropout acts on each rank's shard of the hidden activations.
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
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

import torchrepro


class Net(nn.Module):
    def __init__(self, replicated_dropout: bool = False) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.drop = nn.Dropout(0.25)
        self.fc2 = nn.Linear(16, 8)
        self.head = nn.Linear(8, 4)
        self.drop2 = nn.Dropout(0.25) if replicated_dropout else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.drop2(self.fc2(self.drop(torch.relu(self.fc1(x)))))))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--nudge-rank", type=int, default=-1)
    p.add_argument("--nudge-step", type=int, default=-1)
    p.add_argument("--noise-rank", type=int, default=-1)
    p.add_argument("--noise-step", type=int, default=-1)
    p.add_argument("--print-layouts", action="store_true")
    p.add_argument("--init-after-shard", action="store_true")
    p.add_argument("--replicated-dropout", action="store_true")
    p.add_argument("--timeout", type=float, default=60.0)
    args = p.parse_args()

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    torchrepro.seed_everything(args.seed)  # the same initial weights on every rank, per-rank dropout masks
    model = parallelize_module(Net(args.replicated_dropout), mesh, {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
    if args.init_after_shard:
        torch.manual_seed(args.seed)  # the same state on every rank; CPU DTensors have no offset-based RNG tracker
        nn.init.uniform_(model.fc1.weight, -0.3, 0.3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(1000)  # the same batches on every rank of the tensor-parallel group
    for step in range(1, args.steps + 1):
        x, y = torch.randn(4, 8, generator=gen), torch.randn(4, 4, generator=gen)
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        with torch.no_grad():
            if rank == args.nudge_rank and step == args.nudge_step:
                model.fc2.bias.to_local()[0] += 1e-3  # this rank's replica only
            if rank == args.noise_rank and step == args.noise_step:
                model.fc1.weight.to_local()[0, 0] += (int.from_bytes(os.urandom(2), "little") + 1) * 1e-6
        opt.step()
        if args.print_layouts and rank == 0 and step == 1:
            for name, prm in model.named_parameters():
                grad = prm.grad
                sys.stdout.write(f"{name}: {getattr(prm, 'placements', None)} grad "
                                 f"{getattr(grad, 'placements', None) if grad is not None else None}\n")
    sys.stdout.write(f"rank {rank} done: loss {loss.item():.6f}\n")
    sys.stdout.flush()
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
