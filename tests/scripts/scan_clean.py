"""A training script with no op that is nondeterministic on CPU or CUDA."""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
for _ in range(3):
    x = torch.randn(32, 8)
    loss = (model(x) - 1).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
print("done")
