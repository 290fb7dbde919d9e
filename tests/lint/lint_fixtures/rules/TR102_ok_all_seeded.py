"""Near miss for TR102: every library that draws is seeded; a Dataset's own draws run in seeded workers."""

import random

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset


class Noisy(Dataset):
    def __len__(self):
        return 100

    def __getitem__(self, i):
        return torch.tensor(i + np.random.normal())  # ok: runs in DataLoader workers, seeded from torch


def main():
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    picks = random.sample(range(100), 5)  # ok
    loader = DataLoader(Noisy(), batch_size=4, num_workers=2, generator=torch.Generator().manual_seed(0))
    print(picks, next(iter(loader)))


if __name__ == "__main__":
    main()
