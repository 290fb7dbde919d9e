"""TR201: cuDNN benchmarking switched on."""

import lightning as L
import torch
from torch.backends import cudnn


def configure(args):
    torch.backends.cudnn.benchmark = True  # expect: TR201
    cudnn.benchmark = True  # expect: TR201
    cudnn.benchmark = False  # ok
    torch.backends.cudnn.benchmark = args.benchmark  # ok: not a literal; the user decides
    trainer = L.Trainer(benchmark=True)  # expect: TR201
    other = L.Trainer(deterministic=True)  # ok
    with torch.backends.cudnn.flags(enabled=True, benchmark=True):  # expect: TR201
        pass
    return trainer, other
