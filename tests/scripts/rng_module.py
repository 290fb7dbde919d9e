"""One module draws noise from a generator seeded from the OS: every run differs.

Its parameters are updated by hand, not by torch.optim (whose first use imports torch._dynamo: about 1 CPU s
in every run).
"""
import torch
from torch import nn


class NoisyLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.g = torch.Generator()
        self.g.seed()  # BUG: nondeterministic seed

    def forward(self, x):
        return x + 0.01 * torch.randn(x.shape, generator=self.g)  # NOISE-LINE


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), NoisyLayer(), nn.ReLU(), nn.Linear(8, 1))
x, y = torch.randn(16, 4), torch.randn(16, 1)
for _ in range(3):
    ((model(x) - y) ** 2).mean().backward()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(p.grad, alpha=-0.1)
            p.grad = None
