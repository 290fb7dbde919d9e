"""A DDP training loop (gloo on CPU) with its own checkpoint and resume, for `torchrepro check --resume-at K
--nproc-per-node 2` (tests/distributed/test_resume_at_ranks.py). Dropout draws from each rank's own stream, and
each rank trains on its own shard (`ResumableLoader`). It resumes bit for bit unless told otherwise:

    --forget optimizer   the restarted process does not load the optimizer state (SGD's momentum buffers)
    --save-on rank0      rank 0 saves one checkpoint file that every rank loads (its RNG states and data position
                         are rank 0's: the other ranks do not resume exactly); default `all`: each rank saves its
                         own file, `rank{R}.pt`, into the checkpoint folder torchrepro names
    --snapshot           minGPT-ddp style instead: every rank loads snapshot.pt (in the cwd) at start if it
                         exists, rank 0 saves it every --save-every steps; torchrepro.resume_point() is not read
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import torchrepro

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=4)
p.add_argument("--forget", choices=["nothing", "optimizer"], default="nothing")
p.add_argument("--save-on", choices=["all", "rank0"], default="all")
p.add_argument("--snapshot", action="store_true")
p.add_argument("--save-every", type=int, default=2)
args = p.parse_args()

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank = dist.get_rank()
torchrepro.seed_everything(0)
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Dropout(0.25), nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
g = torch.Generator().manual_seed(1)
data = torch.utils.data.TensorDataset(torch.randn(32, 4, generator=g), torch.randn(32, 1, generator=g))
loader = torchrepro.ResumableLoader(data, batch_size=4, seed=0)  # one shard per rank

start = 0
rp = torchrepro.resume_point()
if args.snapshot:
    if os.path.exists("snapshot.pt"):
        snap = torch.load("snapshot.pt")
        model.load_state_dict(snap["model"])
        opt.load_state_dict(snap["optimizer"])
        start = snap["step"]
elif rp.resume_from:
    own = args.save_on == "all"  # rank 0's file holds rank 0's data position: the others' loaders start again
    path = rp.resume_from / f"rank{rank}.pt" if own else rp.resume_from
    start = torchrepro.load_checkpoint(path, model=model, loader=loader if own or rank == 0 else None,
                                       optimizer=None if args.forget == "optimizer" else opt)["step"]
ddp = DistributedDataParallel(model)

for step in range(start + 1, args.steps + 1):
    x, y = loader.next_batch()
    opt.zero_grad()
    nn.functional.mse_loss(ddp(x), y).backward()
    opt.step()
    if args.snapshot:
        if rank == 0 and step % args.save_every == 0:
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}, "snapshot.pt")
    elif rp.due():  # step K is done (every rank): save, then torchrepro ends every rank as its next step begins
        assert rp.checkpoint is not None
        if args.save_on == "all":
            os.makedirs(rp.checkpoint, exist_ok=True)
            torchrepro.save_checkpoint(Path(rp.checkpoint) / f"rank{rank}.pt", model=model, optimizer=opt,
                                       loader=loader, step=step)
        elif rank == 0:
            torchrepro.save_checkpoint(rp.checkpoint, model=model, optimizer=opt, loader=loader, step=step)

dist.barrier()  # no rank tears the group down while another still uses it
dist.destroy_process_group()
sys.exit(0)
