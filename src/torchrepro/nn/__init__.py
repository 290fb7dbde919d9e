"""Deterministic replacements for PyTorch ops and modules whose results vary from run to run.

``torchrepro.nn.functional`` holds the functions (``index_add``, ``scatter_add``, ``index_put``, ``bincount``,
``histc``, ``embedding_bag``, ``conv_transpose2d``, and ``index_select``/``gather`` with a deterministic
backward); this package holds the drop-in modules ``ConvTranspose2d`` and ``EmbeddingBag``. None of them
needs ``torch.use_deterministic_algorithms``. See docs/nn.md.

>>> import torch
>>> import torchrepro.nn as rnn
>>> rnn.EmbeddingBag(5, 2)(torch.tensor([[0, 1]])).shape
torch.Size([1, 2])
"""

from __future__ import annotations

from . import functional
from .modules import ConvTranspose2d, EmbeddingBag

__all__ = ["ConvTranspose2d", "EmbeddingBag", "functional"]
