"""TR103: the project's own `datasets` package (named like the Hugging Face library) shuffles the file list
before `random` is seeded. `transformers` in nets/build.py is the library, although nets/ has a module of
that name: nets/ is a package, and Python's imports are absolute."""

import argparse
import random

import torch

from datasets import split_files
from nets.build import build_model


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("data")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    train_files, val_files = split_files(args.data)  # expect: TR103
    random.seed(args.seed)
    model = build_model(args.seed)  # ok: transformers.set_seed seeds torch before the model is built
    torch.manual_seed(args.seed + 1)
    print(len(train_files), len(val_files), model(torch.randn(4, 8)))


if __name__ == "__main__":
    main()
