"""Deterministic versions of PyTorch ops whose kernels add floating-point numbers in a varying order.

Every function here gives the same bits on every run, with any number of threads, without
``torch.use_deterministic_algorithms``. Sums are formed in index order (see ``_rowsum``); gradients use
gathers (deterministic everywhere) or the same ordered sum. ``docs/nn.md`` lists each op's tolerance
against the PyTorch op and its measured speed.

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
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch.autograd.function import once_differentiable
from torch.nn.modules.utils import _pair

from .._core.errors import ReproError
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


@contextmanager
def cudnn_deterministic(device: torch.device) -> Iterator[None]:
    """cuDNN's deterministic algorithms (and no benchmarking) for the ops inside, on CUDA; restored after."""
    if device.type != "cuda":
        yield
        return
    before = (torch._C._get_cudnn_deterministic(), torch._C._get_cudnn_benchmark())
    torch._C._set_cudnn_deterministic(True)
    torch._C._set_cudnn_benchmark(False)
    try:
        yield
    finally:
        torch._C._set_cudnn_deterministic(before[0])
        torch._C._set_cudnn_benchmark(before[1])


class _Convolution(torch.autograd.Function):
    """``aten.convolution`` whose forward and backward both run with cuDNN's deterministic algorithms."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None,
                args: tuple[Any, ...]) -> torch.Tensor:
        ctx.args, ctx.has_bias = args, b is not None
        ctx.save_for_backward(x, w)
        with cudnn_deterministic(x.device):
            return torch.ops.aten.convolution(x, w, b, *args)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, w = ctx.saved_tensors
        stride, padding, dilation, transposed, output_padding, groups = ctx.args
        bias_sizes = [w.shape[1] * groups] if transposed else [w.shape[0]]
        mask = [ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.has_bias and ctx.needs_input_grad[2]]
        with cudnn_deterministic(x.device):
            gx, gw, gb = torch.ops.aten.convolution_backward(grad, x, w, bias_sizes, stride, padding, dilation,
                                                             transposed, output_padding, groups, mask)
        return gx, gw, gb, None


def _zero_insertion(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, stride: list[int],
                    padding: list[int], output_padding: list[int], groups: int, dilation: list[int]) -> torch.Tensor:
    """Transposed convolution as: insert stride-1 zeros between inputs, pad, convolve with the flipped kernel."""
    n, c, h, w = x.shape
    up = x.new_zeros(n, c, (h - 1) * stride[0] + 1, (w - 1) * stride[1] + 1)
    up[:, :, :: stride[0], :: stride[1]] = x
    kh, kw = weight.shape[-2:]
    ph, pw = dilation[0] * (kh - 1) - padding[0], dilation[1] * (kw - 1) - padding[1]
    up = torch.nn.functional.pad(up, (pw, pw + output_padding[1], ph, ph + output_padding[0]))
    cin, cout_g = weight.shape[:2]
    flipped = (weight.view(groups, cin // groups, cout_g, kh, kw).transpose(1, 2)
               .reshape(groups * cout_g, cin // groups, kh, kw).flip(-2, -1))
    return _Convolution.apply(up, flipped, bias, ([1, 1], [0, 0], dilation, False, [0, 0], groups))


def _phases(size: int, out: int, stride: int, padding: int, dilation: int,
            kernel: int) -> list[tuple[int, int, int, int, int, int]]:
    """Per output phase r (positions q = o + padding with q % stride == r) along one dimension: the kernel taps
    that reach it (start, step), the input padding (left, right) that makes it a plain dilated correlation, the
    dilation of the sub-kernel, and the first output position it fills."""
    step = stride // math.gcd(stride, dilation)
    found = []
    for r in range(stride):
        taps = [t for t in range(kernel) if (t * dilation) % stride == r]
        first_m = -((r - padding) // stride)  # ceil((padding - r) / stride)
        last_m = (padding + out - 1 - r) // stride
        if not taps or last_m < first_m:
            continue
        offset = (taps[0] * dilation - r) // stride
        sub_dilation = dilation // math.gcd(stride, dilation)
        reach = offset + (len(taps) - 1) * sub_dilation
        found.append((taps[0], step, reach - first_m, last_m - offset - (size - 1), sub_dilation,
                      stride * first_m + r - padding))
    return found


def _output_size(x: torch.Tensor, weight: torch.Tensor, stride: list[int], padding: list[int],
                 output_padding: list[int], dilation: list[int]) -> tuple[int, int]:
    sizes = tuple((x.shape[2 + i] - 1) * stride[i] - 2 * padding[i] + dilation[i] * (weight.shape[2 + i] - 1)
                  + output_padding[i] + 1 for i in range(2))
    if min(sizes) < 1:
        raise ArgumentError(f"conv_transpose2d: Given input size per channel: ({x.shape[2]} x {x.shape[3]}). "
                            f"Calculated output size per channel: ({sizes[0]} x {sizes[1]}). Output size is too "
                            "small; use less padding or a larger input")
    return sizes[0], sizes[1]


def _subpixel(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, stride: list[int],
              padding: list[int], output_padding: list[int], groups: int, dilation: list[int]) -> torch.Tensor:
    """Transposed convolution as stride**2 ordinary convolutions, one per output phase, interleaved: the sums of
    zero insertion + convolution without the zeros."""
    n, c, h, w = x.shape
    cin, cout_g, kh, kw = weight.shape
    out_h, out_w = _output_size(x, weight, stride, padding, output_padding, dilation)
    kernel = weight.view(groups, cin // groups, cout_g, kh, kw).transpose(1, 2).reshape(groups * cout_g,
                                                                                      cin // groups, kh, kw)
    rows = _phases(h, out_h, stride[0], padding[0], dilation[0], kh)
    cols = _phases(w, out_w, stride[1], padding[1], dilation[1], kw)
    # Pad once, by the most any phase needs; each phase convolves a window (a view) of it.
    top, bottom = max([r[2] for r in rows] + [0]), max([r[3] for r in rows] + [0])
    left, right = max([c[2] for c in cols] + [0]), max([c[3] for c in cols] + [0])
    padded = torch.nn.functional.pad(x, (left, right, top, bottom))
    y = x.new_zeros(n, groups * cout_g, out_h, out_w)
    for th, sh, pad_t, pad_b, dh, oh in rows:
        for tw, sw, pad_l, pad_r, dw, ow in cols:
            window = padded[:, :, top - pad_t: padded.shape[2] - bottom + pad_b,
                            left - pad_l: padded.shape[3] - right + pad_r]
            sub = kernel[:, :, th::sh, tw::sw].flip(-2, -1)
            phase = _Convolution.apply(window, sub, None, ([1, 1], [0, 0], [dh, dw], False, [0, 0], groups))
            y[:, :, oh :: stride[0], ow :: stride[1]] = phase
    return y if bias is None else y + bias.view(1, -1, 1, 1)


_CONSTRUCTIONS = ("native", "zero_insertion", "subpixel")

# PyTorch's checks of a transposed convolution's parameters: name, smallest value it accepts, its message.
_CONV_LIMITS = (
    ("padding", 0, "negative padding is not supported"),
    ("output_padding", 0, "negative output_padding is not supported"),
    ("stride", 1, "non-positive stride is not supported"),
    ("dilation", 1, "dilation should be greater than zero"),
)


def _conv_params(**params: Any) -> dict[str, list[int]]:
    """Each parameter as a list of 2 ints (an int is used for both dims), as PyTorch requires."""
    found = {name: list(_pair(value)) for name, value in params.items()}
    for name, value in found.items():
        if len(value) != 2:
            raise ArgumentError(f"conv_transpose2d: expected {name} to be a single integer value or a list of 2 "
                                f"values to match the convolution dimensions, but got {name}={value}")
    return found


def _conv_checks(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, params: dict[str, list[int]],
                 groups: int) -> None:
    """What PyTorch's convolution checks before computing (the other constructions call it on other shapes)."""
    for name, low, message in _CONV_LIMITS:
        if min(params[name]) < low:
            raise ArgumentError(f"conv_transpose2d: {message}, got {name}={params[name]}")
    if groups <= 0:
        raise ArgumentError(f"conv_transpose2d: non-positive groups is not supported, got groups={groups}")
    if weight.dim() != 4:
        raise ArgumentError(f"conv_transpose2d: expected a 4-D weight (in_channels, out_channels/groups, kH, kW), "
                            f"got shape {list(weight.shape)}")
    if any(op >= s and op >= d for op, s, d in zip(params["output_padding"], params["stride"], params["dilation"])):
        raise ArgumentError(f"conv_transpose2d: output padding must be smaller than either stride or dilation, but "
                            f"got output_padding={params['output_padding']}, stride={params['stride']}, "
                            f"dilation={params['dilation']}")
    given = f"conv_transpose2d: Given transposed=1, weight of size {list(weight.shape)}"
    if weight.shape[0] % groups:
        raise ArgumentError(f"conv_transpose2d: Given groups={groups}, expected weight to be divisible by {groups} "
                            f"at dimension 0, but got weight of size {list(weight.shape)} instead")
    if x.shape[1] != weight.shape[0]:
        raise ArgumentError(f"{given}, expected input{list(x.shape)} to have {weight.shape[0]} channels, but got "
                            f"{x.shape[1]} channels instead")
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != weight.shape[1] * groups):
        raise ArgumentError(f"{given}, expected bias to be 1-dimensional with {weight.shape[1] * groups} elements, "
                            f"but got bias of size {list(bias.shape)} instead")
    for other in (weight, bias):
        if other is not None and other.dtype != x.dtype:
            raise ArgumentError(f"conv_transpose2d: expected scalar type {_scalar(x)} but found {_scalar(other)}")


def conv_transpose2d(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                     stride: Any = 1, padding: Any = 0, output_padding: Any = 0, groups: int = 1,
                     dilation: Any = 1, *, construction: str = "native") -> torch.Tensor:
    """Deterministic ``torch.nn.functional.conv_transpose2d`` (same arguments, same weight layout).

    ``construction="native"`` runs PyTorch's transposed convolution, forward and backward, with cuDNN's
    deterministic algorithms selected for this op only; ``"zero_insertion"`` is zero insertion + padding + an
    ordinary convolution with the flipped kernel (about stride**2 times the work); ``"subpixel"`` computes the
    same products without the zeros: one small ordinary convolution per output phase, interleaved. All three run
    their convolutions in the same deterministic cuDNN scope.

    >>> conv_transpose2d(torch.ones(1, 1, 2, 2), torch.ones(1, 1, 2, 2), stride=2).shape
    torch.Size([1, 1, 4, 4])
    """
    if construction not in _CONSTRUCTIONS:
        raise UnsupportedOptionError(f"conv_transpose2d: construction={construction!r}; expected one of "
                                     f"{', '.join(_CONSTRUCTIONS)}")
    if input.dim() not in (3, 4):
        raise ArgumentError(f"conv_transpose2d: Expected 3D (unbatched) or 4D (batched) input to conv_transpose2d, "
                            f"but got input of size: {list(input.shape)}")
    if input.dim() == 3:  # unbatched (C, H, W), as PyTorch accepts
        return conv_transpose2d(input.unsqueeze(0), weight, bias, stride, padding, output_padding, groups, dilation,
                                construction=construction).squeeze(0)
    params = _conv_params(stride=stride, padding=padding, output_padding=output_padding, dilation=dilation)
    if construction != "native":  # PyTorch's convolution checks the native construction's arguments itself
        _conv_checks(input, weight, bias, params, groups)
        _output_size(input, weight, **params)
    return _CONSTRUCTION_OF[construction](input, weight, bias, groups=groups, **params)


def _native(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, stride: list[int],
            padding: list[int], output_padding: list[int], groups: int, dilation: list[int]) -> torch.Tensor:
    return _Convolution.apply(x, weight, bias, (stride, padding, dilation, True, output_padding, groups))


_CONSTRUCTION_OF = {"native": _native, "zero_insertion": _zero_insertion, "subpixel": _subpixel}
