"""TR101: a spawned process draws random numbers and no generator is seeded, in it or in the parent."""

import torch.multiprocessing as mp
from torch import nn


def train_worker(rank, world_size):
    model = nn.Linear(16, 4)  # expect: TR101
    return model, rank, world_size


def main():
    mp.spawn(train_worker, nprocs=2, args=(2,))


if __name__ == "__main__":
    main()
