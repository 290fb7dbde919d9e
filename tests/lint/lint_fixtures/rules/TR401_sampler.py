"""TR401: a DistributedSampler whose epoch is never set."""

import torch.distributed as dist
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler


def main(train_set, val_set):
    dist.init_process_group("nccl")
    sampler = DistributedSampler(train_set, seed=0)  # expect: TR401
    val_sampler = DistributedSampler(val_set, shuffle=False)  # ok: does not shuffle
    loader = DataLoader(train_set, batch_size=32, sampler=sampler)
    val_loader = DataLoader(val_set, batch_size=32, sampler=val_sampler)
    for _epoch in range(3):
        for _batch in loader:
            pass
    return val_loader
