"""A tiny ``transformers.Trainer`` run for the Hugging Face integration tests (CPU, no downloads).

    python tests/scripts/hf_train.py --out DIR [--steps 8] [--save-steps 4] [--resume PATH|true]
        [--callback] [--resume-from PATH] [--seed 0] [--batch-size 2] [--workers 2] [--no-augment]

The dataset's ``__getitem__`` and the data collator draw from torch, NumPy and ``random`` (inside the DataLoader
workers), the model has dropout. ``--callback`` adds ``torchrepro.integrations.transformers.ReproducibleCallback``;
``--resume-from PATH`` resumes through ``callback.resume_from(PATH)``. The last line printed is
``RESULT {"digest": ..., "losses": [...]}``: the digest of every final parameter and the loss of each step; a
failing ``train()`` prints ``ERROR {"type": ..., "message": ...}`` instead and exits 3.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys

import numpy as np
import torch
from torch import nn
from transformers import Trainer, TrainingArguments


class Net(nn.Module):
    """An MLP with dropout that returns ``{"loss": ...}``, as Trainer expects of a model."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 32)
        self.drop = nn.Dropout(0.3)
        self.fc2 = nn.Linear(32, 1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        pred = self.fc2(self.drop(torch.relu(self.fc1(x)))).squeeze(-1)
        return {"loss": nn.functional.mse_loss(pred, y)}


class Noisy(torch.utils.data.Dataset):
    """Fixed points whose ``__getitem__`` adds noise from torch, NumPy and ``random`` (augmentation)."""

    def __init__(self, n: int, augment: bool) -> None:
        g = torch.Generator().manual_seed(1234)
        self.x = torch.randn(n, 8, generator=g)
        self.y = torch.randn(n, generator=g)
        self.augment = augment

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        x = self.x[i].clone()
        if self.augment:
            # how much is drawn depends on the sample, so a replay must load the very samples the run loaded
            x += 0.1 * torch.randn(8 + i % 3)[:8] + float(np.random.normal()) * 0.05 + random.random() * 0.05
        return {"x": x, "y": self.y[i]}


def collate(augment: bool):
    """A data collator that stacks and, with ``augment``, drops features at random (torch RNG)."""

    def fn(samples: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        x = torch.stack([s["x"] for s in samples])
        if augment:
            x = x * (torch.rand(x.shape) > 0.1)
        return {"x": x, "y": torch.stack([s["y"] for s in samples])}

    return fn


def digest(model: nn.Module) -> str:
    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--save-steps", type=int, default=4)
    p.add_argument("--resume", default=None, help="a checkpoint directory, or 'true'")
    p.add_argument("--resume-from", default=None, help="resume through callback.resume_from(PATH)")
    p.add_argument("--callback", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--dataset-len", type=int, default=10)
    p.add_argument("--no-augment", action="store_true")
    p.add_argument("--global-rng-sampler", action="store_true",
                   help="use_seedable_sampler=False: the sampler draws its order from the global torch RNG")
    return p


def build(a: argparse.Namespace) -> tuple[Trainer, str | bool | None]:
    """The Trainer for the options ``a``, and what to pass to ``train(resume_from_checkpoint=...)``."""
    torch.manual_seed(a.seed)
    model = Net()
    args = TrainingArguments(
        output_dir=a.out, max_steps=a.steps, per_device_train_batch_size=a.batch_size,
        gradient_accumulation_steps=a.grad_accum, learning_rate=0.05, save_strategy="steps",
        save_steps=a.save_steps, logging_steps=1, report_to=[], use_cpu=True, dataloader_num_workers=a.workers,
        full_determinism=True, seed=a.seed, disable_tqdm=True,
        accelerator_config={"use_seedable_sampler": not a.global_rng_sampler},
    )
    callbacks = []
    if a.callback:
        from torchrepro.integrations.transformers import ReproducibleCallback

        callbacks.append(ReproducibleCallback())
    trainer = Trainer(model=model, args=args, train_dataset=Noisy(a.dataset_len, not a.no_augment),
                      data_collator=collate(not a.no_augment), callbacks=callbacks)
    resume: str | bool | None = True if a.resume == "true" else a.resume
    if a.resume_from:
        resume = callbacks[0].resume_from(a.resume_from)
    return trainer, resume


def say(line: str) -> None:
    """Print ``line`` in one write: the ranks of torchrun share one stdout, and ``print`` writes the text and its
    newline apart when stdout is unbuffered (PYTHONUNBUFFERED), so two ranks' lines could run into one."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def run(a: argparse.Namespace) -> int:
    """Train as ``a`` says; print RESULT (or ERROR, and return 3)."""
    trainer, resume = build(a)
    try:
        trainer.train(resume_from_checkpoint=resume)
    except Exception as exc:  # the tests read the message
        say("ERROR " + json.dumps({"type": type(exc).__name__, "message": str(exc)}))
        return 3
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    say("RESULT " + json.dumps({"digest": digest(trainer.model), "losses": losses, "step": trainer.state.global_step}))
    return 0


def main() -> int:
    """``run``, then tear the process group down under torchrun: a gloo group left to the interpreter's exit can
    abort the process ("terminate called without an active exception") after the training finished."""
    try:
        return run(parser().parse_args())
    finally:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
