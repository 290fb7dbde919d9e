"""Module-level training setups for verify_resume (a fresh process must be able to import them)."""

from __future__ import annotations

import random

import numpy as np
import torch
from torch import nn

import torchrepro


class AugmentedPoints(torch.utils.data.Dataset):
    """Fixed points plus random augmentation from random, NumPy and torch."""

    def __init__(self, n: int = 64) -> None:
        g = torch.Generator().manual_seed(123)
        self.x = torch.randn(n, 8, generator=g)
        self.y = (self.x[:, 0] > 0).long()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        noise = torch.randn(8) * 0.1 + random.random() * 0.01 + float(np.random.rand()) * 0.01
        return self.x[i] + noise, self.y[i]


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 2))


def build() -> dict:
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return {
        "model": model,
        "optimizer": opt,
        "scheduler": torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5),
        "loader": torchrepro.ResumableLoader(AugmentedPoints(), batch_size=8, shuffle=True, num_workers=2, seed=0),
    }


def step(state: dict) -> torch.Tensor:
    x, y = state["loader"].next_batch()
    state["optimizer"].zero_grad()
    loss = nn.functional.cross_entropy(state["model"](x), y)
    loss.backward()
    state["optimizer"].step()
    state["scheduler"].step()
    return loss


def build_amp() -> dict:
    state = build()
    state["scaler"] = torch.amp.GradScaler("cpu", init_scale=2.0**8)
    return state


def step_amp(state: dict) -> torch.Tensor:
    x, y = state["loader"].next_batch()
    opt, scaler = state["optimizer"], state["scaler"]
    opt.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = nn.functional.cross_entropy(state["model"](x), y)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    state["scheduler"].step()
    return loss


def plain_save(path: str, state: dict, step: int) -> None:
    """What many scripts do: model + optimizer only, no RNG state, no data position."""
    torch.save({"model": state["model"].state_dict(), "optimizer": state["optimizer"].state_dict()}, path)


def plain_load(path: str, state: dict) -> None:
    data = torch.load(path, weights_only=True)
    state["model"].load_state_dict(data["model"])
    state["optimizer"].load_state_dict(data["optimizer"])


# The setups of the tests that are not about the optimizer: their parameters are updated by hand (no torch.optim),
# so the fresh processes verify_resume starts do not import torch._dynamo (about 1 CPU s each, which torch.optim
# costs on its first optimizer).


def _sgd(model: nn.Module, loss: torch.Tensor) -> None:
    """One SGD step by hand: ``p -= 0.1 * grad``."""
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(p.grad, alpha=-0.1)
            p.grad = None


def build_tiny() -> dict:
    return {"model": nn.Linear(3, 1)}


def step_tiny(state: dict) -> torch.Tensor:
    loss = state["model"](torch.randn(4, 3)).pow(2).mean()
    _sgd(state["model"], loss)
    return loss


def step_fails(state: dict) -> torch.Tensor:
    raise RuntimeError("the training step broke")


def step_hangs(state: dict) -> torch.Tensor:
    """Write this process's pid where TORCHREPRO_TEST_PID_FILE says, then hang."""
    import os
    import time

    with open(os.environ["TORCHREPRO_TEST_PID_FILE"], "w") as f:
        f.write(str(os.getpid()))
    time.sleep(600)
    return torch.zeros(())


class _Points(torch.utils.data.Dataset):
    """64 fixed points: 8 batches of 8 an epoch."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(123)
        self.x = torch.randn(64, 8, generator=g)
        self.y = (self.x[:, 0] > 0).long()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


def build_points() -> dict:
    return {"model": nn.Linear(8, 2),
            "loader": torchrepro.ResumableLoader(_Points(), batch_size=8, shuffle=True, seed=0)}


def step_iter(state: dict) -> torch.Tensor:
    """A newcomer's step: a fresh iter() per step, which ends with the epoch (8 batches of 8 of 64 points)."""
    x, y = next(iter(state["loader"]))
    loss = nn.functional.cross_entropy(state["model"](x), y)
    _sgd(state["model"], loss)
    return loss


def step_points(state: dict) -> torch.Tensor:
    x, y = state["loader"].next_batch()
    loss = nn.functional.cross_entropy(state["model"](x), y)
    _sgd(state["model"], loss)
    return loss


def build_with_iterator() -> dict:
    state = build_points()
    state["batches"] = iter(state["loader"])
    return state


def build_not_a_dict():
    model = nn.Linear(3, 1)
    return model, "not a dict"
