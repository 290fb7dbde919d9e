"""The number of refinement passes depends on an unseeded draw: the op sequence differs between runs.

Its parameters are updated by hand, not by torch.optim (whose first use imports torch._dynamo: about 1 CPU s
in every run).
"""
import os

import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
x, y = torch.randn(16, 4), torch.randn(16, 1)
for _ in range(3):
    h = model(x)
    passes = int.from_bytes(os.urandom(2), "little") % 1000  # BUG: unseeded draw decides the control flow
    for _ in range(passes):
        h = h * 0.999  # BRANCH-LINE
    ((h - y) ** 2).mean().backward()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(p.grad, alpha=-0.1)
            p.grad = None
