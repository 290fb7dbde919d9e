"""TR203: ops without deterministic CUDA kernels, in a program that never enables deterministic mode."""

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


class Model(nn.Module):
    def __init__(self, mode):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)  # expect: TR203
        self.pool = nn.AdaptiveAvgPool2d(1)  # expect: TR203
        self.bag = nn.EmbeddingBag(100, 8, mode="max")  # expect: TR203
        self.bag_sum = nn.EmbeddingBag(100, 8, mode="sum")  # ok: only mode="max" lacks a deterministic kernel
        self.up = nn.Upsample(scale_factor=2, mode="bilinear")  # expect: TR203
        self.up_near = nn.Upsample(scale_factor=2)  # ok: nearest
        self.ctc = nn.CTCLoss()  # expect: TR203
        self.mode = mode

    def forward(self, x, idx, src, grid, labels, weights):
        out = torch.zeros(10, 8)
        out.index_add_(0, idx, src)  # expect: TR203
        out.scatter_add_(0, idx.unsqueeze(1).expand(-1, 8), src)  # expect: TR203
        out.index_put_((idx,), src, accumulate=True)  # expect: TR203 (on CPU; on CUDA this one is deterministic)
        out.index_put_((idx,), src)  # expect: TR203 (accumulate=False: which write wins among duplicate indices)
        out.view(-1).put_(idx, src.view(-1)[: idx.numel()])  # expect: TR203
        y = F.interpolate(x, scale_factor=2, mode="bicubic")  # grouped into line 16
        y = F.interpolate(y, scale_factor=2)  # ok: nearest
        y = F.interpolate(y, scale_factor=2, mode=self.mode)  # ok: not a literal
        z = F.grid_sample(x, grid)  # expect: TR203
        counts = torch.bincount(labels)  # ok: no weights
        weighted = torch.bincount(labels, weights=weights)  # expect: TR203
        host = np.bincount(labels.numpy(), weights.numpy())  # ok: NumPy, on the host
        padded = F.pad(x, (1, 1, 1, 1), mode="reflect")  # expect: TR203
        hist = x.histc(bins=10)  # expect: TR203
        return out, y, z, counts, weighted, host, padded, hist


def main():
    torch.manual_seed(0)
    Model("bilinear").cuda()


if __name__ == "__main__":
    main()
