"""A library helper that derives a loader seed from numpy's global generator, which the program seeds first."""

import numpy as np
import torch


def make_generator():
    g = torch.Generator()
    g.manual_seed(int(np.random.randint(2**31)))  # ok: train.py seeds numpy before calling this
    return g
