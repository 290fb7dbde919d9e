"""The one reduction every alternative is built on: add rows of ``src`` into rows of ``out`` in index order.

``row_sum(out, index, src)`` returns ``r`` with ``r[m] = (((out[m] + src[i1]) + src[i2]) + ...)`` for the
positions ``i1 < i2 < ...`` where ``index == m`` -- a sequential sum in the order of ``index``, the same order
on every run and every thread count. Two implementations compute exactly that order:

* ``serial``: ``Tensor.index_add_`` on CPU, which walks ``index`` from first to last for every output row
  (threads, if any, split the columns, never the index). Checked by the tests: bitwise equal to ``sorted``
  and to itself across processes and thread counts.
* ``sorted``: a stable sort of ``index`` (each output row's own value placed first), then
  ``torch.segment_reduce`` -- each segment summed front to back by one thread or block, no atomic adds.
  Used on every device other than CPU (CUDA, MPS, XPU, ...).

>>> import torch
>>> row_sum(torch.zeros(2, 1), torch.tensor([1, 0, 1]), torch.ones(3, 1)).flatten().tolist()
[1.0, 2.0]
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

__all__ = ["force_sorted", "row_sum", "use_sorted"]

_FORCE_SORTED = [False]


def _serial(out: torch.Tensor, index: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    return out.clone().index_add_(0, index, src)


def _sorted(out: torch.Tensor, index: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    rows = out.shape[0]
    if index.numel() and (int(index.min()) < 0 or int(index.max()) >= rows):
        raise IndexError(f"index out of range: values must lie in [0, {rows - 1}], got "
                         f"[{int(index.min())}, {int(index.max())}]")
    if rows == 0:
        return out.clone()
    keys = torch.cat([torch.arange(rows, device=index.device), index])
    order = torch.sort(keys, stable=True).indices
    values = torch.cat([out, src.to(out.dtype)]).index_select(0, order)
    lengths = torch.bincount(index, minlength=rows) + 1  # every segment starts with out's own row
    # -0.0 is the exact identity of IEEE addition (-0.0 + x == x, signed zeros included), unlike 0.0
    return torch.segment_reduce(values, "sum", lengths=lengths, axis=0, initial=-0.0)


# Device kind -> implementation; devices not listed use the sort-based one (no atomics anywhere).
_BY_DEVICE: dict[str, Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]] = {"cpu": _serial}


def use_sorted(device: torch.device) -> bool:
    """True where the sort-based implementation runs: every device but CPU, or anywhere under force_sorted."""
    return _FORCE_SORTED[0] or device.type not in _BY_DEVICE


def row_sum(out: torch.Tensor, index: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """``out`` (M, D) plus the rows of ``src`` (N, D) added at rows ``index`` (N,), in index order (new tensor)."""
    if out.dim() != 2 or src.dim() != 2 or index.dim() != 1:
        raise ValueError(f"row_sum expects out (M, D), index (N,), src (N, D); got {tuple(out.shape)}, "
                         f"{tuple(index.shape)}, {tuple(src.shape)}")
    index = index.to(torch.int64)
    if not (out.dtype.is_floating_point or out.dtype.is_complex):
        return _serial(out, index, src.to(out.dtype))  # integer sums are exact in any order, on any device
    impl = _sorted if use_sorted(out.device) else _BY_DEVICE[out.device.type]
    if out.shape[1] == 1 and impl is _serial:  # the 1-D kernel is a plain loop, much faster than row by row
        return _serial(out.view(-1), index, src.to(out.dtype).reshape(-1)).view(-1, 1)
    return impl(out, index, src.to(out.dtype))


@contextmanager
def force_sorted(enabled: bool = True) -> Iterator[None]:
    """Use the sort-based implementation on every device (tests compare it with the CPU one bitwise)."""
    before = _FORCE_SORTED[0]
    _FORCE_SORTED[0] = enabled
    try:
        yield
    finally:
        _FORCE_SORTED[0] = before
