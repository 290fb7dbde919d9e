"""TR501: checkpoints that cannot resume a run exactly."""

import random

import numpy as np
import torch


def save_checkpoint(state, is_best, filename="checkpoint.pth.tar"):
    torch.save(state, filename)


def save(model, optimizer, scheduler, epoch, step, path, fabric, base):
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)  # expect: TR501
    torch.save({  # expect: TR501
        "epoch": epoch,
        "model_state_dict": model.state_dict(),
        "optimizer_state_dict": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
    }, path)
    torch.save({  # ok: RNG state and position are saved
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "epoch": epoch,
        "torch_rng": torch.get_rng_state(),
        "numpy_rng": np.random.get_state(),
        "python_rng": random.getstate(),
    }, path)
    torch.save(model.state_dict(), "weights.pt")  # ok: weights only, not a resumable checkpoint
    state = {"model": model.state_dict(), "optim": optimizer.state_dict()}
    state["step"] = step
    torch.save(state, path)  # expect: TR501
    save_checkpoint({"epoch": epoch + 1, "state_dict": model.state_dict(), "optimizer": optimizer.state_dict()},  # expect: TR501
                    False)
    fabric.save(path, {"model": model, "optimizer": optimizer, "step": step})  # expect: TR501
    torch.save({**base, "model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)  # ok: contents unknown
