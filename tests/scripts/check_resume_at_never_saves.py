"""A training loop that never checkpoints (tests/cli/test_check_resume_at.py): 8 steps, parameters updated by hand
(no torch.optim: the check is about the missing checkpoint, not the optimizer). It asks torchrepro.resume_point()
where to checkpoint, as resume_loop.py does, and never saves there."""

import torch

import torchrepro

rp = torchrepro.resume_point()  # never saved at rp.checkpoint
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
g = torch.Generator().manual_seed(1)
x, y = torch.randn(64, 4, generator=g), torch.randn(64, 1, generator=g)
for step in range(8):
    loss = torch.nn.functional.mse_loss(model(x[8 * step:8 * step + 8]), y[8 * step:8 * step + 8])
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(p.grad, alpha=-0.01)
            p.grad = None
print("done", step + 1)
