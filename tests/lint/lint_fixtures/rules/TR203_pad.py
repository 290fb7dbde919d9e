"""TR203: padding whose backward accumulates with atomic adds on CUDA. Replicate padding's backward has a
deterministic kernel that deterministic mode switches to; reflect padding's has none (deterministic mode raises)."""

import torch.nn.functional as F
from torch import nn


def replicate(x):
    return F.pad(x, (1, 1, 1, 1), mode="replicate")  # expect: TR203


def reflect(x):
    return F.pad(x, (1, 1, 1, 1), mode="reflect")  # expect: TR203


def other_modes(x, mode):
    a = F.pad(x, (1, 1))  # ok: constant padding
    b = F.pad(x, (1, 1), "circular")  # ok: circular padding is slicing
    c = F.pad(x, (1, 1), mode=mode)  # ok: not a literal, not judged
    return a, b, c


class Padded(nn.Module):
    def __init__(self):
        super().__init__()
        self.rep = nn.ReplicationPad2d(1)  # expect: TR203
        self.ref = nn.ReflectionPad2d(1)  # expect: TR203
        self.zero = nn.ZeroPad2d(1)  # ok: constant padding


if __name__ == "__main__":
    Padded().cuda()
