import torch
import torchrepro

from gnn import scatter_sum


def main():
    torchrepro.seed_everything(0)
    with torchrepro.deterministic():
        print(scatter_sum(torch.ones(4, 2), torch.tensor([0, 1, 1, 0]), 2))


if __name__ == "__main__":
    main()
