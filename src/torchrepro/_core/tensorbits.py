"""Reading a tensor's bits: whether it can be read, the dense parts of a sparse, quantized or nested one, its bytes."""

from __future__ import annotations

import ctypes
import sys
from typing import Any

import torch


class UnfingerprintableError(TypeError):
    """A tensor whose bytes cannot be read (a meta tensor, or a tensor subclass without readable storage)."""


# One ctypes array type spanning the address space: a tensor's bytes are a slice of a view of it at the tensor's
# address (a type per size would be cached by ctypes forever).
_ADDRESS_SPACE = ctypes.c_ubyte * (sys.maxsize // 2)
_PLAIN_TENSOR_TYPES = frozenset({torch.Tensor, torch.nn.Parameter})
# A tensor seen inside torch.func transforms (vmap, grad, functionalize) wraps another: its data pointer and
# storage are not its bytes (functionalize even reports a fake address).
_is_transform_wrapper = getattr(getattr(torch._C, "_functorch", None), "is_functorch_wrapped_tensor",
                                lambda t: False)


def _check_readable(t: torch.Tensor) -> None:
    """Raise :class:`UnfingerprintableError` when :func:`fingerprint` cannot read ``t`` at all."""
    if t.device.type == "meta":
        raise UnfingerprintableError("cannot fingerprint a meta tensor (it has no data)")
    if _is_transform_wrapper(t):
        raise UnfingerprintableError("the tensor has no storage of its own (a torch.func transform's wrapper: "
                                     "vmap, grad, functionalize); fingerprint it outside torch.func transforms")
    if t.layout not in _PARTS and not getattr(t, "is_nested", False):
        raise UnfingerprintableError(f"cannot fingerprint a tensor with layout {t.layout} (no known way to "
                                     "read its bits); convert it with .to_dense() first")


def _check_storage_covers(t: torch.Tensor) -> None:
    """Raise :class:`UnfingerprintableError` when a CPU tensor reaches past the end of its storage (a storage
    resized or freed under it, e.g. by FSDP's ``resize_(0)``): reading it would read memory it does not own."""
    if t.numel() == 0:
        return
    try:
        have = t.untyped_storage().nbytes()
    except (RuntimeError, NotImplementedError, TypeError) as exc:
        if type(t) in _PLAIN_TENSOR_TYPES:  # e.g. a tensor seen inside torch.func.vmap/grad: no bytes of its own
            raise UnfingerprintableError(f"the tensor has no storage of its own ({exc}); fingerprint it outside "
                                         "torch.func transforms (vmap, grad, functionalize)") from None
        return  # a tensor subclass without storage: read through its own ops
    last = t.storage_offset() + sum((n - 1) * abs(st) for n, st in zip(t.shape, t.stride()))
    need = (last + 1) * t.element_size()
    if need > have:
        raise UnfingerprintableError(f"the tensor needs {need} bytes of storage but its storage holds {have} "
                                     "(freed or resized under it, e.g. by `storage().resize_(0)`): it has no "
                                     "data to read")


def check_fingerprintable(t: torch.Tensor) -> None:
    """Raise :class:`UnfingerprintableError` unless ``t``'s bytes can be read directly from its own storage.

    For callers that key caches on storage (the op tracer): sparse, nested and meta tensors have no single
    storage to read. :func:`fingerprint` itself reads sparse and nested tensors through their parts.
    """
    _check_readable(t)
    if t.layout in _DIRECT_LAYOUTS and not getattr(t, "is_nested", False):
        if t.device.type == "cpu" and not t.is_quantized:  # quint4x2 and friends pack several values per byte
            _check_storage_covers(t)
        return
    kind = "a nested tensor" if getattr(t, "is_nested", False) else f"a tensor with layout {t.layout}"
    raise UnfingerprintableError(f"{kind} has no single storage to read directly (fingerprint() reads it "
                                 "through its parts)")


def _sparse_coo_parts(t: torch.Tensor) -> tuple[str, list[torch.Tensor]]:
    c = t if t.is_coalesced() else t.coalesce()  # the canonical form: sorted, duplicate indices summed
    return f"{c.sparse_dim()}|{c.dense_dim()}", [c._indices(), c._values()]


def _compressed_parts(t: torch.Tensor) -> tuple[str, list[torch.Tensor]]:
    if t.layout in (torch.sparse_csr, torch.sparse_bsr):
        return "rows", [t.crow_indices(), t.col_indices(), t.values()]
    return "cols", [t.ccol_indices(), t.row_indices(), t.values()]


_PARTS = {  # layout -> (header detail, the dense tensors that hold the bits); strided tensors are read directly
    torch.strided: None,
    torch.sparse_coo: _sparse_coo_parts,
    torch.sparse_csr: _compressed_parts,
    torch.sparse_csc: _compressed_parts,
    torch.sparse_bsr: _compressed_parts,
    torch.sparse_bsc: _compressed_parts,
    torch._mkldnn: lambda t: ("", [t.to_dense()]),  # type: ignore[attr-defined]
}
_DIRECT_LAYOUTS = {torch.strided}


def _quantized_parts(t: torch.Tensor) -> tuple[str, list[torch.Tensor]]:
    scheme = t.qscheme()
    if scheme in (torch.per_tensor_affine, torch.per_tensor_symmetric):
        return f"{scheme}|{float(t.q_scale()).hex()}|{int(t.q_zero_point())}", [t.int_repr()]
    return (f"{scheme}|axis{t.q_per_channel_axis()}",
            [t.int_repr(), t.q_per_channel_scales(), t.q_per_channel_zero_points()])


def _composite(t: torch.Tensor) -> tuple[str, list[torch.Tensor]] | None:
    """For a tensor that is not a plain strided array: a header and the dense tensors holding its bits."""
    _check_readable(t)
    if getattr(t, "is_nested", False):
        parts = list(t.detach().unbind())
        return f"nested|{t.layout}|{t.dtype}|{len(parts)}", parts
    if t.is_quantized:
        detail, parts = _quantized_parts(t.detach())
    else:
        split = _PARTS[t.layout]
        if split is None:
            return None
        detail, parts = split(t.detach())
    return f"{t.layout}|{t.dtype}|{tuple(t.shape)}|{detail}", parts


_SAME_SIZE_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _flat_bits(t: torch.Tensor) -> torch.Tensor:
    """``t``'s elements, C order, as a contiguous 1-D tensor with the same bytes.

    Elements are reinterpreted as integers of the same width first: float8, bits and sub-byte dtypes have
    no copy kernels, and reinterpreting keeps every bit (a float copy could canonicalise NaN payloads)."""
    if t.numel() == 0:  # no bytes; a strided empty view (``x[::2]`` of an empty x) cannot be reinterpreted
        return torch.empty(0, dtype=torch.uint8, device=t.device)
    t = t.detach()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    as_int = _SAME_SIZE_INT.get(t.element_size())
    if as_int is not None and t.dtype != as_int and not t.is_contiguous():
        t = t.view(as_int)
    return t.contiguous().reshape(-1)


def _direct_bytes(t: torch.Tensor) -> Any:
    """A buffer of the bytes of a plain, contiguous, non-empty CPU tensor, in place (no torch op, no copy; read
    only: a read-only memoryview, or for small tensors a ctypes array of their size); ``None`` for any other
    tensor (subclasses, views with conjugate/negative bits, non-contiguous or empty tensors, memory the
    tensor's storage does not cover). The op tracer's hot path: ~4x cheaper than
    ``detach().reshape(-1).view(uint8).numpy()``, which goes through the dispatcher three times."""
    if (type(t) not in _PLAIN_TENSOR_TYPES or not t.is_cpu or t.layout is not torch.strided or t.is_quantized
            or t.is_nested):
        return None
    return _plain_bytes(t)


_SMALL_BYTES = 1 << 14  # tensors up to this size are read through a ctypes array type of their own size
_small_types: dict[int, Any] = {}  # nbytes -> ctypes.c_ubyte * nbytes (bounded: see _plain_bytes)


def _plain_bytes(t: torch.Tensor) -> Any:
    """:func:`_direct_bytes` for a tensor already known to be a plain strided CPU tensor (not quantized or
    nested): a buffer of its bytes, or ``None``. Small tensors get a ctypes array of their own size (ten times
    cheaper to make than a slice of the address-space view); the array holds the storage like the view does."""
    if not t.is_contiguous() or t.is_conj() or t.is_neg() or _is_transform_wrapper(t):
        return None
    try:
        n = t.nbytes
        ptr = t.data_ptr()
        storage = t.untyped_storage()
        start = storage.data_ptr()
    except RuntimeError:  # no storage (a tensor inside vmap or grad): the checked path says why
        return None
    if n <= 0 or not ptr or ptr < start or ptr + n > start + storage.nbytes():  # e.g. a storage resized to 0
        return None
    if n <= _SMALL_BYTES:
        kind = _small_types.get(n)
        if kind is None:
            if len(_small_types) >= 4096:  # ever new sizes: stay bounded
                _small_types.clear()
            kind = _small_types[n] = ctypes.c_ubyte * n
        small: Any = kind.from_address(ptr)
        small.storage = storage  # the memory stays allocated while the array lives
        return small
    view = _ADDRESS_SPACE.from_address(ptr)
    view.storage = storage  # type: ignore[attr-defined]  # the memory stays allocated while the view lives, even if the tensor is set_() away
    return memoryview(view)[:n].toreadonly()


_STRIDED = torch.strided
_QUANTIZED_DTYPES = frozenset(getattr(torch, name) for name in ("qint8", "quint8", "qint32", "quint4x2", "quint2x4")
                              if hasattr(torch, name))
_COMPLEX_DTYPES = frozenset(d for d in (getattr(torch, n, None) for n in ("complex32", "complex64", "complex128",
                                                                          "chalf", "cfloat", "cdouble"))
                            if d is not None)

