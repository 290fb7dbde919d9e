import torch

from loaders import make_loader


def main():
    loader = make_loader(torch.arange(100))
    for _epoch in range(10):
        for _batch in loader:
            pass


if __name__ == "__main__":
    main()
