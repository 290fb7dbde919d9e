"""TR502: checkpoints meant to resume training (they record the epoch, or their file name says checkpoint)
that hold no optimizer state."""

import os

import torch
from torch import nn, optim


def save_checkpoint(state, filename="checkpoint.pth.tar"):
    torch.save(state, filename)


def train(model, loader, epochs, out_dir):
    optimizer = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for epoch in range(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
        torch.save({"epoch": epoch, "model": model.state_dict()}, os.path.join(out_dir, "model.pt"))  # expect: TR502
        torch.save(model.state_dict(), os.path.join(out_dir, "last.ckpt"))  # expect: TR502
        save_checkpoint({"epoch": epoch + 1, "state_dict": model.state_dict()})  # expect: TR502
    torch.save(model.state_dict(), os.path.join(out_dir, "model.pt"))  # ok: the weights, after training


def finetune(encoder, loader, steps, path):
    opt = optim.AdamW(encoder.parameters(), lr=1e-4)
    for step, batch in enumerate(loader):
        opt.zero_grad()
        encoder(batch).mean().backward()
        opt.step()
        if step % 1000 == 0:
            torch.save({"step": step, "encoder": encoder.state_dict(),  # expect: TR502
                        "rng": torch.get_rng_state()}, path)


def warmup(model, loader):
    sgd = optim.SGD(model.parameters(), lr=0.01)
    for x, y in loader:
        sgd.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        sgd.step()
        torch.save(model.state_dict(), "warmup.ckpt")  # ok: plain SGD keeps no state to lose
