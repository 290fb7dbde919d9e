"""Near misses for TR502 (and TR501): a program that resumes from a checkpoint holding everything; the
weights-only files it also writes are exports, not what it resumes from."""

import argparse
import random

import numpy as np
import torch
from torch import nn, optim


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--resume", default="", help="checkpoint to resume training from")
    parser.add_argument("--save", default="model.pt")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = nn.Linear(10, 2)
    optimizer = optim.Adam(model.parameters())
    start = 0
    if args.resume:
        ckpt = torch.load(args.resume)
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        start = ckpt["epoch"] + 1
    best = float("inf")
    for epoch in range(start, 10):
        loss = model(torch.randn(4, 10)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        torch.save({"epoch": epoch, "model": model.state_dict(), "optimizer": optimizer.state_dict(),  # ok
                    "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(),
                            "python": random.getstate()}}, "checkpoint.pt")
        if loss.item() < best:
            best = loss.item()
            with open(args.save, "wb") as f:
                torch.save(model, f)  # ok: the best model, kept for evaluation
            torch.save(model.state_dict(), "last_best.pt")  # ok: an export (the checkpoint above resumes)
    torch.save(model.state_dict(), "model_final.pt")  # ok: the weights, exported after training


if __name__ == "__main__":
    main()
