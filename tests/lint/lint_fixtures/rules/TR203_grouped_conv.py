"""TR203 groups: the calls with one cause in one top-level class or function are one finding, at the first call,
naming the other lines. A noqa on the reported line silences the group; on another line it takes that line out."""

import torch.nn.functional as F
from torch import nn


class VGGish(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 64, 3, padding=1)  # expect: TR203
        self.c2 = nn.Conv2d(64, 64, 3, padding=1)  # grouped into line 11
        self.c3 = nn.Conv2d(64, 128, 3, padding=1)  # grouped into line 11
        self.c4 = nn.Conv2d(128, 128, 3, padding=1)  # grouped into line 11
        self.c5 = nn.Conv2d(128, 256, 3, padding=1)  # torchrepro: noqa: TR203  # ok: taken out of the group
        self.c6 = nn.Conv2d(256, 256, 3, padding=1)  # grouped into line 11
        self.pair = nn.Sequential(nn.Conv2d(256, 256, 1), nn.Conv2d(256, 256, 1))  # grouped into line 11
        self.up = nn.ConvTranspose2d(256, 128, 2, stride=2)  # expect: TR203 (another cause: transposed backward)

    def forward(self, x, w):
        return F.conv2d(self.c6(x), w)  # grouped into line 11


def block(cin, cout):
    return nn.Sequential(nn.Conv2d(cin, cout, 3), nn.Conv2d(cout, cout, 3))  # expect: TR203 (another function)


class Silenced(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Conv1d(8, 8, 3)  # torchrepro: noqa: TR203  # ok: the reported line, so the group is silenced
        self.b = nn.Conv1d(8, 8, 3)  # ok: in the silenced group


if __name__ == "__main__":
    VGGish().cuda()
