"""TR203 across files: the model is in one module, the choice of device in a helper module; the program that
imports both runs the model on CUDA when there is a GPU."""

import torch

from model import Net
from utils import get_device


def main():
    torch.manual_seed(0)
    model = Net().to(get_device())
    return model


if __name__ == "__main__":
    main()
