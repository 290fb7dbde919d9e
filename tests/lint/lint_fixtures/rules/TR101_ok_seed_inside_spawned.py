"""Near miss for TR101: nothing is seeded in the parent, and each spawned process seeds itself before it
draws (a seed inside the spawned function counts)."""

import random

import torch
import torch.multiprocessing as mp
from torch import nn


def set_seed(seed):
    random.seed(seed)
    torch.manual_seed(seed)


def main_worker(rank, world_size, seed):
    torch.manual_seed(seed + rank)
    model = nn.Linear(16, 4)  # ok: seeded in the spawned process
    return model, world_size


def shuffle_worker(seed):
    set_seed(seed)
    order = list(range(10))
    random.shuffle(order)  # ok: seeded by set_seed() in the process
    return order


def main():
    world_size = torch.cuda.device_count()
    mp.spawn(main_worker, nprocs=world_size, args=(world_size, 0))
    proc = mp.Process(target=shuffle_worker, args=(0,))
    proc.start()
    proc.join()


if __name__ == "__main__":
    main()
