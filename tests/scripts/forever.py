"""Trains until killed; writes its pid to the file named by argv[1] once the first step is done. Its parameter is
updated by hand, not by torch.optim (whose first use imports torch._dynamo: about 1 CPU s a run)."""

import os
import sys
import time

import torch

torch.manual_seed(0)
w = torch.nn.Parameter(torch.randn(4))
step = 0
while True:
    (w ** 2).sum().backward()
    with torch.no_grad():
        w.add_(w.grad, alpha=-0.01)
        w.grad = None
    step += 1
    if step == 1:
        with open(sys.argv[1] + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.replace(sys.argv[1] + ".tmp", sys.argv[1])
    time.sleep(0.05)
