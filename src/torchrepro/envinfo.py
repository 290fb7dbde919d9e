"""What of the environment matters for numerics: versions, devices, threads, flags (layer L2)."""

from __future__ import annotations

import os
import platform
import sys
from typing import Any

import torch

from ._version import __version__
from .determinism import current_config

ENV_VARS = ("PYTHONHASHSEED", "TORCHREPRO_SEED", "CUBLAS_WORKSPACE_CONFIG", "OMP_NUM_THREADS",
            "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "NVIDIA_TF32_OVERRIDE")


def device_kind() -> str:
    """'cuda', 'mps', 'xpu' or 'cpu': the accelerator a default script would use."""
    if torch.cuda.is_available():
        return "cuda"
    for name in ("xpu", "mps"):
        mod = getattr(torch, name, None)
        if mod is not None and mod.is_available():
            return name
    return "cpu"


def environment_summary() -> dict[str, Any]:
    """A JSON-able summary of the environment facts that change numerics."""
    cuda: dict[str, Any] = {"available": torch.cuda.is_available(), "version": torch.version.cuda}
    if torch.cuda.is_available():
        cuda["devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        cuda["cudnn"] = torch.backends.cudnn.version()
    return {
        "torchrepro": __version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "machine": platform.machine(),
        "torch": torch.__version__,
        "device_kind": device_kind(),
        "cuda": cuda,
        "num_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "determinism": current_config().as_dict(),
        "matmul_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
        "cudnn_tf32": bool(torch.backends.cudnn.allow_tf32),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "env": {k: os.environ.get(k) for k in ENV_VARS},
    }
