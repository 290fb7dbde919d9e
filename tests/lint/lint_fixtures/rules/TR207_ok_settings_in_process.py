"""Near miss for TR207: every process makes its own determinism settings — in a helper the spawned function
calls, or at the top level of the main module (which a spawned process re-imports)."""

import torch
import torch.multiprocessing as mp
from torch import nn

torch.backends.cudnn.deterministic = True  # the top level runs again in every spawned process


def make_deterministic(seed):
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)


def conv_worker(rank):  # ok: cuDNN's flag is set at the top level, which this process re-imports
    torch.manual_seed(rank)
    return nn.Conv2d(3, 8, 3).cuda(rank)


def worker(rank):  # ok: the helper enables deterministic mode in this process
    make_deterministic(rank)
    return nn.Conv2d(3, 8, 3).cuda(rank)


def main():
    torch.manual_seed(0)
    mp.spawn(conv_worker, nprocs=2)
    make_deterministic(0)
    mp.spawn(worker, nprocs=2)


if __name__ == "__main__":
    main()
