"""Does what the audit checklist asks before its first step: seeds, deterministic mode, no TF32, a seeded
loader with a worker_init_fn; also sets CUBLAS_WORKSPACE_CONFIG itself and trains under CPU autocast."""

import os

import torch
from torch import nn

import torchrepro

os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
torchrepro.seed_everything(0)
torchrepro.deterministic()
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
data = torch.utils.data.TensorDataset(torch.randn(32, 8))
loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True, generator=torchrepro.make_generator(0),
                                     worker_init_fn=torchrepro.seed_worker)
model = nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for (x,) in loader:
    opt.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(x).float().pow(2).mean()
    loss.backward()
    opt.step()
