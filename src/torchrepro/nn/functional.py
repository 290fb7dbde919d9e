"""Deterministic versions of PyTorch ops whose kernels add floating-point numbers in a varying order.

Every function here gives the same bits on every run, with any number of threads, without
``torch.use_deterministic_algorithms``. Sums are formed in index order (see ``_rowsum``); gradients use
gathers (deterministic everywhere) or the same ordered sum. ``docs/nn.md`` lists each op's tolerance
against the PyTorch op and its measured speed. ``conv_transpose2d`` is built in :mod:`._convtranspose`, the
errors and shared argument checks are :mod:`._checks`; both are re-exported here.

>>> import torch
>>> import torchrepro.nn.functional as F
>>> F.index_add(torch.zeros(3), 0, torch.tensor([0, 2, 0]), torch.tensor([1.0, 2.0, 3.0])).tolist()
[4.0, 0.0, 2.0]
>>> F.bincount(torch.tensor([1, 1, 3]), weights=torch.tensor([0.5, 0.25, 1.0])).tolist()
[0.0, 0.75, 0.0, 1.0]
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from typing import Any

import torch
from torch.autograd.function import once_differentiable

from ._checks import (
    ArgumentError,
    ArgumentIndexError,
    ArgumentValueError,
    UnsupportedDtypeError,
    UnsupportedOptionError,
    _check_bounds,
    _check_index,
    _scalar,
    _size_at,
    _wrap_dim,
)
from ._rowsum import row_sum, use_sorted

__all__ = [
    "ArgumentError",
    "ArgumentIndexError",
    "ArgumentValueError",
    "UnsupportedDtypeError",
    "UnsupportedOptionError",
    "bincount",
    "conv_transpose2d",
    "embedding_bag",
    "gather",
    "histc",
    "index_add",
    "index_put",
    "index_select",
    "scatter_add",
]


# ---------------------------------------------------------------------------------------------- index_add


def _index_add_value(inp: torch.Tensor, dim: int, index: torch.Tensor, src: torch.Tensor, alpha: Any) -> torch.Tensor:
    moved, src_moved = inp.movedim(dim, 0), src.movedim(dim, 0)
    width = math.prod(moved.shape[1:])
    rows = src_moved.reshape(src_moved.shape[0], width)
    if alpha != 1:
        rows = rows * alpha
    summed = row_sum(moved.reshape(moved.shape[0], width), index, rows)
    return summed.view(moved.shape).movedim(0, dim).contiguous()


class _IndexAdd(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, inp: torch.Tensor, dim: int, index: torch.Tensor, src: torch.Tensor,
                alpha: Any) -> torch.Tensor:
        ctx.dim, ctx.alpha = dim, alpha
        ctx.save_for_backward(index)
        return _index_add_value(inp, dim, index, src, alpha)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        (index,) = ctx.saved_tensors
        grad_src = None
        if ctx.needs_input_grad[3]:
            grad_src = grad.index_select(ctx.dim, index)  # a gather: every output read once, no sums
            if ctx.alpha != 1:
                grad_src = grad_src * ctx.alpha
        return (grad if ctx.needs_input_grad[0] else None), None, None, grad_src, None


def _index_add_checks(input: torch.Tensor, dim: Any, index: torch.Tensor, source: torch.Tensor) -> int:
    """PyTorch's checks of index_add's arguments, in its order; the wrapped ``dim``."""
    dim = _wrap_dim(dim, input.dim(), "index_add")
    if index.dim() > 1:
        raise ArgumentIndexError(f"index_add_(): Index is supposed to be a vector, but got dim: {index.dim()} with "
                                 f"type: {_scalar(index)} and size: {list(index.shape)}")
    _check_index(index, "index_add_()")
    if input.dtype != source.dtype:
        raise ArgumentError(f"index_add_(): self ({_scalar(input)}) and source ({_scalar(source)}) must have the "
                            "same scalar type")
    if dim and dim >= source.dim():
        raise ArgumentError(f"index_add_(): Indexing dim {dim} is out of bounds of the source tensor with dim "
                            f"{source.dim()}")
    rows = source.shape[dim] if source.dim() else 1
    if index.numel() != rows:
        raise ArgumentError(f"index_add_(): Number of indices ({index.numel()}) should be equal to "
                            f"source.size(dim): ({rows}), for dim: {dim}")
    if input.dim() != source.dim() or any(a != b for d, (a, b) in enumerate(zip(input.shape, source.shape))
                                          if d != dim):
        raise ArgumentError("index_add_(): source tensor shape must match self tensor shape, excluding the "
                            f"specified dimension. Got self.shape = {list(input.shape)} source.shape = "
                            f"{list(source.shape)}")
    if input.dim() > 1 or use_sorted(input.device):  # 1-D on CPU: PyTorch's kernel raises the same IndexError
        _check_bounds(index, _size_at(input, dim, "index_add"), dim, vector=input.dim() <= 1, what="index_add_()")
    return dim


def index_add(input: torch.Tensor, dim: int, index: torch.Tensor, source: torch.Tensor,
              alpha: Any = 1) -> torch.Tensor:
    """Deterministic ``torch.index_add``: ``input`` with ``alpha * source`` slices added at ``index`` along ``dim``.

    >>> index_add(torch.zeros(2, 2), 0, torch.tensor([1, 1]), torch.ones(2, 2)).tolist()
    [[0.0, 0.0], [2.0, 2.0]]
    """
    dim = _index_add_checks(input, dim, index, source)
    if input.dim() == 0:  # as a 1-D tensor of one element
        return _IndexAdd.apply(input.reshape(1), 0, index.reshape(-1), source.reshape(1), alpha).reshape(())
    return _IndexAdd.apply(input, dim, index.reshape(-1), source, alpha)


# -------------------------------------------------------------------------------------------- scatter_add


def _flat_targets(shape: Sequence[int], dim: int, index: torch.Tensor) -> torch.Tensor:
    """Row-major position in a contiguous tensor of ``shape`` that each element of ``index`` scatters to."""
    strides = [1] * len(shape)
    for d in range(len(shape) - 2, -1, -1):
        strides[d] = strides[d + 1] * shape[d + 1]
    flat = index.to(torch.int64) * strides[dim]
    for d, size in enumerate(index.shape):
        if d != dim and strides[d] and size > 1:
            view = [1] * index.dim()
            view[d] = size
            flat = flat + torch.arange(size, device=index.device).view(view) * strides[d]
    return flat.reshape(-1)


def _scatter_add_value(inp: torch.Tensor, dim: int, index: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    if not use_sorted(inp.device):  # CPU: scatter_add_ runs serially, in index order (checked by the tests)
        return inp.clone().scatter_add_(dim, index, src)
    _check_bounds(index, _size_at(inp, dim, "scatter_add"), dim, vector=False, what="scatter_add")
    picked = src[tuple(slice(0, n) for n in index.shape)]
    flat = row_sum(inp.contiguous().view(-1, 1), _flat_targets(inp.shape, dim, index), picked.reshape(-1, 1))
    return flat.view(inp.shape)


class _ScatterAdd(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, inp: torch.Tensor, dim: int, index: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
        ctx.dim, ctx.src_shape = dim, src.shape
        ctx.save_for_backward(index)
        return _scatter_add_value(inp, dim, index, src)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        (index,) = ctx.saved_tensors
        grad_src = None
        if ctx.needs_input_grad[3]:
            gathered = grad.gather(ctx.dim, index)
            if gathered.shape == ctx.src_shape:
                grad_src = gathered
            else:  # src larger than index: the elements never scattered get no gradient
                grad_src = grad.new_zeros(ctx.src_shape)
                grad_src[tuple(slice(0, n) for n in index.shape)] = gathered
        return (grad if ctx.needs_input_grad[0] else None), None, None, grad_src


def _scatter_checks(input: torch.Tensor, dim: Any, index: torch.Tensor, src: torch.Tensor) -> int:
    """PyTorch's checks of scatter's arguments (scatter_gather_dtype_check, scatter_shape_check); the wrapped dim."""
    dim = _wrap_dim(dim, input.dim(), "scatter_add")
    if index.numel() and index.dtype not in (torch.int64, torch.int32):
        _check_index(index, "scatter_add()")
    if src.dtype != input.dtype:
        raise ArgumentError(f"scatter_add(): Expected self.dtype to be equal to src.dtype, got {_scalar(input)} "
                            f"and {_scalar(src)}")
    if not index.numel():
        return dim
    dims = max(input.dim(), 1)
    if max(index.dim(), 1) != dims:
        raise ArgumentError(f"scatter_add(): Index tensor must have the same number of dimensions as self tensor "
                            f"({input.dim()}), got {index.dim()}")
    here = "scatter_add: src has fewer dimensions than index"
    wrong = (any(_size_at(index, d, here) > _size_at(input, d, here) for d in range(dims) if d != dim)
             or any(_size_at(index, d, here) > _size_at(src, d, here) for d in range(dims)))
    if wrong:
        raise ArgumentError(f"scatter_add(): Expected index {list(index.shape)} to be no larger than self "
                            f"{list(input.shape)} apart from dimension {dim} and to be no larger size than src "
                            f"{list(src.shape)}")
    return dim


def scatter_add(input: torch.Tensor, dim: int, index: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """Deterministic ``torch.scatter_add``: ``out[index[i][j]][j] += src[i][j]`` (for ``dim=0``), in index order.

    >>> scatter_add(torch.zeros(3), 0, torch.tensor([2, 2, 0]), torch.tensor([1.0, 2.0, 3.0])).tolist()
    [3.0, 0.0, 3.0]
    """
    dim = _scatter_checks(input, dim, index, src)
    return _ScatterAdd.apply(input, dim, index.to(torch.int64), src)


# --------------------------------------------------------------------------------------------- index_put


_MASKS = (torch.bool, torch.uint8)  # uint8 indices are masks, as in PyTorch (which deprecates them)
_INTEGER_INDICES = (torch.int64, torch.int32)


def _mask_positions(inp: torch.Tensor, mask: torch.Tensor, start: int) -> tuple[torch.Tensor, ...]:
    """The positions a mask selects over dims ``start, start + 1, ...`` of ``inp`` (PyTorch's shape checks)."""
    for j, size in enumerate(mask.shape):
        at = _wrap_dim(start + j, inp.dim(), "index_put: a mask indexes past the last dimension")
        if size != inp.shape[at]:
            raise ArgumentIndexError(f"index_put: The shape of the mask {list(mask.shape)} at index {j} does not "
                                     f"match the shape of the indexed tensor {list(inp.shape)} at index {at}")
    return mask.nonzero(as_tuple=True)


def _index_tensors(inp: torch.Tensor, indices: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The indices as int64 tensors, one per indexed dim (masks expanded), broadcast together."""
    if len(indices) > inp.dim():
        raise ArgumentIndexError(f"index_put: too many indices for tensor of dimension {inp.dim()} "
                                 f"(got {len(indices)})")
    expanded: list[torch.Tensor] = []
    for idx in indices:
        if idx.dtype in _MASKS:
            expanded.extend(_mask_positions(inp, idx, len(expanded)))
        elif idx.dtype in _INTEGER_INDICES:
            expanded.append(idx.to(torch.int64))
        else:
            raise ArgumentIndexError(f"index_put: tensors used as indices must be long, int, byte or bool tensors, "
                                     f"got {idx.dtype}")
    if not expanded:
        raise ArgumentError("index_put: expected at least one index tensor, got none")
    try:
        return list(torch.broadcast_tensors(*expanded))
    except RuntimeError:
        shapes = ", ".join(str(list(t.shape)) for t in expanded)
        raise ArgumentIndexError(f"index_put: shape mismatch: indexing tensors could not be broadcast together "
                                 f"with shapes {shapes}") from None


def _put_rows(inp: torch.Tensor, indices: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Size, int]:
    """Flat row numbers over the indexed leading dims, the broadcast shape of the indices, how many dims."""
    expanded = _index_tensors(inp, indices)
    flat: torch.Tensor | None = None
    for dim, (size, idx) in enumerate(zip(inp.shape, expanded)):
        low, high = (int(v) for v in torch.aminmax(idx)) if idx.numel() else (0, 0)
        if low < -size or high >= size:
            raise ArgumentIndexError(f"index_put: index {high if high >= size else low} is out of bounds for "
                                     f"dimension {dim} with size {size}")
        if low < 0:
            idx = torch.where(idx < 0, idx + size, idx)
        flat = idx if flat is None else flat * size + idx
    assert flat is not None
    return flat.reshape(-1), expanded[0].shape, len(expanded)


def _check_values(inp: torch.Tensor, values: torch.Tensor, target: tuple[int, ...]) -> None:
    """``values`` of ``inp``'s dtype and expandable to the shape of the indexed result, as PyTorch requires."""
    if values.dtype != inp.dtype:
        raise ArgumentError(f"index_put: Index put requires the source and destination dtypes match, got "
                            f"{_scalar(inp)} for the destination and {_scalar(values)} for the source.")
    fits = values.dim() <= len(target) and all(a in (1, b) for a, b in zip(reversed(values.shape), reversed(target)))
    if not fits:
        raise ArgumentError(f"index_put: shape mismatch: value tensor of shape {list(values.shape)} cannot be "
                            f"broadcast to indexing result of shape {list(target)}")


class _IndexPut(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, inp: torch.Tensor, flat: torch.Tensor, lead: int, bshape: torch.Size,
                values: torch.Tensor) -> torch.Tensor:
        trailing = inp.shape[lead:]
        width = trailing.numel()
        rows = values.expand(*bshape, *trailing).reshape(flat.numel(), width)
        ctx.save_for_backward(flat)
        ctx.width, ctx.view, ctx.values_shape = width, (*bshape, *trailing), values.shape
        return row_sum(inp.reshape(-1, width), flat, rows).view(inp.shape)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        (flat,) = ctx.saved_tensors
        grad_values = None
        if ctx.needs_input_grad[4]:
            picked = grad.reshape(-1, ctx.width).index_select(0, flat).view(ctx.view)
            grad_values = picked.sum_to_size(ctx.values_shape) if picked.shape != ctx.values_shape else picked
        return (grad if ctx.needs_input_grad[0] else None), None, None, None, grad_values


def index_put(input: torch.Tensor, indices: Sequence[torch.Tensor], values: torch.Tensor,
              accumulate: bool = True) -> torch.Tensor:
    """Deterministic ``torch.index_put(input, indices, values, accumulate=True)``: duplicates add up in index order.

    ``indices`` index the leading dimensions of ``input`` (integer or bool tensors, broadcast together).

    >>> index_put(torch.zeros(3), (torch.tensor([0, 0, 2]),), torch.tensor([1.0, 2.0, 5.0])).tolist()
    [3.0, 0.0, 5.0]
    """
    if not accumulate:
        raise UnsupportedOptionError("index_put: accumulate=False is not provided (with duplicate indices the "
                                     "value written is unspecified); use accumulate=True, or torch.index_put "
                                     "with indices you know to be unique")
    if isinstance(indices, torch.Tensor):
        indices = (indices,)
    flat, bshape, lead = _put_rows(input, tuple(indices))
    _check_values(input, values, (*bshape, *input.shape[lead:]))
    return _IndexPut.apply(input, flat, lead, bshape, values)


# ----------------------------------------------------------------------- gathers with a deterministic backward


class _IndexSelect(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, inp: torch.Tensor, dim: int, index: torch.Tensor) -> torch.Tensor:
        ctx.dim, ctx.shape = dim, inp.shape
        ctx.save_for_backward(index)
        return torch.index_select(inp, dim, index)  # a gather: deterministic everywhere

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        (index,) = ctx.saved_tensors
        return _index_add_value(grad.new_zeros(ctx.shape), ctx.dim, index, grad, 1), None, None


class _Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, inp: torch.Tensor, dim: int, index: torch.Tensor) -> torch.Tensor:
        ctx.dim, ctx.shape = dim, inp.shape
        out = torch.gather(inp, dim, index)
        ctx.save_for_backward(index.to(torch.int64))
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        (index,) = ctx.saved_tensors
        return _scatter_add_value(grad.new_zeros(ctx.shape), ctx.dim, index, grad), None, None


def index_select(input: torch.Tensor, dim: int, index: torch.Tensor) -> torch.Tensor:
    """``torch.index_select`` whose backward (an index_add: atomics on CUDA) sums in index order.

    >>> index_select(torch.arange(4.0), 0, torch.tensor([3, 3, 0])).tolist()
    [3.0, 3.0, 0.0]
    """
    dim = _wrap_dim(dim, input.dim(), "index_select")
    if index.dim() > 1:
        raise ArgumentIndexError(f"index_select(): Index is supposed to be a vector, got shape {list(index.shape)}")
    _check_index(index, "index_select()")
    return _IndexSelect.apply(input, dim, index.reshape(-1).to(torch.int64))


def gather(input: torch.Tensor, dim: int, index: torch.Tensor) -> torch.Tensor:
    """``torch.gather`` whose backward (a scatter_add: atomics on CUDA) sums in index order.

    >>> gather(torch.tensor([[1.0, 2.0], [3.0, 4.0]]), 1, torch.tensor([[1, 1], [0, 1]])).tolist()
    [[2.0, 2.0], [3.0, 4.0]]
    """
    return _Gather.apply(input, _wrap_dim(dim, input.dim(), "gather"), index)  # torch.gather checks the rest


# ------------------------------------------------------------------------------------------ bincount, histc


def _integer_dtype(input: torch.Tensor, what: str) -> None:
    if input.dtype.is_floating_point or input.dtype.is_complex or input.dtype == torch.bool:
        raise UnsupportedDtypeError(f"{what}: not implemented for '{_scalar(input)}': the input must be a tensor of "
                                    "integers")


def _bincount_checks(input: torch.Tensor, weights: torch.Tensor) -> int:
    """PyTorch's checks of a weighted bincount of a non-empty input, in its order; the largest value."""
    if input.dim() != 1:
        raise ArgumentError(f"bincount: the input must be 1-d (bincount only supports 1-d non-negative integral "
                            f"inputs), got a {input.dim()}-D tensor")
    low, high = (int(v) for v in torch.aminmax(input))
    if low < 0:
        raise ArgumentError(f"bincount: input must be non-negative, got the value {low}")
    if weights.dim() != 1 or weights.shape[0] != input.shape[0]:
        raise ArgumentError(f"bincount: weights should be 1-d and have the same length as input "
                            f"({input.shape[0]}), got shape {list(weights.shape)}")
    return high


def bincount(input: torch.Tensor, weights: torch.Tensor | None = None, minlength: int = 0) -> torch.Tensor:
    """Deterministic ``torch.bincount``: weights summed per value in index order (differentiable in ``weights``).

    Same result dtype as PyTorch: counts are int64; float32 weights give float32, other weights float64.

    >>> bincount(torch.tensor([0, 2, 2])).tolist()
    [1, 0, 2]
    """
    if weights is None:
        return torch.bincount(input, minlength=minlength)  # integer counts: exact in any order
    _integer_dtype(input, "bincount")
    minlength = operator.index(minlength)  # a float: TypeError, as PyTorch
    if minlength < 0:
        raise ArgumentError(f"bincount: minlength should be >= 0, got {minlength}")
    if input.dim() == 1 and not input.numel():  # PyTorch returns int64 zeros here, whatever the weights
        return torch.zeros(minlength, dtype=torch.int64, device=input.device)
    high = _bincount_checks(input, weights)
    dtype = torch.float32 if weights.dtype == torch.float32 else torch.float64
    zeros = torch.zeros(max(high + 1, minlength), dtype=dtype, device=weights.device)
    return _IndexAdd.apply(zeros, 0, input.to(torch.int64), weights.to(dtype), 1)  # values checked above


def _histc_edges(input: torch.Tensor, min: float, max: float) -> tuple[float, float]:
    left, right = float(min), float(max)
    if left == right and input.numel():
        low, high = torch.aminmax(input)
        left, right = float(low), float(high)
    if left == right:
        left, right = left - 1, right + 1
    if any(v != v or v in (float("inf"), float("-inf")) for v in (left, right)):
        raise ArgumentError(f"histc: range of [{left}, {right}] is not finite; pass finite min and max")
    if left > right:
        raise ArgumentError(f"histc: max must be larger than min, got min={min}, max={max}")
    return left, right


def histc(input: torch.Tensor, bins: int = 100, min: float = 0, max: float = 0) -> torch.Tensor:
    """Deterministic ``torch.histc``: PyTorch's bins, with counts that are exact, hence independent of order.

    Up to 2**24 values (float32; 2**53 for float64) every count is an exact sum of ones, so PyTorch's kernel is
    used as is; above, counts are taken in int64 and converted once (PyTorch's float counts stop at 2**24).

    >>> histc(torch.tensor([0.0, 0.5, 1.0, 2.0]), bins=2, min=0, max=1).tolist()
    [1.0, 2.0]
    """
    if not input.dtype.is_floating_point:
        raise UnsupportedDtypeError(f"histc: not implemented for '{_scalar(input)}': the input must be a "
                                    "floating-point tensor")
    bins = operator.index(bins)  # a float: TypeError, as PyTorch
    if bins <= 0:
        raise ArgumentError(f"histc: bins must be > 0, got {bins}")
    left, right = _histc_edges(input, min, max)
    if input.device.type == "cpu" and input.numel() <= int(2 / torch.finfo(input.dtype).eps):  # 2**24, float32
        # No bin can pass 2**(mantissa bits): each +1.0 is exact, so any order of additions gives the same bits.
        # (CPU only: on CUDA, torch.histc raises under deterministic mode, which the program may have on.)
        return torch.histc(input, bins, left, right)
    return _histc_counted(input, bins, left, right)


def _histc_counted(input: torch.Tensor, bins: int, left: float, right: float) -> torch.Tensor:
    """histc with int64 counts (exact for any size), the bin of each value computed as PyTorch's CPU kernel does."""
    x = input.reshape(-1)
    lo = torch.tensor(left, dtype=input.dtype, device=input.device)
    hi = torch.tensor(right, dtype=input.dtype, device=input.device)
    pos = torch.sub(x, lo).mul_(bins).div_(hi - lo).to(torch.int64).clamp_(0, bins - 1)  # max: the last bin
    pos.masked_fill_(~((x >= lo) & (x <= hi)), bins)  # outside the range (and NaN): a bin cut off below
    return torch.bincount(pos, minlength=bins + 1)[:bins].to(input.dtype)


# --------------------------------------------------------------------------------------------- embedding_bag


class _EmbeddingBag(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, inp: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor, mode: str,
                psw: torch.Tensor | None) -> torch.Tensor:
        # PyTorch's forward reduces each bag front to back in one thread on CPU and CUDA: already deterministic.
        out = torch.nn.functional.embedding_bag(inp, weight, offsets, mode=mode, per_sample_weights=psw)
        ctx.mode, ctx.num_weights = mode, weight.shape[0]
        ctx.save_for_backward(inp, offsets, weight, psw)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        inp, offsets, weight, psw = ctx.saved_tensors
        positions = torch.arange(inp.numel(), device=inp.device)
        bag = torch.bucketize(positions, offsets, right=True) - 1  # which bag each lookup belongs to
        rows = grad.index_select(0, bag)
        if ctx.mode == "mean":
            sizes = torch.diff(offsets, append=offsets.new_tensor([inp.numel()])).clamp_(min=1)
            rows = rows / sizes.index_select(0, bag).unsqueeze(1).to(rows.dtype)
        grad_psw = None
        if psw is not None and ctx.needs_input_grad[4]:
            grad_psw = (rows * weight.index_select(0, inp)).sum(1)
        grad_weight = None
        if ctx.needs_input_grad[1]:
            if psw is not None:
                rows = rows * psw.unsqueeze(1)
            grad_weight = row_sum(weight.new_zeros(ctx.num_weights, weight.shape[1]), inp, rows)
        return None, grad_weight, None, None, grad_psw


def _bag_checks(input: torch.Tensor, offsets: torch.Tensor | None) -> None:
    """PyTorch's checks of embedding_bag's input and offsets (ValueError for shapes, RuntimeError for dtypes)."""
    if input.dim() == 2 and offsets is not None:
        raise ArgumentValueError("embedding_bag: if input is 2-D (one bag per row), offsets has to be None, got a "
                                 "tensor")
    if input.dim() == 1 and offsets is None:
        raise ArgumentValueError("embedding_bag: a 1-D input needs offsets (the start of each bag): offsets has "
                                 "to be a 1D Tensor but got None")
    if input.dim() not in (1, 2):
        raise ArgumentValueError(f"embedding_bag: input has to be 1D or 2D Tensor, but got Tensor of dimension "
                                 f"{input.dim()}")
    for name, t in (("indices", input), ("offsets", offsets)):
        if t is not None and t.dtype not in _INTEGER_INDICES:
            raise ArgumentError(f"embedding_bag: expected {name} to have one of the following scalar types: Long, "
                                f"Int; but got {_scalar(t)}")


def embedding_bag(input: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor | None = None,
                  mode: str = "sum", per_sample_weights: torch.Tensor | None = None) -> torch.Tensor:
    """Deterministic ``torch.nn.functional.embedding_bag`` for ``mode="sum"`` and ``"mean"``.

    ``input`` is 1-D with ``offsets`` (start of each bag) or 2-D (one bag per row, ``offsets=None``).

    >>> w = torch.arange(6.0).view(3, 2)
    >>> embedding_bag(torch.tensor([0, 2, 1]), w, torch.tensor([0, 2])).tolist()
    [[4.0, 6.0], [2.0, 3.0]]
    """
    if mode not in ("sum", "mean"):
        raise UnsupportedOptionError(f"embedding_bag: mode={mode!r} is not provided; use 'sum' or 'mean' "
                                     "(PyTorch raises for mode='max' backward on CUDA under deterministic mode)")
    if per_sample_weights is not None and mode != "sum":
        raise UnsupportedOptionError(f"embedding_bag: per_sample_weights need mode='sum', got mode={mode!r}")
    _bag_checks(input, offsets)
    if input.dim() == 2:
        offsets = torch.arange(0, input.numel(), max(input.shape[1], 1), device=input.device)[: input.shape[0]]
        input = input.reshape(-1)
        per_sample_weights = None if per_sample_weights is None else per_sample_weights.reshape(-1)
    assert offsets is not None
    return _EmbeddingBag.apply(input.to(torch.int64), weight, offsets.to(torch.int64), mode, per_sample_weights)


# ------------------------------------------------------------------------------------------ conv_transpose2d
# Built in _convtranspose (PyTorch's op or ordinary convolutions, in cuDNN's deterministic scope); re-exported here.
from ._convtranspose import conv_transpose2d  # noqa: E402
from ._convtranspose import cudnn_deterministic as cudnn_deterministic  # noqa: E402
