"""TR202: cuDNN's deterministic flag switched off."""

import torch
import torch.backends.cudnn as cudnn


def configure(fast):
    torch.backends.cudnn.deterministic = False  # expect: TR202
    cudnn.deterministic = 0  # expect: TR202
    cudnn.deterministic = True  # ok
    cudnn.deterministic = not fast  # ok: not a literal
    with torch.backends.cudnn.flags(enabled=True, deterministic=False):  # expect: TR202
        pass
    with torch.backends.cudnn.flags(enabled=True, deterministic=True):  # ok
        pass
