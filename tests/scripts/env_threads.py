"""A model whose forward pass normalises by a global sum: on CPU that sum depends on the thread count.

torch splits a large CPU reduction into one partial sum per thread, so `OMP_NUM_THREADS=1` and `=2` add the
same numbers in another order and get other bits; the script seeds itself, so `--seed` changes nothing.
"""

import torch
from torch import nn


class GlobalNorm(nn.Module):
    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h / h.abs().sum()


torch.manual_seed(0)
x = torch.randn(1024, 128)
model = nn.Sequential(nn.Linear(128, 128), GlobalNorm(), nn.Linear(128, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    opt.zero_grad()
    loss = model(x).pow(2).mean()
    loss.backward()
    opt.step()
print(f"threads {torch.get_num_threads()} loss {loss.item().hex()}")
