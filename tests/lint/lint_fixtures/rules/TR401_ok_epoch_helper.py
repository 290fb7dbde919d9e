"""Near miss for TR401: the epoch is set by a helper the linter cannot see, whose name says so."""

import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

from trainkit import set_loader_epoch


def main(train_set):
    dist.init_process_group("nccl")
    sampler = DistributedSampler(train_set, seed=0)  # ok: set_loader_epoch(loader, epoch)
    loader = DataLoader(train_set, batch_size=32, sampler=sampler)
    for epoch in range(3):
        set_loader_epoch(loader, epoch)
        for _batch in loader:
            pass


if __name__ == "__main__":
    main(range(10))
