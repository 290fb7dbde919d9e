"""A dataset whose augmentation draws noise from an unseeded generator.

The model and the shuffle order are seeded, but every run sees different augmented batches, so
`torchrepro check` reports cause `data` at step 1:

    torchrepro check -- python examples/unseeded_augmentation.py
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn


class NoisyPoints(torch.utils.data.Dataset):
    def __init__(self, n: int = 256) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 20, generator=g)
        self.y = (self.x[:, :5].sum(1) > 0).long()
        self.rng = np.random.default_rng()  # BUG: unseeded augmentation randomness

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        noise = torch.from_numpy(self.rng.normal(0.0, 0.1, size=20).astype(np.float32))
        return self.x[i] + noise, self.y[i]


def main() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 2))
    loader = torch.utils.data.DataLoader(NoisyPoints(), batch_size=32, shuffle=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    print(f"final loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
