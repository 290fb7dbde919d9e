"""TR103: a model built (in a helper) before torch.manual_seed."""

import random

import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(10, 2)

    def forward(self, x):
        return self.fc(x)


def build():
    return Net()  # expect: TR103


def main(opt):
    if opt.seed is None:
        opt.seed = random.randint(1, 10000)  # ok: choosing the seed itself, before seeding with it
    print("seed:", opt.seed)
    random.seed(opt.seed)
    model = build()
    torch.manual_seed(opt.seed)
    x = torch.randn(5, 10)  # ok: drawn after the seed
    print(model(x))


if __name__ == "__main__":
    main(None)
