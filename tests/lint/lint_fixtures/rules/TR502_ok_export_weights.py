"""Near misses for TR502: the weights exported after training, and the best model kept for evaluation."""

import argparse

import torch
import torch.nn.functional as F
from torch import nn, optim


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--save", default="model.pt", help="path to save the final model")
    parser.add_argument("--save-model", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(1)
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 10))
    optimizer = optim.Adadelta(model.parameters(), lr=1.0)
    best_val_loss = None
    for epoch in range(args.epochs):
        x, y = torch.randn(64, 1, 28, 28), torch.randint(0, 10, (64,))
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        if best_val_loss is None or loss.item() < best_val_loss:
            with open(args.save, "wb") as f:
                torch.save(model, f)  # ok: the best model, for evaluation
            torch.save(model.state_dict(), "best_checkpoint.pt")  # ok: the best weights
            best_val_loss = loss.item()
        torch.save(model.state_dict(), f"weights/epoch_{epoch}.pt")  # ok: weights per epoch, never resumed
    with open(args.save, "rb") as f:
        model = torch.load(f)
    if args.save_model:
        torch.save(model.state_dict(), "model_final.pt")  # ok: the weights, exported after training


if __name__ == "__main__":
    main()
