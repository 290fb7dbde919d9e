"""A tiny FSDP2 training loop (gloo on CPU) that checkpoints with ``torch.distributed.checkpoint`` (DCP) where
``torchrepro.resume_point()`` says, for ``torchrepro check --resume-at K --nproc-per-node 2``
(tests/cli/test_resume_at_fsdp2.py). It runs alone too: ``torchrun --nproc-per-node 2 fsdp2_dcp_resume.py``.

Each ``nn.Linear`` and the root are ``fully_shard``-ed on a 1-D mesh: every parameter, gradient and AdamW moment is
a DTensor ``Shard(0)``. Dropout draws from each rank's own stream and each rank trains on its own batches (its own
generator). After step K every rank calls ``dcp.save`` into the folder ``rp.checkpoint`` (each rank writes its
shards there: the model's and AdamW's, from ``get_state_dict``), with the step and, under a key of its own
(``rank{R}``: DCP keeps one copy of a key that every rank saves), its RNG state and data position. The restarted
process builds the same model and optimizer and ``dcp.load``s it all from ``rp.resume_from``. It resumes bit for
bit unless told otherwise:

    --forget-optimizer   the restarted process loads the model's state only (get_model_state_dict /
                         set_model_state_dict): AdamW starts again with no exp_avg/exp_avg_sq
    --forget-rng         the restarted process does not restore its RNG state: dropout draws other masks
    --shared-rng-key     every rank saves its RNG state under the same key, "rng" (not its own "rank{R}"): DCP
                         keeps one copy, and every rank loads that one rank's state
    --save-with-torchrepro  checkpoint with torchrepro.save_checkpoint / load_checkpoint instead of DCP: every rank
                         its own file, rank{R}.pt, in the folder rp.checkpoint (its shards and their layouts, its
                         RNG states, its data position in `extra`); resumes bit for bit too
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import torchrepro


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.drop = nn.Dropout(0.25)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.drop(torch.relu(self.fc1(x))))


class TrainState(Stateful):
    """What the checkpoint holds; DCP calls ``state_dict()`` to save and to load into, then ``load_state_dict``."""

    def __init__(self, model: nn.Module, opt: torch.optim.Optimizer, gen: torch.Generator, rank: int, *,
                 optimizer: bool = True, rng: bool = True, shared_rng_key: bool = False) -> None:
        self.model, self.opt, self.gen, self.rank = model, opt, gen, rank
        self.optimizer, self.rng = optimizer, rng
        self.rng_key = "rng" if shared_rng_key else f"rank{rank}"
        self.step = 0

    def state_dict(self) -> dict[str, Any]:
        if self.optimizer:
            model_sd, opt_sd = get_state_dict(self.model, self.opt)  # each rank: its shards (DTensors)
        else:
            model_sd, opt_sd = get_model_state_dict(self.model), None
        sd: dict[str, Any] = {"model": model_sd, "step": self.step,
                              f"rank{self.rank}": {"data": self.gen.get_state()}}
        if self.rng:
            sd.setdefault(self.rng_key, {})["rng"] = torch.get_rng_state()
        if opt_sd is not None:
            sd["optimizer"] = opt_sd
        return sd

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        if self.optimizer:
            set_state_dict(self.model, self.opt, model_state_dict=sd["model"], optim_state_dict=sd["optimizer"])
        else:
            set_model_state_dict(self.model, sd["model"])
        self.gen.set_state(sd[f"rank{self.rank}"]["data"])
        if self.rng:
            torch.set_rng_state(sd[self.rng_key]["rng"])
        self.step = int(sd["step"])


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--forget-optimizer", action="store_true")
    p.add_argument("--forget-rng", action="store_true")
    p.add_argument("--shared-rng-key", action="store_true")
    p.add_argument("--save-with-torchrepro", action="store_true")
    args = p.parse_args()

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    torchrepro.seed_everything(0)  # the same initial weights on every rank, per-rank dropout masks
    model = Net()
    for layer in (model.fc1, model.fc2):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(1000 + rank)  # this rank's data

    rp = torchrepro.resume_point()
    if rp.resume_from and args.save_with_torchrepro:  # every rank its own file
        loaded = torchrepro.load_checkpoint(rp.resume_from / f"rank{rank}.pt", model=model, optimizer=opt)
        gen.set_state(loaded["extra"]["data"])
        start = loaded["step"]
    elif rp.resume_from:  # the restarted process: every rank loads its shards, its RNG state and data position
        state = TrainState(model, opt, gen, rank, optimizer=not args.forget_optimizer, rng=not args.forget_rng,
                           shared_rng_key=args.shared_rng_key)
        dcp.load({"train": state}, checkpoint_id=rp.resume_from)
        start = state.step
    else:
        start = 0
    for step in range(start + 1, args.steps + 1):
        x, y = torch.randn(4, 8, generator=gen), torch.randn(4, 4, generator=gen)
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        if rp.due():  # step K is done, on every rank: every rank writes its part of the checkpoint
            assert rp.checkpoint is not None
            if args.save_with_torchrepro:
                os.makedirs(rp.checkpoint, exist_ok=True)
                torchrepro.save_checkpoint(rp.checkpoint / f"rank{rank}.pt", model=model, optimizer=opt, step=step,
                                           extra={"data": gen.get_state()})
                continue
            state = TrainState(model, opt, gen, rank, shared_rng_key=args.shared_rng_key)
            state.step = step
            dcp.save({"train": state}, checkpoint_id=rp.checkpoint)
    sys.stdout.write(f"rank {rank} done: loss {loss.item():.6f}\n")
    sys.stdout.flush()
    dist.barrier()  # no rank tears the group down while another still uses it
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
