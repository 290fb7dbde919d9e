"""Seeding, checkpoints and meters for train.py."""

import glob
import operator
import os
import random
import shutil

import numpy as np
import torch


def random_seed(seed=42, rank=0):
    """Seed every library, differently on every rank (so that augmentations differ between ranks)."""
    torch.manual_seed(seed + rank)
    np.random.seed(seed + rank)
    random.seed(seed + rank)


def unwrap_model(model):
    return model.module if hasattr(model, "module") else model


class AverageMeter:
    def __init__(self):
        self.val = self.avg = self.sum = self.count = 0

    def update(self, val, n=1):
        self.val = val
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count


def accuracy(output, target, topk=(1,)):
    maxk = min(max(topk), output.size(1))
    _, pred = output.topk(maxk, 1, True, True)
    correct = pred.t().eq(target.reshape(1, -1).expand_as(pred.t()))
    return [correct[:min(k, maxk)].reshape(-1).float().sum(0) * 100.0 / target.size(0) for k in topk]


def resume_checkpoint(model, checkpoint_path, optimizer=None):
    """Load a checkpoint written by CheckpointSaver; the epoch to start from."""
    checkpoint = torch.load(checkpoint_path, map_location="cpu", weights_only=False)
    unwrap_model(model).load_state_dict(checkpoint["state_dict"])
    if optimizer is not None and "optimizer" in checkpoint:
        optimizer.load_state_dict(checkpoint["optimizer"])
    return checkpoint.get("epoch", -1) + 1


class CheckpointSaver:
    """Keeps the last checkpoint and the best few (by the eval metric) in checkpoint_dir."""

    def __init__(self, model, optimizer, args=None, amp_scaler=None, checkpoint_dir="", decreasing=False,
                 max_history=10):
        self.model = model
        self.optimizer = optimizer
        self.args = args
        self.amp_scaler = amp_scaler
        self.checkpoint_dir = checkpoint_dir
        self.checkpoint_files = []  # (path, metric), best first
        self.best_metric = None
        self.best_epoch = None
        self.cmp = operator.lt if decreasing else operator.gt
        self.max_history = max_history

    def save_checkpoint(self, epoch, metric=None):
        last_save_path = os.path.join(self.checkpoint_dir, "last.pth.tar")
        self._save(last_save_path, epoch, metric)
        worst = self.checkpoint_files[-1] if self.checkpoint_files else None
        if len(self.checkpoint_files) < self.max_history or metric is None or self.cmp(metric, worst[1]):
            if len(self.checkpoint_files) >= self.max_history:
                os.remove(self.checkpoint_files.pop()[0])
            save_path = os.path.join(self.checkpoint_dir, f"checkpoint-{epoch}.pth.tar")
            shutil.copyfile(last_save_path, save_path)
            self.checkpoint_files.append((save_path, metric))
            self.checkpoint_files.sort(key=lambda x: x[1], reverse=not self.cmp(1, 0))
            if metric is not None and (self.best_metric is None or self.cmp(metric, self.best_metric)):
                self.best_epoch, self.best_metric = epoch, metric
                shutil.copyfile(last_save_path, os.path.join(self.checkpoint_dir, "model_best.pth.tar"))
        return self.best_metric, self.best_epoch

    def _save(self, save_path, epoch, metric=None):
        save_state = {  # expect[ckpt]: TR501
            "epoch": epoch,
            "arch": type(self.model).__name__.lower(),
            "state_dict": unwrap_model(self.model).state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "version": 2,
        }
        if self.args is not None:
            save_state["arch"] = self.args.model
            save_state["args"] = self.args
        if self.amp_scaler is not None:
            save_state["amp_scaler"] = self.amp_scaler.state_dict()
        if metric is not None:
            save_state["metric"] = metric
        torch.save(save_state, save_path)  # expect[ckpt]: TR501

    def find_recovery(self):
        files = sorted(glob.glob(os.path.join(self.checkpoint_dir, "recovery-*.pth.tar")))  # ok: sorted
        return files[0] if files else ""
