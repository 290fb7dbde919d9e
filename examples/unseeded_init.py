"""A script that forgets to seed: the model starts from different random weights in every run.

The data are fixed, so `torchrepro check` reports cause `initial-weights` at step 0:

    torchrepro check -- python examples/unseeded_init.py
    torchrepro check --seed 0 -- python examples/unseeded_init.py   # identical
"""

from __future__ import annotations

import torch
from torch import nn


def main() -> None:
    g = torch.Generator().manual_seed(0)  # the data are seeded...
    x = torch.randn(256, 20, generator=g)
    y = (x[:, :5].sum(1) > 0).long()
    model = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 2))  # ...but the weights are not
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(8):
        batch = slice(32 * step, 32 * (step + 1))
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x[batch]), y[batch])
        loss.backward()
        opt.step()
    print(f"final loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
