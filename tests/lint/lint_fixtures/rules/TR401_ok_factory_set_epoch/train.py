import argparse

import torch

from timm.data import create_loader


def _set_loader_epoch(loader, epoch):
    if hasattr(loader.sampler, "set_epoch"):
        loader.sampler.set_epoch(epoch)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--distributed", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    loader_train = create_loader(torch.arange(100), 8, is_training=True, distributed=args.distributed)
    for epoch in range(10):
        if args.distributed:
            _set_loader_epoch(loader_train, epoch)
        for _batch in loader_train:
            pass


if __name__ == "__main__":
    main()
