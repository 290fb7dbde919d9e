import torch
from torch import nn


def train_worker(rank):  # ok: reported where it is started (train.py), the program that sets the mode
    torch.manual_seed(rank)
    model = nn.Conv2d(3, 8, 3).to(f"cuda:{rank}")
    return model
