"""examples/unseeded_init.py with the parameters updated by hand, not by torch.optim (whose first use imports
torch._dynamo: about 1 CPU s in every run), for the tests of check, diff and --locate that are not about the
example: the data are seeded, the weights are not, so two runs differ from their initial weights (step 0) on."""
import torch
from handstep import sgd_step
from torch import nn

g = torch.Generator().manual_seed(0)  # the data are seeded...
x = torch.randn(256, 20, generator=g)
y = (x[:, :5].sum(1) > 0).long()
model = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 2))  # ...but the weights are not
for step in range(8):
    batch = slice(32 * step, 32 * (step + 1))
    loss = nn.functional.cross_entropy(model(x[batch]), y[batch])
    loss.backward()
    sgd_step(model.parameters())
print(f"final loss {loss.item():.4f}")
