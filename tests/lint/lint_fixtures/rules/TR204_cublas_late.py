"""TR204: CUBLAS_WORKSPACE_CONFIG set after CUDA was first used."""

import os

import torch
from torch import nn


def enable_determinism():
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"  # expect: TR204
    torch.use_deterministic_algorithms(True)


def main():
    torch.manual_seed(0)
    model = nn.Linear(4, 4).cuda()
    enable_determinism()
    return model


if __name__ == "__main__":
    main()
