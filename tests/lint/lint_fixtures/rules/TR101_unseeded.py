"""TR101: a program that draws random numbers and never seeds any generator."""

import random

import numpy as np
import torch
from torch import nn


def build_model():
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))  # expect: TR101


def main():
    model = build_model()
    noise = np.random.normal(size=8)  # expect: TR101
    order = list(range(10))
    random.shuffle(order)  # expect: TR101
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    print(model(x), noise, order)


if __name__ == "__main__":
    main()
