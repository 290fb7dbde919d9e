"""TR301: data order drawn from torch's global generator."""

import torch
from torch.utils.data import DataLoader, RandomSampler, random_split


def loaders(dataset, sampler, kwargs, seed):
    g = torch.Generator().manual_seed(seed)
    a = DataLoader(dataset, batch_size=32, shuffle=True)  # expect: TR301
    b = DataLoader(dataset, 32, True)  # expect: TR301
    c = DataLoader(dataset, batch_size=32, shuffle=True, generator=g)  # ok
    d = DataLoader(dataset, batch_size=32)  # ok: no shuffling
    e = DataLoader(dataset, batch_size=32, shuffle=(sampler is None), sampler=sampler)  # ok: not a literal
    f = DataLoader(dataset, **kwargs)  # ok: the arguments are not visible
    train, val = random_split(dataset, [0.8, 0.2])  # expect: TR301
    train, val = random_split(dataset, [0.8, 0.2], generator=g)  # ok
    s1 = RandomSampler(dataset)  # expect: TR301
    s2 = RandomSampler(dataset, generator=g)  # ok
    return a, b, c, d, e, f, train, val, s1, s2
