"""One SGD update by hand, for the test scripts whose optimizer is not what a test is about.

torch.optim's first optimizer imports torch._dynamo (``Optimizer.add_param_group`` is wrapped in
``torch._disable_dynamo``): about 1 CPU s in every process that builds one. Without an optimizer, torchrepro counts
each ``backward()`` as a step. A script imports it as ``from handstep import sgd_step`` (its folder is on sys.path).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


@torch.no_grad()
def sgd_step(params: Iterable[torch.Tensor], lr: float = 0.1) -> None:
    """``p -= lr * p.grad`` for every parameter with a gradient, then drop the gradients (``set_to_none``)."""
    for p in params:
        if p.grad is not None:
            p.add_(p.grad, alpha=-lr)
            p.grad = None
