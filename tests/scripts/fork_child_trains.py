"""A parent that trains deterministically (seeded, 3 steps) after forking a child that trains its own,
unseeded model with ops the parent never runs (cumsum), then leaves with os._exit: the child must record
nothing into the parent's run."""
import os

import torch
from torch import nn


def train(seed: int, steps: int, marker: bool) -> None:
    torch.manual_seed(seed)
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        opt.zero_grad()
        out = model(torch.randn(8, 4))
        (out.cumsum(0) if marker else out).sum().backward()
        opt.step()


pid = os.fork()
if pid == 0:
    train(int.from_bytes(os.urandom(4), "little"), 3, marker=True)
    torchrepro_log = __import__("torchrepro").log_metric
    torchrepro_log("child", 1.0)
    os._exit(0)
os.waitpid(pid, 0)
train(0, 3, marker=False)
