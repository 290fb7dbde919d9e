"""TR305: worker_init_fn seeding from the worker id and constants only."""

import random

import numpy as np
import torch
from torch.utils.data import DataLoader

SEED = 1234


def seed_worker_bad(worker_id):
    np.random.seed(SEED + worker_id)  # expect: TR305


def seed_worker_good(worker_id):
    worker_seed = torch.initial_seed() % 2**32
    np.random.seed(worker_seed)  # ok
    random.seed(worker_seed)  # ok


def unused(worker_id):
    np.random.seed(worker_id)  # ok: never passed as worker_init_fn


def loaders(dataset):
    g = torch.Generator().manual_seed(SEED)
    a = DataLoader(dataset, num_workers=2, worker_init_fn=seed_worker_bad, generator=g)
    b = DataLoader(dataset, num_workers=2, worker_init_fn=seed_worker_good, generator=g)
    c = DataLoader(dataset, num_workers=2, worker_init_fn=lambda wid: random.seed(wid), generator=g)  # expect: TR305
    return a, b, c
