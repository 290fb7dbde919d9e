"""Batch-invariant matrix products and attention on CPU: ``torchrepro.batch_invariant()``.

A row's result from ``torch.mm`` and the ops built on it (``addmm``, ``bmm``, ``baddbmm``, ``matmul``,
``F.linear``, ``nn.Linear``) depends on how many rows are multiplied with it: the BLAS picks another kernel, and
so another order of summation, for a few rows than for many (on an x86 CPU with MKL, 1, 2, 3 or 7 rows of a
4096-wide ``Linear`` give other bits than the same rows among 64), and on where the rows lie in memory. So the
same request gets other logits when a server batches it with others.

Inside :func:`batch_invariant` these ops compute their rows in tiles of a fixed number of rows
(:data:`ROW_TILE`): the rows are copied into a fresh buffer of whole tiles (aligned, contiguous, zero rows after
the last one) and the tiles multiplied by the other operand in one batched product (``bmm``, the BLAS's own
kernel; ``baddbmm`` with ``addmm``'s bias); the padding rows are left out. Every matrix product the BLAS
computes then has the same shape, layout and alignment whatever the number of rows, and a tile's result depends
neither on the other rows of the tile nor on how many tiles share the call or where (measured: any row position
in a tile, any tile position among 1 to 33 tiles, gives the same bits), so a row gets the same bits alone as in
any batch. ``bmm``/``baddbmm`` tile each matrix the same way, with each right-hand matrix copied to an aligned
address (``baddbmm``'s bias added after the product).

``F.scaled_dot_product_attention``'s CPU kernel is batch variant too: decoding one token per sequence over 8 or
more cached keys with 2 threads, a batch of one splits each row's keys between the threads and a larger batch
does not. Inside the block it is computed as its math, ``softmax(q @ k^T * scale + mask) @ v``, with the matrix
products above and a row-wise softmax (half and bfloat16 in float32, as the kernel accumulates); keys that the mask
hides from every query of a row (padding) are left out of that row's sums, so a left-padded prompt gets the bits
it gets alone.

The ops are replaced at the CPU dispatch key of the ``aten`` library (``torch.library``), below autograd, so
backward passes use them too; leaving the block puts PyTorch's kernels back. It costs what the padding and the
copies cost: ``benchmarks/bench_batch_invariant.py`` measures it. CUDA tensors are left alone (see
docs/invariance.md).

Example:
    >>> import torch, torchrepro
    >>> w = torch.randn(64, 64)
    >>> x = torch.randn(9, 64)
    >>> with torchrepro.batch_invariant():
    ...     torch.equal((x[:1] @ w)[0], (x @ w)[0])
    True
"""

from __future__ import annotations

import functools
import threading
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from .._core.patches import Patches

ROW_TILE = 16  # rows per BLAS call inside batch_invariant() (see docs/invariance.md for how it was chosen)
_ALIGN = 64  # bytes: MKL's results depend on the alignment of its operands (CNR needs 64-byte alignment)
# The aten ops replaced: the matrix products (matmul, linear, Linear decompose into them) and CPU attention
# (F.scaled_dot_product_attention's CPU kernel: with few rows it splits a row's keys between threads).
OPS = ("mm", "addmm", "bmm", "baddbmm", "_scaled_dot_product_flash_attention_for_cpu")

_F = TypeVar("_F", bound=Callable[..., Any])


def _aligned(t: torch.Tensor) -> bool:
    return t.data_ptr() % _ALIGN == 0


def _canonical(b: torch.Tensor) -> torch.Tensor:
    """``mm``'s right-hand operand as the BLAS should see it: as it is when it is aligned and compact (row- or
    column-major: a Linear's ``weight.t()``, the same tensor in every batch), else an aligned row-major copy."""
    rows, cols = b.shape
    if (b.stride() == (cols, 1) or b.stride() == (1, rows)) and _aligned(b):
        return b
    return b.clone(memory_format=torch.contiguous_format)


def _finish(out: torch.Tensor, bias: torch.Tensor | None, beta: Any, alpha: Any) -> torch.Tensor:
    """``beta * bias + alpha * out``, element by element (addmm's scaling, after the product)."""
    if alpha != 1:
        out.mul_(alpha)
    if bias is not None and beta != 0:  # beta 0: the bias is ignored, NaNs included, as addmm does
        out.add_(bias if beta == 1 else bias * beta)
    return out


def _tiled(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None, beta: Any = 1,
           alpha: Any = 1) -> torch.Tensor:
    """``beta * bias + alpha * (a @ b)`` (or ``a @ b`` without ``bias``): ``a``'s rows copied into tiles of
    :data:`ROW_TILE` rows (a fresh aligned buffer, zero rows after the last), all tiles multiplied by ``b`` in one
    ``bmm`` (``b`` expanded, not copied), the padding rows left out."""
    m, k = a.shape
    n = b.shape[1]
    count = -(-m // ROW_TILE)
    tiles = a.new_zeros((count, ROW_TILE, k))
    tiles.view(-1, k)[:m].copy_(a)
    res = a.new_empty((count, ROW_TILE, n))
    right = _canonical(b).expand(count, k, n)
    if bias is None or beta == 0:  # beta 0: the bias is ignored, NaNs included, as addmm does
        torch.bmm(tiles, right, out=res)
        return _finish(res.view(-1, n)[:m], None, beta, alpha)
    if bias.dim() == 2 and bias.shape[0] == m and m > 1:  # a bias per row: padded into tiles as the rows are
        rows = bias.new_zeros((count * ROW_TILE, n))
        rows[:m].copy_(bias.expand(m, n))
        bias = rows.view(count, ROW_TILE, n)
    torch.baddbmm(bias, tiles, right, beta=beta, alpha=alpha, out=res)
    return res.view(-1, n)[:m]


def _aligned_copy(b: torch.Tensor) -> torch.Tensor:
    """The matrices of ``b`` (batch, k, n), row-major, each starting on an aligned address."""
    count, k, n = b.shape
    per = _ALIGN // b.element_size()
    step = -(-(k * n) // per) * per
    out = b.new_empty((count * step,)).as_strided((count, k, n), (step, n, 1))
    return out.copy_(b)


def _tiled_batch(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None, beta: Any = 1,
                 alpha: Any = 1) -> torch.Tensor:
    """``bmm``/``baddbmm`` the same way: each matrix's rows in tiles of :data:`ROW_TILE` (a fresh aligned buffer),
    its ``b`` in an aligned row-major copy, one ``bmm`` over the batch per tile row."""
    count, m, k = a.shape
    n = b.shape[2]
    steps = -(-m // ROW_TILE)
    tiles = a.new_zeros((count, steps * ROW_TILE, k))
    tiles[:, :m].copy_(a)
    right = _aligned_copy(b)
    res = a.new_empty((count, steps * ROW_TILE, n))
    for step in range(steps):
        rows = slice(step * ROW_TILE, (step + 1) * ROW_TILE)
        torch.bmm(tiles[:, rows], right, out=res[:, rows])
    return _finish(res[:, :m], bias, beta, alpha)


def _result_dtype(*tensors: torch.Tensor) -> torch.dtype:
    return functools.reduce(torch.promote_types, (t.dtype for t in tensors))


def _plain(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the tiled path applies: 2-D strided tensors of one floating dtype; anything else goes to
    PyTorch's ``out=`` kernel as it is (which computes it, or raises PyTorch's own error)."""
    return (a.dim() == 2 and b.dim() == 2 and a.layout == torch.strided and b.layout == torch.strided
            and a.dtype == b.dtype and a.dtype.is_floating_point and a.shape[1] == b.shape[0]
            and a.shape[0] > 0 and a.shape[1] > 0 and b.shape[1] > 0)


def _mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if not _plain(a, b):
        out = a.new_empty((0,), dtype=_result_dtype(a, b))
        return torch.mm(a, b, out=out)
    return _tiled(a, b)


def _addmm(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, beta: Any = 1, alpha: Any = 1) -> torch.Tensor:
    if not _plain(a, b) or bias.dtype != a.dtype or bias.dim() > 2:
        out = a.new_empty((0,), dtype=_result_dtype(bias, a, b))
        return torch.addmm(bias, a, b, beta=beta, alpha=alpha, out=out)
    m, n = a.shape[0], b.shape[1]
    try:
        torch.broadcast_shapes(bias.shape, (m, n))
    except RuntimeError:  # PyTorch's own message
        return torch.addmm(bias, a, b, beta=beta, alpha=alpha, out=a.new_empty((0,)))
    return _tiled(a, b, bias, beta, alpha)


def _bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if not (a.dim() == 3 and b.dim() == 3 and len(a) > 0 and a.shape[0] == b.shape[0] and _plain(a[0], b[0])):
        return torch.bmm(a, b, out=a.new_empty((0,), dtype=_result_dtype(a, b)))
    return _tiled_batch(a, b)


def _baddbmm(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, beta: Any = 1, alpha: Any = 1) -> torch.Tensor:
    plain = (a.dim() == 3 and b.dim() == 3 and len(a) > 0 and a.shape[0] == b.shape[0] and _plain(a[0], b[0])
             and bias.dtype == a.dtype)
    shape = (a.shape[0], a.shape[1], b.shape[2])
    if plain:
        try:
            torch.broadcast_shapes(bias.shape, shape)
        except RuntimeError:
            plain = False
    if not plain:
        out = a.new_empty((0,), dtype=_result_dtype(bias, a, b))
        return torch.baddbmm(bias, a, b, beta=beta, alpha=alpha, out=out)
    return _tiled_batch(a, b, bias, beta, alpha)


def _math_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float, is_causal: bool,
                    mask: torch.Tensor | None, scale: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    length, keys = q.shape[-2], k.shape[-2]
    scores = torch.matmul(q, k.transpose(-2, -1)) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if is_causal:
        scores = scores.masked_fill(~torch.ones(length, keys, dtype=torch.bool).tril(), float("-inf"))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    lse = torch.logsumexp(scores, dim=-1)
    masked = torch.isneginf(lse)  # a row with every key masked: zeros, as PyTorch's kernel gives
    weights = torch.exp(scores - torch.where(masked, 0.0, lse).unsqueeze(-1))
    if dropout_p > 0:
        weights = torch.nn.functional.dropout(weights, dropout_p)
    return torch.matmul(weights, v), torch.where(masked, 0.0, lse)


def _first_keys(mask: torch.Tensor, batch: int) -> torch.Tensor | None:
    """Per batch row and query, the first key the query may attend to (``mask`` 4-D, boolean or additive), as a
    (batch, queries) tensor; None when every query may attend to the first key (no left padding to leave out).
    The mask must be the same for every head."""
    allowed = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2
    if allowed.shape[1] != 1:
        if not bool((allowed == allowed[:, :1]).all()):
            return None  # per-head masks: computed as they are
        allowed = allowed[:, :1]
    allowed = allowed[:, 0].expand(batch, -1, -1)  # (batch, queries, keys)
    if bool(allowed[:, :, 0].all()):
        return None
    keys = allowed.shape[-1]
    index = torch.arange(keys).expand_as(allowed)
    return torch.where(allowed, index, keys).amin(dim=-1)  # a query that may attend nothing: keys


def _attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, dropout_p: float = 0.0,
               is_causal: bool = False, *, attn_mask: torch.Tensor | None = None,
               scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """CPU attention as its math: ``softmax(q @ k^T * scale + mask) @ v`` with the matrix products above (each
    (batch, head) matrix on its own, in fixed row tiles) and row-wise softmax, so that a row's result does not
    depend on the batch. The leading keys that the mask hides from a query (left padding) are left out of that
    query's sums instead of adding zeros to them, so that a left-padded prompt gets the bits it gets unpadded.
    Half and bfloat16 compute in float32, as PyTorch's kernel accumulates. Returns the kernel's (output,
    logsumexp)."""
    dtype = query.dtype
    acc = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    q, k, v = query.to(acc), key.to(acc), value.to(acc)
    mask = attn_mask if attn_mask is None or attn_mask.dtype == torch.bool else attn_mask.to(acc)
    first = (_first_keys(mask, q.shape[0])
             if mask is not None and q.dim() == 4 and mask.dim() == 4 and not is_causal else None)
    if first is None:
        out, lse = _math_attention(q, k, v, dropout_p, is_causal, mask, scale)
    else:
        assert mask is not None
        full = mask.expand(q.shape[0], -1, q.shape[2], -1)
        out = q.new_empty((*q.shape[:-1], v.shape[-1]))
        lse = q.new_empty(q.shape[:-1])
        for b in range(q.shape[0]):
            for lo in first[b].unique().tolist():
                rows = (first[b] == lo).nonzero().flatten()
                lo = min(lo, k.shape[-2] - 1)  # queries that may attend nothing keep one (masked) key
                o, x = _math_attention(q[b:b + 1, :, rows], k[b:b + 1, :, lo:], v[b:b + 1, :, lo:], dropout_p,
                                       False, full[b:b + 1, :, rows, lo:], scale)
                out[b:b + 1, :, rows], lse[b:b + 1, :, rows] = o, x
    out = out.to(dtype).contiguous(memory_format=torch.contiguous_format)
    if lse.dim() == 3:  # the kernel's layout: (batch, heads, length) with strides of (batch, length, heads)
        lse = lse.transpose(1, 2).contiguous().transpose(1, 2)
    return out, lse


_IMPLS: dict[str, Callable[..., Any]] = {"mm": _mm, "addmm": _addmm, "bmm": _bmm, "baddbmm": _baddbmm,
                                         "_scaled_dot_product_flash_attention_for_cpu": _attention}


class _Library:
    """The ``torch.library`` registrations as a removable handle (for :class:`~torchrepro._core.patches.Patches`)."""

    def __init__(self) -> None:
        self.lib = torch.library.Library("aten", "IMPL")
        with warnings.catch_warnings():  # "Overriding a previously registered kernel": that is the point
            warnings.simplefilter("ignore")
            for name in OPS:
                self.lib.impl(name, _IMPLS[name], "CPU")

    def remove(self) -> None:
        self.lib._destroy()  # PyTorch's own kernels are the CPU kernels again


_lock = threading.Lock()
_state: dict[str, Any] = {"depth": 0, "patches": None}


def active() -> bool:
    """Whether batch-invariant ops are in force (inside some :func:`batch_invariant` block)."""
    return bool(_state["depth"])


class batch_invariant:  # noqa: N801 - reads as a function at call sites, like torch.no_grad
    """Make CPU ``mm``/``addmm``/``bmm``/``baddbmm`` -- and so ``matmul``, ``F.linear`` and ``nn.Linear`` -- and
    CPU attention (``F.scaled_dot_product_attention``) batch invariant while the block runs: a row gets the same
    bits alone as inside any batch.

    A context manager (``with torchrepro.batch_invariant(): model(x)``) and a decorator
    (``@torchrepro.batch_invariant()``); blocks may nest; the replacement is process-wide (every thread) while any
    block is open, and PyTorch's kernels are back when the last one closes, also after an exception.
    ``torchrepro.check_batch_invariance(fn, batch)`` run inside the block proves it for a model.
    """

    def __enter__(self) -> batch_invariant:
        with _lock:
            if _state["depth"] == 0:
                patches = Patches()
                patches.hook(_Library())
                _state["patches"] = patches
            _state["depth"] += 1
        return self

    def __exit__(self, *exc: object) -> None:
        with _lock:
            _state["depth"] -= 1
            if _state["depth"] == 0:
                patches, _state["patches"] = _state["patches"], None
                patches.undo()

    def __call__(self, fn: _F) -> _F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with batch_invariant():
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]
