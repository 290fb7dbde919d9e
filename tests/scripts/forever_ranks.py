"""Trains until killed, on every rank (no process group), its parameter updated by hand (no torch.optim); once its
first step is done, rank R writes ``{"pid": its pid, "parent": its parent's pid (torchrun)}`` to ``DIR/rankR.json``
(DIR = argv[1])."""

import json
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
        path = os.path.join(sys.argv[1], f"rank{os.environ.get('RANK', '0')}.json")
        with open(path + ".tmp", "w") as f:
            json.dump({"pid": os.getpid(), "parent": os.getppid()}, f)
        os.replace(path + ".tmp", path)
    time.sleep(0.05)
