"""TR102: only torch is seeded while NumPy and `random` draw too."""

import random

import numpy as np
import torch
from torch import nn


def augment(x):
    if random.random() < 0.5:  # expect: TR102
        x = x.flip(0)
    return x


def main():
    torch.manual_seed(0)
    model = nn.Linear(4, 2)  # ok: torch is seeded
    perm = np.random.permutation(100)  # expect: TR102
    rng = np.random.default_rng(7)
    extra = rng.normal(size=3)  # ok: a seeded Generator object, not the global one
    print(model, perm, extra, augment(torch.ones(4)))


if __name__ == "__main__":
    main()
