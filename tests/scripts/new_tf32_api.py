"""Sets TF32 through PyTorch's new fp32_precision API (torch >= 2.9), then trains (parameters updated by hand, no
torch.optim): torchrepro must still record it."""
import torch
from torch import nn

if hasattr(torch.backends.cudnn, "conv"):
    torch.backends.cuda.matmul.fp32_precision = "ieee"
    torch.backends.cudnn.conv.fp32_precision = "ieee"
model = nn.Linear(4, 1)
for _ in range(2):
    model(torch.ones(3, 4)).sum().backward()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(p.grad, alpha=-0.1)
            p.grad = None
