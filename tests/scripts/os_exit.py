"""Seeds, trains argv[1] steps (0: none) and ends with os._exit(0): no atexit handlers, no finally blocks."""

import os
import sys

import torch

torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(int(sys.argv[1])):
    opt.zero_grad()
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
os._exit(0)
