"""TR103: a model built (in a helper) before torch.manual_seed."""

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


def main():
    model = build()
    torch.manual_seed(0)
    x = torch.randn(5, 10)  # ok: drawn after the seed
    print(model(x))


if __name__ == "__main__":
    main()
