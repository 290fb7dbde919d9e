"""TR302: worker processes seeded from the global generator, without a worker init function."""

import torch
from torch.utils.data import DataLoader
from torchvision import datasets, transforms


def seed_worker(worker_id):
    pass


def loaders(root, args, given):
    dataset = datasets.ImageFolder(root, transforms.RandomCrop(32, padding=4))
    g = torch.Generator().manual_seed(0)
    a = DataLoader(dataset, batch_size=32, num_workers=4)  # expect: TR302
    b = DataLoader(dataset, batch_size=32, num_workers=args.workers)  # expect: TR302
    c = DataLoader(dataset, batch_size=32, num_workers=0)  # ok: no workers
    d = DataLoader(dataset, batch_size=32, num_workers=4, worker_init_fn=seed_worker)  # ok
    e = DataLoader(dataset, batch_size=32, num_workers=4, generator=g)  # ok: worker seeds come from g
    f = DataLoader(dataset, batch_size=32)  # ok
    h = DataLoader(given, batch_size=32, num_workers=4)  # ok: a dataset the linter cannot see (not reported)
    return a, b, c, d, e, f, h
