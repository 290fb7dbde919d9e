"""The project's transformer blocks: a module that happens to share the library's name."""

from torch import nn

SEEDS = []


def set_seed(seed):
    SEEDS.append(seed)  # records the seed, seeds nothing


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.mlp = nn.Linear(width, width)
