"""Near miss for TR203 across files: the same project, whose helper picks the CPU: nothing in the program or the
files it imports uses CUDA, so the model's convolution (in another file) is deterministic."""

import torch

from model import Net
from utils import get_device


def main():
    torch.manual_seed(0)
    model = Net().to(get_device())
    return model


if __name__ == "__main__":
    main()
