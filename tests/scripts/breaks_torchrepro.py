"""Trains fine (parameters updated by hand, no torch.optim), then breaks torchrepro's end-of-run summary (stands in
for a bug in torchrepro's own child code)."""
import torch
from torch import nn

import torchrepro.env.info

model = nn.Linear(4, 1)
for _ in range(2):
    model(torch.ones(3, 4)).sum().backward()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(p.grad, alpha=-0.1)
            p.grad = None


def _broken() -> dict:
    raise RuntimeError("summary failed on purpose")


torchrepro.env.info.environment_summary = _broken
