"""A tiny seeded MLP trained with SGD for --steps steps (for `torchrepro bench` / `variance` tests).

``--manual``: the parameters are updated by hand, not by torch.optim (whose first use imports torch._dynamo: about
1 CPU s a run); each backward() is a step."""
import argparse
import contextlib

import torch
from handstep import sgd_step
from torch import nn

import torchrepro

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100)
parser.add_argument("--manual", action="store_true")
parser.add_argument("--fixed-seed", action="store_true", help="seed with a constant (ignore the launcher's seed)")
args = parser.parse_args()
if args.fixed_seed:
    torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))
opt = None if args.manual else torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(64, 16), torch.randint(0, 4, (64,))
for step in range(args.steps):
    if opt is not None:
        opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    if opt is None:
        sgd_step(model.parameters())
    else:
        opt.step()
    if step % 5 == 4:
        with torch.no_grad() if args.manual else contextlib.nullcontext():  # manual: a forward outside a step
            torchrepro.log_metric("acc", (model(x).argmax(1) == y).float().mean())
print(f"final loss {loss.item():.6f}")
