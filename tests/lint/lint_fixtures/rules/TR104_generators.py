"""TR104: generator objects without a seed."""

import random

import numpy as np
import torch

rng = np.random.default_rng()  # expect: TR104
rng_none = np.random.default_rng(None)  # expect: TR104
rng_ok = np.random.default_rng(1234)  # ok
legacy = np.random.RandomState()  # expect: TR104
py = random.Random()  # expect: TR104
py_ok = random.Random(7)  # ok
bits = np.random.Generator(np.random.PCG64())  # expect: TR104
entropy = np.random.SeedSequence()  # expect: TR104
g = torch.Generator()  # expect: TR104
g_later = torch.Generator()  # ok: seeded on the next line
g_later.manual_seed(0)
g_chain = torch.Generator().manual_seed(1)  # ok


class Augment:
    def __init__(self):
        self.gen = torch.Generator()  # ok: seeded in reset()

    def reset(self, epoch):
        self.gen.manual_seed(epoch)


def loader_generator():
    return torch.Generator(device="cpu")  # ok: returned; the caller may seed it


def loader(dataset):
    return torch.utils.data.DataLoader(dataset, shuffle=True, generator=torch.Generator())  # expect: TR104
