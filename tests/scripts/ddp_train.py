"""A tiny DDP training script (gloo on CPU) for torchrepro's distributed tests.

    python -m torch.distributed.run --standalone --nproc-per-node 2 tests/scripts/ddp_train.py [--steps N]
        [--perturb-rank R --perturb-step K]   rank R nudges fc1.weight just before optimizer step K (or
                                              DDP_TRAIN_PERTURB=R:K in the environment)
        [--exit-rank R --exit-step K]         rank R exits (code 3) after optimizer step K, before its check
        [--exit-code C]                       ... with exit code C instead (0: a rank that stops early)
        [--check-every N]                     torchrepro.distributed.ranks.check_consistency every N steps
        [--save DIR --save-at K] [--resume DIR]  per-rank checkpoints (bitwise resume)
        [--out DIR]                           write DIR/rank{R}.json: dropout masks and final fingerprints

Each rank prints one line `masks <json>` (the fingerprint of its dropout mask at each step) at the end.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import torchrepro
from torchrepro.distributed.ranks import check_consistency


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.drop = nn.Dropout(0.5)
        self.fc2 = nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.drop(torch.relu(self.fc1(x))))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--seed", type=int, default=0)
    # also from DDP_TRAIN_PERTURB=R:K, so that a perturbed run has the same command as an unperturbed one
    perturb = [int(v) for v in os.environ.get("DDP_TRAIN_PERTURB", "-1:-1").split(":")]
    p.add_argument("--perturb-rank", type=int, default=perturb[0])
    p.add_argument("--perturb-step", type=int, default=perturb[1])
    p.add_argument("--exit-rank", type=int, default=-1)
    p.add_argument("--exit-step", type=int, default=-1)
    p.add_argument("--exit-code", type=int, default=3)
    p.add_argument("--check-every", type=int, default=0)
    p.add_argument("--timeout", type=float, default=20.0)
    p.add_argument("--save")
    p.add_argument("--save-at", type=int, default=-1)
    p.add_argument("--resume")
    p.add_argument("--out")
    args = p.parse_args()

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
    rank = dist.get_rank()
    torchrepro.seed_everything(args.seed)
    model = Net()
    data = torch.utils.data.TensorDataset(torch.randn(64, 8, generator=torch.Generator().manual_seed(1)),
                                          torch.randint(0, 2, (64,), generator=torch.Generator().manual_seed(2)))
    loader = torchrepro.ResumableLoader(data, batch_size=4, seed=args.seed)  # one shard per rank
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    start = 0
    if args.resume:
        start = torchrepro.load_checkpoint(os.path.join(args.resume, f"rank{rank}.pt"), model=model, optimizer=opt,
                                           loader=loader)["step"]
    ddp = DistributedDataParallel(model)
    masks: list[str] = []
    model.drop.register_forward_hook(
        lambda m, inp, out: masks.append(torchrepro.fingerprint(out != 0)))
    for step in range(start + 1, args.steps + 1):
        x, y = loader.next_batch()
        opt.zero_grad()
        loss = nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        if step == args.perturb_step and rank == args.perturb_rank:
            with torch.no_grad():
                model.fc1.weight[0, 0] += 1e-3
        opt.step()
        if step == args.exit_step and rank == args.exit_rank:  # before the check: the others wait for it there
            print(f"rank {rank} exits early at step {step}", file=sys.stderr, flush=True)
            sys.exit(args.exit_code)
        if args.check_every and step % args.check_every == 0:
            report = check_consistency(ddp, opt, step=step, timeout=args.timeout)
            sys.stdout.write(report.summary() + "\n")  # one write: the ranks share stdout (see the masks line)
            sys.stdout.flush()
        if args.save and step == args.save_at:
            os.makedirs(args.save, exist_ok=True)
            torchrepro.save_checkpoint(os.path.join(args.save, f"rank{rank}.pt"), model=model, optimizer=opt,
                                       loader=loader, step=step)
    # one write per line: the ranks share stdout, and print() writes the newline apart when it is unbuffered
    sys.stdout.write("masks " + json.dumps(masks) + "\n")
    sys.stdout.flush()
    if args.out:
        final = {name: torchrepro.fingerprint(t) for name, t in model.state_dict().items()}
        with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
            json.dump({"rank": rank, "masks": masks, "final": final,
                       "streams": torchrepro.distributed.ranks.rng_streams()}, f)
    dist.barrier()  # no rank tears the group down while another still uses it
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
