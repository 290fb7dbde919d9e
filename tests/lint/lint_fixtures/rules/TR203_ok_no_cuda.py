"""Near miss for TR203: ops that are nondeterministic only on CUDA (cuDNN convolutions and RNNs, atomic
scatter-adds, adaptive pooling's backward), in a program that never uses CUDA: on the CPU they are deterministic.
Seeding CUDA's generators when there is a GPU, or following a tensor's own device, does not put work on one."""

import random

import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 8, 3)  # ok: no CUDA in this program
        self.pool = nn.AdaptiveAvgPool2d(1)  # ok: same
        self.rnn = nn.LSTM(8, 16)  # ok: cuDNN RNNs run only on CUDA

    def forward(self, x, idx):
        out = torch.zeros(4, 8, device=x.device)  # a tensor's own device: not a choice of device
        out.index_add_(0, idx, self.pool(self.conv(x)).flatten(1))  # ok: the CUDA kernel is the nondeterministic one
        return out


def seed_everything(seed):
    random.seed(seed)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


def main():
    seed_everything(0)
    device = torch.device("cpu")
    return Net().to(device)


if __name__ == "__main__":
    main()
