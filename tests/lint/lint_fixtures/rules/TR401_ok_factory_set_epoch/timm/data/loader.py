"""A loader factory: the DistributedSampler goes back to the caller inside the loader, and the caller sets its
epoch (loader.sampler.set_epoch)."""

import torch
from torch.utils.data import DataLoader


def create_loader(dataset, batch_size, is_training=False, distributed=False, num_workers=4):
    sampler = None
    if distributed:
        if is_training:
            sampler = torch.utils.data.distributed.DistributedSampler(dataset)  # ok: returned in the loader
        else:
            sampler = torch.utils.data.distributed.DistributedSampler(dataset, shuffle=False)  # ok
    loader_args = dict(num_workers=num_workers, worker_init_fn=None)
    loader_args.update(batch_size=batch_size, sampler=sampler, shuffle=sampler is None and is_training)
    loader = DataLoader(dataset, **loader_args)
    return loader
