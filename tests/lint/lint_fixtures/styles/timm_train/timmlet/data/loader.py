"""create_loader: transforms, sampler and DataLoader in one call, as train.py and validate.py use them."""

import random
from functools import partial

import numpy as np
import torch
import torch.utils.data

from .distributed_sampler import OrderedDistributedSampler
from .transforms import create_transform


def _worker_init(worker_id, worker_seeding="all"):
    """torch and `random` are seeded by the DataLoader from its base seed; NumPy is seeded here from the same."""
    worker_info = torch.utils.data.get_worker_info()
    assert worker_info.id == worker_id
    if callable(worker_seeding):
        seed = worker_seeding(worker_info)
        random.seed(seed)
        torch.manual_seed(seed)
        np.random.seed(seed % (2**32 - 1))
    elif worker_seeding == "all":
        np.random.seed(worker_info.seed % (2**32 - 1))  # ok: the loader's base seed + worker id, new every epoch


def create_loader(dataset, input_size, batch_size, is_training=False, no_aug=False, num_workers=1,
                  distributed=False, collate_fn=None, pin_memory=False, persistent_workers=True,
                  worker_seeding="all"):
    dataset.transform = create_transform(input_size, is_training=is_training, no_aug=no_aug)

    sampler = None
    if distributed:
        if is_training:
            # the training script calls loader.sampler.set_epoch(epoch) at the start of every epoch
            sampler = torch.utils.data.distributed.DistributedSampler(dataset)  # ok: train.py calls set_epoch
        else:
            # padded, in order: every rank evaluates the same number of samples
            sampler = OrderedDistributedSampler(dataset)

    return torch.utils.data.DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=sampler is None and is_training,
        num_workers=num_workers,
        sampler=sampler,
        collate_fn=collate_fn,
        pin_memory=pin_memory,
        drop_last=is_training,
        worker_init_fn=partial(_worker_init, worker_seeding=worker_seeding),
        persistent_workers=persistent_workers and num_workers > 0,
    )
