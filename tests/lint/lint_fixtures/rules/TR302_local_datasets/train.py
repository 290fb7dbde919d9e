"""TR302: the project's own `datasets` package (named like the Hugging Face library, as in detr's
`from datasets import build_dataset`) builds a random transform pipeline, which the training loader runs in
its workers without worker_init_fn or generator."""

import argparse

import torch
from torch.utils.data import DataLoader

from datasets import build_dataset


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("data")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    train_set = build_dataset(args.data, train=True)
    val_set = build_dataset(args.data, train=False)
    train_loader = DataLoader(train_set, batch_size=32, num_workers=args.workers)  # expect: TR302
    val_loader = DataLoader(val_set, batch_size=32, num_workers=args.workers)  # ok: validation transforms draw nothing
    print(len(train_loader), len(val_loader))


if __name__ == "__main__":
    main()
