"""TR103: `weights=args.weights` may be None (the option's default), and then the model is built from scratch
before torch is seeded."""

import argparse

import torch
from torchvision import models

parser = argparse.ArgumentParser()
parser.add_argument("--weights", default=None, help="e.g. DEFAULT; none: train from scratch")
parser.add_argument("--seed", type=int, default=0)


def main():
    args = parser.parse_args()
    model = models.resnet50(weights=args.weights)  # expect: TR103
    torch.manual_seed(args.seed)
    print(model(torch.randn(1, 3, 224, 224)))


if __name__ == "__main__":
    main()
