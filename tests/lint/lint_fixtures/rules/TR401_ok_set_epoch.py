"""Near miss for TR401: set_epoch is called at the start of every epoch."""

import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler


def main(train_set):
    dist.init_process_group("nccl")
    sampler = DistributedSampler(train_set, seed=0)  # ok
    loader = DataLoader(train_set, batch_size=32, sampler=sampler)
    for epoch in range(3):
        loader.sampler.set_epoch(epoch)
        for _batch in loader:
            pass
