import os
import random

import numpy as np
import torch

from .workers import worker_init  # noqa: F401 (re-exported)


def make_reproducible(value):
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    random.seed(value)
    np.random.seed(value)
    torch.manual_seed(value)
    torch.use_deterministic_algorithms(True)


def training_device():
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")
