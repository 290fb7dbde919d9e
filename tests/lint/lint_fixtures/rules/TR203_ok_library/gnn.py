"""A library module with a scatter-add; the program that imports it (train.py) enables deterministic mode."""

import torch


def scatter_sum(messages, index, num_nodes):
    out = torch.zeros(num_nodes, messages.shape[1])
    return out.index_add_(0, index, messages)  # ok: train.py enables deterministic mode
