"""Builds the model. `transformers` is the Hugging Face library here, not nets/transformers.py."""

from torch import nn
from transformers import set_seed


def build_model(seed):
    set_seed(seed)
    return nn.Linear(8, 2)
