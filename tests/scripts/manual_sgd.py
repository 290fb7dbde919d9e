"""Updates parameters by hand after backward() (no torch.optim)."""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
x, y = torch.randn(16, 4), torch.randn(16, 1)
for _ in range(4):
    loss = ((model(x) - y) ** 2).mean()
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(p.grad, alpha=-0.1)
            p.grad = None
print("done")
