"""One run logs a value early in each step (an extra op), and a module draws unseeded noise (the real cause).

Which runs log: with SPEED_EXTRA_OP_DIR set, every odd-numbered run of this script (claimed atomically in that
folder), so that exactly one of any two consecutive runs does; without it, an unseeded coin flip.

Its parameters are updated by hand, not by torch.optim (whose first use imports torch._dynamo: about 1 CPU s
in every run).
"""
import os
import random

import torch
from torch import nn


def logs_this_run() -> bool:
    folder = os.environ.get("SPEED_EXTRA_OP_DIR")
    if not folder:
        return random.SystemRandom().random() < 0.5  # unseeded coin flip
    os.makedirs(folder, exist_ok=True)
    k = 0
    while True:
        try:
            os.close(os.open(os.path.join(folder, f"run{k}"), os.O_CREAT | os.O_EXCL))
            return k % 2 == 1
        except FileExistsError:
            k += 1


class NoisyLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.g = torch.Generator()
        self.g.seed()  # BUG: nondeterministic seed

    def forward(self, x):
        return x + 0.01 * torch.randn(x.shape, generator=self.g)  # NOISE-LINE


log = logs_this_run()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), NoisyLayer(), nn.ReLU(), nn.Linear(8, 1))
x, y = torch.randn(16, 4), torch.randn(16, 1)
for _ in range(3):
    if log:
        print("weight norm", model[0].weight.norm().item())  # LOGGING-LINE
    ((model(x) - y) ** 2).mean().backward()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(p.grad, alpha=-0.1)
            p.grad = None
