"""A tiny MLP whose steps repeat bitwise only under deterministic algorithms: without them each step adds noise
drawn from os.urandom, standing in for a kernel that is nondeterministic unless deterministic algorithms are on
(as index_add_ on CUDA). Prints the memory-fill flag it ran under (`bench --explain` tests read it)."""
import os

import torch
from torch import nn

torch.manual_seed(0)
print(f"fill_uninitialized_memory={torch.utils.deterministic.fill_uninitialized_memory} "
      f"algorithms={torch.are_deterministic_algorithms_enabled()}", flush=True)
model = nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(16, 8), torch.randn(16, 2)
for _ in range(50):
    opt.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    if not torch.are_deterministic_algorithms_enabled():
        noise = int.from_bytes(os.urandom(2), "little") * 1e-9
        model.weight.grad.add_(noise)
    opt.step()
