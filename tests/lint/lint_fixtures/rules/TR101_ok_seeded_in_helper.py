"""Near miss for TR101: the seed is set in a helper that the entry point calls, before anything is drawn."""

import random

import numpy as np
import torch
from torch import nn


def seed_all(seed):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class Trainer:
    def __init__(self, seed):
        self.seed = seed

    def setup(self):
        seed_all(self.seed)

    def fit(self):
        self.setup()
        model = nn.Linear(4, 2)  # ok: seeded by setup() through seed_all()
        noise = np.random.rand(3)  # ok
        return model, noise


def main():
    trainer = Trainer(seed=0)
    trainer.fit()


if __name__ == "__main__":
    main()
