"""A tiny regression model whose output sums hidden features; --reverse sums them in the opposite order (the same
math, other rounding), --compile compiles the model with torch.compile (inductor).

Its parameters are updated by hand, not by torch.optim (whose first use imports torch._dynamo: about 1 CPU s
in every run)."""
import argparse

import torch
from handstep import sgd_step
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--reverse", action="store_true")
parser.add_argument("--compile", action="store_true")
parser.add_argument("--steps", type=int, default=3)
args = parser.parse_args()


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.hidden = nn.Linear(8, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.hidden(x))
        if args.reverse:
            return h.flip(1).sum(1, keepdim=True)  # REVERSED-SUM
        return h.sum(1, keepdim=True)  # FORWARD-SUM


torch.manual_seed(0)
model = Net()
run = torch.compile(model) if args.compile else model
x, y = torch.randn(64, 8), torch.randn(64, 1)
for _ in range(args.steps):
    loss = ((run(x) - y) ** 2).mean()
    loss.backward()
    sgd_step(model.parameters(), lr=0.05)
print(f"loss {loss.item():.6f}")
