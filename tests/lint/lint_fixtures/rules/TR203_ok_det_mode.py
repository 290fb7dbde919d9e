"""Near miss for TR203: deterministic mode enabled at start-up (through a helper)."""

import torch
import torch.nn.functional as F


def make_deterministic():
    torch.use_deterministic_algorithms(True)


def step(x, idx, src, grid):
    out = torch.zeros(10, 8)
    out.index_add_(0, idx, src)  # ok: deterministic mode selects a deterministic kernel
    return out, F.grid_sample(x, grid)  # ok: deterministic mode raises instead of varying silently


def main():
    make_deterministic()
    torch.manual_seed(0)


if __name__ == "__main__":
    main()
