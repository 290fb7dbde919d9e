"""TR205: CUDA_LAUNCH_BLOCKING=1 used as if it made CUDA deterministic."""

import os

import torch


def set_deterministic(seed):
    torch.manual_seed(seed)
    os.environ["CUDA_LAUNCH_BLOCKING"] = "1"  # expect: TR205


def make_reproducible():
    torch.use_deterministic_algorithms(True)
    os.environ.setdefault("CUDA_LAUNCH_BLOCKING", "1")  # expect: TR205
    os.environ["CUDA_LAUNCH_BLOCKING"] = "0"  # ok: switched off


def debug_cuda_errors():
    os.environ["CUDA_LAUNCH_BLOCKING"] = "1"  # ok: a debugging helper that sets nothing about determinism
