"""TR203 in a program that never uses CUDA: only the ops that are nondeterministic on the CPU too (with 2+
threads) are reported, with the CPU's reason; the CUDA-only ones are not."""

import torch
from torch import nn


def aggregate(messages, dst, num_nodes):
    out = torch.zeros(num_nodes * messages.shape[1])
    out.index_put_((dst,), messages.reshape(-1), accumulate=True)  # expect: TR203 (on CPU with 2+ threads)
    out.index_add_(0, dst, messages.reshape(-1))  # ok: nondeterministic on CUDA only
    return out


def copy_rows(table, idx, rows):
    return table.index_copy_(0, idx, rows)  # expect: TR203 (duplicate indices: which write wins, on CPU too)


def main():
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 8, 3)  # ok: cuDNN is not used on the CPU
    return conv, aggregate(torch.ones(4, 2), torch.tensor([0, 0, 1, 1, 2, 2, 3, 3]), 4)


if __name__ == "__main__":
    main()
