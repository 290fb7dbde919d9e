"""A seeded model whose forward adds noise from an OS-seeded generator: every run diverges at step 1 with cause
compute, the inputs of the model being identical (``--locate`` names the ``aten.rand`` of the marked line).

``noisy_model.py [--starts FILE]``: with ``--starts``, count this script's starts in FILE and fail from the third
on (as a script whose data set vanished or whose GPU is taken when ``--locate`` re-runs it). Its parameters are
updated by hand, not by torch.optim (whose first use imports torch._dynamo: about 1 CPU s in every run)."""

import argparse
import os
import sys

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--starts")
args = parser.parse_args()
if args.starts:
    starts = int(open(args.starts).read()) + 1 if os.path.exists(args.starts) else 1
    with open(args.starts, "w") as f:
        f.write(str(starts))
    if starts >= 3:
        sys.exit("the data set is gone")

torch.manual_seed(0)
noise = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))


class Noisy(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x + torch.rand(x.shape, generator=noise))  # NOISE-LINE


model = Noisy()
for _ in range(2):
    (model(torch.ones(8, 4)) ** 2).mean().backward()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(p.grad, alpha=-0.1)
            p.grad = None
