"""The errors of :mod:`torchrepro.nn.functional` and the argument checks its ops share (dimensions wrapped, index
dtypes and bounds checked as PyTorch checks them, with PyTorch's exception types)."""

from __future__ import annotations

import operator
from typing import Any

import torch

from .._core.errors import ReproError


class UnsupportedOptionError(ReproError, ValueError):
    """An argument the deterministic alternative does not support (the message says what to use instead)."""


# Arguments the PyTorch op rejects are rejected here with the same built-in exception type (and much the same
# text), so that code catching PyTorch's exceptions catches these too.
class ArgumentError(ReproError, RuntimeError):
    """A shape, dtype or value that the PyTorch op rejects with a RuntimeError."""


class ArgumentIndexError(ReproError, IndexError):
    """A dimension or index that the PyTorch op rejects with an IndexError."""


class ArgumentValueError(ReproError, ValueError):
    """An argument that the PyTorch op rejects with a ValueError."""


class UnsupportedDtypeError(ReproError, NotImplementedError):
    """A dtype that the PyTorch op has no kernel for (NotImplementedError, as PyTorch raises)."""


def _scalar(t: torch.Tensor) -> str:
    """PyTorch's name of a tensor's scalar type, as its messages print it: Float, Double, Long, ..."""
    return t.type().rsplit(".", 1)[-1].removesuffix("Tensor")


def _wrap_dim(dim: Any, ndim: int, what: str) -> int:
    """``dim`` wrapped into [0, ndim) as PyTorch wraps it (a 0-d tensor counts as 1-D); IndexError outside."""
    dim = operator.index(dim)  # a float: TypeError, as PyTorch
    n = max(ndim, 1)
    if not -n <= dim < n:
        raise ArgumentIndexError(f"{what}: Dimension out of range (expected to be in range of [{-n}, {n - 1}], but "
                                 f"got {dim})")
    return dim % n


def _size_at(t: torch.Tensor, d: int, what: str) -> int:
    """``t.size(d)``, 1 for a 0-d tensor (PyTorch's ensure_nonempty_size)."""
    return 1 if t.dim() == 0 else t.shape[_wrap_dim(d, t.dim(), what)]


def _check_index(index: torch.Tensor, what: str) -> None:
    if index.dtype not in (torch.int64, torch.int32):
        raise ArgumentError(f"{what}: Expected dtype int32/int64 for index but got: {_scalar(index)}; convert it "
                            "with .long()")


def _check_bounds(index: torch.Tensor, size: int, dim: int, *, vector: bool, what: str) -> None:
    """Every value of ``index`` in [0, size): else PyTorch's CPU error (IndexError for a 1-D target)."""
    if not index.numel():
        return
    low, high = (int(v) for v in torch.aminmax(index))
    if low >= 0 and high < size:
        return
    value = int(index[(index < 0) | (index >= size)].reshape(-1)[0])
    if vector:
        raise ArgumentIndexError(f"{what}: index out of range in self: got {value} for a dimension of size {size}")
    raise ArgumentError(f"{what}: index {value} is out of bounds for dimension {dim} with size {size}")

