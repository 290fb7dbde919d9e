"""Trains fine, then breaks torchrepro's end-of-run summary (stands in for a bug in torchrepro's own child code)."""
import torch
from torch import nn

import torchrepro.env.info

model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(2):
    opt.zero_grad()
    model(torch.ones(3, 4)).sum().backward()
    opt.step()


def _broken() -> dict:
    raise RuntimeError("summary failed on purpose")


torchrepro.env.info.environment_summary = _broken
