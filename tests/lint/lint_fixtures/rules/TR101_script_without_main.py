"""TR101: a script without a main guard (top-level code) that draws from torch unseeded."""

import torch

data = torch.randn(128, 4)  # expect: TR101
weights = torch.zeros(4, requires_grad=True)
for step in range(10):
    loss = (data @ weights).pow(2).mean()
    loss.backward()
