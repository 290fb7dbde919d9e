"""Trains one step of a tiny seeded model and prints its loss (``epoch 1 loss 0.24``), then waits until the file
named by ``--until`` exists (none: no wait), then prints a line to stderr, trains one more step and prints its
loss and a last line without a newline. ``--lines N`` prints N numbered lines first (``line 1`` ...), half to
stdout and half to stderr. It gives up after 300 s (exit 3).
"""
import argparse
import os
import sys
import time

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--until")
parser.add_argument("--lines", type=int, default=0)
args = parser.parse_args()

for k in range(1, args.lines + 1):
    print(f"line {k}", file=sys.stdout if k % 2 else sys.stderr)
torch.manual_seed(0)
model = nn.Linear(4, 2)
x = torch.randn(8, 4)


def step() -> float:
    loss = model(x).square().mean()
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(p.grad, alpha=-0.1)
            p.grad = None
    return loss.item()


print(f"epoch 1 loss {step():.2f}")
deadline = time.monotonic() + 300
while args.until and not os.path.exists(args.until):
    if time.monotonic() > deadline:
        sys.exit(3)
    time.sleep(0.05)
print("warning: went on", file=sys.stderr)
print(f"epoch 2 loss {step():.2f}")
print("no newline at the end", end="")
