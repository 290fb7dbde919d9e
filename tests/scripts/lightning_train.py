"""A small Lightning training run for tests/integrations/test_lightning.py; prints a digest of its final weights.

Dataset with per-sample augmentation drawn in the DataLoader workers from torch, NumPy and ``random``; dropout;
Adam with a per-step StepLR; ``shuffle=True``; batches of 4 from 12 samples (``--samples 24`` under two ranks): 3
batches an epoch per rank, so step 4 is in the middle of the second epoch and step 8 in the middle of the third.

    python lightning_train.py --steps 8 --save-at 4 --ckpt a.ckpt --callback     # straight, saving at step 4
    python lightning_train.py --steps 8 --resume a.ckpt --callback               # resumed from step 4
    python lightning_train.py --steps 4 --save-end b.ckpt --callback             # 4 steps, save after fit
    python lightning_train.py --steps 8 --callback --devices 2                   # DDP, gloo on CPU
    python lightning_train.py --samples 24 --second 8 --callback                 # two train loaders (6 and 2 batches)
    torchrun --nproc-per-node 2 lightning_train.py --steps 8 --callback          # the same under torchrun

Prints ``LOSSES rank=R step:loss ...`` (this rank's loss per step, as ``float.hex``) and ``DIGEST rank=R
<sha256 of every parameter>`` on every rank; validation (one batch) runs every 4 training batches (counted
across epochs).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import sys

import numpy as np
import torch

try:
    import lightning.pytorch as pl
except ImportError:  # the older namespace
    import pytorch_lightning as pl


class Augmented(torch.utils.data.Dataset):
    """Fixed features plus noise drawn from all three global RNGs of whichever process loads the sample."""

    def __init__(self, n: int, seed: int = 1234) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 8, generator=g)
        self.y = torch.randn(n, 1, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        noise = 0.1 * torch.randn(8) + float(np.random.rand()) + random.random()
        return self.x[i] + noise, self.y[i]


class Net(pl.LightningModule):
    def __init__(self, batch_size: int, workers: int, samples: int, second: int = 0, mode: str = "max_size_cycle",
                 data_seed: int = 1234) -> None:
        super().__init__()
        self.batch_size, self.workers, self.samples = batch_size, workers, samples
        self.second, self.mode, self.data_seed = second, mode, data_seed
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(0.3),
                                       torch.nn.Linear(16, 1))
        self.losses: list[str] = []  # "step:loss as float.hex()" of this rank, for the steps this process ran

    def training_step(self, batch, batch_idx):
        pairs = [batch] if isinstance(batch, (list, tuple)) else [b for b in batch.values() if b is not None]
        loss = sum(torch.nn.functional.mse_loss(self.net(x), y) for x, y in pairs)
        self.losses.append(f"{self.global_step + 1}:{loss.item().hex()}")
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        opt = torch.optim.Adam(self.parameters(), lr=1e-2)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def train_dataloader(self):
        def loader(n: int, seed: int):
            return torch.utils.data.DataLoader(Augmented(n, seed), batch_size=self.batch_size, shuffle=True,
                                               num_workers=self.workers)

        first = loader(self.samples, self.data_seed)
        if not self.second:
            return first
        loaders = {"a": first, "b": loader(self.second, self.data_seed + 1)}
        if self.mode == "max_size_cycle":  # Lightning's default for a dict of loaders
            return loaders
        return pl.utilities.CombinedLoader(loaders, self.mode)

    def val_dataloader(self):  # runs after step 4 (the save) in the uninterrupted run; no generator of its own
        return torch.utils.data.DataLoader(Augmented(8), batch_size=4)


class SaveAt(pl.Callback):
    """``trainer.save_checkpoint(path)`` at the end of training step ``step`` (on every rank, as Lightning asks);
    ``hook="on_train_batch_start"``: at the start of the next one (in the middle of a training step)."""

    def __init__(self, step: int, path: str, hook: str = "on_train_batch_end") -> None:
        self.step, self.path, self.hook = step, path, hook

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.hook == "on_train_batch_start" and trainer.global_step == self.step:
            trainer.save_checkpoint(self.path)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.hook == "on_train_batch_end" and trainer.global_step == self.step:
            trainer.save_checkpoint(self.path)


def digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main(argv: list[str] | None = None) -> Net:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--save-at", type=int, default=0, help="save at the end of this step (with --ckpt)")
    ap.add_argument("--ckpt", default="", help="where --save-at saves")
    ap.add_argument("--save-hook", default="on_train_batch_end", choices=["on_train_batch_end", "on_train_batch_start"])
    ap.add_argument("--save-end", default="", help="save here after fit returns")
    ap.add_argument("--resume", default="", help="fit(ckpt_path=...)")
    ap.add_argument("--callback", action="store_true", help="add torchrepro's ReproducibleCallback")
    ap.add_argument("--callback-seed", type=int, default=None)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--samples", type=int, default=12)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--devices", type=int, default=1, help="ranks of DDP on CPU (torchrun: its WORLD_SIZE)")
    ap.add_argument("--sanity", type=int, default=0, help="Lightning's num_sanity_val_steps (validation before fit)")
    ap.add_argument("--accumulate", type=int, default=1, help="Lightning's accumulate_grad_batches")
    ap.add_argument("--second", type=int, default=0, help="samples of a second train loader (a dict of two loaders)")
    ap.add_argument("--mode", default="max_size_cycle", help="the CombinedLoader mode of the two train loaders")
    ap.add_argument("--data-seed", type=int, default=1234, help="seed of the training data's features and targets")
    args = ap.parse_args(argv)

    pl.seed_everything(args.seed, workers=True, verbose=False)
    callbacks = []
    if args.callback:
        from torchrepro.integrations.lightning import ReproducibleCallback

        callbacks.append(ReproducibleCallback(seed=args.seed if args.callback_seed is None else args.callback_seed))
    if args.save_at:
        callbacks.append(SaveAt(args.save_at, args.ckpt, args.save_hook))
    ranks = int(os.environ.get("TORCHELASTIC_RUN_ID") and os.environ.get("WORLD_SIZE") or args.devices)
    trainer = pl.Trainer(
        max_steps=args.steps, accelerator="cpu", devices=ranks, strategy="ddp" if ranks > 1 else "auto",
        deterministic=True, callbacks=callbacks, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=args.sanity,
        accumulate_grad_batches=args.accumulate,
        val_check_interval=4, check_val_every_n_epoch=None, limit_val_batches=1,
    )
    model = Net(args.batch_size, args.workers, args.samples, args.second, args.mode, args.data_seed)
    trainer.fit(model, ckpt_path=args.resume or None)
    if args.save_end:
        trainer.save_checkpoint(args.save_end)
    # one write per line: the ranks share stdout, and print() writes the newline apart when stdout is unbuffered
    sys.stdout.write(f"LOSSES rank={trainer.global_rank} {' '.join(model.losses)}\n")
    sys.stdout.write(f"DIGEST rank={trainer.global_rank} {digest(model)}\n")
    sys.stdout.flush()
    return model


if __name__ == "__main__":
    main()
