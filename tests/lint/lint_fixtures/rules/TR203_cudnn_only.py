"""TR203: cudnn.deterministic = True covers convolutions, but not scatter/index ops."""

import torch
from torch import nn


def main():
    torch.manual_seed(0)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    conv = nn.Conv2d(3, 8, 3)  # ok: cuDNN is deterministic
    out = torch.zeros(4, device="cuda")
    out.index_add_(0, torch.tensor([0, 0]), torch.ones(2))  # expect: TR203
    return conv, out


if __name__ == "__main__":
    main()
