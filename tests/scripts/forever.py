"""Trains until killed; writes its pid to the file named by argv[1] once the first step is done."""

import os
import sys
import time

import torch

torch.manual_seed(0)
w = torch.nn.Parameter(torch.randn(4))
opt = torch.optim.SGD([w], lr=0.01)
step = 0
while True:
    (w ** 2).sum().backward()
    opt.step()
    opt.zero_grad()
    step += 1
    if step == 1:
        with open(sys.argv[1] + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.replace(sys.argv[1] + ".tmp", sys.argv[1])
    time.sleep(0.05)
