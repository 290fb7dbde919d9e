"""A tiny training script with two ops nondeterministic on CUDA (tests/analysis/test_scan.py asserts the lines)."""
import sys

import torch
import torch.nn.functional as F
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(2)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3, padding=1)
        self.head = nn.Linear(2 * 8 * 8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.interpolate(self.conv(x), scale_factor=2, mode="bilinear", align_corners=False)  # line 19
        return self.head(y.flatten(1))


model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
idx = torch.tensor([0, 1, 0, 3])
for step in range(5):
    x = torch.randn(4, 1, 4, 4)
    out = model(x)
    pooled = torch.zeros(4, 4).index_add_(0, idx, out)  # line 29
    loss = pooled.square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.4f}")
    if step >= int(sys.argv[sys.argv.index("--allow-steps") + 1] if "--allow-steps" in sys.argv else 1):
        raise SystemExit("scan should have stopped the script after its first step")
