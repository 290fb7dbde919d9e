"""Metrics that a training script reports to torchrepro: ``torchrepro.log_metric(name, value)``.

Under ``torchrepro run --record``, ``check`` and ``variance`` (and inside :func:`torchrepro.watch`), each call writes
one ``metric`` event into the run's ``trace.jsonl``: the name, the exact value (``float.hex``), the step count so
far and the time. ``torchrepro variance --metric NAME`` reads the last value of ``NAME`` of each run. Without an
installed recorder (a plain ``python train.py``) the call does nothing, so scripts need no ``if``.

>>> import torchrepro
>>> torchrepro.log_metric("val_acc", 0.75)
0.75
"""

from __future__ import annotations

import numbers
from typing import Any

import torch

from .recorder import current_recorder


def _as_float(name: str, value: Any) -> float:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise TypeError(f"log_metric({name!r}, ...): the value is a tensor of shape {tuple(value.shape)}; "
                            "pass one number (e.g. tensor.mean().item()).")
        if value.is_complex():
            raise TypeError(f"log_metric({name!r}, ...): the value is a complex tensor; pass a real number.")
        if value.dtype == torch.bool:  # as for a Python bool: a truth value is not a measurement
            raise TypeError(f"log_metric({name!r}, ...): the value is a bool tensor; pass a number (e.g. "
                            "tensor.float().mean().item() for a fraction).")
        return float(value.detach().reshape(()).item())
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"log_metric({name!r}, ...): the value must be a real number or a one-element tensor, "
                        f"got {value!r} of type {type(value).__name__}.")
    return float(value)


def log_metric(name: str, value: float | torch.Tensor) -> float:
    """Report ``value`` (a number or one-element tensor) as metric ``name``; return it as a float.

    NaN and ±Inf are kept as they are (``torchrepro variance`` then says which run produced them). A bool (or bool
    tensor) raises ``TypeError``: log the number it stands for (``float(correct)``, a fraction).
    """
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"log_metric: the name must be a non-empty string, got {name!r}.")
    number = _as_float(name, value)
    recorder = current_recorder()
    if recorder is not None:
        recorder.log_metric(name, number)
    return number
