"""A small project across files: the seeding and determinism helper lives in a package (reprokit), the
dataset and the model in their own modules."""

import argparse

import torch
from torch.utils.data import DataLoader

from dataset import GraphFolder
from model import GNN
from reprokit.setup import make_reproducible, training_device, worker_init


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("root")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args()

    make_reproducible(args.seed)
    model = GNN(hidden=64).to(training_device())
    data = GraphFolder(args.root, seed=args.seed)
    loader = DataLoader(data, batch_size=16, shuffle=True, num_workers=args.workers, worker_init_fn=worker_init,
                        generator=torch.Generator().manual_seed(args.seed))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for epoch in range(args.epochs):
        for x, src, dst, y in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x, src, dst), y)
            loss.backward()
            optimizer.step()
        torch.save({"epoch": epoch, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "rng": torch.get_rng_state(), "loader_generator": loader.generator.get_state()}, "last.pt")


if __name__ == "__main__":
    main()
