"""Near miss for TR101: a library module (no entry point, no top-level draws) that builds models when called."""

import torch
from torch import nn


def make_mlp(width):
    return nn.Sequential(nn.Linear(width, width), nn.ReLU())  # ok: not a program; its caller seeds


def jitter(x):
    return x + 0.01 * torch.randn_like(x)  # ok
