"""Sets cudnn.benchmark = True and never seeds: `torchrepro audit -- python ...` must report both."""

import torch
from torch import nn

torch.backends.cudnn.benchmark = True
model = nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(32, 8)), batch_size=8, shuffle=True)
for (x,) in loader:
    opt.zero_grad()
    model(x).pow(2).mean().backward()
    opt.step()
print("trained")
